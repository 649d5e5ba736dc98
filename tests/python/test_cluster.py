"""mccl.cluster: a 2-host emulated cluster at 1 Gbit/s and a 2-switch x 2-host one with a slow
uplink (root only), and its root check anywhere.

The root tests bring a cluster up under an id of their own (so they never touch another cluster on
the machine), measure goodput, run a tiny 2-rank benchmark in it, tear it down and check that
nothing named after it is left, and that no other mccl-* name appeared. Every subprocess has a
deadline, and a finalizer removes the cluster whatever happens.
"""
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from mccl import cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))


def _can_make_clusters() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    try:
        cluster.find_iproute()
    except cluster.ClusterError as exc:
        return str(exc)
    return ""


needs_root = pytest.mark.skipif(bool(_can_make_clusters()), reason=_can_make_clusters() or "ok")


def tool(*args, timeout=120, check=True):
    proc = subprocess.run([sys.executable, "-m", "mccl.cluster", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def all_mccl_names() -> set:
    sh = cluster.Shell()
    return {n for n in cluster._netns_names() + cluster._link_names(sh) if n.startswith(cluster.PREFIX)}


@pytest.fixture
def cluster_id():
    cid = "t" + format(os.getpid() % 36 ** 3, "x")[-3:]
    yield cid
    cluster.down(cid, quiet=True)  # whatever the test did


@needs_root
def test_two_hosts_goodput_bench_and_clean_teardown(cluster_id, tmp_path):
    before = all_mccl_names()
    tool("up", "--id", cluster_id, "--hosts", "2", "--rate", "1gbit")
    spec = cluster.load_spec(cluster_id)
    sh = cluster.Shell()
    # One switch: the one bridge mccl-<id>-br, no core, no uplinks.
    assert sorted(n[len(spec.prefix):] for n in cluster.existing_names(cluster_id, sh)) == ["br", "h0", "h1", "v0", "v1"]
    for i in range(2):
        link = sh.ip_("-n", spec.netns(i), "-o", "link", "show", "eth0").stdout
        assert "mtu 9000" in link and "state UP" in link, link
        assert "tbf" in sh.tc_("-n", spec.netns(i), "qdisc", "show", "dev", "eth0").stdout
        assert "tbf" in sh.tc_("qdisc", "show", "dev", spec.veth(i)).stdout

    gp = json.loads(tool("goodput", "--id", cluster_id, "--seconds", "3", "--ring", "--json").stdout)
    # tbf caps the link at 1 Gbit/s; a loaded 2-core machine may deliver less, but not far less.
    assert 0.3e9 < gp["bits_per_s"] <= 1.02e9, gp
    assert 0 < gp["sender_cpu_pct"] < 400 and 0 < gp["receiver_cpu_pct"] < 400, gp
    # --ring: both hosts stream to the other at once; each host's CPU is its sender's plus its receiver's.
    floor = gp["ring_floor"]
    assert [(s["client"], s["server"]) for s in floor["streams"]] == [(0, 1), (1, 0)], floor
    assert all(0.3e9 < s["bits_per_s"] <= 1.02e9 for s in floor["streams"]), floor
    for i in range(2):
        assert floor["host_cpu_pct"][i] == pytest.approx(floor["streams"][i]["sender_cpu_pct"]
                                                         + floor["streams"][1 - i]["receiver_cpu_pct"]), floor
        assert 0 < floor["host_cpu_pct"][i] < 800, floor
    # A stranger holding the ring's port in host 0: its server cannot listen, and the run fails naming
    # the server and the port rather than reporting whatever the stranger measured.
    stranger = subprocess.Popen(cluster.ns_argv(spec.netns(0), [cluster.iperf3_path(), "-s", "-p", str(floor["port"])]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.5)
        bad = tool("goodput", "--id", cluster_id, "--seconds", "1", "--ring", check=False)
        assert bad.returncode == 2 and f"h0's iperf3 server on {spec.addr(0)}:{floor['port']}" in bad.stderr, bad.stderr
        assert "Address already in use" in bad.stderr, bad.stderr
    finally:
        cluster._stop(stranger)

    out_json = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "mccl.bench", "--cluster", cluster_id, "--sizes", "1K,256K", "-n", "2",
                           "-w", "1", "--ops", "all_reduce,all_gather,broadcast", "--goodput", "measure",
                           "--goodput-seconds", "2", "--deadline", "200", "--json", str(out_json)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out_json.read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["env"]["MCCL_CLUSTER_ID"] == cluster_id
    assert "mccl.cluster" in data["meta"]["goodput"]["how"]
    assert data["meta"]["goodput"]["sender_cpu_pct"] > 0 and data["meta"]["goodput"]["receiver_cpu_pct"] > 0
    assert all(r["wrong"] == 0 and "error" not in r for r in data["results"]), data["results"]

    # The ranks really ran inside the hosts: rank i's network namespace is host i's.
    run = tool("run", "--id", cluster_id, "--timeout", "60", "--", sys.executable, "-c",
               "import os; print('RANK', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'], "
               "os.stat('/proc/self/ns/net').st_ino)")
    for i in range(2):
        ino = os.stat(os.path.join(cluster.NETNS_DIR, spec.netns(i))).st_ino
        assert f"RANK {i} 2 198.18.0.1 {ino}" in run.stdout, run.stdout

    tool("down", "--id", cluster_id)
    assert not cluster.existing_names(cluster_id, sh)
    assert not os.path.exists(cluster.state_path(cluster_id))
    assert all_mccl_names() <= before, all_mccl_names() - before
    assert "nothing to remove" in tool("down", "--id", cluster_id).stdout  # idempotent


_INIT_AND_REPORT = (
    "import os, torch, torch.distributed as dist, mccl\n"
    "dist.init_process_group('mccl')\n"
    "t = torch.ones(4); dist.all_reduce(t); assert t.tolist() == [2.0] * 4, t\n"
    "print('RANK', os.environ['RANK'], 'CPUS', sorted(os.sched_getaffinity(0)), flush=True)\n"
    "dist.destroy_process_group()\n")


def _init_and_report(cluster_id: str) -> subprocess.CompletedProcess:
    """Run _INIT_AND_REPORT on every host of the cluster, with mccl's INIT lines logged."""
    run = subprocess.run([sys.executable, "-m", "mccl.cluster", "run", "--id", cluster_id, "--timeout", "120", "--",
                          sys.executable, "-c", _INIT_AND_REPORT], cwd=ROOT,
                         env=dict(ENV, MCCL_DEBUG="INFO", MCCL_DEBUG_SUBSYS="INIT"),
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@needs_root
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: one per pinned host")
def test_hosts_share_the_machines_cpus_unless_pinned(cluster_id):
    """Hosts are namespaces of one machine: unpinned, their ranks compete for its CPUs, and mccl
    counts them all when it decides on a sender thread; with --cpus-per-host each host's
    processes run on CPUs of their own, and each rank counts only itself."""
    n = len(os.sched_getaffinity(0))
    tool("up", "--id", cluster_id, "--hosts", "2", "--rate", "1gbit")
    run = _init_and_report(cluster_id)
    assert run.stdout.count(f"(it may run on {n} CPUs; {n} CPUs shared by 2 ranks of this job)") == 2, run.stdout
    tool("down", "--id", cluster_id)

    tool("up", "--id", cluster_id, "--hosts", "2", "--rate", "1gbit", "--cpus-per-host", "1")
    cpus = sorted(os.sched_getaffinity(0))
    assert f"CPUs {cpus[1]}" in tool("status", "--id", cluster_id).stdout
    run = _init_and_report(cluster_id)
    for r in range(2):
        assert f"RANK {r} CPUS [{cpus[r]}]" in run.stdout, run.stdout
    # One CPU for one rank: no second thread.
    assert run.stdout.count("the engine thread sends (it may run on 1 CPUs; 1 CPUs shared by 1 ranks of this "
                            "job)") == 2, run.stdout
    # The CPUs were chosen at up: a command run from a narrower affinity pins the same ones.
    out = subprocess.run([sys.executable, "-m", "mccl.cluster", "exec", "--id", cluster_id, "--host", "1", "--",
                          sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: os.sched_setaffinity(0, [cpus[0]]))
    assert out.returncode == 0 and out.stdout.strip() == f"[{cpus[1]}]", out.stdout + out.stderr
    # The Python tool (iperf3's stand-in) from pinned hosts: rate and both ends' CPU.
    gp = json.loads(tool("goodput", "--id", cluster_id, "--seconds", "2", "--tool", "python", "--json").stdout)
    assert gp["bits_per_s"] > 0.3e9 and gp["tool"] == "python", gp
    assert 0 < gp["sender_cpu_pct"] < 200 and 0 < gp["receiver_cpu_pct"] < 200, gp
    tool("down", "--id", cluster_id)

    # More CPUs than there are: refused before anything is created.
    before = all_mccl_names()
    bad = tool("up", "--id", cluster_id, "--hosts", "2", "--cpus-per-host", str(n), check=False)
    assert bad.returncode != 0 and f"need {2 * n} CPUs; this process may run on {n}" in bad.stderr, bad.stderr
    assert all_mccl_names() == before


@needs_root
def test_down_cleans_up_after_a_crashed_run(cluster_id):
    """SIGKILL the tool while its ranks run: `down` still kills them and removes everything."""
    tool("up", "--id", cluster_id, "--hosts", "2", "--rate", "500mbit")
    spec = cluster.load_spec(cluster_id)
    runner = subprocess.Popen([sys.executable, "-m", "mccl.cluster", "run", "--id", cluster_id, "--", "sleep", "600"],
                              cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not all(cluster.netns_pids(spec.netns(i)) for i in range(2)):
            assert time.monotonic() < end, "the ranks never started"
            time.sleep(0.1)
        orphans = [p for i in range(2) for p in cluster.netns_pids(spec.netns(i))]
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        assert all(os.path.exists(f"/proc/{p}") for p in orphans)  # nobody cleaned up: a crash
    finally:
        if runner.poll() is None:
            runner.kill()
    out = tool("down", "--id", cluster_id).stdout
    assert "killed" in out, out
    time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in orphans)
    assert not cluster.existing_names(cluster_id, cluster.Shell())


@needs_root
def test_run_stops_every_rank_when_one_fails(cluster_id):
    tool("up", "--id", cluster_id, "--hosts", "2", "--rate", "1gbit")
    t0 = time.monotonic()
    proc = tool("run", "--id", cluster_id, "--timeout", "60", "--", sys.executable, "-c",
                "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)", check=False)
    assert proc.returncode == 3 and time.monotonic() - t0 < 30, proc.stderr
    assert "stopping the others" in proc.stderr
    spec = cluster.load_spec(cluster_id)
    assert not any(cluster.netns_pids(spec.netns(i)) for i in range(2))


def test_commands_that_need_root_say_so(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for argv in (["up", "--hosts", "2"], ["down"], ["goodput"], ["run", "--", "true"]):
        assert cluster.main(argv) == 2
        assert "needs root" in capsys.readouterr().err


def test_rates_and_names():
    assert cluster.parse_rate("2gbit") == 2e9 and cluster.parse_rate("500mbit") == 5e8
    assert cluster.parse_rate("1.91Gbit/s") == pytest.approx(1.91e9) and cluster.parse_rate("0.25gbps") == 2e9
    with pytest.raises(ValueError):
        cluster.parse_rate("2G")
    spec = cluster.ClusterSpec(id="c0", hosts=16, rate="5gbit")
    assert spec.netns(15) == "mccl-c0-h15" and spec.veth(15) == "mccl-c0-v15" and spec.bridge == "mccl-c0-br"
    assert spec.addr(0) == "198.18.0.1" and spec.addr(15) == "198.18.0.16"
    assert spec.tc_burst() == "625000b"
    assert len(cluster.ClusterSpec(id="abcd", hosts=999, subnet="198.18.0.0/16").veth(998)) <= 15  # IFNAMSIZ - 1
    with pytest.raises(cluster.ClusterError):
        cluster.ClusterSpec(id="toolong")
    env = cluster.rank_env(3, 8, "198.18.0.1", 29500, local_rank=1, local_world_size=2)
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "4"


def test_python_goodput_reports_rate_and_both_ends_cpu():
    """The Python goodput pair on loopback (no root): a rate, and CPU use of each end's thread."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        got = {}
        sink = threading.Thread(target=lambda: got.update(zip(("bits", "cpu"), cluster.goodput_sink(listener, 0.1))))
        sink.start()
        sender_cpu = cluster.goodput_source("127.0.0.1", listener.getsockname()[1], 0.5)
        sink.join(timeout=30)
    assert got["bits"] > 1e8, got
    # Moving hundreds of MB costs each end CPU time; one thread cannot use more than one core.
    assert 0 < got["cpu"] <= 101 and 0 < sender_cpu <= 101, (got, sender_cpu)


def test_rates_keep_their_digits_on_slow_links():
    assert cluster.format_rate(4.963e9) == "4.963 Gbit/s (0.6204 GB/s)"
    assert cluster.format_rate(99e3) == "0.000099 Gbit/s (0.0000124 GB/s)"  # 100kbit: not "0.000"


@pytest.mark.parametrize("args, says", [
    (["down", "--id", ""], "must be 1-4 lowercase letters or digits"),  # '' would match every cluster
    (["down", "--id", "../../tmp/x"], "must be 1-4 lowercase letters or digits"),
    (["status", "--id", "BAD"], "must be 1-4 lowercase letters or digits"),
    (["run", "--nproc", "0", "--", "true"], "--nproc: 0: must be 1 or more"),
    (["run", "--nproc-per-host", "0", "--", "true"], "--nproc-per-host: 0: must be 1 or more"),
    (["goodput", "--seconds", "nan"], "must be a finite number of seconds, at least 1"),
    (["goodput", "--seconds", "0.01"], "must be a finite number of seconds, at least 1"),
    (["up", "--id", "z9", "--rate", "garbage"], "--rate garbage: cannot parse rate"),
    (["up", "--id", "z9", "--subnet", "10.0.0.0/31"], "has no address for a host"),
    (["up", "--id", "z9", "--subnet", "garbage"], "--subnet garbage"),
    (["up", "--id", "z9", "--switches", "2", "--hosts", "3"], "3 hosts do not split evenly over 2 switches"),
    (["up", "--id", "z9", "--switches", "3", "--hosts-per-switch", "2,2"], "lists 2 switches, --switches says 3"),
    (["up", "--id", "z9", "--hosts-per-switch", "2,0"], "--hosts-per-switch: '2,0': expected a number of hosts"),
    (["up", "--id", "z9", "--hosts-per-switch", "300,2"], "each switch takes 1 to 254 hosts"),
    (["up", "--id", "z9", "--hosts", "5", "--hosts-per-switch", "2,2"], "--hosts 5: --switches and --hosts-per"),
    (["up", "--id", "z9", "--uplink-rate", "1gbit"], "--uplink-rate needs --switches 2 or more"),
    (["up", "--id", "z9", "--switches", "2", "--uplink-rate", "fast"], "--uplink-rate fast: cannot parse rate"),
    (["up", "--id", "z9", "--switches", "2", "--subnet", "198.18.0.0/24"], "2 switches need an IPv4 subnet"),
    (["run", "--rank-order", "random", "--", "true"], "expected in-order, interleave, shuffle or shuffle:SEED"),
    (["run", "--master-port", "70000", "--", "true"], "70000 is not a TCP port (1 to 65535)"),
    (["up", "--id", "z9", "--mtu", "0"], "0 is not an MTU (68 to 65535)"),
    (["nsexec"], "usage: nsexec NAMESPACE"),
    (["nsexec", "mccl-zz-h0", "--cpus", "0,,1", "--", "true"], "expected CPU numbers separated by commas"),
    (["nsexec", "mccl-zz-h0", "--cpus", "-1", "--", "true"], "expected CPU numbers separated by commas"),
    (["nsexec", "mccl-zz-h0", "--", "/nonexistent-program"], "/nonexistent-program: command not found"),
])
def test_bad_arguments_get_one_line_errors(args, says):
    """Every bad argument: exit status 2 and a message naming it, no traceback, nothing created."""
    before = all_mccl_names() if os.geteuid() == 0 else set()
    proc = tool(*args, check=False, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if os.geteuid() == 0:
        assert all_mccl_names() == before


@needs_root
def test_down_and_status_survive_a_bad_state_file():
    """A state file that does not parse is reported by status and removed by down --id; an empty
    id removes nothing."""
    os.makedirs(cluster.STATE_DIR, exist_ok=True)
    path = cluster.state_path("zq7")
    with open(path, "w") as f:
        f.write("{garbage")
    try:
        assert tool("down", "--id", "", check=False).returncode == 2 and os.path.exists(path)
        out = tool("status").stdout
        assert "cluster zq7: " in out and "cannot read" in out and "down --id zq7 removes it" in out, out
        assert tool("run", "--id", "zq7", "--", "true", check=False).returncode == 2
        assert path in tool("down", "--id", "zq7").stdout and not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_switch_layouts_addresses_and_rank_orders():
    """No root: how hosts map to switches, /24s and ranks (even, uneven and one switch)."""
    spec = cluster.ClusterSpec(id="c0", switches=2, hosts_per_switch=[2])
    assert spec.hosts == 4 and spec.hosts_per_switch == [2, 2] and spec.subnet == "198.18.0.0/16"
    assert [spec.addr(i) for i in range(4)] == ["198.18.0.1", "198.18.0.2", "198.18.1.1", "198.18.1.2"]
    assert spec.prefixlen == 16 and spec.switch_bridge(1) == "mccl-c0-br1" and spec.core_bridge == "mccl-c0-core"
    assert spec.uplink(1) == ("mccl-c0-up1", "mccl-c0-cu1") and spec.path_rate(0, 2) == spec.path_rate(0, 1) == 1e9
    uneven = cluster.ClusterSpec(id="c0", hosts_per_switch=[3, 4, 3], uplink_rate="100mbit")
    assert uneven.switches == 3 and uneven.hosts == 10
    assert [uneven.switch_of(i) for i in range(10)] == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert uneven.addr(3) == "198.18.1.1" and uneven.addr(9) == "198.18.2.3" and uneven.path_rate(0, 9) == 1e8
    assert len(cluster.ClusterSpec(id="abcd", switches=256, hosts=256).uplink(255)[0]) <= 15  # IFNAMSIZ - 1
    # One switch, as before: same names and addresses, no uplink (also from an old state file).
    one = cluster.ClusterSpec(id="c0", hosts=4, switches=1)
    assert one.bridge == "mccl-c0-br" and one.core_bridge is None and one.addr(3) == "198.18.0.4"
    old = cluster.ClusterSpec(**{"id": "c0", "hosts": 3, "rate": "1gbit", "subnet": "198.18.0.0/24"})
    assert old.switches == 1 and old.hosts_per_switch == [3] and old.addr(2) == "198.18.0.3"
    # Rank orders: in order, interleaved by switch, seeded shuffles (reproducible).
    assert cluster.rank_hosts(spec, 4) == [0, 1, 2, 3]
    assert cluster.rank_hosts(spec, 4, order="interleave") == [0, 2, 1, 3]
    assert cluster.rank_hosts(uneven, 10, order="interleave") == [0, 3, 7, 1, 4, 8, 2, 5, 9, 6]
    assert cluster.rank_hosts(spec, 8, 2, "interleave") == [0, 2, 0, 2, 1, 3, 1, 3]
    shuffled = cluster.rank_hosts(spec, 4, order="shuffle:1")
    assert shuffled == [3, 0, 2, 1] == cluster.rank_hosts(spec, 4, order="shuffle:1")
    assert sorted(cluster.rank_hosts(spec, 8, 2, "shuffle")) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert "rank 0: h3 (switch 1), rank 1: h0 (switch 0)" in cluster.format_rank_hosts(spec, shuffled)


def _full_mesh(spec, timeout=20.0):
    """Every host opens a TCP connection to every other host; returns the failures (empty: all
    connected). One listener and one connector per host, each with a deadline."""
    n, port = spec.hosts, 29611
    listen = ("import socket, sys\n"
              "with socket.create_server((sys.argv[1], int(sys.argv[2]))) as s:\n"
              "    s.settimeout(float(sys.argv[4]))\n"
              "    for _ in range(int(sys.argv[3])): s.accept()[0].close()\n")
    connect = ("import socket, sys, time\n"
               "end = time.monotonic() + float(sys.argv[2])\n"
               "for a in sys.argv[3:]:\n"
               "    while True:\n"
               "        try:\n"
               "            socket.create_connection((a, int(sys.argv[1])), timeout=5).close(); break\n"
               "        except OSError:\n"
               "            if time.monotonic() > end: raise\n"
               "            time.sleep(0.05)\n")
    procs = [subprocess.Popen(cluster.host_argv(spec, i, [sys.executable, "-c", listen, spec.addr(i), str(port),
                                                          str(n - 1), str(timeout)]),
                              env=ENV, stderr=subprocess.PIPE, text=True) for i in range(n)]
    procs += [subprocess.Popen(cluster.host_argv(spec, i, [sys.executable, "-c", connect, str(port), str(timeout),
                                                          *(spec.addr(j) for j in range(n) if j != i)]),
                               env=ENV, stderr=subprocess.PIPE, text=True) for i in range(n)]
    bad = []
    try:
        for i, p in enumerate(procs):
            err = p.communicate(timeout=timeout + 20)[1]
            if p.returncode != 0:
                bad.append((("listener", "connector")[i // n], i % n, err.strip()[-300:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return bad


@needs_root
def test_two_switches_uplink_limits_cross_switch_traffic(cluster_id):
    """2 switches x 2 hosts at 200 Mbit/s with 50 Mbit/s uplinks: per-switch /24s, every host
    reaches every other, both uplink ends shaped, a stream across the uplink gets about 50 Mbit/s
    while one inside a switch gets far more; `down` removes the switches, the core and the uplinks."""
    before = all_mccl_names()
    tool("up", "--id", cluster_id, "--switches", "2", "--hosts-per-switch", "2", "--rate", "200mbit",
         "--uplink-rate", "50mbit")
    spec = cluster.load_spec(cluster_id)
    sh = cluster.Shell()
    assert (spec.switches, spec.hosts_per_switch, spec.uplink_rate) == (2, [2, 2], "50mbit")
    for i in range(4):
        k, j = divmod(i, 2)
        addr = sh.ip_("-n", spec.netns(i), "-o", "-4", "addr", "show", "eth0").stdout
        assert f"inet 198.18.{k}.{j + 1}/16 " in addr, addr
        assert ipaddress.ip_address(spec.addr(i)) in ipaddress.ip_network(f"198.18.{k}.0/24")
        ports = sh.ip_("-o", "link", "show", "master", spec.switch_bridge(k)).stdout
        assert spec.veth(i) in ports and spec.uplink(k)[0] in ports, ports
        assert "rate 200Mbit" in sh.tc_("qdisc", "show", "dev", spec.veth(i)).stdout
    core_ports = sh.ip_("-o", "link", "show", "master", spec.core_bridge).stdout
    for k in range(2):
        assert spec.uplink(k)[1] in core_ports, core_ports
        for end in spec.uplink(k):
            qdisc = sh.tc_("qdisc", "show", "dev", end).stdout
            assert "tbf" in qdisc and "rate 50Mbit" in qdisc, (end, qdisc)
    status = tool("status", "--id", cluster_id).stdout
    assert "2 switches (hosts per switch 2,2)" in status and "uplinks tbf 50mbit" in status, status
    assert "switch 1: bridge " + spec.switch_bridge(1) + ", hosts h2..h3" in status, status
    assert _full_mesh(spec) == []

    intra = json.loads(tool("goodput", "--id", cluster_id, "--seconds", "2", "--json").stdout)
    cross = json.loads(tool("goodput", "--id", cluster_id, "--across-switches", "--seconds", "2", "--json").stdout)
    assert (intra["client"], intra["server"], intra["uplink_rate"]) == (1, 0, None), intra
    assert (cross["client"], cross["server"], cross["switches"], cross["uplink_rate"]) == (2, 0, [0, 1], "50mbit")
    assert 0.1e9 < intra["bits_per_s"] <= 0.205e9, intra
    assert 0.02e9 < cross["bits_per_s"] <= 0.055e9 and cross["bits_per_s"] < 0.7 * intra["bits_per_s"], (cross, intra)

    tool("down", "--id", cluster_id)
    assert not cluster.existing_names(cluster_id, sh) and not os.path.exists(cluster.state_path(cluster_id))
    assert all_mccl_names() <= before, all_mccl_names() - before


@needs_root
def test_shuffled_ranks_are_grouped_by_switch(cluster_id):
    """--rank-order shuffle:1 interleaves the switches' ranks (printed); mccl finds each switch's
    /24 without configuration and keeps each switch's ranks together in its rings."""
    tool("up", "--id", cluster_id, "--switches", "2", "--hosts-per-switch", "2", "--rate", "1gbit")
    spec = cluster.load_spec(cluster_id)
    hosts = cluster.rank_hosts(spec, 4, order="shuffle:1")
    assert [spec.switch_of(h) for h in hosts] == [1, 0, 1, 0]
    code = ("import os, torch, torch.distributed as dist, mccl\n"
            "dist.init_process_group('mccl')\n"
            "t = torch.full((1 << 17,), float(os.environ['RANK'])); dist.all_reduce(t); assert (t == 6).all()\n"
            "print('RANK', os.environ['RANK'], 'HOST', os.environ['MCCL_CLUSTER_HOST'], 'INO',\n"
            "      os.stat('/proc/self/ns/net').st_ino, flush=True)\n"
            "dist.destroy_process_group()\n")
    run = subprocess.run([sys.executable, "-m", "mccl.cluster", "run", "--id", cluster_id, "--rank-order", "shuffle:1",
                          "--timeout", "90", "--", sys.executable, "-c", code], cwd=ROOT,
                         env=dict(ENV, MCCL_DEBUG="INFO", MCCL_DEBUG_SUBSYS="INIT"),
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "rank order shuffle:1: " + cluster.format_rank_hosts(spec, hosts) in run.stderr, run.stderr
    for r, h in enumerate(hosts):
        ino = os.stat(os.path.join(cluster.NETNS_DIR, spec.netns(h))).st_ino
        assert f"RANK {r} HOST {h} INO {ino}" in run.stdout, run.stdout
        assert (f"rank {r}/4 of 'group 0': topology group '198.18.{spec.switch_of(h)}.0/24' (from the subnet); "
                f"2 groups") in run.stdout, run.stdout
    assert "rings visit the ranks in the order 0 2 1 3" in run.stdout, run.stdout


@needs_root
def test_bench_rank_order_and_uplink_goodput(cluster_id, tmp_path):
    """mccl.bench --cluster --rank-order shuffle:1 places the ranks as mccl.cluster run does
    (printed, and in the JSON's meta.placement); with two switches and --goodput measure it
    measures an uplink too (host 2 -> host 0 through 50 Mbit/s uplinks, header and JSON), and
    MCCL_TOPOLOGY_GROUP=all (one name for every rank) gives mccl one group, so its ring follows
    the shuffled ranks."""
    tool("up", "--id", cluster_id, "--switches", "2", "--hosts-per-switch", "2", "--rate", "200mbit",
         "--uplink-rate", "50mbit")
    spec = cluster.load_spec(cluster_id)
    hosts = cluster.rank_hosts(spec, 4, order="shuffle:1")

    def bench(out_json, *extra, env=()):
        proc = subprocess.run([sys.executable, "-m", "mccl.bench", "--cluster", cluster_id, "--rank-order", "shuffle:1",
                               "--sizes", "64K", "-n", "2", "-w", "1", "--ops", "all_reduce", "--deadline", "100",
                               "--json", str(out_json), *extra], cwd=ROOT,
                              env=dict(ENV, MCCL_DEBUG="INFO", MCCL_DEBUG_SUBSYS="INIT", **dict(env)),
                              capture_output=True, text=True, timeout=140)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads(out_json.read_text())
        assert all(r["wrong"] == 0 and "error" not in r for r in data["results"]), data["results"]
        return proc, data["meta"]

    proc, meta = bench(tmp_path / "a.json", "--goodput", "measure", "--goodput-seconds", "2")
    mapping = cluster.format_rank_hosts(spec, hosts)
    assert "mccl.cluster: rank order shuffle:1: " + mapping in proc.stderr, proc.stderr
    assert "# ranks: rank order shuffle:1: " + mapping in proc.stdout, proc.stdout
    assert meta["placement"] == {"rank_order": "shuffle:1", "hosts": hosts, "switches": [1, 0, 1, 0]}, meta
    assert meta["cluster"]["switches"] == 2 and meta["cluster"]["uplink_rate"] == "50mbit", meta
    intra, up = meta["goodput"], meta["goodput_uplink"]
    assert "host 1 -> host 0," in intra["how"] and "host 2 -> host 0 (switch 1 -> switch 0" in up["how"], (intra, up)
    assert 0.02e9 < up["bits_per_s"] <= 0.055e9 < 0.1e9 < intra["bits_per_s"] <= 0.205e9, (intra, up)
    assert "# goodput across an uplink: " in proc.stdout and "# goodput h2 -> h0 (switch 1 -> switch 0" in proc.stdout
    # Subnet groups: every rank in its switch's /24, 2 groups, rings keep each switch's ranks together.
    assert proc.stdout.count("(from the subnet); 2 groups\n") == 4, proc.stdout  # one mccl communicator per rank
    assert "rings visit the ranks in the order 0 2 1 3" in proc.stdout, proc.stdout

    proc, meta = bench(tmp_path / "b.json", env={"MCCL_TOPOLOGY_GROUP": "all"})
    assert meta["goodput_uplink"] is None and meta["env"]["MCCL_TOPOLOGY_GROUP"] == "all", meta
    assert proc.stdout.count("topology group 'all' (from MCCL_TOPOLOGY_GROUP); 1 group\n") == 4, proc.stdout
    assert "rings visit" not in proc.stdout, proc.stdout  # one group: the ring is rank order, the shuffled one
