"""The core API: Comm, Table of the four types, gather/scatter, one-sided
reads, probe, exceptions. Runs at 1..4 ranks (mpi4py communicator)."""

import os

import numpy as np
import pytest

import wholemem
from conftest import values

TYPES = ["continuous", "chunked", "distributed", "hierarchy"]
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


@pytest.fixture(scope="module")
def comm():
    from conftest import WORLD

    if WORLD is None:
        pytest.skip("needs mpi4py (pip install mpi4py)")
    return wholemem.Comm.from_mpi4py(WORLD)


def filled(comm, rows, cols, dtype, ty):
    t = wholemem.Table(comm, rows, cols, dtype, ty)
    start, stop = t.local_rows
    t.write_local(values(rows, cols, dtype)[start:stop])
    comm.barrier()
    return t


def test_comm_matches_mpi(comm):
    from conftest import WORLD

    assert (comm.rank, comm.size) == (WORLD.Get_rank(), WORLD.Get_size())
    got = comm.allgather_bytes(bytes([comm.rank]) * 3)
    assert got == [bytes([r]) * 3 for r in range(comm.size)]


def test_probe_is_a_dict(comm):
    p = wholemem.probe(comm)
    assert p["size"] == comm.size and p["rank"] == comm.rank
    assert p["support"]["distributed/host"]["supported"] is True
    assert p["onesided"]["socket"]["available"] is True
    assert set(p["cuda"]) >= {"available"}


@pytest.mark.parametrize("ty", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_is_numpy_indexing(comm, ty, dtype):
    rows, cols = 1000 + comm.size, 5
    t = filled(comm, rows, cols, dtype, ty)
    ref = values(rows, cols, dtype)
    rng = np.random.default_rng(comm.rank)
    ids = rng.integers(0, rows, 777 + comm.rank)
    got = t.gather(ids)
    assert got.dtype == np.dtype(dtype) and got.shape == (len(ids), cols)
    assert np.array_equal(got, ref[ids])
    assert bytes(got) == bytes(ref[ids])  # bit-exact, floats included
    got32 = t.gather(ids.astype(np.int32))
    assert np.array_equal(got32, ref[ids])
    t.free()
    t.free()


@pytest.mark.parametrize("ty", TYPES)
def test_scatter_then_gather(comm, ty):
    rows, cols = 64 * comm.size + 3, 4
    t = filled(comm, rows, cols, "float32", ty)
    ref = values(rows, cols, "float32")
    # Each rank writes its own set of rows, so the outcome does not depend on order.
    mine = np.arange(comm.rank, rows, comm.size)
    new = (ref[mine] * -2).astype(np.float32)
    t.scatter(mine, new)
    comm.barrier()
    ref[np.arange(rows) % comm.size == comm.rank] *= 1  # unchanged locally
    for r in range(comm.size):
        ref[np.arange(r, rows, comm.size)] *= -2
    every = np.arange(rows)
    assert np.array_equal(t.gather(every), ref)
    t.free()


def test_conversion_into_a_wider_output(comm):
    t = filled(comm, 50, 3, "float32", "distributed")
    out = np.zeros((4, 3), np.float64)
    t.gather([0, 49, 3, 3], out=out)
    assert np.array_equal(out, values(50, 3, "float32")[[0, 49, 3, 3]].astype(np.float64))
    t.free()


def test_bad_inputs_raise_and_leave_the_table_usable(comm):
    rows = 40
    t = filled(comm, rows, 2, "int32", "distributed")
    ref = values(rows, 2, "int32")
    with pytest.raises(IndexError, match=str(rows)) as e:
        t.gather([0, rows])
    assert isinstance(e.value, wholemem.WholememError)
    with pytest.raises(IndexError):
        t.gather([-1])
    with pytest.raises(ValueError, match="C-contiguous"):
        t.gather([0, 1], out=np.zeros((2, 4), np.int32)[:, ::2])
    with pytest.raises(ValueError, match="float32"):
        t.gather([0], out=np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"shape \[3, 2\]"):
        t.gather([0, 1], out=np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros((1, 2), np.int32)
        ro.flags.writeable = False
        t.gather([0], out=ro)
    with pytest.raises(ValueError, match="integers"):
        t.gather(np.array([0.5]))
    with pytest.raises(ValueError, match="dtype"):
        wholemem.Table(comm, 4, 2, "complex64")
    # Only this rank's input is bad: the others' call still completes.
    bad = comm.rank == comm.size - 1
    if bad:
        with pytest.raises(ValueError):
            t.gather([1], out=np.zeros((2, 2), np.int32))
    else:
        assert np.array_equal(t.gather([1]), ref[[1]])
    assert np.array_equal(t.gather(np.arange(rows)), ref)
    t.free()
    with pytest.raises(ValueError, match="freed"):
        t.gather([0])


def test_onesided_reads_without_the_owners(comm):
    rows, cols = 30 * comm.size + 1, 3
    t = filled(comm, rows, cols, "float64", "distributed")
    ref = values(rows, cols, "float64")
    pub = t.onesided(f"core-{comm.size}")
    pub.publish()
    r = pub.reader()
    assert r.info()["rows"] == rows and r.info()["dtype"] == "float64"
    assert np.array_equal(r.get(rows - 3, 3), ref[rows - 3:])
    ids = np.array([rows - 1, 0, 7, 7])
    assert np.array_equal(r.get_batch(ids), ref[ids])
    with pytest.raises(IndexError):
        r.get_batch([rows])
    assert np.array_equal(r.get_batch([1]), ref[[1]])
    comm.barrier()
    pub.free()
    t.free()


@pytest.mark.parametrize("method", ["gather", "gather_bytes"])
def test_a_read_only_output_on_one_rank_fails_there_alone(comm, method):
    rows = 20
    t = filled(comm, rows, 2, "int32", "distributed")
    ref = values(rows, 2, "int32")
    out = np.zeros((2, 2), np.int32)
    call = getattr(t, method)
    if comm.rank == comm.size - 1:
        out.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            call([3, 19], out)
    else:
        call([3, 19], out)
        assert np.array_equal(out, ref[[3, 19]])
    # Every rank took part: the next collective call works everywhere.
    assert np.array_equal(t.gather([5, 0]), ref[[5, 0]])
    t.free()


def test_byte_order(comm):
    rows = 12
    t = filled(comm, rows, 3, "float32", "distributed")
    ref = values(rows, 3, "float32")
    ids = np.array([11, 0, 4], dtype=">i8")  # converted to native int64
    assert np.array_equal(t.gather(ids), ref[[11, 0, 4]])
    with pytest.raises(ValueError, match="native byte order"):
        t.gather([1], out=np.zeros((1, 3), ">f4"))
    assert np.array_equal(t.gather(np.array([2], "<i4")), ref[[2]])
    t.free()


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8"])
def test_store_and_load_npy_shards(comm, shared_dir, dtype):
    rows, cols = 9 * comm.size + 2, 3
    t = filled(comm, rows, cols, dtype, "distributed")
    where = f"{shared_dir}/npy"
    t.store(where)
    comm.barrier()
    # One file per rank, which numpy reads as this rank's rows (uint8 as int8: the same bits).
    start, stop = t.local_rows
    mine = np.load(f"{where}/shard_{comm.rank:04d}.npy")
    assert np.array_equal(mine.view(np.dtype(dtype)), values(rows, cols, dtype)[start:stop])
    back = wholemem.Table(comm, rows, cols, dtype, "chunked")
    got = back.load(where)
    assert got["bytes"] == (back.local_rows[1] - back.local_rows[0]) * cols * np.dtype(dtype).itemsize
    comm.barrier()
    assert np.array_equal(back.gather(np.arange(rows)), values(rows, cols, dtype))
    # The same files listed, and a raw file.
    files = [f"{where}/shard_{r:04d}.npy" for r in range(comm.size)]
    again = wholemem.Table(comm, rows, cols, dtype, "distributed")
    again.load(files)
    comm.barrier()
    assert np.array_equal(again.gather(np.arange(rows)), values(rows, cols, dtype))
    raw = f"{shared_dir}/table.raw"
    t.store(raw, kind="raw")
    again.load(raw, kind="raw")
    comm.barrier()
    assert np.array_equal(again.gather(np.arange(rows)[::-1]), values(rows, cols, dtype)[::-1])
    for x in (t, back, again):
        x.free()


def test_load_refuses_files_of_another_shape_on_every_rank(comm, shared_dir):
    rows = 4 * comm.size
    if comm.rank == 0:
        np.save(f"{shared_dir}/shard_0000.npy", np.zeros((rows, 5), np.float32))
    comm.barrier()
    t = wholemem.Table(comm, rows, 4, "float32", "distributed")
    with pytest.raises(ValueError, match="shard_0000.npy|shape"):
        t.load(shared_dir)
    with pytest.raises(ValueError, match="kind"):
        t.load(shared_dir, kind="hdf5")
    # Still usable: a collective call after the failure works.
    assert t.gather([0]).shape == (1, 4)
    t.free()


# ---- local_view: this rank's rows as a numpy view --------------------------


def wholemem_maps():
    """This process's mappings of wholemem's memfds (table rows, row locks)."""
    with open("/proc/self/maps") as f:
        return sum("/memfd:wholemem" in line for line in f)


def shm_entries():
    return sorted(n for n in os.listdir("/dev/shm") if "wholemem" in n or n.startswith("wm")) if os.path.isdir("/dev/shm") else []


@pytest.mark.parametrize("ty", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_local_view_is_read_local_without_a_copy(comm, ty, dtype):
    rows, cols = 50 + comm.size, 3
    t = filled(comm, rows, cols, dtype, ty)
    start, stop = t.local_rows
    v = t.local_view()
    assert isinstance(v, np.ndarray) and isinstance(v.base, wholemem.LocalView)
    assert v.shape == (stop - start, cols) and v.dtype == np.dtype(dtype)
    assert np.array_equal(v, t.read_local()) and bytes(v) == bytes(t.read_local())
    assert np.array_equal(v, values(rows, cols, dtype)[start:stop])
    # Read-only by default, and numpy will not make it writable.
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[...] = v[0] if len(v) else 0
    with pytest.raises(ValueError):
        v.flags.writeable = True
    # A view, not a copy: writes through the table show in it.
    t.write_local(values(rows, cols, dtype)[start:stop][::-1].copy())
    assert np.array_equal(v, t.read_local())
    del v
    comm.barrier()
    t.free()


@pytest.mark.parametrize("ty", TYPES)
def test_writable_local_view_writes_are_gathered_by_every_rank(comm, ty):
    rows, cols = 40 * comm.size + 1, 4
    t = filled(comm, rows, cols, "float32", ty)
    start, stop = t.local_rows
    w = t.local_view(writable=True)
    assert w.flags.writeable and w.base.writable
    w *= -3
    w[:, 0] = np.arange(start, stop)
    comm.barrier()
    ref = values(rows, cols, "float32") * -3
    ref[:, 0] = np.arange(rows)
    assert np.array_equal(t.gather(np.arange(rows)), ref)
    assert np.array_equal(t.read_local(), ref[start:stop])
    del w
    comm.barrier()
    t.free()


def test_local_view_of_an_empty_shard(comm):
    if comm.size == 1:
        pytest.skip("an empty shard needs a second rank")
    part = [0] + [1] * (comm.size - 1)
    for ty in TYPES:
        t = wholemem.Table(comm, comm.size - 1, 5, "int16", ty, partition=part)
        v = t.local_view(writable=True)
        want = (0, 5) if comm.rank == 0 else (1, 5)
        assert v.shape == want and v.dtype == np.int16
        del v
        comm.barrier()
        t.free()


@pytest.mark.parametrize("ty", TYPES)
def test_free_refuses_on_every_rank_while_a_view_lives(comm, ty):
    maps, shm = wholemem_maps(), shm_entries()
    rows, cols = 10 * comm.size, 2
    t = filled(comm, rows, cols, "int32", ty)
    # Rank 0 alone holds views; every rank's free is refused alike.
    views = [t.local_view(), t.local_view(writable=True)[1:]] if comm.rank == 0 else []
    with pytest.raises(ValueError, match="local_view"):
        t.free()
    # Nothing was freed: the table still serves every rank.
    assert np.array_equal(t.gather(np.arange(rows)), values(rows, cols, "int32"))
    if comm.rank == 0:
        assert np.array_equal(views[0], t.read_local())
    kept = views[1:]  # one view left alive on rank 0: still refused
    del views
    with pytest.raises(ValueError, match="rank 0: 1"):
        t.free()
    del kept
    t.free()
    t.free()
    with pytest.raises(ValueError, match="freed"):
        t.local_view()
    assert wholemem_maps() == maps
    assert shm_entries() == shm


def test_local_view_of_a_device_table_is_unsupported(comm):
    if not wholemem.probe(comm)["support"]["distributed/device"]["supported"]:
        pytest.skip("no device tables on this machine")
    t = wholemem.Table(comm, 8 * comm.size, 2, "float32", "distributed", location="device")
    with pytest.raises(NotImplementedError, match="GPU memory"):
        t.local_view()
    t.free()


class DlpackOnly:
    """An input that offers only the DLPack protocol (as a framework's
    tensor does): no buffer protocol, no __array__."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_outputs_and_inputs(comm):
    rows, cols = 200 + comm.size, 6
    t = filled(comm, rows, cols, "float32", "distributed")
    ref = values(rows, cols, "float32")
    ids = np.arange(rows - 1, -1, -3, dtype=np.int64)
    got = t.gather(ids)
    # An output is taken by np.from_dlpack (and so torch.from_dlpack)
    # without a copy: the same memory.
    taken = np.from_dlpack(got)
    assert np.shares_memory(taken, got) and np.array_equal(taken, ref[ids])
    # Ids and rows given through DLPack alone.
    assert not hasattr(DlpackOnly(ids), "__array__")
    assert np.array_equal(t.gather(DlpackOnly(ids)), ref[ids])
    mine = np.array([comm.rank], dtype=np.int64)
    t.scatter(DlpackOnly(mine), DlpackOnly(np.full((1, cols), -1.0 - comm.rank, dtype=np.float32)))
    comm.barrier()
    back = t.gather(np.arange(comm.size, dtype=np.int64))
    assert np.array_equal(back, -1.0 - np.arange(comm.size, dtype=np.float32)[:, None].repeat(cols, 1))
    t.free()
