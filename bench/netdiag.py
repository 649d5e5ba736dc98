"""Sum the TCP and tc counters that `bench/device_extra.sh` (stage netdiag) dumps before and after
each backend's all-reduces, over every host, and print the differences.

Usage: python bench/netdiag.py RESULTS/net TAG [TAG ...]   (TAG e.g. 1-mccl: reads TAG-before.txt
and TAG-after.txt). Counters: /proc/net/snmp and /proc/net/netstat of each host's namespace (Tcp:,
TcpExt:), then `tc -s` of the host's eth0 (the host's egress, "eth0.*") and of its bridge-side
veth (what reaches the host, "veth.*"), in that order.

When the folder also holds `ss-TAG.txt` (or `.txt.gz`: `ss -tin` of one host sampled while the
run went on, each sample after a line "@ <unix time>"), each connection that moved over 10 MB is
printed from its last sample: bytes each way, busy ms, and the ms (and % of busy) the kernel found
it limited by the peer's receive window (rwnd_limited) and by its own send buffer
(sndbuf_limited), with its RTT and cwnd. A sender that is rwnd-limited is waiting on a receiver
that does not read fast enough (Linux tcp_info: tcpi_busy_time, tcpi_rwnd_limited,
tcpi_sndbuf_limited). Then the times at which the busiest sender ran BBR with a congestion window
of 4 packets or fewer: BBR's PROBE_RTT (probe_rtt_episodes).
"""
import collections
import gzip
import os
import re
import sys

KEYS = ["Tcp.OutSegs", "Tcp.RetransSegs", "TcpExt.TCPFastRetrans", "TcpExt.TCPTimeouts",
        "TcpExt.TCPLossProbes", "TcpExt.DelayedACKs", "TcpExt.TCPSackRecovery", "TcpExt.TCPOFOQueue",
        "TcpExt.TCPSACKReorder", "TcpExt.TCPDSACKRecv", "TcpExt.TCPToZeroWindowAdv",
        "TcpExt.TCPWantZeroWindowAdv", "TcpExt.TCPRcvQDrop", "eth0.dropped", "eth0.overlimits",
        "veth.dropped", "veth.overlimits", "softnet.dropped", "softnet.squeezed"]


def parse(path: str) -> dict:
    return parse_text(open(path).read())


def parse_text(text: str) -> dict:
    """Counters per host number (-1: the machine's softnet section) of one snapshot's text."""
    hosts, cur, nqdisc = {}, None, 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("## softnet"):
            cur, nqdisc = -1, 0
            hosts[cur] = collections.Counter()
            continue
        if cur == -1:
            cols = line.split()
            if len(cols) >= 3 and all(re.fullmatch(r"[0-9a-f]+", c) for c in cols):
                hosts[cur]["softnet.dropped"] += int(cols[1], 16)
                hosts[cur]["softnet.squeezed"] += int(cols[2], 16)
            continue
        m = re.match(r"## host (\d+)", line)
        if m:
            cur, nqdisc = int(m.group(1)), 0
            hosts[cur] = {}
            continue
        if cur is None:
            continue
        pre = line.split(":")[0]
        if pre in ("Tcp", "TcpExt") and i + 1 < len(lines) and lines[i + 1].startswith(pre + ":") \
                and not line.split()[1].lstrip("-").isdigit():
            for k, v in zip(line.split()[1:], lines[i + 1].split()[1:]):
                if v.lstrip("-").isdigit():
                    hosts[cur][f"{pre}.{k}"] = int(v)
        if line.startswith("qdisc tbf"):
            nqdisc += 1
        m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", line)
        if m and nqdisc in (1, 2):
            side = "eth0" if nqdisc == 1 else "veth"
            for k, v in zip(("bytes", "pkt", "dropped", "overlimits"), m.groups()):
                hosts[cur][f"{side}.{k}"] = int(v)
    return hosts


def ss_samples(path: str):
    """Every `ss -tin` sample in `path`: (unix time, {(local, peer): info line})."""
    opener = gzip.open if path.endswith(".gz") else open
    ts, conns, cur = None, {}, None
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("@ "):
                if ts is not None:
                    yield ts, conns
                ts, conns, cur = float(line[2:]), {}, None
            elif line.startswith("\t") and cur is not None:
                conns[cur] = line.strip()
            else:
                p = line.split()
                cur = (p[2], p[3]) if len(p) >= 4 and p[0].isdigit() and p[1].isdigit() else None
    if ts is not None:
        yield ts, conns


def ss_last(path: str) -> dict:
    """The last `ss -tin` sample of each connection (local, peer) in `path`, as its info line."""
    last = {}
    for _, conns in ss_samples(path):
        last.update(conns)
    return last


def probe_rtt_episodes(path: str, min_bytes: int = 100_000_000, gap_s: float = 0.1) -> list[tuple[float, float]]:
    """When the busiest sender of `path` (the connection that has sent the most, once past
    min_bytes) ran BBR with a congestion window of 4 packets or fewer: BBR's PROBE_RTT, which it
    enters when its minimum RTT has not been renewed for 10 s, and holds at least 200 ms (Cardwell
    et al., "BBR: Congestion-Based Congestion Control", ACM Queue 2016). Episodes: (first, last)
    sample times in seconds from the first sample, samples closer than gap_s joined."""
    out, t0 = [], None
    for ts, conns in ss_samples(path):
        t0 = ts if t0 is None else t0
        sent = {k: int(m.group(1)) for k, v in conns.items() if (m := re.search(r"bytes_sent:(\d+)", v))}
        if not sent or max(sent.values()) < min_bytes:
            continue
        info = conns[max(sent, key=sent.get)]
        m = re.search(r"(?<![a-z_])cwnd:(\d+)", info)
        if "bbr" not in info or m is None or int(m.group(1)) > 4:
            continue
        t = round(ts - t0, 3)
        if out and t - out[-1][1] <= gap_s:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def ss_report(path: str, min_bytes: int = 10_000_000) -> list[str]:
    """One line per connection of `path` that sent or received over min_bytes."""
    out = []
    for (local, peer), info in sorted(ss_last(path).items()):
        def field(key: str) -> str | None:  # rtt: but not minrtt: or rcv_rtt:
            m = re.search(rf"(?<![a-z_]){key}:([\d.]+)", info)
            return m.group(1) if m else None

        def num(key: str) -> float:
            return float(field(key) or 0.0)
        sent, recv = num("bytes_sent"), num("bytes_received")
        if max(sent, recv) < min_bytes:
            continue
        busy = num("busy")
        lim = {k: num(k) for k in ("rwnd_limited", "sndbuf_limited")}
        pct = {k: (f"{100 * v / busy:.1f}%" if busy else "-") for k, v in lim.items()}
        out.append(f"  {local} -> {peer}: sent {sent / 1e6:.1f} MB, received {recv / 1e6:.1f} MB, busy "
                   f"{busy:.0f} ms, rwnd_limited {lim['rwnd_limited']:.0f} ms ({pct['rwnd_limited']}), "
                   f"sndbuf_limited {lim['sndbuf_limited']:.0f} ms ({pct['sndbuf_limited']}), "
                   f"rtt {field('rtt') or '-'} ms, cwnd {num('cwnd'):.0f}")
    return out


def main() -> None:
    folder, tags = sys.argv[1], sys.argv[2:]
    for tag in tags:
        before, after = parse(f"{folder}/{tag}-before.txt"), parse(f"{folder}/{tag}-after.txt")
        total = collections.Counter()
        for h, counters in after.items():
            for k, v in counters.items():
                total[k] += v - before.get(h, {}).get(k, 0)
        print(tag, " ".join(f"{k.split('.', 1)[1] if k.startswith('Tcp') else k}={total[k]}" for k in KEYS))
        for ss in (f"{folder}/ss-{tag}.txt", f"{folder}/ss-{tag}.txt.gz"):
            if os.path.exists(ss):
                print("\n".join(ss_report(ss)))
                episodes = probe_rtt_episodes(ss)
                print(f"  busiest sender in BBR's PROBE_RTT (cwnd <= 4): "
                      + (", ".join(f"{a:.2f}-{b:.2f} s" for a, b in episodes) if episodes else "never"))


if __name__ == "__main__":
    main()
