"""Build the mccl Python package: the C library (via `make lib`) linked into the torch shim.

Install with `pip install --no-build-isolation .` (or `-e .`) into an environment that already has
torch: an isolated build environment would download a different torch than the one installed.
"""
import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibrary(BuildExtension):
    """Build libmccl.a with the project's Makefile before compiling the C++ shim against it."""

    def run(self):
        subprocess.check_call(["make", "-C", ROOT, "lib"])
        super().run()


setup(
    packages=["mccl", "mccl.check", "mccl.bench", "mccl.ray"],
    package_dir={"": "python"},
    ext_modules=[
        CppExtension(
            "mccl._C",
            sources=["torch/ProcessGroupMCCL.cpp", "torch/module.cpp"],
            include_dirs=[os.path.join(ROOT, "include")],
            extra_objects=[os.path.join(ROOT, "build", "libmccl.a")],
            extra_compile_args=["-O2", "-std=c++17"],
            extra_link_args=["-pthread"],
        )
    ],
    cmdclass={"build_ext": BuildWithLibrary},
)
