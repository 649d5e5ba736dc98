"""Read MCCL's segment-level traces (``MCCL_TRACE=<prefix>``, csrc/core/trace.h).

Each rank writes ``<prefix>.<communicator>.rank<r>.json``, a Chrome / Perfetto trace: open it in
ui.perfetto.dev, or summarise it here::

    python -m mccl.trace summary /tmp/t.group_0.rank*.json [--json out.json] [--top 5]
    python -m mccl.trace gap /tmp/t.group_0.rank*.json --goodput 4.963gbit [--skip 3]
    python -m mccl.trace gap summary.json --goodput 4.963gbit      # or a summary's --json output

For every collective on every rank, and each link (one direction to one peer) it used, the summary
gives the time the link was *pending* (from the first frame posted on it to the last frame done),
the time it actually moved bytes (the union of its ``send`` / ``recv`` spans), and the gaps in
between. The receiving side is the wire's witness: a ``recv`` span lasts while the bytes of a frame
arrive, so a gap there is time the link from that peer carried nothing this rank was waiting for.
(A ``send`` span only lasts while the kernel takes the bytes, which its socket buffer usually does
at once; what holds a sender back shows as ``send-queued``, ``window`` and ``credit`` time,
reported per send link.) Each gap of a receive link is put down to one cause, first match wins:

``window``
    the peer's socket to this rank was full during the gap (a ``window`` span in the peer's trace,
    when that trace is among the files; else this rank's own send socket to the same peer);
``credit``
    the peer's next frame to this rank waited for this rank's credit report during the gap (a
    ``credit`` span in the peer's trace: its lead was at the bound, csrc/transport/park.h);
``reduce``
    the engine was reducing or copying a received segment during the gap;
``phase``
    the next frame belongs to the other phase of an all-reduce (reduce-scatter steps 0..n-2,
    all-gather steps n-1..2n-3);
``step``
    the next frame is of another step of the algorithm (the ring waits for the previous step's
    data before it can send);
``segment``
    the next frame is the next segment of the same step (the per-frame cost of the pipeline).

The summary ends with the credit loop's latency (csrc/transport/park.h): each ``report`` instant
on a receive link (a rank posting a CREDIT frame with the total its receives took from that peer)
is matched by total to the peer's ``grant`` instant (the frame read at the sender), when the two
traces share a host (one clock). A sender at its window waits at least this long for room, so a
latency near the window's transfer time (1.5 MiB at the link's rate) would mean credits starve it.

Times are microseconds on CLOCK_MONOTONIC, as the trace stores them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field, fields

from . import _cli

CAUSES = ("window", "credit", "reduce", "phase", "step", "segment")


@dataclass
class LinkSummary:
    """One direction of one link during one collective. Times in microseconds."""

    track: str
    bytes: int = 0
    frames: int = 0
    pending_us: float = 0.0
    busy_us: float = 0.0
    queued_us: float = 0.0  # send links: frames posted but not yet taken by the kernel
    window_us: float = 0.0  # send links: the socket full (the peer's TCP window, or the wire)
    credit_us: float = 0.0  # send links: a frame waiting for the peer's credit (its lead at the bound)
    parked_frames: int = 0  # receive links: frames that arrived before their receive was posted
    parked_bytes: int = 0
    bubbles_us: dict = field(default_factory=lambda: {c: 0.0 for c in CAUSES})
    bubble_count: dict = field(default_factory=lambda: {c: 0 for c in CAUSES})

    @property
    def idle_us(self) -> float:
        """Time the link had work pending but moved no byte."""
        return max(0.0, self.pending_us - self.busy_us)


@dataclass
class CollectiveSummary:
    rank: int
    name: str
    seq: int
    coll: str
    count: int
    dtype: str
    start_us: float
    dur_us: float
    reduce_us: float
    links: list


def load(path: str) -> dict:
    """A trace file as written by MCCL: ``{"otherData": {...}, "traceEvents": [...]}``."""
    with open(path) as f:
        data = json.load(f)
    if "traceEvents" not in data or "otherData" not in data:
        raise ValueError(f"{path}: not an MCCL trace (no traceEvents/otherData)")
    return data


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlaps(spans: list[tuple[float, float]], a: float, b: float) -> bool:
    return any(s < b and e > a for s, e in spans)


def summarize(data: dict, peers: dict | None = None) -> list[CollectiveSummary]:
    """Per collective of one rank's trace: its links' pending, busy and bubble times.

    ``peers`` maps rank -> trace of the other ranks of the same communicator on the same host
    (same clock), whose full sockets explain gaps on this rank's receive links.
    """
    meta = data["otherData"]
    rank, nranks = int(meta["rank"]), int(meta["nranks"])
    names = {}
    colls, engine, links = [], [], defaultdict(list)
    for e in data["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "collective":
            colls.append(e)
        elif e["tid"] == 0:
            engine.append(e)
        else:
            links[e["tid"]].append(e)
    out = []
    for c in sorted(colls, key=lambda e: e["ts"]):
        seq, kind = c["args"]["seq"], c["args"]["coll"]

        def mine(e):
            return e["args"]["seq"] == seq and e["args"]["coll"] == kind

        work = [(e["ts"], e["ts"] + e["dur"]) for e in engine if mine(e)]
        reduce_us = sum(b - a for a, b in work)
        summaries = []
        for tid in sorted(links):
            evs = [e for e in links[tid] if mine(e)]
            # A parked frame's bytes arrived during its "park" span (csrc/transport/park.h).
            moves = sorted((e for e in evs if e["name"] in ("send", "recv", "park")), key=lambda e: e["ts"])
            if not moves:
                continue
            waits = [e for e in evs if e["name"] in ("send-queued", "recv-wait")]
            windows = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["name"] == "window"]
            credits = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["name"] == "credit"]
            if tid % 2 == 0:  # a receive link: the peer's socket to this rank, from its trace
                peer = (tid - 2) // 2
                theirs = peers.get(peer) if peers else None

                def peer_spans(name):
                    return [] if theirs is None else [
                        (e["ts"], e["ts"] + e["dur"]) for e in theirs["traceEvents"]
                        if e.get("ph") == "X" and e.get("tid") == 1 + 2 * rank and e["name"] == name
                        and mine(e)]
                windows, credits = peer_spans("window"), peer_spans("credit")
            s = LinkSummary(track=names.get(tid, str(tid)))
            # Times are the collective's own: a frame parked before it started (an idle engine
            # reads ahead, transport/tcp.h) counts its bytes, not the time before the start.
            c0, c1 = c["ts"], c["ts"] + c["dur"]

            def span(e):
                a = min(max(e["ts"], c0), c1)
                return a, max(a, min(e["ts"] + e["dur"], c1))
            s.queued_us = sum(b - a for a, b in _union([span(e) for e in waits]))
            s.window_us = sum(b - a for a, b in _union(windows)) if tid % 2 == 1 else 0.0
            s.credit_us = sum(b - a for a, b in _union(credits)) if tid % 2 == 1 else 0.0
            s.frames = len(moves)
            s.bytes = sum(e["args"]["bytes"] for e in moves)
            parked = [e for e in moves if e["name"] == "park"]
            s.parked_frames, s.parked_bytes = len(parked), sum(e["args"]["bytes"] for e in parked)
            first = min(span(e)[0] for e in moves + waits)
            last = max(span(e)[1] for e in moves)
            s.pending_us = last - first
            busy = _union([span(e) for e in moves])
            s.busy_us = sum(b - a for a, b in busy)
            # Gaps between consecutive frames (one socket moves one frame at a time), and before
            # the first one; each put down to one cause.
            prev_end, prev_step = first, None
            for e in moves:
                (a, b), step = span(e), e["args"]["step"]
                if a > prev_end:
                    if _overlaps(windows, prev_end, a):
                        cause = "window"
                    elif _overlaps(credits, prev_end, a):
                        cause = "credit"
                    elif _overlaps(work, prev_end, a):
                        cause = "reduce"
                    elif kind == "allreduce" and prev_step is not None and \
                            (prev_step < nranks - 1) != (step < nranks - 1):
                        cause = "phase"
                    elif prev_step is not None and step != prev_step:
                        cause = "step"
                    else:
                        cause = "segment"
                    s.bubbles_us[cause] += a - prev_end
                    s.bubble_count[cause] += 1
                prev_end, prev_step = max(prev_end, b), step
            summaries.append(s)
        out.append(CollectiveSummary(rank=rank, name=c["name"], seq=seq, coll=kind, count=c["args"]["count"],
                                     dtype=c["args"]["dtype"], start_us=c["ts"], dur_us=c["dur"],
                                     reduce_us=reduce_us, links=summaries))
    return out


def summarize_all(traces: list[dict]) -> list[CollectiveSummary]:
    """:func:`summarize` for each trace, with the traces of the same communicator and host as
    its peers (their clocks agree: CLOCK_MONOTONIC of one kernel)."""
    out = []
    for t in traces:
        meta = t["otherData"]
        peers = {o["otherData"]["rank"]: o for o in traces
                 if o is not t and o["otherData"].get("communicator") == meta.get("communicator")
                 and o["otherData"].get("host") == meta.get("host")}
        out += summarize(t, peers)
    return out


@dataclass
class CreditLatency:
    """Report-to-grant times of one communicator's credit reports (us), over every link."""

    reports: int          # reports posted (in traces whose peer's trace is on the same host)
    matched: int          # of them, granted in the peer's trace
    median_us: float
    p90_us: float
    max_us: float
    worst_link: str       # "rank p -> rank r" (data direction) with the largest p90, or ""


def _p90(v: list[float]) -> float:
    """Nearest-rank 90th percentile of a non-empty list."""
    s = sorted(v)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def credit_latency(traces: list[dict]) -> CreditLatency | None:
    """Match every ``report`` (the receiver's trace, receive track of the data's sender) to the
    ``grant`` with the same total in the sender's trace (its send track to the receiver), for
    traces of one communicator on one host. None when no report has its peer's trace."""
    by_rank = {}
    for t in traces:
        m = t["otherData"]
        by_rank[(m.get("communicator"), m.get("host"), int(m["rank"]))] = t
    reports, per_link = 0, {}
    for (comm, host, r), t in by_rank.items():
        for e in t["traceEvents"]:
            if e.get("ph") != "X" or e["name"] != "report" or e["tid"] % 2 != 0:
                continue
            p = (e["tid"] - 2) // 2
            peer = by_rank.get((comm, host, p))
            if peer is None:
                continue
            reports += 1
            key = (comm, p, r)
            if key not in per_link:
                per_link[key] = ({g["args"]["bytes"]: g["ts"] for g in peer["traceEvents"]
                                  if g.get("ph") == "X" and g["name"] == "grant" and g["tid"] == 1 + 2 * r}, [])
            grants, latencies = per_link[key]
            ts = grants.get(e["args"]["bytes"])
            if ts is not None:
                latencies.append(ts - e["ts"])
    if reports == 0:
        return None
    lat = [x for _, latencies in per_link.values() for x in latencies]
    worst = max(((k, _p90(v[1])) for k, v in per_link.items() if v[1]), key=lambda kv: kv[1], default=None)
    if not lat:
        return CreditLatency(reports, 0, 0.0, 0.0, 0.0, "")
    return CreditLatency(reports=reports, matched=len(lat), median_us=statistics.median(lat), p90_us=_p90(lat),
                         max_us=max(lat), worst_link="" if worst is None else
                         f"rank {worst[0][1]} -> rank {worst[0][2]} (p90 {worst[1]:.1f} us)")


def report_credit_latency(lat: CreditLatency | None, stream=None) -> None:
    stream = stream or sys.stdout
    if lat is None:
        return
    print(f"credit reports: {lat.reports} posted, {lat.matched} granted in the peer's trace; report to grant "
          f"median {lat.median_us:.1f} us, p90 {lat.p90_us:.1f} us, max {lat.max_us:.1f} us"
          + (f"; slowest link {lat.worst_link}" if lat.worst_link else ""), file=stream)


def _fmt_ms(us: float) -> str:
    return f"{us / 1e3:9.3f}"


def report(summaries: list[CollectiveSummary], top: int, stream=sys.stdout) -> None:
    """Print, per collective and rank, its receive links (the wire) and send links (the sender's
    side), then the causes of the receive links' idle time over every collective."""
    print(f"{'rank':>4} {'collective':<16} {'link':<18} {'MiB':>8} {'frames':>6} {'dur ms':>9} {'pending':>9} "
          f"{'busy':>9} {'idle':>9} {'Gbit/s':>7}  idle by cause, ms (" + ", ".join(CAUSES) + ")", file=stream)
    totals = {c: 0.0 for c in CAUSES}
    for c in sorted(summaries, key=lambda s: (s.rank, s.start_us)):
        for link in c.links:
            if not link.track.startswith("recv") or link.bytes == 0:
                continue
            rate = link.bytes * 8 / (link.pending_us * 1e3) if link.pending_us > 0 else 0.0
            bub = " ".join(f"{link.bubbles_us[k] / 1e3:.3f}" for k in CAUSES)
            print(f"{c.rank:>4} {c.name:<16} {link.track:<18} {link.bytes / 2**20:8.2f} {link.frames:>6} "
                  f"{_fmt_ms(c.dur_us)} {_fmt_ms(link.pending_us)} {_fmt_ms(link.busy_us)} "
                  f"{_fmt_ms(link.idle_us)} {rate:7.3f}  {bub}", file=stream)
            for k in CAUSES:
                totals[k] += link.bubbles_us[k]
        for link in c.links:
            if link.track.startswith("send") and link.bytes > 0:
                print(f"{c.rank:>4} {c.name:<16} {link.track:<18} {link.bytes / 2**20:8.2f} {link.frames:>6} "
                      f"{_fmt_ms(c.dur_us)}   queued {link.queued_us / 1e3:.3f} ms, socket full "
                      f"{link.window_us / 1e3:.3f} ms, waiting for credit {link.credit_us / 1e3:.3f} ms, "
                      f"reduce/copy on the engine {c.reduce_us / 1e3:.3f} ms",
                      file=stream)
    parked = [(link.parked_frames, link.parked_bytes, link.frames) for c in summaries for link in c.links
              if link.track.startswith("recv")]
    if parked:
        nf, nb, all_frames = (sum(p[i] for p in parked) for i in range(3))
        print(f"parked (arrived before their receive was posted): {nf} of {all_frames} received frames, "
              f"{nb / 2**20:.2f} MiB", file=stream)
    total = sum(totals.values())
    if total > 0:
        parts = ", ".join(f"{k} {v / 1e3:.3f} ms ({100 * v / total:.0f}%)"
                          for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:top] if v > 0)
        print(f"receive links idle while pending, all collectives: {total / 1e3:.3f} ms: {parts}", file=stream)


@dataclass
class GapRow:
    """One collective across every rank of a communicator, against the wire's bound. Times in us.

    ``period`` runs from the previous collective's last end (on any rank) to this one's last end:
    the time a back-to-back loop pays per collective. It is the sum of ``launch`` (previous last
    end to this first start: the caller's turnaround, negative when ranks overlap), ``skew`` (first
    start to last start) and ``after_last_start`` (last start to last end); the last is the
    ``bound`` (bytes of the busiest receive link at the goodput) plus ``excess``. ``recv_idle`` and
    ``recv_busy`` are means over ranks of their busiest receive link's idle and busy time.
    """

    seq: int
    name: str
    ranks: int
    link_bytes: int
    bound: float
    period: float | None
    launch: float | None
    skew: float
    after_last_start: float
    excess: float
    end_spread: float
    recv_idle: float
    recv_busy: float
    late_rank: int


def gaps(summaries: list[CollectiveSummary], goodput_bps: float) -> list[GapRow]:
    """Per collective (by sequence number), the decomposition of :class:`GapRow`.

    ``goodput_bps`` is the link's measured goodput in bits per second (``mccl.cluster goodput``);
    the bound of a collective is the bytes its busiest receive link carried divided by it.
    """
    by_seq: dict[int, list[CollectiveSummary]] = defaultdict(list)
    for c in summaries:
        by_seq[c.seq].append(c)
    rows, prev_end = [], None
    for seq in sorted(by_seq):
        cs = by_seq[seq]
        starts = [c.start_us for c in cs]
        ends = [c.start_us + c.dur_us for c in cs]
        busiest = [max((l for l in c.links if l.track.startswith("recv")), key=lambda l: l.bytes, default=None)
                   for c in cs]
        busiest = [l for l in busiest if l is not None]
        link_bytes = max((l.bytes for l in busiest), default=0)
        bound = link_bytes * 8 / goodput_bps * 1e6
        last_end, last_start = max(ends), max(starts)
        after = last_end - last_start
        late = max(cs, key=lambda c: c.start_us + c.dur_us).rank
        rows.append(GapRow(seq=seq, name=cs[0].name, ranks=len(cs), link_bytes=link_bytes, bound=bound,
                           period=None if prev_end is None else last_end - prev_end,
                           launch=None if prev_end is None else min(starts) - prev_end,
                           skew=last_start - min(starts), after_last_start=after, excess=after - bound,
                           end_spread=last_end - min(ends),
                           recv_idle=sum(l.idle_us for l in busiest) / max(1, len(busiest)),
                           recv_busy=sum(l.busy_us for l in busiest) / max(1, len(busiest)),
                           late_rank=late))
        prev_end = last_end
    return rows


def report_gaps(rows: list[GapRow], skip: int, stream=None) -> None:
    """Print :func:`gaps`' rows, then the mean of the rows after the first ``skip`` (a benchmark's
    check pass and warm-up) that have a period. ``stream``: default sys.stdout."""
    stream = stream or sys.stdout
    def ms(v):
        return f"{'-':>8}" if v is None else f"{v / 1e3:8.2f}"
    print(f"{'seq':>4} {'collective':<16} {'ranks':>5} {'MiB/link':>8} {'bound':>8} {'period':>8} {'launch':>8} "
          f"{'skew':>8} {'after':>8} {'excess':>8} {'endsprd':>8} {'r.idle':>8} {'r.busy':>8} {'last':>4}"
          "   (ms; after = last start to last end = bound + excess)", file=stream)
    for r in rows:
        print(f"{r.seq:>4} {r.name:<16} {r.ranks:>5} {r.link_bytes / 2**20:8.2f} {ms(r.bound)} {ms(r.period)} "
              f"{ms(r.launch)} {ms(r.skew)} {ms(r.after_last_start)} {ms(r.excess)} {ms(r.end_spread)} "
              f"{ms(r.recv_idle)} {ms(r.recv_busy)} {r.late_rank:>4}", file=stream)
    kept = [r for r in rows[skip:] if r.period is not None]
    if not kept:
        print(f"no collective with a period after the first {skip} ({len(rows)} in the trace): no mean; "
              "lower --skip", file=stream)
        return
    def mean(f):
        return sum(f(r) for r in kept) / len(kept)
    period, bound = mean(lambda r: r.period), mean(lambda r: r.bound)
    print(f"mean of {len(kept)} collectives after the first {skip}: period {period / 1e3:.2f} ms = bound "
          f"{bound / 1e3:.2f} ms ({100 * bound / period:.1f}% of the period) + launch {mean(lambda r: r.launch) / 1e3:.2f}"
          f" + start skew {mean(lambda r: r.skew) / 1e3:.2f} + excess after the last start "
          f"{mean(lambda r: r.excess) / 1e3:.2f} ms; busiest receive links idle {mean(lambda r: r.recv_idle) / 1e3:.2f}"
          f" ms while pending, busy {mean(lambda r: r.recv_busy) / 1e3:.2f} ms", file=stream)


def _as_json(summaries: list[CollectiveSummary]) -> list[dict]:
    out = []
    for c in summaries:
        out.append({"rank": c.rank, "name": c.name, "seq": c.seq, "coll": c.coll, "count": c.count,
                    "dtype": c.dtype, "start_us": c.start_us, "dur_us": c.dur_us, "reduce_us": c.reduce_us,
                    "links": [{"track": l.track, "bytes": l.bytes, "frames": l.frames,
                               "pending_us": l.pending_us, "busy_us": l.busy_us, "idle_us": l.idle_us,
                               "queued_us": l.queued_us, "window_us": l.window_us, "credit_us": l.credit_us,
                               "parked_frames": l.parked_frames, "parked_bytes": l.parked_bytes,
                               "bubbles_us": l.bubbles_us, "bubble_count": l.bubble_count}
                              for l in c.links]})
    return out


def _is_summary(path: str) -> bool:
    """Whether a file is the JSON of ``summary --json`` (a list) rather than a trace (an object)."""
    with open(path) as f:
        return f.read(64).lstrip().startswith("[")


def _from_json(rows: list[dict]) -> list[CollectiveSummary]:
    """The summaries that :func:`_as_json` wrote (``summary --json``)."""
    out = []
    for r in rows:
        links = [LinkSummary(**{f.name: l[f.name] for f in fields(LinkSummary)}) for l in r["links"]]
        out.append(CollectiveSummary(rank=r["rank"], name=r["name"], seq=r["seq"], coll=r["coll"], count=r["count"],
                                     dtype=r["dtype"], start_us=r["start_us"], dur_us=r["dur_us"],
                                     reduce_us=r["reduce_us"], links=links))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mccl.trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="per collective and link: pending, busy, idle time and its causes")
    s.add_argument("files", nargs="+", help="trace files (<prefix>.<communicator>.rank<r>.json)")
    s.add_argument("--json", type=_cli.output_file, default=None, help="also write the summary as JSON to this file")
    s.add_argument("--top", type=_cli.int_at_least(1), default=len(CAUSES), help="causes to list in the last line")
    g = sub.add_parser("gap", help="per collective across ranks: its period against the wire's bound "
                                   "(launch gap, start skew, excess after the last start)")
    g.add_argument("files", nargs="+", help="trace files of one communicator, every rank's, or the JSON "
                   "that `summary --json` wrote for them")
    g.add_argument("--goodput", required=True,
                   help="the link's measured goodput, a tc rate (e.g. 4.963gbit: mccl.cluster goodput)")
    g.add_argument("--skip", type=_cli.int_at_least(0), default=3, help="collectives left out of the mean (default 3: "
                   "mccl.bench -w 1's check pass, warm-up, and first timed collective, whose period holds "
                   "the benchmark's own pause before timing)")
    args = p.parse_args(argv)
    traces, trace_paths, summaries = [], [], []
    for path in args.files:
        try:
            if args.cmd == "gap" and path.endswith(".json") and _is_summary(path):
                with open(path) as f:
                    summaries += _from_json(json.load(f))
            else:
                traces.append(load(path))
                trace_paths.append(path)
        except (OSError, ValueError, KeyError) as exc:
            print(f"mccl.trace: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    seen: dict[tuple, str] = {}
    for path, t in zip(trace_paths, traces):
        who = (t["otherData"].get("communicator"), t["otherData"].get("rank"))
        if who in seen:  # counted twice, every figure of that rank would double
            print(f"mccl.trace: {seen[who]} and {path} are both rank {who[1]} of communicator {who[0]}; "
                  "give each rank's trace once", file=sys.stderr)
            return 2
        seen[who] = path
    summaries += summarize_all(traces)
    if args.cmd == "gap":
        from mccl.cluster import parse_rate
        try:
            goodput = parse_rate(args.goodput)
        except ValueError as exc:
            print(f"mccl.trace: --goodput: {exc}", file=sys.stderr)
            return 2
        report_gaps(gaps(summaries, goodput), args.skip)
        return 0
    report(summaries, args.top)
    report_credit_latency(credit_latency(traces))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_as_json(summaries), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
