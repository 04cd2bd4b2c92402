"""Builds torchtpu's one C++ extension (torchtpu/csrc/native.cpp) at install time.

Everything else is in pyproject.toml.  The extension is optional: where it
cannot be built (no compiler), torchtpu installs without it and runs with
one device index, tpu:0 (docs/distributed.md).
"""

import os

from setuptools import setup

# torch would import the torchtpu being rebuilt (its backend entry point), with a stale extension.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("torchtpu._native", ["torchtpu/csrc/native.cpp"], extra_compile_args=["-O2"],
                              optional=True)],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
