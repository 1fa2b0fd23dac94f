//! Raw host mappings: memfd portions, reservations and the mappings placed in
//! them. The only unsafe code of the host path lives here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// An anonymous shared-memory file of `size` bytes (zero-filled). It has no
/// name in any file system, so nothing is left behind when the last process
/// holding it exits, however it exits.
pub fn memfd(name: &str, size: usize) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor this process owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is open; ftruncate only sets its size.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Allocate the pages now, by this process (so on its NUMA node, and so a
    // lack of memory is an error here rather than a SIGBUS at first touch).
    // SAFETY: `fd` is open; fallocate only allocates its pages.
    if size > 0 && unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, size as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
    }
    Ok(fd)
}

/// One `mmap`ed range this process owns; unmapped on drop.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is plain memory; it can be moved to and used from any
// thread. Concurrent access through raw pointers is the callers' contract,
// as for any shared memory.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only hands out raw pointers.
unsafe impl Sync for Region {}

fn mmap(addr: *mut libc::c_void, len: usize, prot: i32, flags: i32, fd: i32) -> io::Result<NonNull<u8>> {
    // SAFETY: without MAP_FIXED the kernel picks a free range; with
    // MAP_FIXED the callers guarantee `addr..addr+len` lies in a
    // reservation they own (see `Region::place`).
    let p = unsafe { libc::mmap(addr, len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap does not return null on success"))
}

impl Region {
    /// Private zero-filled memory (`len > 0`).
    pub fn anonymous(len: usize) -> io::Result<Self> {
        assert!(len > 0);
        let ptr = mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)?;
        let region = Self { ptr, len };
        region.advise_huge_pages();
        Ok(region)
    }

    /// `len` bytes of a shared file from offset 0 (`len > 0`), page tables
    /// filled in now so that no later access faults.
    pub fn shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        assert!(len > 0);
        let flags = libc::MAP_SHARED | libc::MAP_POPULATE;
        let ptr = mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd.as_raw_fd())?;
        let region = Self { ptr, len };
        region.advise_huge_pages();
        Ok(region)
    }

    /// An inaccessible range of address space to place mappings in
    /// (`len > 0`, a multiple of the page size).
    pub fn reserve(len: usize) -> io::Result<Self> {
        assert!(len > 0 && len % page_size() == 0);
        let ptr = mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1)?;
        Ok(Self { ptr, len })
    }

    /// Maps `len` bytes of `fd` (from its start) at `offset` inside this
    /// reservation, replacing what was there.
    ///
    /// # Safety
    /// No reference into `offset..offset + len` of this region may be alive:
    /// the old pages vanish. Call it while building a reservation, before
    /// handing out pointers.
    pub unsafe fn place(&self, offset: usize, fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        assert!(offset % page_size() == 0 && len > 0 && offset + len <= self.len, "placement outside the reservation");
        let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE;
        // SAFETY: the target range is inside this reservation (asserted), so
        // MAP_FIXED replaces only pages this Region owns.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        mmap(at.cast(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd.as_raw_fd()).map(drop)
    }

    /// Asks for transparent huge pages: random rows of a large table miss
    /// the TLB far less. A hint; where the kernel declines, nothing changes.
    fn advise_huge_pages(&self) {
        // SAFETY: the range is this Region's own mapping; MADV_HUGEPAGE does
        // not change its contents.
        unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_HUGEPAGE) };
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length in bytes.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` was mapped by this Region (including any
        // placements inside it) and nothing else unmaps it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn placed_memfds_are_side_by_side_and_shared() {
        let page = page_size();
        let a = memfd("wholemem-test-a", page).unwrap();
        let b = memfd("wholemem-test-b", 2 * page).unwrap();
        let res = Region::reserve(3 * page).unwrap();
        // SAFETY: nothing points into the fresh reservation.
        unsafe {
            res.place(0, a.as_fd(), page).unwrap();
            res.place(page, b.as_fd(), 2 * page).unwrap();
        }
        let other = Region::shared(b.as_fd(), 2 * page).unwrap();
        // SAFETY: both ranges are mapped read-write and exclusively used here.
        unsafe {
            res.ptr().add(page + 5).write(42);
            assert_eq!(other.ptr().add(5).read(), 42);
            assert_eq!(res.ptr().read(), 0);
        }
    }
}
