"""Jobs without MPI: ranks are subprocesses meeting in a directory
(rank= and size=), FileComm for collectives, methods 1 and 2; and a rank
killed during get_batch. Each test starts its own ranks, so these run in
the single-process pytest only."""

import os
import subprocess
import sys

import pytest

from conftest import solo

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(tmp_path, scenario, size, *extra):
    d = tmp_path / "rv"
    d.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "WM_"))}
    procs = [
        subprocess.Popen([sys.executable, os.path.join(HERE, "rank_program.py"), scenario, str(d), str(r), str(size), *map(str, extra)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(size)
    ]
    # The limit guards the test run only; the ranks' own waits are bounded by WM_TIMEOUT_S.
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outs


@solo
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_filecomm(tmp_path, size):
    codes, outs = run_ranks(tmp_path, "filecomm", size)
    assert codes == [0] * size, outs


@solo
@pytest.mark.parametrize("method", [1, 2])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_store_without_mpi(tmp_path, size, method):
    codes, outs = run_ranks(tmp_path, "store", size, method)
    assert codes == [0] * size, outs
    # free() withdrew every published record
    assert [f for f in os.listdir(tmp_path / "rv") if f.startswith("onesided-")] == []


@solo
@pytest.mark.parametrize("size", [2, 3])
def test_rank_killed_during_get_batch(tmp_path, size):
    codes, outs = run_ranks(tmp_path, "killed", size)
    assert codes[-1] == 9, outs[-1]
    for code, out in zip(codes[:-1], outs[:-1]):
        assert code == 3, out  # a WholememError, not a hang and not a crash
        assert "error after" in out and f"rank {size - 1}" in out, out


@solo
@pytest.mark.parametrize("what", ["gather", "get_batch"])
def test_the_benchmark_runs_and_verifies(what):
    """`python -m wholemem.bench` on one rank: it exits non-zero on a wrong row."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "WM_"))}
    args = [sys.executable, "-m", "wholemem.bench", what, "--rows", "3000", "--dim", "8", "--batch", "64", "--iters", "4", "--json"]
    if what == "gather":
        args.append("--profile")
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(p.stdout.strip().splitlines()[-1])
    if what == "gather":
        assert j["gbps_per_rank"]["min"] > 0 and j["us_per_call"]["median"] > 0 and j["baseline_gbps"] > 0
        assert "ids" in j["profile_us_per_call"] and j["huge_pages"] >= 0
    else:
        assert set(j["gbps_per_rank"]) == {"method 0", "method 1", "method 2", "numpy full[ids]"}
        assert all(v["min"] > 0 for v in j["gbps_per_rank"].values())
        # Both sides' huge pages are reported, so the ratio can be read.
        assert set(j["huge_pages_rank0"]) == set(j["gbps_per_rank"])
        assert j["numpy_huge_pages_rank0"] is None or 0 <= j["numpy_huge_pages_rank0"] <= 1
