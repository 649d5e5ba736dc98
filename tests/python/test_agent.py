"""mccl-agent (issue 19): probes, the rule, the state machine with hysteresis, the configuration,
the status command and service files, and the real agent joining and leaving a local Ray head.

Fakes drive the rule and the state machine (a fake clock, probes whose answer the test sets).
The real process and login probes see real processes whose argv[0] the test sets: a sleeping
process named "Pro Tools" (with this run's token after it where other runs on the machine could
see it too), and one named like OpenSSH's per-session process ("sshd: artist<token>@pts/7").
Every subprocess has a deadline and is stopped by its process id.
"""
from __future__ import annotations

import collections
import datetime as dt
import json
import os
import plistlib
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from mccl.agent import (Agent, BusyAppProbe, CpuLoadProbe, GpuLoadProbe, InputIdleProbe, ManualProbe, ProbeContext,
                        Reading, RemoteSessionProbe, Rule, ScheduleProbe, State, StateMachine, StaticProbe, parse_config)
from mccl.agent.config import EXAMPLE, ConfigError, load_config
from mccl.agent.probes import in_windows, parse_hid_idle_seconds, parse_ioreg_gpu_utilization, parse_time_window
from mccl.agent.service import launchd_plist, systemd_unit
from raynodes import forget_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
# The process probes see the whole machine, where other test runs may start their own fakes at
# the same time: this run's fakes carry a token of their own, and the agent here watches for them.
TOKEN = f"t{os.getpid()}"
PRO_TOOLS = f"Pro Tools {TOKEN}"
SSH = f"sshd: artist{TOKEN}@pts/7"


# ---- helpers ----------------------------------------------------------------------------------------

def fake_process(argv0: str, seconds: int = 120) -> subprocess.Popen:
    """A sleeping process whose argv[0] is ``argv0`` (what ps and psutil show, as for a real app)."""
    return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep {seconds}'], start_new_session=True)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def wait_for(pred, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout} s: {what}")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeNode:
    """Stands in for RayNode: records starts and stops, 'runs' between them."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.up = False
        self.proc = None

    def start(self) -> None:
        self.up = True
        self.events.append("start")

    def stop(self, reason: str = "") -> str:
        self.up = False
        self.events.append("stop")
        return "stopped"

    def running(self) -> bool:
        return self.up

    def exit_code(self):
        return None if self.up else 1

    def pid(self):
        return 4321 if self.up else None

    def pids(self) -> frozenset:
        return frozenset()

    def shown(self) -> str:
        return "ray start (fake)"


def make_config(tmp_path, **agent) -> "AgentConfig":  # noqa: F821
    data = {"ray": {"address": "127.0.0.1:1"},
            "agent": {"state_dir": str(tmp_path / "state"), "join_after_s": 10.0, "poll_interval_s": 1.0, **agent}}
    return parse_config(data)


def idle(name="p"):
    return Reading(name, False, "idle")


def busy(name="p", why="busy"):
    return Reading(name, True, why)


# ---- rule ----------------------------------------------------------------------------------------------

def test_rule_any_busy_probe_makes_the_machine_busy():
    rule = Rule()
    v = rule.decide([idle("a"), busy("b", "Pro Tools"), idle("c"), busy("d", "ssh")])
    assert v.busy is True and v.reasons == ("b: Pro Tools", "d: ssh")
    v = rule.decide([idle("a"), idle("b")])
    assert v.busy is False and v.reasons == ("a: idle", "b: idle")
    unknown = Reading("input", None, "no ioreg")
    assert rule.decide([idle("a"), unknown]).busy is False
    strict = Rule(unknown_is_busy=["input"]).decide([idle("a"), unknown])
    assert strict.busy is True and strict.reasons == ("input: no ioreg (unknown counts as busy)",)


# ---- state machine ----------------------------------------------------------------------------------------

def run_machine(sm: StateMachine, verdicts):
    """Feed (time, busy) pairs; return [(time, old, new, action)]."""
    out = []
    rule = Rule()
    for t, is_busy in verdicts:
        tr = sm.update(t, rule.decide([busy() if is_busy else idle()]))
        if tr is not None:
            out.append((t, tr.old.value, tr.new.value, tr.action))
    return out


def test_state_machine_joins_after_the_idle_period_and_leaves_at_once():
    sm = StateMachine(join_after_s=600)
    steps = [(t, False) for t in range(0, 601, 1)] + [(601, False), (602, True), (603, True)]
    assert run_machine(sm, steps) == [(0, "out", "arming", None), (600, "arming", "in", "join"),
                                      (602, "in", "out", "leave")]
    assert sm.state is State.OUT


def test_state_machine_any_busy_reading_restarts_the_idle_period():
    sm = StateMachine(join_after_s=10)
    steps = [(t, t == 7) for t in range(0, 30)]
    # idle 0..6, busy at 7: back out; idle again from 8, joins at 18.
    assert run_machine(sm, steps) == [(0, "out", "arming", None), (7, "arming", "out", None),
                                      (8, "out", "arming", None), (18, "arming", "in", "join")]


@pytest.mark.parametrize("period", [1, 2, 5, 9])
def test_state_machine_never_flaps_under_a_probe_faster_than_the_hysteresis(period):
    """A probe that toggles every `period` s (< join_after_s = 10) for 10,000 s: never joins."""
    sm = StateMachine(join_after_s=10)
    steps = [(t * 0.5, int(t * 0.5 // period) % 2 == 1) for t in range(20000)]
    transitions = run_machine(sm, steps)
    assert not [t for t in transitions if t[3] == "join"]
    assert sm.state is not State.IN
    # The same probe once it stays idle for the period: exactly one join.
    sm2 = StateMachine(join_after_s=10)
    steps2 = steps + [(10000 + t * 0.5, False) for t in range(40)]
    assert [t for t in run_machine(sm2, steps2) if t[3]] == [(10010.0, "arming", "in", "join")]


def test_state_machine_backs_off_after_the_node_exits_on_its_own():
    sm = StateMachine(join_after_s=10, backoff_s=30, max_backoff_s=100)
    run_machine(sm, [(t, False) for t in range(0, 11)])
    assert sm.state is State.IN
    tr = sm.node_exited(11, "the Ray node exited on its own (exit 1)")
    assert (tr.old, tr.new, tr.action) == (State.IN, State.OUT, None) and "not rejoining for 30 s" in tr.reason
    # Idle all along: the idle period (10 s) is over at 22, the back-off (30 s) only at 41.
    joins = [t for t in run_machine(sm, [(t, False) for t in range(12, 42)]) if t[3] == "join"]
    assert joins == [(41, "arming", "in", "join")]
    assert "not rejoining for 60 s" in sm.node_exited(42, "crash").reason  # doubled
    joins = [t for t in run_machine(sm, [(t, False) for t in range(43, 103)]) if t[3] == "join"]
    assert joins == [(102, "arming", "in", "join")]
    assert "not rejoining for 100 s" in sm.node_exited(103, "crash").reason  # capped at max_backoff_s
    # A node that stays up for the idle period (10 s) wipes the slate: the next back-off is 30 s again.
    joins = [t for t in run_machine(sm, [(t, False) for t in range(104, 230)]) if t[3] == "join"]
    assert joins == [(203, "arming", "in", "join")]
    assert "not rejoining for 30 s" in sm.node_exited(230, "crash").reason


# ---- the agent with fake probes and a fake node -------------------------------------------------------------

def test_agent_with_fake_probes_logs_every_transition_and_publishes_its_status(tmp_path):
    clock = FakeClock()
    apps, remote = StaticProbe("apps"), StaticProbe("remote")
    node = FakeNode()
    agent = Agent(make_config(tmp_path), probes=[apps, remote], node=node, clock=clock)
    for _ in range(10):
        agent.step()
        clock.t += 1
    assert agent.machine.state is State.ARMING and node.events == []
    st = json.load(open(agent.cfg.status_path))
    assert st["state"] == "arming" and st["join_in_s"] == pytest.approx(1.0) and st["busy"] is False
    assert [p["probe"] for p in st["probes"]] == ["apps", "remote"]
    agent.step()  # 10 s idle
    assert agent.machine.state is State.IN and node.events == ["start"]
    clock.t += 1
    apps.set(True, "'Pro Tools' is running (pid 4242)")
    tr = agent.step()
    assert (tr.new, tr.action) == (State.OUT, "leave") and node.events == ["start", "stop"]
    lines = [json.loads(line) for line in open(agent.cfg.transitions_path)]
    assert [(e["old"], e["new"], e["action"]) for e in lines] == [("out", "arming", None), ("arming", "in", "join"),
                                                                 ("in", "out", "leave")]
    assert lines[2]["reason"] == "apps: 'Pro Tools' is running (pid 4242)" and lines[2]["outcome"] == "stopped"
    assert lines[1]["outcome"] == "started: ray start (fake)"
    st = json.load(open(agent.cfg.status_path))
    assert st["state"] == "out" and st["busy"] is True and st["reason"] == "apps: 'Pro Tools' is running (pid 4242)"


def test_agent_notices_a_node_that_exits_on_its_own(tmp_path):
    clock = FakeClock()
    node = FakeNode()
    agent = Agent(make_config(tmp_path, backoff_s=5.0), probes=[StaticProbe("apps")], node=node, clock=clock)
    for _ in range(11):
        agent.step()
        clock.t += 1
    assert agent.machine.state is State.IN
    node.up = False  # the Ray node died (head gone, crash)
    agent.step()
    lines = [json.loads(line) for line in open(agent.cfg.transitions_path)]
    assert lines[-2]["reason"].startswith("the Ray node exited on its own (exit 1); not rejoining for 5 s")
    assert (lines[-1]["old"], lines[-1]["new"]) == ("out", "arming")


# ---- configuration ----------------------------------------------------------------------------------------

def test_example_configuration_is_the_defaults(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(EXAMPLE)
    cfg = load_config(str(path))
    assert cfg.ray.address == "10.0.0.1:6379" and cfg.ray.resource == "pool:mac"
    assert cfg.agent.join_after_s == 600.0 and cfg.probes.apps.names[0] == "Pro Tools"
    bare = parse_config({"ray": {"address": "10.0.0.1:6379"}})
    for section in ("ray", "agent"):
        assert getattr(bare, section) == getattr(cfg, section), section
    assert bare.probes == cfg.probes


@pytest.mark.parametrize("data, message", [
    ({}, "ray.address is required"),
    ({"ray": {"address": "h:1", "adress": "x"}}, "unknown key(s) in [ray]: adress"),
    ({"ray": {"address": "h:1"}, "probes": {"pro_tools": {}}}, "unknown key(s) in [probes]: pro_tools"),
    ({"ray": {"address": "h:1"}, "agent": {"join_after_s": "10"}}, "agent.join_after_s must be a number, got '10'"),
    ({"ray": {"address": "h:1"}, "agent": {"join_after_s": -1}}, "agent.join_after_s must not be negative"),
    ({"ray": {"address": "h:1"}, "probes": {"apps": {"names": "Pro Tools"}}}, "probes.apps.names must be a list of strings"),
    ({"ray": {"address": "h:1", "launcher": "sh"}}, "ray.launcher must be"),
    ({"ray": {"address": "h:1"}, "probes": {"schedule": {"windows": ["8pm-8am"]}}}, "is not HH:MM-HH:MM"),
    ({"ray": {"address": "h:1"}, "probes": {"schedule": {"days": ["monday"]}}}, "schedule days ['monday']"),
    ({"ray": {"address": "h:1"}, "agent": {"unknown_is_busy": ["keyboard"]}}, "unknown probe(s) ['keyboard']"),
    ({"ray": {"address": "nonsense"}}, "ray.address must be the head node's HOST:PORT"),
    ({"ray": {"address": "h:70000"}}, "ray.address must be the head node's HOST:PORT"),
    ({"ray": {"address": ":6379"}}, "ray.address must be the head node's HOST:PORT"),
])
def test_bad_configurations_name_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert message in str(err.value)


def test_missing_and_broken_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="no configuration file at .*example-config"):
        load_config(str(tmp_path / "none.toml"))
    (tmp_path / "bad.toml").write_text("[ray\naddress=")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(str(tmp_path / "bad.toml"))


# ---- probes: parsers and pure logic -------------------------------------------------------------------------

IOREG_HID = """+-o IOHIDSystem  <class IOHIDSystem, id 0x100000464, registered, matched, active, busy 0 (0 ms), retain 31>
    {
      "IOClass" = "IOHIDSystem"
      "HIDIdleTime" = 754210558125
      "HIDParameters" = {"HIDClickTime"=500000000}
    }
"""
IOREG_GPU = """+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x1000003d6, registered, matched, active>
    {
      "PerformanceStatistics" = {"In use system memory"=1234,"Device Utilization %"=37,"Renderer Utilization %"=35}
    }
"""


def test_console_input_probe_parses_macos_and_takes_a_reader():
    assert parse_hid_idle_seconds(IOREG_HID) == pytest.approx(754.210558125)
    assert parse_hid_idle_seconds("nothing") is None
    ctx = ProbeContext()
    assert InputIdleProbe(600, idle_seconds=lambda now: 30.0).read(ctx) == Reading(
        "input", True, "console input 30 s ago (< 600 s)", 30.0)
    assert InputIdleProbe(600, idle_seconds=lambda now: 754.2).read(ctx).busy is False
    assert InputIdleProbe(600, idle_seconds=lambda now: None).read(ctx).busy is None
    assert InputIdleProbe(600, idle_seconds=lambda now: float("inf")).read(ctx).detail == "no console session"


def test_gpu_probe_parses_macos_and_is_ignored_while_in_ray():
    assert parse_ioreg_gpu_utilization(IOREG_GPU) == 37.0
    probe = GpuLoadProbe(20, gpu_percent=lambda: 37.0)
    assert probe.read(ProbeContext(joined=False)) == Reading("gpu", True, "GPU 37% busy (> 20%)", 37.0)
    assert probe.read(ProbeContext(joined=True)).busy is False
    assert GpuLoadProbe(20, gpu_percent=lambda: None).read(ProbeContext()).busy is None


def test_a_probe_that_raises_reads_unknown():
    def boom(now):
        raise OSError("ioreg vanished")

    assert InputIdleProbe(600, idle_seconds=boom).read(ProbeContext()) == Reading(
        "input", None, "probe failed: OSError: ioreg vanished")


def test_schedule_windows_wrap_midnight_and_belong_to_their_first_day():
    assert parse_time_window("20:00-08:00") == (dt.time(20), dt.time(8))
    night = [parse_time_window("20:00-08:00")]
    wed = dt.datetime(2026, 12, 2)  # a Wednesday
    at = lambda day, h, m=0: wed + dt.timedelta(days=day, hours=h, minutes=m)
    assert [in_windows(at(0, h), night) for h in (7, 8, 12, 19, 20, 23)] == [True, False, False, False, True, True]
    fri_only = ["fri"]
    # Friday night's window runs into Saturday morning; Thursday night's is not Friday's.
    assert in_windows(at(2, 21), night, fri_only) and in_windows(at(3, 7, 59), night, fri_only)
    assert not in_windows(at(2, 7), night, fri_only) and not in_windows(at(3, 21), night, fri_only)
    whole = [parse_time_window("00:00-24:00")]
    assert in_windows(at(0, 23, 59), whole) and in_windows(at(0, 0), whole)
    probe = ScheduleProbe(["20:00-08:00"], clock=lambda: at(0, 12, 30))
    assert probe.read(ProbeContext()) == Reading("schedule", True, "Wed 12:30 is outside the training windows 20:00-08:00")
    probe = ScheduleProbe(["20:00-08:00"], clock=lambda: at(0, 22))
    assert probe.read(ProbeContext()).busy is False


def test_manual_switch_through_the_command_line(tmp_path):
    cfg_path = tmp_path / "agent.toml"
    cfg_path.write_text(f'[ray]\naddress = "h:1"\n[agent]\nstate_dir = "{tmp_path}"\n')
    probe = ManualProbe(str(tmp_path / "keep-out"))
    assert probe.read(ProbeContext()) == Reading("manual", False, "keep-out switch off")
    run = lambda *a: subprocess.run([PY, "-m", "mccl.agent", "--config", str(cfg_path), *a], capture_output=True,
                                    text=True, timeout=120)
    proc = run("keep-out", "on", "--reason", "mixing session until 23:00")
    assert proc.returncode == 0, proc.stderr
    assert probe.read(ProbeContext()) == Reading(
        "manual", True, f"keep-out switch on ({tmp_path / 'keep-out'}): mixing session until 23:00")
    assert run("keep-out", "off").returncode == 0
    assert probe.read(ProbeContext()).busy is False


# ---- the real process and login probes ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_busy_app_probe_sees_a_pro_tools_process():
    probe = BusyAppProbe([PRO_TOOLS])
    assert probe.read(ProbeContext()).busy is False
    proc = fake_process(PRO_TOOLS)
    plain = fake_process("Pro Tools")  # the default list's name exactly
    try:
        wait_for(lambda: psutil.Process(proc.pid).cmdline()[:1] == [PRO_TOOLS], 10, "the fake app's argv")
        wait_for(lambda: psutil.Process(plain.pid).cmdline()[:1] == ["Pro Tools"], 10, "the fake app's argv")
        assert probe.read(ProbeContext()) == Reading("apps", True, f"{PRO_TOOLS!r} is running (pid {proc.pid})", 1.0)
        # The agent's own processes never count (the job's workers could carry any name).
        assert probe.read(ProbeContext(own_pids=frozenset([proc.pid]))).busy is False
        assert BusyAppProbe([PRO_TOOLS.lower()]).read(ProbeContext()).busy is True  # case-insensitive
        assert BusyAppProbe([f"Logic* {TOKEN}"]).read(ProbeContext()).busy is False
        # The default list (Pro Tools first) sees the plain one.
        r = BusyAppProbe().read(ProbeContext())
        assert r.busy is True and r.detail.startswith("'Pro Tools' is running (pid "), r
    finally:
        stop_process(proc)
        stop_process(plain)
    assert probe.read(ProbeContext()).busy is False


@pytest.mark.timeout(60)
def test_remote_probe_sees_an_ssh_session_process_and_login_records():
    mine = RemoteSessionProbe(remote_processes=[f"sshd: *{TOKEN}@*"])
    assert mine.read(ProbeContext()).busy is False
    proc = fake_process(SSH)
    try:
        wait_for(lambda: psutil.Process(proc.pid).cmdline()[:1] == [SSH], 10, "argv")
        assert mine.read(ProbeContext()) == Reading("remote", True, f"remote session process {SSH!r} (pid {proc.pid})",
                                                    1.0)
        assert RemoteSessionProbe().read(ProbeContext()).busy is True  # the default patterns match it too
        assert RemoteSessionProbe(ignore_users=[f"artist{TOKEN}"], remote_processes=[f"sshd: *{TOKEN}@*"]).read(
            ProbeContext()).busy is False
    finally:
        stop_process(proc)
    assert mine.read(ProbeContext()).busy is False
    # Login records (utmp, through psutil.users()): remote hosts count, the local display does not.
    User = collections.namedtuple("suser", "name terminal host started pid")
    local = User("editor", "console", "", 0.0, 1)
    x11 = User("editor", ":0", ":0", 0.0, 2)
    ssh = User("editor", "pts/3", "10.1.2.3", 0.0, 3)
    admin = User("fleetadmin", "pts/4", "10.9.9.9", 0.0, 4)
    none = dict(remote_processes=[])
    assert RemoteSessionProbe(users=lambda: [local, x11], **none).read(ProbeContext()).busy is False
    assert RemoteSessionProbe(users=lambda: [local, ssh, admin], **none).read(ProbeContext()) == Reading(
        "remote", True, "remote login: editor on pts/3 from 10.1.2.3 and 1 more", 2.0)
    assert RemoteSessionProbe(ignore_users=["fleetadmin"], users=lambda: [admin], **none).read(ProbeContext()).busy is False


@pytest.mark.timeout(60)
def test_cpu_probe_leaves_out_the_agents_own_processes():
    """Two probes over the same window, one told that a spinning process is the agent's own: their
    readings differ by that process's CPU share (other engineers' load is in both)."""
    spin = subprocess.Popen([PY, "-c", "import time\nt=time.time()\nwhile time.time()-t<30: pass"])
    try:
        mine, theirs = CpuLoadProbe(max_percent=200, window_s=60), CpuLoadProbe(max_percent=200, window_s=60)
        own = frozenset([spin.pid])
        p = psutil.Process(spin.pid)
        c0 = sum(p.cpu_times()[:2])
        mine.read(ProbeContext(own_pids=own))
        theirs.read(ProbeContext())
        t0 = time.monotonic()
        time.sleep(3)
        a, b = mine.read(ProbeContext(own_pids=own)), theirs.read(ProbeContext())
        share = 100 * (sum(p.cpu_times()[:2]) - c0) / ((time.monotonic() - t0) * psutil.cpu_count())
    finally:
        spin.kill()
        spin.wait()
    assert share > 10, f"the spinning process got only {share:.1f}% of the machine"
    assert b.value - a.value == pytest.approx(share, abs=3.0), (a, b, share)


# ---- command line and service files ----------------------------------------------------------------------------

def test_status_command_shows_the_agents_file(tmp_path):
    clock = FakeClock()
    cfg = make_config(tmp_path)
    agent = Agent(cfg, probes=[StaticProbe("apps", True, "'Pro Tools' is running (pid 7)")], node=FakeNode(), clock=clock)
    agent.step()
    cfg_path = tmp_path / "agent.toml"
    cfg_path.write_text(f'[ray]\naddress = "127.0.0.1:1"\n[agent]\nstate_dir = "{tmp_path / "state"}"\n')
    proc = subprocess.run([PY, "-m", "mccl.agent", "--config", str(cfg_path), "status", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["state"] == "out" and st["probes"] == [
        {"probe": "apps", "busy": True, "detail": "'Pro Tools' is running (pid 7)", "value": None}]
    proc = subprocess.run([PY, "-m", "mccl.agent", "--config", str(cfg_path), "status"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, COLUMNS="160"))
    assert proc.returncode == 0 and "state out" in proc.stdout and "Pro Tools" in proc.stdout, proc.stdout
    assert "is the agent (pid" not in proc.stdout  # fresh
    empty = tmp_path / "empty.toml"
    empty.write_text(f'[ray]\naddress = "h:1"\n[agent]\nstate_dir = "{tmp_path / "nothing"}"\n')
    proc = subprocess.run([PY, "-m", "mccl.agent", "--config", str(empty), "status"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "no status at" in proc.stderr


def test_service_definitions():
    plist = plistlib.loads(launchd_plist("/etc/mccl-agent.toml", user="mccl", python="/opt/mccl/bin/python").encode())
    assert plist["Label"] == "org.mccl.agent" and plist["KeepAlive"] is True and plist["UserName"] == "mccl"
    assert plist["ProgramArguments"] == ["/opt/mccl/bin/python", "-m", "mccl.agent", "run", "--config",
                                         "/etc/mccl-agent.toml"]
    unit = systemd_unit("/etc/mccl-agent.toml", user="mccl", python="/opt/mccl/bin/python")
    assert "ExecStart=/opt/mccl/bin/python -m mccl.agent run --config /etc/mccl-agent.toml\n" in unit
    assert "User=mccl\n" in unit and "KillSignal=SIGTERM\n" in unit and "Restart=always\n" in unit
    proc = subprocess.run([PY, "-m", "mccl.agent", "--config", "/etc/x.toml", "service", "systemd"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and f"ExecStart={PY} -m mccl.agent run --config /etc/x.toml" in proc.stdout


def test_console_entry_point_is_declared():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert 'mccl-agent = "mccl.agent.cli:main"' in text


# ---- the real agent and a real Ray head ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive_nodes(address: str) -> list:
    """Alive nodes by the GCS, with their total resources."""
    from ray._raylet import GcsClient

    infos = GcsClient(address=address).get_all_node_info(timeout=10)
    return [dict(i.resources_total) for i in infos.values() if i.state == 0]  # 0: ALIVE


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the session this test started (the process group), nothing else."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture
def ray_head(tmp_path):
    port = free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen([PY, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--block",
                             "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats",
                             "--node-ip-address=127.0.0.1", "--object-store-memory=80000000"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    address = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: "Ray runtime started" in (tmp_path / "head.log").read_text() or head.poll() is not None,
                 120, "the Ray head to start")
        assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
        yield address
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(head)
        log.close()
        forget_cluster(port)


@pytest.mark.timeout(300)
def test_agent_joins_a_ray_head_and_leaves_for_pro_tools_and_a_remote_login(tmp_path, ray_head):
    join_after = 4.0
    state = tmp_path / "state"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"""
[ray]
address = "{ray_head}"
extra_args = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--object-store-memory=80000000"]
drain_s = 1.0      # drain through the GCS first (Ray Train would see a preemption), at most 1 s
env = {{ RAY_AUTH_MODE = "disabled" }}
[agent]
poll_interval_s = 0.5
join_after_s = {join_after}
state_dir = "{state}"
[probes.input]
enabled = false    # no console here (unknown would not keep it out either)
[probes.cpu]
enabled = false    # other engineers share this machine's 2 cores
[probes.gpu]
enabled = false
[probes.schedule]
windows = ["00:00-24:00"]
[probes.apps]
names = ["{PRO_TOOLS}"]
[probes.remote]
processes = ["sshd: *{TOKEN}@*"]
""")
    log = open(tmp_path / "agent.log", "w")
    started = time.time()
    agent = subprocess.Popen([PY, "-m", "mccl.agent", "--config", str(cfg), "run"], stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    fakes = []
    node_pids: list[int] = []

    def transitions():
        try:
            return [json.loads(line) for line in open(state / "transitions.jsonl")]
        except FileNotFoundError:
            return []

    def joined_nodes():
        return [n for n in alive_nodes(ray_head) if n.get("pool:mac") == 1.0]

    def leave_time(trigger: str) -> float:
        """Seconds from the trigger process's start until the node is gone from the cluster."""
        t0 = time.monotonic()
        fakes.append(fake_process(trigger))
        wait_for(lambda: not joined_nodes(), 30, f"the node to leave after {trigger!r} started")
        gone = time.monotonic() - t0
        # The agent records the transition once every process of the node is gone.
        wait_for(lambda: transitions()[-1]["action"] == "leave", 30, "the leave transition to be recorded")
        done = time.monotonic() - t0
        print(f"{trigger!r}: node gone from the cluster after {gone:.2f} s, all its processes stopped after {done:.2f} s")
        return done

    try:
        wait_for(lambda: joined_nodes(), 150, "the agent's node to join the head")
        trs = transitions()
        assert [(t["old"], t["new"]) for t in trs] == [("out", "arming"), ("arming", "in")]
        assert trs[1]["time"] - trs[0]["time"] >= join_after and trs[0]["time"] >= started
        node_pid = json.load(open(state / "status.json"))["node"]["pid"]
        node_pids.append(node_pid)

        pro_tools = leave_time(PRO_TOOLS)
        trs = transitions()
        assert (trs[-1]["old"], trs[-1]["new"], trs[-1]["action"]) == ("in", "out", "leave")
        assert trs[-1]["reason"].startswith(f"apps: {PRO_TOOLS!r} is running"), trs[-1]
        assert trs[-1]["outcome"].startswith("drained, stopped in "), trs[-1]
        assert not psutil.pid_exists(node_pid) or psutil.Process(node_pid).status() == psutil.STATUS_ZOMBIE

        # Flapping: Pro Tools comes and goes every 1.5 s for 12 s (< the 4 s idle period): no join.
        stop_process(fakes.pop())
        flap_start = time.time()
        for _ in range(4):
            time.sleep(1.5)
            fakes.append(fake_process(PRO_TOOLS))
            time.sleep(1.5)
            stop_process(fakes.pop())
        assert not [t for t in transitions() if t["new"] == "in" and t["time"] > flap_start], transitions()[-6:]
        assert not joined_nodes()

        wait_for(lambda: joined_nodes(), 150, "the node to join again once Pro Tools stayed closed")
        remote = leave_time(SSH)
        assert transitions()[-1]["reason"].startswith(f"remote: remote session process {SSH!r}")
        stop_process(fakes.pop())

        st = subprocess.run([PY, "-m", "mccl.agent", "--config", str(cfg), "status", "--json"], capture_output=True,
                            text=True, timeout=120)
        assert json.loads(st.stdout)["state"] in ("out", "arming")
        assert pro_tools <= 5.0 and remote <= 5.0, (pro_tools, remote)

        # SIGTERM: the agent leaves Ray (if in) and exits.
        wait_for(lambda: joined_nodes(), 150, "a third join")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        wait_for(lambda: not joined_nodes(), 15, "the node to leave when the agent stops")
    finally:
        for f in fakes:
            stop_process(f)
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(agent)
        for pid in node_pids:  # a node the agent left behind (only if the test failed): its session
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        log.close()
        print((tmp_path / "agent.log").read_text()[-3000:])
