//! Descriptors between processes of one node over a Unix stream
//! (`SCM_RIGHTS`), and who is at the other end (`SO_PEERCRED`): what a
//! process outside the communicator needs to receive a rank's shared memory
//! (`wm-onesided`'s readers). The raw calls are those of the mesh, in
//! `sys`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use crate::sys;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = sys::MAX_FDS;

fn wait(s: &UnixStream, events: i16, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "the other side did not answer in time"));
    }
    let mut pfd = [libc::pollfd { fd: s.as_raw_fd(), events, revents: 0 }];
    sys::poll(&mut pfd, i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1))?;
    Ok(())
}

fn again(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// Sends all of `bytes` (not empty) with `fds` attached to the first byte,
/// by `deadline`.
///
/// # Errors
/// Too many descriptors, a closed connection, the deadline.
pub fn send_fds(s: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>], deadline: Instant) -> io::Result<()> {
    if bytes.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors with {} bytes", fds.len(), bytes.len())));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut done = loop {
        match sys::send_with_fds(s.as_raw_fd(), bytes, &raw) {
            Ok(n) => break n,
            Err(e) if again(&e) => wait(s, libc::POLLOUT, deadline)?,
            Err(e) => return Err(e),
        }
    };
    while done < bytes.len() {
        match sys::send(s.as_raw_fd(), &bytes[done..]) {
            Ok(n) => done += n,
            Err(e) if again(&e) => wait(s, libc::POLLOUT, deadline)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf` exactly, by `deadline`, and returns the descriptors that
/// came with it; more than `max_fds` is an error (all are closed).
///
/// # Errors
/// A closed connection (`UnexpectedEof`), too many descriptors, the
/// deadline.
pub fn recv_fds(s: &UnixStream, buf: &mut [u8], max_fds: usize, deadline: Instant) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        match sys::recv_with_fds(s.as_raw_fd(), &mut buf[got..], &mut fds) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the other side closed the connection")),
            Ok(n) => got += n,
            Err(e) if again(&e) => wait(s, libc::POLLIN, deadline)?,
            Err(e) => return Err(e),
        }
        if fds.len() > max_fds {
            return Err(io::Error::other(format!("{} descriptors arrived where at most {max_fds} were expected", fds.len())));
        }
    }
    Ok(fds)
}

/// The user id of the process at the other end, as the kernel recorded it
/// when the connection was made.
///
/// # Errors
/// The system call's.
pub fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    sys::peer_cred(s.as_raw_fd()).map(|(_, uid)| uid)
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    sys::effective_uid()
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::time::Duration;

    use super::*;

    #[test]
    fn descriptors_travel_and_limits_hold() {
        let (a, b) = UnixStream::pair().unwrap();
        let soon = Instant::now() + Duration::from_secs(5);
        let f = std::fs::File::open("/dev/null").unwrap();
        send_fds(&a, b"hello", &[f.as_fd(), f.as_fd()], soon).unwrap();
        let mut buf = [0u8; 5];
        let fds = recv_fds(&b, &mut buf, 2, soon).unwrap();
        assert_eq!((&buf, fds.len()), (b"hello", 2));
        send_fds(&a, b"x", &[f.as_fd(), f.as_fd()], soon).unwrap();
        let e = recv_fds(&b, &mut buf[..1], 1, soon).unwrap_err();
        assert!(e.to_string().contains("at most 1"), "{e}");
        assert_eq!(peer_uid(&a).unwrap(), effective_uid());
        // Nothing sent: the deadline, not a hang.
        let e = recv_fds(&b, &mut buf, 0, Instant::now() + Duration::from_millis(30)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(a);
        assert_eq!(recv_fds(&b, &mut buf, 0, soon).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
