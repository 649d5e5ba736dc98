"""mccl as a library: the wheel, the torch-version guard, and `python -m mccl.info`.

The module's fixture builds a wheel from this checkout (`pip wheel --no-build-isolation`, with
MCCL_BUILD_REUSE_INPLACE=1 so the extension that `make install` built in place is copied, not
compiled again, when it is up to date) and installs it into a fresh virtual environment in a
temporary folder. That environment gets the same torch without a download: every distribution
the wheel needs (torch, numpy, ... and what they need) is linked from this test's environment into
the new site-packages, and pip installs the wheel with --no-index, so a dependency that is not
there fails the install instead of being fetched. mccl itself is not linked: the fresh
environment knows only the wheel's copy. Each multi-process run has a deadline.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from importlib import metadata

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: A 2-rank all-reduce through the installed wheel, run by torchrun from a folder outside the tree.
ALL_REDUCE = r"""
import os, sys
import torch, torch.distributed as dist
import mccl
assert os.path.realpath(mccl.__file__).startswith(os.path.realpath(sys.prefix)), mccl.__file__
dist.init_process_group("mccl")
rank = dist.get_rank()
t = torch.arange(6, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
assert torch.equal(t, torch.arange(6, dtype=torch.float32) * 3), t
print(f"RANK {rank} of {dist.get_world_size()} sum {t.tolist()} from {os.path.dirname(mccl.__file__)}", flush=True)
dist.destroy_process_group()
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would let the source tree in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _requirement_closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that `requirements` need, transitively (markers evaluated, no
    extras)."""
    from packaging.requirements import Requirement

    seen: dict[str, metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen:
            continue
        dist = metadata.distribution(req.name)  # PackageNotFoundError: this environment lacks it too
        seen[key] = dist
        todo += dist.requires or []
    return list(seen.values())


def _link_distribution(dist: metadata.Distribution, site: str) -> None:
    """Symlink the top-level entries of `dist` (packages, modules, .dist-info, .libs) into `site`."""
    base = str(dist.locate_file(""))
    tops = {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in sorted(tops - {"__pycache__"}):
        src, dst = os.path.join(base, top), os.path.join(site, top)
        if os.path.exists(src) and not os.path.lexists(dst):
            os.symlink(src, dst)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh environment's python, seconds the wheel build took)."""
    tmp = tmp_path_factory.mktemp("packaging")
    start = time.monotonic()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                            ROOT, "-w", str(tmp / "dist")], cwd=ROOT, capture_output=True, text=True,
                           timeout=900, env=_clean_env(MCCL_BUILD_REUSE_INPLACE="1"))
    build_s = time.monotonic() - start
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    (wheel,) = (tmp / "dist").glob("mccl-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    needs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    for dist in _requirement_closure(needs):
        _link_distribution(dist, site)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
                              str(wheel)], capture_output=True, text=True, timeout=300, env=_clean_env())
    assert install.returncode == 0, (install.stdout + install.stderr)[-4000:]
    return wheel, python, build_s


@pytest.mark.timeout(1200)
def test_wheel_installs_into_a_fresh_venv_and_all_reduces_outside_the_source_tree(installed, tmp_path):
    wheel, python, build_s = installed
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB, built in {build_s:.0f} s")
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    proc = subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env=_clean_env(OMP_NUM_THREADS="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    site = sysconfig.get_paths()["purelib"]
    for rank in (0, 1):
        line = re.search(rf"RANK {rank} of 2 sum \[0.0, 3.0, 6.0, 9.0, 12.0, 15.0\] from (\S+)", out)
        assert line, out[-4000:]
        assert ROOT not in line.group(1) and site not in line.group(1), "mccl came from outside the fresh venv"


@pytest.mark.timeout(1200)
def test_wheel_records_the_torch_it_was_built_for(installed):
    wheel, python, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        scope: dict = {}
        exec(z.read("mccl/_build_info.py").decode(), scope)
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    build = scope["BUILD"]
    assert build["torch_version"] == str(torch.__version__)
    assert build["cc_version"] and build["cflags"] and "-std=c11" in build["cflags"]
    assert build["cxx_version"] and "-std=c++17" in build["cxxflags"]
    assert any(n.startswith("mccl/_C") and n.endswith((".so", ".pyd")) for n in names)
    assert "mccl/info.py" in names and "mccl/_torch_guard.py" in names
    assert "mccl-info = mccl.info:main" in entry_points


def _fake_package(tmp_path, python_src: str, torch_version: str, installed: bool = True) -> str:
    """A copy of the package at `python_src` whose build record names `torch_version`, in a folder
    named like an environment's site-packages (``installed``) or like a checkout's."""
    fake = tmp_path / ("lib/site-packages" if installed else "checkout/python")
    shutil.copytree(python_src, fake / "mccl", ignore=shutil.ignore_patterns("__pycache__"))
    record = {"torch_version": torch_version}
    (fake / "mccl" / "_build_info.py").write_text(f"BUILD = {record!r}\n")
    return str(fake)


GUARDED_IMPORT = r"""
import sys
try:
    import mccl
except ImportError as exc:
    print("IMPORT ERROR:", exc)
    print("extension loaded:", "mccl._C" in sys.modules)
    sys.exit(3)
print("imported", mccl.__file__)
"""


@pytest.mark.timeout(1200)
def test_import_under_another_torch_is_an_import_error_naming_both_versions(installed, tmp_path):
    """A build record naming torch 2.12.0 (a simulated mismatch) under the installed torch: ImportError
    with both versions and the fix, raised before the extension loads, and the interpreter lives on."""
    _, python, _ = installed
    site = subprocess.run([python, "-c", "import mccl, os; print(os.path.dirname(mccl.__file__))"],
                          capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip()
    running = str(torch.__version__)
    for fake_version, fails in (("2.12.0+cpu", True), ("0.9.1", True), (running.split("+")[0] + "+cu999", False)):
        path = _fake_package(tmp_path / fake_version, site, fake_version)
        proc = subprocess.run([python, "-c", GUARDED_IMPORT], capture_output=True, text=True, timeout=120,
                              env=_clean_env(PYTHONPATH=path), cwd=tmp_path)
        if not fails:  # another local label of the same release: accepted
            assert proc.returncode == 0 and f"imported {path}" in proc.stdout, proc.stdout + proc.stderr
            continue
        assert proc.returncode == 3, f"rc {proc.returncode}, not an ImportError:\n{proc.stdout}{proc.stderr}"
        message = proc.stdout
        assert f"built against torch {fake_version}" in message and f"runs torch {running}" in message, message
        assert f"pip install torch=={fake_version.split('+')[0]}" in message, message
        assert "pip install --no-build-isolation --force-reinstall --no-deps ." in message, message
        assert "extension loaded: False" in message, message
    # Built in place in a checkout (make install): the fix is to rebuild there.
    path = _fake_package(tmp_path / "checkout", site, "2.12.0", installed=False)
    proc = subprocess.run([python, "-c", GUARDED_IMPORT], capture_output=True, text=True, timeout=120,
                          env=_clean_env(PYTHONPATH=path), cwd=tmp_path)
    assert proc.returncode == 3 and "built against torch 2.12.0" in proc.stdout, proc.stdout + proc.stderr
    assert "in this checkout: make install, or pip install --no-build-isolation -e ." in proc.stdout, proc.stdout


def _info(python: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "mccl.info", *args], capture_output=True, text=True, timeout=120,
                          env=_clean_env(**env), cwd="/")


@pytest.mark.timeout(1200)
def test_info_reports_build_devices_network_environment_and_limits(installed):
    _, python, _ = installed
    proc = _info(python, "--json", MCCL_RING_THRESHOLD="1M", MCCL_NOT_A_PARAMETER="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["mccl"]["version"] == metadata.version("mccl") and info["mccl"]["c_library"]
    assert info["mccl"]["installed"].startswith("from the wheel") or "index or a wheel" in info["mccl"]["installed"]
    build = info["build"]
    assert build["torch_built_against"] == build["torch_running"] == str(torch.__version__) and build["torch_match"]
    for key in ("cc_version", "cflags", "cxx_version", "cxxflags", "simd_kernels", "python_built_with"):
        assert build[key], (key, build)
    assert info["devices"]["backend_accepts"][0] == "cpu" and info["devices"]["cpu"]["count"] >= 1
    assert "available" in info["devices"]["cuda"] and "available" in info["devices"]["mps"]
    net = info["network"]
    assert any(i["name"] for i in net["interfaces"]), net
    listens = net["mccl_listens_on"]
    assert "address" in listens and any(listens["address"] in i["addresses"] for i in net["interfaces"]), listens
    env = info["environment"]
    assert env["set"]["MCCL_RING_THRESHOLD"] == "1M"
    assert env["integer_parameters_in_force"]["MCCL_RING_THRESHOLD"] == {"value": 1 << 20, "set": "1M"}
    for name in ("MCCL_SEGMENT_BYTES", "MCCL_PIPELINE_DEPTH", "MCCL_SEND_THREAD", "MCCL_SOCKET_BUFSIZE"):
        assert name in env["integer_parameters_in_force"], env
    assert env["set_but_unknown_to_libmccl"] == ["MCCL_NOT_A_PARAMETER"]
    limits = info["os"]["open_files_ulimit_n"]
    assert limits["soft"] and limits["hard"]
    if sys.platform.startswith("linux"):
        assert info["os"]["socket_buffers"]["net.core.rmem_max"].isdigit()
        assert len(info["os"]["socket_buffers"]["net.ipv4.tcp_rmem"].split()) == 3

    text = _info(python, MCCL_SOCKET_IFNAME="no-such-interface")
    assert text.returncode == 0, text.stdout + text.stderr
    for heading in ("== mccl ==", "== build ==", "== devices ==", "== network ==", "== environment ==", "== os =="):
        assert heading in text.stdout, text.stdout
    for field in ("torch_built_against:", "torch_running:", "cc_version:", "cflags:", "simd_kernels:",
                  "backend_accepts:", "mccl_listens_on:", "MCCL_SEGMENT_BYTES:", "open_files_ulimit_n:"):
        assert field in text.stdout, (field, text.stdout)
    # The library's own message for a setting that matches nothing, in place of an address.
    assert "MCCL_SOCKET_IFNAME=no-such-interface matches no interface" in " ".join(text.stdout.split()), text.stdout


def test_info_runs_from_the_source_tree_too():
    """The editable install CI tests with: `python -m mccl.info` works there, without the probe."""
    proc = _info(sys.executable, "--no-probe")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== environment ==" in proc.stdout and "not probed (--no-probe)" in proc.stdout
