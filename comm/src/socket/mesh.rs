//! The mesh: one authenticated connection per pair of ranks.
//!
//! Each rank connects to every lower rank and accepts every higher one.
//! Every accepted connection is checked on a thread of its own, bounded in
//! time, so a stranger that stays silent costs nothing but that thread:
//! Unix connections must come from this user (`SO_PEERCRED`), and every
//! caller must prove it holds the job key and claim a rank that is due —
//! with the nonces of both records, so a stale record from an earlier job
//! that had the same key is never taken for a live rank. Strangers are
//! dropped and reported, never fatal.

use std::io;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::bootstrap::{Listeners, RankInfo, Rendezvous, warn};
use super::endpoint::Conn;
use super::rendezvous::read_rank_file;
use crate::auth::{self, Claim, JobKey, Purpose};
use crate::gate::{Gate, handshake_limit};
use crate::session::{Session, Wire};
use crate::sys;
use crate::{Error, Result};

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// A caller that proved itself: its rank, the connection, and its fresh
/// record when the one this rank held was stale.
type Admitted = (usize, (Conn, Session), Option<RankInfo>);

/// What an accepting thread needs to judge a caller.
struct Judge {
    me: usize,
    world: usize,
    my_nonce: u64,
    /// Each rank's record nonce as this rank knows it.
    nonces: Vec<u64>,
    /// Where fresher records may be found (`dir:` rendezvous).
    dir: Option<PathBuf>,
    key: JobKey,
    wire: Wire,
}

impl Judge {
    /// Accepts a claim of a higher rank meaning this rank; returns the
    /// caller's fresh record when ours was stale.
    fn judge(&self, c: &Claim) -> std::result::Result<Option<RankInfo>, String> {
        if c.purpose != Purpose::Mesh {
            return Err("it is not a mesh call".into());
        }
        if c.world != self.world as u64 || c.rank <= self.me as u64 || c.rank >= self.world as u64 {
            return Err(format!("it claims rank {} of {}; rank {} of {} accepts ranks above it", c.rank, c.world, self.me, self.world));
        }
        if c.to_nonce != self.my_nonce {
            return Err("it means another process (a record of an earlier job)".into());
        }
        let r = c.rank as usize;
        if c.from_nonce == self.nonces[r] {
            return Ok(None);
        }
        // We may hold a stale record of the caller; the caller wrote its
        // fresh one before calling.
        match self.dir.as_deref().and_then(|d| read_rank_file(d, r, self.world, &self.key).ok().and_then(|f| f.ok().flatten())) {
            Some(i) if i.nonce == c.from_nonce => Ok(Some(i)),
            _ => Err(format!("it is not the rank {r} this job knows (a process of an earlier job?)")),
        }
    }
}

/// Connects every pair of ranks. Returns one connection per rank (`None` at
/// this rank's index); `infos` is updated where a fresher record was found.
pub(crate) fn mesh(
    l: &Listeners,
    infos: &mut [RankInfo],
    how: Option<&Rendezvous>,
    key: &JobKey,
    deadline: Instant,
) -> Result<Vec<Option<(Conn, Session)>>> {
    let me = l.info.rank;
    let world = infos.len();
    let dir = match how {
        Some(Rendezvous::Dir(d)) => Some(d.clone()),
        _ => None,
    };
    let wire = Wire::current()?;
    let limit = handshake_limit()?;
    let mut conns: Vec<Option<(Conn, Session)>> = (0..world).map(|_| None).collect();
    // Connect down, each attempt within the handshake limit (a stale
    // record's address may now belong to a listener that never answers).
    for r in 0..me {
        let conn = loop {
            match connect(&l.info, &infos[r], key, wire, deadline.min(Instant::now() + limit)) {
                Ok(c) => break c,
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Bootstrap(format!("rank {me} cannot connect to rank {r}: {e}")));
                    }
                    // A record left by an earlier job: wait for the fresh one.
                    std::thread::sleep(Duration::from_millis(20));
                    if let Some(i) = dir.as_deref().and_then(|d| read_rank_file(d, r, world, key).ok().and_then(|f| f.ok().flatten())) {
                        infos[r] = i;
                    }
                }
            }
        };
        conns[r] = Some(conn);
    }
    // Accept up.
    let judge =
        Arc::new(Judge { me, world, my_nonce: l.info.nonce, nonces: infos.iter().map(|i| i.nonce).collect(), dir, key: key.clone(), wire });
    let (tx, rx) = mpsc::channel::<Admitted>();
    let gate = Gate::new(format!("rank {me}'s mesh listeners"));
    let mut missing = world - 1 - me;
    while missing > 0 {
        let mut pfds = [
            libc::pollfd { fd: l.unix.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: l.tcp.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        sys::poll(&mut pfds, 20).map_err(|e| Error::io("waiting for connections", e))?;
        loop {
            let mut got = false;
            if let Ok((s, _)) = l.unix.accept() {
                got = true;
                admit(Conn::Unix(s), &judge, &tx, &gate, (limit, deadline));
            }
            if let Ok((s, _)) = l.tcp.accept() {
                got = true;
                let _ = s.set_nodelay(true);
                crate::tcp::record(&s);
                admit(Conn::Tcp(s), &judge, &tx, &gate, (limit, deadline));
            }
            if !got {
                break;
            }
        }
        while let Ok((r, c, fresh)) = rx.try_recv() {
            if conns[r].is_some() {
                warn(&format!("rank {me} refused a second connection claiming rank {r}"));
                continue;
            }
            if let Some(i) = fresh {
                infos[r] = i;
            }
            conns[r] = Some(c);
            missing -= 1;
        }
        if missing > 0 && Instant::now() >= deadline {
            let ranks: Vec<usize> = (me + 1..world).filter(|&r| conns[r].is_none()).collect();
            return Err(Error::Timeout { op: "connecting ranks", ranks, secs: 0.0 });
        }
    }
    for (c, _) in conns.iter().flatten() {
        c.set_streaming().map_err(|e| Error::io("socket", e))?;
    }
    Ok(conns)
}

/// Where a connection came from, for reports.
fn origin(c: &Conn) -> String {
    match c {
        Conn::Unix(s) => match sys::peer_cred(s.as_raw_fd()) {
            Ok((pid, uid)) => format!("a local process (pid {pid}, uid {uid})"),
            Err(_) => "a local process".into(),
        },
        Conn::Tcp(s) => s.peer_addr().map_or_else(|_| "a TCP peer".into(), |a| a.to_string()),
    }
}

/// The peer of a Unix connection must run as this user.
fn check_uid(c: &Conn) -> std::result::Result<(), String> {
    if let Conn::Unix(s) = c {
        let me = sys::effective_uid();
        let (_, uid) = sys::peer_cred(s.as_raw_fd()).map_err(|e| format!("its credentials cannot be read: {e}"))?;
        if uid != me {
            return Err(format!("it runs as uid {uid}, this job as uid {me}"));
        }
    }
    Ok(())
}

/// The peer a gate counts a connection against: its address, or its uid.
fn peer_key(c: &Conn) -> String {
    match c {
        Conn::Unix(s) => sys::peer_cred(s.as_raw_fd()).map_or_else(|_| "a local process".into(), |(_, uid)| format!("uid {uid}")),
        Conn::Tcp(s) => s.peer_addr().map_or_else(|_| "a TCP peer".into(), |a| a.ip().to_string()),
    }
}

fn admit(mut c: Conn, judge: &Arc<Judge>, tx: &mpsc::Sender<Admitted>, gate: &Arc<Gate>, (limit, deadline): (Duration, Instant)) {
    let me = judge.me;
    // Another user's process on this node is refused before it costs a
    // thread or a slot.
    if let Err(why) = check_uid(&c) {
        warn(&format!("rank {me} refused a connection from {}: {why}", origin(&c)));
        return;
    }
    let kill: Option<crate::gate::Shut> = match &c {
        Conn::Unix(s) => s.try_clone().ok().map(crate::gate::Shut::Unix),
        Conn::Tcp(s) => s.try_clone().ok().map(crate::gate::Shut::Tcp),
    };
    let Some(kill) = kill else {
        warn(&format!("rank {me} refused a connection from {}: cannot duplicate its socket", origin(&c)));
        return;
    };
    let ticket = match gate.admit(&peer_key(&c), 2, Box::new(move || kill.shutdown())) {
        Ok(t) => t,
        Err(why) => {
            warn(&format!("rank {me} refused a connection from {}: {why}", origin(&c)));
            return;
        }
    };
    let (judge, tx) = (judge.clone(), tx.clone());
    let spawned = std::thread::Builder::new().name("wm-mesh-accept".into()).spawn(move || {
        let limit = (Instant::now() + limit).min(deadline);
        let mut fresh = None;
        let judged = |claim: &Claim| judge.judge(claim).map(|f| fresh = f);
        let checked = match &mut c {
            Conn::Unix(s) => auth::serve(s, &judge.key, judge.wire, limit, judged),
            Conn::Tcp(s) => auth::serve(s, &judge.key, judge.wire, limit, judged),
        }
        .map_err(|e| e.to_string());
        match checked {
            Ok((claim, session)) => {
                ticket.authenticated();
                let _ = tx.send((claim.rank as usize, (c, session), fresh));
            }
            Err(_) if ticket.evicted() => {}
            Err(why) => warn(&format!("rank {me} refused a connection from {}: {why}", origin(&c))),
        }
        drop(ticket);
    });
    if spawned.is_err() {
        warn(&format!("rank {me} refused a connection: cannot start a thread for it"));
    }
}

fn connect(me: &RankInfo, peer: &RankInfo, key: &JobKey, wire: Wire, deadline: Instant) -> io::Result<(Conn, Session)> {
    let claim =
        Claim { purpose: Purpose::Mesh, wire, rank: me.rank as u64, world: me.world as u64, from_nonce: me.nonce, to_nonce: peer.nonce };
    let refused = |e: auth::HandshakeError| io::Error::other(format!("rank {}: {e}", peer.rank));
    if peer.node_id == me.node_id {
        let addr = UnixAddr::from_abstract_name(peer.unix_name.as_bytes())?;
        let mut s = UnixStream::connect_addr(&addr)?;
        let (_, uid) = sys::peer_cred(s.as_raw_fd())?;
        if uid != sys::effective_uid() {
            return Err(io::Error::other(format!("the process listening as rank {} runs as uid {uid}, not as this user", peer.rank)));
        }
        let session = auth::call(&mut s, key, &claim, deadline).map_err(refused)?;
        Ok((Conn::Unix(s), session))
    } else {
        let addr = peer.tcp_addr.parse().map_err(io::Error::other)?;
        let mut s = crate::tcp::connect(addr, left(deadline).min(Duration::from_secs(5)))?;
        s.set_nodelay(true)?;
        let session = auth::call(&mut s, key, &claim, deadline).map_err(refused)?;
        Ok((Conn::Tcp(s), session))
    }
}

impl Conn {
    /// After the handshake: non-blocking, no timeouts (the endpoint polls).
    fn set_streaming(&self) -> io::Result<()> {
        match self {
            Conn::Unix(s) => {
                s.set_read_timeout(None)?;
                s.set_write_timeout(None)?;
                s.set_nonblocking(true)
            }
            Conn::Tcp(s) => {
                s.set_read_timeout(None)?;
                s.set_write_timeout(None)?;
                s.set_nonblocking(true)
            }
        }
    }
}
