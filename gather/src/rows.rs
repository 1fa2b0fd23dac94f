//! Gathering from rows this process reaches outside a `WholeMemory`:
//! another process's portion mapped read-only, or rows received into a
//! private buffer (`wm-onesided`'s readers). The same kernels as
//! [`gather`](crate::gather): conversion, prefetching, threads.

use std::marker::PhantomData;

use wholemem::CommonError;

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::{DType, Error, Result, RowLayout};

/// Rows laid out `stride` bytes apart, in one or more parts (one per
/// owner, say), numbered on from part to part: part `k` holds rows
/// `first[k]..first[k + 1]`.
#[derive(Debug)]
pub struct RowSource<'a> {
    bases: Vec<SendPtr>,
    first: Vec<usize>,
    stride: usize,
    _rows: PhantomData<&'a [u8]>,
}

impl<'a> RowSource<'a> {
    /// The rows of a private buffer (`rows.len()` a multiple of `stride`).
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for a zero stride or a buffer that is not
    /// whole rows.
    pub fn from_slice(rows: &'a [u8], stride: usize) -> Result<Self> {
        if stride == 0 || rows.len() % stride != 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!("{} bytes are not whole rows of {stride} bytes", rows.len()))));
        }
        Ok(Self { bases: vec![SendPtr(rows.as_ptr().cast_mut())], first: vec![0, rows.len() / stride], stride, _rows: PhantomData })
    }

    /// Parts given as (first byte, rows) each.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for a zero stride, or parts whose bytes
    /// add up past `usize::MAX`.
    ///
    /// # Safety
    /// Each part's `rows × stride` bytes from its first byte stay mapped and
    /// readable for `'a`. Other processes may write them meanwhile: rows
    /// are copied through raw pointers, never borrowed, so a row written
    /// during the copy may arrive half-written but nothing unsound happens.
    pub unsafe fn from_parts(parts: &[(*const u8, usize)], stride: usize) -> Result<Self> {
        if stride == 0 {
            return Err(Error::Common(CommonError::InvalidArgument("rows of 0 bytes".into())));
        }
        let mut first = Vec::with_capacity(parts.len() + 1);
        let mut at = 0usize;
        first.push(0);
        for &(_, n) in parts {
            at = at.checked_add(n).filter(|&a| a.checked_mul(stride).is_some()).ok_or_else(|| {
                Error::Common(CommonError::InvalidArgument(format!("parts of more than usize::MAX bytes (rows of {stride} bytes)")))
            })?;
            first.push(at);
        }
        Ok(Self { bases: parts.iter().map(|&(p, _)| SendPtr(p.cast_mut())).collect(), first, stride, _rows: PhantomData })
    }

    /// Rows in all parts.
    pub fn rows(&self) -> usize {
        *self.first.last().unwrap_or(&0)
    }

    /// Bytes from one row to the next.
    pub fn stride(&self) -> usize {
        self.stride
    }
}

/// A source with the layout's skip applied to every row.
struct Skipped<'s, 'a> {
    src: &'s RowSource<'a>,
    skip: usize,
}

impl RowAddr for Skipped<'_, '_> {
    #[inline]
    fn addr(&self, row: usize) -> *mut u8 {
        let s = self.src;
        let part = if s.bases.len() == 1 { 0 } else { s.first.partition_point(|&f| f <= row) - 1 };
        s.bases[part].get().wrapping_add((row - s.first[part]) * s.stride + self.skip)
    }
}

/// Copies (converting) the `layout` part of source row `rows[i]` into
/// output row `slots[i]` — or `i` without `slots` — of `out`, rows of
/// `layout.cols()` elements of `out_dtype`, split over `threads`. Where a
/// slot repeats, one of its rows wins.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the value: a layout that does not fit
/// the stride, a row past the source, an output of the wrong size, a slot
/// past it, or (when the copy is split over threads: `threads > 1` and
/// at least twice [`MIN_ROWS_PER_THREAD`](crate::MIN_ROWS_PER_THREAD) rows)
/// a slot repeated; [`Error::Conversion`] between float and int.
pub fn gather_from(
    src: &RowSource<'_>,
    layout: &RowLayout,
    rows: &[usize],
    slots: Option<&[usize]>,
    out: &mut [u8],
    out_dtype: DType,
    threads: usize,
) -> Result<()> {
    layout.check_fits(src.stride)?;
    let conv = RowConv::new(layout.dtype(), out_dtype, layout.cols())?;
    let db = conv.dst_bytes();
    if let Some((i, &r)) = rows.iter().enumerate().find(|&(_, &r)| r >= src.rows()) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "row {r} at position {i} is past the {} rows of the source",
            src.rows()
        ))));
    }
    match slots {
        None if out.len() != rows.len() * db => {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "the output has {} bytes; {} rows of {db} bytes need {}",
                out.len(),
                rows.len(),
                rows.len() * db
            ))));
        }
        None => {}
        Some(slots) => {
            if slots.len() != rows.len() || out.len() % db != 0 {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "{} slots for {} rows, into an output of {} bytes (rows of {db})",
                    slots.len(),
                    rows.len(),
                    out.len()
                ))));
            }
            let out_rows = out.len() / db;
            if let Some((i, &s)) = slots.iter().enumerate().find(|&(_, &s)| s >= out_rows) {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "slot {s} at position {i} is past the {out_rows} output rows"
                ))));
            }
            // Threads write slots at once: each must be written by one.
            // One thread (as the kernel splits the rows) writes a repeated
            // slot twice, in order, which is no race.
            if kernel::threads_for(rows.len(), threads) > 1 {
                let mut seen = vec![false; out_rows];
                for (i, &s) in slots.iter().enumerate() {
                    if std::mem::replace(&mut seen[s], true) {
                        return Err(Error::Common(CommonError::InvalidArgument(format!("slot {s} at position {i} is repeated"))));
                    }
                }
            }
        }
    }
    let skipped = Skipped { src, skip: layout.skip_bytes() };
    // SAFETY: every row is below the source's rows, whose bytes are
    // readable (the source's contract) for the stride, which holds the
    // layout; the output holds every (distinct) slot's row, or exactly the
    // rows; `out` is a private buffer, so it overlaps no source.
    unsafe { kernel::gather_rows(&skipped, rows, slots, conv, out, threads) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repeated-slot check and the kernel's split share one threshold:
    /// below twice `MIN_ROWS_PER_THREAD` rows one thread writes every slot, so a
    /// repeated one is accepted and the output is that of one thread; past
    /// it, threads would race on the slot, so it is refused. Distinct
    /// slots give one thread's output on either side.
    #[test]
    fn repeated_slots_are_refused_exactly_where_the_kernel_splits_the_rows() {
        let m = crate::MIN_ROWS_PER_THREAD;
        let (cols, src_rows) = (2usize, 16usize);
        let stride = cols * 4;
        let table: Vec<u32> = (0..src_rows * cols).map(|i| 7 * i as u32 + 1).collect();
        let src = RowSource::from_slice(bytemuck::cast_slice(&table), stride).unwrap();
        let layout = RowLayout::new(DType::I32, cols, 0).unwrap();
        let gather = |rows: &[usize], slots: &[usize], threads: usize| {
            let mut out = vec![0u8; rows.len() * stride];
            gather_from(&src, &layout, rows, Some(slots), &mut out, DType::I32, threads).map(|()| out)
        };
        for n in [m, 2 * m - 2, 2 * m - 1, 2 * m, 2 * m + 1] {
            let rows: Vec<usize> = (0..n).map(|i| (i * 5 + 3) % src_rows).collect();
            let distinct: Vec<usize> = (0..n).rev().collect();
            let one = gather(&rows, &distinct, 1).unwrap();
            for (i, (&r, &s)) in rows.iter().zip(&distinct).enumerate() {
                assert_eq!(
                    one[s * stride..][..stride],
                    *bytemuck::cast_slice::<u32, u8>(&table[r * cols..][..cols]),
                    "{n} rows: position {i}"
                );
            }
            let mut repeated = distinct.clone();
            repeated[n - 1] = repeated[0];
            let alone = gather(&rows, &repeated, 1).unwrap();
            for threads in [2, 4] {
                assert_eq!(gather(&rows, &distinct, threads).unwrap(), one, "{n} distinct slots on {threads} threads");
                match gather(&rows, &repeated, threads) {
                    Ok(out) if n < 2 * m => assert_eq!(out, alone, "{n} rows, a repeated slot, {threads} threads"),
                    Ok(_) => panic!("{n} rows on {threads} threads: a repeated slot was accepted from {} rows", 2 * m),
                    Err(e) if n >= 2 * m => {
                        assert!(e.to_string().contains(&format!("slot {} at position {} is repeated", n - 1, n - 1)), "{e}")
                    }
                    Err(e) => panic!("{n} rows on {threads} threads: a repeated slot was refused below {} rows: {e}", 2 * m),
                }
            }
        }
    }

    #[test]
    fn parts_slices_slots_and_conversions_match_a_plain_loop() {
        let (cols, rows_a, rows_b) = (3usize, 5usize, 4usize);
        let a: Vec<f32> = (0..rows_a * cols).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..rows_b * cols).map(|i| 1000.0 + i as f32).collect();
        let stride = cols * 4;
        // SAFETY: both vectors outlive the source.
        let src = unsafe { RowSource::from_parts(&[(a.as_ptr().cast(), rows_a), (b.as_ptr().cast(), rows_b)], stride) }.unwrap();
        assert_eq!(src.rows(), 9);
        let layout = RowLayout::new(DType::F32, 2, 1).unwrap();
        let rows = [8usize, 0, 5, 5, 4];
        let mut out = vec![0u8; rows.len() * 2 * 8];
        gather_from(&src, &layout, &rows, None, &mut out, DType::F64, 2).unwrap();
        let got: Vec<f64> = bytemuck::pod_collect_to_vec(&out);
        let all: Vec<f32> = a.iter().chain(&b).copied().collect();
        for (i, &r) in rows.iter().enumerate() {
            assert_eq!(got[i * 2..i * 2 + 2], [f64::from(all[r * cols + 1]), f64::from(all[r * cols + 2])], "row {r}");
        }
        // Slots: a permutation lands each row where it is told.
        let flat: Vec<u8> = bytemuck::cast_slice(&all).to_vec();
        let src = RowSource::from_slice(&flat, stride).unwrap();
        let whole = RowLayout::new(DType::F32, 3, 0).unwrap();
        let mut out = vec![0u8; 3 * stride];
        gather_from(&src, &whole, &[1, 7, 2], Some(&[2, 0, 1]), &mut out, DType::F32, 1).unwrap();
        assert_eq!(&out[2 * stride..], &flat[stride..2 * stride]);
        assert_eq!(&out[..stride], &flat[7 * stride..8 * stride]);
        // Bad input names the value.
        let e = gather_from(&src, &whole, &[9], None, &mut out[..stride], DType::F32, 1).unwrap_err();
        assert!(e.to_string().contains("row 9 at position 0"), "{e}");
        let n = 2 * crate::MIN_ROWS_PER_THREAD;
        let many: Vec<usize> = (0..n).map(|i| i % 9).collect();
        let mut slots: Vec<usize> = (0..n).collect();
        slots[n - 1] = 5;
        let mut big = vec![0u8; n * stride];
        let e = gather_from(&src, &whole, &many, Some(&slots), &mut big, DType::F32, 2).unwrap_err();
        assert!(e.to_string().contains(&format!("slot 5 at position {} is repeated", n - 1)), "{e}");
        // One thread: a repeated slot is no race; one of its rows wins.
        gather_from(&src, &whole, &many, Some(&slots), &mut big, DType::F32, 1).unwrap();
        let e = gather_from(&src, &whole, &[1], Some(&[3]), &mut out, DType::F32, 1).unwrap_err();
        assert!(e.to_string().contains("slot 3 at position 0 is past"), "{e}");
        let e = gather_from(&src, &whole, &[1], None, &mut out, DType::I32, 1).unwrap_err();
        assert!(matches!(e, Error::Conversion(_)), "{e}");
        assert!(RowSource::from_slice(&flat[..5], stride).is_err());
    }
}
