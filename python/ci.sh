#!/usr/bin/env bash
# CI lane of the Python face (issue 34): a fresh venv, the wheel built once
# with maturin, installed with numpy, mpi4py (built against the system's
# Open MPI) and pytest; pytest on one process, then under mpirun at 2, 3
# and 4 ranks.
#
#   python/ci.sh            # from anywhere; needs python3 (>= 3.9) with venv,
#                           # a Rust toolchain, mpicc/mpirun (libopenmpi-dev)
#
# Environment: PYTHON (default python3), CARGO_TARGET_DIR (reused when
# set), WM_CI_VENV (default: a fresh temporary directory, removed at exit),
# PIP_ARGS (extra pip arguments, e.g. an index mirror).
# Time on a 2-core machine with warm Rust dependencies: about 4 minutes
# (wheel 1-2 min, mpi4py build 1 min on first use, tests 1.5 min).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
venv="${WM_CI_VENV:-$(mktemp -d /tmp/wm-py-ci.XXXXXX)}"
[[ -n "${WM_CI_VENV:-}" ]] || trap 'rm -rf "$venv"' EXIT
start=$SECONDS
step() { printf '\n== %s (%ds)\n' "$*" $((SECONDS - start)); }

step "fresh venv in $venv"
"$py" -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install -q ${PIP_ARGS:-} --upgrade pip
python -m pip install -q ${PIP_ARGS:-} "maturin>=1.5,<2" numpy pytest mpi4py

step "build the wheel once"
wheels="$venv/wheels"
maturin build --release --manifest-path "$here/Cargo.toml" --out "$wheels" --interpreter "$(command -v python)"
python -m pip install -q ${PIP_ARGS:-} --no-index --find-links "$wheels" wholemem

step "import time"
python - <<'PY'
import subprocess, sys, time
t = []
for _ in range(5):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import wholemem, wholemem.pyddstore"], check=True)
    t.append(time.perf_counter() - t0)
base = []
for _ in range(5):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numpy"], check=True)
    base.append(time.perf_counter() - t0)
print(f"python -c 'import wholemem, wholemem.pyddstore': best {min(t)*1e3:.0f} ms (python -c 'import numpy': best {min(base)*1e3:.0f} ms)")
PY

cd "$here/tests"   # the installed wheel is tested, not the source tree
export WM_TIMEOUT_S="${WM_TIMEOUT_S:-30}"
step "pytest, one process"
python -m pytest -q --color=no -p no:cacheprovider .
for n in 2 3 4; do
    step "mpirun -np $n pytest"
    mpirun --allow-run-as-root --oversubscribe -np "$n" python -m pytest -q --color=no -p no:cacheprovider test_core.py test_pyddstore.py test_embedding.py test_graph.py
done
step "python lane passed"
