//! A rank's read server: answers readers' requests for its rows from a
//! read-only mapping of its own portion, on threads of its own, so the
//! rank itself never takes part in a read.
//!
//! Two listeners — an abstract Unix socket for readers on this node (which
//! may also ask for the portion's memfds, handed out read-only, to map
//! them themselves) and TCP for the others — and one acceptor thread
//! polling both and a wake-up socket. Every connection passes a
//! [`Gate`] (the process's descriptor budget, a bounded share of
//! unauthenticated connections per peer, the oldest evicted when full)
//! and gets a thread: the reader's handshake (job key, all of it within
//! `WM_HANDSHAKE_S`; on Unix sockets also this user's uid, checked before
//! anything else), then requests until the reader hangs up. Strangers are
//! refused and reported, never fatal. [`Server::stop`] wakes the acceptor
//! through the wake-up socket it opened at start — no new descriptor, so
//! it returns even when the process has none left — and shuts every
//! connection down, so readers see the table go at once.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wm_comm::JobKey;
use wm_comm::auth::{self, Timed};
use wm_comm::gate::{Gate, Shut, Ticket};
use wm_comm::session::Sealed;
use wm_gather::rows::gather_from;
use wm_gather::{DType, RowLayout};

use crate::record::UNIX_PREFIX;
use crate::shm::Mapped;
use crate::wire::{self, Request, Response};
use crate::{Error, Result};

/// What every connection thread shares.
#[derive(Debug)]
struct Shared {
    table: String,
    /// This rank's world rank (for messages).
    rank: usize,
    rows: Mapped,
    count: usize,
    row_bytes: usize,
    /// The portion's memfds, for readers on this node.
    portion: Vec<OwnedFd>,
    key: JobKey,
    nonce: u64,
    epoch: AtomicU64,
    stop: AtomicBool,
    /// Every open connection, so `stop` can shut them down.
    conns: Mutex<HashMap<u64, Open>>,
    next: AtomicU64,
    timeout: Duration,
    /// How long a caller has for its whole handshake.
    handshake: Duration,
    gate: Arc<Gate>,
}

/// An open connection: a handle to shut it down with, and its thread.
type Open = (Stream, Option<JoinHandle<()>>);

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// A running read server.
#[derive(Debug)]
pub(crate) struct Server {
    shared: Arc<Shared>,
    acceptors: Vec<JoinHandle<()>>,
    /// Written to wake the acceptor at stop.
    wake: UnixStream,
    pub unix_name: String,
    pub tcp_addr: SocketAddr,
}

/// What a server serves.
pub(crate) struct Serve {
    pub table: String,
    pub rank: usize,
    pub rows: Mapped,
    pub count: usize,
    pub row_bytes: usize,
    pub portion: Vec<OwnedFd>,
    pub key: JobKey,
    pub nonce: u64,
    pub timeout: Duration,
    /// The address to listen on for other nodes.
    pub ip: std::net::IpAddr,
}

impl Server {
    /// Opens the listeners and starts serving.
    pub(crate) fn start(s: Serve) -> Result<Self> {
        let unix_name = format!("{UNIX_PREFIX}{}.{:016x}", std::process::id(), s.nonce);
        let addr = UnixAddr::from_abstract_name(unix_name.as_bytes()).map_err(|e| Error::io("an abstract socket name", e))?;
        let unix = UnixListener::bind_addr(&addr).map_err(|e| Error::io("binding a read server's Unix socket", e))?;
        let tcp = TcpListener::bind((s.ip, 0)).map_err(|e| Error::io(format!("binding a read server on {}", s.ip), e))?;
        // The rows it sends go at the job's congestion control's pace, from
        // each connection's first byte (before anyone knows the address).
        wm_comm::tcp::listen(&tcp)?;
        let tcp_addr = tcp.local_addr().map_err(|e| Error::io("a read server's address", e))?;
        let handshake = wm_comm::gate::handshake_limit()?;
        let gate = Gate::new(format!("rank {}'s read server of table {:?}", s.rank, s.table));
        let shared = Arc::new(Shared {
            table: s.table,
            rank: s.rank,
            rows: s.rows,
            count: s.count,
            row_bytes: s.row_bytes,
            portion: s.portion,
            key: s.key,
            nonce: s.nonce,
            epoch: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            timeout: s.timeout,
            handshake,
            gate,
        });
        let (wake, woken) = UnixStream::pair().map_err(|e| Error::io("a read server's wake-up socket", e))?;
        for (what, r) in [("Unix", unix.set_nonblocking(true)), ("TCP", tcp.set_nonblocking(true))] {
            r.map_err(|e| Error::io(format!("a read server's {what} listener"), e))?;
        }
        let sh = shared.clone();
        let acceptors = vec![spawn("wm-onesided-accept", move || accept_loop(&sh, &unix, &tcp, &woken))?];
        Ok(Self { shared, acceptors, wake, unix_name, tcp_addr })
    }

    /// Sets the epoch readers are told.
    pub(crate) fn set_epoch(&self, e: u64) {
        self.shared.epoch.store(e, Ordering::Release);
    }

    /// Stops serving: no new connections; every open one shut down (its
    /// reader's next request fails saying the table is gone); every thread
    /// joined.
    pub(crate) fn stop(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the acceptor through the socket it polls (it also looks at
        // the flag every poll interval, should this write fail).
        let _ = (&self.wake).write(&[1]);
        for a in self.acceptors.drain(..) {
            let _ = a.join();
        }
        let conns: Vec<Open> = self.shared.conns.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, v)| v).collect();
        for (s, _) in &conns {
            s.shutdown();
        }
        for (_, h) in conns {
            if let Some(h) = h {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io("starting a read server thread", e))
}

fn report_accept(sh: &Shared, e: &io::Error) {
    if !sh.stop.load(Ordering::Acquire) {
        wm_comm::warn(&format!("rank {}: accepting a one-sided reader of table {:?} failed: {e}", sh.rank, sh.table));
        // Out of descriptors, say: do not spin.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How often the acceptor looks at the stop flag without being woken.
const ACCEPT_POLL: Duration = Duration::from_millis(500);

/// Accepts on both listeners until `stop`: woken by a byte on `woken`.
fn accept_loop(sh: &Arc<Shared>, unix: &UnixListener, tcp: &TcpListener, woken: &UnixStream) {
    while !sh.stop.load(Ordering::Acquire) {
        let ready = match wm_comm::gate::wait_readable(&[unix.as_fd(), tcp.as_fd(), woken.as_fd()], ACCEPT_POLL) {
            Ok(r) => r,
            Err(e) => {
                report_accept(sh, &e);
                continue;
            }
        };
        if ready[2] || sh.stop.load(Ordering::Acquire) {
            break;
        }
        if ready[0] {
            loop {
                match unix.accept() {
                    Ok((s, _)) => admit_unix(sh, s),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        report_accept(sh, &e);
                        break;
                    }
                }
            }
        }
        if ready[1] {
            loop {
                match tcp.accept() {
                    Ok((s, from)) => {
                        let _ = s.set_nodelay(true);
                        admit(sh, Stream::Tcp(s), from.to_string(), from.ip().to_string());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        report_accept(sh, &e);
                        break;
                    }
                }
            }
        }
    }
}

/// A Unix connection: another user's process is refused before it costs
/// a slot or a thread.
fn admit_unix(sh: &Arc<Shared>, s: UnixStream) {
    match wm_comm::fdpass::peer_uid(&s) {
        Ok(uid) if uid == wm_comm::fdpass::effective_uid() => {
            admit(sh, Stream::Unix(s), "a process on this node".into(), format!("uid {uid}"))
        }
        Ok(uid) => refused(sh, "a process on this node", format!("it runs as uid {uid}, not as this user")),
        Err(e) => refused(sh, "a process on this node", format!("its credentials cannot be read: {e}")),
    }
}

fn refused(sh: &Shared, from: &str, why: String) {
    wm_comm::warn(&format!("rank {} refused a one-sided reader of table {:?} from {from}: {why}", sh.rank, sh.table));
}

/// Registers a connection and gives it a thread.
fn admit(sh: &Arc<Shared>, s: Stream, from: String, peer: String) {
    let kill = match &s {
        Stream::Unix(u) => u.try_clone().map(Shut::Unix),
        Stream::Tcp(t) => t.try_clone().map(Shut::Tcp),
    };
    let Ok(kill) = kill else {
        return refused(sh, &from, "cannot duplicate its socket".into());
    };
    // Three descriptors: the stream, its copy for `stop`, the evictor's.
    let ticket = match sh.gate.admit(&peer, 3, Box::new(move || kill.shutdown())) {
        Ok(t) => t,
        Err(why) => return refused(sh, &from, why),
    };
    let mut conns = sh.conns.lock().unwrap_or_else(|p| p.into_inner());
    let kept = match &s {
        Stream::Unix(u) => u.try_clone().map(Stream::Unix),
        Stream::Tcp(t) => t.try_clone().map(Stream::Tcp),
    };
    let Ok(kept) = kept else {
        drop(conns);
        wm_comm::warn(&format!("rank {} refused a one-sided reader from {from}: cannot duplicate its socket", sh.rank));
        return;
    };
    let id = sh.next.fetch_add(1, Ordering::Relaxed);
    let sh2 = sh.clone();
    let who = from.clone();
    let spawned = spawn("wm-onesided-conn", move || {
        serve(&sh2, s, &who, &ticket);
        // Gone from the table unless `stop` took it (and joins this thread).
        let mine = sh2.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        drop(mine);
    });
    match spawned {
        Ok(h) => {
            conns.insert(id, (kept, Some(h)));
        }
        Err(_) => {
            drop(conns);
            wm_comm::warn(&format!("rank {} refused a one-sided reader from {from}: cannot start a thread for it", sh.rank));
        }
    }
}

/// The reader's side of the handshake on `s`: its session, or `None` when
/// it failed (reported, unless the gate evicted the connection meanwhile).
fn handshake<S: Timed>(sh: &Shared, s: &mut S, from: &str, ticket: &Ticket, deadline: Instant) -> Option<wm_comm::session::Session> {
    match auth::serve_reader(s, &sh.key, sh.nonce, deadline) {
        Ok((_, session)) => {
            ticket.authenticated();
            Some(session)
        }
        Err(why) => {
            if !ticket.evicted() {
                refused(sh, from, why);
            }
            None
        }
    }
}

/// One connection, from handshake to hang-up.
fn serve(sh: &Shared, s: Stream, from: &str, ticket: &Ticket) {
    let deadline = Instant::now() + sh.handshake;
    let result = match s {
        Stream::Unix(mut u) => {
            let Some(session) = handshake(sh, &mut u, from, ticket, deadline) else { return };
            let dup = u.try_clone().ok();
            requests(sh, &mut Sealed::new(u, session), dup.as_ref())
        }
        Stream::Tcp(mut t) => {
            let Some(session) = handshake(sh, &mut t, from, ticket, deadline) else { return };
            requests(sh, &mut Sealed::new(t, session), None)
        }
    };
    if let Err(e) = result
        && !sh.stop.load(Ordering::Acquire)
        && !crate::client::is_gone(&e)
    {
        wm_comm::warn(&format!("rank {}: a one-sided reader of table {:?} from {from}: {e}", sh.rank, sh.table));
    }
}

/// Answers requests until the reader hangs up (`Ok`) or breaks the
/// protocol (`Err`, after telling it why). `unix` is the connection again
/// when it can carry descriptors.
///
/// Every answer carries the id of the request it answers: its sequence
/// number on this connection, counted from 0 (`wire`). A request the
/// server can parse but not serve (a row it does not own) is answered with
/// an error and the connection stays in step; after a header it cannot
/// parse it cannot tell where the next request starts, so it answers and
/// hangs up.
fn requests<S: Read + Write + Timed>(sh: &Shared, s: &mut Sealed<S>, unix: Option<&UnixStream>) -> io::Result<()> {
    // Idle readers wait as long as they like; a reader that stops reading
    // an answer is given up on after the timeout.
    s.set_timeouts(sh.timeout)?;
    let mut ids: Vec<u64> = Vec::new();
    let mut rows: Vec<usize> = Vec::new();
    for id in 0u64.. {
        let mut h = [0u8; wire::HEADER];
        match read_idle(s, &mut h) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(e),
        }
        let request = match Request::decode(&h, sh.row_bytes) {
            Ok(r) => r,
            Err(why) => {
                // The stream cannot be trusted past a bad header.
                let _ = answer_error(s, sh, id, &why);
                return Err(io::Error::other(format!("a bad request: {why}")));
            }
        };
        let epoch = sh.epoch.load(Ordering::Acquire);
        match request {
            Request::Ping => s.write_all(&Response { id, ok: true, epoch, bytes: 0 }.encode())?,
            Request::Portion => match unix {
                Some(u) => {
                    // The answer's header as one record, the descriptors on
                    // its first byte.
                    let mut rec = Vec::new();
                    s.seal_to(&Response { id, ok: true, epoch, bytes: 0 }.encode(), &mut rec);
                    let fds: Vec<_> = sh.portion.iter().map(AsFd::as_fd).collect();
                    wm_comm::fdpass::send_fds(u, &rec, &fds, Instant::now() + sh.timeout)?;
                }
                None => answer_error(s, sh, id, "a portion is handed out over a Unix socket only")?,
            },
            Request::Read { rows: n, skip, len } => {
                ids.resize(n, 0);
                s.read_exact(bytemuck::cast_slice_mut(&mut ids))?;
                rows.clear();
                rows.extend(ids.iter().map(|&i| usize::try_from(i).unwrap_or(usize::MAX)));
                if let Some((i, &r)) = rows.iter().enumerate().find(|&(_, &r)| r >= sh.count) {
                    answer_error(s, sh, id, &format!("row {r} at position {i} is not one of its {} rows", sh.count))?;
                    continue;
                }
                let head = Response { id, ok: true, epoch, bytes: n * len }.encode();
                send_rows(sh, s, &head, &rows, skip, len)?;
            }
        }
    }
    Ok(())
}

/// Rows staged at a time for sealing: about this many bytes.
const STAGE_BYTES: usize = 1 << 20;

/// Sends `head`, then `len` bytes from byte `skip` of each of `rows`,
/// copied from the mapping a stage at a time and sealed as they go.
fn send_rows<S: Write>(sh: &Shared, s: &mut Sealed<S>, head: &[u8], rows: &[usize], skip: usize, len: usize) -> io::Result<()> {
    let src = sh.rows.source().map_err(|e| io::Error::other(e.to_string()))?;
    let layout = RowLayout::new(DType::I8, len, skip).map_err(|e| io::Error::other(e.to_string()))?;
    let per = (STAGE_BYTES / len).max(1);
    let mut stage = head.to_vec();
    if rows.is_empty() {
        return s.write_all(&stage);
    }
    for chunk in rows.chunks(per) {
        let at = stage.len();
        stage.resize(at + chunk.len() * len, 0);
        gather_from(&src, &layout, chunk, None, &mut stage[at..], DType::I8, 1).map_err(|e| io::Error::other(e.to_string()))?;
        s.write_all(&stage)?;
        stage.clear();
    }
    Ok(())
}

/// Reads a request header, waiting as long as it takes for its first
/// byte: `Ok(false)` when the reader hung up.
fn read_idle<S: Read + Timed>(s: &mut S, h: &mut [u8; wire::HEADER]) -> io::Result<bool> {
    let mut got = 0;
    while got == 0 {
        match s.read(&mut h[..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got = n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
            Err(e) if crate::client::is_gone(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    s.read_exact(&mut h[got..])?;
    Ok(true)
}

/// Answers request `id` with an error message (the connection stays in step).
fn answer_error<W: Write>(s: &mut W, sh: &Shared, id: u64, why: &str) -> io::Result<()> {
    let msg = &why.as_bytes()[..why.len().min(wire::MAX_MESSAGE)];
    s.write_all(&Response { id, ok: false, epoch: sh.epoch.load(Ordering::Acquire), bytes: msg.len() }.encode())?;
    s.write_all(msg)
}
