"""Build the mccl Python package: the C library (via `make lib`) linked into the torch shim.

The extension is compiled against the torch that is installed, so build without an isolated
environment (which would download some other torch):

    pip install --no-build-isolation .                    # or -e . for a checkout you edit
    pip wheel --no-build-isolation --no-deps . -w dist    # a wheel (pip)
    python -m build --wheel --no-isolation                # a wheel (pypa/build: pip install build)

Next to the extension the build writes `mccl/_build_info.py`: the torch it was built against, the
compilers and flags. `import mccl` compares that torch with the one it runs under before it loads
the extension (python/mccl/_torch_guard.py), and `python -m mccl.info` prints it.

MCCL_BUILD_REUSE_INPLACE=1 (for the packaging test): a wheel build copies the extension that
`build_ext --inplace` or `pip install -e .` left in python/mccl/ instead of compiling it again,
when that one is newer than every source, header, libmccl.a and this file, and was built for the
same torch; otherwise it compiles as usual and says why.
"""
import glob
import os
import platform
import pprint
import shutil
import subprocess
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _first_line(cmd):
    """The first line `cmd` prints, or None if it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _library_build():
    """CC and CFLAGS of libmccl, from the Makefile (`make print-build`)."""
    try:
        out = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "print-build"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _source_commit():
    """The checkout's commit (with '-dirty' if tracked files changed), or None outside git."""
    commit = _first_line(["git", "-C", ROOT, "rev-parse", "HEAD"])
    if commit and len(commit) == 40:
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode
        return commit + ("-dirty" if dirty == 1 else "")
    return None


def build_record(ext):
    """What `_build_info.py` holds: plain strings, readable without torch or the extension."""
    lib = _library_build()
    cxx = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension compiles with
    return {
        "mccl_version": DISTRIBUTION_VERSION,
        "torch_version": str(torch.__version__),
        "torch_git_version": getattr(torch.version, "git_version", None),
        "torch_cuda": torch.version.cuda,
        "torch_cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cc": lib.get("CC"),
        "cc_version": lib.get("CC_VERSION"),
        "cflags": lib.get("CFLAGS"),
        "cxx": cxx,
        "cxx_version": _first_line([cxx, "--version"]),
        "cxxflags": " ".join(ext.extra_compile_args),
        "ldflags": " ".join(ext.extra_link_args),
        "source_commit": _source_commit(),
    }


def _newest_input(ext):
    paths = [os.path.join(ROOT, p) for p in ext.sources] + list(ext.extra_objects) + [os.path.abspath(__file__)]
    paths += glob.glob(os.path.join(ROOT, "torch", "*.hpp")) + glob.glob(os.path.join(ROOT, "include", "*.h"))
    return max(os.path.getmtime(p) for p in paths if os.path.exists(p))


class BuildWithLibrary(BuildExtension):
    """Build libmccl.a with the project's Makefile before compiling the C++ shim against it, and
    write the build record next to the extension."""

    def run(self):
        subprocess.check_call(["make", "-C", ROOT, "lib"])
        super().run()
        for ext in self.extensions:
            target = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "_build_info.py"), "w") as f:
                f.write('"""Written by setup.py when mccl._C was built; read before it loads (_torch_guard.py)."""\n')
                f.write("BUILD = %s\n" % pprint.pformat(build_record(ext), width=100, sort_dicts=False))

    def build_extension(self, ext):
        if not self.inplace and os.environ.get("MCCL_BUILD_REUSE_INPLACE") == "1" and self._reuse_inplace(ext):
            return
        super().build_extension(ext)

    def _reuse_inplace(self, ext):
        """Copy python/mccl's in-place extension into the build if it is up to date; else say why not."""
        name = os.path.basename(self.get_ext_filename(ext.name))
        src = os.path.join(ROOT, "python", *ext.name.split(".")[:-1], name)
        info = os.path.join(os.path.dirname(src), "_build_info.py")
        why = None
        if not os.path.exists(src) or not os.path.exists(info):
            why = "there is none (or no _build_info.py beside it)"
        elif os.path.getmtime(src) < _newest_input(ext):
            why = "a source, header, libmccl.a or setup.py is newer"
        else:
            scope = {}
            with open(info) as f:
                exec(f.read(), scope)  # our own generated literal
            if scope.get("BUILD", {}).get("torch_version") != str(torch.__version__):
                why = "it was built for torch %s" % scope.get("BUILD", {}).get("torch_version")
        if why:
            print("MCCL_BUILD_REUSE_INPLACE: compiling, not reusing %s: %s" % (src, why))
            return False
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(src, dest)
        print("MCCL_BUILD_REUSE_INPLACE: reused %s (newer than every input)" % src)
        return True


def _project_version():
    """pyproject.toml's [project] version (one place for it)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        for line in f:
            if line.startswith("version"):
                return line.split("=", 1)[1].strip().strip('"')
    return "unknown"


DISTRIBUTION_VERSION = _project_version()
IS_MACOS = sys.platform == "darwin"
SOURCES = ["torch/ProcessGroupMCCL.cpp", "torch/call_site.cpp", "torch/module.cpp", "torch/device.cpp", "torch/device_cpu.cpp",
           "torch/device_cuda.cpp"]  # device_cuda.cpp needs no CUDA toolkit: it loads libcuda at run time
COMPILE = ["-O2", "-std=c++17"]
LINK = ["-pthread"]
DEFINES = []
if IS_MACOS:
    # MPS: one Objective-C++ unit, without ARC (ATen's MPS headers do not build under it).
    SOURCES.append("torch/device_mps.mm")
    COMPILE.append("-fno-objc-arc")
    LINK += ["-framework", "Metal", "-framework", "Foundation"]
    DEFINES.append(("MCCL_WITH_MPS", "1"))
else:
    LINK.append("-ldl")  # dlopen of libcuda.so.1

setup(
    packages=find_packages("python"),  # every subpackage (mccl.check, .bench, .ray, .agent, .data, ...)
    package_dir={"": "python"},
    ext_modules=[
        CppExtension(
            "mccl._C",
            sources=SOURCES,
            include_dirs=[os.path.join(ROOT, "include")],
            extra_objects=[os.path.join(ROOT, "build", "libmccl.a")],
            extra_compile_args=COMPILE,
            extra_link_args=LINK,
            define_macros=DEFINES,
        )
    ],
    cmdclass={"build_ext": BuildWithLibrary},
)
