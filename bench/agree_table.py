"""The table of bench/device_agreement.sh's results: per (collective, size), the median over rounds
of each invocation's time (the slowest rank's median iteration, mccl.bench's ``time_us``), mccl
and gloo, with the agreement to every peer and with dissemination, and every round's mccl figure.

    python bench/agree_table.py bench/results/device-agree-cluster-<time>
"""
from __future__ import annotations

import glob
import json
import statistics
import sys


def main(folder: str) -> None:
    rows: dict = {}
    for path in sorted(glob.glob(f"{folder}/r*.json")):
        mode = "dis" if "dissemination" in path else "all"
        for r in json.load(open(path))["results"]:
            rows.setdefault((r["op"], r["size"]), {}).setdefault((mode, r["backend"]), []).append(r["time_us"])
    print("| collective | size (B) | to every peer: mccl (us) | gloo (us) | dissemination: mccl (us) | gloo (us) "
          "| dissemination / every peer | mccl per round (every peer; dissemination) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for (op, size), v in sorted(rows.items()):
        med = {k: statistics.median(x) for k, x in v.items()}
        a, ag, d, dg = (med.get(k, float("nan")) for k in
                        (("all", "mccl"), ("all", "gloo"), ("dis", "mccl"), ("dis", "gloo")))
        rounds = "; ".join(" ".join(f"{t:.0f}" for t in v.get((m, "mccl"), [])) for m in ("all", "dis"))
        print(f"| {op} | {size} | {a:.0f} | {ag:.0f} | {d:.0f} | {dg:.0f} | {d / a:.3f} | {rounds} |")


if __name__ == "__main__":
    main(sys.argv[1])
