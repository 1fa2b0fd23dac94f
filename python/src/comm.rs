//! `Comm`: the job's communicator, from a `wm-run` launch, an mpi4py
//! communicator, or a directory rendezvous with rank and size given.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use wm_comm::{Communicator, JobKey, Rendezvous, SocketComm};

use crate::errors::{IntoPy, value};

/// The job's communicator: which rank this process is, how many there are,
/// and the connections every collective call (allocation, gather, scatter)
/// goes through.
#[pyclass(module = "wholemem._wholemem", name = "Comm", frozen)]
pub struct Comm {
    pub(crate) inner: Arc<dyn Communicator>,
}

fn timeout(secs: Option<f64>) -> PyResult<Duration> {
    match secs {
        Some(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(value(format!("timeout {s} is not a positive number of seconds"))),
        None => wm_topology::env::timeout().map_err(value),
    }
}

#[pymethods]
impl Comm {
    /// The world communicator from the environment of a `wm-run` launch
    /// (`WM_RANK`, `WM_WORLD_SIZE`, `WM_RENDEZVOUS`; Slurm and PMI
    /// variables too). A process started alone is a job of one rank.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        let inner = py.detach(wm_comm::init).py()?;
        Ok(Self { inner })
    }

    /// Rank `rank` of `size`, meeting the others in the shared directory
    /// `path` (which also receives the job's key, `job.key`, when none is
    /// set in `WM_JOB_KEY`). Every rank passes the same path and size.
    #[staticmethod]
    #[pyo3(signature = (path, rank, size, timeout=None))]
    fn from_dir(py: Python<'_>, path: &str, rank: usize, size: usize, timeout: Option<f64>) -> PyResult<Self> {
        if size == 0 || rank >= size {
            return Err(value(format!("rank {rank} is not below size {size}")));
        }
        let t = self::timeout(timeout)?;
        let how = Rendezvous::parse(&format!("dir:{path}")).py()?;
        if size == 1 {
            // A job of one never meets; its key still goes where outside readers look.
            how.job_key().py()?;
        }
        let c = py.detach(|| SocketComm::bootstrap(rank, size, Some(&how), None, t)).py()?;
        Ok(Self { inner: Arc::new(c) })
    }

    /// The members of an mpi4py communicator as a wholemem job: rank and
    /// size are the communicator's, and the ranks meet through its
    /// `allgather` (rank 0 draws the job's key and broadcasts it, unless
    /// `WM_JOB_KEY` is set). Collective over `comm`. The rows then move
    /// over wholemem's own connections, not through MPI.
    #[staticmethod]
    #[pyo3(signature = (comm, timeout=None))]
    fn from_mpi4py(py: Python<'_>, comm: Py<PyAny>, timeout: Option<f64>) -> PyResult<Self> {
        let c = comm.bind(py);
        let rank: usize = c.call_method0("Get_rank")?.extract()?;
        let size: usize = c.call_method0("Get_size")?.extract()?;
        let t = self::timeout(timeout)?;
        let key = match JobKey::from_env().py()? {
            Some(k) => k,
            None => {
                let mine = if rank == 0 { Some(JobKey::generate().py()?.to_hex()) } else { None };
                let hex: String = c.call_method1("bcast", (mine, 0))?.extract()?;
                JobKey::from_hex(&hex, "the key broadcast by rank 0").py()?
            }
        };
        let inner = py
            .detach(|| {
                let mut exchange = |mine: &[u8]| -> wm_comm::Result<Vec<Vec<u8>>> {
                    Python::attach(|py| {
                        let all = comm.bind(py).call_method1("allgather", (PyBytes::new(py, mine),))?;
                        all.cast_into::<PyList>()?.iter().map(|b| b.extract::<Vec<u8>>()).collect::<PyResult<Vec<_>>>()
                    })
                    .map_err(|e| wm_comm::Error::Bootstrap(format!("the mpi4py allgather failed: {e}")))
                };
                SocketComm::bootstrap_with(rank, size, t, &key, &mut exchange)
            })
            .py()?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Waits for every rank. Collective.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.barrier()).py()
    }

    /// Every rank's `data`, in rank order. Collective.
    fn allgather_bytes<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let all = py.detach(|| self.inner.allgatherv(&data)).py()?;
        Ok(all.iter().map(|v| PyBytes::new(py, v)).collect())
    }

    fn __repr__(&self) -> String {
        format!("Comm(rank={}, size={})", self.inner.rank(), self.inner.size())
    }
}
