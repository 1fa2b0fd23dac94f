#!/usr/bin/env bash
# Threads at one rank: WM_THREADS 1, 2 and unset, for sample, gather and
# scatter at batches 8192 and 65536, interleaved, ROUNDS rounds.
#   scripts/threads.sh target/release/wm-bench [ROUNDS] [LOG.jsonl]
# Every result must be verified; prints a table with medians (min–max).
set -euo pipefail
B=${1:?wm-bench}; ROUNDS=${2:-3}; LOG=${3:-/tmp/wm-threads.jsonl}
: > "$LOG"
for r in $(seq 1 "$ROUNDS"); do
  for op in sample gather scatter; do
    for batch in 8192 65536; do
      for t in 1 2 default; do
        if [ "$op" = sample ]; then
          args="sample --json --ranks 1 --fanouts 10,10 --batch $batch --iters 10"
        else
          args="$op --json --ranks 1 --type chunked --rows 1000000 --dim 128 --batch $batch --iters 10"
        fi
        if [ "$t" = default ]; then
          line=$(env -u WM_THREADS "$B" $args 2>/dev/null | grep '^{' | tail -1)
        else
          line=$(WM_THREADS=$t "$B" $args 2>/dev/null | grep '^{' | tail -1)
        fi
        echo "{\"round\":$r,\"op\":\"$op\",\"batch\":$batch,\"threads\":\"$t\",\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$line}" >> "$LOG"
      done
    done
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def fig(res):
    assert res.get("verified") is True, res
    return res["edges_per_s"]["median"] / 1e6 if res["op"] == "sample" else res["gbps_per_rank"]["median"]
print("| op | batch | 1 thread | 2 threads | 2 ÷ 1 | default | default ÷ 1 |")
print("|---|---|---|---|---|---|---|")
for op in ("sample", "gather", "scatter"):
    for b in (8192, 65536):
        v = {t: [fig(r["result"]) for r in rows if r["op"] == op and r["batch"] == b and r["threads"] == t] for t in ("1", "2", "default")}
        m = {t: statistics.median(x) for t, x in v.items()}
        f = lambda t: f"{m[t]:.2f} ({min(v[t]):.2f}–{max(v[t]):.2f})"
        print(f"| {op} | {b} | {f('1')} | {f('2')} | {m['2']/m['1']:.2f} | {f('default')} | {m['default']/m['1']:.2f} |")
print("loads:", sorted(float(r["load"]) for r in rows)[::max(1, len(rows)//6)])
PY
