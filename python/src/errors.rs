//! Rust errors as Python exceptions that keep the Rust message.
//!
//! Every exception raised by the extension derives from `WholememError`;
//! the kinds a caller acts on also derive from the matching built-in class,
//! so `except ValueError` and `except WholememError` both catch a bad
//! argument.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    wholemem,
    WholememError,
    PyException,
    "Base class of every error raised by wholemem; the message is the Rust library's."
);

/// What kind of failure an error is, for choosing its Python class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bad argument: shapes, types, names (`ValueError`).
    Value,
    /// A row id out of range (`IndexError`).
    Index,
    /// A wait that ran past its limit (`TimeoutError`).
    Timeout,
    /// The job's key was refused (`PermissionError`).
    Permission,
    /// Not possible in this build or on this machine (`NotImplementedError`).
    Unsupported,
    /// A rank of the job was lost (`ConnectionError`).
    PeerLost,
    /// The table was freed or its job ended.
    Gone,
    /// Everything else (`WholememError` itself).
    Other,
}

/// (class name, built-in base, docstring) of each kind with a class of its own.
const CLASSES: [(Kind, &str, &str, &str); 6] = [
    (Kind::Value, "InvalidArgumentError", "ValueError", "A bad argument: a shape, dtype, name or buffer that does not fit."),
    (Kind::Index, "IndexOutOfRangeError", "IndexError", "A row id that is negative or past the end of the table."),
    (Kind::Timeout, "WaitTimeoutError", "TimeoutError", "A wait (peers, a rendezvous, a join) that ran past its limit."),
    (Kind::Permission, "RefusedError", "PermissionError", "A server or catalogue refused this process: it lacks the job's key."),
    (Kind::Unsupported, "UnsupportedError", "NotImplementedError", "Not possible in this build or on this machine; the message says why."),
    (Kind::PeerLost, "PeerLostError", "ConnectionError", "A rank of the job was lost; every later collective call fails too."),
];

static TYPES: PyOnceLock<Vec<(Kind, Py<PyType>)>> = PyOnceLock::new();
static GONE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn make_class(py: Python<'_>, name: &str, bases: Bound<'_, PyTuple>, doc: &str) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "wholemem")?;
    ns.set_item("__doc__", doc)?;
    let ty = py.import("builtins")?.getattr("type")?.call1((name, bases, ns))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

/// Creates the exception classes and adds them to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("WholememError", py.get_type::<WholememError>())?;
    let builtins = py.import("builtins")?;
    let mut made = Vec::new();
    for (kind, name, base, doc) in CLASSES {
        let bases = PyTuple::new(py, [py.get_type::<WholememError>().into_any(), builtins.getattr(base)?])?;
        let ty = make_class(py, name, bases, doc)?;
        m.add(name, ty.bind(py))?;
        made.push((kind, ty));
    }
    let gone = make_class(
        py,
        "GoneError",
        PyTuple::new(py, [py.get_type::<WholememError>()])?,
        "The table was freed, or the job serving it ended.",
    )?;
    m.add("GoneError", gone.bind(py))?;
    let _ = TYPES.set(py, made);
    let _ = GONE.set(py, gone);
    Ok(())
}

/// A Python exception of `kind` carrying `msg`.
pub fn raise(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| {
        let ty = match kind {
            Kind::Other => None,
            Kind::Gone => GONE.get(py).map(|t| t.bind(py).clone()),
            k => TYPES.get(py).and_then(|v| v.iter().find(|(kk, _)| *kk == k)).map(|(_, t)| t.bind(py).clone()),
        };
        match ty {
            Some(ty) => PyErr::from_type(ty, msg),
            None => WholememError::new_err(msg),
        }
    })
}

/// A `ValueError` (and `WholememError`) naming the bad value.
pub fn value(msg: impl Into<String>) -> PyErr {
    raise(Kind::Value, msg)
}

/// Errors of the wholemem crates, classified.
pub trait Classify: std::fmt::Display {
    /// The Python class this error becomes.
    fn kind(&self) -> Kind;
}

impl Classify for wm_comm::Error {
    fn kind(&self) -> Kind {
        use wm_comm::Error as E;
        match self {
            E::PeerLost { .. } => Kind::PeerLost,
            E::Timeout { .. } => Kind::Timeout,
            E::InvalidArgument(_) | E::Mismatch { .. } => Kind::Value,
            E::Unsupported { .. } => Kind::Unsupported,
            _ => Kind::Other,
        }
    }
}

impl Classify for wholemem::CommonError {
    fn kind(&self) -> Kind {
        use wholemem::CommonError as E;
        match self {
            E::InvalidArgument(_) => Kind::Value,
            E::Timeout { .. } => Kind::Timeout,
            _ => Kind::Other,
        }
    }
}

impl Classify for wholemem::Error {
    fn kind(&self) -> Kind {
        use wholemem::Error as E;
        match self {
            E::SizeOverflow { .. } | E::Shards { .. } => Kind::Value,
            E::IndexOutOfRange { .. } => Kind::Index,
            E::Common(e) => e.kind(),
            E::Unsupported { .. } => Kind::Unsupported,
            E::Comm(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

impl Classify for wm_gather::Error {
    fn kind(&self) -> Kind {
        use wm_gather::Error as E;
        match self {
            E::IndexOutOfRange { .. } => Kind::Index,
            E::Conversion(_) => Kind::Value,
            E::Common(e) => e.kind(),
            E::Memory(e) => e.kind(),
            E::Comm(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

impl Classify for wm_onesided::Error {
    fn kind(&self) -> Kind {
        use wm_onesided::Error as E;
        match self {
            E::IndexOutOfRange { .. } => Kind::Index,
            E::Common(e) => e.kind(),
            E::Unsupported { .. } => Kind::Unsupported,
            E::Gone { .. } => Kind::Gone,
            E::NotPublished { .. } => Kind::Timeout,
            E::Refused { .. } => Kind::Permission,
            E::Gather(e) => e.kind(),
            E::Memory(e) => e.kind(),
            E::Comm(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

/// `Result` of a wholemem crate into a `PyResult`.
pub trait IntoPy<T> {
    /// Converts the error, keeping its message.
    fn py(self) -> PyResult<T>;
}

impl<T, E: Classify> IntoPy<T> for Result<T, E> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| raise(e.kind(), e.to_string()))
    }
}
