#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair
# (10.213.0.1/24 and 10.213.0.2/24, addresses of these test hosts only),
# each rank in its own UTS namespace with its host's name, so the two hosts
# differ by host name and talk over real TCP. Two ranks per host, started by
# hand as any launcher would (WM_RANK, WM_WORLD_SIZE, WM_RENDEZVOUS at the
# first host's address, WM_HOST_ADDR, WM_JOB_KEY).
#
#   1. wm-bench gather and scatter, --type hierarchy and distributed: every
#      rank exits 0, rank 0's JSON says verified on 2 nodes; wm-bench probe
#      names the two nodes by their host names.
#   2. The link is cut (ip link set ... down) during a long gather with
#      WM_TIMEOUT_S=10: every rank exits non-zero with an error naming a
#      peer, within the timeout and some slack.
#   3. With wm-test-flood beside wm-bench: a stranger (uid 65534) on host b
#      holds 2000 idle connections to rank 0's rendezvous while the job
#      starts; every rank of wm-bench probe exits 0.
#   4. Nothing is left: no process of ours, nothing new in /dev/shm; the
#      namespaces are deleted on any exit.
#
# Usage: tests/netns/run.sh [--bench] [WM_BENCH]   (default: target/release/wm-bench,
# else target/debug/wm-bench). Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN):
# when `ip netns add` is not permitted it prints SKIP and exits 0, except
# under CI (CI=true), where that is a failure.
#
# With --bench it measures instead of checking: wm-bench gather and scatter
# of the default 2 GiB table (4 194 304 x 128 f32), distributed and
# hierarchy, 1 and 2 ranks per host, batches 8192 and 65 536, one JSON line
# each (verified, with the same-run baseline and the ratio) — the figures
# of docs/performance.md (how they were reached: docs/perf-log/). To measure part of
# it, WM_NETNS_PER_HOST, WM_NETNS_OPS, WM_NETNS_TYPES and WM_NETNS_BATCHES
# each name the values to keep (e.g. WM_NETNS_TYPES=hierarchy
# WM_NETNS_BATCHES=65536); WM_NETNS_BENCH_ARGS adds options to every
# wm-bench (e.g. "--profile --iters 100"), and WM_NETNS_MTU sets the veth
# pair's MTU (default: the Ethernet default of 1500 a host's link has
# unless configured otherwise; 9000 for jumbo frames).
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=check
if [ "${1:-}" = --bench ]; then
  mode=bench
  shift
fi
bench=${1:-}
if [ -z "$bench" ]; then
  if [ -x target/release/wm-bench ]; then bench=target/release/wm-bench; else bench=target/debug/wm-bench; fi
fi
bench=$(realpath "$bench")
[ -x "$bench" ] || { echo "netns: no wm-bench at $bench (build it first)" >&2; exit 1; }

tag="wm$$"
nsa="$tag-a" nsb="$tag-b"
addr_a=10.213.0.1 addr_b=10.213.0.2
port=29513
timeout_s=10
marker="wm-netns-test.$$.$RANDOM"
work=$(mktemp -d)
shm_before=$(ls /dev/shm)

# Every process of ours carries the marker in its environment.
ours() {
  grep -lsz "^WM_NETNS_MARKER=$marker\$" /proc/[0-9]*/environ 2>/dev/null | sed 's|/proc/\([0-9]*\)/environ|\1|' || true
}

cleanup() {
  local rc=$?
  for pid in $(ours); do kill -KILL "$pid" 2>/dev/null || true; done
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! err=$(ip netns add "$nsa" 2>&1); then
  if [ "${CI:-}" = true ]; then
    echo "netns: ip netns add failed under CI: $err" >&2
    exit 1
  fi
  echo "SKIP netns: ip netns add is not permitted here: $err"
  exit 0
fi
ip netns add "$nsb"
ip link add "$tag-va" type veth peer name "$tag-vb"
ip link set "$tag-va" netns "$nsa"
ip link set "$tag-vb" netns "$nsb"
ip -n "$nsa" addr add "$addr_a/24" dev "$tag-va"
ip -n "$nsb" addr add "$addr_b/24" dev "$tag-vb"
for ns in "$nsa" "$nsb"; do
  ip -n "$ns" link set lo up
done
if [ -n "${WM_NETNS_MTU:-}" ]; then
  [[ "$WM_NETNS_MTU" =~ ^[0-9]+$ ]] || { echo "netns: WM_NETNS_MTU must be a number of bytes, got '$WM_NETNS_MTU'" >&2; exit 1; }
  ip -n "$nsa" link set "$tag-va" mtu "$WM_NETNS_MTU"
  ip -n "$nsb" link set "$tag-vb" mtu "$WM_NETNS_MTU"
fi
ip -n "$nsa" link set "$tag-va" up
ip -n "$nsb" link set "$tag-vb" up

# The job's key, as wm-run would make it (64 hex digits).
key=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')

# start RANK TIMEOUT_S LOG ARGS...: rank RANK of $world in its host's
# namespaces, in the background; the first half on host a, the rest on b.
pids=()
world=4
start() {
  local rank=$1 tmo=$2 log=$3
  shift 3
  local ns=$nsa host=wm-host-a addr=$addr_a
  if [ "$rank" -ge $((world / 2)) ]; then ns=$nsb host=wm-host-b addr=$addr_b; fi
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" \
    env -u WM_NODE_ID -u WM_UNTAGGED -u WM_BACKEND \
    WM_NETNS_MARKER="$marker" WM_RANK="$rank" WM_WORLD_SIZE="$world" \
    WM_RENDEZVOUS="$addr_a:$port" WM_HOST_ADDR="$addr" WM_JOB_KEY="$key" \
    WM_TIMEOUT_S="$tmo" "$bench" "$@" >"$log.$rank.out" 2>"$log.$rank.err" &
  pids[rank]=$!
}

# wait_all LIMIT_S: waits for the 4 ranks, at most LIMIT_S seconds; sets
# codes[r] (124: still running at the limit, then killed).
codes=()
wait_all() {
  local limit=$1 t0=$SECONDS
  for ((r = 0; r < world; r++)); do
    while kill -0 "${pids[r]}" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.2; done
    if kill -0 "${pids[r]}" 2>/dev/null; then
      kill -KILL "${pids[r]}" 2>/dev/null || true
      wait "${pids[r]}" 2>/dev/null || true
      codes[r]=124
    else
      set +e
      wait "${pids[r]}"
      codes[r]=$?
      set -e
    fi
  done
}

show() {
  for ((r = 0; r < world; r++)); do
    sed "s/^/[$r] /" "$1.$r.out" "$1.$r.err" >&2 || true
  done
}

if [ "$mode" = bench ]; then
  echo "-- measuring on two hosts ($nsa at $addr_a, $nsb at $addr_b), real TCP between them"
  for per_host in ${WM_NETNS_PER_HOST:-1 2}; do
    world=$((2 * per_host))
    # Two ranks per "host" share this machine's cores: every rank runs the
    # baseline too, and both are timed as steps (docs/performance.md).
    shared=""; [ "$per_host" = 2 ] && shared="--baseline-ranks all"
    for op in ${WM_NETNS_OPS:-gather scatter}; do
      for ty in ${WM_NETNS_TYPES:-distributed hierarchy}; do
        for batch in ${WM_NETNS_BATCHES:-8192 65536}; do
          log="$work/bench-$op-$ty-$per_host-$batch"
          for ((r = 0; r < world; r++)); do
            start "$r" 300 "$log" "$op" --json --type "$ty" --batch "$batch" $shared ${WM_NETNS_BENCH_ARGS:-}
          done
          wait_all 900
          expect=$(printf '0 %.0s' $(seq "$world"))
          if [ "${codes[*]} " != "$expect" ]; then
            show "$log"
            echo "netns: $op $ty x$per_host batch $batch: exit codes ${codes[*]}" >&2
            exit 1
          fi
          cat "$log.0.out"
          grep -q '"verified":true' "$log.0.out"
        done
      done
    done
  done
  exit 0
fi

echo "-- two hosts ($nsa: ranks 0 1 at $addr_a, $nsb: ranks 2 3 at $addr_b), real TCP between them"
for op in gather scatter; do
  for ty in hierarchy distributed; do
    log="$work/$op-$ty"
    echo "-- wm-bench $op --type $ty on 2 hosts x 2 ranks"
    for r in 0 1 2 3; do
      start "$r" 120 "$log" "$op" --json --type "$ty" --rows 200000 --batch 8192 --iters 3
    done
    wait_all 300
    if [ "${codes[*]}" != "0 0 0 0" ]; then
      show "$log"
      echo "netns: $op $ty: exit codes ${codes[*]}" >&2
      exit 1
    fi
    cat "$log.0.out"
    grep -q '"verified":true' "$log.0.out"
    grep -q '"nodes":2' "$log.0.out"
    grep -q '"ranks":4' "$log.0.out"
  done
done

echo "-- wm-bench probe on 2 hosts: nodes named by their host names"
log="$work/probe"
for r in 0 1 2 3; do
  start "$r" 120 "$log" probe --json
done
wait_all 300
if [ "${codes[*]}" != "0 0 0 0" ]; then
  show "$log"
  echo "netns: probe: exit codes ${codes[*]}" >&2
  exit 1
fi
grep -q 'ranks 0 and 2 are on different nodes (wm-host-a and wm-host-b)' "$log.0.out" || {
  cat "$log.0.out" >&2
  echo "netns: probe does not name the two hosts" >&2
  exit 1
}

# A stranger (uid 65534) on host b holds 2000 idle connections to rank 0's
# rendezvous before the other ranks arrive (wm-test-flood, beside wm-bench
# when the tests were built into the same directory): the job must start.
flood_bin="$(dirname "$bench")/wm-test-flood"
if [ -x "$flood_bin" ]; then
  echo "-- wm-bench probe while a stranger on host b holds 2000 connections to the rendezvous"
  log="$work/flood"
  start 0 120 "$log" probe --json
  until ip netns exec "$nsa" ss -ltnH "sport = :$port" | grep -q .; do
    kill -0 "${pids[0]}" 2>/dev/null || { show "$log"; echo "netns: rank 0 ended before listening" >&2; exit 1; }
    sleep 0.2
  done
  ip netns exec "$nsb" env WM_NETNS_MARKER="$marker" setpriv --reuid 65534 --regid 65534 --clear-groups \
    "$flood_bin" idle 2000 600 "$addr_a:$port" >"$log.flood" 2>&1 &
  flood_pid=$!
  until grep -q issued "$log.flood" 2>/dev/null; do
    kill -0 "$flood_pid" 2>/dev/null || { cat "$log.flood" >&2; echo "netns: the flood did not start" >&2; exit 1; }
    sleep 0.2
  done
  for r in 1 2 3; do
    start "$r" 120 "$log" probe --json
  done
  wait_all 300
  kill "$flood_pid" 2>/dev/null || true
  wait "$flood_pid" 2>/dev/null || true
  if [ "${codes[*]}" != "0 0 0 0" ]; then
    show "$log"
    echo "netns: probe under a flood: exit codes ${codes[*]}" >&2
    exit 1
  fi
else
  echo "-- (no wm-test-flood beside $bench: the flood step is skipped; cargo build -p wm-tests builds it)"
fi

echo "-- the link cut during a long gather (WM_TIMEOUT_S=$timeout_s)"
log="$work/cut"
for r in 0 1 2 3; do
  start "$r" "$timeout_s" "$log" gather --type distributed --rows 200000 --batch 8192 --warmup 0 --iters 100000000
done
# Cut once the job is under way: every rank of host b connected to both
# ranks of host a (the mesh is up), and a little longer for the exchange.
t0=$SECONDS
until [ "$(ip netns exec "$nsb" ss -Htn state established dst "$addr_a" | wc -l)" -ge 4 ]; do
  if [ $((SECONDS - t0)) -ge 120 ]; then
    show "$log"
    echo "netns: the ranks did not connect across the hosts" >&2
    exit 1
  fi
  sleep 0.2
done
sleep 2
for r in 0 1 2 3; do
  if ! kill -0 "${pids[r]}" 2>/dev/null; then
    show "$log"
    echo "netns: rank $r ended before the link was cut" >&2
    exit 1
  fi
done
ip -n "$nsa" link set "$tag-va" down
ip -n "$nsb" link set "$tag-vb" down
cut_at=$SECONDS
# Every rank must end on its own: the timeout, plus slack for a busy
# machine (this bounds a hang, it measures nothing).
wait_all $((timeout_s + 50))
took=$((SECONDS - cut_at))
show "$log"
echo "ranks ended ${took} s after the cut with codes ${codes[*]}"
for r in 0 1 2 3; do
  case "${codes[r]}" in
    0) echo "netns: rank $r succeeded although the link was cut" >&2; exit 1 ;;
    124) echo "netns: rank $r still ran $((timeout_s + 50)) s after the cut" >&2; exit 1 ;;
  esac
  if ! grep -E '^wm-bench: .*ranks? [0-9]+' "$log.$r.err" >/dev/null; then
    echo "netns: rank $r's error does not name a peer" >&2
    exit 1
  fi
  if grep -q panicked "$log.$r.err"; then
    echo "netns: rank $r panicked" >&2
    exit 1
  fi
done

left=$(ours)
if [ -n "$left" ]; then
  ps -o pid,stat,args -p "$(echo "$left" | paste -sd,)" >&2 || true
  echo "netns: processes left behind" >&2
  exit 1
fi
new_shm=$(comm -13 <(echo "$shm_before") <(ls /dev/shm) | grep -iE 'wholemem|^wm[-_]' || true)
if [ -n "$new_shm" ]; then
  echo "netns: left in /dev/shm: $new_shm" >&2
  exit 1
fi
echo "netns: 2 hosts verified (gather, scatter x hierarchy, distributed); the cut link named a peer on every rank"
