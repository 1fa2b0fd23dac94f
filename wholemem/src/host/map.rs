//! Raw host mappings: memfd portions, reservations and the mappings placed in
//! them. The only unsafe code of the host path lives here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// The size of a page the kernel maps with one middle-level page-table entry
/// (a "PMD" huge page): `hpage_pmd_size` from sysfs, else 2 MiB.
pub fn huge_page_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&s| s.is_power_of_two() && s > page_size())
            .unwrap_or(2 << 20)
    })
}

/// Whether `WM_HUGE_PAGES` leaves shared portions free to use huge pages.
fn huge_pages_wanted() -> bool {
    !matches!(wm_topology::env::WM_HUGE_PAGES.get().as_deref().map(str::trim), Some("off" | "0" | "no" | "false"))
}

/// The seals every shared-memory file of a table carries before it leaves
/// this process: its size can never change again, and no seal can be added
/// (so not `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE` either, which would stop
/// the writable mappings the table needs).
pub const SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// An anonymous shared-memory file of `size` bytes (zero-filled), sealed
/// with [`SEALS`]. It has no name in any file system, so nothing is left
/// behind when the last process holding it exits, however it exits; and
/// since nobody can shrink it, a process that mapped it never faults on a
/// page that is gone (SIGBUS).
///
/// With `huge`, the whole huge pages at its start are asked for as huge pages
/// ([`back_with_huge_pages`]); the rest, or all of it where the kernel
/// declines, gets ordinary pages. The seals come last: they do not stop
/// `MADV_COLLAPSE`, which leaves the size alone, but sealing after it keeps
/// the two independent.
pub fn memfd(name: &str, size: usize, huge: bool) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    let len = libc::off_t::try_from(size).map_err(|_| io::Error::other(format!("a shared-memory file of {size} bytes")))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor this process owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is open; ftruncate only sets its size.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if huge && huge_pages_wanted() {
        back_with_huge_pages(fd.as_fd(), size);
    }
    // Allocate the (remaining) pages now, by this process (so on its NUMA
    // node, and so a lack of memory is an error here rather than a SIGBUS
    // at first touch).
    // SAFETY: `fd` is open; fallocate only allocates its pages.
    if size > 0 && unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
    }
    // SAFETY: `fd` is open; F_ADD_SEALS only restricts later changes to it.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Checks a shared-memory file that a peer sent before anything maps it: it
/// carries [`SEALS`] (so it cannot shrink under the mapping) and holds
/// exactly `len` bytes. The error says what is wrong, for an error naming
/// the peer.
pub fn check_received(fd: BorrowedFd<'_>, len: usize) -> Result<(), String> {
    // SAFETY: `fd` is open; F_GET_SEALS only reads its seals.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(format!("a descriptor that is not a sealable shared-memory file ({})", io::Error::last_os_error()));
    }
    if seals & SEALS != SEALS {
        return Err(format!(
            "a shared-memory file without its seals (seals {seals:#x}, wanted {SEALS:#x}: shrink, grow and seal): its size could change under the mapping"
        ));
    }
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("a descriptor whose size cannot be read ({})", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("a descriptor that is not a regular shared-memory file".to_owned());
    }
    if u64::try_from(st.st_size).ok() != Some(len as u64) {
        return Err(format!("a shared-memory file of {} bytes where the table's layout needs {len}", st.st_size));
    }
    Ok(())
}

/// Backs the first `size / H` whole huge pages of a fresh shared-memory file
/// with huge pages (`H` = [`huge_page_size`]), as far as the kernel allows.
///
/// A table of random rows in 4 KiB pages misses the TLB on nearly every row,
/// and each miss walks four levels of page tables (more under a hypervisor);
/// with 2 MiB pages a 2 GiB table needs 1024 entries instead of 524 288.
/// Shared memory (tmpfs, memfd) gets huge pages at fault time only where
/// `shmem_enabled` allows it, which distributions leave at `never`; but
/// `MADV_COLLAPSE` (Linux 6.1) builds huge pages for shared memory regardless
/// of that setting. So: one small page per huge page (so each range is not
/// an empty hole, which the kernel refuses to collapse), a temporary aligned
/// mapping, `MADV_COLLAPSE`, unmap. The huge pages stay in the file; every
/// later mapping at a huge-page-aligned address and offset maps them with
/// one entry each.
///
/// Best effort: an older kernel, no contiguous memory free, or any other
/// refusal leaves the file as it was, and the caller allocates ordinary
/// pages.
fn back_with_huge_pages(fd: BorrowedFd<'_>, size: usize) {
    let huge = huge_page_size();
    let len = size / huge * huge;
    if len == 0 {
        return;
    }
    for off in (0..len).step_by(huge) {
        // SAFETY: `fd` is open; fallocate only allocates one page of it.
        if unsafe { libc::fallocate(fd.as_raw_fd(), 0, off as libc::off_t, page_size() as libc::off_t) } != 0 {
            return;
        }
    }
    let Ok(window) = Region::reserve_aligned(len, huge) else { return };
    // SAFETY: the reservation is fresh and private to this function.
    if unsafe { window.place_lazily(0, fd, len) }.is_err() {
        return;
    }
    // SAFETY: the range is `window`'s own mapping of `fd`; MADV_COLLAPSE
    // moves the file's contents into huge pages without changing them.
    unsafe { libc::madvise(window.ptr().cast(), len, libc::MADV_COLLAPSE) };
}

/// Bytes of `start..start + len` this process maps with huge pages now, from
/// `/proc/self/smaps` (0 where it cannot be read). smaps counts huge pages
/// per mapping, so a mapping that only partly overlaps the range counts at
/// most its overlap.
pub fn huge_bytes_in(start: usize, len: usize) -> usize {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
    let end = start + len;
    let mut overlap = 0;
    let mut total = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first.ends_with(':') {
            // A field of the current mapping.
            if overlap > 0 && matches!(first, "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:") {
                let huge = words.next().and_then(|kb| kb.parse::<usize>().ok()).unwrap_or(0) * 1024;
                total += huge.min(overlap);
            }
        } else if let Some((a, b)) = first.split_once('-') {
            // The header of the next mapping: `start-end perms offset ...`.
            let parse = |s: &str| usize::from_str_radix(s, 16).ok();
            overlap = match (parse(a), parse(b)) {
                (Some(a), Some(b)) => b.min(end).saturating_sub(a.max(start)),
                _ => 0,
            };
        }
    }
    total
}

/// `madvise(MADV_HUGEPAGE)` on the whole pages inside `memory`.
pub fn advise_huge_pages(memory: &mut [u8]) {
    let page = page_size();
    let head = memory.as_ptr().align_offset(page);
    let len = memory.len().saturating_sub(head) / page * page;
    if len > 0 {
        // SAFETY: `head..head + len` lies inside `memory`, which the caller
        // borrows exclusively; MADV_HUGEPAGE does not change contents.
        unsafe { libc::madvise(memory.as_mut_ptr().add(head).cast(), len, libc::MADV_HUGEPAGE) };
    }
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
    /// `len` bytes of a shared file from offset 0 (`len > 0`), page tables
    /// filled in now so that no later access faults. Placed at a huge-page
    /// boundary when it spans a huge page, so huge pages the file holds are
    /// mapped as such.
    pub fn shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        assert!(len > 0);
        let huge = huge_page_size();
        let align = if len >= huge { huge } else { page_size() };
        let region = Self::reserve_aligned(len.div_ceil(page_size()) * page_size(), align)?;
        // SAFETY: the reservation is fresh; nothing points into it.
        unsafe { region.place(0, fd, len) }?;
        Ok(region)
    }

    /// Shared files mapped read-only side by side (each from its offset 0,
    /// every one but the last a whole number of pages), `len` bytes in all
    /// (`len > 0`), page tables filled in now, at a huge-page boundary when
    /// they span a huge page: another process's table portion, for
    /// one-sided reads. Writes through it fault, so nothing here can change
    /// the owner's rows.
    pub fn read_only_pieces(pieces: &[(BorrowedFd<'_>, usize)], len: usize) -> io::Result<Self> {
        assert!(len > 0 && pieces.iter().map(|p| p.1).sum::<usize>() == len);
        let huge = huge_page_size();
        let align = if len >= huge { huge } else { page_size() };
        let region = Self::reserve_aligned(len.div_ceil(page_size()) * page_size(), align)?;
        let mut at = 0;
        for &(fd, bytes) in pieces {
            if bytes > 0 {
                // SAFETY: the reservation is fresh; nothing points into it.
                unsafe { region.place_with(at, fd, bytes, libc::MAP_POPULATE, libc::PROT_READ) }?;
            }
            at += bytes;
        }
        region.advise_huge_pages(0, len);
        Ok(region)
    }

    /// An inaccessible range of address space to place mappings in
    /// (`len > 0`, a multiple of the page size), starting at a multiple of
    /// `align` (a power of two, at least the page size).
    pub fn reserve_aligned(len: usize, align: usize) -> io::Result<Self> {
        let page = page_size();
        assert!(len > 0 && len % page == 0 && align.is_power_of_two() && align >= page);
        let slack = align - page;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let raw = mmap(std::ptr::null_mut(), len + slack, libc::PROT_NONE, flags, -1)?.as_ptr();
        let head = raw.align_offset(align);
        let tail = slack - head;
        // SAFETY: `raw..raw+len+slack` was just mapped by this function;
        // unmapping its unaligned head and surplus tail leaves
        // `raw+head..raw+head+len`, which the returned Region owns.
        unsafe {
            if head > 0 {
                libc::munmap(raw.cast(), head);
            }
            if tail > 0 {
                libc::munmap(raw.add(head + len).cast(), tail);
            }
        }
        // SAFETY: `raw + head` lies inside the mapping (head ≤ slack).
        let ptr = NonNull::new(unsafe { raw.add(head) }).expect("mmap does not return null on success");
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
        // SAFETY: forwarded from the caller.
        unsafe { self.place_with(offset, fd, len, libc::MAP_POPULATE, libc::PROT_READ | libc::PROT_WRITE) }?;
        self.advise_huge_pages(offset, len);
        Ok(())
    }

    /// As [`place`](Self::place), without filling in page tables: a read
    /// of a hole in the file then allocates nothing until it happens.
    ///
    /// # Safety
    /// As for [`place`](Self::place).
    unsafe fn place_lazily(&self, offset: usize, fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.place_with(offset, fd, len, 0, libc::PROT_READ | libc::PROT_WRITE) }
    }

    /// # Safety
    /// As for [`place`](Self::place).
    unsafe fn place_with(&self, offset: usize, fd: BorrowedFd<'_>, len: usize, extra: i32, prot: i32) -> io::Result<()> {
        assert!(offset % page_size() == 0 && len > 0 && offset + len <= self.len, "placement outside the reservation");
        let flags = libc::MAP_SHARED | libc::MAP_FIXED | extra;
        // SAFETY: the target range is inside this reservation (asserted), so
        // MAP_FIXED replaces only pages this Region owns.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        mmap(at.cast(), len, prot, flags, fd.as_raw_fd()).map(drop)
    }

    /// Asks for transparent huge pages: random rows of a large table miss
    /// the TLB far less. A hint; where the kernel declines, nothing changes.
    fn advise_huge_pages(&self, offset: usize, len: usize) {
        // SAFETY: the range is inside this Region's own mapping (callers
        // pass a placed or allocated range); MADV_HUGEPAGE does not change
        // its contents.
        unsafe { libc::madvise(self.ptr.as_ptr().add(offset).cast(), len, libc::MADV_HUGEPAGE) };
    }

    /// Bytes of this range the process maps with huge pages now.
    pub fn huge_bytes(&self) -> usize {
        huge_bytes_in(self.ptr.as_ptr() as usize, self.len)
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

/// A shared-memory file of `len` bytes made the way a careless peer would:
/// without seals (for tests of the receiving checks).
#[cfg(test)]
pub(crate) fn unsealed_memfd(len: usize) -> OwnedFd {
    let name = CString::new("wholemem-test-unsealed").expect("no NUL");
    // SAFETY: a valid name for the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor this process owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is open; ftruncate only sets its size.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }, 0, "ftruncate");
    fd
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

    fn resize(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        // SAFETY: `fd` is open; ftruncate only sets its size.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[test]
    fn table_memfds_are_sealed_and_checked_on_receipt() {
        let page = page_size();
        let fd = memfd("wholemem-test-sealed", 2 * page, false).unwrap();
        check_received(fd.as_fd(), 2 * page).unwrap();
        // The seals refuse both directions of a resize.
        for len in [page, 3 * page, 0] {
            let e = resize(fd.as_fd(), len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "resizing to {len}: {e}");
        }
        // A sealed file of another size than the layout's is refused.
        let e = check_received(fd.as_fd(), 4 * page).unwrap_err();
        assert!(e.contains(&format!("{} bytes where the table's layout needs {}", 2 * page, 4 * page)), "{e}");

        // A file a careless (or hostile) peer made without seals: refused,
        // whatever its size.
        let raw = unsealed_memfd(page);
        let e = check_received(raw.as_fd(), page).unwrap_err();
        assert!(e.contains("without its seals"), "{e}");
        // And something that is not shared memory at all.
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = check_received(file.as_fd(), 0).unwrap_err();
        assert!(e.contains("not a sealable shared-memory file"), "{e}");
    }

    #[test]
    fn huge_page_memfds_are_sealed_too() {
        let huge = huge_page_size();
        let fd = memfd("wholemem-test-huge", 2 * huge, true).unwrap();
        check_received(fd.as_fd(), 2 * huge).unwrap();
        let r = Region::shared(fd.as_fd(), 2 * huge).unwrap();
        // SAFETY: the mapping is 2 huge pages long and used only here.
        unsafe {
            r.ptr().add(huge + 3).write(9);
            assert_eq!(r.ptr().add(huge + 3).read(), 9);
        }
    }

    #[test]
    fn placed_memfds_are_side_by_side_and_shared() {
        let page = page_size();
        let a = memfd("wholemem-test-a", page, false).unwrap();
        let b = memfd("wholemem-test-b", 2 * page, false).unwrap();
        let res = Region::reserve_aligned(3 * page, page).unwrap();
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
