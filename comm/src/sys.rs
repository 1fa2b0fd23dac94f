//! The few raw socket calls std does not offer: non-blocking send and receive
//! without SIGPIPE, file descriptors over `SCM_RIGHTS`, and `poll`; and the
//! C allocator's thresholds.
//!
//! Every function takes a descriptor the caller owns and keeps open for the
//! duration of the call; that is the invariant the `SAFETY` comments rely on.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors carried by one message.
pub(crate) const MAX_FDS: usize = 32;

fn cvt(ret: isize) -> io::Result<usize> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret as usize) }
}

/// Sends without blocking and without raising SIGPIPE on a closed peer.
pub(crate) fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid readable slice for its length; `fd` is open.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    cvt(n)
}

/// Receives without blocking. `Ok(0)` means the peer closed its end.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable slice for its length; `fd` is open.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    cvt(n)
}

fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((n * mem::size_of::<RawFd>()) as u32) as usize }
}

/// Sends the concatenation of `parts` without blocking, with one system
/// call (empty parts are skipped).
pub(crate) fn send_vectored(fd: RawFd, parts: &[&[u8]]) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> =
        parts.iter().filter(|p| !p.is_empty()).map(|p| libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() }).collect();
    // SAFETY: zeroed msghdr is a valid empty header; the vector is set below.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: every iovec points into a live slice of `parts`, which the
    // kernel only reads; fd is open.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    cvt(n)
}

/// Sends `buf` with `fds` attached to its first byte (Unix sockets only).
pub(crate) fn send_with_fds(fd: RawFd, buf: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    assert!(!buf.is_empty() && fds.len() <= MAX_FDS);
    let mut iov = libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
    // u64 storage keeps the control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; cmsg_space(MAX_FDS).div_ceil(8)];
    let space = cmsg_space(fds.len());
    // SAFETY: zeroed msghdr is a valid empty header; fields are set below.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds at least `space` bytes, enough for one
    // cmsghdr carrying `fds.len()` descriptors, so CMSG_FIRSTHDR is non-null
    // and CMSG_DATA points inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
    }
    // SAFETY: msg points at live iovec and control buffers; fd is open.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    cvt(n)
}

/// Receives into `buf`, appending any descriptors that arrive to `fds_out`
/// (close-on-exec). `Ok(0)` means the peer closed its end.
pub(crate) fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds_out: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = vec![0u64; cmsg_space(MAX_FDS).div_ceil(8)];
    // SAFETY: zeroed msghdr is a valid empty header; fields are set below.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = (control.len() * 8) as _;
    // SAFETY: msg points at live buffers of the stated sizes; fd is open.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    let n = cvt(n)?;
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer
    // with well-formed cmsghdrs; the CMSG_* macros walk only within it, and
    // each SCM_RIGHTS payload holds descriptors this process now owns.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / mem::size_of::<RawFd>() {
                    fds_out.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // The bytes were consumed but descriptors were dropped: the stream
        // can no longer be trusted.
        return Err(io::Error::other("descriptors were dropped in transit (is this process out of file descriptors?)"));
    }
    Ok(n)
}

/// `poll(2)`, retried on `EINTR` as a zero-event return.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid mutable array of pollfd for its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) }
    } else {
        Ok(n as usize)
    }
}

/// A doorbell between the threads of one process: an eventfd one thread
/// rings and another finds among the descriptors it polls, so a thread
/// asleep in `poll(2)` wakes as soon as another needs it.
#[derive(Debug)]
pub(crate) struct Doorbell(OwnedFd);

impl Doorbell {
    /// A new doorbell (a non-blocking, close-on-exec eventfd).
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor this process owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor to poll for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Rings: the next (or current) poll of [`fd`](Self::fd) returns.
    pub(crate) fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64. A full counter (EAGAIN,
        // after 2^64 - 2 rings nobody answered) is still readable: ignored.
        let _ = unsafe { libc::write(self.fd(), (&raw const one).cast(), 8) };
    }

    /// Answers every ring so far: the descriptor stops being readable.
    pub(crate) fn answer(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64. Nothing to read
        // (EAGAIN) is fine: someone answered already.
        let _ = unsafe { libc::read(self.fd(), (&raw mut count).cast(), 8) };
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit
/// (where the kernel allows it); returns the soft limit then in force.
pub(crate) fn raise_nofile() -> io::Result<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
        // SAFETY: `want` is a valid rlimit; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    Ok(r.rlim_cur)
}

/// This process's effective user id.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The process id and user id of the process at the other end of a Unix
/// socket, as the kernel recorded them when the connection was made
/// (`SO_PEERCRED`).
pub(crate) fn peer_cred(fd: RawFd) -> io::Result<(i32, u32)> {
    // SAFETY: an all-zero ucred is a valid value to be overwritten.
    let mut cred: libc::ucred = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes; `fd` is open.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != mem::size_of::<libc::ucred>() {
        return Err(io::Error::other("SO_PEERCRED returned a short credential"));
    }
    Ok((cred.pid, cred.uid))
}

/// Asks for congestion control `name` on TCP socket `fd`
/// (`TCP_CONGESTION`): `ENOENT` when the kernel has no such algorithm,
/// `EPERM` when this process may not choose it.
pub(crate) fn set_tcp_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: `name` is readable for its length; `fd` is open.
    let r = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), name.len() as libc::socklen_t) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A fresh, unconnected TCP socket of `family` (`AF_INET`, `AF_INET6`),
/// closed on drop.
pub(crate) fn tcp_socket(family: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory preconditions.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor this process just opened and owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects the fresh TCP socket `fd` to `addr` within `timeout`, and
/// leaves it blocking: what `TcpStream::connect_timeout` does, on a socket
/// the caller could set options on first.
pub(crate) fn tcp_connect(fd: RawFd, addr: std::net::SocketAddr, timeout: std::time::Duration) -> io::Result<()> {
    // SAFETY: all-zero sockaddr_storage is a valid value to fill in.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any address.
            let sin = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    set_nonblocking(fd, true)?;
    // SAFETY: `storage` holds a valid address of `len` bytes; `fd` is open.
    let r = unsafe { libc::connect(fd, (&raw const storage).cast(), len as libc::socklen_t) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} timed out")));
            }
            let mut p = [libc::pollfd { fd, events: libc::POLLOUT, revents: 0 }];
            if poll(&mut p, left.as_millis().clamp(1, i32::MAX as u128) as i32)? > 0 {
                break;
            }
        }
        let mut err: libc::c_int = 0;
        let mut elen = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `err` is writable for `elen` bytes; `fd` is open.
        if unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut err).cast(), &mut elen) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
    }
    set_nonblocking(fd, false)
}

fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL only reads the descriptor's flags; `fd` is open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: F_SETFL only sets the descriptor's flags; `fd` is open.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The congestion control TCP socket `fd` uses.
pub(crate) fn tcp_congestion(fd: RawFd) -> io::Result<String> {
    // The kernel's names are at most 15 bytes and a NUL (TCP_CA_NAME_MAX).
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is writable for `len` bytes; `fd` is open.
    let r = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, buf.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let got = &buf[..(len as usize).min(buf.len())];
    let end = got.iter().position(|&b| b == 0).unwrap_or(got.len());
    Ok(String::from_utf8_lossy(&got[..end]).into_owned())
}

/// The first IPv4 address of the network interface `name`, if it has one.
pub(crate) fn interface_ipv4(name: &str) -> io::Result<Option<std::net::Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs; its name is a NUL-terminated string and a
        // non-null address of family AF_INET is a sockaddr_in.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null()
                && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET
                && std::ffi::CStr::from_ptr(ifa.ifa_name).to_bytes() == name.as_bytes()
            {
                let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                found = Some(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
                break;
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// Blocks below this many bytes come from the heap, not from a mapping of
/// their own.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of the heap kept, not given back, up to this.
const TRIM_THRESHOLD: i32 = 256 << 20;

/// Sets glibc's `M_MMAP_THRESHOLD` and `M_TRIM_THRESHOLD` (elsewhere:
/// nothing). By default glibc gives back the top of its heap as soon as
/// twice the last large block is free there: a gather's temporaries of a
/// few hundred KiB each, freed at its end, are given back and faulted in
/// again by the next call (on a 65 536-id hierarchy gather, half of its
/// de-duplication time). Returns whether the thresholds were set.
pub(crate) fn tune_malloc() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; any value is
        // valid for these two.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (MMAP_THRESHOLD, TRIM_THRESHOLD);
        false
    }
}
