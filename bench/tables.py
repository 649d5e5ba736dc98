"""Render mccl.bench JSON results as the Markdown tables of docs/PERFORMANCE.md.

Usage: python bench/tables.py RESULT.json [...] [--goodput GBPS] [--ratios] [--ops OPS]
Every number comes from the JSON (no hand-typed results); %goodput uses the goodput recorded in the
JSON's meta (or --goodput, in GB/s). --ratios prints one compact table instead: a row per
(collective, world size, file) and a column per size, each cell mccl's busbw / gloo's (> 1: mccl
faster).
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
    ap.add_argument("files", nargs="+", help="JSON files of mccl.bench; A.json+B.json pools two runs (backends run separately)")
    ap.add_argument("--goodput", type=float, default=0.0, help="GB/s, overrides the JSON's")
    ap.add_argument("--ratios", action="store_true", help="one table of mccl/gloo busbw ratios")
    ap.add_argument("--ops", default="", help="comma-separated collectives to keep (default: all)")
    args = ap.parse_args()
    keep = set(filter(None, args.ops.split(",")))
    if args.ratios:
        ratios(args.files, keep)
        return
    for path in args.files:
        d = json.load(open(path.split("+")[0]))
        gp = args.goodput or goodput_of(d.get("meta", {}))
        rows = defaultdict(dict)
        for r in results_of(path):
            if not keep or r["op"] in keep:
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
                ratio = f"{m['busbw'] / g['busbw']:.2f}" if m and g and m.get("busbw") and g.get("busbw") else "-"
                wrong = sum(r.get("wrong", 0) for r in by.values())  # error/unsupported rows have none
                print(f"| {human(size)} | {cell(m, 'time_us', '%.1f')} | {cell(m, 'busbw', '%.3f')} | {pct(m)} | "
                      f"{cell(g, 'time_us', '%.1f')} | {cell(g, 'busbw', '%.3f')} | {pct(g)} | {ratio} | {wrong} | "
                      f"{cell(m, 'cpu_engine_pct', '%.0f')} | {cell(m, 'rss_extra_mib', '%.1f')} |")


def results_of(path: str) -> list[dict]:
    """The results of one JSON file, or of several joined by '+' (backends run separately)."""
    return [r for p in path.split("+") for r in json.load(open(p))["results"]]


def ratios(paths: list[str], keep: set[str]) -> None:
    table, sizes = {}, set()
    for path in paths:
        for r in results_of(path):
            if keep and r["op"] not in keep:
                continue
            table.setdefault((r["op"], r["nranks"], path), {}).setdefault(r["size"], {})[r["backend"]] = r
            sizes.add(r["size"])
    cols = sorted(sizes)
    print("| collective | ranks | " + " | ".join(human(c) for c in cols) + " | source |")
    print("|---|---|" + "---|" * len(cols) + "---|")
    for (op, n, path), by_size in table.items():
        cells = []
        for c in cols:
            m, g = by_size.get(c, {}).get("mccl"), by_size.get(c, {}).get("gloo")
            cells.append(f"{m['busbw'] / g['busbw']:.2f}" if m and g and m.get("busbw") and g.get("busbw") else "-")
        src = " + ".join("/".join(p.split("/")[-2:]) for p in path.split("+"))
        print(f"| {op} | {n} | " + " | ".join(cells) + f" | {src} |")


if __name__ == "__main__":
    main()
