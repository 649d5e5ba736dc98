"""An emulated cluster on one Linux machine: N hosts as network namespaces on one bridge, or on
K bridges ("switches") joined through a core bridge by shaped uplinks.

Every host is a network namespace ``mccl-<id>-h<i>`` with one interface ``eth0`` (address
``198.18.0.<i+1>/24`` by default, from the benchmarking range RFC 2544 reserves, so it never meets
a real network). Its other end ``mccl-<id>-v<i>`` is a port of the bridge ``mccl-<id>-br``, the
"switch". Both ends of every veth are shaped with ``tbf`` at the given rate (so traffic is limited
into and out of every host, as on a full-duplex link) and use MTU 9000 (jumbo frames, as in the
paper). Every name the tool creates starts with ``mccl-<id>-``, so clusters with different ids and
anything else on the machine never collide, and ``down`` finds everything by name even when the
process that brought the cluster up crashed.

With ``up --switches K --hosts-per-switch H --uplink-rate R`` there is one bridge per switch,
``mccl-<id>-br<k>``, and a core bridge ``mccl-<id>-core``; switch k's uplink is the veth pair
``mccl-<id>-up<k>`` (a port of switch k's bridge) / ``mccl-<id>-cu<k>`` (a port of the core), a
star, so there is no L2 loop. Both uplink ends are shaped with ``tbf`` at R (default: the host
rate), so each direction between switch k and the rest is limited to R; host links keep
``--rate``. Hosts are numbered switch by switch (0..H-1 on switch 0, H..2H-1 on switch 1, ...);
``--hosts-per-switch 3,4,3`` gives uneven switches. All hosts share one subnet (198.18.0.0/16 by
default), so every host reaches every other at L2 through the core, but host j of switch k gets
``198.18.k.(j+1)``: MCCL's topology detection, which groups ranks by IPv4 /24, puts each switch's
hosts in one group without configuration. ``--switches 1`` (the default) is the single bridge
above, names and addresses unchanged.

Commands (``python -m mccl.cluster <command> --help`` for options; all but ``status`` need root)::

    up       --hosts 4 --rate 2gbit        bring a cluster up (rolled back if anything fails);
             [--cpus-per-host C]            with C: pin each host's processes to C CPUs of its own
             [--switches K --hosts-per-switch H --uplink-rate R]   K switches of H hosts, R uplinks
    down     [--all]                        remove everything it created; idempotent
    status                                  what exists now, with addresses, qdiscs, pinned CPUs
    run      [--nproc N] -- CMD ARGS...     CMD once per rank, rank i in host i, torchrun-style env
             [--rank-order shuffle[:SEED]]  ranks to hosts in a seeded shuffled order (or interleave)
    exec     --host I -- CMD ARGS...        one command inside host I (no rank environment)
    goodput  [--server 0 --client 1]        single-stream TCP goodput between two hosts
             [--across-switches]            from switch 1's first host to host 0: an uplink's goodput
             [--ring]                       also every host to the next at once (iperf3): the ring floor

``run`` gives every rank MASTER_ADDR/MASTER_PORT (host 0), RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME,
TORCHELASTIC_RUN_ID, OMP_NUM_THREADS=1 and GLOO_SOCKET_IFNAME=eth0 (Gloo otherwise resolves the
machine's host name to an address that does not exist inside the namespace), and kills every rank
when one fails, when the deadline passes, or when the tool itself is interrupted. With
``--rank-order`` other than ``in-order`` it prints which host (and switch) each rank runs in, and
MASTER_ADDR is rank 0's host; every rank also gets MCCL_CLUSTER_HOST, MCCL_CLUSTER_SWITCH and
MCCL_CLUSTER_RANK_ORDER (``mccl.bench --cluster ID --rank-order ...`` launches through the same code).

The hosts share the machine's CPUs unless ``up --cpus-per-host C`` gives each its own: host i gets
the (i+1)-th C of the CPUs ``up`` may run on, kept in the cluster's state, and every process the
tool starts in host i (``run``'s ranks, ``exec``, the goodput tools) is pinned to them.

``goodput`` uses iperf3 (Debian package ``iperf3``) when it is installed and otherwise a Python
socket sender/receiver; both measure one TCP stream's payload rate at the receiver after a
warm-up second, which is what a ring link can carry, and the CPU the stream cost its sending and
its receiving process (% of one core), the kernel's floor for a rank that sends and receives at
that rate. ``--ring`` adds the ring floor: every host streams to the next at the same time, so each
host sends and receives as a ring rank does, with the network's kernel work landing where it lands
during a collective (on this emulation the veths', bridge's and tbf's softirqs are charged to
whichever thread they interrupt); each host's sender plus receiver CPU is what a ring backend's
engine is set against in the same run.

The ``ip`` and ``tc`` binaries come from ``--iproute-dir DIR`` (or ``MCCL_IPROUTE_DIR``), else from
``PATH``, else from the repository's ``.tools/iproute`` that ``bench/bundle_iproute.sh`` fills on a
machine that has them (for machines without iproute2, such as the team's GPU machine). Running a
command inside a host needs no binary: the tool enters the namespace itself with ``setns(2)``.

This module uses only the standard library and no relative imports, so it also runs as a plain
script (``python3 python/mccl/cluster.py ...``) where the ``mccl`` extension is not built.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

try:
    from . import _cli
except ImportError:  # run as a script (nsexec and the goodput helpers): this folder is on sys.path
    import _cli  # type: ignore[no-redef]

PREFIX = "mccl-"
DEFAULT_ID = "c0"
DEFAULT_SUBNET = "198.18.0.0/24"
DEFAULT_MULTI_SUBNET = "198.18.0.0/16"  # with --switches K > 1: switch k's hosts in 198.18.k.0/24
DEFAULT_MASTER_PORT = 29500
STATE_DIR = "/run/mccl-cluster"
NETNS_DIR = "/run/netns"
HOST_IFNAME = "eth0"
CLONE_NEWNET = 0x40000000
_ID_RE = re.compile(r"^[a-z0-9]{1,4}$")
_HERE = os.path.abspath(__file__)
_REPO_TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))), ".tools", "iproute")


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says what and how to fix it."""


# ---------------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------------

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(text: str) -> float:
    """Parse a link rate such as ``2gbit``, ``500mbit`` or ``1.5Gbit/s`` into bits per second.

    Units follow tc(8): ``bit``/``kbit``/``mbit``/``gbit`` are bits (powers of 1000) and
    ``bps``/``kbps``/``mbps``/``gbps`` are bytes per second. Raises ValueError otherwise.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)(/s)?\s*", text)
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"cannot parse rate {text!r}: use a number and a tc unit, e.g. 2gbit, 500mbit")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]


def format_rate(bits_per_s: float) -> str:
    """``1.910 Gbit/s (0.2388 GB/s)``: bits in powers of 1000, bytes as nccl-tests' GB/s (1e9 B/s);
    below 100 Mbit/s with 6 and 7 decimals, so a slow link's figure keeps its digits (and the unit
    stays Gbit/s, which scripts grep for)."""
    d = 3 if bits_per_s >= 1e8 else 6
    return f"{bits_per_s / 1e9:.{d}f} Gbit/s ({bits_per_s / 8e9:.{d + 1}f} GB/s)"


# ---------------------------------------------------------------------------------------------
# ip and tc
# ---------------------------------------------------------------------------------------------

def require_root(what: str) -> None:
    """Exit with a clear message when not root (namespaces, veths and qdiscs need CAP_NET_ADMIN)."""
    if os.geteuid() != 0:
        raise ClusterError(f"'{what}' needs root (network namespaces, veth links and tc qdiscs need "
                           f"CAP_NET_ADMIN); run it as root, e.g. with sudo")


def find_iproute(iproute_dir: str | None = None) -> tuple[list[str], list[str]]:
    """Return the argv prefixes that run ``ip`` and ``tc``.

    Order: ``iproute_dir`` (or ``$MCCL_IPROUTE_DIR``), then ``PATH``, then the repository's
    ``.tools/iproute``. A bundle directory holds either wrapper scripts ``ip`` and ``tc`` (what
    bench/bundle_iproute.sh writes) or plain binaries with their libraries in ``lib/``, which are
    then run with ``LD_LIBRARY_PATH`` set for that one process only.
    """
    iproute_dir = iproute_dir or os.environ.get("MCCL_IPROUTE_DIR")
    candidates = [iproute_dir] if iproute_dir else []
    if not iproute_dir:
        ip, tc = shutil.which("ip"), shutil.which("tc")
        if ip and tc:
            return [ip], [tc]
        candidates.append(_REPO_TOOLS)
    for d in candidates:
        ip, tc = os.path.join(d, "ip"), os.path.join(d, "tc")
        if os.access(ip, os.X_OK) and os.access(tc, os.X_OK):
            lib = os.path.join(d, "lib")
            pre = ["env", f"LD_LIBRARY_PATH={lib}"] if _is_elf(ip) and os.path.isdir(lib) else []
            return pre + [ip], pre + [tc]
    where = iproute_dir or f"PATH or {_REPO_TOOLS}"
    raise ClusterError(f"no ip/tc binaries in {where}: install iproute2 (apt-get install iproute2), or "
                       f"run bench/bundle_iproute.sh on a machine that has it and pass --iproute-dir")


def _is_elf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


class Shell:
    """Runs ip/tc commands, raising ClusterError with the command and its stderr on failure."""

    def __init__(self, iproute_dir: str | None = None, verbose: bool = False):
        self.ip, self.tc = find_iproute(iproute_dir)
        self.verbose = verbose

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        if self.verbose:
            print("+", " ".join(argv[2:] if argv[0] == "env" else argv), file=sys.stderr)
        proc = subprocess.run(argv, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise ClusterError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}")
        return proc

    def ip_(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run(self.ip + list(args), check)

    def tc_(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run(self.tc + list(args), check)


# ---------------------------------------------------------------------------------------------
# The cluster's layout
# ---------------------------------------------------------------------------------------------

@dataclass
class ClusterSpec:
    """What ``up`` builds; saved as JSON in /run/mccl-cluster/<id>.json for the other commands.

    ``hosts_per_switch`` lists how many hosts each switch has (hosts 0..H0-1 on switch 0, the
    next H1 on switch 1, ...); left empty, ``hosts`` are split evenly over ``switches``, and
    given, it sets ``switches`` and ``hosts``. ``subnet`` ``auto`` is 198.18.0.0/24 for one
    switch and 198.18.0.0/16 for more."""

    id: str = DEFAULT_ID
    hosts: int = 2
    rate: str = "1gbit"
    mtu: int = 9000
    burst: str = "auto"
    latency: str = "50ms"
    subnet: str = "auto"
    cpus_per_host: int = 0  # 0: every host's processes may run on every CPU
    host_cpus: list = field(default_factory=list)  # host i's CPUs, chosen by assign_cpus() at up
    created: float = field(default_factory=time.time)
    switches: int = 1
    hosts_per_switch: list = field(default_factory=list)  # hosts of switch k; filled in by __post_init__
    uplink_rate: str = ""  # each uplink's tbf rate, each way; "" (or one switch): the host rate

    def __post_init__(self) -> None:
        check_id(self.id)
        self._layout()
        if self.subnet == "auto":
            self.subnet = DEFAULT_SUBNET if self.switches == 1 else DEFAULT_MULTI_SUBNET
        try:
            net = ipaddress.ip_network(self.subnet)
        except ValueError as exc:
            raise ClusterError(f"--subnet {self.subnet}: {exc}") from None
        if self.switches == 1:
            room = min(999, net.num_addresses - 2)
            if room < 1:
                raise ClusterError(f"--subnet {self.subnet} has no address for a host (a /30 or wider has)")
            if not 1 <= self.hosts <= room:
                raise ClusterError(f"--hosts {self.hosts}: must be 1 to {room} for {self.subnet}")
        else:
            # Switch k's hosts get the k-th /24 of the subnet, so topology detection by /24 groups them.
            if net.version != 4 or net.prefixlen > 24 or net.num_addresses < 256 * self.switches:
                raise ClusterError(f"--subnet {self.subnet}: {self.switches} switches need an IPv4 subnet of at "
                                   f"least {self.switches} /24s (one per switch), e.g. {DEFAULT_MULTI_SUBNET}")
            if self.hosts > 999:
                raise ClusterError(f"{self.hosts} hosts: at most 999")
        for what, text in (("--rate", self.rate), ("--uplink-rate", self.uplink_rate or self.rate)):
            try:
                if parse_rate(text) <= 0:
                    raise ValueError("a link needs a rate above 0")
            except ValueError as exc:
                raise ClusterError(f"{what} {text}: {exc}") from None
        if self.cpus_per_host < 0:
            raise ClusterError(f"--cpus-per-host {self.cpus_per_host}: must be 0 (no pinning) or more")

    def _layout(self) -> None:
        """Make ``switches``, ``hosts_per_switch`` and ``hosts`` agree, or raise ClusterError."""
        hps = [int(h) for h in self.hosts_per_switch]
        if not hps:
            if self.switches < 1:
                raise ClusterError(f"--switches {self.switches}: must be 1 or more")
            if self.hosts % self.switches:
                raise ClusterError(f"{self.hosts} hosts do not split evenly over {self.switches} switches: "
                                   f"give --hosts-per-switch H or H0,H1,...")
            hps = [self.hosts // self.switches] * self.switches
        if len(hps) > 1 and self.switches not in (1, len(hps)):
            raise ClusterError(f"--hosts-per-switch {','.join(map(str, hps))} lists {len(hps)} switches, "
                               f"--switches says {self.switches}")
        if len(hps) == 1 and self.switches > 1:
            hps = hps * self.switches
        if len(hps) > 1:
            bad = [h for h in hps if not 1 <= h <= 254]
            if bad:
                raise ClusterError(f"--hosts-per-switch: each switch takes 1 to 254 hosts (one /24), not {bad[0]}")
        elif hps[0] < 1:
            raise ClusterError(f"--hosts {hps[0]}: must be 1 or more")
        if len(hps) > 256:
            raise ClusterError(f"--switches {len(hps)}: at most 256")
        self.switches, self.hosts_per_switch, self.hosts = len(hps), hps, sum(hps)
        if self.switches == 1:
            self.uplink_rate = ""

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.id}-"

    @property
    def bridge(self) -> str:
        """Switch 0's bridge (with one switch, the only one: ``mccl-<id>-br``)."""
        return self.switch_bridge(0)

    def switch_bridge(self, k: int) -> str:
        """Switch k's bridge: ``mccl-<id>-br`` with one switch, ``mccl-<id>-br<k>`` with more."""
        return f"{self.prefix}br" if self.switches == 1 else f"{self.prefix}br{k}"

    @property
    def core_bridge(self) -> str | None:
        """The bridge that joins the switches (``mccl-<id>-core``), None with one switch."""
        return f"{self.prefix}core" if self.switches > 1 else None

    def uplink(self, k: int) -> tuple[str, str]:
        """Switch k's uplink veth pair: (its end on switch k's bridge, its end on the core)."""
        return f"{self.prefix}up{k}", f"{self.prefix}cu{k}"

    def switch_of(self, i: int) -> int:
        """The switch host i is on (hosts are numbered switch by switch)."""
        for k, n in enumerate(self.hosts_per_switch):
            if i < n:
                return k
            i -= n
        raise ClusterError(f"host {i}: out of range")

    def first_host(self, k: int) -> int:
        """The lowest host number on switch k."""
        return sum(self.hosts_per_switch[:k])

    def netns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def assign_cpus(self) -> None:
        """With ``cpus_per_host`` > 0: give host i the (i+1)-th ``cpus_per_host`` of the CPUs this
        process may run on, once (``up`` does, and the state file keeps them, so every later
        command pins the same CPUs whatever its own affinity). Raises ClusterError when there
        are too few for every host."""
        if self.cpus_per_host == 0:
            self.host_cpus = []
            return
        avail = sorted(os.sched_getaffinity(0))
        if self.hosts * self.cpus_per_host > len(avail):
            raise ClusterError(f"{self.hosts} hosts x {self.cpus_per_host} CPUs need {self.hosts * self.cpus_per_host} "
                               f"CPUs; this process may run on {len(avail)}")
        self.host_cpus = [avail[i * self.cpus_per_host:(i + 1) * self.cpus_per_host] for i in range(self.hosts)]

    def cpus(self, i: int) -> list[int] | None:
        """The CPUs host i's processes are pinned to (like a machine of its own), or None when
        the hosts are not pinned."""
        return list(self.host_cpus[i]) if self.host_cpus else None

    def addr(self, i: int) -> str:
        """Host i's address: the (i+1)-th of the subnet with one switch; with more, the (j+1)-th
        of switch k's /24 for the j-th host of switch k (198.18.k.(j+1) by default)."""
        net = ipaddress.ip_network(self.subnet)
        if self.switches == 1:
            return str(net[i + 1])
        k = self.switch_of(i)
        return str(net[256 * k + i - self.first_host(k) + 1])

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def rate_bits(self) -> float:
        return parse_rate(self.rate)

    @property
    def uplink_bits(self) -> float:
        return parse_rate(self.uplink_rate or self.rate)

    def tc_rate(self, bits: float | None = None) -> str:
        return f"{int(self.rate_bits if bits is None else bits)}bit"

    def tc_burst(self, bits: float | None = None) -> str:
        """``auto``: 1 ms of traffic at the link rate (``bits``, default the host links'), at least
        64 KiB. A full bucket lets a burst of this many bytes through at memory speed, so transfers
        much smaller than the burst are not limited by the link rate; a smaller bucket costs goodput
        (timer resolution)."""
        if self.burst != "auto":
            return self.burst
        return f"{max(64 * 1024, int((self.rate_bits if bits is None else bits) / 8 / 1000))}b"

    def tbf_args(self, bits: float | None = None) -> list[str]:
        """The tbf qdisc for a link at ``bits`` (default the host links' rate), as tc's arguments."""
        return ["tbf", "rate", self.tc_rate(bits), "burst", self.tc_burst(bits), "latency", self.latency]

    def path_rate(self, a: int, b: int) -> float:
        """The lowest link rate on the path between hosts a and b (bits/s): the host links', and
        the uplinks' too when they are on different switches."""
        if self.switch_of(a) == self.switch_of(b):
            return self.rate_bits
        return min(self.rate_bits, self.uplink_bits)


def check_id(cluster_id: str) -> str:
    """``cluster_id`` if it is a valid id (1-4 of [a-z0-9]), else ClusterError. Every command
    checks it: an id becomes interface names, and a path under STATE_DIR that ``down`` removes."""
    if not isinstance(cluster_id, str) or not _ID_RE.match(cluster_id):
        raise ClusterError(f"cluster id {cluster_id!r} must be 1-4 lowercase letters or digits "
                           f"(interface names are limited to 15 characters)")
    return cluster_id


def state_path(cluster_id: str) -> str:
    return os.path.join(STATE_DIR, f"{check_id(cluster_id)}.json")


def load_spec(cluster_id: str = DEFAULT_ID) -> ClusterSpec:
    """The spec of a cluster that is up; raises ClusterError naming the fix when there is none."""
    try:
        with open(state_path(cluster_id)) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ClusterError(f"cluster '{cluster_id}' is not up (no {state_path(cluster_id)}); "
                           f"bring it up with: python -m mccl.cluster up --id {cluster_id} --hosts N --rate R") from None
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise ClusterError(f"cluster '{cluster_id}': cannot read {state_path(cluster_id)} ({exc}); "
                           f"python -m mccl.cluster down --id {cluster_id} removes it") from None
    try:
        spec = ClusterSpec(**data)
    except (TypeError, ClusterError) as exc:
        raise ClusterError(f"cluster '{cluster_id}': {state_path(cluster_id)} does not describe a cluster of this "
                           f"version ({exc}); python -m mccl.cluster down --id {cluster_id} removes it") from None
    missing = [spec.netns(i) for i in range(spec.hosts) if not os.path.exists(os.path.join(NETNS_DIR, spec.netns(i)))]
    if missing:
        raise ClusterError(f"cluster '{cluster_id}' is incomplete (missing {', '.join(missing)}): run "
                           f"python -m mccl.cluster down --id {cluster_id} and bring it up again")
    return spec


# ---------------------------------------------------------------------------------------------
# up / down / status
# ---------------------------------------------------------------------------------------------

def up(spec: ClusterSpec, iproute_dir: str | None = None, verbose: bool = False, check: bool = True) -> ClusterSpec:
    """Create the bridge, the namespaces, the shaped veths and the addresses; write the state file.

    Anything that fails (or a SIGINT/SIGTERM during the bring-up) removes what was created so far.
    Raises ClusterError when the cluster id is already in use.
    """
    require_root("up")
    spec.assign_cpus()  # enough CPUs for every host, before anything is created
    sh = Shell(iproute_dir, verbose)
    existing = existing_names(spec.id, sh)
    if existing:
        raise ClusterError(f"cluster '{spec.id}' already exists ({', '.join(existing[:4])}...); "
                           f"run python -m mccl.cluster down --id {spec.id} first, or use another --id")
    with cleanup_on_signals(lambda: down(spec.id, iproute_dir, quiet=True)):
        try:
            os.makedirs(STATE_DIR, exist_ok=True)
            # The state file is written first: a crash part way leaves something `down` can read.
            _write_state(spec)
            tbf = spec.tbf_args()
            for k in range(spec.switches):
                sh.ip_("link", "add", spec.switch_bridge(k), "type", "bridge")
            if spec.core_bridge:
                # A star: every switch's bridge has one uplink to the core bridge (no L2 loop),
                # shaped at the uplink rate on both ends, so each direction is limited.
                up_tbf = spec.tbf_args(spec.uplink_bits)
                sh.ip_("link", "add", spec.core_bridge, "type", "bridge")
                for k in range(spec.switches):
                    sw_end, core_end = spec.uplink(k)
                    sh.ip_("link", "add", sw_end, "mtu", str(spec.mtu), "type", "veth",
                           "peer", "name", core_end, "mtu", str(spec.mtu))
                    for end, bridge in ((sw_end, spec.switch_bridge(k)), (core_end, spec.core_bridge)):
                        sh.ip_("link", "set", end, "master", bridge)
                        sh.ip_("link", "set", end, "up")
                        sh.tc_("qdisc", "replace", "dev", end, "root", *up_tbf)
                sh.ip_("link", "set", spec.core_bridge, "mtu", str(spec.mtu), "up")
            for i in range(spec.hosts):
                ns, veth = spec.netns(i), spec.veth(i)
                sh.ip_("netns", "add", ns)
                sh.ip_("link", "add", veth, "mtu", str(spec.mtu), "type", "veth",
                       "peer", "name", HOST_IFNAME, "mtu", str(spec.mtu), "netns", ns)
                sh.ip_("link", "set", veth, "master", spec.switch_bridge(spec.switch_of(i)))
                sh.ip_("link", "set", veth, "up")
                sh.ip_("-n", ns, "link", "set", "lo", "up")
                sh.ip_("-n", ns, "addr", "add", f"{spec.addr(i)}/{spec.prefixlen}", "dev", HOST_IFNAME)
                sh.ip_("-n", ns, "link", "set", HOST_IFNAME, "up")
                # Shape both directions: the bridge side limits what reaches the host, the host
                # side what leaves it.
                sh.tc_("qdisc", "replace", "dev", veth, "root", *tbf)
                sh.tc_("-n", ns, "qdisc", "replace", "dev", HOST_IFNAME, "root", *tbf)
            for k in range(spec.switches):
                sh.ip_("link", "set", spec.switch_bridge(k), "mtu", str(spec.mtu), "up")
            if check:
                check_connectivity(spec)
        except BaseException:
            down(spec.id, iproute_dir, quiet=True)
            raise
    return spec


def _write_state(spec: ClusterSpec) -> None:
    tmp = state_path(spec.id) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(spec), f, indent=1)
    os.replace(tmp, state_path(spec.id))


def _name_pattern(cluster_id: str | None) -> re.Pattern:
    ident = re.escape(cluster_id) if cluster_id else "[a-z0-9]{1,4}"
    return re.compile(rf"^{re.escape(PREFIX)}{ident}-(h\d+|v\d+|br|br\d+|core|up\d+|cu\d+)$")


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _netns_names() -> list[str]:
    return _listdir(NETNS_DIR)


def _link_names(sh: Shell) -> list[str]:
    out = sh.ip_("-o", "link", "show").stdout
    # "12: mccl-c0-v0@if2: <...>": the name ends at '@' (peer) or ':'.
    return [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.M)]


def existing_names(cluster_id: str | None, sh: Shell | None = None) -> list[str]:
    """Namespaces and links of cluster ``cluster_id`` (of every cluster when None) that exist now."""
    pat = _name_pattern(cluster_id)
    names = [n for n in _netns_names() if pat.match(n)]
    if sh is not None:
        names += [n for n in _link_names(sh) if pat.match(n)]
    return names


def netns_pids(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns`` (what ``ip netns pids`` does, without ip)."""
    try:
        ino = os.stat(os.path.join(NETNS_DIR, ns)).st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == ino:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def down(cluster_id: str | None = DEFAULT_ID, iproute_dir: str | None = None, quiet: bool = False,
         verbose: bool = False) -> list[str]:
    """Remove every namespace and link named ``mccl-<id>-*`` and the state file; kill processes left
    in those namespaces. Idempotent: returns what it removed (nothing when nothing was there).
    ``cluster_id=None`` removes every cluster this tool's naming pattern matches."""
    require_root("down")
    if cluster_id is not None:
        check_id(cluster_id)  # an empty id would match every cluster, a path files elsewhere
    sh = Shell(iproute_dir, verbose)
    pat = _name_pattern(cluster_id)
    removed = []
    # A bring-up stopped by a signal may have killed `ip netns add` halfway (the name there, its
    # mount not yet): such a name goes on a later pass, so a few passes, a moment apart.
    for attempt in range(4):
        if attempt:
            time.sleep(0.25)
        for ns in [n for n in _netns_names() if pat.match(n)]:
            pids = netns_pids(ns)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if sh.ip_("netns", "del", ns, check=False).returncode == 0:  # also deletes the veth pair
                removed.append(ns + (f" (killed {len(pids)} processes)" if pids else ""))
        for link in [n for n in _link_names(sh) if pat.match(n)]:
            if sh.ip_("link", "del", link, check=False).returncode == 0:
                removed.append(link)
        if not existing_names(cluster_id, sh):
            break
    ids = [cluster_id] if cluster_id else [f[:-5] for f in _listdir(STATE_DIR)
                                           if f.endswith(".json") and _ID_RE.match(f[:-5])]
    for cid in ids:
        for path in (state_path(cid), state_path(cid) + ".tmp"):
            if os.path.exists(path):
                os.unlink(path)
                removed.append(path)
    left = existing_names(cluster_id, sh)
    if left:
        raise ClusterError(f"could not remove: {', '.join(left)}")
    if not quiet:
        print(f"removed {len(removed)}: " + ", ".join(removed) if removed else "nothing to remove")
    return removed


def status(cluster_id: str | None = None, iproute_dir: str | None = None) -> str:
    """A human-readable listing of the clusters that exist (one when ``cluster_id`` is given)."""
    lines = []
    pat = _name_pattern(None)
    ids = [cluster_id] if cluster_id else sorted({n[len(PREFIX):].rsplit("-", 1)[0] for n in _netns_names() if pat.match(n)}
                                                 | {f[:-5] for f in _listdir(STATE_DIR) if f.endswith(".json")})
    if not ids:
        return "no mccl cluster is up"
    try:
        sh = Shell(iproute_dir)
    except ClusterError:
        sh = None
    for cid in ids:
        try:
            spec = load_spec(cid)
        except ClusterError as exc:
            lines.append(f"cluster {cid}: {exc}")
            continue
        def qdisc(dev: str) -> str:
            if sh is None or os.geteuid() != 0:
                return ""
            return sh.tc_("qdisc", "show", "dev", dev, check=False).stdout.strip().split("\n")[0]

        where = (f"bridge {spec.bridge}" if spec.switches == 1 else
                 f"{spec.switches} switches (hosts per switch {','.join(map(str, spec.hosts_per_switch))}) joined "
                 f"by {spec.core_bridge}, uplinks tbf {spec.uplink_rate or spec.rate} (burst "
                 f"{spec.tc_burst(spec.uplink_bits)}) both ways")
        lines.append(f"cluster {cid}: {spec.hosts} hosts, tbf {spec.rate} (burst {spec.tc_burst()}, latency "
                     f"{spec.latency}) both ways, MTU {spec.mtu}, {where}"
                     + (f", {spec.cpus_per_host} CPUs pinned per host" if spec.cpus_per_host else ""))
        for k in range(spec.switches):
            if spec.switches > 1:
                sw_end, core_end = spec.uplink(k)
                first = spec.first_host(k)
                lines.append(f" switch {k}: bridge {spec.switch_bridge(k)}, hosts h{first}..h"
                             f"{first + spec.hosts_per_switch[k] - 1}; uplink {sw_end}: {qdisc(sw_end)}  "
                             f"{core_end}: {qdisc(core_end)}")
            for i in range(spec.first_host(k), spec.first_host(k) + spec.hosts_per_switch[k]):
                lines.append(f"  h{i}: netns {spec.netns(i)}  {HOST_IFNAME} {spec.addr(i)}/{spec.prefixlen}  "
                             f"{spec.veth(i)}: {qdisc(spec.veth(i))}  processes: {len(netns_pids(spec.netns(i)))}"
                             + (f"  CPUs {','.join(map(str, cpus))}" if (cpus := spec.cpus(i)) else ""))
    return "\n".join(lines)


@contextlib.contextmanager
def cleanup_on_signals(cleanup: Callable[[], object]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into an exception inside the block (so ``finally`` and ``except``
    run), and run ``cleanup`` at interpreter exit if the block is left by an uncaught path."""
    done = threading.Event()
    fired = []

    def handler(signum, frame):
        if not fired:  # later signals must not interrupt the cleanup the first one started
            fired.append(signum)
            raise KeyboardInterrupt(f"signal {signum}")

    def at_exit():
        if not done.is_set():
            with contextlib.suppress(Exception):
                cleanup()

    import atexit

    atexit.register(at_exit)
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        done.set()
        atexit.unregister(at_exit)
        for sig, h in old.items():
            signal.signal(sig, h)


# ---------------------------------------------------------------------------------------------
# Running commands inside hosts
# ---------------------------------------------------------------------------------------------

def enter_netns(ns: str) -> None:
    """Move the calling thread (the process, when single-threaded) into network namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ClusterError(f"network namespace {ns!r}: {exc.strerror} (is the cluster up?)") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ClusterError(f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def exec_in(ns: str, cpus: Sequence[int] | None, command: list[str]) -> None:
    """Replace this process with ``command`` inside namespace ``ns``, pinned to ``cpus`` when given
    (exec keeps the affinity); ClusterError naming the cause when any step fails."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            raise ClusterError(f"CPUs {','.join(map(str, cpus))}: {exc.strerror} (this process may run on "
                               f"{','.join(map(str, sorted(os.sched_getaffinity(0))))})") from None
    enter_netns(ns)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise ClusterError(f"{command[0]}: {exc.strerror}") from None


def ns_argv(ns: str | None, argv: Sequence[str], cpus: Sequence[int] | None = None) -> list[str]:
    """argv that runs ``argv`` inside namespace ``ns`` (unchanged for None), pinned to ``cpus``
    when given: this file's ``nsexec`` command enters the namespace, sets the CPU affinity and
    then execs ``argv``, keeping cwd and environment."""
    if ns is None:
        return list(argv)
    pin = ["--cpus", ",".join(map(str, cpus))] if cpus else []
    return [sys.executable, _HERE, "nsexec", ns, *pin, "--", *argv]


def host_argv(spec: ClusterSpec, host: int, argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` in host ``host`` of ``spec``: its namespace and its CPUs."""
    return ns_argv(spec.netns(host), argv, spec.cpus(host))


def rank_env(rank: int, world_size: int, master_addr: str, master_port: int, *, local_rank: int = 0,
             local_world_size: int = 1, node_rank: int | None = None, nnodes: int | None = None,
             run_id: str = "mccl-cluster") -> dict[str, str]:
    """The environment torchrun gives a worker (see torch/distributed/elastic/agent/server/api.py)."""
    node_rank = rank // local_world_size if node_rank is None else node_rank
    nnodes = -(-world_size // local_world_size) if nnodes is None else nnodes
    return {
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size), "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": run_id, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_rank_order(text: str) -> str:
    """``in-order``, ``interleave``, ``shuffle`` or ``shuffle:SEED`` (SEED an integer), returned
    as given; ClusterError otherwise."""
    if text in ("in-order", "interleave", "shuffle") or re.fullmatch(r"shuffle:-?\d+", text):
        return text
    raise ClusterError(f"--rank-order {text!r}: expected in-order, interleave, shuffle or shuffle:SEED")


def rank_hosts(spec: ClusterSpec, world_size: int, nproc_per_host: int = 1, order: str = "in-order") -> list[int]:
    """The host of every rank (index: rank). The job uses hosts 0..ceil(world_size/nproc_per_host)-1
    with ``nproc_per_host`` slots each (the last may have fewer); ``in-order`` gives rank r host
    ``r // nproc_per_host``; ``interleave`` deals the slots out switch by switch (rank 0 on switch
    0, rank 1 on switch 1, ...) so consecutive ranks sit on different switches; ``shuffle[:SEED]``
    shuffles the in-order slots with ``random.Random(SEED)`` (SEED 0 when not given)."""
    parse_rank_order(order)
    slots = [r // nproc_per_host for r in range(world_size)]
    if order == "interleave":
        by_switch: dict[int, list[int]] = {}
        for h in slots:
            by_switch.setdefault(spec.switch_of(h), []).append(h)
        queues = [by_switch[k] for k in sorted(by_switch)]
        slots = []
        while any(queues):
            slots += [q.pop(0) for q in queues if q]
    elif order.startswith("shuffle"):
        import random

        random.Random(int(order.partition(":")[2] or 0)).shuffle(slots)
    return slots


def format_rank_hosts(spec: ClusterSpec, hosts: Sequence[int]) -> str:
    """``rank 0: h2 (switch 1), rank 1: h0 (switch 0), ...`` (no switches with one switch)."""
    return format_placement(hosts, [spec.switch_of(h) for h in hosts] if spec.switches > 1 else None)


def format_placement(hosts: Sequence[int], switches: Sequence[int] | None = None) -> str:
    """:func:`format_rank_hosts` from every rank's host and, with several switches, its switch (as
    a job's ranks see them in MCCL_CLUSTER_HOST and MCCL_CLUSTER_SWITCH)."""
    return ", ".join(f"rank {r}: h{h}" + (f" (switch {switches[r]})" if switches is not None else "")
                     for r, h in enumerate(hosts))


#: --rank-order's help, shared by ``run`` and ``mccl.bench --cluster``.
RANK_ORDER_HELP = ("which host each rank runs in: in-order (rank r in host r // nproc-per-host), interleave "
                   "(consecutive ranks on different switches), shuffle[:SEED] (in-order slots shuffled with "
                   "random.Random(SEED), SEED 0 by default); other than in-order, the mapping is printed")


def across_switches_pair(spec: ClusterSpec, server: int | None = None, client: int | None = None) -> tuple[int, int]:
    """(server, client) of a goodput measurement through the uplinks: host 0 and the first host of
    switch 1, unless given; ClusterError with one switch."""
    if spec.switches < 2:
        raise ClusterError(f"--across-switches: cluster '{spec.id}' has one switch")
    return (0 if server is None else server), (spec.first_host(1) if client is None else client)


def launch(argv: Sequence[str], world_size: int, *, spec: ClusterSpec | None = None, nproc_per_host: int = 1,
           timeout: float | None = None, extra_env: dict[str, str] | None = None, tag_rank0: bool = False,
           master_port: int | None = None, out=None, rank_order: str = "in-order") -> int:
    """Run ``argv`` as ``world_size`` ranks and wait for all of them; return the job's exit status.

    Without ``spec`` the ranks run on this machine over loopback (like ``torchrun --standalone``);
    with it, rank r runs in host ``r // nproc_per_host``, or where ``rank_order`` puts it
    (:func:`rank_hosts`; the mapping is printed to stderr, and MASTER_ADDR is rank 0's host).
    Every rank gets MCCL_CLUSTER_HOST, MCCL_CLUSTER_SWITCH and MCCL_CLUSTER_RANK_ORDER. Output is
    forwarded line by line, every line of rank r > 0 (and of rank 0 when ``tag_rank0``) prefixed
    with ``[rank r]``. When a rank fails, the deadline passes or this process gets
    SIGINT/SIGTERM/SIGHUP, every rank's process group is killed (SIGTERM, then SIGKILL after 5 s).
    Returns 0 when all ranks exited 0, 124 on timeout, else the first non-zero exit status
    (128+signal for a signalled rank).
    """
    out = out or sys.stdout.buffer
    if spec is not None:
        hosts_needed = -(-world_size // nproc_per_host)
        if hosts_needed > spec.hosts:
            raise ClusterError(f"{world_size} ranks at {nproc_per_host} per host need {hosts_needed} hosts; "
                               f"cluster '{spec.id}' has {spec.hosts}")
        hosts = rank_hosts(spec, world_size, nproc_per_host, rank_order)
        if rank_order != "in-order":
            print(f"mccl.cluster: rank order {rank_order}: {format_rank_hosts(spec, hosts)}", file=sys.stderr,
                  flush=True)
        master_addr, master_port = spec.addr(hosts[0]), master_port or DEFAULT_MASTER_PORT
    else:
        if rank_order != "in-order":
            raise ClusterError(f"rank order {rank_order!r} needs a cluster (ranks on loopback have no hosts)")
        hosts = [r // nproc_per_host for r in range(world_size)]
        master_addr, master_port = "127.0.0.1", master_port or free_port()
    local_ranks = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    procs: list[subprocess.Popen] = []
    lock = threading.Lock()

    def pump(rank: int, stream) -> None:
        tag = b"" if rank == 0 and not tag_rank0 else f"[rank {rank}] ".encode()
        for line in iter(stream.readline, b""):
            with lock:
                out.write(tag + line)
                out.flush()

    def kill_all() -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + 5
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, end - time.monotonic()))
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # also whatever a rank left in its group
            p.wait()

    pumps = []
    status_code = 0
    with cleanup_on_signals(kill_all):
        try:
            for rank in range(world_size):
                host = hosts[rank]
                env = dict(os.environ)
                env.update(rank_env(rank, world_size, master_addr, master_port, local_rank=local_ranks[rank],
                                    local_world_size=nproc_per_host, node_rank=host))
                if spec is not None:
                    env.update({"GLOO_SOCKET_IFNAME": HOST_IFNAME, "MCCL_CLUSTER_ID": spec.id,
                                "MCCL_CLUSTER_HOST": str(host), "MCCL_CLUSTER_SWITCH": str(spec.switch_of(host)),
                                "MCCL_CLUSTER_RATE": spec.rate, "MCCL_CLUSTER_RANK_ORDER": rank_order})
                env.update(extra_env or {})
                p = subprocess.Popen(host_argv(spec, host, argv) if spec else list(argv), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
                procs.append(p)
                t = threading.Thread(target=pump, args=(rank, p.stdout), daemon=True)
                t.start()
                pumps.append(t)
            deadline = time.monotonic() + timeout if timeout else None
            while True:
                codes = [p.poll() for p in procs]
                failed = [c for c in codes if c not in (None, 0)]
                if failed:
                    status_code = failed[0] if failed[0] > 0 else 128 - failed[0]
                    bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                    print(f"mccl.cluster: rank(s) {bad} exited with {failed}; stopping the others", file=sys.stderr)
                    break
                if all(c == 0 for c in codes):
                    break
                if deadline and time.monotonic() > deadline:
                    print(f"mccl.cluster: deadline of {timeout:.0f} s passed; killing every rank", file=sys.stderr)
                    status_code = 124
                    break
                time.sleep(0.05)
        finally:
            kill_all()
            for t in pumps:
                t.join(timeout=2)
    return status_code


# ---------------------------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------------------------

GOODPUT_OMIT_S = 1.0


def goodput_sink(listener: socket.socket, omit_s: float = GOODPUT_OMIT_S, timeout: float = 60) -> tuple[float, float]:
    """Accept one connection on ``listener`` and read until EOF. Returns the payload rate in bits/s
    measured at the receiver and the CPU the receiving thread used meanwhile (% of one core: its
    thread CPU time over wall time, kernel time included), both ignoring the first ``omit_s``
    seconds (TCP slow start)."""
    listener.settimeout(timeout)
    conn, _ = listener.accept()
    conn.settimeout(timeout)
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    total, start, mark_t, mark_b, mark_cpu = 0, None, None, 0, 0.0
    with conn:
        while True:
            n = conn.recv_into(view)
            if not n:
                break
            now = time.perf_counter()
            if start is None:
                start, start_cpu = now, time.thread_time()
            total += n
            if mark_t is None and now - start >= omit_s:
                mark_t, mark_b, mark_cpu = now, total, time.thread_time()
        end, end_cpu = time.perf_counter(), time.thread_time()
    if start is None:
        raise ClusterError("goodput: the sender sent nothing")
    if mark_t is None or end - mark_t < 0.2:  # too short to omit anything
        mark_t, mark_b, mark_cpu = start, 0, start_cpu
    return (total - mark_b) * 8 / (end - mark_t), 100 * (end_cpu - mark_cpu) / (end - mark_t)


def connect_retry(addr: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``addr:port``, retried until the other side listens or ``timeout`` s pass."""
    end = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((addr, port), timeout=timeout)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def goodput_source(addr: str, port: int, seconds: float, connect_timeout: float = 10) -> float:
    """Connect to ``addr:port`` (retrying until the sink listens) and send for ``seconds``. Returns
    the CPU the sending thread used (% of one core, kernel time included)."""
    sock = connect_retry(addr, port, connect_timeout)
    payload = bytes(1 << 20)
    with sock:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sock.sendall(payload)
        cpu = 100 * (time.thread_time() - cpu0) / (time.perf_counter() - t0)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(30)
        sock.recv(1)  # wait for the sink to close: every byte was received
    return cpu


def iperf3_path() -> str | None:
    """iperf3 on PATH, else the one bench/bundle_iproute.sh put beside ip and tc."""
    found = shutil.which("iperf3")
    for d in (os.environ.get("MCCL_IPROUTE_DIR"), _REPO_TOOLS):
        if not found and d and os.access(os.path.join(d, "iperf3"), os.X_OK):
            found = os.path.join(d, "iperf3")
    return found


def goodput_iperf3_client(addr: str, port: int, seconds: float, ns: str | None = None,
                          connect_timeout: float = 10, cpus: Sequence[int] | None = None,
                          started: list[subprocess.Popen] | None = None) -> dict:
    """Run ``iperf3 -c`` (in namespace ``ns``, pinned to ``cpus``) against a server already started
    on ``addr:port``. Returns ``{"bits_per_s", "sender_cpu_pct", "receiver_cpu_pct"}``: receiver
    bits/s (``end.sum_received``, omitting the first second) and iperf3's own CPU figures for the
    client (sender) and server (receiver) processes, % of one core, kernel time included. Each
    client process started is appended to ``started`` (when given), so a caller can stop it."""
    argv = ns_argv(ns, [iperf3_path() or "iperf3", "-c", addr, "-p", str(port), "-t", str(max(1, round(seconds))),
                        "-O", str(int(GOODPUT_OMIT_S)), "-J"], cpus)
    end = time.monotonic() + connect_timeout
    while True:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        if started is not None:
            started.append(proc)
        try:
            out, err = proc.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise ClusterError(f"iperf3 -c {addr}:{port} did not finish within {seconds + 60:g} s") from None
        try:
            report = json.loads(out)
        except json.JSONDecodeError:
            report = {"error": err.strip() or out.strip()}
        if "error" not in report:
            cpu = report["end"].get("cpu_utilization_percent", {})
            return {"bits_per_s": float(report["end"]["sum_received"]["bits_per_second"]),
                    "sender_cpu_pct": cpu.get("host_total"), "receiver_cpu_pct": cpu.get("remote_total")}
        if "connect" not in str(report["error"]) or time.monotonic() > end:
            raise ClusterError(f"iperf3 failed: {report['error']}")
        time.sleep(0.1)  # the server is not listening yet


def _iperf3_server(spec: ClusterSpec, host: int, port: int) -> subprocess.Popen:
    """A one-off iperf3 server (``-s -1``) in ``host`` on its address and ``port``; its stderr is
    kept for :func:`_server_failure`."""
    return subprocess.Popen(host_argv(spec, host, [iperf3_path(), "-s", "-1", "-B", spec.addr(host), "-p", str(port)]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _server_failure(spec: ClusterSpec, host: int, port: int, srv: subprocess.Popen) -> str | None:
    """Once its client is done: why ``host``'s server failed, else None. A server that could not
    listen (its port taken) exits at once with an error, and whatever answered its client was not
    ours."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        srv.wait(timeout=5)
    if srv.returncode in (0, None):
        return None
    return (f"h{host}'s iperf3 server on {spec.addr(host)}:{port}: "
            f"{srv.stderr.read().strip()[-300:] or f'exit {srv.returncode}'}")


def measure_goodput(spec: ClusterSpec, server: int = 0, client: int = 1, seconds: float = 5.0,
                    tool: str = "auto", port: int = 5201) -> dict:
    """Single-stream TCP goodput from host ``client`` to host ``server``: ``{"bits_per_s", "tool",
    "sender_cpu_pct", "receiver_cpu_pct"}``, the tool being ``iperf3`` when installed and ``tool``
    is auto, else ``python``. The CPU figures (% of one core, kernel time included) are what moving
    that stream cost the sending and the receiving process: a rank that sends and receives at this
    rate pays at least about their sum before any work of its own (iperf3's buffer stays in cache;
    a collective's tensors stream from memory and cost more)."""
    if server == client or not (0 <= server < spec.hosts and 0 <= client < spec.hosts):
        raise ClusterError(f"goodput needs two different hosts of 0..{spec.hosts - 1}")
    tool = ("iperf3" if iperf3_path() else "python") if tool == "auto" else tool
    addr = spec.addr(server)
    if tool == "iperf3":
        if not iperf3_path():
            raise ClusterError("iperf3 is not installed (apt-get install iperf3), use --tool python")
        srv = _iperf3_server(spec, server, port)
        clients: list[subprocess.Popen] = []
        try:
            gp = {**goodput_iperf3_client(addr, port, seconds, ns=spec.netns(client), cpus=spec.cpus(client),
                                          started=clients), "tool": tool}
            if failure := _server_failure(spec, server, port, srv):
                raise ClusterError(failure)
            return gp
        finally:
            for proc in [srv, *clients]:
                _stop(proc)
    if tool != "python":
        raise ClusterError(f"unknown goodput tool {tool!r}: auto, iperf3 or python")
    sink = subprocess.Popen(host_argv(spec, server, [sys.executable, _HERE, "_sink", addr, str(port)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        src = subprocess.run(host_argv(spec, client, [sys.executable, _HERE, "_source", addr, str(port), str(seconds)]),
                             capture_output=True, text=True, timeout=seconds + 60)
        if src.returncode != 0:
            raise ClusterError(f"goodput sender failed: {src.stderr.strip()}")
        out, err = sink.communicate(timeout=30)
        if sink.returncode != 0:
            raise ClusterError(f"goodput receiver failed: {err.strip()}")
        bits, receiver_cpu = map(float, out.split())
        return {"bits_per_s": bits, "tool": tool, "sender_cpu_pct": float(src.stdout.strip()),
                "receiver_cpu_pct": receiver_cpu}
    finally:
        _stop(sink)


def measure_ring_floor(spec: ClusterSpec, seconds: float = 5.0, port: int = 5301) -> dict:
    """Every host streams to the next at once (host i -> host i+1 mod n, one iperf3 stream each), the
    byte pattern of a ring collective without its work: what the network path alone costs a ring
    rank on this machine. Returns ``{"tool": "iperf3", "port", "streams": [{"client", "server",
    "bits_per_s", "sender_cpu_pct", "receiver_cpu_pct"}, ...], "host_cpu_pct": [...]}``, where host i's CPU is
    its sending process's plus its receiving process's (% of one core, kernel time included, as
    iperf3 reports them). On the emulated cluster the veths', bridge's and tbf's softirq work is
    charged to whichever thread it interrupts, so this is the floor to set a ring backend's
    engine CPU against in the same run; iperf3's buffer stays in cache, a collective's tensors do
    not. Needs iperf3 (bench/bundle_iproute.sh bundles it) and at least 2 hosts; a server that cannot
    listen on ``port`` (taken) or a stream that fails raises ClusterError naming the host."""
    if spec.hosts < 2:
        raise ClusterError("the ring floor needs at least 2 hosts")
    if not iperf3_path():
        raise ClusterError("the ring floor needs iperf3 (apt-get install iperf3, or bench/bundle_iproute.sh)")
    n = spec.hosts
    procs: list[subprocess.Popen] = []  # every iperf3 started, stopped on every way out
    results: list[dict | BaseException] = [ClusterError("no result")] * n

    def client(i: int) -> None:
        nxt = (i + 1) % n
        try:
            results[i] = {"client": i, "server": nxt,
                          **goodput_iperf3_client(spec.addr(nxt), port, seconds, ns=spec.netns(i), cpus=spec.cpus(i),
                                                  started=procs)}
        except BaseException as exc:  # reported below, with the host's name
            results[i] = exc

    try:
        servers = []
        for i in range(n):
            servers.append(_iperf3_server(spec, i, port))
            procs.append(servers[-1])
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [f for i, srv in enumerate(servers) if (f := _server_failure(spec, i, port, srv))]
    finally:  # Ctrl-C, and SIGTERM/SIGHUP as main() turns them into it, pass through here too
        for p in list(procs):
            _stop(p)
    failed += [f"h{i} -> h{(i + 1) % n}: {r}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed:
        raise ClusterError("ring floor: " + "; ".join(failed))
    streams = [r for r in results if isinstance(r, dict)]
    if any(s["sender_cpu_pct"] is None or s["receiver_cpu_pct"] is None for s in streams):
        raise ClusterError("ring floor: iperf3 reported no CPU figures")
    # host i sends as streams[i]'s client and receives as streams[i - 1]'s server
    host_cpu = [streams[i]["sender_cpu_pct"] + streams[i - 1]["receiver_cpu_pct"] for i in range(n)]
    return {"tool": "iperf3", "port": port, "streams": streams, "host_cpu_pct": host_cpu}


def format_ring_floor(floor: dict) -> str:
    """One line: the streams' goodput and the hosts' CPU, each as min / median / max."""
    def mmm(xs: list[float], fmt: str) -> str:
        xs = sorted(xs)
        return " / ".join(fmt.format(x) for x in (xs[0], xs[len(xs) // 2], xs[-1]))
    bits = [s["bits_per_s"] / 1e9 for s in floor["streams"]]
    return (f"ring floor ({len(bits)} iperf3 streams at once, h[i] -> h[i+1]): goodput min / median / max "
            f"{mmm(bits, '{:.3f}')} Gbit/s; per host, its sender + its receiver: {mmm(floor['host_cpu_pct'], '{:.0f}')}% "
            f"of a core")


def stream_cpu(gp: dict) -> tuple[float, float] | None:
    """(sender, receiver) CPU % of a goodput result from :func:`measure_goodput`, or None when the
    tool did not report both."""
    sender, receiver = gp.get("sender_cpu_pct"), gp.get("receiver_cpu_pct")
    return None if sender is None or receiver is None else (sender, receiver)


def format_goodput(gp: dict) -> str:
    """``4.963 Gbit/s (0.6204 GB/s)``, then the stream's CPU cost when known."""
    text = format_rate(gp["bits_per_s"])
    if cpu := stream_cpu(gp):
        text += f"; its CPU: sender {cpu[0]:.0f}% + receiver {cpu[1]:.0f}% of a core"
    return text


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def check_connectivity(spec: ClusterSpec, timeout: float = 10.0) -> None:
    """Connect over TCP from every host to host 0; raise ClusterError naming the hosts that cannot
    (e.g. when br_netfilter drops bridged traffic)."""
    if spec.hosts < 2:
        return
    port = DEFAULT_MASTER_PORT + 1
    server = subprocess.Popen(ns_argv(spec.netns(0), [sys.executable, _HERE, "_accept", spec.addr(0), str(port),
                                                      str(spec.hosts - 1), str(timeout)]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        clients = [subprocess.Popen(ns_argv(spec.netns(i), [sys.executable, _HERE, "_connect", spec.addr(0), str(port),
                                                            str(timeout)]),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
                   for i in range(1, spec.hosts)]
        bad = [i + 1 for i, c in enumerate(clients) if c.wait(timeout=timeout + 10) != 0]
        if bad and server.poll() not in (None, 0):  # the check itself broke, not the network
            raise ClusterError(f"the connectivity check's listener in host 0 failed: "
                               f"{server.stderr.read().strip()[-500:]}")
        if bad:
            hint = ""
            if _read("/proc/sys/net/bridge/bridge-nf-call-iptables") == "1":
                hint = (" (net.bridge.bridge-nf-call-iptables=1: the host firewall filters bridged traffic; "
                        "allow it or set the sysctl to 0)")
            raise ClusterError(f"hosts {bad} cannot reach host 0 at {spec.addr(0)}:{port}{hint}")
    finally:
        _stop(server)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def id_arg(text: str) -> str:
    """argparse type of --id: a valid cluster id (check_id)."""
    try:
        return check_id(text)
    except ClusterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cpu_list(text: str) -> list[int]:
    """``0,3,5`` as CPU numbers; ClusterError for anything else (empty items, negatives, junk)."""
    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        cpus = []
    if not cpus or min(cpus) < 0 or max(cpus) >= 1 << 20:
        raise ClusterError(f"--cpus {text!r}: expected CPU numbers separated by commas, e.g. 0,1")
    return cpus


def hosts_per_switch_arg(text: str) -> list[int]:
    """argparse type of --hosts-per-switch: ``4`` or ``3,4,3`` (each at least 1)."""
    try:
        counts = [int(c) for c in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of hosts, or one per switch separated by "
                                         f"commas, e.g. 4 or 3,4,3")
    return counts


def rank_order_arg(text: str) -> str:
    """argparse type of --rank-order (parse_rank_order)."""
    try:
        return parse_rank_order(text)
    except ClusterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def spec_from_args(args) -> ClusterSpec:
    """The ClusterSpec ``up``'s options describe; ClusterError when they contradict each other."""
    hps = args.hosts_per_switch or []
    switches = args.switches or (len(hps) if len(hps) > 1 else 1)
    if len(hps) > 1 and switches != len(hps):
        raise ClusterError(f"--hosts-per-switch {','.join(map(str, hps))} lists {len(hps)} switches, "
                           f"--switches says {switches}")
    if hps:
        total = sum(hps) if len(hps) > 1 else hps[0] * switches
        if args.hosts is not None and args.hosts != total:
            raise ClusterError(f"--hosts {args.hosts}: --switches and --hosts-per-switch make {total} hosts")
        hosts = total
    else:
        hosts = args.hosts if args.hosts is not None else 2 * switches
    if args.uplink_rate is not None and switches == 1:
        raise ClusterError("--uplink-rate needs --switches 2 or more (one switch has no uplink)")
    return ClusterSpec(id=args.id, hosts=hosts, rate=args.rate, mtu=args.mtu, burst=args.burst, latency=args.latency,
                       subnet=args.subnet, cpus_per_host=args.cpus_per_host, switches=switches,
                       hosts_per_switch=hps * switches if len(hps) == 1 else hps,
                       uplink_rate=args.uplink_rate or "")


def _program(cmd: list[str]) -> list[str]:
    """``cmd`` if its program can be run from here, else ClusterError naming it."""
    if shutil.which(cmd[0]) is None:
        raise ClusterError(f"{cmd[0]}: command not found (or not executable)")
    return cmd


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mccl.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
            "example (as root):\n"
            "  python -m mccl.cluster up --hosts 4 --rate 2gbit\n"
            "  python -m mccl.cluster goodput\n"
            "  python -m mccl.cluster run -- python -m mccl.bench --backends mccl,gloo --goodput measure\n"
            "  python -m mccl.cluster down\n"
            "two switches of 4 hosts, 2 Gbit/s host links, 1 Gbit/s uplinks, ranks interleaving the switches:\n"
            "  python -m mccl.cluster up --switches 2 --hosts-per-switch 4 --rate 2gbit --uplink-rate 1gbit\n"
            "  python -m mccl.cluster goodput --across-switches\n"
            "  python -m mccl.cluster run --rank-order shuffle:1 -- python -m mccl.bench --backends mccl"))
    p.add_argument("--iproute-dir", default=None,
                   help="folder with ip and tc (wrappers from bench/bundle_iproute.sh, or binaries with lib/); "
                        "default $MCCL_IPROUTE_DIR, then PATH, then the repository's .tools/iproute")
    p.add_argument("-v", "--verbose", action="store_true", help="print every ip/tc command")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    def with_id(sp):
        sp.add_argument("--id", type=id_arg, default=DEFAULT_ID,
                        help="cluster id (1-4 of [a-z0-9]); names are mccl-<id>-*")
        return sp

    sp = with_id(sub.add_parser("up", help="bring a cluster up", formatter_class=fmt))
    sp.add_argument("--hosts", type=_cli.int_at_least(1), default=None,
                    help="number of hosts (namespaces); default 2, or switches x hosts-per-switch")
    sp.add_argument("--rate", default="1gbit", help="tbf rate of every host link, each way (tc units: 500mbit, 2gbit)")
    sp.add_argument("--switches", type=_cli.int_at_least(1), default=None,
                    help="number of switches (bridges) joined by a core bridge; default 1 (one bridge, no core)")
    sp.add_argument("--hosts-per-switch", type=hosts_per_switch_arg, default=None, metavar="H|H0,H1,...",
                    help="hosts on each switch: one number for every switch, or one per switch (uneven layouts)")
    sp.add_argument("--uplink-rate", default=None,
                    help="tbf rate of every switch's uplink to the core, each way (default: --rate)")
    sp.add_argument("--mtu", type=_cli.int_in(68, 65535, what="an MTU"), default=9000, help="MTU of every veth and the bridge")
    sp.add_argument("--burst", default="auto",
                    help="tbf burst (bucket size, tc units such as 1mb); auto: 1 ms at --rate, at least 64 KiB")
    sp.add_argument("--latency", default="50ms", help="tbf latency (queue bound)")
    sp.add_argument("--subnet", default="auto",
                    help=f"host addresses: host i gets the (i+1)-th address; with 2 or more switches, host j of "
                         f"switch k the (j+1)-th of the subnet's k-th /24. auto: {DEFAULT_SUBNET} with one switch, "
                         f"{DEFAULT_MULTI_SUBNET} with more")
    sp.add_argument("--no-check", action="store_true", help="skip the TCP connectivity check after bring-up")
    sp.add_argument("--cpus-per-host", type=int, default=0,
                    help="pin each host's processes to CPUs of their own, this many per host, like separate "
                         "machines (0: every process may run on every CPU)")

    sp = sub.add_parser("down", help="remove a cluster (idempotent; works after a crash)", formatter_class=fmt)
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--id", type=id_arg, default=DEFAULT_ID, help="cluster id")
    g.add_argument("--all", action="store_true",
                   help="remove every cluster named mccl-<id>-{h<i>,v<i>,br,br<k>,core,up<k>,cu<k>}")

    sp = sub.add_parser("status", help="list clusters, hosts, addresses, qdiscs", formatter_class=fmt)
    sp.add_argument("--id", type=id_arg, default=None, help="one cluster id (default: all)")

    sp = with_id(sub.add_parser("run", help="run CMD once per rank inside the hosts", formatter_class=fmt))
    sp.add_argument("--nproc", type=_cli.int_at_least(1), default=None, help="world size (default: hosts x nproc-per-host)")
    sp.add_argument("--nproc-per-host", type=_cli.int_at_least(1), default=1, help="ranks per host")
    sp.add_argument("--master-port", type=_cli.int_in(1, 65535, what="a TCP port"), default=DEFAULT_MASTER_PORT, help="MASTER_PORT (host 0)")
    sp.add_argument("--timeout", type=_cli.number_at_least(0, what="number of seconds"), default=3600,
                    help="kill every rank after this many seconds (0: no deadline)")
    sp.add_argument("--tag-rank0", action="store_true", help="prefix rank 0's lines with [rank 0] too")
    sp.add_argument("--rank-order", type=rank_order_arg, default="in-order", help=RANK_ORDER_HELP)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    sp = with_id(sub.add_parser("exec", help="run one command inside one host", formatter_class=fmt))
    sp.add_argument("--host", type=int, default=0, help="host index")
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    sp = with_id(sub.add_parser("goodput", help="single-stream TCP goodput between two hosts", formatter_class=fmt))
    sp.add_argument("--server", type=int, default=None, help="receiving host (default 0)")
    sp.add_argument("--client", type=int, default=None, help="sending host (default 1)")
    sp.add_argument("--across-switches", action="store_true",
                    help="through the uplinks: from the first host of switch 1 to host 0 (unless --client/--server "
                         "say otherwise)")
    sp.add_argument("--seconds", type=_cli.number_at_least(1, what="number of seconds"), default=5.0,
                    help="measurement length, at least 1 (the first second is omitted: slow start and tbf's burst)")
    sp.add_argument("--tool", default="auto", choices=["auto", "iperf3", "python"],
                    help="iperf3 when installed (auto), or the Python socket fallback")
    sp.add_argument("--ring", action="store_true",
                    help="also every host to the next at once (iperf3): a ring's streams without its work, and "
                         "what they cost each host's CPU (the floor for a ring backend's engine CPU)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")

    return p


def _internal(argv: list[str]) -> int:
    """Helpers the commands above run inside a namespace: ``nsexec NS -- CMD...`` (enter NS, exec
    CMD), ``_sink ADDR PORT``, ``_source ADDR PORT SECONDS`` (goodput), ``_accept ADDR PORT COUNT
    TIMEOUT`` and ``_connect ADDR PORT TIMEOUT`` (connectivity check)."""
    cmd, rest = argv[0], argv[1:]
    if cmd == "nsexec":
        if not rest or rest[0].startswith("-"):
            raise ClusterError("usage: nsexec NAMESPACE [--cpus LIST] -- COMMAND...")
        ns, rest, cpus = rest[0], rest[1:], None
        if rest[:1] == ["--cpus"]:
            if len(rest) < 2:
                raise ClusterError("nsexec --cpus: expected CPU numbers separated by commas, e.g. 0,1")
            cpus, rest = cpu_list(rest[1]), rest[2:]
        exec_in(ns, cpus, _program(_command(rest)))
    addr, port = rest[0], int(rest[1])
    if cmd == "_sink":
        with socket.create_server((addr, port)) as ls:
            print(*goodput_sink(ls), flush=True)
    elif cmd == "_source":
        print(goodput_source(addr, port, float(rest[2])), flush=True)
    elif cmd == "_accept":
        with socket.create_server((addr, port)) as ls:
            ls.settimeout(float(rest[3]))
            for _ in range(int(rest[2])):
                ls.accept()[0].close()
    elif cmd == "_connect":
        connect_retry(addr, port, float(rest[2])).close()
    return 0


_INTERNAL = ("nsexec", "_sink", "_source", "_accept", "_connect")


def _command(rest: list[str]) -> list[str]:
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise ClusterError("no command given: put it after --")
    return rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _INTERNAL:
        try:
            return _internal(argv)
        except ClusterError as exc:
            print(f"mccl.cluster: error: {exc}", file=sys.stderr)
            return 2
    args = _parser().parse_args(argv)
    if args.iproute_dir:  # for every lookup here and in the processes this command starts
        os.environ["MCCL_IPROUTE_DIR"] = os.path.abspath(args.iproute_dir)
    try:
        if args.cmd == "up":
            spec = up(spec_from_args(args), args.iproute_dir, args.verbose, check=not args.no_check)
            print(status(spec.id, args.iproute_dir))
        elif args.cmd == "down":
            down(None if args.all else args.id, args.iproute_dir, verbose=args.verbose)
        elif args.cmd == "status":
            print(status(args.id, args.iproute_dir))
        elif args.cmd == "run":
            require_root("run")
            spec = load_spec(args.id)
            world = args.nproc if args.nproc is not None else spec.hosts * args.nproc_per_host
            return launch(_program(_command(args.command)), world, spec=spec, nproc_per_host=args.nproc_per_host,
                          timeout=args.timeout, tag_rank0=args.tag_rank0, master_port=args.master_port,
                          rank_order=args.rank_order)
        elif args.cmd == "exec":
            require_root("exec")
            spec = load_spec(args.id)
            if not 0 <= args.host < spec.hosts:
                raise ClusterError(f"--host {args.host}: cluster '{spec.id}' has hosts 0..{spec.hosts - 1}")
            exec_in(spec.netns(args.host), spec.cpus(args.host), _program(_command(args.command)))
        elif args.cmd == "goodput":
            require_root("goodput")
            spec = load_spec(args.id)
            server, client = args.server, args.client
            if args.across_switches:
                server, client = across_switches_pair(spec, server, client)
            server, client = 0 if server is None else server, 1 if client is None else client
            if args.ring and not iperf3_path():  # before the single stream, not after it
                raise ClusterError("--ring needs iperf3 (apt-get install iperf3, or bench/bundle_iproute.sh)")
            with cleanup_on_signals(lambda: None):  # SIGTERM/SIGHUP unwind like Ctrl-C: the iperf3s are stopped
                gp = measure_goodput(spec, server, client, args.seconds, args.tool)
                floor = measure_ring_floor(spec, args.seconds) if args.ring else None
            crosses = spec.switches > 1 and spec.switch_of(server) != spec.switch_of(client)
            path = f"link {spec.rate}" + (f", uplinks {spec.uplink_rate or spec.rate}" if crosses else "")
            if args.json:
                print(json.dumps({**gp, "bytes_per_s": gp["bits_per_s"] / 8, "rate": spec.rate,
                                  "server": server, "client": client, "switches": [spec.switch_of(server),
                                                                                   spec.switch_of(client)],
                                  "uplink_rate": (spec.uplink_rate or spec.rate) if crosses else None,
                                  "path_bits_per_s": spec.path_rate(server, client),
                                  **({"ring_floor": floor} if floor else {})}))
            else:
                where = (f" (switch {spec.switch_of(client)} -> switch {spec.switch_of(server)})"
                         if spec.switches > 1 else "")
                print(f"single-stream TCP goodput h{client} -> h{server}{where}: {format_goodput(gp)} "
                      f"[{gp['tool']}; {path}]")
                if floor:
                    print(format_ring_floor(floor))
        return 0
    except ClusterError as exc:
        print(f"mccl.cluster: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
