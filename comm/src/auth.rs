//! Who may join a job: the job key and the handshake that proves it.
//!
//! Every connection a wholemem process accepts — at rendezvous and on the
//! mesh — starts with a mutual challenge–response over HMAC-SHA256 keyed by
//! the job's secret [`JobKey`]. Neither side sends the key; each proves it
//! holds it by a MAC over both sides' fresh random challenges, so a recorded
//! exchange cannot be replayed and a reflected one does not verify (the two
//! directions use different labels). What the caller claims to be (which
//! rank, for which purpose, meaning which callee) is inside the MAC, so it
//! cannot be altered on the way.
//!
//! The exchange, in fixed sizes:
//!
//! ```text
//! server → client   "WMAUTH01" ‖ server challenge (32)                   40 bytes
//! client → server   client challenge (32) ‖ claim (48) ‖ client MAC (32) 112 bytes
//! server → client   server MAC (32)                                       32 bytes
//! client MAC = HMAC(key, "wholemem client v1" ‖ server ch. ‖ client ch. ‖ claim)
//! server MAC = HMAC(key, "wholemem server v1" ‖ server ch. ‖ client ch. ‖ claim)
//! ```
//!
//! The server answers only when the MAC verifies and the claim is one it
//! accepts; otherwise it closes the connection. Both sides then derive the
//! connection's keys (HKDF-SHA256 over the job key, both challenges and the
//! claim, one key per direction) and everything that follows travels in
//! sealed records (`session`): a relay that passed the handshake along
//! unchanged can neither read (`WM_WIRE=aead`) nor alter, replay, reorder
//! or drop a byte without the receiver's error. `docs/security.md` has the
//! threat model.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use wm_topology::env::{WM_JOB_KEY, WM_JOB_KEY_FILE};
use zeroize::Zeroize;

pub use crate::session::Timed;
use crate::session::{self, Session, Wire};
use crate::{Error, Result};

/// Bytes in a job key.
pub const KEY_LEN: usize = 32;
const CHALLENGE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const MAGIC: &[u8; 8] = b"WMAUTH01";
/// Bytes the server sends first.
pub(crate) const SERVER_HELLO_LEN: usize = MAGIC.len() + CHALLENGE_LEN;
/// Bytes of the client's answer.
pub(crate) const CLIENT_HELLO_LEN: usize = CHALLENGE_LEN + CLAIM_LEN + MAC_LEN;
const CLAIM_LEN: usize = 48;

/// The secret every process of one job holds: 32 random bytes, written as 64
/// hexadecimal digits in `WM_JOB_KEY` or a key file.
///
/// `Debug` does not show it, and it is wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; KEY_LEN]);

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(..)")
    }
}

impl Drop for JobKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl JobKey {
    /// A fresh key from the operating system's random source.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the system has no random source.
    pub fn generate() -> Result<Self> {
        let mut k = [0u8; KEY_LEN];
        fill_random(&mut k)?;
        Ok(Self(k))
    }

    /// Parses 64 hexadecimal digits (surrounding white space ignored).
    /// `source` names where the text came from, for the error, which never
    /// repeats the text itself (it may be a mistyped secret).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming `source` when the text is not 64 hex digits.
    pub fn from_hex(text: &str, source: &str) -> Result<Self> {
        let t = text.trim();
        let bad = || {
            Error::Bootstrap(format!(
                "{source} is not a job key: expected {} hexadecimal digits, got {} characters (make one with `openssl rand -hex 32`)",
                2 * KEY_LEN,
                t.chars().count()
            ))
        };
        if t.len() != 2 * KEY_LEN {
            return Err(bad());
        }
        let mut k = [0u8; KEY_LEN];
        for (i, pair) in t.as_bytes().chunks_exact(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => k[i] = (h * 16 + l) as u8,
                _ => return Err(bad()),
            }
        }
        Ok(Self(k))
    }

    /// A key from its bytes (e.g. received over a channel the job trusts).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The key as 64 lowercase hexadecimal digits (for `WM_JOB_KEY`).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key from `WM_JOB_KEY`, else from the file `WM_JOB_KEY_FILE`
    /// names, else `None`.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when a variable is set but holds no key, or the
    /// file cannot be read or is readable by other users.
    pub fn from_env() -> Result<Option<Self>> {
        if let Some(v) = WM_JOB_KEY.get() {
            return Self::from_hex(&v, WM_JOB_KEY.name).map(Some);
        }
        match WM_JOB_KEY_FILE.get() {
            Some(path) => Self::read_file(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// Reads a key file: opened without following a symbolic link
    /// (`O_NOFOLLOW | O_CLOEXEC`), then checked on the open descriptor — a
    /// regular file, owned by this user, readable by nobody else — so it
    /// cannot be swapped between the check and the read.
    ///
    /// # Errors
    /// [`Error::Untrusted`] naming the file when it is a link, not a
    /// regular file, someone else's or readable by others;
    /// [`Error::Bootstrap`] when it cannot be read or holds no key.
    pub fn read_file(path: &Path) -> Result<Self> {
        let what = "the job key file";
        let f = crate::owned_files::open_owned(path, true, what)?
            .ok_or_else(|| Error::Bootstrap(format!("cannot read {what} {}: it does not exist", path.display())))?;
        let mut text = String::new();
        (&f).take(4096).read_to_string(&mut text).map_err(|e| Error::Bootstrap(format!("cannot read {what} {}: {e}", path.display())))?;
        let key = Self::from_hex(&text, &format!("{what} {}", path.display()));
        text.zeroize();
        key
    }

    /// A value that shows whether two processes hold the same key without
    /// showing the key: a MAC of a fixed label. Safe to send to peers.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.mac(b"wholemem key fingerprint v1", &[], &[], &[]).finalize().into_bytes().into()
    }

    fn mac(&self, label: &[u8], server: &[u8], client: &[u8], claim: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(server);
        m.update(client);
        m.update(claim);
        m
    }
}

/// Fills `buf` from the operating system's random source.
pub(crate) fn fill_random(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::Bootstrap(format!("the system's random source failed: {e}")))
}

/// A random 64-bit value (nonces, names).
pub(crate) fn random_u64() -> Result<u64> {
    let mut b = [0u8; 8];
    fill_random(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Why a caller connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Purpose {
    /// A rank sending its record to rank 0.
    Rendezvous = 1,
    /// A rank connecting to a lower rank of the mesh.
    Mesh = 2,
    /// A one-sided reader (a rank or an outside process) connecting to a
    /// rank's read server or a job's table catalogue.
    Reader = 3,
}

/// What a caller says it is, covered by its MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub purpose: Purpose,
    /// How the caller protects what follows the handshake.
    pub wire: Wire,
    /// The caller's rank.
    pub rank: u64,
    /// The world size the caller belongs to.
    pub world: u64,
    /// The caller's record nonce.
    pub from_nonce: u64,
    /// The callee's record nonce as the caller knows it (0 when unknown).
    pub to_nonce: u64,
}

impl Claim {
    fn encode(&self) -> [u8; CLAIM_LEN] {
        let mut b = [0u8; CLAIM_LEN];
        b[0] = self.purpose as u8;
        b[1] = self.wire as u8;
        b[8..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..24].copy_from_slice(&self.world.to_le_bytes());
        b[24..32].copy_from_slice(&self.from_nonce.to_le_bytes());
        b[32..40].copy_from_slice(&self.to_nonce.to_le_bytes());
        b
    }

    fn decode(b: &[u8; CLAIM_LEN]) -> std::result::Result<Self, String> {
        let u = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let purpose = match b[0] {
            1 => Purpose::Rendezvous,
            2 => Purpose::Mesh,
            3 => Purpose::Reader,
            p => return Err(format!("unknown purpose {p}")),
        };
        let wire = Wire::from_u8(b[1]).ok_or_else(|| format!("unknown wire protection {}", b[1]))?;
        if b[2..8].iter().chain(&b[40..48]).any(|&x| x != 0) {
            return Err("reserved bytes are not zero".into());
        }
        Ok(Self { purpose, wire, rank: u(8), world: u(16), from_nonce: u(24), to_nonce: u(32) })
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Reads all of `buf` by `deadline` — the deadline of the whole read, not
/// of each piece: a caller that sends one byte at a time is cut off at
/// the same moment as one that sends nothing.
pub fn read_by<S: Timed>(s: &mut S, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the deadline passed"));
        }
        s.set_timeouts(left(deadline))?;
        match s.read(buf) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed")),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` by `deadline` (the whole write's deadline).
pub fn write_by<S: Timed>(s: &mut S, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the deadline passed"));
        }
        s.set_timeouts(left(deadline))?;
        match s.write(buf) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the connection took no bytes")),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why a handshake failed. `Refused` and `Malformed` mean the other side
/// is not (or does not behave like) a holder of the key.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The connection failed, closed or timed out.
    Io(io::Error),
    /// The other side sent something that is not this protocol.
    Malformed(String),
    /// The other side's MAC did not verify: it does not hold the key.
    WrongKey,
    /// The MAC verified but the server's check refused the claim.
    Claim(String),
    /// The server closed the connection before its first byte: refused by
    /// its policy (connection limits, credentials), not for the key.
    Dropped,
    /// The server closed the connection after reading the caller's proof:
    /// it holds another key, or refused the claim.
    Rejected,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) if matches!(e.kind(), io::ErrorKind::UnexpectedEof) => {
                f.write_str("the other side closed the connection during the handshake (a refusal, or not a wholemem process)")
            }
            Self::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                f.write_str("the handshake timed out")
            }
            Self::Io(e) => write!(f, "the handshake failed: {e}"),
            Self::Malformed(m) => write!(f, "not a wholemem handshake: {m}"),
            Self::WrongKey => f.write_str("it does not hold the job key (a key mismatch)"),
            Self::Claim(m) => write!(f, "its claim was refused: {m}"),
            Self::Dropped => f.write_str(
                "refused by policy: the other side closed the connection before its handshake (its connection limits or credential checks)",
            ),
            Self::Rejected => f.write_str(
                "the other side refused this process's proof: a key mismatch (is WM_JOB_KEY the same on both sides?), or a claim it does not accept",
            ),
        }
    }
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Parses the client's answer: its challenge, claim and MAC.
pub(crate) fn parse_client_hello(b: &[u8; CLIENT_HELLO_LEN]) -> std::result::Result<([u8; 32], Claim, [u8; 32]), String> {
    let mut challenge = [0u8; CHALLENGE_LEN];
    challenge.copy_from_slice(&b[..CHALLENGE_LEN]);
    let mut claim = [0u8; CLAIM_LEN];
    claim.copy_from_slice(&b[CHALLENGE_LEN..CHALLENGE_LEN + CLAIM_LEN]);
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(&b[CHALLENGE_LEN + CLAIM_LEN..]);
    Ok((challenge, Claim::decode(&claim)?, mac))
}

/// Parses the server's first bytes: its challenge.
pub(crate) fn parse_server_hello(b: &[u8; SERVER_HELLO_LEN]) -> std::result::Result<[u8; 32], String> {
    if &b[..MAGIC.len()] != MAGIC {
        return Err("bad magic".into());
    }
    let mut c = [0u8; CHALLENGE_LEN];
    c.copy_from_slice(&b[MAGIC.len()..]);
    Ok(c)
}

const CLIENT_LABEL: &[u8] = b"wholemem client v1";
const SERVER_LABEL: &[u8] = b"wholemem server v1";
const SESSION_LABEL: &[u8] = b"wholemem session v1";
const TO_SERVER: &[u8] = b"caller to callee";
const TO_CLIENT: &[u8] = b"callee to caller";

/// The connection's keys: HKDF-SHA256 with both challenges as salt, the
/// job key as input, and the label, the claim (purpose and protection,
/// the caller's rank and world, its record nonce and the nonce of the
/// record it dialled) and the direction as info. Either side gets its
/// sending key and its receiving key.
fn session_keys(key: &JobKey, server: &[u8], client: &[u8], claim: &[u8; CLAIM_LEN], wire: Wire, caller: bool) -> Session {
    let salt = [server, client].concat();
    let dir = |d: &[u8]| session::Keys {
        record: session::derive(&key.0, &salt, &[SESSION_LABEL, claim, d]),
        length: session::derive(&key.0, &salt, &[SESSION_LABEL, claim, d, b" lengths"]),
    };
    let (to_server, to_client) = (dir(TO_SERVER), dir(TO_CLIENT));
    if caller { Session::new(wire, to_server, to_client) } else { Session::new(wire, to_client, to_server) }
}

/// The accepting side: challenges the caller, checks its MAC, that it
/// protects frames as `wire` says, and lets `accept` judge its claim, then
/// proves itself. Everything by `deadline`. Returns the claim and the
/// connection's keys.
pub(crate) fn serve<S: Timed>(
    s: &mut S,
    key: &JobKey,
    wire: Wire,
    deadline: Instant,
    accept: impl FnOnce(&Claim) -> std::result::Result<(), String>,
) -> std::result::Result<(Claim, Session), HandshakeError> {
    let mut server = [0u8; CHALLENGE_LEN];
    fill_random(&mut server).map_err(|e| HandshakeError::Io(io::Error::other(e.to_string())))?;
    let mut hello = [0u8; SERVER_HELLO_LEN];
    hello[..MAGIC.len()].copy_from_slice(MAGIC);
    hello[MAGIC.len()..].copy_from_slice(&server);
    write_by(s, &hello, deadline)?;
    let mut answer = [0u8; CLIENT_HELLO_LEN];
    read_by(s, &mut answer, deadline)?;
    let (client, claim, mac) = parse_client_hello(&answer).map_err(HandshakeError::Malformed)?;
    let claim_bytes = &answer[CHALLENGE_LEN..CHALLENGE_LEN + CLAIM_LEN];
    key.mac(CLIENT_LABEL, &server, &client, claim_bytes).verify_slice(&mac).map_err(|_| HandshakeError::WrongKey)?;
    if claim.wire != wire {
        return Err(HandshakeError::Claim(format!(
            "it protects frames with {}={}, this process with {}",
            wm_topology::env::WM_WIRE.name,
            claim.wire.name(),
            wire.name()
        )));
    }
    accept(&claim).map_err(HandshakeError::Claim)?;
    let proof = key.mac(SERVER_LABEL, &server, &client, claim_bytes).finalize().into_bytes();
    write_by(s, &proof, deadline)?;
    let claim_bytes: [u8; CLAIM_LEN] = claim_bytes.try_into().expect("48 bytes");
    Ok((claim, session_keys(key, &server, &client, &claim_bytes, wire, false)))
}

/// The connecting side: answers the server's challenge with `claim`, then
/// checks the server's proof. Everything by `deadline`. Returns the
/// connection's keys.
pub(crate) fn call<S: Timed>(s: &mut S, key: &JobKey, claim: &Claim, deadline: Instant) -> std::result::Result<Session, HandshakeError> {
    let closed = |e: io::Error, then: HandshakeError| {
        if matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) {
            then
        } else {
            HandshakeError::Io(e)
        }
    };
    let mut hello = [0u8; SERVER_HELLO_LEN];
    read_by(s, &mut hello, deadline).map_err(|e| closed(e, HandshakeError::Dropped))?;
    let server = parse_server_hello(&hello).map_err(HandshakeError::Malformed)?;
    let mut client = [0u8; CHALLENGE_LEN];
    fill_random(&mut client).map_err(|e| HandshakeError::Io(io::Error::other(e.to_string())))?;
    let claim_bytes = claim.encode();
    let mac = key.mac(CLIENT_LABEL, &server, &client, &claim_bytes).finalize().into_bytes();
    let mut answer = [0u8; CLIENT_HELLO_LEN];
    answer[..CHALLENGE_LEN].copy_from_slice(&client);
    answer[CHALLENGE_LEN..CHALLENGE_LEN + CLAIM_LEN].copy_from_slice(&claim_bytes);
    answer[CHALLENGE_LEN + CLAIM_LEN..].copy_from_slice(&mac);
    write_by(s, &answer, deadline).map_err(|e| closed(e, HandshakeError::Rejected))?;
    let mut proof = [0u8; MAC_LEN];
    read_by(s, &mut proof, deadline).map_err(|e| closed(e, HandshakeError::Rejected))?;
    key.mac(SERVER_LABEL, &server, &client, &claim_bytes).verify_slice(&proof).map_err(|_| HandshakeError::WrongKey)?;
    Ok(session_keys(key, &server, &client, &claim_bytes, claim.wire, true))
}

/// Who a one-sided reader says it is, inside its MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderId {
    /// A rank of the job (its world rank).
    Rank(usize),
    /// A process outside the job that holds the key.
    Outside,
}

/// The claim a reader makes: its identity, and the nonce the server
/// published (so a proof made for one server is worth nothing at another).
fn reader_claim(who: ReaderId, server: u64, wire: Wire) -> Claim {
    let rank = match who {
        ReaderId::Rank(r) => r as u64,
        ReaderId::Outside => u64::MAX,
    };
    Claim { purpose: Purpose::Reader, wire, rank, world: 0, from_nonce: 0, to_nonce: server }
}

/// A one-sided reader's side of the handshake with a read server or a
/// table catalogue (`wm-onesided`): proves it holds `key`, claims `who`,
/// names the server by the nonce the server published, and checks the
/// server's proof. Everything by `deadline`. Returns the connection's keys:
/// everything after the handshake goes through them
/// ([`Sealed`](crate::session::Sealed)), protected as `WM_WIRE` says.
///
/// # Errors
/// Why the handshake failed, in words (refused, wrong key, timed out, a
/// bad `WM_WIRE`).
pub fn call_as_reader<S: Timed>(
    s: &mut S,
    key: &JobKey,
    who: ReaderId,
    server: u64,
    deadline: Instant,
) -> std::result::Result<Session, Refusal> {
    let wire = Wire::current().map_err(|e| Refusal { closed: false, detail: e.to_string() })?;
    call(s, key, &reader_claim(who, server, wire), deadline)
        .map_err(|e| Refusal { closed: matches!(e, HandshakeError::Dropped | HandshakeError::Rejected), detail: e.to_string() })
}

/// Why a reader's handshake failed.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Why, in words (names the cause: key mismatch, policy, timeout).
    pub detail: String,
    /// The server closed the connection without a verdict — a key
    /// mismatch, or a listener shedding unauthenticated connections under
    /// load (worth a retry within the caller's deadline).
    pub closed: bool,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// A read server's side of that handshake: accepts only a reader that
/// proves `key`, names `server` and protects frames as this process does;
/// then proves itself. Returns who the reader claims to be, and the
/// connection's keys.
///
/// # Errors
/// Why the caller was refused, in words (for the server's log).
pub fn serve_reader<S: Timed>(s: &mut S, key: &JobKey, server: u64, deadline: Instant) -> std::result::Result<(ReaderId, Session), String> {
    let wire = Wire::current().map_err(|e| e.to_string())?;
    let (claim, session) = serve(s, key, wire, deadline, |c| {
        if c.purpose != Purpose::Reader {
            return Err("it is not a one-sided reader".into());
        }
        if c.to_nonce != server || c.world != 0 || c.from_nonce != 0 {
            return Err("its claim names another server".into());
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let who = if claim.rank == u64::MAX { ReaderId::Outside } else { ReaderId::Rank(usize::try_from(claim.rank).unwrap_or(usize::MAX)) };
    Ok((who, session))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::thread;

    use proptest::prelude::*;

    use super::*;

    fn claim() -> Claim {
        Claim { purpose: Purpose::Mesh, wire: Wire::Aead, rank: 3, world: 4, from_nonce: 77, to_nonce: 88 }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn keys_parse_print_and_hide() {
        let k = JobKey::generate().unwrap();
        let hex = k.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(JobKey::from_hex(&format!(" {hex}\n"), "test").unwrap(), k);
        assert_eq!(format!("{k:?}"), "JobKey(..)");
        for bad in ["", "abc", &"g".repeat(64), &"0".repeat(63), &"0".repeat(65)] {
            let e = JobKey::from_hex(bad, "WM_JOB_KEY").unwrap_err().to_string();
            assert!(e.contains("WM_JOB_KEY") && e.contains("64 hexadecimal digits"), "{e}");
            assert!(bad.is_empty() || !e.contains(bad), "the error repeats the text: {e}");
        }
        assert_ne!(JobKey::generate().unwrap(), k, "two fresh keys are equal");
    }

    fn handshake(
        server_key: &JobKey,
        client_key: &JobKey,
        refuse: bool,
    ) -> (std::result::Result<(Claim, Session), String>, std::result::Result<Session, String>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let sk = server_key.clone();
        let server = thread::spawn(move || {
            serve(&mut a, &sk, Wire::Aead, soon(), |c| if refuse { Err(format!("rank {} is not expected", c.rank)) } else { Ok(()) })
                .map_err(|e| e.to_string())
                .inspect_err(|_| drop(a))
        });
        let client = call(&mut b, client_key, &claim(), soon()).map_err(|e| e.to_string());
        (server.join().unwrap(), client)
    }

    /// Whether what `from` seals, `to` opens.
    fn talks(from: &mut Session, to: &mut Session) -> bool {
        let mut rec = Vec::new();
        from.sealer.seal(b"row bytes", &mut rec);
        to.opener.open(&mut rec).is_ok_and(|p| p == b"row bytes")
    }

    #[test]
    fn both_sides_prove_the_key_and_share_keys_nobody_else_derives() {
        let k = JobKey::generate().unwrap();
        let (s, c) = handshake(&k, &k, false);
        let (got, mut server) = s.unwrap();
        let mut client = c.unwrap();
        assert_eq!(got, claim());
        assert!(talks(&mut client, &mut server) && talks(&mut server, &mut client));
        // A second handshake between the same processes gets other keys:
        // nothing of one connection opens on another.
        let (s2, c2) = handshake(&k, &k, false);
        let (_, mut server2) = s2.unwrap();
        let _ = c2.unwrap();
        assert!(!talks(&mut client, &mut server2));
    }

    #[test]
    fn a_caller_with_another_wire_protection_is_refused_by_name() {
        let k = JobKey::generate().unwrap();
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let sk = k.clone();
        let server = thread::spawn(move || serve(&mut a, &sk, Wire::Mac, soon(), |_| Ok(())).map_err(|e| e.to_string()));
        let _ = call(&mut b, &k, &claim(), soon());
        let e = server.join().unwrap().unwrap_err();
        assert!(e.contains("WM_WIRE=aead, this process with mac"), "{e}");
    }

    #[test]
    fn a_wrong_key_is_refused_on_both_sides() {
        let (s, c) = handshake(&JobKey::generate().unwrap(), &JobKey::generate().unwrap(), false);
        assert!(s.unwrap_err().contains("does not hold the job key"));
        let c = c.unwrap_err();
        assert!(c.contains("refused this process's proof") && c.contains("key mismatch"), "{c}");
    }

    #[test]
    fn a_refused_claim_gets_no_proof() {
        let k = JobKey::generate().unwrap();
        let (s, c) = handshake(&k, &k, true);
        assert!(s.unwrap_err().contains("rank 3 is not expected"));
        assert!(c.is_err());
    }

    #[test]
    fn a_server_without_the_key_is_found_out() {
        // A stranger that listens where rank 0 should: it sends a valid
        // hello but cannot produce the proof.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let stranger = thread::spawn(move || {
            let mut hello = [0u8; SERVER_HELLO_LEN];
            hello[..8].copy_from_slice(MAGIC);
            a.write_all(&hello).unwrap();
            let mut answer = [0u8; CLIENT_HELLO_LEN];
            a.read_exact(&mut answer).unwrap();
            a.write_all(&[7u8; MAC_LEN]).unwrap();
        });
        let e = call(&mut b, &JobKey::generate().unwrap(), &claim(), soon()).unwrap_err();
        assert!(matches!(e, HandshakeError::WrongKey), "{e}");
        stranger.join().unwrap();
    }

    #[test]
    fn readers_prove_the_key_and_name_their_server() {
        let k = JobKey::generate().unwrap();
        for (who, server_nonce, named, ok) in
            [(ReaderId::Outside, 5, 5, true), (ReaderId::Rank(2), 5, 5, true), (ReaderId::Outside, 5, 6, false)]
        {
            let (mut a, mut b) = UnixStream::pair().unwrap();
            let sk = k.clone();
            let server = thread::spawn(move || serve_reader(&mut a, &sk, server_nonce, soon()).inspect_err(|_| drop(a)));
            let client = call_as_reader(&mut b, &k, who, named, soon()).map_err(|r| r.detail);
            let served = server.join().unwrap();
            assert_eq!(client.is_ok(), ok, "{client:?}");
            match served {
                Ok((got, _)) => assert!(ok && got == who, "{got:?}"),
                Err(e) => assert!(!ok && e.contains("names another server"), "{e}"),
            }
        }
        // A rank's mesh claim is not a reader's.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let sk = k.clone();
        let server = thread::spawn(move || serve_reader(&mut a, &sk, 0, soon()).inspect_err(|_| drop(a)));
        let _ = call(&mut b, &k, &claim(), soon());
        assert!(server.join().unwrap().unwrap_err().contains("not a one-sided reader"));
    }

    #[test]
    fn a_silent_server_times_out() {
        let (_a, mut b) = UnixStream::pair().unwrap();
        let e = call(&mut b, &JobKey::generate().unwrap(), &claim(), Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
    }

    proptest! {
        #[test]
        fn client_hellos_never_panic(bytes in proptest::collection::vec(any::<u8>(), CLIENT_HELLO_LEN)) {
            let mut b = [0u8; CLIENT_HELLO_LEN];
            b.copy_from_slice(&bytes);
            let _ = parse_client_hello(&b);
        }

        #[test]
        fn server_hellos_never_panic(bytes in proptest::collection::vec(any::<u8>(), SERVER_HELLO_LEN)) {
            let mut b = [0u8; SERVER_HELLO_LEN];
            b.copy_from_slice(&bytes);
            let _ = parse_server_hello(&b);
        }

        #[test]
        fn arbitrary_answers_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            // Whatever a stranger sends, the server refuses it and does not panic.
            let (mut a, mut b) = UnixStream::pair().unwrap();
            let key = JobKey([9u8; KEY_LEN]);
            let writer = thread::spawn(move || {
                let mut hello = [0u8; SERVER_HELLO_LEN];
                let _ = b.read_exact(&mut hello);
                let _ = b.write_all(&bytes);
            });
            let r = serve(&mut a, &key, Wire::Aead, Instant::now() + Duration::from_millis(200), |_| Ok(()));
            prop_assert!(r.is_err());
            drop(a);
            writer.join().unwrap();
        }

        #[test]
        fn claims_round_trip(rank in any::<u64>(), world in any::<u64>(), f in any::<u64>(), t in any::<u64>(), mesh in any::<bool>()) {
            let wire = if mesh { Wire::Mac } else { Wire::Aead };
            let c = Claim { purpose: if mesh { Purpose::Mesh } else { Purpose::Rendezvous }, wire, rank, world, from_nonce: f, to_nonce: t };
            prop_assert_eq!(Claim::decode(&c.encode()).unwrap(), c);
        }
    }
}
