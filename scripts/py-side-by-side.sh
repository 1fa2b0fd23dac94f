#!/usr/bin/env bash
# Method 0 of the Python face beside the Rust it calls, interleaved (issue 34):
# each round runs `wm-bench gather --type distributed` (its own launcher,
# ranks unbound), `python -m wholemem.bench gather` and `python -m
# wholemem.bench get_batch` (methods 0/1/2 and numpy's np.take in the same
# run) under `mpirun --bind-to none` (the same placement as wm-bench's
# ranks: Open MPI binds each rank to one core by default at 2 ranks, which
# on a shared machine slows either side alike), and appends one JSON line
# per run to OUT.
#
#   scripts/py-side-by-side.sh OUT [ROUNDS] [ROWS] [BATCH] [ITERS] [NP]
#
# Needs: wm-bench built in release ($WM_BENCH, default
# $CARGO_TARGET_DIR/release/wm-bench), `python` with the wheel, numpy and
# mpi4py, and mpirun. Summarise with scripts/py-side-by-side.py OUT.
set -euo pipefail
out="$1"; rounds="${2:-5}"; rows="${3:-4194304}"; batch="${4:-8192}"; iters="${5:-20}"; np="${6:-2}"
wb="${WM_BENCH:-${CARGO_TARGET_DIR:-target}/release/wm-bench}"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np")
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    "$wb" gather --type distributed --ranks "$np" --rows "$rows" --batch "$batch" --iters "$iters" --json \
        | sed "s/^{/{\"round\":$r,\"bench\":\"wm-bench gather\",/" >>"$out"
    "${mpi[@]}" python -m wholemem.bench gather --rows "$rows" --batch "$batch" --iters "$iters" --json \
        | sed "s/^{/{\"round\":$r,/" >>"$out"
    "${mpi[@]}" python -m wholemem.bench get_batch --rows "$rows" --batch "$batch" --iters "$iters" --json \
        | sed "s/^{/{\"round\":$r,/" >>"$out"
done
