#!/usr/bin/env bash
# GraphSAGE epochs at WM_THREADS 1 and 2 (prefetch auto), interleaved.
#   scripts/sage-threads.sh target/release/wm-run target/release/examples/graphsage [ROUNDS] [RANKS] [LOG]
# (cargo build --release -p wm-bench -p wm-graph --features candle --example graphsage)
set -euo pipefail
RUN=$1; SAGE=$2; ROUNDS=${3:-5}; RANKS=${4:-1}; LOG=${5:-/tmp/sage.log}
: > "$LOG"
for r in $(seq 1 "$ROUNDS"); do
  order="1 2"; [ $((r % 2)) = 0 ] && order="2 1"
  for t in $order; do
    WM_THREADS=$t "$RUN" -n "$RANKS" -- "$SAGE" --epochs 3 2>&1 | sed "s/^/round=$r threads=$t ranks=$RANKS load=$(cut -d' ' -f1 /proc/loadavg) | /" >> "$LOG"
  done
done
python3 - "$LOG" <<'PY'
import re, statistics, sys
ep = {}; acc = {}
for l in open(sys.argv[1]):
    m = re.match(r"round=(\d+) threads=(\d) ranks=(\d+) load=\S+ \| (?:\[\d+\] )?(graphsage|baseline)[^:]* epoch (\d+): .*epoch_s=([\d.]+)", l)
    if m:
        r, t, _, name, e, s = m.groups()
        ep.setdefault((name, t), []).append(float(s))
    m = re.search(r"threads=(\d).*\| acc=([\d.]+)\s*$", l)
    if m: acc.setdefault(m.group(1), []).append(float(m.group(2)))
for name in sorted({k[0] for k in ep}):
    a, b = ep.get((name, "1"), []), ep.get((name, "2"), [])
    if a and b:
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name}: epoch_s median 1 thread {ma:.3f} ({min(a):.3f}-{max(a):.3f}, n={len(a)}), 2 threads {mb:.3f} ({min(b):.3f}-{max(b):.3f}, n={len(b)}), 2/1 time {mb/ma:.3f}, speedup {ma/mb:.2f}x")
print("acc:", {k: statistics.median(v) for k, v in acc.items()})
PY
