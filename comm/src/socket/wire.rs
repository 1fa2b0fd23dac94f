//! The frame every message of the socket backend starts with.
//!
//! 32 bytes, little-endian: magic `u32`, kind `u8`, op `u8`, descriptor count
//! `u16`, communicator id `u64`, sequence number `u64`, payload length `u64`.
//! Descriptors passed with `SCM_RIGHTS` ride on the first byte of the frame.

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
const MAGIC: u32 = u32::from_le_bytes(*b"WMC1");

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Collective payload.
    Data = 1,
    /// The sender shuts down cleanly; its end closes next.
    Bye = 2,
    /// The sender lost the rank in `seq`; every collective must now fail.
    Abort = 3,
    /// Point-to-point descriptors.
    Fds = 4,
}

/// Which operation sent a frame, so a mismatch can be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `barrier`.
    Barrier = 1,
    /// `broadcast`.
    Broadcast = 2,
    /// `allgather` / `allgatherv`.
    Allgather = 3,
    /// `alltoallv`.
    Alltoallv = 4,
    /// `send_fds` / `recv_fds`.
    Fds = 5,
    /// Control frames (bye, abort).
    Control = 6,
    /// `Communicator::exchange`.
    AlltoallvInPlace = 7,
}

impl Op {
    /// The operation's name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
            Op::Allgather => "allgather",
            Op::Alltoallv => "alltoallv",
            Op::Fds => "fd passing",
            Op::Control => "control",
            Op::AlltoallvInPlace => "alltoallv in place",
        }
    }
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Op::Barrier,
            2 => Op::Broadcast,
            3 => Op::Allgather,
            4 => Op::Alltoallv,
            5 => Op::Fds,
            6 => Op::Control,
            7 => Op::AlltoallvInPlace,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: Kind,
    /// Which operation sent it.
    pub op: Op,
    /// Descriptors attached.
    pub nfds: u16,
    /// Communicator id.
    pub comm: u64,
    /// Collective sequence number on that communicator (the lost rank for
    /// [`Kind::Abort`]).
    pub seq: u64,
    /// Payload bytes that follow.
    pub len: u64,
}

impl Header {
    /// The 32 bytes on the wire.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.op as u8;
        b[6..8].copy_from_slice(&self.nfds.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses 32 bytes, or says what is wrong with them.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, String> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(format!("bad frame magic {magic:#010x}"));
        }
        let kind = match b[4] {
            1 => Kind::Data,
            2 => Kind::Bye,
            3 => Kind::Abort,
            4 => Kind::Fds,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let op = Op::from_u8(b[5]).ok_or_else(|| format!("unknown op {}", b[5]))?;
        Ok(Self { kind, op, nfds: u16::from_le_bytes([b[6], b[7]]), comm: u64_at(8), seq: u64_at(16), len: u64_at(24) })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn arbitrary_headers_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&bytes);
            if let Ok(h) = Header::decode(&b) {
                prop_assert_eq!(h.encode(), b);
            }
        }
    }

    #[test]
    fn header_round_trips() {
        let h = Header { kind: Kind::Fds, op: Op::Alltoallv, nfds: 3, comm: u64::MAX - 7, seq: 42, len: 1 << 40 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
    }
}
