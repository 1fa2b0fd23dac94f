#!/usr/bin/env bash
# The node cache across a shaped link (issue 35): two "hosts" in network
# namespaces joined by a veth pair at 2 Gbit/s each way
# (scripts/shaped-link.sh), the wm-test-cache scenarios run with one group
# of ranks on each side:
#
#   1. coherence, 1 and 2 ranks per host: a rank of host b writes the
#      table by every path (wm_gather::scatter, write_rows, write_local, an
#      in-place slice, files::load, apply_gradients of an embedding without
#      a cache of its own), telling the cache nothing and with no barrier
#      before the next read; every cached gather, on every rank of both
#      hosts, equals an uncached gather of the same ids and the scenario's
#      model of the table (no stale row); then the cache's own writes keep
#      the rows they did not write.
#   2. node, 2 ranks per host (its partition leaves a rank without rows): distributed and hierarchy tables, f32 and
#      bf16, ratios 0.01-1 and a column slice, twelve rounds of skewed ids
#      with writes from both hosts between them.
#
# Each scenario checks on every rank and exits non-zero naming the rank,
# the case and the stale row; rank 0's transcript must show every case.
# Nothing may be left: processes, namespaces, links (shaped-link.sh removes
# them on any exit), files in /dev/shm.
#
# Usage: tests/netns/shaped-cache.sh [WM_TEST_CACHE]   (default:
# target/release/wm-test-cache, else target/debug/wm-test-cache; with
# CARGO_TARGET_DIR set, that folder's). Needs root, iproute2 and sch_tbf:
# without them it prints SKIP and the reason and exits 0, except under
# CI=true, where that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=${1:-}
if [ -z "$bin" ]; then
  tgt=${CARGO_TARGET_DIR:-target}
  if [ -x "$tgt/release/wm-test-cache" ]; then bin=$tgt/release/wm-test-cache; else bin=$tgt/debug/wm-test-cache; fi
fi
[ -x "$bin" ] || { echo "shaped-cache: no wm-test-cache at $bin (cargo build -p wm-tests --bin wm-test-cache)" >&2; exit 1; }
bin=$(realpath "$bin")

link=scripts/shaped-link.sh
set +e
SHAPED_LINK_SKIP_OK=1 "$link" --check
rc=$?
set -e
case "$rc" in
  0) ;;
  77) exit 0 ;; # shaped-link printed SKIP and the reason
  *) exit "$rc" ;;
esac

work=$(mktemp -d)
shm_before=$(ls /dev/shm)
trap 'rm -rf "$work"' EXIT

# run NAME PER_HOST ARGS...: the scenario on the shaped link, rank 0's
# transcript in $work/NAME.out.
run() {
  local name=$1 per_host=$2
  shift 2
  echo "-- wm-test-cache $1, $per_host rank(s) per host, 2 Gbit/s between the hosts"
  if ! "$link" --rate 2gbit --per-host "$per_host" --timeout-s 600 -- env WM_TIMEOUT_S=120 "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    cat "$work/$name.out" "$work/$name.err" >&2
    echo "shaped-cache: wm-test-cache $* failed across the link ($per_host rank(s) per host)" >&2
    exit 1
  fi
  cat "$work/$name.out" "$work/$name.err"
  # This run's namespaces (named on shaped-link's first line) are gone.
  local ns
  for ns in $(grep -o 'wmsl[0-9]*-[ab]' "$work/$name.err" | sort -u); do
    if [ -e "/run/netns/$ns" ]; then
      echo "shaped-cache: namespace $ns left behind" >&2
      exit 1
    fi
  done
}

# expect NAME TEXT COUNT: rank 0 reported TEXT exactly COUNT times.
expect() {
  local got
  got=$(grep -c -- "$2" "$work/$1.out" || true)
  if [ "$got" != "$3" ]; then
    echo "shaped-cache: $1: '$2' reported $got times, expected $3 (a case did not run)" >&2
    exit 1
  fi
}

for per_host in 1 2; do
  mkdir -p "$work/files-$per_host"
  run "coherence-$per_host" "$per_host" coherence "$work/files-$per_host"
  # Both collective types, ratios 1 and 0.1; and the cache's own writes.
  expect "coherence-$per_host" "^case coherence " 4
  expect "coherence-$per_host" "^case own-writes " 2
done
run node 2 node
# 2 types x (2 element types x 4 ratios + a column slice).
expect node "^case " 18

new_shm=$(comm -13 <(echo "$shm_before") <(ls /dev/shm) | grep -iE 'wholemem|^wm[-_]' || true)
if [ -n "$new_shm" ]; then
  echo "shaped-cache: left in /dev/shm: $new_shm" >&2
  exit 1
fi
echo "shaped-cache: cached gathers equal uncached ones on both sides of a 2 Gbit/s link, writes from the other host seen, nothing stale"
