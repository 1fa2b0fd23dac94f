#!/usr/bin/env bash
# Two "hosts" joined by a link of a chosen rate, on one machine: two network
# namespaces and a veth pair whose two ends each send through a token
# bucket (tc tbf) at --rate, so every byte between the hosts crosses a
# shaped link in both directions. Runs COMMAND as the ranks of one job,
# the first half in host a, the rest in host b, each rank in its own UTS
# namespace with its host's name (so the ranks of a host are one node and
# the hosts are two), started as any launcher would: WM_RANK,
# WM_WORLD_SIZE, WM_RENDEZVOUS at host a's address, WM_HOST_ADDR,
# WM_JOB_KEY (tests/netns/run.sh starts its ranks the same way).
#
# Usage:
#   scripts/shaped-link.sh [--rate 2gbit|10gbit|25gbit] [--per-host N]
#       [--mtu BYTES] [--timeout-s S] [--logs DIR] -- COMMAND [ARGS...]
#   scripts/shaped-link.sh --check        # the requirements, then exit
#
#   --rate       the link's rate each way (default 2gbit)
#   --per-host   ranks per host (default 1; the world is twice that)
#   --mtu        the veth pair's MTU (default 1500, a host link's default)
#   --timeout-s  every rank is killed after this many seconds, and the
#                script exits 124 (default 900)
#   --logs DIR   keep each rank's stdout and stderr there (rank.R.out,
#                rank.R.err); by default they go to a temporary folder
#                that is removed
#
# Output: rank 0's stdout and stderr as they come; the other ranks' output
# after they end, each line prefixed with "[R] ", on stderr. Exit code: 0
# when every rank exits 0, else the first failing rank's code (124 for a
# timeout).
#
# Needs root (CAP_SYS_ADMIN for namespaces, CAP_NET_ADMIN for links),
# iproute2 (ip, tc), util-linux's unshare and the kernel's veth and sch_tbf.
# What is missing is named; exit 2 unless SHAPED_LINK_SKIP_OK=1, when it
# prints "SKIP shaped-link: <reason>" and exits 77 (for scripts that turn a
# missing requirement into a skip; under CI=true a missing requirement is
# always exit 2).
#
# Nothing is left: the namespaces (and with them the veth pair and its
# qdiscs) are deleted and every rank killed on any exit, Ctrl-C included.
# Names are unique to this run (wmsl<pid><random>) and checked before they
# are made: an existing namespace or link of that name is never touched.
set -euo pipefail

usage() {
  sed -n '/^# Usage:/,/^#   --logs/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

rate=2gbit per_host=1 mtu=1500 timeout_s=900 logs="" check_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --per-host) per_host=${2:?--per-host needs a value}; shift 2 ;;
    --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
    --timeout-s) timeout_s=${2:?--timeout-s needs a value}; shift 2 ;;
    --logs) logs=${2:?--logs needs a folder}; shift 2 ;;
    --check) check_only=1; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "shaped-link: unknown option '$1' (the command comes after --)" >&2; usage ;;
  esac
done
if [ "$check_only" = 0 ] && [ $# -eq 0 ]; then
  echo "shaped-link: no command to run (give it after --)" >&2
  usage
fi

[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?(k|m|g)?bit$ ]] || { echo "shaped-link: --rate '$rate': expected a tc rate such as 2gbit, 10gbit or 25gbit" >&2; exit 2; }
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "shaped-link: --per-host '$per_host': expected a positive number of ranks" >&2; exit 2; }
[[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] || { echo "shaped-link: --mtu '$mtu': expected a number of bytes, at least 576" >&2; exit 2; }
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || { echo "shaped-link: --timeout-s '$timeout_s': expected a positive number of seconds" >&2; exit 2; }

# The rate in bits per second, for the bucket's size.
rate_bps=$(awk -v r="$rate" 'BEGIN {
  n = r; sub(/[kmg]?bit$/, "", n); u = substr(r, length(n) + 1, 1)
  m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : 1
  printf "%.0f", n * m }')

# missing REASON: a requirement is not met.
missing() {
  if [ "${CI:-}" != true ] && [ "${SHAPED_LINK_SKIP_OK:-}" = 1 ]; then
    echo "SKIP shaped-link: $1"
    exit 77
  fi
  echo "shaped-link: $1" >&2
  exit 2
}

for tool in ip tc unshare awk od; do
  command -v "$tool" >/dev/null || missing "needs '$tool' (ip and tc: iproute2; unshare: util-linux), not found in PATH"
done
[ "$(id -u)" = 0 ] || missing "needs root (network namespaces and links: CAP_SYS_ADMIN, CAP_NET_ADMIN); running as uid $(id -u)"

# Names of this run only, checked before anything is made.
tag="wmsl$$$((RANDOM % 100))"
tag=${tag:0:12}
nsa="$tag-a" nsb="$tag-b" va="$tag-a" vb="$tag-b"
addr_a=10.214.0.1 addr_b=10.214.0.2
port=29514
marker="wm-shaped-link.$$.$RANDOM$RANDOM"
for ns in "$nsa" "$nsb"; do
  if ip netns list 2>/dev/null | awk '{ print $1 }' | grep -qx "$ns" || [ -e "/run/netns/$ns" ]; then
    echo "shaped-link: a network namespace '$ns' exists already; not touching it (run again for other names)" >&2
    exit 2
  fi
done
for dev in "$va" "$vb"; do
  if ip link show dev "$dev" >/dev/null 2>&1; then
    echo "shaped-link: a link '$dev' exists already; not touching it (run again for other names)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
made_a=0 made_b=0 made_link=0

# Every rank carries the marker in its environment: what is ours to kill.
ours() {
  grep -lsz "^SHAPED_LINK_MARKER=$marker\$" /proc/[0-9]*/environ 2>/dev/null | sed 's|/proc/\([0-9]*\)/environ|\1|' || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  local pid
  for pid in $(ours); do kill -KILL "$pid" 2>/dev/null || true; done
  # The pair goes with either namespace; deleting it first frees the
  # qdiscs even while a process still holds a namespace.
  if [ "$made_link" = 1 ]; then
    ip -n "$nsa" link del "$va" 2>/dev/null || ip link del "$va" 2>/dev/null || true
  fi
  [ "$made_a" = 1 ] && { ip netns del "$nsa" 2>/dev/null || echo "shaped-link: could not delete namespace $nsa" >&2; }
  [ "$made_b" = 1 ] && { ip netns del "$nsb" 2>/dev/null || echo "shaped-link: could not delete namespace $nsb" >&2; }
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if ! err=$(ip netns add "$nsa" 2>&1); then
  missing "ip netns add is not permitted here: $err"
fi
made_a=1
ip netns add "$nsb"
made_b=1
if ! err=$(ip link add "$va" type veth peer name "$vb" 2>&1); then
  missing "cannot make a veth pair (kernel module veth): $err"
fi
made_link=1
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$addr_a/24" dev "$va"
ip -n "$nsb" addr add "$addr_b/24" dev "$vb"
for ns in "$nsa" "$nsb"; do
  ip -n "$ns" link set lo up
done
ip -n "$nsa" link set "$va" mtu "$mtu"
ip -n "$nsb" link set "$vb" mtu "$mtu"

# The bucket: 1 ms of the rate (at least 64 KiB, so a GSO packet of the
# veth passes whole), a queue of 10 ms beyond it. Each end shapes what it
# sends, so both directions run at the rate.
burst=$((rate_bps / 8 / 1000))
[ "$burst" -ge 65536 ] || burst=65536
for end in "$nsa:$va" "$nsb:$vb"; do
  if ! err=$(ip netns exec "${end%%:*}" tc qdisc add dev "${end#*:}" root tbf rate "$rate" burst "$burst" latency 10ms 2>&1); then
    missing "cannot shape the link with tc tbf (kernel module sch_tbf): $err"
  fi
done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up

if [ "$check_only" = 1 ]; then
  echo "shaped-link: ok: namespaces, a veth pair and tbf at $rate work here (and were removed)"
  exit 0
fi

if [ -n "$logs" ]; then
  mkdir -p "$logs"
  logdir=$(realpath "$logs")
else
  logdir=$work
fi

world=$((2 * per_host))
key=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
# span FIRST LAST: "rank F" or "ranks F-L".
span() { if [ "$1" = "$2" ]; then echo "rank $1"; else echo "ranks $1-$2"; fi; }
echo "shaped-link: $world ranks: $(span 0 $((per_host - 1))) on wm-host-a ($nsa, $addr_a), $(span "$per_host" $((world - 1))) on wm-host-b ($nsb, $addr_b); tbf $rate each way (burst $burst bytes), MTU $mtu" >&2

# start RANK: rank RANK in its host's namespaces, in the background, its
# output on this script's descriptors (rank 0 without --logs: the script's
# own, shared rather than reopened, so a file the caller redirected to is
# not truncated) or in the log folder.
start() {
  local r=$1 ns=$nsa host=wm-host-a addr=$addr_a
  if [ "$r" -ge "$per_host" ]; then ns=$nsb host=wm-host-b addr=$addr_b; fi
  # shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" \
    env -u WM_NODE_ID -u WM_UNTAGGED -u WM_BACKEND \
    SHAPED_LINK_MARKER="$marker" WM_RANK="$r" WM_WORLD_SIZE="$world" \
    WM_RENDEZVOUS="$addr_a:$port" WM_HOST_ADDR="$addr" WM_JOB_KEY="$key" \
    "${cmd[@]}"
}
cmd=("$@")
pids=()
for ((r = 0; r < world; r++)); do
  if [ "$r" = 0 ] && [ -z "$logs" ]; then
    start "$r" &
  else
    start "$r" >"$logdir/rank.$r.out" 2>"$logdir/rank.$r.err" &
  fi
  pids[r]=$!
done

# Wait for every rank, at most --timeout-s in all.
codes=()
t0=$SECONDS
for ((r = 0; r < world; r++)); do
  while kill -0 "${pids[r]}" 2>/dev/null && [ $((SECONDS - t0)) -lt "$timeout_s" ]; do sleep 0.2; done
  if kill -0 "${pids[r]}" 2>/dev/null; then
    echo "shaped-link: rank $r still ran after ${timeout_s} s; killing every rank" >&2
    for pid in $(ours); do kill -KILL "$pid" 2>/dev/null || true; done
    wait "${pids[r]}" 2>/dev/null || true
    codes[r]=124
  else
    set +e
    wait "${pids[r]}"
    codes[r]=$?
    set -e
  fi
done

for ((r = 0; r < world; r++)); do
  if [ "$r" != 0 ] || [ -n "$logs" ]; then
    for f in "$logdir/rank.$r.out" "$logdir/rank.$r.err"; do
      [ -s "$f" ] && sed "s/^/[$r] /" "$f" >&2
    done
  fi
done
left=$(ours)
if [ -n "$left" ]; then
  echo "shaped-link: processes of the job outlived their ranks: $(echo "$left" | paste -sd' '); killed" >&2
fi
for ((r = 0; r < world; r++)); do
  if [ "${codes[r]}" != 0 ]; then
    echo "shaped-link: rank $r exited ${codes[r]} (exit codes: ${codes[*]})" >&2
    exit "${codes[r]}"
  fi
done
exit 0
