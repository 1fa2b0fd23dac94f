//! A stranger that holds many connections open: `wm-test-flood MODE N
//! SECS HOST:PORT…` opens `N` non-blocking TCP connections to each
//! address from one thread, then holds them for `SECS` seconds — `idle`
//! says nothing; `drip` sends one byte a second on each. It never holds
//! the key. The tests run it as another user against every listener of a
//! job (`tests/tests/bounds.rs`).
//!
//! It prints `issued N` once every connection is started and, each
//! second, how many are still open (`open K`): a listener that sheds
//! unauthenticated connections closes most of them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One connection: its descriptor, or closed.
struct Conn(Option<std::os::fd::OwnedFd>);

fn open(to: SocketAddr) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = to else { bail!("{to}: IPv4 only") };
    // SAFETY: socket has no memory preconditions; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    // SAFETY: `fd` is a fresh descriptor this process owns.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: `sa` is a valid sockaddr_in for its size; `fd` is open.
    let r = unsafe { libc::connect(fd, (&raw const sa).cast(), std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e).context(format!("connecting to {to}"));
        }
    }
    Ok(owned)
}

/// Sends one byte (or checks the connection, with `probe`); false when
/// the other side closed it.
fn poke(fd: &std::os::fd::OwnedFd, byte: bool) -> bool {
    use std::os::fd::AsRawFd;
    if byte {
        // SAFETY: one readable byte; `fd` is open.
        let r = unsafe { libc::send(fd.as_raw_fd(), b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            return matches!(e, Some(libc::EAGAIN) | Some(libc::ENOTCONN));
        }
        return true;
    }
    let mut b = [0u8; 64];
    // SAFETY: `b` is writable for its length; `fd` is open.
    let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    if r == 0 {
        return false;
    }
    r > 0 || matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOTCONN))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, n, secs, targets @ ..] = args.as_slice() else { bail!("wm-test-flood idle|drip N SECS HOST:PORT…") };
    let drip = match mode.as_str() {
        "idle" => false,
        "drip" => true,
        other => bail!("mode {other:?}: idle or drip"),
    };
    let n: usize = n.parse().context("N")?;
    let secs: u64 = secs.parse().context("SECS")?;
    let targets: Vec<SocketAddr> = targets.iter().map(|t| t.parse().with_context(|| format!("address {t:?}"))).collect::<Result<_>>()?;
    let mut conns: Vec<Conn> = Vec::with_capacity(n * targets.len());
    for &t in &targets {
        for _ in 0..n {
            conns.push(Conn(Some(open(t)?)));
        }
    }
    println!("issued {n} to each of {} listeners", targets.len());
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_secs(1));
        let mut open = 0;
        for c in &mut conns {
            if let Some(fd) = &c.0 {
                if poke(fd, drip) {
                    open += 1;
                } else {
                    c.0 = None;
                }
            }
        }
        println!("open {open}");
    }
    Ok(())
}
