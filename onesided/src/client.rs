//! A reader's connections to read servers: connecting, the handshake,
//! requests and their answers, liveness.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::{Duration, Instant};

use wholemem::CommonError;
use wm_comm::JobKey;
use wm_comm::auth::{self, ReaderId, Timed};
use wm_comm::session::{PREFIX, SealError, Sealed, TAG};

use crate::wire::{self, Request, Response};
use crate::{Error, Result};

/// One connection to a read server, and where it stands in the
/// request/answer sequence. Everything after the handshake travels sealed
/// with the keys it gave.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: Sealed<Stream>,
    /// Requests sent so far: the id of the next one.
    sent: u64,
    /// Answers read in full so far: the id of the one due next.
    answered: u64,
}

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Timed for Stream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_timeouts(t),
            Stream::Tcp(s) => s.set_timeouts(t),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Conn {
    /// Fills every buffer of `bufs`, in order: rows into their places, each
    /// byte only once the record that carried it has authenticated.
    pub(crate) fn read_into(&mut self, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        for b in bufs.iter_mut() {
            self.read_exact(b)?;
        }
        Ok(())
    }

    /// Sends one request, header and body in one write; returns its id.
    pub(crate) fn send(&mut self, request: &[u8]) -> io::Result<u64> {
        let id = self.sent;
        // Counted before the write: a request cut short is still one the
        // connection owes an answer to, so it is out of step.
        self.sent += 1;
        self.write_all(request)?;
        Ok(id)
    }

    /// Reads the header of the answer due next, which must say `expect`
    /// bytes of rows follow (or an error message). The caller reads what
    /// follows, then calls [`settled`](Self::settled).
    ///
    /// # Errors
    /// [`Error::Malformed`] for an answer to another request, of another
    /// length or status; the error of a lost connection.
    pub(crate) fn answer(&mut self, table: &str, owner: usize, at: &Addr, expect: usize) -> Result<Response> {
        let mut h = [0u8; wire::HEADER];
        self.read_exact(&mut h).map_err(|e| lost(table, owner, at, "reading an answer", &e))?;
        self.check(&h, owner, expect)
    }

    /// Checks an answer's header `h` (read by the caller) as
    /// [`answer`](Self::answer) does.
    fn check(&self, h: &[u8; wire::HEADER], owner: usize, expect: usize) -> Result<Response> {
        if self.answered >= self.sent {
            return Err(Error::Malformed { from: format!("rank {owner}'s read server"), detail: "an answer to no request".into() });
        }
        Response::decode(h, self.answered, expect).map_err(|d| Error::Malformed { from: format!("rank {owner}'s read server"), detail: d })
    }

    /// Records that the answer due has been read in full.
    pub(crate) fn settled(&mut self) {
        self.answered += 1;
    }

    /// Whether every answer asked for has been read in full: only such a
    /// connection may carry another request.
    pub(crate) fn in_step(&self) -> bool {
        self.answered == self.sent
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.stream.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a read server listens.
#[derive(Debug, Clone)]
pub(crate) enum Addr {
    /// Its abstract Unix socket (same node).
    Unix(String),
    /// Its TCP address.
    Tcp(SocketAddr),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Unix(n) => write!(f, "@{n}"),
            Addr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// Who a reader is and what it proves: the same for all its connections.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub key: JobKey,
    pub who: ReaderId,
    /// How long one request may wait for its answer.
    pub timeout: Duration,
}

/// Whether an I/O error means the server went away (the table was freed or
/// its process ended) rather than a slow or broken one.
pub(crate) fn is_gone(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionRefused | ConnectionAborted | BrokenPipe | NotConnected)
        || e.raw_os_error() == Some(libc::ECONNREFUSED)
}

/// The error for a failed exchange with `owner`'s server at `at`.
pub(crate) fn lost(table: &str, owner: usize, at: &Addr, what: &str, e: &io::Error) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<SealError>()) {
        Error::Malformed { from: format!("rank {owner}'s read server at {at} (table {table:?})"), detail: format!("{what}: {e}") }
    } else if is_gone(e) {
        Error::Gone {
            table: table.to_owned(),
            detail: format!("rank {owner}'s read server at {at} is gone while {what} ({e}): the job freed the table or ended"),
        }
    } else if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        Error::Common(CommonError::Timeout { what: format!("{what} from rank {owner}'s read server at {at} (table {table:?})"), secs: 0.0 })
    } else {
        Error::io(format!("{what} from rank {owner}'s read server at {at} (table {table:?})"), io::Error::new(e.kind(), e.to_string()))
    }
}

/// Connects to a read server and proves this reader's key; the server
/// proves its own. `nonce` is the one the server published.
pub(crate) fn connect(table: &str, owner: usize, at: &Addr, nonce: u64, id: &Identity) -> Result<Conn> {
    let deadline = Instant::now() + id.timeout.min(Duration::from_secs(30));
    // A server shedding unauthenticated connections under a flood closes
    // some callers' connections before they prove themselves: such a
    // close is retried for a while (a key mismatch is reported after it).
    let retry_until = Instant::now() + RETRY_CLOSED.min(id.timeout);
    loop {
        match connect_once(table, owner, at, nonce, id, deadline) {
            Err(Refused::Closed(e)) if Instant::now() < retry_until => {
                drop(e);
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(Refused::Closed(e) | Refused::Other(e)) => return Err(e),
            Ok(c) => return Ok(c),
        }
    }
}

/// How long a reader retries connections closed during its handshake.
pub(crate) const RETRY_CLOSED: Duration = Duration::from_secs(10);

enum Refused {
    Closed(Error),
    Other(Error),
}

impl From<Error> for Refused {
    fn from(e: Error) -> Self {
        Self::Other(e)
    }
}

fn connect_once(table: &str, owner: usize, at: &Addr, nonce: u64, id: &Identity, deadline: Instant) -> std::result::Result<Conn, Refused> {
    let mut stream = match at {
        Addr::Unix(name) => {
            let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::io("an abstract socket name", e))?;
            let s = UnixStream::connect_addr(&addr).map_err(|e| lost(table, owner, at, "connecting", &e))?;
            // The server must run as this user: nobody else gets to serve
            // rows to this process.
            let uid = wm_comm::fdpass::peer_uid(&s).map_err(|e| Error::io("reading a read server's credentials", e))?;
            if uid != wm_comm::fdpass::effective_uid() {
                return Err(
                    Error::Refused { at: at.to_string(), detail: format!("the server there runs as uid {uid}, not as this user") }.into()
                );
            }
            Stream::Unix(s)
        }
        Addr::Tcp(a) => {
            wm_comm::tcp::choice().map_err(Error::from)?;
            let s =
                wm_comm::tcp::connect(*a, id.timeout.min(Duration::from_secs(30))).map_err(|e| lost(table, owner, at, "connecting", &e))?;
            let _ = s.set_nodelay(true);
            Stream::Tcp(s)
        }
    };
    let session = match auth::call_as_reader(&mut stream, &id.key, id.who, nonce, deadline) {
        Ok(session) => session,
        Err(r) => {
            let e = Error::Refused { at: format!("rank {owner}'s read server at {at}"), detail: r.detail };
            return Err(if r.closed { Refused::Closed(e) } else { Refused::Other(e) });
        }
    };
    stream.set_timeouts(id.timeout).map_err(|e| Error::io("setting a connection's timeouts", e))?;
    Ok(Conn { stream: Sealed::new(stream, session), sent: 0, answered: 0 })
}

impl Conn {
    /// Asks for the owner's `count` memfds (Unix connections).
    pub(crate) fn portion(&mut self, table: &str, owner: usize, at: &Addr, count: usize, timeout: Duration) -> Result<Vec<OwnedFd>> {
        if !matches!(self.stream.get_ref(), Stream::Unix(_)) {
            return Err(Error::Unsupported { what: "receiving a portion".into(), reason: "only over a Unix socket".into() });
        }
        // As `send`, on the stream that carries descriptors.
        self.sent += 1;
        self.write_all(&Request::Portion.encode()).map_err(|e| lost(table, owner, at, "asking for its portion", &e))?;
        // The answer's header is one record, the descriptors on its first byte.
        let mut rec = [0u8; PREFIX + wire::HEADER + TAG];
        let Stream::Unix(s) = self.stream.get_ref() else { unreachable!("checked above") };
        let fds = wm_comm::fdpass::recv_fds(s, &mut rec, count, Instant::now() + timeout)
            .map_err(|e| lost(table, owner, at, "receiving its portion", &e))?;
        let plain = self.stream.open_from(&mut rec).map_err(|e| lost(table, owner, at, "receiving its portion", &e.into()))?;
        let h: [u8; wire::HEADER] = plain.try_into().map_err(|_| Error::Malformed {
            from: format!("rank {owner}'s read server"),
            detail: format!("an answer header of {} bytes", plain.len()),
        })?;
        let r = self.check(&h, owner, 0)?;
        if !r.ok {
            let msg = self.message(r.bytes, table, owner, at)?;
            return Err(Error::Common(CommonError::PeerFailed { rank: owner, detail: msg }));
        }
        self.settled();
        if fds.len() != count {
            return Err(Error::Malformed {
                from: format!("rank {owner}'s read server"),
                detail: format!("{} descriptors with its portion, not {count}", fds.len()),
            });
        }
        Ok(fds)
    }

    /// Reads the error message of `n` bytes that follows an answer's
    /// header (bounded by the header's check): the answer is then settled.
    pub(crate) fn message(&mut self, n: usize, table: &str, owner: usize, at: &Addr) -> Result<String> {
        let mut m = vec![0u8; n.min(wire::MAX_MESSAGE)];
        self.read_exact(&mut m).map_err(|e| lost(table, owner, at, "reading an error message", &e))?;
        self.settled();
        Ok(String::from_utf8_lossy(&m).into_owned())
    }

    /// The server's epoch.
    pub(crate) fn ping(&mut self, table: &str, owner: usize, at: &Addr) -> Result<u64> {
        self.send(&Request::Ping.encode()).map_err(|e| lost(table, owner, at, "pinging", &e))?;
        let r = self.answer(table, owner, at, 0)?;
        if !r.ok {
            let msg = self.message(r.bytes, table, owner, at)?;
            return Err(Error::Common(CommonError::PeerFailed { rank: owner, detail: msg }));
        }
        self.settled();
        Ok(r.epoch)
    }

    /// Makes the connection a liveness probe: non-blocking, never used for
    /// requests again.
    pub(crate) fn into_probe(self) -> Result<Probe> {
        match self.stream.get_ref() {
            Stream::Unix(s) => s.set_nonblocking(true),
            Stream::Tcp(s) => s.set_nonblocking(true),
        }
        .map_err(|e| Error::io("making a connection non-blocking", e))?;
        Ok(Probe(self))
    }
}

/// A connection kept open only to notice when the server goes away: the
/// server never writes on it unasked, so anything readable — the end of the
/// stream, an error — means it closed.
#[derive(Debug)]
pub(crate) struct Probe(Conn);

impl Probe {
    /// Whether the server is still there (one non-blocking `recv`).
    pub(crate) fn alive(&self) -> bool {
        let mut b = [0u8; 1];
        // Nothing is ever expected on a probe, so reading (not peeking)
        // loses nothing.
        let r = match self.0.stream.get_ref() {
            Stream::Unix(s) => (&*s).read(&mut b),
            Stream::Tcp(s) => (&*s).read(&mut b),
        };
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}
