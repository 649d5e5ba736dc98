"""Render mccl.bench JSON results as the Markdown tables of docs/PERFORMANCE.md.

Usage: python bench/tables.py RESULT.json [...] [--goodput GBPS]
Every number comes from the JSON (no hand-typed results); %goodput uses the goodput recorded in the
JSON's meta (or --goodput, in GB/s).
"""
import argparse
import json
from collections import defaultdict


def human(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def goodput_of(meta: dict) -> float:
    g = meta.get("goodput") or {}
    bits = g.get("bits_per_s") if isinstance(g, dict) else None
    return bits / 8e9 if bits else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--goodput", type=float, default=0.0, help="GB/s, overrides the JSON's")
    args = ap.parse_args()
    for path in args.files:
        d = json.load(open(path))
        gp = args.goodput or goodput_of(d.get("meta", {}))
        rows = defaultdict(dict)
        for r in d["results"]:
            rows[(r["op"], r["size"])][r["backend"]] = r
        ops = sorted({op for op, _ in rows}, key=lambda o: [k[0] for k in rows].index(o))
        for op in ops:
            n = next(iter(next(v for k, v in rows.items() if k[0] == op).values()))["nranks"]
            print(f"\n{op}, {n} ranks ({path}; goodput {gp:.4f} GB/s)\n")
            print("| size | mccl time (us) | mccl busbw (GB/s) | mccl %goodput | gloo time (us) | gloo busbw (GB/s) | gloo %goodput | mccl/gloo | #wrong | mccl engine CPU % | mccl +RSS (MiB) |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for (o, size), by in sorted(rows.items(), key=lambda kv: kv[0][1]):
                if o != op:
                    continue
                m, g = by.get("mccl"), by.get("gloo")
                cell = lambda r, k, f: (f % r[k]) if r and r.get(k) is not None else "-"
                pct = lambda r: f"{r['busbw'] / gp * 100:.1f}" if r and gp else "-"
                ratio = f"{m['busbw'] / g['busbw']:.2f}" if m and g and g["busbw"] else "-"
                wrong = sum(r["wrong"] for r in by.values())
                print(f"| {human(size)} | {cell(m, 'time_us', '%.1f')} | {cell(m, 'busbw', '%.3f')} | {pct(m)} | "
                      f"{cell(g, 'time_us', '%.1f')} | {cell(g, 'busbw', '%.3f')} | {pct(g)} | {ratio} | {wrong} | "
                      f"{cell(m, 'cpu_engine_pct', '%.0f')} | {cell(m, 'rss_extra_mib', '%.1f')} |")


if __name__ == "__main__":
    main()
