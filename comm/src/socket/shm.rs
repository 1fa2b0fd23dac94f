//! Shared-memory mailboxes between ranks of one node, for
//! [`Communicator::exchange`](crate::Communicator::exchange).
//!
//! A large payload to a rank on the same node does not travel through the
//! Unix socket (a copy into the kernel, a copy out, a wake-up per socket
//! buffer's worth): the sender writes it straight into a memfd both
//! processes map, and the frame on the socket only says where it is. The
//! receiver reads it there. Each (communicator, peer) pair has two mailboxes
//! per direction, used alternately; see [`Channels`] for why no
//! acknowledgement is needed before a mailbox is written again.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Payloads from this size go through a mailbox; smaller ones ride on the
/// socket, where one send is cheaper than touching shared pages.
pub(crate) const MAILBOX_MIN: usize = 16 << 10;

/// The seals of a mailbox: its size never changes, nor do its seals.
const SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A shared-memory file mapped into this process; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mailbox {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mailbox is plain shared memory plus a descriptor; it can move
// between threads. Who may write it when is the protocol's business (see
// `Channels`), and its bytes are reached only through the unsafe
// `bytes_mut` (with `&mut self`) and `bytes`.
unsafe impl Send for Mailbox {}
// SAFETY: as above; `&Mailbox` hands out bytes only through `unsafe fn bytes`.
unsafe impl Sync for Mailbox {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

impl Mailbox {
    /// A fresh zero-filled mailbox of at least `len` bytes, mapped for
    /// writing.
    pub fn create(len: usize) -> io::Result<Self> {
        let len = len.max(1).div_ceil(page_size()) * page_size();
        let name = CString::new("wm-comm-mailbox").expect("no NUL in the name");
        // SAFETY: `name` is a valid NUL-terminated string for the call.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a fresh descriptor this process owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is open; ftruncate only sets its size.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Its size is fixed from now on, so a peer that maps it can trust
        // `fstat` and never fault past its end.
        // SAFETY: `fd` is an open memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Maps a mailbox a peer created (its size from `fstat`), for reading.
    /// It must be sealed against shrinking and growing: otherwise the peer
    /// could truncate it under this rank's reads (a SIGBUS, not an error).
    pub fn open(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: `fd` is open; F_GET_SEALS only reads its seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(io::Error::other(format!("it is not a sealable memfd: {}", io::Error::last_os_error())));
        }
        if seals & SEALS != SEALS {
            return Err(io::Error::other(format!("its size is not sealed (seals {seals:#x})")));
        }
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is writable for the call.
        if unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = usize::try_from(st.st_size).map_err(|_| io::Error::other("a mailbox of negative size"))?;
        if len == 0 {
            return Err(io::Error::other("an empty mailbox"));
        }
        Self::map(fd, len, libc::PROT_READ)
    }

    fn map(fd: OwnedFd, len: usize, prot: i32) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of an open file at a kernel-chosen
        // address; it overlaps nothing this process uses.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, ptr: NonNull::new(p.cast()).expect("mmap does not return null on success"), len })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The descriptor, to hand to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// The first `len` bytes, for the sender to fill (a mailbox it
    /// [created](Self::create)).
    ///
    /// The memory is shared: the peer holds the descriptor and maps it, so
    /// `&mut self` alone cannot make this slice exclusive.
    ///
    /// # Safety
    /// No other process may read or write the mailbox while the slice
    /// lives. For an outbox of [`Channels`] that holds from the start of
    /// this rank's in-place exchange until the frame announcing the bytes
    /// is sent: the peer only reads a mailbox (it maps it read-only), and
    /// only between the arrival of that frame and the start of its own
    /// next exchange, by which time this rank has moved to the other
    /// outbox (see [`Channels`]).
    ///
    /// # Panics
    /// When `len` is more than the mailbox holds (the caller sized it with
    /// [`Channels::next_outbox`]).
    pub unsafe fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len, "{len} bytes do not fit in a mailbox of {}", self.len);
        // SAFETY: the range is inside the mapping, which is writable (only
        // `create` makes mailboxes a sender fills) and alive as long as the
        // borrow of `self`; `&mut self` excludes other users in this
        // process, the caller's contract other processes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }

    /// The first `len` bytes, as the peer wrote them; an error when the
    /// peer announced more than the mailbox holds.
    ///
    /// # Safety
    /// The peer must not write the mailbox while the slice lives: true from
    /// the arrival of the frame announcing these bytes until this rank's
    /// next in-place exchange on the same communicator begins.
    pub unsafe fn bytes(&self, len: usize) -> Result<&[u8], String> {
        if len > self.len {
            return Err(format!("a part of {len} bytes in a mailbox of {}", self.len));
        }
        // SAFETY: inside the mapping, whose size is sealed; no writer
        // meanwhile (the caller's contract).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) })
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` was mapped by this Mailbox and nothing else
        // unmaps it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The mailboxes of one communicator, by peer (rank in the communicator).
///
/// Why a mailbox can be written again without waiting for an
/// acknowledgement: the two outboxes to a peer are used alternately, so
/// between two writes of one mailbox lies at least one other exchange: if
/// exchange `k` wrote it, the next write is exchange `k + 2` or later. Every in-place
/// exchange waits for a frame from every peer; this rank's exchange `k + 1`
/// therefore ended only after the peer had *started* its exchange `k + 1`,
/// that is after the peer had *finished* its exchange `k`, reading included.
/// So by the time exchange `k + 2` begins here, the peer is done with what
/// exchange `k` left in that mailbox.
#[derive(Debug, Default)]
pub(crate) struct Channels {
    peers: HashMap<usize, PeerBoxes>,
}

#[derive(Debug, Default)]
struct PeerBoxes {
    /// Mailboxes written for this peer so far (which outbox is next).
    count: u64,
    /// What this rank writes for the peer.
    outbox: [Option<Mailbox>; 2],
    /// What the peer writes for this rank, as mapped here.
    inbox: [Option<Mailbox>; 2],
}

impl Channels {
    /// The outbox for the next exchange to `peer`, at least `len` bytes:
    /// its index, the mailbox, and whether it is new (its descriptor must
    /// travel with the frame).
    pub fn next_outbox(&mut self, peer: usize, len: usize) -> io::Result<(usize, &mut Mailbox, bool)> {
        let p = self.peers.entry(peer).or_default();
        let i = (p.count % 2) as usize;
        p.count += 1;
        let slot = &mut p.outbox[i];
        let fresh = match slot {
            Some(m) if m.len() >= len => false,
            _ => {
                // Grow geometrically, so a slowly rising size replaces the
                // mailbox a few times only.
                let old = slot.as_ref().map_or(0, Mailbox::len);
                *slot = Some(Mailbox::create(len.max(2 * old).max(MAILBOX_MIN))?);
                true
            }
        };
        Ok((i, slot.as_mut().expect("just filled"), fresh))
    }

    /// Inbox `index` from `peer`: the mailbox `fd` when the frame brought
    /// one (the peer replaced that mailbox), else the one mapped before.
    pub fn inbox(&mut self, peer: usize, index: usize, fd: Option<OwnedFd>) -> io::Result<&Mailbox> {
        let p = self.peers.entry(peer).or_default();
        let slot = &mut p.inbox[index];
        if let Some(fd) = fd {
            *slot = Some(Mailbox::open(fd)?);
        }
        slot.as_ref().ok_or_else(|| io::Error::other(format!("mailbox {index} was announced without ever being sent")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsealed_memfd(len: usize) -> OwnedFd {
        let name = CString::new("wm-test").unwrap();
        // SAFETY: a valid name; the descriptor is owned right away.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)) };
        // SAFETY: `fd` is an open memfd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }, 0);
        fd
    }

    #[test]
    fn a_mailbox_that_could_shrink_is_refused() {
        let e = Mailbox::open(unsealed_memfd(1 << 16)).unwrap_err();
        assert!(e.to_string().contains("not sealed") || e.to_string().contains("not a sealable"), "{e}");
    }

    #[test]
    fn a_mailbox_cannot_be_resized_and_announced_overruns_are_errors() {
        let mb = Mailbox::create(40_000).unwrap();
        let len = mb.len();
        let theirs = mb.fd().try_clone_to_owned().unwrap();
        // The sender's seals hold against anyone holding the descriptor.
        // SAFETY: `theirs` is an open descriptor of the mailbox.
        assert_ne!(unsafe { libc::ftruncate(theirs.as_raw_fd(), 4096) }, 0, "a sealed mailbox shrank");
        // SAFETY: as above.
        assert_ne!(unsafe { libc::ftruncate(theirs.as_raw_fd(), (len * 2) as libc::off_t) }, 0, "a sealed mailbox grew");
        let seen = Mailbox::open(theirs).unwrap();
        assert_eq!(seen.len(), len);
        // SAFETY: nobody writes the mailbox during the test.
        let over = unsafe { seen.bytes(len + 1) }.unwrap_err();
        assert!(over.contains(&format!("{} bytes in a mailbox of {len}", len + 1)), "{over}");
        // SAFETY: as above.
        assert_eq!(unsafe { seen.bytes(len) }.unwrap().len(), len);
    }
}
