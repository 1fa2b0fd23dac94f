#!/usr/bin/env bash
# The GPU check: runs on a GPU machine with no Rust toolchain, from the
# bundle that scripts/gpu-bundle.sh built (default ./gpu-bundle). Two parts,
# one command each, each estimated at under 6 minutes on one H200 with 4
# ranks (docs/device.md, "The GPU check"):
#
#   scripts/gpu-check.sh correctness [BUNDLE]
#     1. what the machine has: GPUs, driver and its CUDA version, compute
#        mode (EXCLUSIVE_PROCESS would stop ranks sharing a GPU), NVRTC and
#        NCCL libraries, the bundle's prebuilt kernels;
#     2. wm-bench probe --active, 4 ranks: every type on the device;
#     3. the kernels against the CPU kernels (every conversion pair), loaded
#        as users load them (prebuilt CUBIN, else NVRTC);
#     4. the device test suite, one step per test, 1 to 4 ranks sharing the
#        GPU(s);
#   scripts/gpu-check.sh bench [BUNDLE]
#     wm-bench gather and scatter --location device for every type (dim 128
#     f32, 4M rows, batches of 512K ids, 5 timed + 1 warm-up), beside the
#     same-run device-to-device copy; gathers of a host table (registered
#     with CUDA) into device memory beside a copy over the host link; one
#     single-rank gather.
#   scripts/gpu-check.sh all [BUNDLE]   both, one after the other
#
# Every step runs under `timeout -k 10` and prints its elapsed time; a
# timed-out step is named as such. The part as a whole keeps within
# WM_GPU_CHECK_BUDGET_S seconds (default 540, under the 10 minutes one
# command may run): steps the budget no longer allows are reported as not
# run. WM_GPU_CHECK_ONLY=REGEX runs only the steps whose names match (to
# rerun what failed); WM_GPU_CHECK_RANKS (default 4) sets the ranks.
# WM_REQUIRE_GPU=1 throughout: a device test that would skip fails.
# Exit status: the number of failed steps.
set -uo pipefail
part=${1:-}
case $part in
  correctness | bench | all) ;;
  *)
    echo "usage: $0 correctness|bench|all [BUNDLE]" >&2
    exit 2
    ;;
esac
b=$(cd "${2:-gpu-bundle}" && pwd) || exit 2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu-steps.sh
. "$here/gpu-steps.sh"
ranks=${WM_GPU_CHECK_RANKS:-4}
budget=${WM_GPU_CHECK_BUDGET_S:-540}
[ "$part" = all ] && budget=$((2 * budget))
export WM_TEST_BIN_DIR=$b WM_REQUIRE_GPU=1 WM_KERNEL_CACHE=$b/kernels
steps_begin "$budget" "$b" "${WM_GPU_CHECK_ONLY:-}"
start=$SECONDS

# NCCL ships as libnccl.so.2; cudarc looks for libnccl.so.
for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/lib64 $(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null); do
  if [ -e "$d/libnccl.so.2" ] && [ ! -e "$d/libnccl.so" ]; then
    mkdir -p "$b/lib" && ln -sf "$d/libnccl.so.2" "$b/lib/libnccl.so"
    export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    break
  fi
done

machine() {
  nvidia-smi -L || return 1
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,memory.used,compute_mode --format=csv || return 1
  nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/driver CUDA version: \1/p'
  echo "libraries: $(ldconfig -p 2>/dev/null | grep -oE 'lib(cuda|nvrtc|nccl)\.so[.0-9]*' | sort -u | tr '\n' ' ')"
  echo "bundle kernels: $(ls "$b/kernels" | tr '\n' ' ')"
  nproc
  local modes
  modes=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | sort -u)
  if [ "$modes" != "Default" ]; then
    echo "compute mode '$modes': ranks sharing a GPU need Default (EXCLUSIVE_PROCESS allows one process per GPU)" >&2
    return 1
  fi
}

correctness() {
  export WM_TIMEOUT_S=${WM_TIMEOUT_S:-60}
  step "machine" 30 machine
  step "probe --active, $ranks ranks" 90 "$b/wm-run" -n "$ranks" -- "$b/wm-bench" probe --active \
    --require continuous:device,chunked:device,distributed:device,hierarchy:device
  step "kernels against the CPU kernels" 120 "$b/kernel-tests" cuda::gpu_check --test-threads=1 --nocapture
  local t
  for t in device_memory_of_every_type_fills_and_reads_back_on_1_to_4_ranks \
    device_gather_and_scatter_match_the_reference_on_1_to_4_ranks \
    device_buffers_gather_and_scatter_checked_and_deduplicated_on_the_device_on_1_to_4_ranks \
    device_hierarchy_and_distributed_cross_simulated_nodes \
    device_tables_store_and_load_sharded_files_on_1_to_4_ranks \
    device_embeddings_train_like_the_reference_on_1_to_4_ranks \
    device_caches_of_host_rows_train_like_no_cache_on_2_ranks_and_2_nodes \
    device_tables_are_read_one_sidedly_through_a_host_mirror_on_1_to_4_ranks; do
    step "device test $t" 100 "$b/device-tests" "$t" --exact --test-threads=1 --nocapture
  done
}

# One benchmark, its JSON line kept; passes when the rows it moved verify.
bench_one() {
  "$b/wm-bench" "$@" --dim 128 --batch 524288 --iters 5 --warmup 1 --json | tee -a "$b/bench.jsonl" | grep -q '"verified":true'
}

bench() {
  export WM_TIMEOUT_S=${WM_TIMEOUT_S:-120}
  local op ty
  : >"$b/bench.jsonl"
  for op in gather scatter; do
    for ty in continuous chunked distributed hierarchy; do
      step "$op $ty device, $ranks ranks, 512K ids" 60 bench_one "$op" --location device --type "$ty" --ranks "$ranks" --rows 4194304
    done
  done
  for ty in continuous chunked; do
    step "gather $ty host table into device memory, $ranks ranks, 512K ids" 60 \
      bench_one gather --location host --out-location device --type "$ty" --ranks "$ranks" --rows 4194304
  done
  step "gather chunked device, 1 rank, 512K ids" 45 bench_one gather --location device --type chunked --ranks 1 --rows 4194304
  printf '\nbenchmarks (op type table->output ranks: per-rank median GB/s, baseline GB/s, ratio):\n'
  sed -n 's/.*"baseline_gbps":\([0-9.e+-]*\).*"median":\([0-9.e+-]*\).*"location":"\([a-z]*\)".*"op":"\([a-z]*\)".*"out_location":"\([a-z]*\)".*"ranks":\([0-9]*\).*"ratio":\([0-9.e+-]*\).*"type":"\([a-z]*\)".*"verified":\([a-z]*\).*/\4 \8 \3->\5 \6: \2, \1, \7 (verified \9)/p' "$b/bench.jsonl"
}
# Steps that are shell functions run in a child bash (see gpu-steps.sh).
export -f machine bench_one
export b

case $part in
  correctness) correctness ;;
  bench) bench ;;
  all)
    correctness
    bench
    ;;
esac
steps_summary
failed=$?
echo "gpu-check $part: $((SECONDS - start)) s in all"
exit "$failed"
