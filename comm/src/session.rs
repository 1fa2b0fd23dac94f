//! What protects a connection after its handshake: per-connection keys and
//! the record layer every frame travels in.
//!
//! The handshake (`auth`) ends with two keys, one per direction, derived
//! by HKDF-SHA256 from the job key, both sides' challenges and the
//! caller's claim (purpose, rank, world, both record nonces), so a relay
//! that forwarded the handshake holds nothing it can use. From then on
//! every byte either side sends travels in **records**:
//!
//! ```text
//! length u32 (little-endian, at most RECORD_MAX) ‖ check (4) ‖ body (length bytes) ‖ tag (16)
//! ```
//!
//! sealed with AES-256-GCM under the direction's key and a nonce made of
//! the record's sequence number (0, 1, 2, … per direction, never sent), so
//! a record that was changed, replayed, reordered or dropped fails to
//! open, and every later one with it. The check is the first 4 bytes of a
//! GMAC of the length under a key of its own and the same sequence number,
//! so a changed length is refused before anything waits for the bytes it
//! announces (a flipped length bit would otherwise stall the receiver until
//! its timeout). Under [`Wire::Aead`] the body is the
//! ciphertext and the length is authenticated data; under [`Wire::Mac`]
//! the body is the plaintext and the tag is the one AES-GCM gives when it
//! encrypts a copy of the body (same key, nonce and authenticated data);
//! that ciphertext is thrown away, never sent. The receiver encrypts its
//! own copy and compares tags. A tag over the ciphertext authenticates the
//! body (the ciphertext is a one-to-one function of it), and ring's
//! encryption is about six times as fast as its hashing of authenticated
//! data, which a GMAC over the body would be.
//!
//! A sender that owns the bytes it sends seals them where they lie
//! ([`Sealer::seal_in_place`]) and writes prefix, body and tag with one
//! vectored call; no copy of the payload is made.
//!
//! [`Sealed`] wraps a blocking stream (rendezvous, read servers,
//! readers, the catalogue); the mesh's poll-driven endpoint drives a
//! [`Sealer`] and an [`Opener`] itself.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use ring::hkdf;
use wm_topology::env::WM_WIRE;

use crate::{Error, Result};

/// Most bytes of payload in one record: large enough that a record's
/// system calls, tag and check cost little beside its bytes (a tag per
/// 256 KiB cost the gather a measurable share), small enough that the
/// buffer a connection keeps for the record being received stays small
/// beside its frame allowance (`AHEAD_MAX` of the endpoint).
pub const RECORD_MAX: usize = 1 << 20;
/// Bytes of a record's prefix: its length and the length's check.
pub const PREFIX: usize = 8;
const LEN: usize = 4;
/// Bytes of a record's tag.
pub const TAG: usize = 16;

/// How frames are protected (`WM_WIRE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Wire {
    /// Authenticated only: the bytes travel readable, each record carries
    /// a GMAC.
    Mac = 1,
    /// Encrypted and authenticated (AES-256-GCM): the default.
    Aead = 2,
}

impl Wire {
    /// The mode `WM_WIRE` named when this process first asked (`aead`
    /// when unset): every connection of a process uses one mode.
    ///
    /// # Errors
    /// As [`Wire::from_env`].
    pub fn current() -> Result<Self> {
        static MODE: std::sync::OnceLock<std::result::Result<Wire, String>> = std::sync::OnceLock::new();
        MODE.get_or_init(|| Self::from_env().map_err(|e| e.to_string())).clone().map_err(Error::InvalidArgument)
    }

    /// The mode `WM_WIRE` names (`aead` when unset).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the value when it is neither
    /// `mac` nor `aead`.
    pub fn from_env() -> Result<Self> {
        match WM_WIRE.get().as_deref().map(str::trim) {
            None | Some("aead") => Ok(Wire::Aead),
            Some("mac") => Ok(Wire::Mac),
            Some(v) => Err(Error::InvalidArgument(format!("{}={v:?}: expected `aead` or `mac`", WM_WIRE.name))),
        }
    }

    /// The mode's name, as `WM_WIRE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Mac => "mac",
            Wire::Aead => "aead",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Wire::Mac),
            2 => Some(Wire::Aead),
            _ => None,
        }
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealError {
    /// Its length prefix is over [`RECORD_MAX`].
    TooLong(u64),
    /// It does not verify: changed, replayed, reordered or dropped on the way.
    Forged(u64),
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::TooLong(n) => write!(f, "a record announces {n} bytes (at most {RECORD_MAX}): the stream was altered"),
            SealError::Forged(seq) => write!(
                f,
                "record {seq} does not authenticate: it was changed, replayed, reordered or dropped on the way (authentication failed)"
            ),
        }
    }
}

impl std::error::Error for SealError {}

impl From<SealError> for io::Error {
    fn from(e: SealError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[NONCE_LEN - 8..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Derives one direction's key: HKDF-SHA256 with `salt`, the job key as
/// input keying material, and `info` (the parts are concatenated).
pub(crate) fn derive(ikm: &[u8], salt: &[u8], info: &[&[u8]]) -> LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let okm = prk.expand(info, &AES_256_GCM).expect("an AES-256 key is well within HKDF-SHA256's output limit");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// One direction's keys: for records, and for their lengths' checks.
pub(crate) struct Keys {
    pub(crate) record: LessSafeKey,
    pub(crate) length: LessSafeKey,
}

/// The check of a record's length: 4 bytes of a GMAC under `key`.
fn length_check(key: &LessSafeKey, seq: u64, len: &[u8]) -> [u8; PREFIX - LEN] {
    let tag = key.seal_in_place_separate_tag(nonce(seq), Aad::from(len), &mut []).expect("an empty message");
    tag.as_ref()[..PREFIX - LEN].try_into().expect("4 bytes")
}

/// The tag of a [`Wire::Mac`] record: AES-GCM's over `body` encrypted
/// in `scratch` (a copy), with `prefix` as authenticated data.
fn mac_tag(
    key: &LessSafeKey,
    n: Nonce,
    prefix: &[u8],
    body: &[u8],
    scratch: &mut Vec<u8>,
) -> std::result::Result<Tag, ring::error::Unspecified> {
    scratch.clear();
    scratch.extend_from_slice(body);
    key.seal_in_place_separate_tag(n, Aad::from(prefix), scratch)
}

/// Seals what one side sends.
pub struct Sealer {
    key: LessSafeKey,
    length: LessSafeKey,
    seq: u64,
    wire: Wire,
    /// The copy a [`Wire::Mac`] body is encrypted in for its tag.
    scratch: Vec<u8>,
}

/// Opens what one side receives.
pub struct Opener {
    key: LessSafeKey,
    length: LessSafeKey,
    seq: u64,
    wire: Wire,
    /// As the sealer's.
    scratch: Vec<u8>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealer({}, record {})", self.wire.name(), self.seq)
    }
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opener({}, record {})", self.wire.name(), self.seq)
    }
}

/// Both directions of one connection.
#[derive(Debug)]
pub struct Session {
    /// What this side sends.
    pub sealer: Sealer,
    /// What this side receives.
    pub opener: Opener,
}

impl Session {
    pub(crate) fn new(wire: Wire, send: Keys, recv: Keys) -> Self {
        Self {
            sealer: Sealer { key: send.record, length: send.length, seq: 0, wire, scratch: Vec::new() },
            opener: Opener { key: recv.record, length: recv.length, seq: 0, wire, scratch: Vec::new() },
        }
    }

    /// Both ends of one connection, for tests: what one seals the other
    /// opens.
    #[cfg(test)]
    pub(crate) fn pair(wire: Wire) -> (Session, Session) {
        let k =
            |label: &[u8]| Keys { record: derive(&[7u8; 32], b"salt", &[label]), length: derive(&[7u8; 32], b"salt", &[label, b"len"]) };
        (Session::new(wire, k(b"a to b"), k(b"b to a")), Session::new(wire, k(b"b to a"), k(b"a to b")))
    }

    /// The protection in force.
    pub fn wire(&self) -> Wire {
        self.sealer.wire
    }
}

impl Sealer {
    /// Appends `plain` to `out` as records of at most [`RECORD_MAX`] bytes
    /// each (one empty record when `plain` is empty).
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        if plain.is_empty() {
            return self.seal_record(plain, out);
        }
        out.reserve(plain.len() + plain.len().div_ceil(RECORD_MAX) * (PREFIX + TAG));
        for chunk in plain.chunks(RECORD_MAX) {
            self.seal_record(chunk, out);
        }
    }

    /// Appends `plain` (at most [`RECORD_MAX`] bytes) to `out` as one record.
    pub fn seal_record(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        self.seal_parts(&[plain], out);
    }

    /// Appends the concatenation of `parts` (at most [`RECORD_MAX`] bytes
    /// in all) to `out` as one record, copied once.
    pub fn seal_parts(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= RECORD_MAX);
        out.reserve(PREFIX + len + TAG);
        let start = out.len();
        out.extend_from_slice(&[0u8; PREFIX]);
        for p in parts {
            out.extend_from_slice(p);
        }
        let (prefix, body) = out[start..].split_at_mut(PREFIX);
        let (p, tag) = self.seal_in_place(body);
        prefix.copy_from_slice(&p);
        out.extend_from_slice(&tag);
    }

    /// Seals `body` (at most [`RECORD_MAX`] bytes) as the next record
    /// where it lies: under [`Wire::Aead`] it is encrypted in place. The
    /// record on the wire is the returned prefix, then `body`, then the
    /// returned tag.
    pub fn seal_in_place(&mut self, body: &mut [u8]) -> ([u8; PREFIX], [u8; TAG]) {
        debug_assert!(body.len() <= RECORD_MAX);
        let mut prefix = [0u8; PREFIX];
        prefix[..LEN].copy_from_slice(&(body.len() as u32).to_le_bytes());
        let check = length_check(&self.length, self.seq, &prefix[..LEN]);
        prefix[LEN..].copy_from_slice(&check);
        let n = nonce(self.seq);
        self.seq += 1;
        let tag: Tag = match self.wire {
            Wire::Aead => self.key.seal_in_place_separate_tag(n, Aad::from(&prefix), body),
            Wire::Mac => mac_tag(&self.key, n, &prefix, body, &mut self.scratch),
        }
        .expect("a record is far below AES-GCM's message limit");
        (prefix, tag.as_ref().try_into().expect("16 bytes"))
    }

    /// Records sealed so far.
    pub fn records(&self) -> u64 {
        self.seq
    }
}

impl Opener {
    /// The bytes that follow the prefix of the record due next: its body
    /// and tag.
    ///
    /// # Errors
    /// [`SealError::Forged`] when the length's check fails,
    /// [`SealError::TooLong`] when it announces more than [`RECORD_MAX`].
    pub fn rest(&self, prefix: &[u8; PREFIX]) -> std::result::Result<usize, SealError> {
        let (len, check) = prefix.split_at(LEN);
        let want = length_check(&self.length, self.seq, len);
        // Compared without an early exit.
        if want.iter().zip(check).fold(0u8, |d, (w, c)| d | (w ^ c)) != 0 {
            return Err(SealError::Forged(self.seq));
        }
        let n = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        if n > RECORD_MAX {
            return Err(SealError::TooLong(n as u64));
        }
        Ok(n + TAG)
    }

    /// Opens the next record, `record` being all of it (prefix, body,
    /// tag), in place; returns its payload.
    ///
    /// # Errors
    /// [`SealError`] when it does not verify as the record due next (its
    /// sequence number is then spent: the stream cannot be trusted again).
    pub fn open<'a>(&mut self, record: &'a mut [u8]) -> std::result::Result<&'a [u8], SealError> {
        let seq = self.seq;
        if record.len() < PREFIX + TAG {
            self.seq += 1;
            return Err(SealError::Forged(seq));
        }
        let prefix: [u8; PREFIX] = record[..PREFIX].try_into().expect("8 bytes");
        let rest = self.rest(&prefix);
        self.seq += 1;
        if rest? != record.len() - PREFIX {
            return Err(SealError::Forged(seq));
        }
        let end = record.len() - TAG;
        match self.wire {
            Wire::Aead => {
                let (prefix, body) = record.split_at_mut(PREFIX);
                let plain = self.key.open_in_place(nonce(seq), Aad::from(&*prefix), body).map_err(|_| SealError::Forged(seq))?;
                Ok(&*plain)
            }
            Wire::Mac => {
                let (prefix, body) = record[..end].split_at(PREFIX);
                let want = mac_tag(&self.key, nonce(seq), prefix, body, &mut self.scratch).map_err(|_| SealError::Forged(seq))?;
                // Compared without an early exit.
                if want.as_ref().iter().zip(&record[end..]).fold(0u8, |d, (w, t)| d | (w ^ t)) != 0 {
                    return Err(SealError::Forged(seq));
                }
                Ok(&record[PREFIX..end])
            }
        }
    }

    /// Records opened (or refused) so far.
    pub fn records(&self) -> u64 {
        self.seq
    }
}

/// A blocking stream whose every byte travels in records of its
/// [`Session`]: what is written is sealed, what is read has been opened.
#[derive(Debug)]
pub struct Sealed<S> {
    inner: S,
    session: Session,
    /// The record being read, then its payload between `at` and `end`.
    record: Vec<u8>,
    at: usize,
    end: usize,
    out: Vec<u8>,
}

impl<S> Sealed<S> {
    /// Protects `inner` with `session` (both from the handshake).
    pub fn new(inner: S, session: Session) -> Self {
        Self { inner, session, record: Vec::new(), at: 0, end: 0, out: Vec::new() }
    }

    /// The stream beneath (for descriptors, shutdown, polling).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream beneath, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The session's keys and counters.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Whether payload of an opened record waits to be read.
    pub fn buffered(&self) -> usize {
        self.end - self.at
    }

    /// Seals `plain` as records into a buffer of the caller's (for a write
    /// that carries descriptors).
    pub fn seal_to(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        self.session.sealer.seal(plain, out);
    }

    /// Opens a whole record the caller received itself (with descriptors).
    ///
    /// # Errors
    /// As [`Opener::open`].
    pub fn open_from<'a>(&mut self, record: &'a mut [u8]) -> std::result::Result<&'a [u8], SealError> {
        debug_assert_eq!(self.buffered(), 0, "a record received beside the stream while payload waits");
        self.session.opener.open(record)
    }
}

impl<S: Read> Sealed<S> {
    /// Reads and opens the next record. `Ok(false)` at a clean end of the
    /// stream (before any byte of a record).
    fn next_record(&mut self) -> io::Result<bool> {
        let mut prefix = [0u8; PREFIX];
        let mut got = 0;
        while got < PREFIX {
            match self.inner.read(&mut prefix[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stream ended inside a record")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let rest = self.session.opener.rest(&prefix)?;
        self.record.clear();
        self.record.extend_from_slice(&prefix);
        self.record.resize(PREFIX + rest, 0);
        self.inner.read_exact(&mut self.record[PREFIX..])?;
        let n = self.session.opener.open(&mut self.record)?.len();
        self.at = PREFIX;
        self.end = PREFIX + n;
        Ok(true)
    }
}

impl<S: Read> Read for Sealed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.at == self.end {
            if !self.next_record()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.end - self.at);
        buf[..n].copy_from_slice(&self.record[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl<S: Write> Write for Sealed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        // Sealed and sent a few records at a time, so a large answer needs
        // no copy of its own size.
        for chunk in buf.chunks(2 * RECORD_MAX) {
            self.out.clear();
            self.session.sealer.seal(chunk, &mut self.out);
            self.inner.write_all(&self.out)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A stream whose reads and writes can be bounded in time (TCP and Unix
/// streams), so a handshake never waits past its deadline.
pub trait Timed: Read + Write {
    /// Makes the stream blocking, with `t` as its read and write timeout.
    ///
    /// # Errors
    /// The system call's.
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Timed for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl<S: Timed> Timed for Sealed<S> {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.inner.set_timeouts(t)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use proptest::prelude::*;

    use super::*;

    fn pair(wire: Wire) -> (Session, Session) {
        Session::pair(wire)
    }

    fn records(s: &mut Sealer, parts: &[&[u8]]) -> Vec<Vec<u8>> {
        parts
            .iter()
            .map(|p| {
                let mut v = Vec::new();
                s.seal_record(p, &mut v);
                v
            })
            .collect()
    }

    #[test]
    fn records_round_trip_in_both_modes_and_aead_hides_the_payload() {
        for wire in [Wire::Aead, Wire::Mac] {
            let (mut a, mut b) = pair(wire);
            let payload = b"row 17 of table t, column 3".repeat(100);
            let mut wire_bytes = Vec::new();
            a.sealer.seal(&payload, &mut wire_bytes);
            let visible = wire_bytes.windows(20).any(|w| w == &payload[..20]);
            assert_eq!(visible, wire == Wire::Mac, "{wire:?}");
            let plain = b.opener.open(&mut wire_bytes).unwrap();
            assert_eq!(plain, &payload[..]);
        }
    }

    #[test]
    fn a_record_sealed_in_place_opens_and_a_flipped_bit_in_it_does_not() {
        for wire in [Wire::Aead, Wire::Mac] {
            let (mut a, mut b) = pair(wire);
            let payload: Vec<u8> = (0..RECORD_MAX).map(|i| (i * 7 % 253) as u8).collect();
            let mut body = payload.clone();
            let (prefix, tag) = a.sealer.seal_in_place(&mut body);
            assert_eq!(body == payload, wire == Wire::Mac, "{wire:?}: the body is ciphertext only under aead");
            let record = [&prefix[..], &body, &tag].concat();
            let mut flipped = record.clone();
            flipped[PREFIX + RECORD_MAX / 2] ^= 1;
            assert_eq!(b.opener.open(&mut record.clone()).unwrap(), &payload[..]);
            assert_eq!(b.opener.open(&mut flipped), Err(SealError::Forged(1)), "{wire:?}");
        }
    }

    #[test]
    fn a_replayed_reordered_or_dropped_record_is_refused() {
        for wire in [Wire::Aead, Wire::Mac] {
            // Replay: record 0 twice.
            let (mut a, mut b) = pair(wire);
            let r = records(&mut a.sealer, &[b"first", b"second", b"third"]);
            b.opener.open(&mut r[0].clone()).unwrap();
            assert_eq!(b.opener.open(&mut r[0].clone()), Err(SealError::Forged(1)));
            // Reorder: record 1 before record 0.
            let (mut a, mut b) = pair(wire);
            let r = records(&mut a.sealer, &[b"first", b"second"]);
            assert_eq!(b.opener.open(&mut r[1].clone()), Err(SealError::Forged(0)));
            // Drop: record 0 never arrives.
            let (mut a, mut b) = pair(wire);
            let r = records(&mut a.sealer, &[b"first", b"second"]);
            assert_eq!(b.opener.open(&mut r[1].clone()), Err(SealError::Forged(0)));
            // Reflected: a side's own record sent back to it.
            let (mut a, _) = pair(wire);
            let mut r = records(&mut a.sealer, &[b"mine"]);
            assert_eq!(a.opener.open(&mut r[0]), Err(SealError::Forged(0)));
        }
    }

    #[test]
    fn a_changed_length_is_refused_before_its_bytes_are_awaited() {
        let (mut a, b) = pair(Wire::Aead);
        let mut rec = Vec::new();
        a.sealer.seal_record(b"twelve bytes", &mut rec);
        let prefix: [u8; PREFIX] = rec[..PREFIX].try_into().unwrap();
        assert_eq!(b.opener.rest(&prefix), Ok(12 + TAG));
        for bit in 0..32 {
            let mut p = prefix;
            p[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(b.opener.rest(&p), Err(SealError::Forged(0)), "bit {bit}");
        }
    }

    #[test]
    fn a_sealed_stream_carries_large_writes_and_refuses_a_flipped_bit() {
        let (x, y) = UnixStream::pair().unwrap();
        let (a, b) = pair(Wire::Aead);
        let mut w = Sealed::new(x, a);
        let mut r = Sealed::new(y, b);
        let data: Vec<u8> = (0..3 * RECORD_MAX + 5).map(|i| (i * 31 % 251) as u8).collect();
        let sender = {
            let data = data.clone();
            std::thread::spawn(move || {
                w.write_all(&data).unwrap();
                w
            })
        };
        let mut got = vec![0u8; data.len()];
        r.read_exact(&mut got).unwrap();
        assert_eq!(got, data);
        let mut w = sender.join().unwrap();
        // A bit flipped on the way: the reader refuses the record.
        let mut rec = Vec::new();
        w.seal_to(b"hello", &mut rec);
        rec[PREFIX + 2] ^= 4;
        w.get_mut().write_all(&rec).unwrap();
        let e = r.read(&mut [0u8; 5]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("authentication failed"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Any single flipped bit anywhere in a record is refused.
        #[test]
        fn every_flipped_bit_is_found(len in 0usize..300, bit in any::<usize>(), mac in any::<bool>()) {
            let wire = if mac { Wire::Mac } else { Wire::Aead };
            let (mut a, mut b) = pair(wire);
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut rec = Vec::new();
            a.sealer.seal_record(&payload, &mut rec);
            let bit = bit % (rec.len() * 8);
            rec[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(b.opener.open(&mut rec).is_err());
        }
    }
}
