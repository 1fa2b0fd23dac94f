"""Shared fixtures. Under `mpirun -np N python -m pytest`, every rank runs
every test; tests that start their own ranks (subprocesses) run on a
single-process pytest only, and say so when skipped."""

import os
import shutil
import tempfile

import numpy as np
import pytest

try:
    from mpi4py import MPI

    WORLD = MPI.COMM_WORLD
except ImportError:  # the multi-rank tests need mpi4py; they skip naming it
    MPI = None
    WORLD = None


def pytest_configure(config):
    """Under mpirun each rank gets pytest temporaries of its own: ranks that
    shared `/tmp/pytest-of-USER` removed each other's old directories and
    warned that they could not (a `PytestWarning`)."""
    if WORLD is not None and WORLD.Get_size() > 1 and not config.option.basetemp:
        config.option.basetemp = tempfile.mkdtemp(prefix=f"wm-pytest-rank{WORLD.Get_rank()}-")


def pytest_unconfigure(config):
    base = config.option.basetemp
    if WORLD is not None and WORLD.Get_size() > 1 and base and os.path.basename(str(base)).startswith("wm-pytest-rank"):
        shutil.rmtree(str(base), ignore_errors=True)


def world_size() -> int:
    return WORLD.Get_size() if WORLD is not None else 1


@pytest.fixture
def world():
    if WORLD is None:
        pytest.skip("needs mpi4py (pip install mpi4py)")
    WORLD.Barrier()
    yield WORLD
    WORLD.Barrier()


@pytest.fixture
def shared_dir(tmp_path):
    """One directory every rank sees (rank 0 makes it; mode 700)."""
    path = None
    if WORLD is None or WORLD.Get_rank() == 0:
        path = tempfile.mkdtemp(prefix="wm-py-", dir=str(tmp_path))
    if WORLD is not None:
        path = WORLD.bcast(path, 0)
    yield path
    if WORLD is not None:
        WORLD.Barrier()
    if WORLD is None or WORLD.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


solo = pytest.mark.skipif(world_size() > 1, reason="starts its own ranks as subprocesses; run by the single-process pytest")


def values(rows, cols, dtype):
    """Row- and column-dependent values of a table, exact in every dtype."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    v = (r * 7919 + c * 104729) % 251
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ((r + c) % 3 == 0).astype(np.bool_)
    if dtype.kind == "f":
        return (v + (r % 5) * 0.25 - c * 0.5).astype(dtype)
    return v.astype(dtype) - (0 if dtype.kind == "u" or dtype.itemsize == 1 else 100)


def shard_counts(total, size, skew=True):
    """Uneven rows per rank (the last rank may get fewer) that sum to total."""
    base = [total // size + (1 if skew and r % 2 == 0 else 0) for r in range(size)]
    base[-1] = total - sum(base[:-1])
    assert base[-1] >= 0
    return base
