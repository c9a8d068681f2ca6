"""Build step of oip-gateway (metadata is in pyproject.toml).

The hot-path modules listed in COMPILED are compiled to C extensions with mypyc (mypy's
compiler: the same type annotations, checked, become native code) when the build has a C
compiler; without one — or with OIP_GATEWAY_COMPILE=0 — the package installs as pure Python,
which behaves the same, only slower. docs/design-notes.md ("Compiled hot path") says which
modules and what it saves.
"""
from __future__ import annotations

import os
import shutil
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Each is imported compiled when its extension is built; `pip install -e .` builds them next to
# the sources (tests/conftest.py refuses a run whose extension is older than its source).
COMPILED = [
    "gateway/backends/h1/errors.py",
    "gateway/backends/h1/slots.py",
    "gateway/backends/h1/answer.py",
    "gateway/backends/h1/clock.py",
    "gateway/backends/h1/link.py",
    "gateway/backends/h1/reader.py",
    "gateway/backends/h1/connection.py",
    "gateway/backends/h1/pool.py",
    "gateway/frontend/h1direct.py",
    "gateway/frontend/infer.py",
    "gateway/frontend/inferchecks.py",
    "gateway/codec/content.py",
    "gateway/codec/jsondup.py",
    "gateway/codec/grpcscan.py",
    "gateway/codec/jsonscan.py",
    "gateway/frontend/grpcunary.py",
]


def _compiler() -> bool:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


def ext_modules() -> list:
    if os.environ.get("OIP_GATEWAY_COMPILE", "1") == "0":
        return []
    if not _compiler():
        print("oip-gateway: no C compiler here; installing the pure-Python modules")
        return []
    from mypyc.build import mypycify

    # One shared library for them all, named for the project (else a hash of the module list).
    return mypycify(COMPILED, opt_level="3", debug_level="1", group_name="oip_gateway")


class BuildExt(build_ext):
    """build_ext that marks every extension it leaves next to the sources as built now: mypyc
    relinks a module only when its generated C changed, so an edit to a comment would leave an
    extension older than its source, which the tests and benchmarks/ab.py take as stale."""

    def run(self) -> None:
        super().run()
        if self.inplace:
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.utime(path)


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
