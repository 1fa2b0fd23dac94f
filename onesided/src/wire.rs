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
//! response  "WMOR" | status u8 | 0 0 0 | epoch u64 | bytes u64 | 0   32 bytes
//!   status 0: `bytes` of rows follow (n rows of c bytes, in request order)
//!   status 1: `bytes` of an error message follow (at most 4 KiB); the
//!             connection stays usable
//! ```

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
        h
    }

    /// Parses a response header; `expect` is how many bytes of rows the
    /// request asked for.
    pub(crate) fn decode(h: &[u8; HEADER], expect: usize) -> Result<Self, String> {
        if &h[..4] != RESPONSE_MAGIC || h[5..8] != [0, 0, 0] || h[24..] != [0; 8] {
            return Err("a response header without its magic".into());
        }
        let epoch = u64::from_le_bytes(h[8..16].try_into().unwrap_or([0; 8]));
        let bytes = u64::from_le_bytes(h[16..24].try_into().unwrap_or([0; 8]));
        match h[4] {
            0 if bytes == expect as u64 => Ok(Self { ok: true, epoch, bytes: expect }),
            0 => Err(format!("{bytes} bytes of rows where {expect} were asked for")),
            1 if bytes <= MAX_MESSAGE as u64 => Ok(Self { ok: false, epoch, bytes: bytes as usize }),
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
        let ok = Response { ok: true, epoch: 7, bytes: 96 };
        assert_eq!(Response::decode(&ok.encode(), 96), Ok(ok));
        assert!(Response::decode(&ok.encode(), 95).unwrap_err().contains("96 bytes of rows where 95"));
        let err = Response { ok: false, epoch: 7, bytes: MAX_MESSAGE + 1 };
        assert!(Response::decode(&err.encode(), 0).unwrap_err().contains("error message"));
    }

    proptest! {
        #[test]
        fn arbitrary_headers_never_panic(bytes in proptest::collection::vec(any::<u8>(), HEADER), rb in 0usize..1 << 20, e in 0usize..1 << 30) {
            let h: [u8; HEADER] = bytes.try_into().unwrap();
            if let Ok(Request::Read { rows, skip, len }) = Request::decode(&h, rb) {
                prop_assert!(rows <= MAX_ROWS && skip + len <= rb && rows * len <= MAX_BYTES);
            }
            let _ = Response::decode(&h, e);
        }
    }
}
