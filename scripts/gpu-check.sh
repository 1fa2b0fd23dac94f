#!/usr/bin/env bash
# The GPU check: runs on a GPU machine with no Rust toolchain, from the
# bundle that scripts/gpu-bundle.sh built (default ./gpu-bundle):
#
#   1. what the machine has (nvidia-smi, wm-bench probe --active);
#   2. the kernels against the CPU kernels (every conversion pair), and the
#      device test suite, both with WM_REQUIRE_GPU=1 (a missing GPU fails
#      instead of skipping), 1 to 4 ranks sharing the GPU(s);
#   3. wm-bench gather and scatter --location device for every type, dim 128
#      f32, batches of 1M ids, beside the same-run device-to-device copy; and
#      gathers of a host table (registered with CUDA) into device memory,
#      beside a copy of the same bytes over the host link;
#   4. a summary, one line per step.
#
#   scripts/gpu-check.sh [BUNDLE]      (exit status: the number of failed steps)
set -uo pipefail
b=$(cd "${1:-gpu-bundle}" && pwd)
export WM_TEST_BIN_DIR=$b WM_REQUIRE_GPU=1 WM_KERNEL_CACHE=$b/kernels WM_TIMEOUT_S=${WM_TIMEOUT_S:-120}
ranks=${WM_GPU_CHECK_RANKS:-4}
summary=()
failed=0

step() {
  local name=$1
  shift
  printf '\n==== %s\n$ %s\n' "$name" "$*"
  local t0=$SECONDS
  if "$@"; then
    summary+=("PASS  $name ($((SECONDS - t0)) s)")
  else
    summary+=("FAIL  $name ($((SECONDS - t0)) s)")
    failed=$((failed + 1))
  fi
}

# NCCL ships as libnccl.so.2; cudarc looks for libnccl.so.
for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/lib64 $(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null); do
  if [ -e "$d/libnccl.so.2" ] && [ ! -e "$d/libnccl.so" ]; then
    mkdir -p "$b/lib" && ln -sf "$d/libnccl.so.2" "$b/lib/libnccl.so"
    export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    break
  fi
done

step "machine" sh -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader'
step "probe --active, $ranks ranks" "$b/wm-run" -n "$ranks" -- "$b/wm-bench" probe --active --require continuous:device,chunked:device,distributed:device,hierarchy:device
step "kernels against the CPU kernels (WM_REQUIRE_GPU=1)" "$b/kernel-tests" cuda:: --test-threads=1 --nocapture
step "device tests (WM_REQUIRE_GPU=1)" "$b/device-tests" --test-threads=1 --nocapture

bench() {
  local op=$1 ty=$2
  "$b/wm-bench" "$op" --location device --type "$ty" --ranks "$ranks" --rows 8388608 --dim 128 \
    --batch 1048576 --iters 10 --warmup 2 --json | tee -a "$b/bench.jsonl" | grep -q '"verified":true'
}
: > "$b/bench.jsonl"
for op in gather scatter; do
  for ty in continuous chunked distributed hierarchy; do
    step "$op $ty device, $ranks ranks, 1M ids" bench "$op" "$ty"
  done
done
host_to_device() {
  "$b/wm-bench" gather --location host --out-location device --type "$1" --ranks "$ranks" --rows 8388608 --dim 128 \
    --batch 1048576 --iters 10 --warmup 2 --json | tee -a "$b/bench.jsonl" | grep -q '"verified":true'
}
for ty in continuous chunked; do
  step "gather $ty host table into device memory, $ranks ranks, 1M ids" host_to_device "$ty"
done
step "gather chunked device, 1 rank, 1M ids" sh -c "'$b/wm-bench' gather --location device --type chunked --ranks 1 --rows 8388608 --batch 1048576 --iters 10 --json | tee -a '$b/bench.jsonl' | grep -q '\"verified\":true'"

printf '\n==== summary\n'
printf '%s\n' "${summary[@]}"
printf '\nbenchmarks (op type table->output ranks: per-rank median GB/s, baseline GB/s, ratio):\n'
sed -n 's/.*"baseline_gbps":\([0-9.e+-]*\).*"median":\([0-9.e+-]*\).*"location":"\([a-z]*\)".*"op":"\([a-z]*\)".*"out_location":"\([a-z]*\)".*"ranks":\([0-9]*\).*"ratio":\([0-9.e+-]*\).*"type":"\([a-z]*\)".*"verified":\([a-z]*\).*/\4 \8 \3->\5 \6: \2, \1, \7 (verified \9)/p' "$b/bench.jsonl"
echo "failed steps: $failed"
exit "$failed"
