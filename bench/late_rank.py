"""Which rank made each timed iteration slow, from mccl.bench JSON (every rank's iteration times).

Usage: PYTHONPATH=python python bench/late_rank.py RESULT.json [--op all_reduce] [--size 64M]

mccl.bench times iteration k on a rank from the end of its iteration k-1 to its own end, and
reports the median over iterations of the slowest rank's time; nccl-tests reports the loop (the
timed loop over the iterations). The two differ when ranks run ahead of each other: with parking
and credits a rank that starts late delays only the rank after it in the ring, whose iteration
is then long by that much while the late rank's next one is short by as much, and the late
rank moves one place along the ring each iteration. Then every iteration's maximum is long and
the loop is not. (On the 8-host testbed, 2026-12-06, gloo's two figures differed by as much as
mccl's, so the moving late rank is not the only cause of a difference.)

Per (op, size, backend, round) this prints: the loop figure and the median of maxima (ms), the
median over iterations of (slowest rank's time - median rank's time), and the late rank of every
iteration with the share of consecutive iterations in which it moved to the next rank (rank
order; the bench's rings run in rank order on one switch).
"""
import argparse
import json
import statistics

from mccl.model import parse_size


def analyse(row: dict) -> dict:
    """The late-rank pattern of one measured row (a round's row with per_rank.times_us)."""
    times = row["per_rank"]["times_us"]
    n, iters = len(times), len(times[0])
    late = [max(range(n), key=lambda r: times[r][k]) for k in range(iters)]
    excess = [max(t[k] for t in times) - statistics.median(t[k] for t in times) for k in range(iters)]
    moves = sum(1 for a, b in zip(late, late[1:]) if b == (a + 1) % n)
    return {"loop_ms": row["time_us_loop"] / 1e3, "median_of_max_ms": row["time_us"] / 1e3,
            "excess_ms": statistics.median(excess) / 1e3, "late": late,
            "moved_to_next": moves / max(1, iters - 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--op", default=None, help="only this collective (e.g. all_reduce)")
    ap.add_argument("--size", default=None, help="only this size (bytes, or 16M, 64K)")
    a = ap.parse_args()
    d = json.load(open(a.file))
    rows = d.get("rounds") or d["results"]
    size = parse_size(a.size) if a.size else None
    print(f"{'op':<14} {'size':>10} {'backend':<6} {'rnd':>3} {'loop ms':>9} {'max ms':>9} {'max-med':>8} "
          f"{'next %':>6}  late rank by iteration")
    for r in rows:
        if "per_rank" not in r or "times_us" not in r["per_rank"] or "time_us_loop" not in r:
            continue
        if (a.op and r["op"] != a.op) or (size and r["size"] != size):
            continue
        x = analyse(r)
        print(f"{r['op']:<14} {r['size']:>10} {r['backend']:<6} {r.get('round', 0):>3} {x['loop_ms']:>9.2f} "
              f"{x['median_of_max_ms']:>9.2f} {x['excess_ms']:>8.2f} {100 * x['moved_to_next']:>6.0f}  "
              f"{' '.join(map(str, x['late']))}")


if __name__ == "__main__":
    main()
