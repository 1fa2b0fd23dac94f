//! How ranks of the socket backend find each other.
//!
//! 1. Each rank chooses the address it listens on (`WM_HOST_ADDR`,
//!    `WM_IFACE`, or the interface the rendezvous implies) and opens two
//!    listeners: an abstract Unix socket for ranks of its node and a TCP
//!    socket on that address for the others.
//! 2. Rendezvous gives every rank the table of all ranks' records
//!    ([`rendezvous`](super::rendezvous)): `host:port` (rank 0 collects and
//!    hands out the table) or `dir:/path` (each rank writes `rank-<r>.json`
//!    there and reads the others'), or another communicator's allgather.
//! 3. Mesh ([`mesh`](super::mesh)): each rank connects to every lower rank
//!    and accepts every higher one.
//!
//! Every connection a rank accepts starts with the job-key handshake
//! ([`crate::auth`]); Unix connections also check that the peer runs as
//! this user. Records that arrive are parsed and checked here before
//! anything indexes by them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wm_topology::NodeIdentity;
use wm_topology::env::{WM_HOST_ADDR, WM_IFACE, WM_RENDEZVOUS};

use crate::auth::JobKey;
use crate::sys;
use crate::{Error, Result};

/// The largest rank record accepted, in bytes.
pub(crate) const RECORD_MAX: usize = 16 << 10;
/// Longest host name or node id in a record.
const NAME_MAX: usize = 512;
/// Longest abstract socket name (the kernel allows 107 bytes).
const UNIX_NAME_MAX: usize = 100;
/// The prefix of every rank's abstract socket name.
const UNIX_PREFIX: &str = "wholemem.";

/// What every rank tells the others about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
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

    /// Whether the record is one a rank of a world of `world` ranks can
    /// have sent: every field bounded and well-formed.
    pub fn check(&self, world: usize) -> std::result::Result<(), String> {
        if self.world != world {
            return Err(format!("it is for a world of {} ranks, not {world}", self.world));
        }
        if self.rank >= world {
            return Err(format!("it claims rank {}, not below {world}", self.rank));
        }
        if self.node_id.is_empty() || self.node_id.len() > NAME_MAX || self.hostname.len() > NAME_MAX {
            return Err(format!("its node id or host name is empty or longer than {NAME_MAX} bytes"));
        }
        if !self.unix_name.starts_with(UNIX_PREFIX) || self.unix_name.len() > UNIX_NAME_MAX {
            return Err(format!("its socket name is not `{UNIX_PREFIX}…` of at most {UNIX_NAME_MAX} bytes"));
        }
        match self.tcp_addr.parse::<SocketAddr>() {
            Ok(a) if !a.ip().is_unspecified() && a.port() != 0 => Ok(()),
            _ => Err(format!("its TCP address {:?} is not a reachable address and port", self.tcp_addr)),
        }
    }

    /// Parses and checks one record.
    pub fn parse(bytes: &[u8], world: usize) -> std::result::Result<Self, String> {
        if bytes.len() > RECORD_MAX {
            return Err(format!("a record of {} bytes (at most {RECORD_MAX})", bytes.len()));
        }
        let i: Self = serde_json::from_slice(bytes).map_err(|e| format!("the record does not parse: {e}"))?;
        i.check(world)?;
        Ok(i)
    }
}

/// Parses and checks the table of every rank's record: exactly `world`
/// records, record `r` from rank `r`.
pub(crate) fn parse_table(bytes: &[u8], world: usize) -> std::result::Result<Vec<RankInfo>, String> {
    let max = RECORD_MAX.saturating_mul(world);
    if bytes.len() > max {
        return Err(format!("a table of {} bytes for {world} ranks (at most {max})", bytes.len()));
    }
    let infos: Vec<RankInfo> = serde_json::from_slice(bytes).map_err(|e| format!("the table does not parse: {e}"))?;
    check_table(&infos, world)?;
    Ok(infos)
}

/// Checks a table of records, however it arrived.
pub(crate) fn check_table(infos: &[RankInfo], world: usize) -> std::result::Result<(), String> {
    if infos.len() != world {
        return Err(format!("it holds {} records for a world of {world} ranks", infos.len()));
    }
    for (r, i) in infos.iter().enumerate() {
        i.check(world).map_err(|e| format!("record {r}: {e}"))?;
        if i.rank != r {
            return Err(format!("record {r} is rank {}'s", i.rank));
        }
    }
    Ok(())
}

/// Where ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0 listens at this address; the others connect. Port 0: rank 0
    /// lets the kernel pick one and publishes it in
    /// `WM_RENDEZVOUS_PORT_FILE`.
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

    /// The key of the job that met here, for a process joining it from
    /// outside (a one-sided reader): `WM_JOB_KEY` or `WM_JOB_KEY_FILE`,
    /// else (for `dir:`) the directory's `job.key`, never a new one.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] saying where the key was looked for.
    pub fn reader_key(&self) -> Result<JobKey> {
        if let Some(k) = JobKey::from_env()? {
            return Ok(k);
        }
        match self {
            Self::Dir(dir) => super::dir_key::existing_dir_key(dir),
            Self::Tcp(addr) => Err(Error::Bootstrap(format!(
                "joining the job at {addr} needs its key: set {} (or {}) to the key the job's ranks hold",
                wm_topology::env::WM_JOB_KEY.name,
                wm_topology::env::WM_JOB_KEY_FILE.name
            ))),
        }
    }

    /// The key of the job meeting here, as a rank holds it: `WM_JOB_KEY` or
    /// `WM_JOB_KEY_FILE`, else (for `dir:`) the directory's `job.key`,
    /// created when absent (in a directory only this user can write). A
    /// job of one rank never meets, so it calls this to leave the key where
    /// outside readers look for it.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] saying where the key was looked for, or why the
    /// directory may not hold one.
    pub fn job_key(&self) -> Result<JobKey> {
        job_key(self)
    }

    /// The address a listener of this process advertises to other nodes:
    /// `WM_HOST_ADDR`, else `WM_IFACE`'s, else what the rendezvous `how`
    /// implies — the local address that routes to a `host:port`
    /// rendezvous, the host name's address for `dir:` or none.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for a bad `WM_HOST_ADDR` or `WM_IFACE`.
    pub fn advertised_ip(how: Option<&Rendezvous>) -> Result<IpAddr> {
        let implied = || match how {
            Some(Rendezvous::Tcp(addr)) => route_to(addr).unwrap_or_else(hostname_ip),
            _ => hostname_ip(),
        };
        Ok(choose_addr(implied)?.addr)
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
    pub unix: UnixListener,
    pub tcp: TcpListener,
    pub info: RankInfo,
}

impl Listeners {
    /// Opens both listeners, the TCP one on `ip`.
    pub fn open(rank: usize, world: usize, node: &NodeIdentity, ip: Chosen) -> Result<Self> {
        let nonce = crate::auth::random_u64()?;
        let unix_name = format!("{UNIX_PREFIX}{}.{:016x}", std::process::id(), crate::auth::random_u64()?);
        let addr = UnixAddr::from_abstract_name(unix_name.as_bytes()).map_err(|e| Error::io("abstract socket name", e))?;
        let unix = UnixListener::bind_addr(&addr).map_err(|e| Error::io("binding the node-local listener", e))?;
        let tcp = match TcpListener::bind((ip.addr, 0)) {
            Ok(t) => t,
            // An address given by hand may be one other nodes reach through
            // a translation this host cannot bind; listen everywhere then.
            Err(e) if ip.by_hand && e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                warn(&format!("rank {rank}: cannot listen on {} ({e}); listening on every interface and advertising it anyway", ip.addr));
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| Error::io("binding the TCP listener", e))?
            }
            Err(e) => return Err(Error::io(format!("binding the TCP listener on {}", ip.addr), e)),
        };
        // Connections are born with the job's congestion control. One the
        // host refuses has already failed a rank that meets at a rendezvous
        // (`rendezvous::run` checks first); under MPI it fails here, before
        // the records are exchanged.
        crate::tcp::listen(&tcp)?;
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
            tcp_addr: SocketAddr::new(ip.addr, port).to_string(),
            nonce,
            pid: std::process::id(),
        };
        Ok(Self { unix, tcp, info })
    }
}

/// The address a rank listens on and advertises.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chosen {
    pub addr: IpAddr,
    /// Named by `WM_HOST_ADDR` or `WM_IFACE` rather than implied.
    pub by_hand: bool,
}

/// The address named by `WM_HOST_ADDR`, else `WM_IFACE`, else `implied()`.
pub(crate) fn choose_addr(implied: impl FnOnce() -> IpAddr) -> Result<Chosen> {
    if let Some(v) = WM_HOST_ADDR.get() {
        let ip: IpAddr = v.trim().parse().map_err(|_| Error::Bootstrap(format!("{}={v:?} is not an IP address", WM_HOST_ADDR.name)))?;
        if ip.is_unspecified() {
            return Err(Error::Bootstrap(format!("{}={v:?} is not an address other ranks can reach", WM_HOST_ADDR.name)));
        }
        return Ok(Chosen { addr: ip, by_hand: true });
    }
    if let Some(name) = WM_IFACE.get() {
        let ip = sys::interface_ipv4(&name).map_err(|e| Error::io("listing network interfaces", e))?;
        let ip = ip.ok_or_else(|| Error::Bootstrap(format!("{}={name:?}: no such interface with an IPv4 address", WM_IFACE.name)))?;
        return Ok(Chosen { addr: IpAddr::V4(ip), by_hand: true });
    }
    Ok(Chosen { addr: implied(), by_hand: false })
}

/// The local address the kernel would use to reach `addr` (`host:port`):
/// a UDP socket's route, found without sending anything.
fn route_to(addr: &str) -> Option<IpAddr> {
    let target = addr.to_socket_addrs().ok()?.find(|a| a.is_ipv4())?;
    let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    probe.connect(target).ok()?;
    probe.local_addr().ok().map(|a| a.ip()).filter(|ip| !ip.is_unspecified())
}

/// The address of this host's name (what `dir:` and MPI rendezvous
/// advertise unless told otherwise).
pub(crate) fn hostname_ip() -> IpAddr {
    let name = wm_topology::node::hostname();
    (name.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()).map(|a| a.ip()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Another communicator's allgather: this rank's bytes in, every rank's out.
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// Opens listeners and meets through a caller's exchange (another
/// communicator's allgather, trusted to deliver what each rank put in).
pub(crate) fn exchange(rank: usize, world: usize, node: &NodeIdentity, exchange: &mut Exchange<'_>) -> Result<(Listeners, Vec<RankInfo>)> {
    let l = Listeners::open(rank, world, node, choose_addr(hostname_ip)?)?;
    let mine = serde_json::to_vec(&l.info).map_err(|e| Error::Bootstrap(e.to_string()))?;
    let all = exchange(&mine)?;
    if all.len() != world {
        return Err(Error::Bootstrap(format!("the exchange returned {} records for {world} ranks", all.len())));
    }
    let infos = all
        .iter()
        .enumerate()
        .map(|(r, b)| RankInfo::parse(b, world).map_err(|e| Error::Bootstrap(format!("rank {r}'s record: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    check_table(&infos, world).map_err(|e| Error::Bootstrap(format!("the exchanged records: {e}")))?;
    Ok((l, infos))
}

/// Reports something a user should know but that is not an error (see
/// [`crate::warn`]).
pub(crate) fn warn(msg: &str) {
    crate::warn(msg);
}

/// Where the job key comes from for a rendezvous: the environment, or
/// (for `dir:`) the directory's key file.
pub(crate) fn job_key(how: &Rendezvous) -> Result<JobKey> {
    if let Some(k) = JobKey::from_env()? {
        return Ok(k);
    }
    match how {
        Rendezvous::Dir(dir) => super::dir_key::dir_key(dir),
        Rendezvous::Tcp(addr) => Err(Error::Bootstrap(format!(
            "{}={addr} needs a job key, so that only this job's ranks can join it: set {} to the same 64 hexadecimal digits on every rank \
             (e.g. `export {}=$(openssl rand -hex 32)` before `srun`/`mpirun`), or name a mode-600 file holding them in {}; \
             `wm-run` does this for you, and a `dir:` rendezvous keeps one in the directory",
            WM_RENDEZVOUS.name,
            wm_topology::env::WM_JOB_KEY.name,
            wm_topology::env::WM_JOB_KEY.name,
            wm_topology::env::WM_JOB_KEY_FILE.name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn info(rank: usize, world: usize) -> RankInfo {
        RankInfo {
            rank,
            world,
            node_id: "host:boot".into(),
            hostname: "host".into(),
            node_overridden: false,
            unix_name: format!("wholemem.1.{rank:016x}"),
            tcp_addr: format!("127.0.0.1:{}", 4000 + rank),
            nonce: rank as u64,
            pid: 1,
        }
    }

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

    #[test]
    fn records_and_tables_are_checked() {
        let good: Vec<RankInfo> = (0..3).map(|r| info(r, 3)).collect();
        let bytes = serde_json::to_vec(&good).unwrap();
        assert_eq!(parse_table(&bytes, 3).unwrap(), good);
        // A short table, a table for another world, records out of order.
        let e = parse_table(&serde_json::to_vec(&good[..2]).unwrap(), 3).unwrap_err();
        assert!(e.contains("2 records for a world of 3"), "{e}");
        let e = parse_table(&bytes, 4).unwrap_err();
        assert!(e.contains("4"), "{e}");
        let swapped = vec![good[1].clone(), good[0].clone(), good[2].clone()];
        let e = parse_table(&serde_json::to_vec(&swapped).unwrap(), 3).unwrap_err();
        assert!(e.contains("record 0 is rank 1's"), "{e}");
        // Fields out of bounds.
        let mut bad = info(1, 3);
        bad.tcp_addr = "0.0.0.0:5".into();
        assert!(RankInfo::parse(&serde_json::to_vec(&bad).unwrap(), 3).unwrap_err().contains("reachable"));
        let mut bad = info(1, 3);
        bad.unix_name = "x".repeat(200);
        assert!(RankInfo::parse(&serde_json::to_vec(&bad).unwrap(), 3).unwrap_err().contains("socket name"));
        let mut bad = info(5, 3);
        bad.world = 3;
        assert!(RankInfo::parse(&serde_json::to_vec(&bad).unwrap(), 3).unwrap_err().contains("rank 5"));
        assert!(RankInfo::parse(&vec![b' '; RECORD_MAX + 1], 3).unwrap_err().contains("at most"));
    }

    proptest! {
        #[test]
        fn arbitrary_records_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), world in 0usize..8) {
            let _ = RankInfo::parse(&bytes, world);
            let _ = parse_table(&bytes, world);
        }

        #[test]
        fn mutated_records_never_panic(pos in 0usize..300, byte in any::<u8>(), world in 1usize..5) {
            // Near-valid input reaches deeper than random bytes.
            let mut bytes = serde_json::to_vec(&(0..world).map(|r| info(r, world)).collect::<Vec<_>>()).unwrap();
            let pos = pos % bytes.len();
            bytes[pos] = byte;
            if let Ok(t) = parse_table(&bytes, world) {
                prop_assert_eq!(t.len(), world);
            }
            let one = serde_json::to_vec(&info(0, world)).unwrap();
            let mut one2 = one.clone();
            let p = pos % one2.len();
            one2[p] = byte;
            let _ = RankInfo::parse(&one2, world);
        }
    }
}
