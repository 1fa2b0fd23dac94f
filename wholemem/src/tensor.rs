//! Typed tables over a WholeMemory handle.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use wm_comm::Communicator;

use crate::CommonError;
use crate::handle::{AllocRequest, WholeMemory};
use crate::types::{Location, MemoryType};
use crate::{Error, Result};

/// Most dimensions a descriptor holds.
pub const MAX_DIMS: usize = 8;

/// The shape of a tensor: sizes and strides in elements, and the element
/// offset of its first entry in the storage. Dimension 0 is the row
/// dimension, the one partitioned across ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    sizes: Vec<usize>,
    strides: Vec<usize>,
    storage_offset: usize,
}

impl TensorDesc {
    /// A descriptor from its parts.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] naming the problem: no dimensions or more
    /// than [`MAX_DIMS`], sizes and strides of different lengths, or inner
    /// dimensions that do not fit within one row's stride.
    pub fn new(sizes: &[usize], strides: &[usize], storage_offset: usize) -> Result<Self> {
        if sizes.is_empty() || sizes.len() > MAX_DIMS {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a tensor has 1 to {MAX_DIMS} dimensions, not {}",
                sizes.len()
            ))));
        }
        if sizes.len() != strides.len() {
            return Err(Error::Common(CommonError::InvalidArgument(format!("{} sizes but {} strides", sizes.len(), strides.len()))));
        }
        // The span of one row, checked: the accessors below may then
        // compute it plainly.
        let extent =
            sizes[1..].iter().zip(&strides[1..]).try_fold(1usize, |a, (&s, &st)| s.saturating_sub(1).checked_mul(st)?.checked_add(a));
        if extent.is_none() {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "one row of sizes {sizes:?} and strides {strides:?} spans more than usize::MAX elements"
            ))));
        }
        let d = Self { sizes: sizes.to_vec(), strides: strides.to_vec(), storage_offset };
        if sizes[1..].iter().all(|&s| s > 0) && d.row_extent() > d.row_stride() {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "one row spans {} elements but the row stride is {} (sizes {sizes:?}, strides {strides:?})",
                d.row_extent(),
                d.row_stride()
            ))));
        }
        Ok(d)
    }

    /// A dense `rows × cols` matrix.
    pub fn matrix(rows: usize, cols: usize) -> Self {
        Self { sizes: vec![rows, cols], strides: vec![cols, 1], storage_offset: 0 }
    }

    /// A `rows × cols` matrix whose rows are `stride >= cols` elements apart.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when `stride < cols`.
    pub fn matrix_with_stride(rows: usize, cols: usize, stride: usize) -> Result<Self> {
        Self::new(&[rows, cols], &[stride, 1], 0)
    }

    /// Sizes per dimension.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Strides per dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the first entry.
    pub fn storage_offset(&self) -> usize {
        self.storage_offset
    }

    /// Number of dimensions.
    pub fn dims(&self) -> usize {
        self.sizes.len()
    }

    /// Rows (size of dimension 0).
    pub fn rows(&self) -> usize {
        self.sizes[0]
    }

    /// Elements from one row to the next.
    pub fn row_stride(&self) -> usize {
        if self.dims() == 1 { self.strides[0].max(1) } else { self.strides[0] }
    }

    /// Elements one row's entries span (from its first entry to its last,
    /// inclusive).
    pub fn row_extent(&self) -> usize {
        1 + self.sizes[1..].iter().zip(&self.strides[1..]).map(|(&s, &st)| s.saturating_sub(1) * st).sum::<usize>()
    }
}

/// A typed table of `T` over a [`WholeMemory`] handle: rows partitioned
/// across ranks, each row `row_stride` elements of storage.
#[derive(Debug)]
pub struct WholeTensor<T: Pod> {
    mem: WholeMemory,
    desc: TensorDesc,
    _t: PhantomData<T>,
}

impl<T: Pod> WholeTensor<T> {
    /// Allocates collectively a tensor of shape `desc` (its storage offset
    /// must be 0), with rows per rank from `partition` or the default split.
    ///
    /// # Errors
    /// As [`WholeMemory::allocate`]; [`crate::CommonError::InvalidArgument`] for a
    /// zero-sized `T` or a non-zero storage offset.
    pub fn allocate(
        comm: &Arc<dyn Communicator>,
        ty: MemoryType,
        loc: Location,
        desc: TensorDesc,
        partition: Option<&[usize]>,
    ) -> Result<Self> {
        let elem = std::mem::size_of::<T>();
        if elem == 0 {
            return Err(Error::Common(CommonError::InvalidArgument("a zero-sized element type".into())));
        }
        if desc.storage_offset != 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a new tensor starts at offset 0, not {}",
                desc.storage_offset
            ))));
        }
        let (rows, stride) = (desc.rows(), desc.row_stride());
        let sizes = stride.checked_mul(elem).and_then(|g| Some((g, rows.checked_mul(g)?)));
        let Some((granularity, total)) = sizes else {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{rows} rows of {stride} elements of {elem} bytes are more than usize::MAX bytes"
            ))));
        };
        let req = AllocRequest { ty, loc, total, granularity, partition: partition.map(<[usize]>::to_vec) };
        let mem = WholeMemory::allocate(comm, &req)?;
        Ok(Self { mem, desc, _t: PhantomData })
    }

    /// Allocates a dense `rows × cols` matrix.
    ///
    /// # Errors
    /// As [`WholeTensor::allocate`].
    pub fn matrix(
        comm: &Arc<dyn Communicator>,
        ty: MemoryType,
        loc: Location,
        rows: usize,
        cols: usize,
        partition: Option<&[usize]>,
    ) -> Result<Self> {
        Self::allocate(comm, ty, loc, TensorDesc::matrix(rows, cols), partition)
    }

    /// The shape.
    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    /// The handle underneath.
    pub fn memory(&self) -> &WholeMemory {
        &self.mem
    }

    /// The handle underneath, for operations that write the table.
    pub fn memory_mut(&mut self) -> &mut WholeMemory {
        &mut self.mem
    }

    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.desc.rows()
    }

    /// Elements of storage per row.
    pub fn row_stride(&self) -> usize {
        self.desc.row_stride()
    }

    /// The rows this rank owns.
    pub fn local_rows(&self) -> Range<usize> {
        self.mem.local_rows()
    }

    /// This rank's rows, `row_stride` elements each, borrowed in place.
    /// Prefer [`read_local`](Self::read_local), which copies.
    ///
    /// # Safety
    /// As [`WholeMemory::local_bytes`]: no process writes these rows while
    /// the slice lives.
    ///
    /// # Panics
    /// For device memory.
    pub unsafe fn local(&self) -> &[T] {
        // SAFETY: forwarded from the caller.
        bytemuck::cast_slice(unsafe { self.mem.local_bytes() })
    }

    /// This rank's rows, writable in place. Prefer
    /// [`write_local`](Self::write_local), which copies.
    ///
    /// # Safety
    /// As [`WholeMemory::local_bytes_mut`]: no other process reads or
    /// writes these rows while the slice lives.
    ///
    /// # Panics
    /// For device memory.
    pub unsafe fn local_mut(&mut self) -> &mut [T] {
        // SAFETY: forwarded from the caller.
        bytemuck::cast_slice_mut(unsafe { self.mem.local_bytes_mut() })
    }

    /// Copies this rank's rows (`local_rows().len() × row_stride`
    /// elements) into `out`. Safe for every memory type and location.
    ///
    /// # Errors
    /// As [`WholeMemory::read_local`].
    pub fn read_local(&self, out: &mut [T]) -> Result<()> {
        self.mem.read_local(bytemuck::cast_slice_mut(out))
    }

    /// Copies `src` (`local_rows().len() × row_stride` elements) over this
    /// rank's rows. Safe for every memory type and location.
    ///
    /// # Errors
    /// As [`WholeMemory::write_local`].
    pub fn write_local(&mut self, src: &[T]) -> Result<()> {
        self.mem.write_local(bytemuck::cast_slice(src))
    }

    /// Copies global row `row` (`row_stride` elements) into `out`.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`]; [`crate::CommonError::InvalidArgument`] when `out` is
    /// not one row long; [`Error::Unsupported`] for a row this rank does not
    /// map.
    pub fn read_row(&self, row: usize, out: &mut [T]) -> Result<()> {
        self.check_len(out.len())?;
        self.mem.read_rows(row, bytemuck::cast_slice_mut(out))
    }

    /// Copies `src` (`row_stride` elements) into global row `row`.
    ///
    /// # Errors
    /// As [`read_row`](Self::read_row).
    pub fn write_row(&mut self, row: usize, src: &[T]) -> Result<()> {
        self.check_len(src.len())?;
        self.mem.write_rows(row, bytemuck::cast_slice(src))
    }

    fn check_len(&self, n: usize) -> Result<()> {
        if n != self.row_stride() {
            return Err(Error::Common(CommonError::InvalidArgument(format!("a row has {} elements, the buffer {n}", self.row_stride()))));
        }
        Ok(())
    }

    /// Frees the table collectively.
    ///
    /// # Errors
    /// As [`WholeMemory::free`].
    pub fn free(self) -> Result<()> {
        self.mem.free()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_check_their_shape() {
        let d = TensorDesc::matrix(10, 7);
        assert_eq!((d.rows(), d.row_stride(), d.row_extent()), (10, 7, 7));
        let d = TensorDesc::matrix_with_stride(10, 7, 8).unwrap();
        assert_eq!(d.row_stride(), 8);
        assert!(TensorDesc::matrix_with_stride(10, 7, 6).unwrap_err().to_string().contains("stride is 6"));
        let d = TensorDesc::new(&[4, 2, 3], &[6, 3, 1], 0).unwrap();
        assert_eq!(d.row_extent(), 6);
        assert!(TensorDesc::new(&[1; 9], &[1; 9], 0).unwrap_err().to_string().contains("not 9"));
        assert!(TensorDesc::new(&[2, 2], &[2], 0).is_err());
        // A row span past usize::MAX is an error, not a wrapped value.
        let e = TensorDesc::new(&[2, 3, usize::MAX], &[usize::MAX, usize::MAX, 1], 0).unwrap_err();
        assert!(e.to_string().contains("more than usize::MAX elements"), "{e}");
    }
}
