//! The Python face of wholemem (`wholemem._wholemem`): communicators,
//! tables of the four memory types, gather and scatter into and out of
//! numpy, one-sided reads, and the machine's capabilities. The Python
//! package `wholemem` re-exports it and adds `wholemem.pyddstore`.
//!
//! Every call that waits (on peers, the network, a rendezvous) releases
//! the GIL; every error becomes an exception deriving from `WholememError`
//! that keeps the Rust message.

mod buffers;
mod comm;
mod embedding;
mod errors;
mod graph;
mod onesided;
mod table;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use wholemem::{Location, MemoryType, Support};

use crate::errors::IntoPy;

/// What this machine and job can do: the rank and size, the nodes, whether
/// CUDA is usable and why not, which memory type × location the job can
/// allocate (with the reason where it cannot), and the one-sided methods
/// this build has.
#[pyfunction]
#[pyo3(signature = (comm=None))]
fn probe<'py>(py: Python<'py>, comm: Option<&comm::Comm>) -> PyResult<Bound<'py, PyDict>> {
    let own;
    let c: &dyn wm_comm::Communicator = match comm {
        Some(c) => c.inner.as_ref(),
        None => {
            let t = wm_topology::env::timeout().map_err(errors::value)?;
            own = py.detach(|| wm_comm::SocketComm::bootstrap(0, 1, None, None, t)).py()?;
            &own
        }
    };
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("rank", c.rank())?;
    d.set_item("size", c.size())?;
    d.set_item("nodes", c.nodes().iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    let cuda = PyDict::new(py);
    match wholemem::device::status() {
        Ok(gpus) => {
            cuda.set_item("available", true)?;
            cuda.set_item("gpus", gpus)?;
        }
        Err(why) => {
            cuda.set_item("available", false)?;
            cuda.set_item("reason", why)?;
        }
    }
    d.set_item("cuda", cuda)?;
    let support = PyDict::new(py);
    for ty in MemoryType::ALL {
        for loc in Location::ALL {
            let v: Option<String> = match wholemem::query(c, ty, loc) {
                Support::Supported => None,
                Support::Unsupported { reason } => Some(reason),
            };
            let entry = PyDict::new(py);
            entry.set_item("supported", v.is_none())?;
            if let Some(r) = v {
                entry.set_item("reason", r)?;
            }
            support.set_item(format!("{}/{}", ty.name(), loc.name()), entry)?;
        }
    }
    d.set_item("support", support)?;
    let methods = PyDict::new(py);
    for m in wm_onesided::Method::ALL {
        let entry = PyDict::new(py);
        match wm_onesided::available(m) {
            Ok(()) => entry.set_item("available", true)?,
            Err(why) => {
                entry.set_item("available", false)?;
                entry.set_item("reason", why)?;
            }
        }
        methods.set_item(m.name(), entry)?;
    }
    d.set_item("onesided", methods)?;
    Ok(d)
}

/// Starts recording where the time of this thread's gathers and scatters
/// goes, phase by phase (`wm_gather::profile`); `profile_take` returns it.
#[pyfunction]
fn profile_record() {
    wm_gather::profile::record();
}

/// What was recorded since `profile_record` on this thread, and stops
/// recording: `{"calls": n, "phases": {name: seconds, ...}}` with the
/// phases in the order they first ran (see `wm_gather::profile` for their
/// meaning); zero calls when nothing was recorded.
#[pyfunction]
fn profile_take<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let p = wm_gather::profile::take();
    let d = PyDict::new(py);
    d.set_item("calls", p.calls)?;
    let phases = PyDict::new(py);
    for (name, t) in &p.phases {
        phases.set_item(*name, t.as_secs_f64())?;
    }
    d.set_item("phases", phases)?;
    Ok(d)
}

#[pymodule]
fn _wholemem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<comm::Comm>()?;
    m.add_class::<table::Table>()?;
    m.add_class::<table::LocalView>()?;
    m.add_class::<embedding::Embedding>()?;
    m.add_class::<graph::Graph>()?;
    m.add_class::<onesided::OneSided>()?;
    m.add_class::<onesided::Reader>()?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_function(wrap_pyfunction!(profile_record, m)?)?;
    m.add_function(wrap_pyfunction!(profile_take, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
