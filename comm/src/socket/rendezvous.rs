//! Rendezvous: how every rank gets the table of all ranks' records.
//!
//! - `host:port`: rank 0 listens there and serves callers concurrently,
//!   each within the whole-handshake deadline (`WM_HANDSHAKE_S`) and behind
//!   a [`Gate`] (a bounded share of unauthenticated connections, the oldest
//!   evicted when full), so a silent, dripping or garbled connection costs
//!   one thread for a few seconds, never the job. A caller proves it holds
//!   the job key before it may send its record; rank 0 proves it back before
//!   the caller trusts the table; record and table are signed with the key.
//!   With port 0, rank 0 lets the kernel pick the port and publishes it in
//!   `WM_RENDEZVOUS_PORT_FILE`. Rank 0 keeps the listener afterwards for
//!   the table catalogue ([`take_kept_listener`]): the port is never
//!   released and bound again.
//! - `dir:/path`: only a directory no other user can write
//!   ([`trust::check_dir`]); each rank writes its signed record (mode 600)
//!   and reads the others', refusing files that are not its user's or whose
//!   signature does not verify; the key comes from the environment or the
//!   directory's `job.key` (mode 600).

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use wm_topology::NodeIdentity;
use wm_topology::env::WM_RENDEZVOUS_PORT_FILE;

use super::bootstrap::{self, Listeners, RECORD_MAX, RankInfo, Rendezvous, warn};
use crate::auth::{self, Claim, HandshakeError, JobKey, Purpose};
use crate::gate::{Gate, handshake_limit};
use crate::session::{Sealed, Wire};
use crate::sys;
use crate::trust::{self, RecordKind};
use crate::{Error, Result};

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Runs rendezvous: opens this rank's listeners and returns them with
/// every rank's record, indexed by rank.
pub(crate) fn run(
    rank: usize,
    world: usize,
    node: &NodeIdentity,
    how: &Rendezvous,
    key: &JobKey,
    deadline: Instant,
) -> Result<(Listeners, Vec<RankInfo>)> {
    // A congestion control the host refuses fails this rank here, before
    // it publishes a port or waits for rank 0 (the listeners would fail
    // on it later, after others had waited).
    crate::tcp::choice()?;
    match how {
        Rendezvous::Tcp(addr) if rank == 0 => tcp_serve(world, node, addr, key, deadline),
        Rendezvous::Tcp(addr) => tcp_join(rank, world, node, addr, key, deadline),
        Rendezvous::Dir(dir) => {
            let l = Listeners::open(rank, world, node, bootstrap::choose_addr(bootstrap::hostname_ip)?)?;
            let infos = dir_rendezvous(&l.info, dir, key, deadline)?;
            Ok((l, infos))
        }
    }
}

/// A rendezvous connection after its handshake: every byte sealed.
type Channel = Sealed<TcpStream>;

fn write_frame(s: &mut Channel, body: &[u8], deadline: Instant) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("a rendezvous frame over 4 GiB"))?;
    auth::write_by(s, &[&len.to_le_bytes()[..], body].concat(), deadline)
}

/// Reads one length-prefixed frame of at most `max` bytes, all of it by
/// `deadline`; its buffer grows as the bytes arrive, never to the announced
/// length first.
fn read_frame(s: &mut Channel, max: usize, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    auth::read_by(s, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::other(format!("a rendezvous frame of {len} bytes (at most {max})")));
    }
    let mut body = Vec::new();
    while body.len() < len {
        let at = body.len();
        body.resize(at + (len - at).min(64 << 10), 0);
        auth::read_by(s, &mut body[at..], deadline)?;
    }
    Ok(body)
}

/// Rank 0's rendezvous listener, kept after the job has met so that the
/// table catalogue serves at the same address without binding it again.
static KEPT: Mutex<Option<TcpListener>> = Mutex::new(None);

/// The rendezvous listener this process kept, if it listens on `port`
/// (for the table catalogue of `wm-onesided`): handed over once.
pub fn take_kept_listener(port: u16) -> Option<TcpListener> {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    match kept.as_ref().map(TcpListener::local_addr) {
        Some(Ok(a)) if a.port() == port => kept.take(),
        _ => None,
    }
}

/// Binds rank 0's rendezvous listener at `addr` (port 0: a port the kernel
/// picks, published in `WM_RENDEZVOUS_PORT_FILE`).
fn bind_rendezvous(addr: &str) -> Result<TcpListener> {
    let resolved: Vec<SocketAddr> =
        addr.to_socket_addrs().map_err(|e| Error::Bootstrap(format!("cannot resolve rendezvous address {addr:?}: {e}")))?.collect();
    let first = *resolved.first().ok_or_else(|| Error::Bootstrap(format!("rendezvous address {addr:?} resolves to nothing")))?;
    let listener = match resolved.iter().find_map(|a| TcpListener::bind(a).ok()) {
        Some(l) => l,
        None => {
            // The name resolves to no address of this host (a service
            // address, a NAT): listen on every interface at that port.
            let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, first.port()))
                .map_err(|e| Error::Bootstrap(format!("rank 0 cannot listen on {addr} (is the port in use?): {e}")))?;
            warn(&format!("rank 0: {addr} is not an address of this host; listening on port {} of every interface", first.port()));
            l
        }
    };
    if first.port() == 0 {
        let port = listener.local_addr().map_err(|e| Error::io("rendezvous listener", e))?.port();
        publish_port(port)?;
    }
    Ok(listener)
}

/// The port file the tests of this module use instead of the variable
/// (setting a variable is unsafe beside threads that may read the
/// environment).
#[cfg(test)]
static TEST_PORT_FILE: Mutex<Option<PathBuf>> = Mutex::new(None);

fn port_file() -> Result<PathBuf> {
    #[cfg(test)]
    if let Some(p) = TEST_PORT_FILE.lock().ok().and_then(|p| p.clone()) {
        return Ok(p);
    }
    WM_RENDEZVOUS_PORT_FILE.get().map(PathBuf::from).ok_or_else(|| {
        Error::Bootstrap(format!(
            "a rendezvous at port 0 needs {} (where rank 0 writes the port it listens on)",
            WM_RENDEZVOUS_PORT_FILE.name
        ))
    })
}

fn publish_port(port: u16) -> Result<()> {
    let path = port_file()?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        writeln!(f, "{port}")?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| Error::io(format!("publishing the rendezvous port in {}", path.display()), e))
}

/// The port rank 0 published, once it has.
fn published_port(deadline: Instant) -> Result<u16> {
    let path = port_file()?;
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(p) = text.trim().parse::<u16>()
            && p != 0
        {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout { op: "rendezvous (waiting for rank 0 to publish its port)", ranks: vec![0], secs: 0.0 });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a rendezvous caller's thread hands back: its checked record and
/// the stream to send the table on.
type Arrival = (RankInfo, Channel);

fn tcp_serve(world: usize, node: &NodeIdentity, addr: &str, key: &JobKey, deadline: Instant) -> Result<(Listeners, Vec<RankInfo>)> {
    let listener = bind_rendezvous(addr)?;
    let bound = listener.local_addr().map_err(|e| Error::io("rendezvous listener", e))?;
    let chosen = bootstrap::choose_addr(|| if bound.ip().is_unspecified() { bootstrap::hostname_ip() } else { bound.ip() })?;
    let l = Listeners::open(0, world, node, chosen)?;
    listener.set_nonblocking(true).map_err(|e| Error::io("rendezvous listener", e))?;
    let mut infos: Vec<Option<RankInfo>> = vec![None; world];
    infos[0] = Some(l.info.clone());
    let mut streams: Vec<Option<Channel>> = (0..world).map(|_| None).collect();
    let (tx, rx) = mpsc::channel::<Arrival>();
    let gate = Gate::new("rank 0's rendezvous");
    let limit = handshake_limit()?;
    let key = Arc::new(key.clone());
    let wire = Wire::current()?;
    while infos.iter().any(Option::is_none) {
        let mut pfd = [libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        sys::poll(&mut pfd, 20).map_err(|e| Error::io("waiting at the rendezvous", e))?;
        loop {
            match listener.accept() {
                Ok((s, from)) => admit(s, from, world, (&key, wire), &tx, &gate, (limit, deadline)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors, a connection reset before accept:
                // that caller's problem, or a passing one.
                Err(e) => {
                    warn(&format!("rank 0: accepting at the rendezvous failed: {e}"));
                    break;
                }
            }
        }
        while let Ok((info, s)) = rx.try_recv() {
            let r = info.rank;
            if let Some(first) = &infos[r] {
                return Err(Error::Bootstrap(format!(
                    "two processes hold the job key and claim rank {r}: pid {} on {} and pid {} on {} (two jobs with one key?)",
                    first.pid, first.hostname, info.pid, info.hostname
                )));
            }
            infos[r] = Some(info);
            streams[r] = Some(s);
        }
        if Instant::now() >= deadline && infos.iter().any(Option::is_none) {
            let missing: Vec<usize> = (0..world).filter(|&r| infos[r].is_none()).collect();
            return Err(Error::Timeout { op: "rendezvous", ranks: missing, secs: 0.0 });
        }
    }
    let infos: Vec<RankInfo> = infos.into_iter().flatten().collect();
    let table = serde_json::to_vec(&infos).map_err(|e| Error::Bootstrap(e.to_string()))?;
    let table = key.sign_record(RecordKind::RankTable, &table);
    for (r, s) in streams.iter_mut().enumerate() {
        if let Some(s) = s {
            // Bounded: a rank that stopped reading is named, not waited for.
            write_frame(s, &table, deadline).map_err(|e| Error::io(format!("sending the rank table to rank {r}"), e))?;
        }
    }
    *KEPT.lock().unwrap_or_else(|p| p.into_inner()) = Some(listener);
    Ok((l, infos))
}

/// Hands one rendezvous connection to a thread of its own, through the
/// gate: the handshake, then the caller's signed record, all of it within
/// the whole-handshake limit.
fn admit(
    mut s: TcpStream,
    from: SocketAddr,
    world: usize,
    (key, wire): (&Arc<JobKey>, Wire),
    tx: &mpsc::Sender<Arrival>,
    gate: &Arc<Gate>,
    (limit, deadline): (Duration, Instant),
) {
    let Ok(kill) = s.try_clone() else {
        warn(&format!("rank 0 refused a rendezvous connection from {from}: cannot duplicate its socket"));
        return;
    };
    let ticket = match gate.admit(&from.ip().to_string(), 2, Box::new(move || drop(kill.shutdown(std::net::Shutdown::Both)))) {
        Ok(t) => t,
        Err(why) => {
            warn(&format!("rank 0 refused a rendezvous connection from {from}: {why}"));
            return;
        }
    };
    let (key, tx) = (key.clone(), tx.clone());
    let spawned = std::thread::Builder::new().name("wm-rendezvous".into()).spawn(move || {
        let limit = (Instant::now() + limit).min(deadline);
        let _ = s.set_nodelay(true);
        let checked = auth::serve(&mut s, &key, wire, limit, |c| {
            if c.purpose != Purpose::Rendezvous {
                return Err("it is not a rendezvous call".into());
            }
            if c.world != world as u64 || c.rank == 0 || c.rank >= world as u64 {
                return Err(format!("it claims rank {} of {} in a world of {world}", c.rank, c.world));
            }
            Ok(())
        })
        .map_err(|e| e.to_string())
        .and_then(|(claim, session)| {
            ticket.authenticated();
            let mut s = Sealed::new(s, session);
            let signed =
                read_frame(&mut s, RECORD_MAX + trust::SIGNED_OVERHEAD, limit).map_err(|e| format!("its record did not arrive: {e}"))?;
            let body = key.open_record(RecordKind::Rank, &signed).map_err(|e| format!("its record is refused: {e}"))?;
            let info = RankInfo::parse(body, world)?;
            if info.rank as u64 != claim.rank || info.nonce != claim.from_nonce {
                return Err(format!("its record (rank {}) is not the one its handshake claimed (rank {})", info.rank, claim.rank));
            }
            Ok((info, s))
        });
        match checked {
            Ok(arrival) => {
                let _ = tx.send(arrival);
            }
            Err(_) if ticket.evicted() => {}
            Err(why) => warn(&format!("rank 0 refused a rendezvous connection from {from}: {why}")),
        }
        drop(ticket);
    });
    if spawned.is_err() {
        warn(&format!("rank 0 refused a rendezvous connection from {from}: cannot start a thread for it"));
    }
}

fn tcp_join(
    rank: usize,
    world: usize,
    node: &NodeIdentity,
    addr: &str,
    key: &JobKey,
    deadline: Instant,
) -> Result<(Listeners, Vec<RankInfo>)> {
    // With port 0 the port file is read again before each attempt: a file
    // an earlier job left behind gives a dead port until rank 0 publishes
    // this job's over it.
    let picked = addr.strip_suffix(":0");
    let mut at;
    // The nonce goes into the claim before the record exists, so it is
    // drawn here and the record made to match.
    let mut last = String::new();
    // What the last attempt's failure points at, in words.
    let mut hint = String::new();
    let mut verdict = false;
    let (mut s, l) = loop {
        at = match picked {
            Some(host) => format!("{host}:{}", published_port(deadline)?),
            None => addr.to_owned(),
        };
        let attempt = at.to_socket_addrs().and_then(|mut a| {
            let a = a.next().ok_or_else(|| io::Error::other("the name has no address"))?;
            TcpStream::connect_timeout(&a, left(deadline).min(Duration::from_secs(5)))
        });
        match attempt {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                let local = s.local_addr().map_err(|e| Error::io("rendezvous", e))?.ip();
                let chosen = bootstrap::choose_addr(|| local)?;
                let l = Listeners::open(rank, world, node, chosen)?;
                let claim = Claim {
                    purpose: Purpose::Rendezvous,
                    wire: Wire::current()?,
                    rank: rank as u64,
                    world: world as u64,
                    from_nonce: l.info.nonce,
                    to_nonce: 0,
                };
                // One attempt's handshake within the handshake limit: a
                // port that an unrelated listener now holds (one that waits
                // for its client to speak) would otherwise take the whole
                // rendezvous, and the port file would never be read again.
                let attempt = deadline.min(Instant::now() + handshake_limit()?);
                match auth::call(&mut s, key, &claim, attempt) {
                    Ok(session) => break (Sealed::new(s, session), l),
                    // A verdict (a key mismatch, a refusal) outweighs a
                    // later attempt cut short by the deadline.
                    Err(HandshakeError::Io(_)) if verdict => {}
                    Err(e) => {
                        verdict = !matches!(e, HandshakeError::Io(_));
                        hint = join_hint(&e);
                        last = format!("the process there did not complete the handshake: {e}");
                    }
                }
            }
            Err(e) => {
                last = format!("unreachable: {e}");
                hint = "is rank 0 running, and listening at that address? It may have failed at its start".to_owned();
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::Bootstrap(format!("rank {rank} could not join rank 0 at {at}: {last} ({hint})")));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let record = serde_json::to_vec(&l.info).map_err(|e| Error::Bootstrap(e.to_string()))?;
    let record = key.sign_record(RecordKind::Rank, &record);
    write_frame(&mut s, &record, deadline).map_err(|e| Error::io("sending this rank's record to rank 0", e))?;
    let table = read_frame(&mut s, RECORD_MAX.saturating_mul(world) + trust::SIGNED_OVERHEAD, deadline).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout { op: "rendezvous", ranks: vec![0], secs: 0.0 },
        _ => Error::io("receiving the rank table from rank 0", e),
    })?;
    let table =
        key.open_record(RecordKind::RankTable, &table).map_err(|e| Error::Bootstrap(format!("rank 0's rank table is refused: {e}")))?;
    let infos = bootstrap::parse_table(table, world).map_err(|e| Error::Bootstrap(format!("rank 0 sent a bad rank table: {e}")))?;
    if infos[rank] != l.info {
        return Err(Error::Bootstrap(format!("rank 0's table does not hold rank {rank}'s record as it was sent")));
    }
    Ok((l, infos))
}

/// What a failed handshake with rank 0 points at, in words.
fn join_hint(e: &HandshakeError) -> String {
    let key = wm_topology::env::WM_JOB_KEY.name;
    match e {
        HandshakeError::WrongKey => {
            format!("key mismatch: the process there cannot prove this job's key; is {key} the same on every rank?")
        }
        HandshakeError::Rejected => {
            format!("key mismatch or a refused claim: is {key} the same on every rank, and the world size?")
        }
        HandshakeError::Claim(_) => "refused by policy: rank 0 does not accept this rank's claim (the same world size?)".to_owned(),
        HandshakeError::Dropped => "refused by policy: rank 0 closed the connection before the handshake (its connection limits); \
                                    retried until the timeout"
            .to_owned(),
        HandshakeError::Malformed(_) => "the process listening there is not a wholemem rendezvous".to_owned(),
        HandshakeError::Io(_) => "unreachable: is rank 0 running, and listening at that address?".to_owned(),
    }
}

pub(crate) fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Rank `rank`'s record, if there is one signed with `key` for a world of
/// `world` ranks: `Ok(None)` when there is none yet, `Err` with the reason
/// when the file there is refused (a record of an earlier job with
/// another key or world size is refused, and waited past).
///
/// # Errors
/// [`Error::Untrusted`] for a file that is not this user's or is a link:
/// the rank could never replace it, so waiting would only time out.
pub(crate) fn read_rank_file(dir: &Path, rank: usize, world: usize, key: &JobKey) -> Result<std::result::Result<Option<RankInfo>, String>> {
    let path = rank_file(dir, rank);
    let signed = match trust::read_owned(&path, RECORD_MAX + trust::SIGNED_OVERHEAD, "the rendezvous record") {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Ok(None)),
        Err(e @ Error::Untrusted(_)) => return Err(e),
        Err(e) => return Ok(Err(e.to_string())),
    };
    let checked = key
        .open_record(RecordKind::Rank, &signed)
        .and_then(|body| RankInfo::parse(body, world))
        .and_then(|i| if i.rank == rank { Ok(i) } else { Err(format!("it holds rank {}'s record", i.rank)) });
    Ok(checked.map(Some).map_err(|e| format!("{} is refused: {e}", path.display())))
}

/// Writes `body` to `path` atomically, readable only by this user.
fn write_private(path: &Path, body: &[u8], tag: u64) -> io::Result<()> {
    let tmp = path.with_file_name(format!(".{}.{tag:016x}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(body).and_then(|_| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn dir_rendezvous(me: &RankInfo, dir: &Path, key: &JobKey, deadline: Instant) -> Result<Vec<RankInfo>> {
    if !dir.is_dir() {
        return Err(Error::Bootstrap(format!("rendezvous directory {} does not exist", dir.display())));
    }
    trust::check_dir(dir, "rendezvous directory")?;
    let body = serde_json::to_vec(me).map_err(|e| Error::Bootstrap(e.to_string()))?;
    let body = key.sign_record(RecordKind::Rank, &body);
    write_private(&rank_file(dir, me.rank), &body, me.nonce)
        .map_err(|e| Error::io(format!("writing this rank's record into {}", dir.display()), e))?;
    let mut infos: Vec<Option<RankInfo>> = vec![None; me.world];
    let mut refused: Vec<Option<String>> = vec![None; me.world];
    loop {
        for (r, slot) in infos.iter_mut().enumerate() {
            if slot.is_none() {
                match read_rank_file(dir, r, me.world, key)? {
                    Ok(i) => *slot = i,
                    Err(why) => refused[r] = Some(why),
                }
            }
        }
        if infos.iter().all(Option::is_some) {
            return Ok(infos.into_iter().flatten().collect());
        }
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..me.world).filter(|&r| infos[r].is_none()).collect();
            let why: Vec<String> = missing.iter().filter_map(|&r| refused[r].clone()).collect();
            if !why.is_empty() {
                return Err(Error::Bootstrap(format!(
                    "rendezvous timed out waiting for {}; records refused: {}",
                    crate::rank_list(&missing),
                    why.join("; ")
                )));
            }
            return Err(Error::Timeout { op: "rendezvous", ranks: missing, secs: 0.0 });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes this rank's rendezvous file (after the mesh is up, so everyone
/// has read it).
pub(crate) fn remove_rank_file(how: &Rendezvous, rank: usize) {
    if let Rendezvous::Dir(dir) = how {
        let _ = std::fs::remove_file(rank_file(dir, rank));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `host:0` rendezvous whose port file still names an earlier job's
    /// port, now held by a listener that never speaks: rank 1's handshake
    /// there ends at the handshake limit, it reads the port file again,
    /// and finds rank 0, up at another port 300 ms later. (Bounded by the
    /// whole rendezvous instead, the attempt took all of it.)
    #[test]
    fn a_silent_listener_at_a_stale_port_costs_one_handshake_limit() {
        let silent = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let stale = silent.local_addr().expect("its address").port();
        let dir = std::env::temp_dir().join(format!("wm-stale-port-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let port_file = dir.join("port");
        std::fs::write(&port_file, format!("{stale}\n")).expect("the port file");
        *TEST_PORT_FILE.lock().expect("the port file's lock") = Some(port_file);
        let key = JobKey::generate().expect("a key");
        let node = NodeIdentity::from_parts("n".into(), "h".into(), true);
        let how = Rendezvous::Tcp("127.0.0.1:0".into());
        // Far past the handshake limit (5 s): without the limit per
        // attempt, rank 1 fails at this deadline.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (k0, n0, h0) = (key.clone(), node.clone(), how.clone());
        let rank0 = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            run(0, 2, &n0, &h0, &k0, deadline).map(|_| ())
        });
        let joined = run(1, 2, &node, &how, &key, deadline).map(|_| ());
        let r0 = rank0.join().expect("rank 0's thread");
        drop(silent);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(joined.is_ok() && r0.is_ok(), "rank 1 {joined:?}, rank 0 {r0:?}");
    }
}
