"""wholemem.pyddstore against the seed reference, at 1..4 ranks (mpi4py),
values bit-exact against numpy indexing of the concatenated shards."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import wholemem
from wholemem import pyddstore
from conftest import shard_counts, values

DTYPES = ["int32", "int64", "uint8", "float32", "float64", "bool"]
METHODS = [0, 1, 2]


def make(world, method, shared_dir, **kw):
    if method == 2:
        return pyddstore.PyDDStore(world, method=2, handshake_dir=shared_dir, **kw)
    return pyddstore.PyDDStore(world, method=method, **kw)


def shard(world, total, disp, dtype):
    counts = shard_counts(total, world.Get_size())
    lo = sum(counts[: world.Get_rank()])
    full = values(total, disp, dtype)
    return full, np.ascontiguousarray(full[lo: lo + counts[world.Get_rank()]])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_get_batch_bit_exact(world, shared_dir, method, dtype):
    total, disp = 211, 6
    full, mine = shard(world, total, disp, dtype)
    s = make(world, method, shared_dir)
    s.add("feat", mine)
    assert s.info("feat") == (total, disp, np.dtype(dtype).itemsize)
    rng = np.random.default_rng(world.Get_rank() + 10)
    idx = rng.integers(0, total, 100 + world.Get_rank())  # counts differ by rank
    out = np.zeros((len(idx), disp), dtype)
    s.epoch_begin()
    s.get_batch("feat", out, idx)
    s.epoch_end()
    assert out.tobytes() == full[idx].tobytes()
    one = np.zeros((5, disp), dtype)
    s.get("feat", one, total - 5)
    assert one.tobytes() == full[total - 5:].tobytes()
    # 1-D variables
    col = np.ascontiguousarray(mine[:, 0])
    s.add("col", col)
    out1 = np.zeros(3, dtype)
    s.get_batch("col", out1, np.array([total - 1, 0, 5], np.int32))
    assert out1.tobytes() == full[[total - 1, 0, 5], 0].tobytes()
    s.free()
    s.free()  # idempotent


@pytest.mark.parametrize("method", METHODS)
def test_empty_batches_on_some_ranks(world, shared_dir, method):
    full, mine = shard(world, 50, 2, "float32")
    s = make(world, method, shared_dir)
    s.add("x", mine)
    n = 0 if world.Get_rank() % 2 else 7
    out = np.zeros((n, 2), np.float32)
    s.get_batch("x", out, np.arange(n))
    assert np.array_equal(out, full[:n])
    s.free()


@pytest.mark.parametrize("method", METHODS)
def test_init_update_epoch(world, shared_dir, method):
    size, rank = world.Get_size(), world.Get_rank()
    nrows, disp = 8, 3
    s = make(world, method, shared_dir)
    s.init("v", nrows, disp, itemsize=8)
    assert s.info("v") == (nrows * size, disp, 8)
    rows = np.arange(nrows * disp, dtype=np.int64).reshape(nrows, disp) + 1000 * rank
    s.update("v", rows[:5], 0)
    s.update("v", rows[5:], 5)
    if method != 0:
        world.Barrier()  # epoch_begin is a no-op for methods 1 and 2, as in the seed
    s.epoch_begin()
    out = np.zeros((size, disp), np.int64)
    s.get_batch("v", out, np.arange(size) * nrows + 6)
    s.epoch_end()
    expect = np.stack([np.arange(disp) + 6 * disp + 1000 * r for r in range(size)])
    assert np.array_equal(out, expect)
    with pytest.raises(IndexError):
        s.update("v", rows[:2], nrows - 1)
    s.free()


def test_register_recv_and_profile(world, shared_dir, monkeypatch):
    monkeypatch.setenv("DDSTORE_PROFILE", "1")
    full, mine = shard(world, 40, 4, "float32")
    s = make(world, 1, shared_dir)
    s.add("x", mine)
    pool = np.zeros((16, 4), np.float32)
    s.register_recv("x", pool)
    s.get_batch("x", pool[:3], [39, 1, 2])
    assert np.array_equal(pool[:3], full[[39, 1, 2]])
    p = s.get_profile("x")
    assert p["py_gets"] == 1 and p["calls"] == 1 and p["rows"] == 3
    s.unregister_recv("x", pool)
    with pytest.raises(ValueError, match="not registered"):
        s.unregister_recv("x", pool)
    s.free()


def test_profile_is_zero_without_ddstore_profile(world, shared_dir, monkeypatch):
    monkeypatch.delenv("DDSTORE_PROFILE", raising=False)
    _, mine = shard(world, 10, 1, "int32")
    s = make(world, 2, shared_dir)
    s.add("x", mine)
    s.get_batch("x", np.zeros((1, 1), np.int32), [3])
    assert set(s.get_profile("x").values()) == {0}
    s.free()


@pytest.mark.parametrize("method", METHODS)
def test_bad_inputs_leave_every_rank_usable(world, shared_dir, method):
    full, mine = shard(world, 30, 4, "float32")
    s = make(world, method, shared_dir)
    s.add("x", mine)
    good = np.zeros((2, 4), np.float32)
    with pytest.raises(IndexError, match="30"):  # raised on every rank, for method 0 too
        s.get_batch("x", good, [0, 30])
    with pytest.raises(ValueError, match="3 indices"):
        s.get_batch("x", good, [0, 1, 2])
    with pytest.raises(ValueError, match="C-contiguous"):
        s.get_batch("x", np.zeros((2, 8), np.float32)[:, ::2], [0, 1])
    with pytest.raises(ValueError, match="float64"):
        s.get_batch("x", np.zeros((2, 4), np.float64), [0, 1])
    with pytest.raises(ValueError, match="shape"):
        s.get_batch("x", np.zeros((2, 3), np.float32), [0, 1])
    with pytest.raises(KeyError, match="nope"):
        s.get_batch("nope", good, [0, 1])
    with pytest.raises(IndexError):
        s.get("x", good, 29)
    # one rank alone passes a bad buffer: the others' collective call completes
    if world.Get_rank() == 0:
        with pytest.raises(ValueError):
            s.get_batch("x", np.zeros((1, 4), np.float32), [0, 1])
    else:
        s.get_batch("x", good, [0, 1])
        assert np.array_equal(good, full[:2])
    with pytest.raises(ValueError, match="rank"):  # shapes that disagree between ranks
        s.add("y", np.zeros((2, 3 + world.Get_rank() % 2 if world.Get_size() > 1 else 0), np.float32))
    s.get_batch("x", good, [29, 28])
    assert np.array_equal(good, full[[29, 28]])
    s.free()
    with pytest.raises(RuntimeError, match="freed"):
        s.get_batch("x", good, [0, 1])


def test_join_from_outside_and_timeout(world, shared_dir):
    full, mine = shard(world, 77, 5, "float64")
    s = pyddstore.PyDDStore(world, method=2, handshake_dir=shared_dir, exchange_ns="job")
    s.add("feat", mine)
    world.Barrier()
    if world.Get_rank() == 0:
        # An extra member: a process that is not part of the job.
        code = textwrap.dedent(f"""
            import numpy as np
            from wholemem import pyddstore
            s = pyddstore.PyDDStore(None, method=2, handshake_dir={shared_dir!r}, n_core={world.Get_size()}, exchange_ns="job")
            s.join("feat")
            rows, disp, itemsize = s.info("feat")
            out = np.zeros((3, disp), np.float64)
            s.get_batch("feat", out, [rows - 1, 0, 40])
            np.save({os.path.join(shared_dir, 'extra.npy')!r}, out)
            s.free()
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
        got = np.load(os.path.join(shared_dir, "extra.npy"))
        assert got.tobytes() == full[[76, 0, 40]].tobytes()
    world.Barrier()
    s.free()
    extra = pyddstore.PyDDStore(None, method=2, handshake_dir=shared_dir, n_core=world.Get_size(), exchange_ns="late")
    os.environ["DDSTORE_HANDSHAKE_TIMEOUT_S"] = "0.5"
    try:
        with pytest.raises(TimeoutError) as e:
            extra.join("missing")
    finally:
        del os.environ["DDSTORE_HANDSHAKE_TIMEOUT_S"]
    assert shared_dir in str(e.value) and "missing" in str(e.value)


@pytest.mark.parametrize("method", [0, 1, 2])
def test_forked_workers_read_while_the_parent_reads(world, shared_dir, method):
    full, mine = shard(world, 300, 8, "int64")
    s = make(world, method, shared_dir)
    s.add("x", mine)
    world.Barrier()
    pids = []
    for w in range(2):
        pid = os.fork()
        if pid == 0:  # a DataLoader worker
            ok = False
            try:
                r = s.fork_reader()
                for i in range(20):
                    idx = (np.arange(50) * (w + 3) + i) % 300
                    out = np.zeros((50, 8), np.int64)
                    r.get_batch("x", out, idx)
                    assert np.array_equal(out, full[idx])
                ok = True
            finally:
                os._exit(0 if ok else 1)
        pids.append(pid)
    if method != 0:
        for i in range(20):  # the parent reads meanwhile
            idx = (np.arange(40) * 7 + i) % 300
            out = np.zeros((40, 8), np.int64)
            s.get_batch("x", out, idx)
            assert np.array_equal(out, full[idx])
    codes = [os.waitpid(p, 0)[1] for p in pids]
    assert codes == [0, 0]
    world.Barrier()
    s.free()


def test_dataset_batches(world, shared_dir):
    full, mine = shard(world, 60, 3, "float32")
    s = make(world, 1, shared_dir)
    s.add("x", mine)
    ds = pyddstore.StoreDataset(s, "x")
    assert len(ds) == 60
    assert np.array_equal(ds.__getitems__([59, 0, 7]), full[[59, 0, 7]])
    assert np.array_equal(ds[4], full[4])
    world.Barrier()
    s.free()


def test_have_mpi_and_import_alias():
    assert pyddstore.HAVE_MPI is True
    sys.modules.setdefault("pyddstore", pyddstore)
    import pyddstore as alias  # noqa: F811

    assert alias.PyDDStore is pyddstore.PyDDStore
    assert issubclass(wholemem.IndexOutOfRangeError, IndexError)
