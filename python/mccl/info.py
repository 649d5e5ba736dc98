"""``python -m mccl.info``: what to paste into a bug report (as ``python -m torch.utils.collect_env``).

Prints, in this order:

- **mccl**: the package's version, the C library's, where it is imported from, how it was installed;
- **build**: the torch it was built against and the one running, Python, the C and C++ compilers and
  their flags, the source commit (all from ``mccl/_build_info.py``, written by setup.py), and the
  SIMD reduction kernels this CPU gets (as libmccl reports them);
- **devices**: the device types the backend accepts, CPUs and memory, CUDA, MPS;
- **network**: every interface with its addresses, and the address MCCL would listen on, found by
  creating a real 2-rank communicator over loopback in a child process (``--no-probe`` skips it);
- **environment**: every ``MCCL_*`` variable that is set, and the value in force of each integer
  parameter of the C library (``mcclGetEnvInt``: the value used, which is the default when a value
  is refused);
- **os**: the system, the kernel's socket buffer limits, and the open-file limit (``ulimit -n``).

``--json`` prints the same as one JSON object. Exit status 0; a section that fails says why in
place of its values.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import textwrap
from typing import Any, Callable, Optional

import psutil
import torch

import mccl

from . import _C, _device, _torch_guard

__all__ = ["collect", "main", "render"]

#: The child process of the network probe: two ranks of one communicator on threads, joined over a
#: HashStore, then the address of the TCP connection between them (both ends in this process).
_PROBE = r"""
import datetime, json, os, sys, threading
import psutil, torch.distributed as dist
import mccl
store, groups, errors = dist.HashStore(), [None, None], []
def make(rank):
    try:
        groups[rank] = mccl._C.ProcessGroupMCCL(store=store, rank=rank, size=2,
                                                timeout=datetime.timedelta(seconds=20),
                                                peer_hint=os.environ.get("MASTER_ADDR", ""))
    except Exception as exc:
        errors.append(str(exc))
threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
for t in threads: t.start()
for t in threads: t.join()
if errors:
    print(json.dumps({"error": errors[0]})); sys.exit(0)
me = psutil.Process()
conns = me.net_connections(kind="tcp") if hasattr(me, "net_connections") else me.connections(kind="tcp")
ips = sorted({c.laddr.ip for c in conns if c.raddr and c.status == psutil.CONN_ESTABLISHED and c.laddr.ip == c.raddr.ip})
print(json.dumps({"addresses": ips}))
"""


def _guard(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``{"error": ...}`` if it raises: one broken probe must not hide the rest."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 (a report tool reports whatever went wrong)
        return {"error": f"{type(exc).__name__}: {exc}"}


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return " ".join(f.read().split())
    except OSError:
        return None


def _cpuinfo(field: str) -> Optional[str]:
    """The first ``field`` of /proc/cpuinfo (Linux), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


def _sysctl(name: str) -> Optional[str]:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# ---- mccl and build ------------------------------------------------------------------------------

def _mccl_section() -> dict[str, Any]:
    from importlib import metadata

    where = os.path.dirname(os.path.abspath(mccl.__file__))
    out: dict[str, Any] = {"version": None, "c_library": ".".join(map(str, _C.version)), "package": where}
    try:
        dist = metadata.distribution("mccl")
    except metadata.PackageNotFoundError:
        out["installed"] = "not installed: imported from the folder above (PYTHONPATH or the current folder)"
        return out
    out["version"] = dist.version
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        out["installed"] = f"editable install of {direct.get('url', '?')}"
    elif direct.get("url", "").startswith("file:") and direct.get("url", "").endswith(".whl"):
        out["installed"] = f"from the wheel {direct['url']}"
    elif direct:
        out["installed"] = f"from {direct.get('url', '?')}"
    else:
        out["installed"] = "from a package index or a wheel (no direct_url.json)"
    return out


def _lib() -> ctypes.CDLL:
    """libmccl's public C API, linked into the extension."""
    return ctypes.CDLL(_C.__file__)


def simd_kernels() -> str:
    """The build of the reduction kernels libmccl runs on this CPU, as the library reports it
    (mcclGetReduceKernels: it decides from CPUID at run time)."""
    fn = _lib().mcclGetReduceKernels
    fn.restype = ctypes.c_char_p
    return fn().decode()


def _build_section() -> dict[str, Any]:
    record = _torch_guard.build_record()
    out: dict[str, Any] = {"torch_running": str(torch.__version__), "python_running": platform.python_version(),
                           "simd_kernels": simd_kernels()}
    if record is None:
        out["record"] = ("none: this extension was built before setup.py wrote mccl/_build_info.py; "
                         "rebuild to get one")
        return out
    out["torch_built_against"] = record.get("torch_version")
    out["torch_match"] = _torch_guard.release(record.get("torch_version", "")) == _torch_guard.release(torch.__version__)
    for key in ("python", "platform", "cc", "cc_version", "cflags", "cxx", "cxx_version", "cxxflags", "ldflags",
                "torch_cxx11_abi", "source_commit"):
        out[key if key != "python" else "python_built_with"] = record.get(key)
    return out


# ---- devices -------------------------------------------------------------------------------------

def _devices_section() -> dict[str, Any]:
    cpu: dict[str, Any] = {"count": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    if hasattr(os, "sched_getaffinity"):
        cpu["usable_by_this_process"] = len(os.sched_getaffinity(0))
    cpu["model"] = (_cpuinfo("model name") or (_sysctl("machdep.cpu.brand_string") if sys.platform == "darwin" else None)
                    or platform.processor() or None)
    cuda: dict[str, Any] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if cuda["available"]:
        cuda["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"backend_accepts": list(mccl.DEVICES), "this_host": _device.host_device_type(), "cpu": cpu,
            "cuda": cuda, "mps": {"available": bool(torch.backends.mps.is_available())}}


# ---- network -------------------------------------------------------------------------------------

def _interfaces() -> list[dict[str, Any]]:
    import socket

    stats = psutil.net_if_stats()
    rows = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        st = stats.get(name)
        rows.append({
            "name": name, "up": bool(st and st.isup), "mtu": st.mtu if st else None,
            "speed_mbps": st.speed if st and st.speed else None,
            "addresses": [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)],
        })
    return rows


def probe_listen_address(timeout_s: float = 60.0) -> dict[str, Any]:
    """The address MCCL listens on and publishes here: a 2-rank communicator made in a child
    process (its two ranks connect to each other over that address). ``{"address", "interface"}``
    or ``{"error"}`` (e.g. the library's message when MCCL_SOCKET_IFNAME matches nothing)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe did not finish within {timeout_s:g} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"the probe exited with {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    found = json.loads(lines[-1])
    if "error" in found:
        return found
    if not found.get("addresses"):
        return {"error": "the probe's two ranks connected, but no connection between them was found"}
    address = found["addresses"][0]
    names = [i["name"] for i in _interfaces() if address in i["addresses"]]
    return {"address": address, "interface": names[0] if names else None}


def _network_section(probe: bool) -> dict[str, Any]:
    if os.environ.get("MCCL_SOCKET_IFNAME"):
        rule = f"MCCL_SOCKET_IFNAME={os.environ['MCCL_SOCKET_IFNAME']}"
    elif os.environ.get("MASTER_ADDR"):
        rule = f"the route toward MASTER_ADDR={os.environ['MASTER_ADDR']}"
    else:
        rule = "the first interface that is up and not loopback (MASTER_ADDR and MCCL_SOCKET_IFNAME unset)"
    out: dict[str, Any] = {"interfaces": _guard(_interfaces), "rule": rule}
    out["mccl_listens_on"] = _guard(probe_listen_address) if probe else "not probed (--no-probe)"
    return out


# ---- environment ---------------------------------------------------------------------------------

def library_parameters() -> tuple[dict[str, int], set[str]]:
    """(integer parameters of libmccl and the value in force of each, the names of all its
    parameters), from the library's own table (mcclGetEnvName, mcclGetEnvInt; csrc/core/param.c
    stays the one list). Values are read once per process, as the library does."""
    lib = _lib()
    name_of = lib.mcclGetEnvName
    name_of.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    name_of.restype = ctypes.c_char_p
    get = lib.mcclGetEnvInt
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
    get.restype = ctypes.c_int
    names, values = set(), {}
    for i in range(10_000):
        is_string = ctypes.c_int()
        name = name_of(i, ctypes.byref(is_string))
        if name is None:
            break
        names.add(name.decode())
        value = ctypes.c_int64()
        if not is_string.value and get(name, ctypes.byref(value)) == 0:
            values[name.decode()] = value.value
    return values, names


def _environment_section() -> dict[str, Any]:
    values, mentioned = library_parameters()
    set_vars = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MCCL_")}
    in_force = {}
    for name, value in values.items():
        raw = set_vars.get(name)
        in_force[name] = {"value": value, "set": raw}
    return {
        "set": set_vars,
        "integer_parameters_in_force": in_force,
        "set_but_unknown_to_libmccl": sorted(k for k in set_vars if k not in mentioned),
    }


# ---- operating system ----------------------------------------------------------------------------

def _socket_buffers() -> dict[str, Optional[str]]:
    if sys.platform.startswith("linux"):
        keys = ["net/core/rmem_max", "net/core/wmem_max", "net/core/rmem_default", "net/core/wmem_default",
                "net/ipv4/tcp_rmem", "net/ipv4/tcp_wmem", "net/ipv4/tcp_congestion_control",
                "net/core/somaxconn"]
        return {k.replace("/", "."): _read(f"/proc/sys/{k}") for k in keys}
    if sys.platform == "darwin":
        keys = ["kern.ipc.maxsockbuf", "net.inet.tcp.sendspace", "net.inet.tcp.recvspace",
                "net.inet.tcp.autosndbufmax", "net.inet.tcp.autorcvbufmax", "kern.ipc.somaxconn"]
        return {k: _sysctl(k) for k in keys}
    return {}


def _os_section() -> dict[str, Any]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else v  # noqa: E731
    libc = " ".join(platform.libc_ver()).strip()
    return {"system": platform.platform(), "libc": libc or None, "python": sys.executable,
            "socket_buffers": _guard(_socket_buffers), "open_files_ulimit_n": {"soft": show(soft), "hard": show(hard)}}


# ---- the report ----------------------------------------------------------------------------------

def collect(probe: bool = True) -> dict[str, Any]:
    """Every section as plain data (what ``--json`` prints)."""
    return {
        "mccl": _guard(_mccl_section), "build": _guard(_build_section), "devices": _guard(_devices_section),
        "network": _guard(lambda: _network_section(probe)), "environment": _guard(_environment_section),
        "os": _guard(_os_section),
        "collected": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "(none)"]
        width = max(len(str(k)) for k in value)
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v and not _flat(v):
                out.append(f"{pad}{k}:")
                out += _lines(v, indent + 2)
            else:
                out.append(f"{pad}{str(k) + ':':<{width + 1}} {_scalar(v)}")
        return out
    if isinstance(value, list):
        return [pad + _scalar(v) for v in value] or [pad + "(none)"]
    return [pad + _scalar(value)]


def _flat(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    return all(not isinstance(v, (dict, list)) for v in items) and len(_scalar(value)) <= 80


def _scalar(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_scalar(v)}" for k, v in value.items()) or "(none)"
    if isinstance(value, list):
        return ", ".join(_scalar(v) for v in value) or "(none)"
    return "-" if value is None else str(value)


def render(info: dict[str, Any]) -> str:
    """The report as text: one heading per section, ``key: value`` lines below it."""
    out = [f"mccl.info, collected {info.get('collected', '?')} (paste all of it into a bug report)"]
    for section in ("mccl", "build", "devices", "network", "environment", "os"):
        out += ["", f"== {section} =="]
        value = info.get(section)
        if section == "network" and isinstance(value, dict) and isinstance(value.get("interfaces"), list):
            value = dict(value)
            value["interfaces"] = {
                i["name"]: (", ".join(i["addresses"]) or "no address") + f" ({'up' if i['up'] else 'down'}, mtu {i['mtu']}"
                + (f", {i['speed_mbps']} Mb/s" if i["speed_mbps"] else "") + ")" for i in value["interfaces"]}
        if section == "environment" and isinstance(value, dict) and "integer_parameters_in_force" in value:
            value = dict(value)
            value["integer_parameters_in_force"] = {
                k: f"{v['value']}" + (f" (set to {v['set']!r})" if v["set"] is not None else " (default)")
                for k, v in value["integer_parameters_in_force"].items()}
        for line in _lines(value, 2):
            out += textwrap.wrap(line, width=120, subsequent_indent=" " * (len(line) - len(line.lstrip()) + 4),
                                 break_on_hyphens=False) or [line]
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mccl.info", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help="do not start the child process that finds the address MCCL would listen on")
    args = parser.parse_args(argv)
    info = collect(probe=args.probe)
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
