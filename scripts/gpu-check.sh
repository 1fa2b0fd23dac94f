#!/usr/bin/env bash
# The GPU check: one command on a GPU machine with no Rust toolchain, from
# the bundle that scripts/gpu-bundle.sh built. It fits one command of the
# device tool (10 minutes) with time to spare for a rerun after a fix: every
# part has a time budget, and the budgets add up to at most 540 s.
#
#   scripts/gpu-check.sh [all|correctness|bench] [BUNDLE]
#   scripts/gpu-check.sh --dry-run [all|correctness|bench]
#
# BUNDLE defaults to the directory this script is in when that is a bundle,
# else ./gpu-bundle. --dry-run prints the plan (each part in order, its
# budget and what it runs, the sum) and needs neither a bundle nor a GPU.
# The parts, in order (`correctness`: the first four; `bench`: machine,
# probe, benchmarks, ncu; `all`, the default: every one):
#
#   machine       uname -a, nvidia-smi, nvidia-smi dmon -c 1 (first of all),
#                 the GPUs' facts, compute mode (anything but Default fails:
#                 EXCLUSIVE_PROCESS stops ranks sharing a GPU), libraries,
#                 the bundle's prebuilt kernels
#   probe         wm-bench probe --active on 4 ranks, every device type
#                 required; when it fails there is no usable device and the
#                 check stops at once, saying so
#   kernels       the kernels against the CPU kernels, loaded as users load
#                 them (prebuilt CUBIN, else NVRTC)
#   device-tests  the device test suite, one step per test
#   benchmarks    wm-bench gather and scatter --location device for every
#                 type on 4 ranks (mapped types with --baseline-ranks all),
#                 host tables into device memory, single-rank gather and
#                 scatter; dim 128 f32, 4M rows, 512K ids, 5 timed + 1 warm-up
#   ncu           where Nsight Compute's ncu is installed: the SpeedOfLight
#                 section of one gather kernel (skipped, passing, without)
#
# Everything goes to one log, $OUT/gpu-check.log (the device tool's $OUT;
# BUNDLE/gpu-check.log when OUT is unset), and to stdout; the benchmarks'
# JSON lines also to bench.jsonl beside it. Every step runs under
# `timeout -k 10` and prints its elapsed time; a step its part's budget no
# longer allows is reported as not run. WM_GPU_CHECK_ONLY=REGEX runs only the
# steps whose names match (to rerun what failed); WM_GPU_CHECK_RANKS
# (default 4) sets the ranks; WM_GPU_CHECK_BUDGET_S (default 540) caps the
# whole run. WM_REQUIRE_GPU=1 throughout: a device test that would skip
# fails. Exit status: the number of failed steps; 64 for a usage error or a
# missing bundle.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The plan: parts in order, each one's budget (seconds) and what it runs.
PARTS=(machine probe kernels device-tests benchmarks ncu)
declare -A BUDGET=([machine]=30 [probe]=45 [kernels]=45 [device-tests]=150 [benchmarks]=210 [ncu]=45)
declare -A WHAT=(
  [machine]="uname -a, nvidia-smi, nvidia-smi dmon -c 1; GPUs, driver, compute mode, libraries, bundle kernels"
  [probe]="wm-bench probe --active, every device type required (no usable device: the check stops here)"
  [kernels]="the kernels against the CPU kernels, every conversion pair"
  [device-tests]="the device tests, one step each"
  [benchmarks]="wm-bench gather/scatter --location device, every type; host tables into device memory; one rank"
  [ncu]="ncu SpeedOfLight of one gather kernel, where ncu is installed"
)
LIMIT_S=540

usage() {
  echo "usage: $0 [--dry-run] [all|correctness|bench] [BUNDLE]" >&2
  exit 64
}

dry=
if [ "${1:-}" = --dry-run ]; then
  dry=1
  shift
fi
sel=${1:-all}
case $sel in
  all) parts=("${PARTS[@]}") ;;
  correctness) parts=(machine probe kernels device-tests) ;;
  bench) parts=(machine probe benchmarks ncu) ;;
  *) usage ;;
esac

plan() {
  local p i=0 sum=0
  echo "gpu-check plan ($sel): parts in this order, each with its time budget"
  for p in "${parts[@]}"; do
    i=$((i + 1))
    sum=$((sum + BUDGET[$p]))
    printf '  %d. %-13s %4d s  %s\n' "$i" "$p" "${BUDGET[$p]}" "${WHAT[$p]}"
  done
  printf 'total %d s (limit %d s: one command of at most 10 minutes, with time left in a 15-minute lease to rerun)\n' "$sum" "$LIMIT_S"
}

if [ -n "$dry" ]; then
  plan
  exit 0
fi

if [ -n "${2:-}" ]; then
  bundle=$2
elif [ -x "$here/wm-bench" ]; then
  bundle=$here
else
  bundle=gpu-bundle
fi
b=$(cd "$bundle" 2>/dev/null && pwd) || {
  echo "gpu-check: no bundle at $bundle (build it with scripts/gpu-bundle.sh)" >&2
  exit 64
}
out=${OUT:-$b}

# Everything to one log as well as to stdout: the check runs itself again
# with its output through tee.
if [ -z "${WM_GPU_CHECK_LOG:-}" ]; then
  mkdir -p "$out" || exit 64
  WM_GPU_CHECK_LOG=$out/gpu-check.log "$BASH" "$0" "$sel" "$b" 2>&1 | tee "$out/gpu-check.log"
  exit "${PIPESTATUS[0]}"
fi

# shellcheck source=scripts/gpu-steps.sh
. "$here/gpu-steps.sh"
ranks=${WM_GPU_CHECK_RANKS:-4}
budget=${WM_GPU_CHECK_BUDGET_S:-$LIMIT_S}
export WM_TEST_BIN_DIR=$b WM_REQUIRE_GPU=1 WM_KERNEL_CACHE=$b/kernels
echo "gpu-check $sel: bundle $b, log $WM_GPU_CHECK_LOG, budget $budget s, $ranks ranks"
steps_begin "$budget" "$b" "${WM_GPU_CHECK_ONLY:-}"
start=$SECONDS

# NCCL ships as libnccl.so.2; cudarc looks for libnccl.so.
nccl_dirs() {
  echo /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/lib64
  python3 -c 'import nvidia.nccl as n; print(" ".join(p + "/lib" for p in n.__path__))' 2>/dev/null
}
for d in $(nccl_dirs); do
  if [ -e "$d/libnccl.so.2" ] && [ ! -e "$d/libnccl.so" ]; then
    mkdir -p "$b/lib" && ln -sf "$d/libnccl.so.2" "$b/lib/libnccl.so"
    export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    break
  fi
done

machine() {
  echo "\$ uname -a"
  uname -a
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi: not found (no NVIDIA driver tools on this machine)"
    return 1
  fi
  echo "\$ nvidia-smi"
  nvidia-smi
  echo "\$ nvidia-smi dmon -c 1"
  timeout 10 nvidia-smi dmon -c 1 || echo "(nvidia-smi dmon: not available here)"
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,memory.used,compute_mode --format=csv || return 1
  nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/driver CUDA version: \1/p'
  echo "libraries: $(ldconfig -p 2>/dev/null | grep -oE 'lib(cuda|nvrtc|nccl)\.so[.0-9]*' | sort -u | tr '\n' ' ')"
  echo "bundle kernels: $(ls "$b/kernels" 2>/dev/null | tr '\n' ' ')"
  echo "cores: $(nproc)"
  local modes
  modes=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | sort -u)
  if [ "$modes" != "Default" ]; then
    echo "compute mode '$modes': ranks sharing a GPU need Default (EXCLUSIVE_PROCESS allows one process per GPU)" >&2
    return 1
  fi
}

# One benchmark: its JSON line printed and kept; passes when it exits 0 and
# the rows it moved verify.
bench_one() {
  local line rc
  line=$("$b/wm-bench" "$@" --dim 128 --batch 524288 --iters 5 --warmup 1 --json)
  rc=$?
  printf '%s\n' "$line"
  printf '%s\n' "$line" >>"$out/bench.jsonl"
  [ "$rc" -eq 0 ] && grep -q '"verified":true' <<<"$line"
}

# Nsight Compute, where installed: PATH, then the usual install places.
find_ncu() {
  command -v ncu 2>/dev/null && return 0
  local c
  for c in /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -x "$c" ] && echo "$c" && return 0
  done
  return 1
}

ncu_gather() {
  local ncu
  if ! ncu=$(find_ncu); then
    echo "ncu: not installed here (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute): no kernel timing"
    return 0
  fi
  "$ncu" --section SpeedOfLight -k regex:wm_gather -c 1 "$b/wm-bench" gather --location device --type continuous \
    --ranks 1 --rows 4194304 --dim 128 --batch 524288 --iters 1 --warmup 0
}

# The benchmarks' table, from their JSON lines.
bench_table() {
  [ -s "$out/bench.jsonl" ] || return 0
  printf '\nbenchmarks (GB/s; per rank: median of the calls, or of a step with every rank on the baseline):\n'
  python3 - "$out/bench.jsonl" <<'EOF' || cat "$out/bench.jsonl"
import json, sys
print("%-8s %-12s %-15s %5s %9s %9s %9s %9s %7s %s" % ("op", "type", "table->output", "ranks", "per rank", "all", "base", "base all", "ratio", "verified"))
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    per = j.get("step_gbps_per_rank", j["gbps_per_rank"]["median"])
    total = j.get("step_gbps_total", j["gbps_total"])
    base_all = j.get("baseline_gbps_total", j["baseline_gbps"])
    print("%-8s %-12s %-15s %5d %9.2f %9.2f %9.2f %9.2f %7.3f %s (baseline %s)" % (
        j["op"], j["type"], j["location"] + "->" + j["out_location"], j["ranks"], per, total,
        j["baseline_gbps"], base_all, j["ratio"], j["verified"], j["baseline_ranks"]))
EOF
}
# Steps that are shell functions run in a child bash (see gpu-steps.sh).
export -f machine bench_one find_ncu ncu_gather
export b out

run_part() {
  local p=$1 t op ty
  steps_part "$p" "${BUDGET[$p]}"
  case $p in
    machine) step "machine" 30 machine ;;
    probe)
      export WM_TIMEOUT_S=${WM_GPU_CHECK_TIMEOUT_S:-60}
      step "probe --active, $ranks ranks" 45 "$b/wm-run" -n "$ranks" -- "$b/wm-bench" probe --active \
        --require continuous:device,chunked:device,distributed:device,hierarchy:device
      ;;
    kernels) step "kernels against the CPU kernels" 45 "$b/kernel-tests" cuda::gpu_check --test-threads=1 --nocapture ;;
    device-tests)
      for t in device_memory_of_every_type_fills_and_reads_back_on_1_to_4_ranks \
        device_gather_and_scatter_match_the_reference_on_1_to_4_ranks \
        device_buffers_gather_and_scatter_checked_and_deduplicated_on_the_device_on_1_to_4_ranks \
        device_hierarchy_and_distributed_cross_simulated_nodes \
        device_tables_store_and_load_sharded_files_on_1_to_4_ranks \
        device_embeddings_train_like_the_reference_on_1_to_4_ranks \
        device_caches_of_host_rows_train_like_no_cache_on_2_ranks_and_2_nodes \
        device_tables_are_read_one_sidedly_through_a_host_mirror_on_1_to_4_ranks; do
        step "device test $t" 60 "$b/device-tests" "$t" --exact --test-threads=1 --nocapture
      done
      ;;
    benchmarks)
      export WM_TIMEOUT_S=${WM_GPU_CHECK_TIMEOUT_S:-120}
      : >"$out/bench.jsonl"
      for ty in continuous chunked; do
        step "gather $ty device, $ranks ranks, every rank on the baseline" 40 \
          bench_one gather --location device --type "$ty" --ranks "$ranks" --rows 4194304 --baseline-ranks all
      done
      for ty in distributed hierarchy; do
        step "gather $ty device, $ranks ranks" 40 bench_one gather --location device --type "$ty" --ranks "$ranks" --rows 4194304
      done
      for ty in continuous chunked distributed hierarchy; do
        step "scatter $ty device, $ranks ranks" 40 bench_one scatter --location device --type "$ty" --ranks "$ranks" --rows 4194304
      done
      for ty in continuous chunked; do
        step "gather $ty host table into device memory, $ranks ranks, every rank on the baseline" 40 \
          bench_one gather --location host --out-location device --type "$ty" --ranks "$ranks" --rows 4194304 --baseline-ranks all
      done
      for op in gather scatter; do
        step "$op continuous device, 1 rank" 30 bench_one "$op" --location device --type continuous --ranks 1 --rows 4194304
      done
      bench_table
      ;;
    ncu) step "ncu: one gather kernel" 30 ncu_gather ;;
  esac
}

for i in "${!parts[@]}"; do
  run_part "${parts[$i]}"
  if [ "${parts[$i]}" = probe ] && { [ "$STEPS_LAST" = FAIL ] || [ "$STEPS_LAST" = "NOT RUN" ]; }; then
    steps_stop "no usable device: the probe failed (its output above says why), and the later parts need one" "${parts[@]:$((i + 1))}"
    break
  fi
done
steps_summary
failed=$?
echo "gpu-check $sel: $((SECONDS - start)) s in all; log $WM_GPU_CHECK_LOG"
exit "$failed"
