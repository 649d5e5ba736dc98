"""Sum the TCP and tc counters that `bench/device_extra.sh` (stage netdiag) dumps before and after
each backend's all-reduces, over every host, and print the differences.

Usage: python bench/netdiag.py RESULTS/net TAG [TAG ...]   (TAG e.g. 1-mccl: reads TAG-before.txt
and TAG-after.txt). Counters: /proc/net/snmp and /proc/net/netstat of each host's namespace (Tcp:,
TcpExt:), then `tc -s` of the host's eth0 (the host's egress, "eth0.*") and of its bridge-side
veth (what reaches the host, "veth.*"), in that order.
"""
import collections
import re
import sys

KEYS = ["Tcp.OutSegs", "Tcp.RetransSegs", "TcpExt.TCPFastRetrans", "TcpExt.TCPTimeouts",
        "TcpExt.TCPLossProbes", "TcpExt.DelayedACKs", "TcpExt.TCPSackRecovery", "TcpExt.TCPOFOQueue",
        "TcpExt.TCPToZeroWindowAdv", "TcpExt.TCPWantZeroWindowAdv", "TcpExt.TCPRcvQDrop",
        "eth0.dropped", "eth0.overlimits", "veth.dropped", "veth.overlimits"]


def parse(path: str) -> dict:
    hosts, cur, nqdisc = {}, None, 0
    lines = open(path).read().split("\n")
    for i, line in enumerate(lines):
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


def main() -> None:
    folder, tags = sys.argv[1], sys.argv[2:]
    for tag in tags:
        before, after = parse(f"{folder}/{tag}-before.txt"), parse(f"{folder}/{tag}-after.txt")
        total = collections.Counter()
        for h, counters in after.items():
            for k, v in counters.items():
                total[k] += v - before.get(h, {}).get(k, 0)
        print(tag, " ".join(f"{k.split('.', 1)[1] if k.startswith('Tcp') else k}={total[k]}" for k in KEYS))


if __name__ == "__main__":
    main()
