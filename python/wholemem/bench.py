"""Benchmarks of the Python face, each verified and beside a baseline from
the same run.

    mpirun -np 2 python -m wholemem.bench get_batch [--rows 4194304] [--dim 128] [--batch 8192] [--iters 20] [--warmup 3]
    mpirun -np 2 python -m wholemem.bench gather [--type distributed] [--rows 4194304] [--batch 8192] [--iters 20]

``get_batch``: every rank adds its shard of a float32 table to a PyDDStore,
then for each method times ``iters`` batches of random ids after
``warmup`` untimed ones (3, as ``wm-bench``: the first calls on a fresh
store grow the exchange's buffers, and one warm-up batch left method 0
at 1.03-1.10 of numpy where three gave 1.14-1.18), verifies every row
moved, and prints GB/s per rank beside
``full[ids]`` (``np.take``) over a private copy of the whole table, every
rank at once. Both sides' huge-page fractions are printed: wholemem's
tables are built from huge pages, numpy's array gets transparent huge
pages, so the comparison is of the copies, not of TLB reach.

``gather``: ``Table.gather`` as ``wm-bench gather`` runs ``wm_gather::gather``
(same table type, shape, id type and timing: a barrier, then the call alone
is timed), so the two compare side by side; the baseline is ``np.take`` of
the same batches from a private copy, run by rank 0 alone after each batch
while the others wait (``wm-bench``'s ``--baseline-ranks one``). Prints GB/s
per rank, microseconds per call and the ratio to the baseline; ``--json``
prints one JSON object instead.

In both, every timed call is preceded by wholemem's barrier (untimed), so
a rank's time is its call, not its wait for a rank still verifying the
last batch (Open MPI's Barrier, which polls, can leave ranks milliseconds
apart on a machine with more busy processes than cores).
``gather`` also runs under ``wm-run`` (without MPI), and without mpi4py or
a launcher as a job of one rank.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _values(ids, dim):
    """Row ``r`` holds ``r + c·1e-3`` in column ``c`` (float32): a permuted
    row or column cannot pass."""
    return ids.astype(np.float32)[:, None] + np.arange(dim, dtype=np.float32)[None, :] * np.float32(1e-3)


def _spread(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def _huge_fraction(arr):
    """Fraction of ``arr``'s bytes this process maps with transparent huge
    pages (``AnonHugePages`` of every mapping it overlaps, from
    ``/proc/self/smaps``; numpy asks for them with ``MADV_HUGEPAGE`` on
    large arrays), or ``None`` where that file cannot be read."""
    lo, hi = arr.ctypes.data, arr.ctypes.data + arr.nbytes
    huge, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start < hi and end > lo
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1]) * 1024
    except OSError:
        return None
    return min(1.0, huge / max(1, arr.nbytes))


def _world():
    """``(mpi4py communicator or None, wholemem Comm)``."""
    import os

    import wholemem

    if "WM_RANK" in os.environ:  # started by wm-run: no MPI
        return None, wholemem.Comm.from_env()
    try:
        from mpi4py import MPI
    except ImportError:
        return None, wholemem.Comm.from_env()
    return MPI.COMM_WORLD, wholemem.Comm.from_mpi4py(MPI.COMM_WORLD)


def _gathered(comm, job, obj):
    """Every rank's ``obj`` at every rank."""
    if comm is not None:
        return comm.allgather(obj)
    return [json.loads(b) for b in job.allgather_bytes(json.dumps(obj).encode())]


def gather(a):
    import wholemem

    comm, job = _world()
    rank, size = job.rank, job.size
    t = wholemem.Table(job, a.rows, a.dim, "float32", a.type)
    lo, hi = t.local_rows
    for first in range(lo, hi, 1 << 18):  # fill in slices: no second copy of the shard
        last = min(hi, first + (1 << 18))
        t.write_rows_bytes(first, _values(np.arange(first, last), a.dim))
    job.barrier()
    huge = t.huge_pages
    id_dtype = np.int32 if a.ids == "i32" else np.int64
    rng = np.random.default_rng([a.seed, rank])
    out = np.empty((a.batch, a.dim), np.float32)
    full = _values(np.arange(a.rows), a.dim) if rank == 0 else None
    base_out = np.empty_like(out)
    calls, base = [], []
    for b in range(a.warmup + a.iters):
        if a.profile and b == a.warmup:
            wholemem.profile_record()
        ids = rng.integers(0, a.rows, a.batch).astype(id_dtype)
        job.barrier()
        t0 = time.perf_counter()
        t.gather(ids, out)
        dt = time.perf_counter() - t0
        if not np.array_equal(out, _values(ids, a.dim)):
            sys.exit(f"rank {rank}: batch {b} gathered wrong rows")
        job.barrier()
        if full is not None:
            t0 = time.perf_counter()
            np.take(full, ids, axis=0, out=base_out)
            bt = time.perf_counter() - t0
            if not np.array_equal(base_out, out):
                sys.exit(f"baseline batch {b} took wrong rows")
        if b >= a.warmup:
            calls.append(dt)
            if full is not None:
                base.append(bt)
    profile = wholemem.profile_take() if a.profile else {"calls": 0, "phases": {}}
    t.free()
    gb = a.batch * a.dim * 4 / 1e9
    mine = {"gbps": gb * len(calls) / sum(calls), "us_per_call": statistics.median(calls) * 1e6, "huge_pages": huge,
            "phases_us": {k: v / max(1, profile["calls"]) * 1e6 for k, v in profile["phases"].items()}}
    every = _gathered(comm, job, mine)
    if rank != 0:
        return
    per_rank = _spread([e["gbps"] for e in every])
    us = _spread([e["us_per_call"] for e in every])
    baseline = gb * len(base) / sum(base)
    report = {"bench": "python gather", "type": a.type, "ranks": size, "rows": a.rows, "dim": a.dim, "batch": a.batch,
              "ids": a.ids, "iters": a.iters, "gbps_per_rank": per_rank, "us_per_call": us,
              "baseline_gbps": baseline, "baseline_is": "np.take from a private copy, rank 0 alone",
              "ratio": per_rank["median"] / baseline, "huge_pages": every[0]["huge_pages"]}
    if a.profile:
        report["profile_us_per_call"] = {k: _spread([e["phases_us"].get(k, 0.0) for e in every])
                                         for k in every[0]["phases_us"]}
    if a.json:
        print(json.dumps(report))
        return
    print(f"python gather: {a.type} host, {a.rows}x{a.dim} f32, {a.ids} ids, batch {a.batch}, {a.iters} batches, "
          f"{size} ranks (every row verified)")
    print(f"  per rank GB/s   min {per_rank['min']:.2f}   median {per_rank['median']:.2f}   max {per_rank['max']:.2f}")
    print(f"  us per call     min {us['min']:.1f}   median {us['median']:.1f}   max {us['max']:.1f}")
    print(f"  baseline GB/s   {baseline:.2f}   ({report['baseline_is']})")
    print(f"  ratio           {report['ratio']:.2f}")
    print(f"  huge pages      {report['huge_pages']:.0%} of the table rank 0 maps")
    for k, v in report.get("profile_us_per_call", {}).items():
        print(f"  phase {k:12s} us per call  min {v['min']:.1f}   median {v['median']:.1f}   max {v['max']:.1f}")


def get_batch(a):
    from mpi4py import MPI

    import wholemem
    from wholemem import pyddstore

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # The barrier before each timed call is wholemem's, as wm-bench's: on a
    # machine with more busy processes than cores, Open MPI's polling
    # Barrier can leave the ranks milliseconds apart, which a collective
    # call (method 0) would then count as its own time.
    job = wholemem.Comm.from_mpi4py(comm)
    per = -(-a.rows // size)
    lo, hi = min(rank * per, a.rows), min((rank + 1) * per, a.rows)
    rows = _values(np.arange(lo, hi), a.dim)
    rng = np.random.default_rng([a.seed, rank])
    batches = [rng.integers(0, a.rows, a.batch) for _ in range(a.warmup + a.iters)]
    out = np.empty((a.batch, a.dim), np.float32)
    gb = a.batch * a.dim * 4 / 1e9
    results, huge = {}, {}
    for m in map(int, a.methods.split(",")):
        hd = a.handshake_dir
        if m == 2 and not hd:
            import tempfile

            hd = comm.bcast(tempfile.mkdtemp(prefix="wm-bench-") if rank == 0 else None, 0)
        s = pyddstore.PyDDStore(comm, method=m, handshake_dir=hd if m == 2 else "")
        s.add("x", rows)
        huge[f"method {m}"] = s._vars["x"].table.huge_pages
        comm.Barrier()
        times = []
        for i, ids in enumerate(batches):
            job.barrier()
            t0 = time.perf_counter()
            s.get_batch("x", out, ids)
            dt = time.perf_counter() - t0
            if not np.array_equal(out, _values(ids, a.dim)):
                sys.exit(f"method {m}: batch {i} moved wrong rows")
            if i >= a.warmup:
                times.append(dt)
        s.free()
        results[f"method {m}"] = gb * len(times) / sum(times)
    del rows
    full = _values(np.arange(a.rows), a.dim)
    huge["numpy full[ids]"] = _huge_fraction(full)
    times = []
    for i, ids in enumerate(batches):
        job.barrier()
        t0 = time.perf_counter()
        np.take(full, ids, axis=0, out=out)
        dt = time.perf_counter() - t0
        if not np.array_equal(out, _values(ids, a.dim)):
            sys.exit(f"numpy: batch {i} took wrong rows")
        if i >= a.warmup:
            times.append(dt)
    results["numpy full[ids]"] = gb * len(times) / sum(times)
    every = comm.gather(results, 0)
    if rank != 0:
        return
    numpy_median = statistics.median(r["numpy full[ids]"] for r in every)
    if a.json:
        print(json.dumps({"bench": "python get_batch", "ranks": size, "rows": a.rows, "dim": a.dim, "batch": a.batch,
                          "iters": a.iters, "gbps_per_rank": {k: _spread([r[k] for r in every]) for k in results},
                          "numpy_gbps_median": numpy_median, "huge_pages_rank0": huge,
                          "numpy_huge_pages_rank0": huge["numpy full[ids]"]}))
        return
    print(f"get_batch {a.rows}x{a.dim} f32, batch {a.batch}, {a.iters} batches, {size} ranks "
          f"(GB/s per rank: min / median / max; ratio: median over numpy's median)")
    for k in results:
        s = _spread([r[k] for r in every])
        pages = f"   huge pages {huge[k]:.0%}" if huge.get(k) is not None else ""
        print(f"  {k:16s} {s['min']:7.2f} / {s['median']:7.2f} / {s['max']:7.2f}   {s['median'] / numpy_median:5.2f}{pages}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m wholemem.bench")
    p.add_argument("what", choices=["get_batch", "gather"])
    p.add_argument("--rows", type=int, default=4194304)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.add_argument("--methods", default="0,1,2", help="get_batch: the PyDDStore methods")
    p.add_argument("--handshake-dir", default="", help="get_batch: method 2's directory (default: a fresh one)")
    p.add_argument("--type", default="distributed", help="gather: continuous, chunked, distributed or hierarchy")
    p.add_argument("--ids", choices=["i32", "i64"], default="i64", help="gather: the ids' integer type")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first (get_batch: of each method and numpy)")
    p.add_argument("--profile", action="store_true", help="gather: the time of each phase per call (wm_gather::profile)")
    a = p.parse_args(argv)
    if a.rows <= 0 or a.dim <= 0 or a.batch <= 0 or a.iters <= 0:
        p.error("--rows, --dim, --batch and --iters must be positive")
    (gather if a.what == "gather" else get_batch)(a)


if __name__ == "__main__":
    main()
