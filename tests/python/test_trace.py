"""MCCL_TRACE (csrc/core/trace.h), ``python -m mccl.trace summary``, and the collectives' events
in torch.profiler (issue 17). Byte counts in the trace are checked exactly against what the ring
must move."""
from __future__ import annotations

import glob
import json

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks
from mccl import trace

ELEMS = 3 << 20  # 12 MiB of float32: the ring (MCCL_RING_THRESHOLD is 256 KiB), 3 equal chunks


def _traced(rank: int, world_size: int) -> dict:
    x = torch.full((ELEMS,), float(rank + 1))
    dist.all_reduce(x)
    out = torch.empty(ELEMS * world_size)
    dist.all_gather_into_tensor(out, torch.full((ELEMS,), float(rank)))
    group = dist.new_group(backend="mccl")  # a second communicator: a file of its own
    dist.all_reduce(torch.ones(8), group=group)
    ok = bool((x == world_size * (world_size + 1) / 2).all()) and bool(
        torch.equal(out, torch.arange(world_size, dtype=torch.float32).repeat_interleave(ELEMS)))
    name = dist.distributed_c10d._get_process_group_name(group)
    dist.destroy_process_group()  # writes the traces before this rank reports
    return {"ok": ok, "group": name}


def _spans(data, tid, name, seq):
    """Spans called ``name`` (a tuple: any of them) on track ``tid`` for collective ``seq``."""
    names = name if isinstance(name, tuple) else (name,)
    return [e for e in data["traceEvents"]
            if e.get("ph") == "X" and e.get("tid") == tid and e["name"] in names and e["args"]["seq"] == seq]


#: A frame arrives either straight into its receive ("recv") or, before its receive was posted,
#: into the park ("park"; csrc/transport/park.h).
ARRIVALS = ("recv", "park")


def test_trace_records_every_frame_exactly(tmp_path):
    n = 3
    prefix = str(tmp_path / "t")
    values = check_ok(run_ranks(_traced, n, deadline_s=120, env={"MCCL_TRACE": prefix}))
    assert all(v["ok"] for v in values)
    posted, loaded = 0, {}
    for r in range(n):
        path = f"{prefix}.group_0.rank{r}.json"
        data = loaded[r] = trace.load(path)
        assert data["otherData"]["rank"] == r and data["otherData"]["nranks"] == n
        assert data["otherData"]["dropped"] == 0
        colls = [e for e in data["traceEvents"] if e.get("cat") == "collective"]
        assert [(e["args"]["coll"], e["args"]["seq"], e["args"]["ok"]) for e in colls] == \
            [("allreduce", 0, True), ("allgather", 1, True)], colls
        send_track, recv_track = 1 + 2 * ((r + 1) % n), 2 + 2 * ((r - 1) % n)
        # Ring all-reduce: n - 1 chunks go out in the reduce-scatter and n - 1 in the all-gather,
        # as many come in; the reduce-scatter's n - 1 are reduced. Chunks are ELEMS / n elements.
        sent = sum(e["args"]["bytes"] for e in _spans(data, send_track, "send", 0))
        got = sum(e["args"]["bytes"] for e in _spans(data, recv_track, ARRIVALS, 0))
        reduced = sum(e["args"]["bytes"] for e in _spans(data, 0, "reduce", 0))
        assert sent == got == 2 * (n - 1) * (ELEMS // n) * 4, (sent, got)
        assert reduced == (n - 1) * (ELEMS // n) * 4, reduced
        # All-gather: this rank's block goes out, and every other rank's comes in, once.
        assert sum(e["args"]["bytes"] for e in _spans(data, send_track, "send", 1)) == (n - 1) * ELEMS * 4
        assert sum(e["args"]["bytes"] for e in _spans(data, recv_track, ARRIVALS, 1)) == (n - 1) * ELEMS * 4
        # One socket moves one frame at a time: a direction's spans never overlap.
        for tid in (send_track, recv_track):
            moves = sorted((e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid
                            and e["name"] in ("send", *ARRIVALS)), key=lambda e: e["ts"])
            for a, b in zip(moves, moves[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
        peers = {q: trace.load(f"{prefix}.group_0.rank{q}.json") for q in range(n) if q != r}
        summary = trace.summarize(data, peers)
        assert [c.name for c in summary] == ["allreduce #0", "allgather #1"]
        for c in summary:
            for link in c.links:
                assert 0 <= link.busy_us <= link.pending_us <= c.dur_us + 1e-3, link
                assert abs(sum(link.bubbles_us.values()) - link.idle_us) <= 1e-3 + 1e-6 * link.pending_us, link
                assert 0 <= link.window_us <= link.pending_us + 1e-3 and link.queued_us >= 0, link
        # Credit reports (csrc/transport/park.h): the receives from the ring's predecessor took
        # 2 (n - 1) chunks of the all-reduce and n - 1 blocks of the all-gather, all in 256 KiB
        # frames. A report is due after each, and one due while the last is still queued covers
        # both: totals rise by whole frames, at least one each time, up to all of it.
        taken = 2 * (n - 1) * (ELEMS // n) * 4 + (n - 1) * ELEMS * 4
        reports = [e["args"]["bytes"] for e in data["traceEvents"] if e.get("tid") == recv_track
                   and e["name"] == "report"]
        steps = [b - a for a, b in zip([0] + reports, reports)]
        assert reports and reports[-1] == taken and all(d > 0 and d % (1 << 18) == 0 for d in steps), steps
        posted += len(reports)
        # Rank r's successor's reports arrive here as grants: each one a total it reported.
        theirs = {e["args"]["bytes"]: e["ts"] for e in peers[(r + 1) % n]["traceEvents"]
                  if e.get("tid") == 2 + 2 * r and e["name"] == "report"}
        grants = [(e["args"]["bytes"], e["ts"]) for e in data["traceEvents"]
                  if e.get("tid") == send_track and e["name"] == "grant"]
        assert grants and all(b in theirs and ts >= theirs[b] for b, ts in grants), grants[:5]
        assert [b for b, _ in grants] == sorted(b for b, _ in grants)
        # The subgroup's communicator wrote its own file, named by torch's group name.
        sub = trace.load(f"{prefix}.group_{values[r]['group']}.rank{r}.json")
        assert [e["args"]["coll"] for e in sub["traceEvents"] if e.get("cat") == "collective"] == ["allreduce"]
    lat = trace.credit_latency(list(loaded.values()))
    assert lat.reports == posted and 0 < lat.matched <= lat.reports, lat
    assert 0 <= lat.median_us <= lat.p90_us <= lat.max_us, lat
    assert trace.main(["summary", *sorted(glob.glob(prefix + ".group_0.rank*.json")),
                       "--json", str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())
    assert len(rows) == 2 * n and all(row["links"] for row in rows)
    # A rank's trace given twice would double every figure of that rank: refused, naming both.
    twice = f"{prefix}.group_0.rank0.json"
    assert trace.main(["summary", twice, f"{prefix}.group_0.rank1.json", twice]) == 2


def _profiled(rank: int, world_size: int) -> dict:
    from torch.profiler import profile

    x = torch.ones(1 << 20)
    with profile() as prof:
        dist.all_reduce(x)
        work = dist.all_gather_into_tensor(torch.empty(2 << 20), torch.ones(1 << 20), async_op=True)
        work.wait()
        dist.broadcast(torch.ones(16), 0)
    events = [e for e in prof.events() if e.name.startswith("mccl:")]
    return {"names": sorted(e.name for e in events),
            "closed": all(e.time_range.end > e.time_range.start for e in events)}


def test_collectives_appear_in_torch_profiler():
    for v in check_ok(run_ranks(_profiled, 2, deadline_s=60)):
        assert v["names"] == ["mccl:all_gather_into_tensor", "mccl:all_reduce", "mccl:broadcast"], v
        assert v["closed"], v


def _coll(rank: int, seq: int, start: float, dur: float, recv_bytes: int, busy: float) -> "trace.CollectiveSummary":
    link = trace.LinkSummary(track=f"recv from rank {1 - rank}", bytes=recv_bytes, frames=4,
                             pending_us=dur, busy_us=busy)
    return trace.CollectiveSummary(rank=rank, name=f"allreduce #{seq}", seq=seq, coll="allreduce", count=1,
                                   dtype="float32", start_us=start, dur_us=dur, reduce_us=0.0,
                                   links=[link, trace.LinkSummary(track=f"send to rank {1 - rank}", bytes=8)])


def test_gap_decomposes_each_period_against_the_wire_bound(tmp_path, capsys):
    # 2 ranks, 3 collectives; each receive link carries 1e6 bytes, 8 ms at 1 Gbit/s (the bound).
    # seq 0: both start at 0; rank 1 ends at 9000 us.
    # seq 1: rank 0 starts at 9500, rank 1 at 10000; they end at 19000 and 20000.
    # seq 2: both start at 20000 and end at 28000.
    rows = [_coll(0, 0, 0, 8500, 10**6, 8000), _coll(1, 0, 0, 9000, 10**6, 8000),
            _coll(0, 1, 9500, 9500, 10**6, 8000), _coll(1, 1, 10000, 10000, 10**6, 9000),
            _coll(0, 2, 20000, 8000, 10**6, 7000), _coll(1, 2, 20000, 8000, 10**6, 7000)]
    g = trace.gaps(rows, 1e9)
    assert [r.seq for r in g] == [0, 1, 2] and all(r.ranks == 2 and r.bound == 8000 for r in g)
    assert g[0].period is None and g[0].launch is None and g[0].excess == 1000 and g[0].late_rank == 1
    # seq 1: period 20000 - 9000 = 11000 = launch 500 + skew 500 + after 10000 (= bound 8000 + excess 2000)
    assert (g[1].period, g[1].launch, g[1].skew, g[1].after_last_start, g[1].excess) == (11000, 500, 500, 10000, 2000)
    assert g[1].end_spread == 1000 and g[1].recv_busy == 8500 and g[1].recv_idle == 1250  # (1500 + 1000) / 2
    assert (g[2].period, g[2].launch, g[2].skew, g[2].excess) == (8000, 0, 0, 0)
    for r in g[1:]:
        assert r.period == r.launch + r.skew + r.bound + r.excess
    # The command reads a summary's JSON as well as traces; the mean leaves out --skip rows.
    path = tmp_path / "s.json"
    path.write_text(json.dumps(trace._as_json(rows)))
    assert trace.main(["gap", str(path), "--goodput", "1gbit", "--skip", "1"]) == 0
    out = capsys.readouterr().out
    assert "mean of 2 collectives after the first 1: period 9.50 ms = bound 8.00 ms (84.2% of the period)" in out
    assert trace.main(["gap", str(path), "--goodput", "fast"]) == 2
    assert trace.main(["gap", str(path), "--goodput", "1gbit", "--skip", "5"]) == 0
    assert "no collective with a period after the first 5 (3 in the trace): no mean" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        trace.main(["gap", str(path), "--goodput", "1gbit", "--skip", "-1"])
    with pytest.raises(SystemExit):
        trace.main(["summary", str(path), "--top", "0"])


def _x(tid, name, ts, dur, step=0, nbytes=0, cat="frame"):
    return {"ph": "X", "tid": tid, "name": name, "ts": ts, "dur": dur, "cat": cat,
            "args": {"seq": 0, "coll": "allreduce", "step": step, "bytes": nbytes, "offset": 0}}


def test_gap_while_the_sender_waits_for_credit_is_put_down_to_credit():
    """Rank 0's receive link from rank 1 idles from 100 to 300 us while rank 1's next frame to
    rank 0 waits for rank 0's credit (a ``credit`` span on rank 1's send track to rank 0, tid 1):
    the gap's cause is "credit", and rank 1's send link reports the 200 us waited."""
    coll = {"ph": "X", "tid": 0, "name": "mccl:all_reduce", "cat": "collective", "ts": 0, "dur": 500,
            "args": {"seq": 0, "coll": "allreduce", "count": 1024, "dtype": "float32"}}
    r0 = {"otherData": {"rank": 0, "nranks": 2}, "traceEvents": [
        coll, _x(4, "recv", 0, 100, 0, 4096), _x(4, "recv", 300, 100, 0, 4096)]}
    r1 = {"otherData": {"rank": 1, "nranks": 2}, "traceEvents": [
        dict(coll), _x(1, "send", 0, 50, 0, 4096), _x(1, "credit", 100, 200, 0, 4096),
        _x(1, "send", 300, 50, 0, 4096)]}
    (s0,) = trace.summarize(r0, {1: r1})
    (link,) = s0.links
    assert link.bubbles_us["credit"] == 200 and sum(link.bubbles_us.values()) == 200, link
    assert link.bubble_count["credit"] == 1
    (s1,) = trace.summarize(r1, {0: r0})
    (send,) = [l for l in s1.links if l.credit_us]
    assert send.credit_us == 200, send


def test_credit_latency_matches_each_report_to_its_grant_by_total():
    """Rank 0 reports 256 KiB and 512 KiB taken from rank 1 (``report`` instants on its receive
    track from rank 1, tid 4) at 100 and 400 us; rank 1 reads them (``grant`` instants on its send
    track to rank 0, tid 1) at 150 and 700 us: latencies 50 and 300 us. A third report that was
    never granted counts as posted, not matched; a grant without a report is ignored."""
    meta = {"nranks": 2, "communicator": "c", "host": "h"}
    r0 = {"otherData": {"rank": 0, **meta}, "traceEvents": [
        _x(4, "report", 100, 0, 0, 1 << 18), _x(4, "report", 400, 0, 0, 2 << 18), _x(4, "report", 900, 0, 0, 3 << 18)]}
    r1 = {"otherData": {"rank": 1, **meta}, "traceEvents": [
        _x(1, "grant", 150, 0, 0, 1 << 18), _x(1, "grant", 700, 0, 0, 2 << 18), _x(1, "grant", 800, 0, 0, 5 << 18)]}
    lat = trace.credit_latency([r0, r1])
    assert (lat.reports, lat.matched, lat.median_us, lat.p90_us, lat.max_us) == (3, 2, 175.0, 300.0, 300.0), lat
    assert lat.worst_link == "rank 1 -> rank 0 (p90 300.0 us)"
    # On another host the clocks differ: nothing is matched, nothing reported.
    assert trace.credit_latency([r0, {**r1, "otherData": {**r1["otherData"], "host": "other"}}]) is None
