//! The congestion control of the job's TCP connections
//! (`WM_TCP_CONGESTION`).
//!
//! A collective exchange between nodes is a burst: every rank sends its
//! parts at once and waits for the others'. Loss-based congestion control
//! (Cubic, Reno, or the ECN-based DCTCP of a datacenter) sends such a burst
//! as fast as the receiver takes it. BBR paces every connection at the
//! bandwidth it has measured, and a connection whose receiver was busy
//! copying rows measures little: between two network namespaces on the
//! development machine, BBR (that host's default) held the bare exchange
//! of a two-ranks-per-node gather to 0.74–0.83 GB/s per rank, against
//! 1.30–1.50 with Cubic (`docs/perf-log/2026-12-03-across-nodes-tenth-cubic.md`).
//!
//! So by default the job keeps the host's choice unless it is BBR, and then
//! asks for Cubic, else Reno — where this process may choose them
//! (`net.ipv4.tcp_allowed_congestion_control` limits unprivileged
//! processes; Reno is always allowed). `WM_TCP_CONGESTION=system` keeps the
//! host's choice whatever it is; any other value names the algorithm to
//! use, and a name the host does not offer, or will not let this process
//! choose, is an error at start naming it and the host's lists.
//!
//! The choice is made once per process, on a fresh socket, before any
//! connection ([`choice`], which the socket backend's start calls), and it
//! is set before each connection is made — on the connecting socket
//! ([`connect`]) and on the listener, whose connections inherit it
//! ([`listen`]) — for the mesh between ranks and the one-sided read
//! servers. A connection born with BBR keeps pacing after a switch to
//! another algorithm, so switching an established one would not do.
//! [`in_use`] says what the connections got.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

use wm_topology::env::WM_TCP_CONGESTION;

use crate::{Error, Result, sys};

/// What `WM_TCP_CONGESTION` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Congestion {
    /// Unset: the host's choice, unless it is BBR; then Cubic, else Reno,
    /// where this process may choose them.
    Default,
    /// `system`: the host's choice, whatever it is.
    System,
    /// An algorithm by name.
    Named(String),
}

/// What the default asks for instead of BBR, in order.
const INSTEAD_OF_PACING: [&str; 2] = ["cubic", "reno"];

impl Congestion {
    /// Reads a value of `WM_TCP_CONGESTION` (`None`: unset).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming the value when it cannot be the name of
    /// a congestion control: empty after trimming, longer than the
    /// kernel's 15 bytes, or with characters other than ASCII letters,
    /// digits, `_` and `-`.
    pub fn parse(value: Option<&str>) -> Result<Self> {
        let Some(raw) = value else { return Ok(Self::Default) };
        let v = raw.trim();
        if v == "system" {
            return Ok(Self::System);
        }
        let fits = !v.is_empty() && v.len() <= 15 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !fits {
            return Err(Error::Bootstrap(format!(
                "{}={raw:?} is not the name of a congestion control (at most 15 letters, digits, `_` or `-`; or `system`)",
                WM_TCP_CONGESTION.name
            )));
        }
        Ok(Self::Named(v.to_owned()))
    }

    /// Decides, on a fresh socket, the algorithm to ask for on every
    /// connection: `None` leaves the host's.
    fn resolve(&self) -> Result<Option<String>> {
        match self {
            Self::System => Ok(None),
            // Best effort: a host whose choice cannot even be read keeps it.
            Self::Default => Ok(sys::tcp_socket(libc::AF_INET).ok().and_then(|fresh| {
                let fd = fresh.as_raw_fd();
                let host = sys::tcp_congestion(fd).ok()?;
                if !host.starts_with("bbr") {
                    return None;
                }
                INSTEAD_OF_PACING.iter().find(|name| sys::set_tcp_congestion(fd, name).is_ok()).map(|name| (*name).to_owned())
            })),
            Self::Named(name) => {
                let fresh =
                    sys::tcp_socket(libc::AF_INET).map_err(|e| Error::io("opening a TCP socket to check the congestion control", e))?;
                sys::set_tcp_congestion(fresh.as_raw_fd(), name)
                    .map_err(|e| Error::Bootstrap(format!("{}={name:?}: {}", WM_TCP_CONGESTION.name, refusal(&e))))?;
                Ok(Some(name.clone()))
            }
        }
    }
}

/// Why the kernel refused an algorithm, with the host's lists.
fn refusal(e: &std::io::Error) -> String {
    let list = |what: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{what}")).map_or_else(|_| "unreadable".to_owned(), |s| s.trim().to_owned())
    };
    match e.raw_os_error() {
        Some(libc::ENOENT) => {
            format!(
                "this host has no congestion control of that name (net.ipv4.tcp_available_congestion_control: {})",
                list("tcp_available_congestion_control")
            )
        }
        Some(libc::EPERM) => format!(
            "this process may not choose it (unprivileged processes may choose: {}, net.ipv4.tcp_allowed_congestion_control)",
            list("tcp_allowed_congestion_control")
        ),
        _ => format!("the kernel refused it: {e}"),
    }
}

/// The algorithm this process asks for on its connections (`None`: the
/// host's), from `WM_TCP_CONGESTION`, decided once.
///
/// # Errors
/// [`Error::Bootstrap`] naming the value when it is malformed, or names an
/// algorithm the host does not offer or will not let this process choose
/// (every later call returns the same error).
pub fn choice() -> Result<Option<&'static str>> {
    static CHOICE: OnceLock<std::result::Result<Option<String>, String>> = OnceLock::new();
    let decided = CHOICE.get_or_init(|| {
        Congestion::parse(WM_TCP_CONGESTION.get().as_deref()).and_then(|c| c.resolve()).map_err(|e| match e {
            Error::Bootstrap(why) => why,
            other => other.to_string(),
        })
    });
    match decided {
        Ok(name) => Ok(name.as_deref()),
        Err(why) => Err(Error::Bootstrap(why.clone())),
    }
}

static IN_USE: OnceLock<String> = OnceLock::new();

/// Applies [`choice`] to a listener: the connections it accepts are born
/// with it.
///
/// # Errors
/// [`choice`]'s error, or the kernel's refusal (not expected once
/// [`choice`] has checked the name on a fresh socket).
pub fn listen(l: &TcpListener) -> Result<()> {
    if let Some(name) = choice()? {
        sys::set_tcp_congestion(l.as_raw_fd(), name)
            .map_err(|e| Error::Bootstrap(format!("{}={name:?}: {}", WM_TCP_CONGESTION.name, refusal(&e))))?;
    }
    Ok(())
}

/// Connects to `addr` within `timeout` on a socket that has [`choice`]'s
/// congestion control before the connection is made, and
/// [`record`]s it.
///
/// # Errors
/// The connection's failure; [`choice`]'s error as an
/// [`io::ErrorKind::InvalidInput`] (callers check [`choice`] first to
/// report it as such).
pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let fd = sys::tcp_socket(family)?;
    if let Some(name) = choice().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))? {
        sys::set_tcp_congestion(fd.as_raw_fd(), name)
            .map_err(|e| io::Error::new(e.kind(), format!("{}={name:?}: {}", WM_TCP_CONGESTION.name, refusal(&e))))?;
    }
    sys::tcp_connect(fd.as_raw_fd(), addr, timeout)?;
    let s = TcpStream::from(fd);
    record(&s);
    Ok(s)
}

/// Remembers the congestion control of the first connection made or
/// accepted, for [`in_use`].
pub fn record(s: &TcpStream) {
    if IN_USE.get().is_none() {
        if let Ok(got) = sys::tcp_congestion(s.as_raw_fd()) {
            let _ = IN_USE.set(got);
        }
    }
}

/// The congestion control of this process's TCP connections — the mesh
/// between ranks, a one-sided reader's — read back from the first one
/// [`record`]ed; `None` before any (a job on one node has none).
pub fn in_use() -> Option<&'static str> {
    IN_USE.get().map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_malformed_values_are_errors_naming_them() {
        assert_eq!(Congestion::parse(None).unwrap(), Congestion::Default);
        assert_eq!(Congestion::parse(Some("system")).unwrap(), Congestion::System);
        assert_eq!(Congestion::parse(Some(" cubic ")).unwrap(), Congestion::Named("cubic".into()));
        assert_eq!(Congestion::parse(Some("bbr-2_x")).unwrap(), Congestion::Named("bbr-2_x".into()));
        for bad in ["", "  ", "cu bic", "reno;rm", "sixteen_letters_", "é"] {
            let e = Congestion::parse(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(&format!("WM_TCP_CONGESTION={bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_named_algorithm_is_set_and_read_back_and_an_unknown_one_is_refused_with_the_hosts_list() {
        // Reno is built into every kernel and allowed to every process.
        assert_eq!(Congestion::Named("reno".into()).resolve().unwrap().as_deref(), Some("reno"));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        sys::set_tcp_congestion(s.as_raw_fd(), "reno").unwrap();
        assert_eq!(sys::tcp_congestion(s.as_raw_fd()).unwrap(), "reno");

        let e = Congestion::Named("nosuchcc".into()).resolve().unwrap_err().to_string();
        assert!(e.contains("WM_TCP_CONGESTION=\"nosuchcc\"") && e.contains("tcp_available_congestion_control"), "{e}");
    }

    #[test]
    fn the_default_keeps_the_hosts_choice_unless_it_paces() {
        let fresh = sys::tcp_socket(libc::AF_INET).unwrap();
        let host = sys::tcp_congestion(fresh.as_raw_fd()).unwrap();
        let got = Congestion::Default.resolve().unwrap();
        if host.starts_with("bbr") {
            // Reno at least is always allowed.
            assert!(matches!(got.as_deref(), Some("cubic" | "reno")), "{got:?} instead of {host}");
        } else {
            assert_eq!(got, None, "the host's {host} was overridden");
        }
        assert_eq!(Congestion::System.resolve().unwrap(), None);
    }
}
