"""A drop-in for PyDDStore, over wholemem.

Every rank contributes a shard of each named variable; the global row space
is the shards concatenated in rank order. Reads:

* ``method=0`` — ``get_batch`` is collective: every rank calls it the same
  number of times, and the rows move through wholemem's exchange (the
  distributed gather). ``get`` reads one-sidedly.
* ``method=1`` / ``method=2`` — ``get`` and ``get_batch`` read one-sidedly:
  any rank, alone, at any time (shared memory on a node, the owners' read
  servers across nodes, libfabric where the build and a provider allow).

A job is made from an mpi4py communicator, or without MPI from
``handshake_dir`` with ``rank`` and ``size``. A process outside the job
(``method=2``, ``n_core=N``, no communicator) joins variables published in
``handshake_dir`` by name.

To make ``import pyddstore`` resolve here, run once before importing it::

    import sys, wholemem.pyddstore; sys.modules.setdefault("pyddstore", wholemem.pyddstore)

See docs/python.md for the compatibility table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _wholemem as _wm

# mpi4py is optional: without it only the rank/size shapes work. It is not
# imported here (importing it initialises MPI); a communicator passed in is
# used through its methods.
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None

__all__ = ["HAVE_MPI", "FileComm", "PyDDStore", "StoreDataset"]

_DTYPES = ("int32", "int64", "uint8", "float32", "float64", "bool")
_INIT_DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
# One wholemem job per communicator or rendezvous directory, shared by the
# stores of this process (a job's connections outlive its stores).
_JOBS: Dict[Tuple[Any, ...], _wm.Comm] = {}
_STORES_CREATED = 0


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{name}={text!r} is not positive")
    return value


def _timeout() -> float:
    return _env_float("DDSTORE_HANDSHAKE_TIMEOUT_S", _env_float("WM_TIMEOUT_S", 120.0))


def _as_array(obj: Any, what: str) -> np.ndarray:
    """numpy view of an array, a CPU torch tensor or a DLPack producer."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "is_cuda") and hasattr(obj, "numpy"):
        if obj.is_cuda:
            raise ValueError(f"{what} is a GPU tensor; this build reads into host memory only")
        return obj.numpy()
    if hasattr(obj, "__dlpack__"):
        return np.from_dlpack(obj)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        return np.asarray(obj)
    raise ValueError(f"{what} must be a numpy array or a CPU torch tensor; got {type(obj).__name__}")


def _check_buffer(arr: np.ndarray, what: str, writable: bool) -> None:
    if arr.dtype.name not in _DTYPES:
        raise ValueError(f"{what} has dtype {arr.dtype}; supported: {', '.join(_DTYPES)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (strides {arr.strides}); pass np.ascontiguousarray(...)")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only")


def _rows_disp(arr: np.ndarray, what: str) -> Tuple[int, int]:
    if arr.ndim == 1:
        return arr.shape[0], 1
    if arr.ndim == 2:
        return arr.shape[0], arr.shape[1]
    raise ValueError(f"{what} must be 1-D or 2-D; got shape {arr.shape}")


def _job(comm: Any, handshake_dir: str, rank: Optional[int], size: int) -> _wm.Comm:
    if comm is not None:
        if not HAVE_MPI:
            raise RuntimeError("a communicator was given but mpi4py is not importable (HAVE_MPI is False)")
        rank, size = comm.Get_rank(), comm.Get_size()
        if handshake_dir:
            key: Tuple[Any, ...] = ("dir", os.path.abspath(handshake_dir), rank, size)
            if key not in _JOBS:
                _JOBS[key] = _wm.Comm.from_dir(handshake_dir, rank, size, _timeout())
        else:
            key = ("mpi", comm.py2f(), size)
            if key not in _JOBS:
                _JOBS[key] = _wm.Comm.from_mpi4py(comm, _timeout())
        return _JOBS[key]
    if rank is None or size <= 0:
        raise ValueError(f"without a communicator, pass rank= and size= (got rank={rank!r}, size={size!r})")
    if not handshake_dir:
        raise ValueError("without a communicator, handshake_dir is required")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not below size {size}")
    key = ("dir", os.path.abspath(handshake_dir), rank, size)
    if key not in _JOBS:
        _JOBS[key] = _wm.Comm.from_dir(handshake_dir, rank, size, _timeout())
    return _JOBS[key]


class _Var:
    """One variable: its table, its one-sided face and this process's reader."""

    def __init__(self, name: str, dtype: Optional[np.dtype], disp: int, itemsize: int, total: int,
                 nlocal: int, offset: int, table: Optional[_wm.Table], onesided: Optional[_wm.OneSided],
                 reader: _wm.Reader) -> None:
        self.name = name
        self.dtype = dtype
        self.disp = disp
        self.itemsize = itemsize
        self.total = total
        self.nlocal = nlocal
        self.offset = offset
        self.table = table
        self.onesided = onesided
        self.reader = reader
        self.recv: List[np.ndarray] = []
        self.profile = {"py_gets": 0, "py_get": 0.0}

    def check_out(self, arr: np.ndarray, nrows: int, what: str) -> None:
        _check_buffer(arr, what, writable=True)
        if self.dtype is not None and arr.dtype != self.dtype:
            raise ValueError(f"{what} has dtype {arr.dtype}; variable {self.name!r} holds {self.dtype}")
        if arr.dtype.itemsize != self.itemsize:
            raise ValueError(f"{what} has {arr.dtype.itemsize}-byte elements; variable {self.name!r} has {self.itemsize}")
        if arr.ndim == 0 or arr.shape[0] != nrows or arr.size != nrows * self.disp:
            raise ValueError(f"{what} has shape {arr.shape}; {nrows} rows of variable {self.name!r} need ({nrows}, {self.disp})")


class PyDDStore:
    """A store of named, row-sharded variables; see the module's docstring."""

    def __init__(self, comm_or_none: Any = None, method: int = 0, handshake_dir: str = "", n_core: int = 0,
                 nic_map: Optional[str] = None, rank: Optional[int] = None, size: int = 0,
                 exchange_ns: str = "") -> None:
        global _STORES_CREATED
        if method not in (0, 1, 2):
            raise ValueError(f"method {method!r} is not 0, 1 or 2")
        if exchange_ns and "." in exchange_ns:
            raise ValueError(f"exchange_ns {exchange_ns!r} contains '.'")
        self.method = method
        self.handshake_dir = handshake_dir
        self.nic_map = nic_map  # accepted for compatibility; wholemem picks NICs itself
        self.ns = exchange_ns or f"s{_STORES_CREATED}"
        _STORES_CREATED += 1
        self._vars: Dict[str, _Var] = {}
        self._freed = False
        self._profile = os.environ.get("DDSTORE_PROFILE", "").strip().lower() in ("1", "true", "yes")
        extra = comm_or_none is None and method == 2 and rank is None and n_core > 0
        if extra:
            if not handshake_dir:
                raise ValueError("an extra member (method=2, n_core=) needs handshake_dir")
            self._job: Optional[_wm.Comm] = None
            self.rank, self.size = None, n_core
        else:
            if comm_or_none is None and method == 2 and size <= 0 and n_core > 0:
                size = n_core
            self._job = _job(comm_or_none, handshake_dir, rank, size)
            self.rank, self.size = self._job.rank, self._job.size
            if method == 2 and n_core and n_core != self.size:
                raise ValueError(f"n_core {n_core} differs from the communicator's size {self.size}")
        self._where = f"dir:{os.path.abspath(handshake_dir)}" if handshake_dir else None
        self._onesided_method = "fabric" if method == 1 and _wm.probe(self._job)["onesided"]["fabric"]["available"] else None

    # -- bookkeeping ---------------------------------------------------------
    def _live(self) -> None:
        if self._freed:
            raise RuntimeError("this PyDDStore has been freed")

    def _var(self, name: str) -> _Var:
        self._live()
        try:
            return self._vars[name]
        except KeyError:
            raise KeyError(f"no variable {name!r} in this store (known: {sorted(self._vars)})") from None

    def _core(self, what: str) -> _wm.Comm:
        self._live()
        if self._job is None:
            raise RuntimeError(f"{what} needs a core member; this store is an extra member (method=2, n_core=)")
        return self._job

    def _table_name(self, name: str) -> str:
        return f"{self.ns}.{name}"

    def _allgather(self, obj: Any) -> List[Any]:
        job = self._core("a collective call")
        return [json.loads(b) for b in job.allgather_bytes(json.dumps(obj).encode())]

    def _create(self, name: str, dtype: np.dtype, disp: int, nlocal: int, itemsize: int, data: Optional[np.ndarray],
                problem: Optional[str], declared: Optional[str]) -> None:
        if name in self._vars:
            problem = problem or f"variable {name!r} exists already"
        mine = {"name": name, "dtype": declared, "disp": disp, "itemsize": itemsize, "rows": nlocal, "problem": problem}
        everyone = self._allgather(mine)
        for r, theirs in enumerate(everyone):
            if theirs["problem"]:
                raise ValueError(f"rank {r}: {theirs['problem']}")
        for key in ("name", "dtype", "disp", "itemsize"):
            values = [t[key] for t in everyone]
            if any(v != values[0] for v in values):
                raise ValueError(f"ranks disagree on {key}: {values}")
        counts = [t["rows"] for t in everyone]
        total = sum(counts)
        if total == 0:
            raise ValueError(f"variable {name!r} has no rows on any rank")
        table = _wm.Table(self._job, total, disp, dtype, "distributed", "host", counts)
        offset = sum(counts[: self.rank])
        try:
            if data is not None and nlocal:
                table.write_rows_bytes(offset, data)
            onesided = table.onesided(self._table_name(name), self._onesided_method, self._where, self._profile)
            onesided.publish()
            reader = onesided.reader()
        except BaseException:
            table.free()
            raise
        self._vars[name] = _Var(name, np.dtype(declared) if declared else None, disp, itemsize, total, nlocal,
                                offset, table, onesided, reader)

    # -- the seed API --------------------------------------------------------
    def add(self, name: str, arr: Any) -> None:
        """Registers this rank's shard of ``name`` (collective)."""
        self._core("add")
        problem = None
        try:
            a = _as_array(arr, "arr")
            _check_buffer(a, "arr", writable=False)
            nrows, disp = _rows_disp(a, "arr")
            if disp == 0:
                raise ValueError(f"arr has shape {a.shape}: rows of no elements")
        except ValueError as e:
            problem, a, nrows, disp = str(e), np.zeros((0, 1), np.uint8), 0, 1
        store_dtype = "int8" if a.dtype.name in ("uint8", "bool") else a.dtype.name
        self._create(name, np.dtype(store_dtype), disp, nrows, a.dtype.itemsize, a, problem, a.dtype.name)

    def init(self, name: str, nrows: int, disp: int, itemsize: int = 1) -> None:
        """Allocates ``name`` with ``nrows`` rows here, to be filled by ``update`` (collective)."""
        self._core("init")
        problem = None
        if itemsize not in _INIT_DTYPES:
            problem = f"itemsize {itemsize!r} is not one of {sorted(_INIT_DTYPES)}"
        elif not isinstance(nrows, (int, np.integer)) or nrows < 0:
            problem = f"nrows {nrows!r} is not a non-negative integer"
        elif not isinstance(disp, (int, np.integer)) or disp <= 0:
            problem = f"disp {disp!r} is not a positive integer"
        if problem:
            nrows, disp, itemsize = 0, 1, 1
        store = "int8" if itemsize == 1 else _INIT_DTYPES[itemsize]
        self._create(name, np.dtype(store), int(disp), int(nrows), itemsize, None, problem, None)

    def update(self, name: str, arr: Any, offset: int) -> None:
        """Overwrites rows ``offset..`` of this rank's shard of ``name`` (local)."""
        v = self._var(name)
        if v.table is None:
            raise RuntimeError("update needs a core member; this store is an extra member")
        a = _as_array(arr, "arr")
        _check_buffer(a, "arr", writable=False)
        if v.dtype is not None and a.dtype != v.dtype:
            raise ValueError(f"arr has dtype {a.dtype}; variable {name!r} holds {v.dtype}")
        if a.dtype.itemsize != v.itemsize:
            raise ValueError(f"arr has {a.dtype.itemsize}-byte elements; variable {name!r} has {v.itemsize}")
        nrows, disp = _rows_disp(a, "arr")
        if a.size != nrows * v.disp:
            raise ValueError(f"arr has shape {a.shape}; rows of variable {name!r} have {v.disp} elements")
        if not isinstance(offset, (int, np.integer)) or offset < 0 or offset + nrows > v.nlocal:
            raise IndexError(f"rows {offset}..{offset}+{nrows} are outside this rank's {v.nlocal} rows of {name!r}")
        if nrows:
            v.table.write_rows_bytes(v.offset + int(offset), a)

    def get(self, name: str, arr: Any, start: int = 0) -> None:
        """Reads ``arr.shape[0]`` rows from global row ``start`` into ``arr`` (one-sided)."""
        v = self._var(name)
        a = _as_array(arr, "arr")
        nrows = a.shape[0] if a.ndim else 0
        v.check_out(a, nrows, "arr")
        if not isinstance(start, (int, np.integer)) or start < 0 or start + nrows > v.total:
            raise IndexError(f"rows {start}..{start}+{nrows} are outside variable {name!r} of {v.total} rows")
        t0 = time.perf_counter()
        if nrows:
            v.reader.get_bytes(int(start), a)
        self._count(v, t0)

    def get_batch(self, name: str, arr: Any, indices: Any) -> None:
        """Reads rows ``indices`` into ``arr`` (collective for method 0)."""
        v = self._var(name)
        problem: Optional[Exception] = None
        try:
            a = _as_array(arr, "arr")
            idx = np.ascontiguousarray(np.asarray(indices).reshape(-1))
            if idx.size and idx.dtype.kind not in "iu":
                raise ValueError(f"indices have dtype {idx.dtype}; they must be integers")
            if idx.dtype.kind != "i" or idx.dtype.itemsize not in (4, 8):
                idx = idx.astype(np.int64)
            if a.ndim == 0 or a.shape[0] != idx.shape[0]:
                raise ValueError(f"arr has {a.shape[0] if a.ndim else 0} rows but {idx.shape[0]} indices were given")
            v.check_out(a, idx.shape[0], "arr")
        except ValueError as e:
            problem = e
        t0 = time.perf_counter()
        if self.method == 0 and v.table is not None:
            if problem is not None:
                # Take part with no rows, so the other ranks' call completes.
                v.table.gather_bytes(np.zeros(0, np.int64), np.zeros(0, np.uint8))
                raise problem
            v.table.gather_bytes(idx, a)
        else:
            if problem is not None:
                raise problem
            self._read_batch(v, idx, a)
        self._count(v, t0)

    def _read_batch(self, v: _Var, idx: np.ndarray, a: np.ndarray) -> None:
        row_bytes = v.disp * v.itemsize
        limit = int(_env_float("DDSTORE_MAX_READ_BYTES", float(1 << 30)))
        per_call = max(1, limit // max(1, row_bytes))
        if idx.shape[0] <= per_call:
            v.reader.get_batch_bytes(idx, a)
            return
        flat = a.reshape(a.shape[0], -1)
        for lo in range(0, idx.shape[0], per_call):
            v.reader.get_batch_bytes(idx[lo:lo + per_call], flat[lo:lo + per_call])

    def _count(self, v: _Var, t0: float) -> None:
        if self._profile:
            v.profile["py_gets"] += 1
            v.profile["py_get"] += time.perf_counter() - t0

    def register_recv(self, name: str, arr: Any) -> None:
        """Keeps ``arr`` as a reused destination of ``name`` until ``unregister_recv`` or ``free``."""
        v = self._var(name)
        a = _as_array(arr, "arr")
        _check_buffer(a, "arr", writable=True)
        v.recv.append(arr)

    def unregister_recv(self, name: str, arr: Any) -> None:
        """Forgets a destination registered with ``register_recv``."""
        v = self._var(name)
        for i, kept in enumerate(v.recv):
            if kept is arr:
                del v.recv[i]
                return
        raise ValueError(f"that array was not registered for {name!r}")

    def get_profile(self, name: str) -> Dict[str, float]:
        """Timers of ``get``/``get_batch`` on ``name`` (zeros unless DDSTORE_PROFILE=1)."""
        v = self._var(name)
        out = {k: 0 for k in ("calls", "rows", "lock_wait", "mr", "mr_miss", "read", "cq", "py_gets", "py_get", "py_sync")}
        if not self._profile:
            return out
        p = v.reader.profile() or {}
        for k in ("calls", "rows", "lock_wait", "mr", "mr_miss", "read", "cq"):
            out[k] = p.get(k, 0)
        out.update(py_gets=v.profile["py_gets"], py_get=v.profile["py_get"], py_sync=0.0)
        return out

    def join(self, name: str) -> None:
        """Extra member: waits for ``name`` in ``handshake_dir`` (DDSTORE_HANDSHAKE_TIMEOUT_S), then reads it."""
        self._live()
        if name in self._vars:
            return
        if self._job is not None and self._where is None:
            raise KeyError(f"no variable {name!r} in this store; core members add() or init() it")
        if not self.handshake_dir:
            raise ValueError("join needs handshake_dir")
        timeout = _timeout()
        try:
            reader = _wm.Reader.join(self._where, self._table_name(name), timeout)
        except TimeoutError as e:
            raise _wm.WaitTimeoutError(
                f"variable {name!r} (table {self._table_name(name)!r}) did not appear in {self.handshake_dir!r} "
                f"within {timeout:g} s (DDSTORE_HANDSHAKE_TIMEOUT_S): {e}") from None
        info = reader.info()
        itemsize = np.dtype(info["dtype"]).itemsize
        self._vars[name] = _Var(name, None, info["cols"], itemsize, info["rows"], 0, 0, None, None, reader)

    def fork_reader(self) -> "PyDDStore":
        """A read-only store over the same variables for this process (call it in a forked child) or thread."""
        self._live()
        child = object.__new__(PyDDStore)
        child.__dict__.update(self.__dict__)
        child._job = None
        child._read_only = True
        child._vars = {}
        for name, v in self._vars.items():
            nv = _Var(name, v.dtype, v.disp, v.itemsize, v.total, 0, 0, None, None, v.reader.reopen())
            child._vars[name] = nv
        child.method = 2 if self.method == 0 else self.method  # reads one-sidedly
        return child

    def info(self, name: str) -> Tuple[int, int, int]:
        """``(total_rows, disp, itemsize)`` of ``name``."""
        v = self._var(name)
        return v.total, v.disp, v.itemsize

    def epoch_begin(self) -> None:
        """Method 0: makes every rank's update() writes visible (collective). No-op for 1/2."""
        if self.method == 0 and self._job is not None:
            self._core("epoch_begin").barrier()

    def epoch_end(self) -> None:
        """Method 0: waits until every rank is done reading (collective). No-op for 1/2."""
        if self.method == 0 and self._job is not None:
            self._core("epoch_end").barrier()

    def free(self) -> None:
        """Releases every variable (collective for core members: it waits
        until every rank is done reading, then stops serving). Idempotent."""
        if self._freed:
            return
        self._freed = True
        first: Optional[BaseException] = None
        if self._job is not None and self._vars:
            # Every rank stops reading before any stops serving its rows.
            try:
                self._job.barrier()
            except BaseException as e:
                first = e
        for v in self._vars.values():
            v.recv.clear()
            for part in (v.onesided, v.table):
                if part is None:
                    continue
                try:
                    part.free()
                except BaseException as e:  # free what remains, then report the first failure
                    first = first or e
        self._vars.clear()
        if first is not None:
            raise first

    def __enter__(self) -> "PyDDStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


class FileComm:
    """Collectives through files in a shared directory, for jobs without MPI.

    Every rank creates its FileComms and makes its calls in the same order,
    with an ``ns`` unique in ``dir``. Waits end after
    DDSTORE_HANDSHAKE_TIMEOUT_S (default WM_TIMEOUT_S, else 120 s) with a
    TimeoutError naming the files still missing.
    """

    def __init__(self, dir: str, rank: int, size: int, ns: str = "fc") -> None:  # noqa: A002 - the seed's name
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"size {size!r} is not a positive integer")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank {rank!r} is not in 0..{size}")
        if not ns or "/" in ns:
            raise ValueError(f"ns {ns!r} must be a non-empty name without '/'")
        os.makedirs(dir, exist_ok=True)
        self.dir, self.rank, self.size, self.ns = dir, rank, size, ns
        self._calls = 0

    def _path(self, call: int, who: str) -> str:
        return os.path.join(self.dir, f"filecomm-{self.ns}-{call}-{who}.pkl")

    def _write(self, path: str, obj: Any) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".filecomm-")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, path)

    def _wait(self, paths: List[str]) -> None:
        timeout = _timeout()
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            missing = [p for p in paths if not os.path.exists(p)]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise _wm.WaitTimeoutError(
                    f"FileComm {self.ns!r} in {self.dir!r}: rank {self.rank} waited {timeout:g} s for {missing[:4]}"
                    f"{' …' if len(missing) > 4 else ''} (DDSTORE_HANDSHAKE_TIMEOUT_S)")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, as a list in rank order."""
        call = self._calls
        self._calls += 1
        self._write(self._path(call, str(self.rank)), obj)
        combined = self._path(call, "all")
        if self.rank == 0:
            parts = [self._path(call, str(r)) for r in range(self.size)]
            self._wait(parts)
            objs = []
            for p in parts:
                with open(p, "rb") as f:
                    objs.append(pickle.load(f))
            self._write(combined, objs)
            for p in parts:
                os.unlink(p)
            if call > 0:  # every rank has left the previous call: it wrote this one's part
                try:
                    os.unlink(self._path(call - 1, "all"))
                except FileNotFoundError:
                    pass
            return objs
        self._wait([combined])
        with open(combined, "rb") as f:
            return pickle.load(f)

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        self.allgather(None)


class StoreDataset:
    """A map-style dataset over one variable of a store, for torch's DataLoader.

    ``__getitems__`` reads a whole batch with one ``get_batch``; in a
    DataLoader worker (another process) it first takes a ``fork_reader()``
    of the store, so workers read one-sidedly while the parent goes on.
    Without torch it is a plain sequence.
    """

    def __init__(self, store: PyDDStore, name: str) -> None:
        self.store = store
        self.name = name
        self.total, self.disp, self.itemsize = store.info(name)
        v = store._var(name)
        self.dtype = v.dtype if v.dtype is not None else np.dtype(_INIT_DTYPES[self.itemsize])
        self._pid = os.getpid()
        self._reader: Optional[PyDDStore] = None

    def _store(self) -> PyDDStore:
        if os.getpid() == self._pid and self.store.method != 0:
            return self.store
        if self._reader is None or self._reader_pid != os.getpid():
            self._reader = self.store.fork_reader()
            self._reader_pid = os.getpid()
        return self._reader

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> np.ndarray:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: List[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        out = np.empty((idx.shape[0], self.disp), dtype=self.dtype)
        self._store().get_batch(self.name, out, idx)
        return out
