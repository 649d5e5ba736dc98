"""Every torch.distributed collective on N ranks of one machine, each result checked exactly.

Issue 18's scale check: ``python bench/every_collective.py --nproc 64 [--json out.json]`` starts
N ranks over loopback (``mccl.cluster.launch``, under ``--deadline``), and each rank, on a
"mccl" process group:

- times ``init_process_group`` and counts the descriptors it added (``/proc/self/fd`` on Linux,
  through psutil) and, of them, the sockets, then counts its sockets again after a 1 MiB ring
  all-reduce, a recursive-doubling all-reduce and a broadcast (the peers a training step
  connects to, with runtime connection), and after every collective (all-to-all connects every
  peer);
- runs every collective the backend offers (all_reduce with sum/avg/min/max, reduce, broadcast,
  all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all,
  all_to_all_single with even and uneven splits, gather, scatter, barrier, send/recv and
  batch_isend_irecv around the ring, all_gather_object, broadcast_object_list) at ``--count``
  elements (and 1), on integer-valued float32 and int64 inputs, and compares every result with
  ``torch.equal`` to a reference computed in float64/int64 from the closed-form inputs of all
  ranks;
- sends its verdicts, init time, descriptors and a digest of all its outputs to rank 0 over a
  separate gloo group; rank 0 checks that the digests of the outputs every rank must share are
  equal, prints one table and exits 1 if anything was wrong.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from datetime import timedelta


def _inputs(rank: int, count: int, dtype, start: int = 0):
    """Elements start .. start + count - 1 of rank ``rank``'s input."""
    import torch

    i = torch.arange(start, start + count, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 11 - 5).to(dtype)  # small integers: sums of 64 stay exact in fp32


def _all(n: int, count: int, dtype, start: int = 0):
    """Every rank's elements start .. start + count - 1, one row per rank, in float64 or int64."""
    import torch

    return torch.stack([_inputs(r, count, dtype, start) for r in range(n)]).to(
        torch.float64 if dtype.is_floating_point else torch.int64)


def _socket_fds() -> dict[int, str]:
    """This process's sockets: descriptor -> "socket:[inode]" (empty where /proc is absent)."""
    fd_dir = "/proc/self/fd"
    out = {}
    if os.path.isdir(fd_dir):
        for fd in os.listdir(fd_dir):
            try:
                link = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if link.startswith("socket:"):
                out[int(fd)] = link
    return out


def _sockets() -> int:
    return len(_socket_fds()) if os.path.isdir("/proc/self/fd") else -1


def _socket_detail(before: dict[int, str]) -> list[list]:
    """The sockets opened since ``before`` (a `_socket_fds()` snapshot), one ``[kind, status,
    local address, local port, remote address, remote port]`` each from psutil's per-descriptor
    table (kind "tcp", "tcp6", "udp", "unix"; where psutil cannot place the descriptor, the /proc/net
    table that lists its inode, e.g. "netlink/0", or "other" where none does; "" and 0 where there
    is no address)."""
    import socket as so

    import psutil

    new = {fd for fd, link in _socket_fds().items() if before.get(fd) != link}
    out, seen = [], set()
    for c in psutil.Process().net_connections(kind="all"):
        if c.fd in new:
            seen.add(c.fd)
            fam = {so.AF_INET: "tcp", so.AF_INET6: "tcp6", so.AF_UNIX: "unix"}.get(c.family, str(c.family))
            if fam.startswith("tcp") and c.type == so.SOCK_DGRAM:
                fam = fam.replace("tcp", "udp")
            status = c.status if c.status and c.status != psutil.CONN_NONE else ""
            ends = [(a.ip, a.port) if a and hasattr(a, "port") else ("", 0) for a in (c.laddr, c.raddr)]
            out.append([fam, status, *ends[0], *ends[1]])
    cur = _socket_fds()
    out += [[_socket_family(cur[fd]), "", "", 0, "", 0] for fd in sorted(new - seen) if fd in cur]
    return out


def _socket_family(link: str) -> str:
    """What a socket psutil cannot place is, from its inode ("socket:[N]") in /proc/net's tables:
    "netlink/<protocol>", "packet", "unix", "raw", "udp", ...; "other" where no table lists it."""
    inode = link[len("socket:["):-1]
    tables = {"netlink": ("netlink", 9, 1), "packet": ("packet", 8, None), "unix": ("unix", 6, None),
              "raw": ("raw", 9, None), "raw6": ("raw", 9, None), "udp": ("udp", 9, None), "udp6": ("udp", 9, None)}
    for name, (kind, col, proto_col) in tables.items():
        try:
            with open(f"/proc/net/{name}") as f:
                next(f, None)  # the header
                for line in f:
                    cols = line.split()
                    if len(cols) > col and cols[col] == inode:
                        return f"{kind}/{cols[proto_col]}" if proto_col is not None else kind
        except OSError:
            continue
    return "other"


def _classify_sockets(every: list[dict]) -> list[dict]:
    """Per rank, what its new sockets are: listeners, links to peer ranks (a TCP connection whose
    other end, the same 4-tuple reversed, is a socket of another rank of this job), links to
    itself, TCP connections whose other end is in no rank (a store, a stranger, a peer that has
    closed its end), and anything else; with the peers that hold more than one link, and the
    states of the connections outside."""
    end_of = {}
    for r in every:
        for kind, status, lip, lport, rip, rport in r["socket_detail"]:
            if kind.startswith("tcp") and status != "LISTEN":
                end_of[(lip, lport, rip, rport)] = r["rank"]
    rows = []
    for r in every:
        row = {"listen": 0, "peer_links": 0, "self": 0, "outside": {}, "other": {}, "dup_peers": {}}
        per_peer: dict[int, int] = {}
        for kind, status, lip, lport, rip, rport in r["socket_detail"]:
            if not kind.startswith("tcp"):
                row["other"][kind] = row["other"].get(kind, 0) + 1
            elif status == "LISTEN":
                row["listen"] += 1
            else:
                peer = end_of.get((rip, rport, lip, lport))
                if peer is None:
                    row["outside"][status] = row["outside"].get(status, 0) + 1
                elif peer == r["rank"]:
                    row["self"] += 1
                else:
                    per_peer[peer] = per_peer.get(peer, 0) + 1
                    row["peer_links"] += 1
        row["dup_peers"] = {str(p): c for p, c in per_peer.items() if c > 1}
        rows.append(row)
    return rows


def rank_main(args) -> int:
    import psutil
    import torch
    import torch.distributed as dist

    import mccl  # noqa: F401  (registers the backend)

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames *_into_tensor; both tested
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=args.pg_timeout)
    # Rank 0's table and the digests travel on gloo (its own store prefix), not on the group under test.
    dist.init_process_group("gloo", timeout=timeout)
    control = dist.group.WORLD
    me = psutil.Process()
    base_fds = _socket_fds()
    fds, socks, t0 = me.num_fds(), _sockets(), time.perf_counter()
    pg = dist.new_group(backend="mccl", timeout=timeout)
    init_s = time.perf_counter() - t0
    added_fds, added_socks = me.num_fds() - fds, _sockets() - socks

    checks: dict[str, bool] = {}
    shared = hashlib.sha256()  # outputs every rank must hold alike

    def check(name: str, got, want) -> None:
        checks[name] = bool(torch.equal(got, want.to(got.dtype)))

    # First the collectives a training step uses (a ring all-reduce of 1 MiB, recursive doubling,
    # a broadcast): with runtime connection (above MCCL_ANNOUNCE_RANKS ranks) the sockets they
    # open are the ring's neighbours and the log2 n partners; all-to-all below opens the rest.
    step = (torch.arange(1 << 18, dtype=torch.float32) % 13) + rank
    dist.all_reduce(step, group=pg)
    check("all_reduce ring 1 MiB", step, (torch.arange(1 << 18, dtype=torch.float64) % 13) * n + n * (n - 1) / 2)
    one = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(one, group=pg)
    check("all_reduce doubling x1", one, torch.tensor([n * (n + 1) // 2]))
    dist.broadcast(step, src=n - 1, group=pg)
    socks_step = _sockets() - socks

    for count in sorted({1, args.count}):
        for dtype in (torch.float32, torch.int64):
            tag = f"{str(dtype).split('.')[-1]} x{count}"
            ref = _all(n, count, dtype)
            mine = _inputs(rank, count, dtype)
            ops = {"sum": (dist.ReduceOp.SUM, ref.sum(0)), "min": (dist.ReduceOp.MIN, ref.min(0).values),
                   "max": (dist.ReduceOp.MAX, ref.max(0).values)}
            if dtype.is_floating_point and n & (n - 1) == 0:  # a power of 2: the mean of integers is exact
                ops["avg"] = (dist.ReduceOp.AVG, ref.sum(0) / n)
            for name, (op, want) in ops.items():
                t = mine.clone()
                dist.all_reduce(t, op=op, group=pg)
                check(f"all_reduce {name} {tag}", t, want)
                shared.update(t.numpy().tobytes())
            root = 5 % n
            t = mine.clone()
            dist.reduce(t, dst=root, group=pg)
            if rank == root:
                check(f"reduce {tag}", t, ref.sum(0))
            t = mine.clone() if rank == 7 % n else torch.zeros_like(mine)
            dist.broadcast(t, src=7 % n, group=pg)
            check(f"broadcast {tag}", t, ref[7 % n])
            parts = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(parts, mine, group=pg)
            check(f"all_gather {tag}", torch.stack(parts), ref)
            flat = torch.empty(n * count, dtype=dtype)
            dist.all_gather_into_tensor(flat, mine, group=pg)
            check(f"all_gather_into_tensor {tag}", flat, ref.reshape(-1))
            shared.update(flat.numpy().tobytes())
            # reduce-scatter: rank r's block j is _inputs(r, n * count)[j*count:(j+1)*count]
            # Only block `rank` of every rank's input is needed: the whole n x n x count reference
            # took 537 MB per rank at 128 ranks (128 ranks on the GPU machine ran out of memory).
            blk_ref = _all(n, count, dtype, start=rank * count)
            big = _inputs(rank, n * count, dtype)
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, group=pg)
            want_rs = blk_ref.sum(0)
            check(f"reduce_scatter_tensor {tag}", out, want_rs)
            out2 = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out2, list(big.chunk(n)), group=pg)
            check(f"reduce_scatter {tag}", out2, want_rs)
            # all-to-all: rank r's block j goes to rank j, so rank r receives every rank's block r
            got = torch.empty(n * count, dtype=dtype)
            dist.all_to_all_single(got, big, group=pg)
            check(f"all_to_all_single {tag}", got, blk_ref.reshape(-1))
            outs = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_to_all(outs, list(big.chunk(n)), group=pg)
            check(f"all_to_all {tag}", torch.cat(outs), blk_ref.reshape(-1))
            # uneven: rank r sends (r + j) % 3 elements to rank j (some zero)
            send_splits = [(rank + j) % 3 for j in range(n)]
            recv_splits = [(j + rank) % 3 for j in range(n)]
            src = _inputs(rank, sum(send_splits), dtype)
            dst = torch.empty(sum(recv_splits), dtype=dtype)
            dist.all_to_all_single(dst, src, output_split_sizes=recv_splits, input_split_sizes=send_splits, group=pg)
            want_uneven = []
            for j in range(n):
                offs = sum((j + k) % 3 for k in range(rank))
                want_uneven.append(_inputs(j, sum((j + k) % 3 for k in range(n)), dtype)[offs:offs + recv_splits[j]])
            check(f"all_to_all_single uneven {tag}", dst, torch.cat(want_uneven))
            groot = 3 % n
            glist = [torch.empty_like(mine) for _ in range(n)] if rank == groot else None
            dist.gather(mine, gather_list=glist, dst=groot, group=pg)
            if rank == groot:
                check(f"gather {tag}", torch.stack(glist), ref)
            sroot = 2 % n
            recv = torch.empty_like(mine)
            dist.scatter(recv, scatter_list=list(ref.to(dtype)) if rank == sroot else None, src=sroot, group=pg)
            check(f"scatter {tag}", recv, ref[rank])
            # point to point around the ring: even ranks send first, odd ranks receive first
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            got = torch.empty_like(mine)
            if n > 1:
                if rank % 2 == 0:
                    dist.send(mine, nxt, group=pg)
                    dist.recv(got, prv, group=pg)
                else:
                    dist.recv(got, prv, group=pg)
                    dist.send(mine, nxt, group=pg)
                check(f"send/recv {tag}", got, ref[prv])
                got2 = torch.empty_like(mine)
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt, group=pg),
                                               dist.P2POp(dist.irecv, got2, prv, group=pg)])
                for q in reqs:
                    q.wait()
                check(f"batch_isend_irecv {tag}", got2, ref[prv])
    dist.barrier(group=pg)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "square": rank * rank}, group=pg)
    checks["all_gather_object"] = objs == [{"rank": r, "square": r * r} for r in range(n)]
    box = [{"from": 1 % n, "list": list(range(10))}] if rank == 1 % n else [None]
    dist.broadcast_object_list(box, src=1 % n, group=pg)
    checks["broadcast_object_list"] = box == [{"from": 1 % n, "list": list(range(10))}]

    every = [None] * n
    mine_report = {"rank": rank, "init_s": init_s, "descriptors": added_fds, "sockets": added_socks,
                   "sockets_step": socks_step, "sockets_end": _sockets() - socks,
                   "socket_detail": _socket_detail(base_fds),
                   "checks": checks, "digest": shared.hexdigest()}
    dist.all_gather_object(every, mine_report, group=control)
    dist.destroy_process_group(pg)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    names = list(dict.fromkeys(name for r in every for name in r["checks"]))  # reduce, gather: their root only
    failed = {name: [r["rank"] for r in every if r["checks"].get(name) is False] for name in names}
    checked = sum(len(r["checks"]) for r in every)
    digests = {r["digest"] for r in every}
    init = sorted(r["init_s"] for r in every)
    summary = {"world_size": n, "count": args.count, "kinds": len(names), "checks": checked,
               "failed": {k: v for k, v in failed.items() if v}, "digests_equal": len(digests) == 1,
               "init_s_max": init[-1], "init_s_median": init[len(init) // 2],
               "descriptors": sorted({r["descriptors"] for r in every}),
               "sockets": sorted({r["sockets"] for r in every}),
               "sockets_step": [min(r["sockets_step"] for r in every), max(r["sockets_step"] for r in every)],
               "sockets_end": [min(r["sockets_end"] for r in every), max(r["sockets_end"] for r in every)],
               "sockets_end_kinds": sorted({json.dumps(c, sort_keys=True) for c in _classify_sockets(every)}),
               "cpus": os.cpu_count(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    print(f"# every_collective: {n} ranks on {os.cpu_count()} CPUs, --count {args.count}")
    print(f"# mccl group init: slowest rank {summary['init_s_max']:.2f} s, median {summary['init_s_median']:.2f} s")
    print(f"# descriptors the mccl group added per rank: {summary['descriptors']} (sockets {summary['sockets']})")
    print(f"# its sockets per rank (min, max) after a ring all-reduce, recursive doubling and a broadcast: "
          f"{summary['sockets_step']}; after every collective (all-to-all included): {summary['sockets_end']}")
    print(f"# what those sockets are at the end ({len(summary['sockets_end_kinds'])} distinct per-rank tallies): "
          f"{'; '.join(summary['sockets_end_kinds'][:8])}")
    for name in names:
        bad = failed[name]
        print(f"{name:<40} {'ok' if not bad else 'WRONG on ranks ' + ', '.join(map(str, bad[:16]))}")
    print(f"# outputs every rank shares: {'equal on every rank' if summary['digests_equal'] else 'DIFFER across ranks'}")
    ok = not summary["failed"] and summary["digests_equal"]
    print(f"# {checked} checks ({len(names)} kinds) on {n} ranks: {'all exact' if ok else 'FAILURES'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "ranks": every}, f, indent=1)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=64, help="ranks to start on this machine (driver mode)")
    p.add_argument("--count", type=int, default=4099, help="elements per rank per collective (and 1)")
    p.add_argument("--pg-timeout", type=float, default=120.0, help="process group timeout (s)")
    p.add_argument("--deadline", type=float, default=600.0, help="driver: kill every rank after this many s")
    p.add_argument("--json", default=None, help="rank 0 writes the summary and every rank's report here")
    args = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return rank_main(args)
    from mccl import cluster

    return cluster.launch([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], args.nproc,
                          timeout=args.deadline, extra_env={"OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    sys.exit(main())
