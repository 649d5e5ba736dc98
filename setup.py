"""Build the mccl Python package: the C library (via `make lib`) linked into the torch shim.

Install with `pip install --no-build-isolation .` (or `-e .`) into an environment that already has
torch: an isolated build environment would download a different torch than the one installed.
"""
import os
import subprocess
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibrary(BuildExtension):
    """Build libmccl.a with the project's Makefile before compiling the C++ shim against it."""

    def run(self):
        subprocess.check_call(["make", "-C", ROOT, "lib"])
        super().run()


IS_MACOS = sys.platform == "darwin"
SOURCES = ["torch/ProcessGroupMCCL.cpp", "torch/module.cpp", "torch/device.cpp", "torch/device_cpu.cpp",
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
    packages=["mccl", "mccl.check", "mccl.bench", "mccl.ray"],
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
