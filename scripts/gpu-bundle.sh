#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs on a GPU machine that has no Rust
# toolchain (and maybe no NVRTC): stripped release binaries (wm-bench,
# wm-run, the rank programs of the tests, the device and kernel test
# executables) and the kernels precompiled for sm_80 and sm_90, in one
# directory (default gpu-bundle/, ignored by git) that stays under the
# 60 MiB a transfer to the GPU machine allows.
#
#   scripts/gpu-bundle.sh [DIR]
#
# Needs NVRTC (the nvidia-cuda-nvrtc-cu12 wheel's lib directory on
# LD_LIBRARY_PATH, see docs/kernels.md): without the prebuilt kernels the
# GPU machine could load no kernel, so the bundle fails rather than ship
# without them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
# Where cargo puts what it builds (CARGO_TARGET_DIR, else target/).
target=${CARGO_TARGET_DIR:-target}
archs="sm_80 sm_90"
limit_mib=60
fail() {
  echo "gpu-bundle: $*" >&2
  exit 1
}
rm -rf "$out"
mkdir -p "$out/kernels"

# The kernels first: they are what a bundle cannot do without, and the
# check is quick once wm-bench is built.
cargo build --release -p wm-bench --bin wm-bench
arch_args=$(printf -- '--arch %s ' $archs)
# shellcheck disable=SC2086
if ! "$target/release/wm-bench" kernels --prebuild "$out/kernels" $arch_args; then
  fail "could not prebuild the kernels for $archs (is NVRTC on LD_LIBRARY_PATH? see docs/kernels.md); a bundle without them cannot load a kernel on a GPU machine without NVRTC"
fi
for a in $archs; do
  set -- "$out"/kernels/wm-kernels-"$a"-*.prebuilt.cubin
  [ -f "$1" ] || fail "no prebuilt $a kernels in $out/kernels"
  [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ] || fail "$1 is not a CUBIN (ELF) file"
done

rank_programs="wm-test-rank wm-test-load wm-test-embedding wm-test-cache wm-test-onesided"
cargo build --release -p wm-bench --bin wm-bench --bin wm-run -p wm-tests $(printf -- '--bin %s ' $rank_programs)
for b in wm-bench wm-run $rank_programs; do
  cp "$target/release/$b" "$out/$b"
done
# Test executables: cargo names them with a hash, so ask cargo — for the
# artifact of exactly that target (building a test also builds the
# package's binaries, whose artifacts come in no fixed order).
test_exe() {
  local kind=$1 name=$2
  shift 2
  cargo test --release "$@" --no-run --message-format=json 2>/dev/null |
    grep -F "\"kind\":[\"$kind\"]" | grep -F "\"name\":\"$name\"" |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
exe=$(test_exe test device -p wm-tests --test device)
[ -n "$exe" ] || fail "no device test executable"
cp "$exe" "$out/device-tests"
# wm-gather's unit tests: the kernels against the CPU kernels, on the GPU.
exe=$(test_exe lib wm_gather -p wm-gather --lib)
[ -n "$exe" ] || fail "no wm-gather test executable"
cp "$exe" "$out/kernel-tests"
for b in wm-bench wm-run $rank_programs device-tests kernel-tests; do
  strip "$out/$b"
done
cp scripts/gpu-check.sh scripts/gpu-steps.sh "$out/"
# The test executables are the right ones: they list their own tests.
list=$("$out/device-tests" --list 2>/dev/null) || true
grep -q '^device_gather_and_scatter_match_the_reference_on_1_to_4_ranks: test' <<<"$list" ||
  fail "$out/device-tests is not the device test executable"
list=$("$out/kernel-tests" --list 2>/dev/null) || true
grep -q '^cuda::gpu_check::kernels_run_like_the_cpu_kernels: test' <<<"$list" ||
  fail "$out/kernel-tests is not wm-gather's unit test executable"

size=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out is ${size} MiB (limit ${limit_mib} MiB); kernels:"
ls -l "$out/kernels"
if [ "$size" -ge "$limit_mib" ]; then
  fail "over the ${limit_mib} MiB transfer limit"
fi
