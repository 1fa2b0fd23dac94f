"""One rank of a job without MPI, started by test_nompi.py:
``python rank_program.py SCENARIO DIR RANK SIZE [METHOD]``. Exits 0 when its
checks pass; prints what went wrong otherwise."""

import os
import sys

import numpy as np

from wholemem import pyddstore

sys.path.insert(0, os.path.dirname(__file__))
from conftest import shard_counts, values  # noqa: E402

scenario, d, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
method = int(sys.argv[5]) if len(sys.argv) > 5 else 2
fc = pyddstore.FileComm(d, rank, size, "fc")

if scenario == "filecomm":
    got = fc.allgather({"rank": rank, "sq": rank * rank})
    assert got == [{"rank": r, "sq": r * r} for r in range(size)], got
    for i in range(5):
        fc.barrier()
        assert fc.allgather(i * 10 + rank) == [i * 10 + r for r in range(size)]
    print("ok")

elif scenario == "store":
    s = pyddstore.PyDDStore(None, method=method, handshake_dir=d, rank=rank, size=size)
    for dtype in ("int32", "int64", "uint8", "float32", "float64", "bool"):
        total, disp = 97, 3
        counts = shard_counts(total, size)
        lo = sum(counts[:rank])
        full = values(total, disp, dtype)
        s.add(dtype, np.ascontiguousarray(full[lo: lo + counts[rank]]))
        assert s.info(dtype) == (total, disp, np.dtype(dtype).itemsize)
        idx = np.random.default_rng(rank).integers(0, total, 64)
        out = np.zeros((64, disp), dtype)
        s.get_batch(dtype, out, idx)
        assert out.tobytes() == full[idx].tobytes(), dtype
        s.get(dtype, out[:4], total - 4)
        assert out[:4].tobytes() == full[total - 4:].tobytes()
        try:
            s.get_batch(dtype, out[:1], [total])
            raise AssertionError("no IndexError")
        except IndexError:
            pass
    fc.barrier()
    s.free()
    print("ok")

elif scenario == "killed":
    # Every rank reads collectively (method 0) until the last rank dies.
    os.environ["WM_TIMEOUT_S"] = "10"
    s = pyddstore.PyDDStore(None, method=0, handshake_dir=d, rank=rank, size=size)
    s.add("x", np.full((100, 16), rank, np.float32))
    out = np.zeros((256, 16), np.float32)
    idx = np.arange(256) * 7 % (100 * size)
    for i in range(1_000_000):
        if rank == size - 1 and i == 20:
            os._exit(9)
        try:
            s.get_batch("x", out, idx)
        except Exception as e:  # the survivors: an error, not a hang
            print(f"error after {i} batches: {type(e).__name__}: {e}")
            sys.exit(3 if isinstance(e, pyddstore._wm.WholememError) else 4)
    sys.exit(5)
