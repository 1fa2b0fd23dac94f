//! The read servers' protocol, after the reader's handshake: fixed 32-byte
//! headers, every count and length bounded before anything is allocated.
//!
//! ```text
//! request   "WMOQ" | op u8 | 0 0 0 | a u64 | b u64 | c u64       32 bytes
//!   READ    a = rows n, b = first byte in each row, c = bytes per row;
//!           then n row indices (u64, the owner's own numbering)
//!   PING    (a, b, c zero): the server answers with its epoch
//!   PORTION (a, b, c zero; Unix sockets only): the answer carries the
//!           memfd of the owner's rows
//! response  "WMOR" | status u8 | 0 0 0 | epoch u64 | bytes u64 | id u64  32 bytes
//!   id:       the id of the request it answers: the request's sequence
//!             number on its connection (the first request after the
//!             handshake is 0, the next 1, …), counted by both sides
//!   status 0: `bytes` of rows follow (n rows of c bytes, in request order)
//!   status 1: `bytes` of an error message follow (at most 4 KiB)
//! ```
//!
//! Answers come in request order, one per request. A reader checks every
//! answer's id against the request it waits for, its status and its length
//! before it reads a byte of rows: an answer to another request is
//! [`Malformed`](crate::Error::Malformed), never rows. A connection is used
//! again only while it is *in step* — every answer asked for read in full,
//! an error answer to a request the server could parse included; any other
//! failure (a bad header, an id out of step, a short read, a timeout)
//! closes it. The server closes a connection after a request header it
//! cannot parse, having answered it with an error.

/// Bytes of every header.
pub(crate) const HEADER: usize = 32;
const REQUEST_MAGIC: &[u8; 4] = b"WMOQ";
const RESPONSE_MAGIC: &[u8; 4] = b"WMOR";
/// Most rows one request asks for.
pub(crate) const MAX_ROWS: usize = 1 << 20;
/// Most bytes of rows one response carries.
pub(crate) const MAX_BYTES: usize = 64 << 20;
/// Longest error message a response carries.
pub(crate) const MAX_MESSAGE: usize = 4096;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `rows` rows: `len` bytes of each, from byte `skip`.
    Read { rows: usize, skip: usize, len: usize },
    /// The server's epoch.
    Ping,
    /// The memfd of the owner's rows.
    Portion,
}

const READ: u8 = 1;
const PING: u8 = 2;
const PORTION: u8 = 3;

impl Request {
    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(REQUEST_MAGIC);
        let (op, a, b, c) = match *self {
            Request::Read { rows, skip, len } => (READ, rows as u64, skip as u64, len as u64),
            Request::Ping => (PING, 0, 0, 0),
            Request::Portion => (PORTION, 0, 0, 0),
        };
        h[4] = op;
        h[8..16].copy_from_slice(&a.to_le_bytes());
        h[16..24].copy_from_slice(&b.to_le_bytes());
        h[24..32].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Parses a request header against rows of `row_bytes` bytes.
    pub(crate) fn decode(h: &[u8; HEADER], row_bytes: usize) -> Result<Self, String> {
        if &h[..4] != REQUEST_MAGIC || h[5..8] != [0, 0, 0] {
            return Err("a request header without its magic".into());
        }
        let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
        let (a, b, c) = (word(8), word(16), word(24));
        match h[4] {
            READ => {
                let rows =
                    usize::try_from(a).ok().filter(|&n| n <= MAX_ROWS).ok_or_else(|| format!("a read of {a} rows (at most {MAX_ROWS})"))?;
                let skip = usize::try_from(b).map_err(|_| format!("a read from byte {b}"))?;
                let len = usize::try_from(c).map_err(|_| format!("a read of {c} bytes per row"))?;
                if len == 0 || skip.checked_add(len).is_none_or(|end| end > row_bytes) {
                    return Err(format!("a read of {len} bytes from byte {skip} of rows of {row_bytes} bytes"));
                }
                if rows.checked_mul(len).is_none_or(|t| t > MAX_BYTES) {
                    return Err(format!("a read of {rows} rows of {len} bytes (at most {MAX_BYTES} bytes)"));
                }
                Ok(Request::Read { rows, skip, len })
            }
            PING if (a, b, c) == (0, 0, 0) => Ok(Request::Ping),
            PORTION if (a, b, c) == (0, 0, 0) => Ok(Request::Portion),
            op => Err(format!("an unknown request {op}")),
        }
    }
}

/// A response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    /// The id of the request it answers (its sequence number on the
    /// connection).
    pub id: u64,
    /// Whether the bytes that follow are rows (true) or an error message.
    pub ok: bool,
    /// The server's epoch (publishes so far).
    pub epoch: u64,
    /// Bytes that follow.
    pub bytes: usize,
}

impl Response {
    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(RESPONSE_MAGIC);
        h[4] = u8::from(!self.ok);
        h[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        h[16..24].copy_from_slice(&(self.bytes as u64).to_le_bytes());
        h[24..32].copy_from_slice(&self.id.to_le_bytes());
        h
    }

    /// Parses the header of the answer to request `id`; `expect` is how
    /// many bytes of rows that request asked for. An answer to any other
    /// request is an error, whatever it carries.
    pub(crate) fn decode(h: &[u8; HEADER], id: u64, expect: usize) -> Result<Self, String> {
        if &h[..4] != RESPONSE_MAGIC || h[5..8] != [0, 0, 0] {
            return Err("a response header without its magic".into());
        }
        let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
        let (epoch, bytes, got) = (word(8), word(16), word(24));
        if got != id {
            return Err(format!("the answer to request {got} where the answer to request {id} was due (the connection is out of step)"));
        }
        match h[4] {
            0 if bytes == expect as u64 => Ok(Self { id, ok: true, epoch, bytes: expect }),
            0 => Err(format!("{bytes} bytes of rows where {expect} were asked for")),
            1 if bytes <= MAX_MESSAGE as u64 => Ok(Self { id, ok: false, epoch, bytes: bytes as usize }),
            1 => Err(format!("an error message of {bytes} bytes (at most {MAX_MESSAGE})")),
            s => Err(format!("the unknown status {s}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_bounds_hold() {
        for r in [Request::Read { rows: 3, skip: 4, len: 8 }, Request::Ping, Request::Portion] {
            assert_eq!(Request::decode(&r.encode(), 16), Ok(r));
        }
        let bad = [
            (Request::Read { rows: 3, skip: 250, len: 8 }, "from byte 250"),
            (Request::Read { rows: 3, skip: 0, len: 0 }, "0 bytes"),
            (Request::Read { rows: MAX_ROWS + 1, skip: 0, len: 1 }, "at most"),
            (Request::Read { rows: MAX_ROWS, skip: 0, len: 128 }, "at most 67108864 bytes"),
        ];
        for (r, want) in bad {
            let e = Request::decode(&r.encode(), 256).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let ok = Response { id: 3, ok: true, epoch: 7, bytes: 96 };
        assert_eq!(Response::decode(&ok.encode(), 3, 96), Ok(ok));
        assert!(Response::decode(&ok.encode(), 3, 95).unwrap_err().contains("96 bytes of rows where 95"));
        let err = Response { id: 0, ok: false, epoch: 7, bytes: MAX_MESSAGE + 1 };
        assert!(Response::decode(&err.encode(), 0, 0).unwrap_err().contains("error message"));
    }

    #[test]
    fn an_answer_to_another_request_is_refused_whatever_it_carries() {
        // The same rows, the right length and status: only the id differs.
        for (sent, due) in [(0u64, 1u64), (2, 1), (u64::MAX, 0)] {
            for ok in [true, false] {
                let r = Response { id: sent, ok, epoch: 1, bytes: 64 };
                let e = Response::decode(&r.encode(), due, 64).unwrap_err();
                assert!(e.contains(&format!("the answer to request {sent} where the answer to request {due} was due")), "{e}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_headers_never_panic(bytes in proptest::collection::vec(any::<u8>(), HEADER), rb in 0usize..1 << 20, e in 0usize..1 << 30, id in any::<u64>()) {
            let h: [u8; HEADER] = bytes.try_into().unwrap();
            if let Ok(Request::Read { rows, skip, len }) = Request::decode(&h, rb) {
                prop_assert!(rows <= MAX_ROWS && skip + len <= rb && rows * len <= MAX_BYTES);
            }
            if let Ok(r) = Response::decode(&h, id, e) {
                prop_assert_eq!(r.id, id);
            }
        }
    }
}
