#!/bin/bash
# The wire's protection on the cross-node gather (docs/performance.md, "The
# wire's protection"): interleaved rounds of plain frames (a build of main
# before records), an older build of this branch, and mac and aead now, in
# one sitting. Prints, per run, the gather's per-rank median (the 7th field
# of "per rank GB/s  min A  median B  max C"), the bare exchange's wire
# GB/s, and whether the run verified.
#   PLAIN=…/wm-bench OLD=…/wm-bench NEW=…/wm-bench REPS=4 scripts/bench-wire.sh
set -eu
A="gather --type distributed --ranks 2 --node-size 1 --rows 4194304 --dim 128 --batch 8192 --iters 20"
: "${PLAIN:?a wm-bench built from main before records}" "${NEW:?this build's wm-bench}"
for rep in $(seq 1 "${REPS:-4}"); do
  for v in plain aead-old mac aead; do
    case $v in
      plain) out=$("$PLAIN" $A 2>&1) ;;
      aead-old) [ -n "${OLD:-}" ] || continue; out=$(WM_WIRE=aead "$OLD" $A 2>&1) ;;
      *) out=$(WM_WIRE=$v "$NEW" $A 2>&1) ;;
    esac
    g=$(echo "$out" | awk '/per rank GB\/s/ {print $7}')
    wire=$(echo "$out" | awk '/wire GB\/s/ {print $3}')
    ver=$(echo "$out" | awk '/verified/ {print $2}')
    echo "$rep $v gather=$g wire=$wire verified=$ver"
  done
done
