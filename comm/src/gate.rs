//! Bounded admission at every listener: a descriptor budget for the whole
//! process, a cap on connections that have not yet proved the job key —
//! overall and per peer address — and eviction of the oldest of them when
//! a new one arrives at a full gate.
//!
//! A stranger can open connections faster than any handshake can refuse
//! them; what it cannot do here is hold more than a bounded share of them,
//! starve the process of descriptors (the budget leaves headroom for the
//! job's own sockets, memfds and files), or keep a slot past the
//! whole-handshake deadline (`WM_HANDSHAKE_S`). A caller that holds the key
//! completes its handshake in a round trip, so evicting the oldest
//! unauthenticated connection lets it in however many strangers wait.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Unauthenticated connections one gate holds at most.
const PENDING_MAX: usize = 128;
/// Unauthenticated connections from one peer address at most.
const PER_PEER_MAX: usize = 32;
/// Descriptors always left for the job's own needs (mesh connections,
/// memfds, files being loaded, libraries), at least.
const HEADROOM_MIN: usize = 256;

/// Descriptors this process's listeners may hold for their connections:
/// the soft `RLIMIT_NOFILE`, raised to the hard limit at the first call,
/// less a quarter of it (at least 256) kept for the job's own needs.
pub fn descriptor_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let soft = crate::sys::raise_nofile().map_or(1024, |n| usize::try_from(n).unwrap_or(usize::MAX));
        // A hard limit of "unlimited" is no budget to plan with.
        let soft = soft.min(1 << 20);
        soft.saturating_sub(HEADROOM_MIN.max(soft / 4))
    })
}

/// Descriptors held by admitted connections, process-wide.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Descriptors taken from the budget, given back on drop.
#[derive(Debug)]
struct Reserved(usize);

impl Reserved {
    fn take(n: usize) -> Option<Self> {
        let budget = descriptor_budget();
        let before = HELD.fetch_add(n, Ordering::AcqRel);
        if before + n > budget {
            HELD.fetch_sub(n, Ordering::AcqRel);
            return None;
        }
        Some(Self(n))
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// How to cut off a connection that has not proved itself (shut its socket
/// down, so the thread handling it sees the end at once).
pub type Evict = Box<dyn FnOnce() + Send>;

/// A duplicate of an accepted socket, kept to shut it down with.
#[derive(Debug)]
pub enum Shut {
    /// A Unix stream.
    Unix(std::os::unix::net::UnixStream),
    /// A TCP stream.
    Tcp(std::net::TcpStream),
}

impl Shut {
    /// Shuts the socket down both ways (every descriptor of it sees the end).
    pub fn shutdown(&self) {
        let _ = match self {
            Self::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Self::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

struct Pending {
    peer: String,
    evict: Evict,
}

#[derive(Default)]
struct State {
    next: u64,
    /// By admission order: the first is the oldest.
    pending: BTreeMap<u64, Pending>,
}

/// One listener's admission control (see the module's documentation).
pub struct Gate {
    what: String,
    pending_max: usize,
    per_peer_max: usize,
    state: Mutex<State>,
    evicted: AtomicUsize,
    told: AtomicBool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("what", &self.what).field("pending_max", &self.pending_max).finish_non_exhaustive()
    }
}

/// An admitted connection's place: its descriptors from the budget, and
/// (until [`Ticket::authenticated`]) its slot among the unauthenticated.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    id: u64,
    authenticated: AtomicBool,
    _fds: Reserved,
}

impl Gate {
    /// A gate for `what` (named in reports: "rank 0's rendezvous").
    pub fn new(what: impl Into<String>) -> Arc<Self> {
        // Each unauthenticated connection holds about two descriptors.
        let pending_max = PENDING_MAX.min(descriptor_budget() / 8).max(4);
        let per_peer_max = PER_PEER_MAX.min(pending_max);
        Arc::new(Self {
            what: what.into(),
            pending_max,
            per_peer_max,
            state: Mutex::new(State::default()),
            evicted: AtomicUsize::new(0),
            told: AtomicBool::new(false),
        })
    }

    /// Admits a connection from `peer` that holds `fds` descriptors:
    /// evicts the oldest unauthenticated connection from the same peer
    /// when that peer holds its share, else the oldest overall when the
    /// gate is full.
    ///
    /// # Errors
    /// Why it is refused, in words: the process's descriptor budget is
    /// spent (the oldest unauthenticated connection is evicted so that the
    /// next caller finds room).
    pub fn admit(self: &Arc<Self>, peer: &str, fds: usize, evict: Evict) -> Result<Ticket, String> {
        let mut out: Vec<Pending> = Vec::new();
        let admitted = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let same: Vec<u64> = st.pending.iter().filter(|(_, p)| p.peer == peer).map(|(&id, _)| id).collect();
            if same.len() >= self.per_peer_max {
                out.extend(st.pending.remove(&same[0]));
            } else if st.pending.len() >= self.pending_max {
                out.extend(st.pending.pop_first().map(|(_, p)| p));
            }
            match Reserved::take(fds) {
                Some(r) => {
                    let id = st.next;
                    st.next += 1;
                    st.pending.insert(id, Pending { peer: peer.to_owned(), evict });
                    Ok(Ticket { gate: self.clone(), id, authenticated: AtomicBool::new(false), _fds: r })
                }
                None => {
                    if out.is_empty() {
                        out.extend(st.pending.pop_first().map(|(_, p)| p));
                    }
                    Err(format!("the process's descriptor budget ({} of RLIMIT_NOFILE, after headroom) is spent", descriptor_budget()))
                }
            }
        };
        for p in out {
            self.evicted.fetch_add(1, Ordering::Relaxed);
            if !self.told.swap(true, Ordering::Relaxed) {
                crate::warn(&format!(
                    "{}: evicting the oldest unauthenticated connection (from {}) to make room; further evictions are counted, not shown",
                    self.what, p.peer
                ));
            }
            (p.evict)();
        }
        admitted
    }

    /// Unauthenticated connections evicted so far.
    pub fn evicted(&self) -> usize {
        self.evicted.load(Ordering::Relaxed)
    }

    fn forget(&self, id: u64) -> Option<Pending> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).pending.remove(&id)
    }
}

impl Ticket {
    /// The connection proved the key: it leaves the unauthenticated and
    /// can no longer be evicted (its descriptors stay counted).
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
        drop(self.gate.forget(self.id));
    }

    /// Whether the gate evicted this connection to make room (its
    /// handshake then fails; that is not worth a report of its own).
    pub fn evicted(&self) -> bool {
        !self.authenticated.load(Ordering::Relaxed)
            && !self.gate.state.lock().unwrap_or_else(|p| p.into_inner()).pending.contains_key(&self.id)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        drop(self.gate.forget(self.id));
    }
}

/// The whole-handshake limit, `WM_HANDSHAKE_S` (default 5 s).
///
/// # Errors
/// [`crate::Error::Bootstrap`] naming the variable's bad value.
pub fn handshake_limit() -> crate::Result<Duration> {
    wm_topology::env::handshake().map_err(crate::Error::Bootstrap)
}

/// Waits until one of `fds` is readable (or hung up), at most `timeout`;
/// says which are. Acceptors wait on their listeners and a wake-up socket
/// together, so stopping one needs no new descriptor.
///
/// # Errors
/// `poll`'s.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds.iter().map(|f| libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    crate::sys::poll(&mut pfds, ms)?;
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn flag() -> (Arc<AtomicBool>, Evict) {
        let f = Arc::new(AtomicBool::new(false));
        let g = f.clone();
        (f, Box::new(move || g.store(true, Ordering::SeqCst)))
    }

    #[test]
    fn the_budget_leaves_headroom_and_the_limit_is_raised() {
        let b = descriptor_budget();
        assert!(b > 0, "no descriptor budget");
        let status = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = status.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let v: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(v[3], v[4], "the soft limit was not raised to the hard one: {line}");
    }

    #[test]
    fn a_full_peer_share_evicts_that_peers_oldest_and_authenticated_ones_stay() {
        let g = Gate::new("test gate");
        let mut tickets = Vec::new();
        let mut flags = Vec::new();
        for _ in 0..g.per_peer_max {
            let (f, e) = flag();
            tickets.push(g.admit("10.0.0.1", 1, e).unwrap());
            flags.push(f);
        }
        // The first proves itself: it is never evicted.
        tickets[0].authenticated();
        let (other, e) = flag();
        let _o = g.admit("10.0.0.2", 1, e).unwrap();
        let (_, e) = flag();
        let _n = g.admit("10.0.0.1", 1, e).unwrap();
        assert!(flags.iter().all(|f| !f.load(Ordering::SeqCst)), "an eviction before any share was full");
        let (_, e) = flag();
        let _t = g.admit("10.0.0.1", 1, e).unwrap();
        assert!(!flags[0].load(Ordering::SeqCst), "an authenticated connection was evicted");
        assert!(flags[1].load(Ordering::SeqCst), "the peer's oldest unauthenticated connection was not evicted");
        assert!(tickets[1].evicted() && !tickets[0].evicted() && !tickets[2].evicted());
        assert!(!other.load(Ordering::SeqCst), "another peer's connection was evicted for this peer's");
        assert_eq!(g.evicted(), 1);
    }
}
