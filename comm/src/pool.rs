//! Large buffers kept between calls, so that a collective called thousands
//! of times does not fault in fresh pages every time.
//!
//! A buffer of a few MiB costs a page fault per 4 KiB page the first time it
//! is written (hundreds of microseconds per call, more than the copy
//! itself); reusing one costs nothing. Exchanges of random ids ask for
//! slightly different sizes each call, so a new buffer gets
//! [`HEADROOM`] more room than asked, and a full pool keeps its largest
//! buffers: after the first calls every request finds a buffer that fits.

use std::collections::TryReserveError;

/// The extra room of a new buffer: an eighth of its length.
pub const HEADROOM: usize = 8;

/// Buffers of `T` with room for at least `min` values each, at most `max`
/// of them.
#[derive(Debug)]
pub struct BufferPool<T> {
    bufs: Vec<Vec<T>>,
    min: usize,
    max: usize,
}

impl<T: Copy + Default> BufferPool<T> {
    /// An empty pool keeping up to `max` buffers of `min` values or more.
    pub const fn new(min: usize, max: usize) -> Self {
        Self { bufs: Vec::new(), min, max }
    }

    /// A buffer of `len` values: the smallest kept one with room for them
    /// (its contents are whatever it held; only values past its old length
    /// are set to `T::default()`), else a new one of `len` default values
    /// with room for an eighth more.
    ///
    /// # Errors
    /// When `len` values cannot be allocated (a length that came from a
    /// peer must not abort the process).
    pub fn take(&mut self, len: usize) -> Result<Vec<T>, TryReserveError> {
        let best = self.bufs.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
        let mut b = match best {
            Some(i) => self.bufs.swap_remove(i),
            None => {
                let mut b = Vec::new();
                if len < self.min || b.try_reserve_exact(len.saturating_add(len / HEADROOM)).is_err() {
                    b.try_reserve_exact(len)?;
                }
                b
            }
        };
        b.resize(len, T::default());
        b.truncate(len);
        Ok(b)
    }

    /// A kept buffer of at least `len` elements' capacity, emptied, if
    /// one is kept; nothing is allocated.
    pub fn reuse(&mut self, len: usize) -> Option<Vec<T>> {
        let best = self.bufs.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i)?;
        let mut b = self.bufs.swap_remove(best);
        b.clear();
        Some(b)
    }

    /// Like [`take`](Self::take), aborting on allocation failure as `vec!`
    /// does (for lengths of this process's own making).
    pub fn get(&mut self, len: usize) -> Vec<T> {
        self.take(len).unwrap_or_else(|_| vec![T::default(); len])
    }

    /// Keeps `b` for a later [`take`](Self::take) when it is large enough;
    /// when the pool is full it replaces the smallest kept buffer, if that
    /// one is smaller.
    pub fn keep(&mut self, b: Vec<T>) {
        if b.capacity() < self.min || self.max == 0 {
            return;
        }
        if self.bufs.len() < self.max {
            self.bufs.push(b);
            return;
        }
        if let Some((i, small)) = self.bufs.iter().enumerate().min_by_key(|(_, k)| k.capacity())
            && small.capacity() < b.capacity()
        {
            self.bufs[i] = b;
        }
    }

    /// Buffers kept now.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// Whether no buffer is kept.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slightly_larger_request_reuses_the_buffer_of_the_last() {
        let mut pool = BufferPool::<u8>::new(1024, 4);
        let first = pool.take(100_000).unwrap();
        assert_eq!(first.len(), 100_000);
        assert!(first.capacity() >= 100_000 + 100_000 / HEADROOM);
        let at = first.as_ptr();
        pool.keep(first);
        // Random ids: the next call asks a few per cent more.
        let second = pool.take(104_000).unwrap();
        assert_eq!(second.as_ptr(), at, "the kept buffer is reused");
        assert!(second.iter().skip(100_000).all(|&b| b == 0), "growth is zeroed");
        assert!(pool.is_empty());
    }

    #[test]
    fn a_full_pool_keeps_its_largest_buffers_and_ignores_small_ones() {
        let mut pool = BufferPool::<f32>::new(16, 2);
        pool.keep(Vec::with_capacity(8));
        assert!(pool.is_empty(), "below the minimum");
        for cap in [100, 50, 400] {
            pool.keep(Vec::with_capacity(cap));
        }
        assert_eq!(pool.len(), 2);
        // 50 was replaced by 400: a request for 300 fits without allocating.
        let b = pool.take(300).unwrap();
        assert!(b.capacity() >= 400 && b.capacity() < 400 + 400 / HEADROOM);
        assert_eq!(b.len(), 300);
        assert_eq!(pool.take(100).unwrap().capacity(), 100);
    }

    #[test]
    fn the_allocator_is_tuned_on_glibc_unless_turned_off() {
        let off = wm_topology::env::WM_MALLOC_TUNE.get().as_deref().map(str::trim) == Some("0");
        assert_eq!(crate::tune_allocator(), cfg!(all(target_os = "linux", target_env = "gnu")) && !off);
    }

    #[test]
    fn an_impossible_length_is_an_error_not_an_abort() {
        let mut pool = BufferPool::<u8>::new(1, 1);
        assert!(pool.take(usize::MAX / 2).is_err());
    }
}
