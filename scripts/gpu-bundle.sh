#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs on a GPU machine that has no Rust
# toolchain: stripped release binaries (wm-bench, wm-run, the rank program
# of the tests, the device and kernel test executables) and, when NVRTC is at hand, the
# kernels precompiled for sm_80 and sm_90, in one directory (default
# gpu-bundle/, ignored by git) that stays under the 60 MiB a transfer to the
# GPU machine allows.
#
#   scripts/gpu-bundle.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
rm -rf "$out"
mkdir -p "$out/kernels"

rank_programs="wm-test-rank wm-test-load wm-test-embedding"
cargo build --release -p wm-bench --bin wm-bench --bin wm-run -p wm-tests $(printf -- '--bin %s ' $rank_programs)
for b in wm-bench wm-run $rank_programs; do
  cp "target/release/$b" "$out/$b"
done
# The device test executable: cargo names it with a hash, so ask cargo.
exe=$(cargo test --release -p wm-tests --test device --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -n "$exe" ] || { echo "gpu-bundle: no device test executable" >&2; exit 1; }
cp "$exe" "$out/device-tests"
# wm-gather's unit tests: the kernels against the CPU kernels, on the GPU.
exe=$(cargo test --release -p wm-gather --lib --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -n "$exe" ] || { echo "gpu-bundle: no wm-gather test executable" >&2; exit 1; }
cp "$exe" "$out/kernel-tests"
for b in wm-bench wm-run $rank_programs device-tests kernel-tests; do
  strip "$out/$b"
done

# Kernels compiled ahead, so the GPU machine needs no NVRTC.
if "$out/wm-bench" kernels --prebuild "$out/kernels" --arch sm_80 --arch sm_90; then
  echo "gpu-bundle: kernels precompiled into $out/kernels"
else
  echo "gpu-bundle: NVRTC unavailable here; the GPU machine will need it to compile the kernels" >&2
fi
cp scripts/gpu-check.sh "$out/"
size=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out is ${size} MiB"
if [ "$size" -ge 60 ]; then
  echo "gpu-bundle: over the 60 MiB transfer limit" >&2
  exit 1
fi
