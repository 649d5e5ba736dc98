"""bench/netdiag.py's `ss` report: a connection's last sample, its busy time and the share of it
the kernel found limited by the peer's receive window, read exactly from a synthetic file."""
import gzip
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("netdiag", ROOT / "bench" / "netdiag.py")
netdiag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netdiag)

SAMPLE = """@ 1.0
Recv-Q Send-Q Local Address:Port Peer Address:Port
0      0      10.0.0.2:5000   10.0.0.3:6000
\t bbr rtt:0.5/0.1 cwnd:20 bytes_sent:5000000 bytes_acked:5000000 busy:100ms rwnd_limited:10ms(10.0%)
0      0      10.0.0.2:5001   10.0.0.1:6001
\t bbr rtt:1.0/0.1 cwnd:10 bytes_sent:672 bytes_received:900 busy:1ms
@ 2.0
Recv-Q Send-Q Local Address:Port Peer Address:Port
0      0      10.0.0.2:5000   10.0.0.3:6000
\t bbr rtt:0.4/0.1 minrtt:0.01 cwnd:32 bytes_sent:20000000 bytes_retrans:5 bytes_acked:19000000 busy:400ms rwnd_limited:100ms(25.0%) sndbuf_limited:20ms(5.0%)
0      0      10.0.0.2:5001   10.0.0.1:6001
\t bbr rtt:1.0/0.1 rcv_rtt:9 cwnd:10 bytes_sent:672 bytes_received:30000000 busy:2ms
"""


def test_ss_report_reads_each_connections_last_sample(tmp_path):
    path = tmp_path / "ss-1-mccl.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(SAMPLE)
    last = netdiag.ss_last(str(path))
    assert set(last) == {("10.0.0.2:5000", "10.0.0.3:6000"), ("10.0.0.2:5001", "10.0.0.1:6001")}
    assert "bytes_sent:20000000" in last[("10.0.0.2:5000", "10.0.0.3:6000")]
    lines = netdiag.ss_report(str(path))
    assert lines == [
        "  10.0.0.2:5000 -> 10.0.0.3:6000: sent 20.0 MB, received 0.0 MB, busy 400 ms, rwnd_limited 100 ms "
        "(25.0%), sndbuf_limited 20 ms (5.0%), rtt 0.4 ms, cwnd 32",
        "  10.0.0.2:5001 -> 10.0.0.1:6001: sent 0.0 MB, received 30.0 MB, busy 2 ms, rwnd_limited 0 ms "
        "(0.0%), sndbuf_limited 0 ms (0.0%), rtt 1.0 ms, cwnd 10",
    ]
    # below the threshold nothing is printed
    assert netdiag.ss_report(str(path), min_bytes=40_000_000) == []


SNAP = """## host 0
Tcp: RtoAlgorithm OutSegs RetransSegs
Tcp: 1 {out} {re}
TcpExt: TCPSACKReorder TCPDSACKRecv
TcpExt: {ro} 2
qdisc tbf 8001: root refcnt 2 rate 5Gbit burst 625000b lat 50ms
 Sent 100 bytes 10 pkt (dropped 0, overlimits 7 requeues 0)
## softnet
{cpu0} 00000000 00000000
00000010 {drop1} {sq1} 00000000
"""


def test_parse_sums_softnet_backlog_drops_over_cpus(tmp_path):
    before = SNAP.format(out=100, re=1, ro=3, cpu0="000000ff 00000001", drop1="00000000", sq1="00000002")
    after = SNAP.format(out=250, re=4, ro=5, cpu0="000001ff 00000003", drop1="0000000a", sq1="00000004")
    b, a = netdiag.parse_text(before), netdiag.parse_text(after)
    assert a[0]["Tcp.OutSegs"] - b[0]["Tcp.OutSegs"] == 150 and a[0]["Tcp.RetransSegs"] == 4
    assert a[0]["TcpExt.TCPSACKReorder"] == 5 and a[0]["eth0.overlimits"] == 7
    # softnet_stat is hexadecimal: column 2 the backlog's drops, column 3 its time squeezes, summed over CPUs
    assert (b[-1]["softnet.dropped"], b[-1]["softnet.squeezed"]) == (1, 2)
    assert (a[-1]["softnet.dropped"], a[-1]["softnet.squeezed"]) == (3 + 10, 4)


def test_probe_rtt_episodes_are_the_busiest_senders_bbr_samples_at_cwnd_4(tmp_path):
    def sample(t, cc, cwnd, sent):
        return (f"@ {t}\nRecv-Q Send-Q Local Address:Port Peer Address:Port\n"
                f"0      0      10.0.0.2:5000   10.0.0.3:6000\n\t {cc} rtt:0.3/0.1 cwnd:{cwnd} bytes_sent:{sent}\n"
                f"0      0      10.0.0.2:5001   10.0.0.1:6001\n\t {cc} rtt:1.0/0.1 cwnd:2 bytes_sent:600\n")
    # t=100: too early (under min_bytes; the small connection's cwnd 2 never counts); 101.00-101.08:
    # one episode (samples 40 ms apart); 101.3: back to 40; 111.2: a second one; cubic never counts.
    text = (sample(100.0, "bbr", 4, 10) + sample(101.0, "bbr", 4, 2 * 10**8) + sample(101.04, "bbr", 3, 3 * 10**8)
            + sample(101.08, "bbr", 4, 4 * 10**8) + sample(101.3, "bbr", 40, 5 * 10**8)
            + sample(111.2, "bbr", 4, 9 * 10**8) + sample(112.0, "cubic", 2, 10**9))
    path = tmp_path / "ss-1-mccl.txt"
    path.write_text(text)
    assert netdiag.probe_rtt_episodes(str(path)) == [(1.0, 1.08), (11.2, 11.2)]
