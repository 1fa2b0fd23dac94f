#!/usr/bin/env bash
# An A/B of two wm-bench builds in one sitting: every case runs on both
# builds, round after round (interleaved, A first in odd rounds and B first
# in even ones). The table gives each build's median over the rounds, the
# change B/A, the median of the rounds' own B/A (paired), and the noise: the
# spread (max-min)/median between the rounds of one build. A change inside
# the noise is no change. Every result must be verified.
#   scripts/ab.sh OLD/wm-bench NEW/wm-bench [ROUNDS] [LOG.jsonl]
# AB_ONLY=REGEX runs only the cases whose name matches; AB_REPORT=1 only
# prints the table of an existing LOG.
set -euo pipefail
A=${1:?old wm-bench}; B=${2:?new wm-bench}; ROUNDS=${3:-3}; LOG=${4:-/tmp/wm-ab.jsonl}
[ "${AB_REPORT:-0}" = 1 ] || : > "$LOG"
cases=(
  "gather continuous 1n|gather --json --ranks 2 --type continuous --batch 65536"
  "gather chunked 1n|gather --json --ranks 2 --type chunked --batch 65536"
  "gather distributed 1n|gather --json --ranks 2 --type distributed --batch 65536"
  "gather hierarchy 1n|gather --json --ranks 2 --type hierarchy --batch 65536"
  "gather distributed 2n|gather --json --ranks 2 --node-size 1 --type distributed --batch 65536"
  "gather hierarchy 2n|gather --json --ranks 2 --node-size 1 --type hierarchy --batch 65536"
  "get shm|get --json --ranks 2 --method shm"
  "get socket 2n|get --json --ranks 2 --node-size 1 --method socket"
  "sample distributed|sample --json --ranks 2 --type distributed --fanouts 10,10"
)
[ "${AB_REPORT:-0}" = 1 ] && ROUNDS=0
for r in $(seq 1 "$ROUNDS"); do
  for c in "${cases[@]}"; do
    name=${c%%|*}; args=${c#*|}
    [[ "$name" =~ ${AB_ONLY:-.} ]] || continue
    # Odd rounds run A first, even rounds B first: neither build always
    # finds the machine as the other left it.
    order="A B"; [ $((r % 2)) = 0 ] && order="B A"
    for side in $order; do
      bin=$A; [ "$side" = B ] && bin=$B
      # shellcheck disable=SC2086
      line=$("$bin" $args 2>/dev/null | grep '^{' | tail -1)
      echo "{\"round\":$r,\"case\":\"$name\",\"build\":\"$side\",\"result\":$line}" >> "$LOG"
      echo "round $r $side $name done" >&2
    done
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def figure(res):
    if res.get("verified") is not True:
        raise SystemExit(f"unverified result: {res}")
    if res["op"] == "sample":
        return res["edges_per_s"]["median"] / 1e6, "M edges/s per rank"
    return res["gbps_per_rank"]["median"], "GB/s per rank"
cases = list(dict.fromkeys(r["case"] for r in rows))
print("| case | unit | A median | B median | B/A | paired B/A | noise A | noise B | A ratio to its baseline | B ratio | noise A | noise B |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    vals = {"A": [], "B": []}; ratios = {"A": [], "B": []}; by_round = {}
    for r in rows:
        if r["case"] == c:
            v, unit = figure(r["result"]); vals[r["build"]].append(v)
            ratios[r["build"]].append(r["result"]["ratio"])
            by_round.setdefault(r["round"], {})[r["build"]] = v
    paired = [x["B"] / x["A"] for x in by_round.values() if len(x) == 2]
    def med(xs): return statistics.median(xs)
    def spread(xs): return (max(xs) - min(xs)) / med(xs)
    ma, mb = med(vals["A"]), med(vals["B"]); ra, rb = med(ratios["A"]), med(ratios["B"])
    print(f"| {c} | {unit} | {ma:.3f} | {mb:.3f} | {mb/ma:.3f} | {med(paired):.3f} | {spread(vals['A']):.1%} | {spread(vals['B']):.1%} "
          f"| {ra:.3f} | {rb:.3f} | {spread(ratios['A']):.1%} | {spread(ratios['B']):.1%} |")
PY
