"""Tables (rich) and plots (matplotlib) of benchmark results; only rank 0 calls these."""
from __future__ import annotations

import os
import shutil
import statistics
import sys

from rich.console import Console
from rich.table import Table

from .. import cluster
from .runtime import cluster_lines, device_line, init_line


def console() -> Console:
    # Piped output (a launcher, a log file) keeps full rows instead of wrapping at 80 columns.
    width = None if sys.stdout.isatty() else max(shutil.get_terminal_size((200, 50)).columns, 200)
    return Console(width=width, highlight=False, soft_wrap=False)


def print_header(meta: dict, args) -> None:
    gp = meta.get("goodput")
    lines = [f"# mccl.bench: {meta['world_size']} ranks, backends {', '.join(meta['backends'])}, "
             f"torch {meta['torch']}" + (f", mccl {meta['mccl']}" if "mccl" in meta else "")
             + (f", git {meta['git']}" if meta.get("git") else ""),
             f"# host {meta['host']}, {meta['cpus']} CPUs"
             + (f" (rank 0 may run on {meta['cpus_usable']})" if meta.get("cpus_usable", meta["cpus"]) != meta["cpus"] else "")
             + f", load average {meta['loadavg_start'][0]:.2f} at start",
             "# goodput: " + (f"{cluster.format_goodput(gp)}, {gp['how']}" if gp else
                              "not measured: one rank has no link to another" if getattr(args, "goodput", None) == "measure"
                              and meta["world_size"] < 2 else "not given (--goodput measure|RATE): no %goodput column")]
    lines += cluster_lines(meta)
    if init := init_line(meta):
        lines.append(init)
    lines.append(device_line(meta))
    if meta["env"]:
        lines.append("# env: " + " ".join(f"{k}={v}" for k, v in sorted(meta["env"].items())))
    for b, note in meta["cpu_source"].items():
        lines.append(f"# cpu% of {b}: {note}")
    if getattr(args, "skew_ms", 0):
        lines.append(f"# skew: rank {args.skew_rank % meta['world_size']} waits 0..{args.skew_ms:g} ms before every "
                     f"iteration; times include it")
    if meta["loadavg_start"][0] > (meta["cpus"] or 1):
        lines.append(f"# WARNING: load average {meta['loadavg_start'][0]:.1f} exceeds {meta['cpus']} CPUs: the "
                     f"machine is busy, numbers are not representative")
    lines.append("# time: median over iterations of the slowest rank (mean in the detail table); busbw from "
                 "the median; GB/s = 1e9 B/s; busbw factors from nccl-tests doc/PERFORMANCE.md")
    if not getattr(args, "quiet", True):
        lines.append(f"#{'collective':>13} {'bknd':>5} {'size (B)':>12} {'count':>11} {'type':>8} {'redop':>5} "
                     f"{'root':>4} {'time (us)':>11} {'algbw':>7} {'busbw':>7} {'#wrong':>6} %goodput")
    print("\n".join(lines), flush=True)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_progress_row(row: dict) -> None:
    """One nccl-tests-like line per finished (collective, size, backend), while the run goes on."""
    if "error" in row:
        print(f"{row['op']:>14} {row['backend']:>5} {row['size']:>12} ERROR {row['error']}", flush=True)
        return
    if "unsupported" in row:
        print(f"{row['op']:>14} {row['backend']:>5} {row['size']:>12} unsupported: {row['unsupported']}", flush=True)
        return
    pct = f"{row['busbw_pct_goodput']:6.1f}%" if "busbw_pct_goodput" in row else ""
    print(f"{row['op']:>14} {row['backend']:>5} {row['size']:>12} {row['count']:>11} {row['type']:>8} "
          f"{row['redop']:>5} {row['root']:>4} {row['time_us']:>11.1f} {row['algbw']:>7.3f} {row['busbw']:>7.3f} "
          f"{row['wrong']:>6} {pct}", flush=True)


def _cpu(row: dict) -> str:
    return f"{_f(row.get('cpu_engine_pct'), '.0f')} / {_f(row.get('cpu_proc_pct'), '.0f')}"


def print_rounds(rows: list[dict], backends: list[str]) -> None:
    """Per collective and size, each backend's busbw (or % of goodput) in every round and the
    spread of its times: the evidence behind a "faster" or "parity" read off the median. Each
    round twice: from the median of per-iteration maxima (the table above) and from the loop
    (nccl-tests' figure: the slowest rank's whole timed loop over the iterations), then the loop
    figures' ratio, the second backend's median loop time over the first's (> 1: the first is
    faster)."""
    con = console()
    for op in dict.fromkeys(r["op"] for r in rows):
        t = Table(title=f"{op}: every round (median in the table above)", title_justify="left")
        t.add_column("size (B)", justify="right")
        pct = any("rounds_busbw_pct_goodput" in r for r in rows if r["op"] == op)
        unit = "%goodput" if pct else "busbw GB/s"
        for b in backends:
            t.add_column(f"{b}\n{unit} by round", justify="right")
            t.add_column(f"{b}\nspread %", justify="right")
            t.add_column(f"{b}\nloop {unit} by round", justify="right")
        if len(backends) >= 2:
            t.add_column(f"loop time\n{backends[1]}/{backends[0]}", justify="right")
        by = {(r["size"], r["backend"]): r for r in rows if r["op"] == op}
        for size in dict.fromkeys(r["size"] for r in rows if r["op"] == op):
            cells = [str(size)]
            loops = []
            for b in backends:
                r = by.get((size, b), {})
                vals = r.get("rounds_busbw_pct_goodput" if pct else "rounds_busbw")
                loop = r.get("rounds_busbw_loop_pct_goodput" if pct else "rounds_busbw_loop")
                loops.append(r.get("time_us_loop_median"))
                if vals is None:
                    cells += ["-", "-", "-"]
                    continue
                fmt = (lambda v: f"{v:.1f}") if pct else (lambda v: f"{v:.3f}")
                cells += [" / ".join(fmt(v) for v in vals), f"{r['spread_pct']:.1f}",
                          " / ".join(fmt(v) for v in loop) if loop and None not in loop else "-"]
            if len(backends) >= 2:
                cells.append(f"{loops[1] / loops[0]:.3f}" if None not in loops[:2] else "-")
            t.add_row(*cells)
        con.print(t)


def print_tables(rows: list[dict], backends: list[str], meta: dict) -> None:
    """Per collective: the nccl-tests table with the backends side by side (and busbw ratio of the
    first backend to the second), then a detail table: mean time, iterations, CPU, memory."""
    con = console()
    has_gp = meta.get("goodput") is not None
    ops = list(dict.fromkeys(r["op"] for r in rows))
    total_wrong = sum(r.get("wrong", 0) for r in rows)
    for op in ops:
        sizes = list(dict.fromkeys(r["size"] for r in rows if r["op"] == op))
        by = {(r["size"], r["backend"]): r for r in rows if r["op"] == op}
        t = Table(title=f"{op}  ({meta['world_size']} ranks)", title_justify="left")
        for col in ("size (B)", "count", "type", "redop", "root"):
            t.add_column(col, justify="right")
        for b in backends:
            t.add_column(f"{b}\ntime (us)", justify="right")
            t.add_column(f"{b}\nalgbw GB/s", justify="right")
            t.add_column(f"{b}\nbusbw GB/s", justify="right")
            if has_gp:
                t.add_column(f"{b}\n%goodput", justify="right")
            t.add_column(f"{b}\n#wrong", justify="right")
        if len(backends) > 1:
            t.add_column(f"busbw\n{backends[0]}/{backends[1]}", justify="right")
        for size in sizes:
            first = next(by[(size, b)] for b in backends if (size, b) in by)
            cells = [str(first["size"]), str(first["count"]), first["type"], first["redop"], str(first["root"])]
            for b in backends:
                r = by.get((size, b), {})
                if "unsupported" in r:
                    cells += ["unsupported", "", "", *([""] if has_gp else []), ""]
                    continue
                if "error" in r or not r:
                    cells += ["error", "", "", *([""] if has_gp else []), ""]
                    continue
                cells += [f"{r['time_us']:.1f}", f"{r['algbw']:.3f}", f"{r['busbw']:.3f}"]
                if has_gp:
                    cells.append(f"{r['busbw_pct_goodput']:.1f}")
                cells.append(str(r["wrong"]) if r["wrong"] == 0 else f"[bold red]{r['wrong']}[/]")
            if len(backends) > 1:
                a, c = by.get((size, backends[0]), {}), by.get((size, backends[1]), {})
                cells.append(f"{a['busbw'] / c['busbw']:.2f}" if a.get("busbw") and c.get("busbw") else "-")
            t.add_row(*cells)
        con.print(t)
        for b in backends:
            bw = [by[(s, b)]["busbw"] for s in sizes if "busbw" in by.get((s, b), {})]
            if bw:
                con.print(f"# Avg bus bandwidth ({op}, {b}): {statistics.fmean(bw):.4f} GB/s")

        d = Table(title=f"{op}: detail", title_justify="left")
        d.add_column("size (B)", justify="right")
        for b in backends:
            for col in ("mean (us)", "iters", "cpu % eng/proc", "peak RSS MiB", "+RSS MiB"):
                d.add_column(f"{b}\n{col}", justify="right")
        for size in sizes:
            cells = [str(size)]
            for b in backends:
                r = by.get((size, b), {})
                if "time_us_mean" not in r:
                    cells += [("unsupported" if "unsupported" in r else r.get("error", "-"))[:40], "", "", "", ""]
                    continue
                cells += [f"{r['time_us_mean']:.1f}", str(r["iters"]), _cpu(r), f"{r['rss_peak_mib']:.0f}",
                          f"{r['rss_extra_mib']:.1f}"]
            d.add_row(*cells)
        con.print(d)
    con.print("# cpu %: of one core, max over ranks: the backend's named engine threads ('-' when it names none) / "
              "the whole rank process. +RSS: peak RSS during warm-up and timing minus the RSS just before (tensors "
              "resident), max over ranks")
    if cpu := cluster.stream_cpu(meta.get("goodput") or {}):
        con.print(f"# the goodput stream cost its sender {cpu[0]:.0f}% and its receiver {cpu[1]:.0f}% of a core: a "
                  f"rank that sends and receives at that rate pays at least about {cpu[0] + cpu[1]:.0f}% to move its "
                  f"bytes, before any work of its own (more for data that is not in cache, as a collective's tensors "
                  f"are not)")
    refused = {}
    for r in rows:
        if "unsupported" in r:
            refused.setdefault(r["unsupported"], []).append(r["size"])
    for why, sizes in refused.items():
        con.print(f"# unsupported ({len(sizes)} size(s), not counted as failures): {why}")
    errors = [r for r in rows if "error" in r]
    con.print(f"# #wrong total: {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}"
              + (f"; {len(errors)} measurements failed" if errors else ""))


def plot(rows: list[dict], backends: list[str], meta: dict, path: str) -> None:
    """busbw vs size, one panel per collective, one line per backend, the goodput as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    cols = min(3, len(ops))
    nrows = -(-len(ops) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    gp = meta.get("goodput")
    for ax, op in zip(axes.flat, ops):
        for b in backends:
            pts = sorted((r["size"], r["busbw"]) for r in rows if r["op"] == op and r["backend"] == b and "busbw" in r)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=b)
        if gp:
            ax.axhline(gp["bits_per_s"] / 8e9, color="k", ls="--", lw=1, label=f"TCP goodput ({gp['tool']})")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {meta['world_size']} ranks")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    rate = meta.get("env", {}).get("MCCL_CLUSTER_RATE")
    fig.suptitle("mccl.bench" + (f", links {rate}" if rate else ", local") + f", {meta['time']}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
