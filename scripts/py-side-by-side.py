#!/usr/bin/env python3
"""Summarises scripts/py-side-by-side.sh's JSON lines: per round, the
per-rank median GB/s of each run and the ratios taken within the round;
then the median and spread (min..max) of each over the rounds.

    python3 scripts/py-side-by-side.py OUT.jsonl
"""
import json
import statistics
import sys


def main(path):
    rounds = {}
    for line in open(path):
        line = line.strip()
        if line:
            j = json.loads(line)
            rounds.setdefault(j["round"], {})[j["bench"]] = j
    rows, pages = [], {}
    for r, runs in sorted(rounds.items()):
        wb, pg, gb = runs.get("wm-bench gather"), runs.get("python gather"), runs.get("python get_batch")
        if not (wb and pg and gb):
            continue
        g = {k: v["median"] for k, v in gb["gbps_per_rank"].items()}
        m = {
            "wm-bench gather": wb["gbps_per_rank"]["median"],
            "Table.gather": pg["gbps_per_rank"]["median"],
            "method 0": g["method 0"],
            "method 1": g.get("method 1", float("nan")),
            "method 2": g.get("method 2", float("nan")),
            "numpy np.take": g["numpy full[ids]"],
        }
        m["Table.gather / wm-bench"] = m["Table.gather"] / m["wm-bench gather"]
        m["method 0 / wm-bench"] = m["method 0"] / m["wm-bench gather"]
        m["method 0 / numpy"] = m["method 0"] / m["numpy np.take"]
        rows.append(m)
        for k, v in gb.get("huge_pages_rank0", {}).items():
            if v is not None:
                pages.setdefault(k, []).append(v)
    if not rows:
        sys.exit(f"{path}: no complete round")
    print(f"{len(rows)} rounds; GB/s per rank (median over ranks), then ratios within a round")
    print(f"  {'':26s} {'median':>8s} {'min':>8s} {'max':>8s}")
    for k in rows[0]:
        v = [x[k] for x in rows]
        print(f"  {k:26s} {statistics.median(v):8.2f} {min(v):8.2f} {max(v):8.2f}")
    if pages:
        print("huge pages, rank 0 (lowest over the rounds): "
              + ", ".join(f"{k} {min(v):.0%}" for k, v in pages.items()))


if __name__ == "__main__":
    main(sys.argv[1])
