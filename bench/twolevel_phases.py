#!/usr/bin/env python3
"""Where a two-level all-reduce's time goes, from its MCCL_TRACE files (bench/NOTES.md, 2026-12-04).

    .venv/bin/python bench/twolevel_phases.py TRACE_DIR/tl.group_1.rank*.json --groups 4 --group-size 3 \
        --order "0 3 5 1 7 10 2 9 11 4 6 8" [--goodput 0.6204] [--bin-ms 5] [--uplink-seq 2]

Steps 0..g-2 of a rank's frames are the reduce-scatter inside its group, the next 2(G-1) the
all-reduce across groups (csrc/algo/ring.c, mcclTwoLevelAllReduce), the rest the all-gather. For
every collective after the first two (warm-up) it prints, in ms from the first rank's start: the
start skew, when phase 1 ended (first..last rank), phase 2's span and its median per-rank length,
phase 3's span. For collective --uplink-seq it prints, per group, the bytes its ranks received in
phase 2 per bin as % of --goodput (GB/s): the inbound uplink's use, since only phase 2 crosses it.
--order is the ring order the communicator logged ("rings visit the ranks in the order ..."). A
trace whose frames do not follow that split (phase 2 from another group, phases 1 and 3 from the
rank's own) is refused: it is not a two-level all-reduce over these groups.
"""
import argparse
import statistics as st

from mccl.trace import load

#: Steps at or above this mark control frames (csrc/transport/wire.h, MCCL_STEP_CONTROL).
STEP_CONTROL = 0x40000000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--groups", type=int, required=True)
    ap.add_argument("--group-size", type=int, required=True)
    ap.add_argument("--order", required=True, help="the ring order, space-separated ranks")
    ap.add_argument("--goodput", type=float, default=0.6204, help="GB/s (1e9 B/s) of one link")
    ap.add_argument("--bin-ms", type=float, default=5.0)
    ap.add_argument("--uplink-seq", type=int, default=2)
    a = ap.parse_args()
    g, G = a.group_size, a.groups
    order = [int(x) for x in a.order.split()]
    if len(order) != g * G:
        raise SystemExit(f"--order has {len(order)} ranks, not groups x group size = {g * G}")
    group = {r: order.index(r) // g for r in order}
    first, last = g - 1, g - 1 + 2 * (G - 1)  # phase 2's steps: [first, last)
    colls, frames = {}, []  # (rank, seq) -> (start, end); (rank, seq, phase, ts, dur, bytes)
    for f in a.files:
        trace = load(f)
        rank = trace["otherData"]["rank"]
        tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        for e in trace["traceEvents"]:
            if e.get("ph") != "X":
                continue
            if e["name"].startswith("allreduce #"):
                colls[(rank, int(e["name"].split("#")[1]))] = (e["ts"], e["ts"] + e["dur"])
            elif e["name"] == "recv" and e["args"].get("bytes", 0) > 0 and e["args"]["step"] < STEP_CONTROL:
                s = e["args"]["step"]
                ph = 0 if s < first else 1 if s < last else 2
                peer = int(tracks[e["tid"]].rsplit(" ", 1)[1])  # track "recv from rank P"
                if (group[peer] != group[rank]) != (ph == 1):  # only phase 2 comes from another group
                    raise SystemExit(f"{f}: rank {rank} got step {s} of {e['args']['coll']} #{e['args']['seq']} from "
                                     f"rank {peer}: not a two-level all-reduce over these groups")
                frames.append((rank, e["args"]["seq"], ph, e["ts"], e["dur"], e["args"]["bytes"]))
    span = {}
    for rank, seq, ph, ts, dur, _ in frames:
        lo, hi = span.get((rank, seq, ph), (float("inf"), 0.0))
        span[(rank, seq, ph)] = (min(lo, ts), max(hi, ts + dur))
    ranks = sorted({r for r, _ in colls})
    for seq in sorted({s for _, s in colls})[2:]:
        t0 = min(colls[(r, seq)][0] for r in ranks)
        ms = lambda t: (t - t0) / 1e3  # noqa: E731
        p = {ph: [span[(r, seq, ph)] for r in ranks if (r, seq, ph) in span] for ph in range(3)}
        if not all(p.values()):
            raise SystemExit(f"collective #{seq}: a phase has no frames (is it a two-level all-reduce of these groups?)")
        print(f"#{seq}: first start .. last end {ms(max(colls[(r, seq)][1] for r in ranks)):.1f} ms; start skew "
              f"{ms(max(colls[(r, seq)][0] for r in ranks)):.1f}; phase 1 ends {ms(min(x[1] for x in p[0])):.1f}.."
              f"{ms(max(x[1] for x in p[0])):.1f}; phase 2 {ms(min(x[0] for x in p[1])):.1f}..{ms(max(x[1] for x in p[1])):.1f}"
              f" (per rank, median {st.median(b - a for a, b in p[1]) / 1e3:.1f}); phase 3 "
              f"{ms(min(x[0] for x in p[2])):.1f}..{ms(max(x[1] for x in p[2])):.1f}")
    seq = a.uplink_seq
    if not all((r, seq) in colls for r in ranks):
        raise SystemExit(f"--uplink-seq {seq}: not a collective every trace has")
    t0 = min(colls[(r, seq)][0] for r in ranks)
    B = a.bin_ms * 1e3
    bins: dict = {}
    for rank, s, ph, ts, dur, nbytes in frames:
        if s != seq or ph != 1:
            continue
        x, end, d = ts - t0, ts - t0 + max(dur, 1e-3), max(dur, 1e-3)
        while x < end:  # spread the frame's bytes evenly over its span
            k = int(x // B)
            nxt = min((k + 1) * B, end)
            bins[(group[rank], k)] = bins.get((group[rank], k), 0.0) + nbytes * (nxt - x) / d
            x = nxt
    if not bins:
        raise SystemExit(f"collective #{seq}: no phase-2 frames (is it a two-level all-reduce of these groups?)")
    nb = max(k for _, k in bins) + 1
    print(f"# collective #{seq}: phase 2 bytes received per group per {a.bin_ms:g} ms, % of {a.goodput} GB/s")
    for gi in range(G):
        print(f"group {gi}: " + " ".join(f"{bins.get((gi, k), 0.0) / B * 1e6 / (a.goodput * 1e9) * 100:3.0f}"
                                          for k in range(nb)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
