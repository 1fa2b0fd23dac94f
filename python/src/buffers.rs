//! numpy arrays (and anything numpy can view without a copy: DLPack
//! producers, CPU torch tensors, the buffer protocol) as bytes.

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use wholemem::DType;

use crate::errors::value;

/// An element type as Python sees it: numpy's names, with `uint8` and
/// `bool` stored as wholemem's 8-bit integers (the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// `float16`.
    F16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint8` (stored as `I8`).
    U8,
    /// `bool` (stored as `I8`).
    Bool,
}

impl Elem {
    /// Every element type, for messages.
    pub const NAMES: &'static str = "float16, float32, float64, int8, int16, int32, int64, uint8, bool";

    /// From numpy's dtype name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "float16" => Self::F16,
            "float32" => Self::F32,
            "float64" => Self::F64,
            "int8" => Self::I8,
            "int16" => Self::I16,
            "int32" => Self::I32,
            "int64" => Self::I64,
            "uint8" => Self::U8,
            "bool" => Self::Bool,
            _ => return None,
        })
    }

    /// numpy's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::Bool => "bool",
        }
    }

    /// The element type wholemem stores.
    pub fn core(self) -> DType {
        match self {
            Self::F16 => DType::F16,
            Self::F32 => DType::F32,
            Self::F64 => DType::F64,
            Self::I8 | Self::U8 | Self::Bool => DType::I8,
            Self::I16 => DType::I16,
            Self::I32 => DType::I32,
            Self::I64 => DType::I64,
        }
    }

    /// From the element type wholemem stores (tables joined from outside).
    pub fn from_core(d: DType) -> Option<Self> {
        Some(match d {
            DType::F16 => Self::F16,
            DType::F32 => Self::F32,
            DType::F64 => Self::F64,
            DType::I8 => Self::I8,
            DType::I16 => Self::I16,
            DType::I32 => Self::I32,
            DType::I64 => Self::I64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.core().size()
    }

    /// The element type of `out` when rows of `self` are converted into it:
    /// the same type, or float ↔ float and signed int ↔ signed int as
    /// gather converts; `uint8` and `bool` only to themselves.
    pub fn convert_to(self, out: Elem) -> PyResult<DType> {
        if self == out {
            return Ok(self.core());
        }
        let narrow = |e: Elem| matches!(e, Elem::U8 | Elem::Bool);
        if narrow(self) || narrow(out) || self.core().is_float() != out.core().is_float() {
            return Err(value(format!("cannot convert rows of {} into an output of {}", self.name(), out.name())));
        }
        Ok(out.core())
    }
}

/// The `numpy` module.
pub fn numpy(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("numpy")
}

/// The element type named by a numpy dtype, a dtype-like (`"float32"`,
/// `np.float32`) or a torch dtype (`torch.float32`).
pub fn elem_of(dtype: &Bound<'_, PyAny>) -> PyResult<Elem> {
    let py = dtype.py();
    let text = dtype.str()?.to_string();
    let torch_name = text.strip_prefix("torch.").map(str::to_owned);
    let name: String = match torch_name {
        Some(n) => n,
        None => {
            numpy(py)?.getattr("dtype")?.call1((dtype,)).map_err(|e| value(format!("dtype {text}: {e}")))?.getattr("name")?.extract()?
        }
    };
    Elem::from_name(&name).ok_or_else(|| value(format!("dtype {name} is not supported; use one of {}", Elem::NAMES)))
}

/// `obj` as a numpy array without copying: arrays as they are, CPU torch
/// tensors through `.numpy()`, DLPack producers through `np.from_dlpack`,
/// the buffer protocol through `np.asarray`.
pub fn as_array<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Ok(a.clone());
    }
    let py = obj.py();
    let np = numpy(py)?;
    let arr = if obj.hasattr("__dlpack__")? {
        // A CPU torch tensor shares its memory through `.numpy()`, writable.
        let via_numpy = if obj.hasattr("numpy")? && obj.hasattr("is_cuda")? { obj.call_method0("numpy").ok() } else { None };
        match via_numpy {
            Some(a) => a,
            None => np.getattr("from_dlpack")?.call1((obj,)).map_err(|e| value(format!("{what}: np.from_dlpack failed: {e}")))?,
        }
    } else {
        np.getattr("asarray")?.call1((obj,)).map_err(|e| value(format!("{what}: not an array: {e}")))?
    };
    arr.cast_into::<PyUntypedArray>().map_err(|_| value(format!("{what} is not an array")))
}

/// The element type of a dtype in native byte order, from its kind and
/// size (no string made: this runs on every call).
fn elem_of_descr(d: &Bound<'_, PyArrayDescr>) -> Option<Elem> {
    if d.is_native_byteorder() == Some(false) {
        return None;
    }
    Some(match (d.kind(), d.itemsize()) {
        (b'f', 2) => Elem::F16,
        (b'f', 4) => Elem::F32,
        (b'f', 8) => Elem::F64,
        (b'i', 1) => Elem::I8,
        (b'i', 2) => Elem::I16,
        (b'i', 4) => Elem::I32,
        (b'i', 8) => Elem::I64,
        (b'u', 1) => Elem::U8,
        (b'b', 1) => Elem::Bool,
        _ => return None,
    })
}

/// The element type of an array.
pub fn array_elem(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Elem> {
    let d = a.dtype();
    elem_of_descr(&d).ok_or_else(|| {
        let name = d.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into());
        value(format!("{what} has dtype {name}, which is not supported; use one of {} (native byte order)", Elem::NAMES))
    })
}

/// Fails unless `a` is writable. Collective calls check this with their
/// other arguments, before the call, so a read-only output on one rank
/// still takes part.
pub fn writable(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<()> {
    if !a.getattr("flags")?.getattr("writeable")?.extract::<bool>()? {
        return Err(read_only(what));
    }
    Ok(())
}

fn read_only(what: &str) -> PyErr {
    value(format!("{what} is read-only; pass a writable array"))
}

/// A borrow of an array that numpy refuses, as an error naming it.
fn borrow_error(what: &str, e: numpy::BorrowError) -> PyErr {
    match e {
        numpy::BorrowError::NotWriteable => read_only(what),
        e => value(format!("{what}: {e}")),
    }
}

fn contiguity(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<()> {
    if !a.is_c_contiguous() {
        return Err(value(format!(
            "{what} is not C-contiguous (shape {:?}, strides {:?}); pass np.ascontiguousarray(...)",
            a.shape(),
            a.strides()
        )));
    }
    Ok(())
}

macro_rules! each_elem {
    ($a:expr, $elem:expr, |$t:ident| $body:expr) => {
        match $elem {
            Elem::F16 => {
                type $t = half::f16;
                $body
            }
            Elem::F32 => {
                type $t = f32;
                $body
            }
            Elem::F64 => {
                type $t = f64;
                $body
            }
            Elem::I8 => {
                type $t = i8;
                $body
            }
            Elem::I16 => {
                type $t = i16;
                $body
            }
            Elem::I32 => {
                type $t = i32;
                $body
            }
            Elem::I64 => {
                type $t = i64;
                $body
            }
            Elem::U8 => {
                type $t = u8;
                $body
            }
            Elem::Bool => unreachable!("bool arrays are handled apart"),
        }
    };
}

/// Calls `f` with the bytes of a C-contiguous array, read-only.
pub fn with_bytes<R>(a: &Bound<'_, PyUntypedArray>, what: &str, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    contiguity(a, what)?;
    let elem = array_elem(a, what)?;
    if elem == Elem::Bool {
        let arr = a.cast::<PyArrayDyn<bool>>()?;
        let ro = arr.try_readonly().map_err(|e| value(format!("{what}: {e}")))?;
        let s = ro.as_slice().map_err(|e| value(format!("{what}: {e}")))?;
        return f(bytemuck::cast_slice::<bool, u8>(s));
    }
    each_elem!(a, elem, |T| {
        let arr = a.cast::<PyArrayDyn<T>>()?;
        let ro = arr.try_readonly().map_err(|e| value(format!("{what}: {e}")))?;
        let s = ro.as_slice().map_err(|e| value(format!("{what}: {e}")))?;
        f(bytemuck::cast_slice::<T, u8>(s))
    })
}

/// Calls `f` with the bytes of a C-contiguous, writable array. A `bool`
/// array is filled through a staging buffer and every byte read as
/// `!= 0`, so no invalid `bool` can be written.
pub fn with_bytes_mut<R>(a: &Bound<'_, PyUntypedArray>, what: &str, f: impl FnOnce(&mut [u8]) -> PyResult<R>) -> PyResult<R> {
    contiguity(a, what)?;
    let elem = array_elem(a, what)?;
    // numpy's borrow refuses a read-only array (`borrow_error` says so).
    if elem == Elem::Bool {
        let arr = a.cast::<PyArrayDyn<bool>>()?;
        let mut rw = arr.try_readwrite().map_err(|e| borrow_error(what, e))?;
        let s = rw.as_slice_mut().map_err(|e| value(format!("{what}: {e}")))?;
        let mut staging = vec![0u8; s.len()];
        let r = f(&mut staging)?;
        for (o, b) in s.iter_mut().zip(staging) {
            *o = b != 0;
        }
        return Ok(r);
    }
    each_elem!(a, elem, |T| {
        let arr = a.cast::<PyArrayDyn<T>>()?;
        let mut rw = arr.try_readwrite().map_err(|e| borrow_error(what, e))?;
        let s = rw.as_slice_mut().map_err(|e| value(format!("{what}: {e}")))?;
        f(bytemuck::cast_slice_mut::<T, u8>(s))
    })
}

/// Row ids: a 1-D array of int32 or int64 as it is, any other integer
/// array converted to int64.
pub enum IdArray<'py> {
    /// 32-bit ids.
    I32(Bound<'py, PyArrayDyn<i32>>),
    /// 64-bit ids.
    I64(Bound<'py, PyArrayDyn<i64>>),
}

impl<'py> IdArray<'py> {
    /// From any array-like of integers.
    pub fn new(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        let mut a = as_array(obj, "ids")?;
        if a.ndim() != 1 {
            return Err(value(format!("ids must be one-dimensional; got shape {:?}", a.shape())));
        }
        let d = a.dtype();
        let (kind, size) = (d.kind(), d.itemsize());
        // An empty list arrives as float64: no ids, nothing to convert badly.
        if !(kind == b'i' || kind == b'u' || (a.len() == 0 && kind == b'f')) {
            return Err(value(format!("ids must be integers; got dtype {}", d.str()?)));
        }
        let native = d.is_native_byteorder() != Some(false);
        if !(kind == b'i' && (size == 4 || size == 8) && native) || !a.is_c_contiguous() {
            let np = numpy(obj.py())?;
            if kind == b'u' && size == 8 {
                // Ids past i64::MAX are out of range anyway; say so rather than wrap.
                let too_big: bool = np.getattr("any")?.call1((a.call_method1("__gt__", (i64::MAX as u64,))?,))?.extract()?;
                if too_big {
                    return Err(crate::errors::raise(crate::errors::Kind::Index, "an id is larger than 2^63-1".to_string()));
                }
            }
            a = np.getattr("ascontiguousarray")?.call1((a, "int64"))?.cast_into::<PyUntypedArray>()?;
        }
        Ok(if a.dtype().itemsize() == 4 { Self::I32(a.cast_into()?) } else { Self::I64(a.cast_into()?) })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            Self::I32(a) => a.len(),
            Self::I64(a) => a.len(),
        }
    }

    /// Calls `f` with the ids.
    pub fn with<R>(&self, f: impl FnOnce(wm_gather::Ids<'_>) -> PyResult<R>) -> PyResult<R> {
        match self {
            Self::I32(a) => {
                let ro = a.try_readonly().map_err(|e| value(format!("ids: {e}")))?;
                f(wm_gather::Ids::I32(ro.as_slice().map_err(|e| value(format!("ids: {e}")))?))
            }
            Self::I64(a) => {
                let ro = a.try_readonly().map_err(|e| value(format!("ids: {e}")))?;
                f(wm_gather::Ids::I64(ro.as_slice().map_err(|e| value(format!("ids: {e}")))?))
            }
        }
    }
}
