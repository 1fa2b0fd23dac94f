"""``python -m wholemem.bench get_batch``: PyDDStore get_batch by method
against numpy fancy indexing of the same rows, in the same run.

    mpirun -np 2 python -m wholemem.bench get_batch [--rows 4194304] [--dim 128] [--batch 8192] [--iters 20]

Every rank adds its shard of a float32 table, then for each method times
``iters`` batches of random ids (after one warm-up), verifies every row
moved, and prints GB/s per rank beside ``full[ids]`` over a private copy of
the rows.
"""

import argparse
import sys
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m wholemem.bench")
    p.add_argument("what", choices=["get_batch"])
    p.add_argument("--rows", type=int, default=4194304)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--methods", default="0,1,2")
    p.add_argument("--handshake-dir", default="")
    a = p.parse_args(argv)
    from mpi4py import MPI

    from wholemem import pyddstore

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    per = -(-a.rows // size)
    lo, hi = min(rank * per, a.rows), min((rank + 1) * per, a.rows)
    rows = np.arange(lo, hi, dtype=np.float32)[:, None] + np.arange(a.dim, dtype=np.float32)[None, :] * 1e-3
    expect = lambda ids: ids.astype(np.float32)[:, None] + np.arange(a.dim, dtype=np.float32)[None, :] * 1e-3  # noqa: E731
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, a.rows, a.batch) for _ in range(a.iters + 1)]
    out = np.empty((a.batch, a.dim), np.float32)
    gb = a.batch * a.dim * 4 / 1e9
    results = {}
    for m in map(int, a.methods.split(",")):
        hd = a.handshake_dir
        if m == 2 and not hd:
            import tempfile

            hd = comm.bcast(tempfile.mkdtemp(prefix="wm-bench-") if rank == 0 else None, 0)
        s = pyddstore.PyDDStore(comm, method=m, handshake_dir=hd if m == 2 else "")
        s.add("x", rows)
        comm.Barrier()
        times = []
        for i, ids in enumerate(batches):
            t0 = time.perf_counter()
            s.get_batch("x", out, ids)
            dt = time.perf_counter() - t0
            if not np.array_equal(out, expect(ids)):
                sys.exit(f"method {m}: batch {i} moved wrong rows")
            if i:
                times.append(dt)
        s.free()
        results[f"method {m}"] = gb * len(times) / sum(times)
    full = np.arange(a.rows, dtype=np.float32)[:, None] + np.arange(a.dim, dtype=np.float32)[None, :] * 1e-3
    times = []
    for i, ids in enumerate(batches):
        t0 = time.perf_counter()
        np.take(full, ids, axis=0, out=out)
        if i:
            times.append(time.perf_counter() - t0)
    results["numpy full[ids]"] = gb * len(times) / sum(times)
    every = comm.gather(results, 0)
    if rank == 0:
        print(f"get_batch {a.rows}x{a.dim} f32, batch {a.batch}, {a.iters} batches, {size} ranks (GB/s per rank: min / max)")
        for k in results:
            v = [r[k] for r in every]
            print(f"  {k:16s} {min(v):7.2f} / {max(v):7.2f}")


if __name__ == "__main__":
    main()
