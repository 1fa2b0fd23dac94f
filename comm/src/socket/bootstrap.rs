//! How ranks of the socket backend find each other.
//!
//! 1. Each rank opens two listeners: an abstract Unix socket (no file, so
//!    nothing is left behind) for ranks of its node and a TCP socket for the
//!    others.
//! 2. Rendezvous gives every rank the table of all ranks' addresses:
//!    `host:port` (rank 0 collects and hands out the table) or `dir:/path`
//!    (each rank writes `rank-<r>.json` there and reads the others').
//! 3. Mesh: each rank connects to every lower rank and accepts every higher
//!    one; a hello frame names the caller and the callee's nonce, so a stale
//!    address from an earlier job is never taken for a live rank.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use wm_topology::NodeIdentity;
use wm_topology::env::{WM_HOST_ADDR, WM_RENDEZVOUS};

use super::endpoint::Conn;
use crate::sys;
use crate::{Error, Result};

/// What every rank tells the others about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct RankInfo {
    pub rank: usize,
    pub world: usize,
    pub node_id: String,
    pub hostname: String,
    pub node_overridden: bool,
    pub unix_name: String,
    pub tcp_addr: String,
    pub nonce: u64,
    pub pid: u32,
}

impl RankInfo {
    pub fn node(&self) -> NodeIdentity {
        NodeIdentity::from_parts(self.node_id.clone(), self.hostname.clone(), self.node_overridden)
    }
}

/// Where ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0 listens at this address; the others connect.
    Tcp(String),
    /// A directory every rank can read and write.
    Dir(PathBuf),
}

impl Rendezvous {
    /// Parses `host:port` or `dir:/path`.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming the value when it is neither.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("dir:") {
            if p.is_empty() {
                return Err(Error::Bootstrap(format!("{}={s:?}: the directory is empty", WM_RENDEZVOUS.name)));
            }
            return Ok(Self::Dir(PathBuf::from(p)));
        }
        let s2 = s.strip_prefix("tcp:").unwrap_or(s);
        match s2.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(Self::Tcp(s2.to_owned())),
            _ => Err(Error::Bootstrap(format!("{}={s:?} is neither `host:port` nor `dir:/path`", WM_RENDEZVOUS.name))),
        }
    }

    /// From `WM_RENDEZVOUS`, if set.
    ///
    /// # Errors
    /// As [`Rendezvous::parse`].
    pub fn from_env() -> Result<Option<Self>> {
        WM_RENDEZVOUS.get().map(|s| Self::parse(&s)).transpose()
    }
}

/// This rank's listeners and what it advertises.
pub(crate) struct Listeners {
    unix: UnixListener,
    tcp: TcpListener,
    pub info: RankInfo,
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}

impl Listeners {
    pub fn open(rank: usize, world: usize, node: &NodeIdentity) -> Result<Self> {
        let nonce = random_u64();
        let unix_name = format!("wholemem.{}.{nonce:016x}", std::process::id());
        let addr = UnixAddr::from_abstract_name(unix_name.as_bytes()).map_err(|e| Error::io("abstract socket name", e))?;
        let unix = UnixListener::bind_addr(&addr).map_err(|e| Error::io("binding the node-local listener", e))?;
        let tcp = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| Error::io("binding the TCP listener", e))?;
        unix.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
        tcp.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
        let port = tcp.local_addr().map_err(|e| Error::io("listener address", e))?.port();
        let info = RankInfo {
            rank,
            world,
            node_id: node.id().to_owned(),
            hostname: node.hostname().to_owned(),
            node_overridden: node.overridden(),
            unix_name,
            tcp_addr: format!("0.0.0.0:{port}"),
            nonce,
            pid: std::process::id(),
        };
        Ok(Self { unix, tcp, info })
    }

    fn set_ip(&mut self, ip: IpAddr) {
        let port = self.info.tcp_addr.rsplit_once(':').map(|(_, p)| p.to_owned()).unwrap_or_default();
        self.info.tcp_addr = SocketAddr::new(ip, port.parse().unwrap_or(0)).to_string();
    }
}

fn host_addr_override() -> Result<Option<IpAddr>> {
    match WM_HOST_ADDR.get() {
        None => Ok(None),
        Some(v) => v.parse::<IpAddr>().map(Some).map_err(|_| Error::Bootstrap(format!("{}={v:?} is not an IP address", WM_HOST_ADDR.name))),
    }
}

/// The address of this host's name, for `dir:` rendezvous.
fn hostname_ip() -> IpAddr {
    let name = wm_topology::node::hostname();
    (name.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()).map(|a| a.ip()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Runs rendezvous and returns every rank's record, indexed by rank.
pub(crate) fn rendezvous(l: &mut Listeners, how: &Rendezvous, timeout: Duration) -> Result<Vec<RankInfo>> {
    let deadline = Instant::now() + timeout;
    let infos = match how {
        Rendezvous::Tcp(addr) => tcp_rendezvous(l, addr, deadline)?,
        Rendezvous::Dir(dir) => {
            l.set_ip(host_addr_override()?.unwrap_or_else(hostname_ip));
            dir_rendezvous(&l.info, dir, deadline)?
        }
    };
    for (r, i) in infos.iter().enumerate() {
        if i.rank != r || i.world != l.info.world {
            return Err(Error::Bootstrap(format!(
                "rank {} says the world has {} ranks, rank {} says {}",
                i.rank, i.world, l.info.rank, l.info.world
            )));
        }
    }
    Ok(infos)
}

/// Another communicator's allgather: this rank's bytes in, every rank's out.
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// Rendezvous through a caller's exchange (another communicator's
/// allgather): each rank's record in, everyone's out.
pub(crate) fn exchange(l: &mut Listeners, exchange: &mut Exchange<'_>) -> Result<Vec<RankInfo>> {
    l.set_ip(host_addr_override()?.unwrap_or_else(hostname_ip));
    let mine = serde_json::to_vec(&l.info).map_err(|e| Error::Bootstrap(e.to_string()))?;
    let infos = exchange(&mine)?
        .iter()
        .map(|b| serde_json::from_slice::<RankInfo>(b).map_err(|e| Error::Bootstrap(format!("a rank's record does not parse: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    for (r, i) in infos.iter().enumerate() {
        if i.rank != r || i.world != l.info.world {
            return Err(Error::Bootstrap(format!("the exchange returned rank {}'s record at position {r}", i.rank)));
        }
    }
    Ok(infos)
}

fn write_frame(s: &mut TcpStream, v: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(v).map_err(io::Error::other)?;
    s.write_all(&(body.len() as u32).to_le_bytes())?;
    s.write_all(&body)
}

fn read_frame<T: for<'de> Deserialize<'de>>(s: &mut TcpStream) -> io::Result<T> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 16 << 20 {
        return Err(io::Error::other(format!("a rendezvous frame of {len} bytes: not a wholemem rank")));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(io::Error::other)
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

fn tcp_rendezvous(l: &mut Listeners, addr: &str, deadline: Instant) -> Result<Vec<RankInfo>> {
    let world = l.info.world;
    if l.info.rank == 0 {
        let resolved: Vec<SocketAddr> =
            addr.to_socket_addrs().map_err(|e| Error::Bootstrap(format!("cannot resolve rendezvous address {addr:?}: {e}")))?.collect();
        let listener = resolved
            .iter()
            .find_map(|a| TcpListener::bind(a).ok())
            .or_else(|| resolved.first().and_then(|a| TcpListener::bind((Ipv4Addr::UNSPECIFIED, a.port())).ok()))
            .ok_or_else(|| Error::Bootstrap(format!("rank 0 cannot listen on {addr} (is the port in use?)")))?;
        let my_ip = match host_addr_override()? {
            Some(ip) => ip,
            None => resolved.iter().map(|a| a.ip()).find(|ip| !ip.is_unspecified()).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        };
        l.set_ip(my_ip);
        listener.set_nonblocking(true).map_err(|e| Error::io("rendezvous listener", e))?;
        let mut infos: Vec<Option<RankInfo>> = vec![None; world];
        infos[0] = Some(l.info.clone());
        let mut streams = Vec::new();
        while infos.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)
                        .and_then(|_| s.set_read_timeout(Some(left(deadline))))
                        .map_err(|e| Error::io("rendezvous", e))?;
                    let info: RankInfo = read_frame(&mut s).map_err(|e| Error::io("reading a rank's rendezvous record", e))?;
                    if info.rank >= world || infos[info.rank].is_some() {
                        return Err(Error::Bootstrap(format!("two processes claim rank {} (or it is not below {world})", info.rank)));
                    }
                    let r = info.rank;
                    infos[r] = Some(info);
                    streams.push(s);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (0..world).filter(|&r| infos[r].is_none()).collect();
                        return Err(Error::Timeout { op: "rendezvous", ranks: missing, secs: 0.0 });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(Error::io("accepting at the rendezvous", e)),
            }
        }
        let infos: Vec<RankInfo> = infos.into_iter().map(|i| i.expect("all arrived")).collect();
        for s in &mut streams {
            write_frame(s, &infos).map_err(|e| Error::io("sending the rank table", e))?;
        }
        Ok(infos)
    } else {
        let mut last_err;
        let mut s = loop {
            let attempt = addr.to_socket_addrs().and_then(|mut a| {
                let a = a.next().ok_or_else(|| io::Error::other("the name has no address"))?;
                TcpStream::connect_timeout(&a, left(deadline).min(Duration::from_secs(5)))
            });
            match attempt {
                Ok(s) => break s,
                Err(e) => last_err = e,
            }
            if Instant::now() >= deadline {
                return Err(Error::Bootstrap(format!("rank {} could not reach rank 0 at {addr}: {}", l.info.rank, last_err)));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let ip = match host_addr_override()? {
            Some(ip) => ip,
            None => s.local_addr().map_err(|e| Error::io("rendezvous", e))?.ip(),
        };
        l.set_ip(ip);
        s.set_read_timeout(Some(left(deadline))).map_err(|e| Error::io("rendezvous", e))?;
        write_frame(&mut s, &l.info).map_err(|e| Error::io("sending this rank's record to rank 0", e))?;
        read_frame(&mut s).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout { op: "rendezvous", ranks: vec![0], secs: 0.0 },
            _ => Error::io("receiving the rank table from rank 0", e),
        })
    }
}

fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Rank `rank`'s record, if there is one for a world of `world` ranks (a
/// record for another world size is left over from an earlier job).
fn read_rank_file(dir: &Path, rank: usize, world: usize) -> Option<RankInfo> {
    let bytes = std::fs::read(rank_file(dir, rank)).ok()?;
    serde_json::from_slice::<RankInfo>(&bytes).ok().filter(|i| i.world == world && i.rank == rank)
}

fn dir_rendezvous(me: &RankInfo, dir: &Path, deadline: Instant) -> Result<Vec<RankInfo>> {
    if !dir.is_dir() {
        return Err(Error::Bootstrap(format!("rendezvous directory {} does not exist", dir.display())));
    }
    let tmp = dir.join(format!(".rank-{}.{}.tmp", me.rank, me.nonce));
    let body = serde_json::to_vec(me).map_err(|e| Error::Bootstrap(e.to_string()))?;
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, rank_file(dir, me.rank)))
        .map_err(|e| Error::io(format!("writing this rank's record into {}", dir.display()), e))?;
    let mut infos: Vec<Option<RankInfo>> = vec![None; me.world];
    loop {
        for (r, slot) in infos.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = read_rank_file(dir, r, me.world);
            }
        }
        if infos.iter().all(Option::is_some) {
            return Ok(infos.into_iter().map(|i| i.expect("all read")).collect());
        }
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..me.world).filter(|&r| infos[r].is_none()).collect();
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

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"WMHELLO1");

/// The first bytes on a mesh connection: who calls (rank and nonce) and
/// whom it means (the callee's nonce).
fn hello(from: usize, from_nonce: u64, to_nonce: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&(from as u64).to_le_bytes());
    b[16..24].copy_from_slice(&from_nonce.to_le_bytes());
    b[24..32].copy_from_slice(&to_nonce.to_le_bytes());
    b
}

/// Connects every pair of ranks. Returns one connection per rank (`None` at
/// this rank's index).
pub(crate) fn mesh(l: &Listeners, infos: &mut [RankInfo], how: Option<&Rendezvous>, deadline: Instant) -> Result<Vec<Option<Conn>>> {
    let me = l.info.rank;
    let world = infos.len();
    let mut conns: Vec<Option<Conn>> = (0..world).map(|_| None).collect();
    // Connect down.
    for r in 0..me {
        let conn = loop {
            match connect(&l.info, &infos[r]) {
                Ok(c) => break c,
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Bootstrap(format!("rank {me} cannot connect to rank {r}: {e}")));
                    }
                    // A record left by an earlier job: wait for the fresh one.
                    std::thread::sleep(Duration::from_millis(20));
                    if let Some(Rendezvous::Dir(dir)) = how
                        && let Some(i) = read_rank_file(dir, r, world)
                    {
                        infos[r] = i;
                    }
                }
            }
        };
        conns[r] = Some(conn);
    }
    // Accept up.
    let mut missing = world - 1 - me;
    while missing > 0 {
        let mut pfds = [
            libc::pollfd { fd: l.unix.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: l.tcp.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let wait = left(deadline).as_millis().min(1000) as i32;
        sys::poll(&mut pfds, wait).map_err(|e| Error::io("waiting for connections", e))?;
        let mut accepted = Vec::new();
        if let Ok((s, _)) = l.unix.accept() {
            accepted.push(Conn::Unix(s));
        }
        if let Ok((s, _)) = l.tcp.accept() {
            let _ = s.set_nodelay(true);
            accepted.push(Conn::Tcp(s));
        }
        for c in accepted {
            let from = read_hello(&c, l.info.nonce, deadline)?;
            match from {
                Some((r, caller_nonce)) if r > me && r < world && conns[r].is_none() => {
                    if infos[r].nonce != caller_nonce {
                        // We read a stale record of rank r; the caller wrote
                        // its fresh one before calling.
                        match how {
                            Some(Rendezvous::Dir(dir)) => match read_rank_file(dir, r, world) {
                                Some(i) if i.nonce == caller_nonce => infos[r] = i,
                                _ => continue,
                            },
                            _ => continue,
                        }
                    }
                    conns[r] = Some(c);
                    missing -= 1;
                }
                _ => {} // a stranger or a stale caller: drop it
            }
        }
        if missing > 0 && Instant::now() >= deadline {
            let ranks: Vec<usize> = (me + 1..world).filter(|&r| conns[r].is_none()).collect();
            return Err(Error::Timeout { op: "connecting ranks", ranks, secs: 0.0 });
        }
    }
    for c in conns.iter().flatten() {
        match c {
            Conn::Unix(s) => s.set_nonblocking(true),
            Conn::Tcp(s) => s.set_nonblocking(true),
        }
        .map_err(|e| Error::io("socket", e))?;
    }
    Ok(conns)
}

fn connect(me: &RankInfo, peer: &RankInfo) -> io::Result<Conn> {
    let mut conn = if peer.node_id == me.node_id {
        let addr = UnixAddr::from_abstract_name(peer.unix_name.as_bytes())?;
        Conn::Unix(UnixStream::connect_addr(&addr)?)
    } else {
        let s = TcpStream::connect_timeout(&peer.tcp_addr.parse().map_err(io::Error::other)?, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        Conn::Tcp(s)
    };
    let h = hello(me.rank, me.nonce, peer.nonce);
    match &mut conn {
        Conn::Unix(s) => s.write_all(&h)?,
        Conn::Tcp(s) => s.write_all(&h)?,
    }
    Ok(conn)
}

/// Reads a caller's hello: its rank and nonce, if it is meant for us.
fn read_hello(c: &Conn, nonce: u64, deadline: Instant) -> Result<Option<(usize, u64)>> {
    let mut b = [0u8; 32];
    let t = Some(left(deadline).min(Duration::from_secs(10)));
    let r = match c {
        Conn::Unix(s) => s.set_nonblocking(false).and_then(|_| s.set_read_timeout(t)).and_then(|_| (&*s).read_exact(&mut b)),
        Conn::Tcp(s) => s.set_nonblocking(false).and_then(|_| s.set_read_timeout(t)).and_then(|_| (&*s).read_exact(&mut b)),
    };
    if r.is_err() {
        return Ok(None);
    }
    let field = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    if field(0) != HELLO_MAGIC || field(24) != nonce {
        return Ok(None);
    }
    let _ = match c {
        Conn::Unix(s) => s.set_read_timeout(None),
        Conn::Tcp(s) => s.set_read_timeout(None),
    };
    Ok(Some((field(8) as usize, field(16))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_strings_parse_or_are_named() {
        assert_eq!(Rendezvous::parse("dir:/tmp/x").unwrap(), Rendezvous::Dir("/tmp/x".into()));
        assert_eq!(Rendezvous::parse("node1:29500").unwrap(), Rendezvous::Tcp("node1:29500".into()));
        assert_eq!(Rendezvous::parse("tcp:127.0.0.1:5").unwrap(), Rendezvous::Tcp("127.0.0.1:5".into()));
        for bad in ["dir:", "nohost", ":12", "host:port"] {
            let e = Rendezvous::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
