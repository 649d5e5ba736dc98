"""Tabulate an A/B folder of mccl.bench runs (bench/device_trace.sh's `ab` stage).

The folder holds ``R-A.json`` / ``R-B.json`` (and their ``.txt`` logs) for rounds R = 1, 2, ...; A and
B alternate within each round, so the rows compare like with like. Per op, size and side it prints
each round's median time (ms), engine CPU (``cpu_engine_pct``: mccl-engine + mccl-send, % of one
core, max over ranks) and wrong-result count, then how often each side's log says the sender
thread's load rule moved the writing ("frames now written by", MCCL_DEBUG=INFO, subsystem NET).

    python bench/ab_summary.py bench/results/device-trace-.../ab8-10gbit
"""
from __future__ import annotations

import collections
import json
import pathlib
import re
import sys


def main(folder: str) -> int:
    root = pathlib.Path(folder)
    rows: dict[tuple, list[str]] = collections.defaultdict(list)
    flips: dict[str, list[int]] = collections.defaultdict(list)
    files = sorted(root.glob("*-[AB].json"), key=lambda p: (int(p.stem.split("-")[0]), p.stem))
    if not files:
        print(f"ab_summary: no R-A.json / R-B.json in {root}", file=sys.stderr)
        return 1
    for path in files:
        side = path.stem.split("-")[1]
        for r in json.loads(path.read_text())["results"]:
            rows[(r["op"], r["size"], side)].append(
                f"{r['time_us'] / 1e3:8.1f} ms {r.get('cpu_engine_pct', float('nan')):6.1f}% w{r['wrong']}")
        log = path.with_suffix(".txt")
        text = log.read_text(errors="replace") if log.exists() else ""
        flips[side].append(len(re.findall(r"frames now written by", text)))
    print("# op, size, side: per round median time / engine CPU (% of a core, max over ranks) / wrong")
    for (op, size, side), cells in sorted(rows.items()):
        print(f"{op:12s} {size:>10d} {side}  " + "  ".join(cells))
    for side, counts in sorted(flips.items()):
        print(f"side {side}: load-rule hand-overs logged per invocation (all ranks): {counts}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/ab_summary.py FOLDER")
    sys.exit(main(sys.argv[1]))
