"""Build step of oip-gateway (metadata is in pyproject.toml).

The hot-path modules listed in COMPILED are compiled to C extensions with mypyc (mypy's
compiler: the same type annotations, checked, become native code) when the build has a C
compiler; without one — or with OIP_GATEWAY_COMPILE=0 — the package installs as pure Python,
which behaves the same, only slower. docs/design-notes.md ("Compiled hot path") says which
modules and what it saves.

gateway/codec/_jsonskip.c (one byte loop of codec/jsonscan.py), gateway/codec/_jsondata.c (JSON
data arrays read into tensor bytes, codec/jsonfast.py) and gateway/_fill.c (the HTTP/1.1 client's
whole-answer buffer, backends/h1/framing.py) are built with them.

Apart from those, gateway/h2/_h2.c (HTTP/2 on libnghttp2, docs/h2-design.md) is built whenever a C
compiler and the header nghttp2/nghttp2.h are there (Debian: libnghttp2-dev), whatever
OIP_GATEWAY_COMPILE says; OIP_GATEWAY_H2=0 leaves it out. Nothing imports it unless it is there
(gateway.h2.available()).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Each is imported compiled when its extension is built; `pip install -e .` builds them next to
# the sources (tests/conftest.py refuses a run whose extension is older than its source).
COMPILED = [
    "gateway/backends/h1/errors.py",
    "gateway/backends/h1/slots.py",
    "gateway/backends/h1/answer.py",
    "gateway/backends/h1/clock.py",
    "gateway/backends/h1/link.py",
    "gateway/backends/h1/framing.py",
    "gateway/backends/h1/reader.py",
    "gateway/backends/h1/connection.py",
    "gateway/backends/h1/pool.py",
    "gateway/frontend/h1direct.py",
    "gateway/frontend/h1conn.py",
    "gateway/frontend/h1sizes.py",
    "gateway/frontend/incoming.py",
    "gateway/rawbody.py",
    "gateway/frontend/infer.py",
    "gateway/frontend/inferchecks.py",
    "gateway/codec/content.py",
    "gateway/codec/jsondup.py",
    "gateway/codec/grpcscan.py",
    "gateway/codec/jsonscan.py",
    "gateway/codec/queue_metrics.py",
    "gateway/frontend/grpcunary.py",
    "gateway/codec/grpcframe.py",
    "gateway/frontend/h2head.py",
    "gateway/frontend/h2calls.py",
    "gateway/frontend/h2infer.py",
    "gateway/frontend/h2session.py",
    "gateway/frontend/h2listen.py",
    "gateway/backends/h2frames.py",
    "gateway/backends/h2stream.py",
    "gateway/backends/h2bidi.py",
    "gateway/backends/h2conn.py",
    "gateway/backends/h2channel.py",
    "gateway/proxy.py",
    "gateway/proxynow.py",
    "gateway/holding.py",
    "gateway/backends/base.py",
    "gateway/backends/refusal.py",
    "gateway/backends/grpc.py",
    "gateway/backends/grpc_outcome.py",
    "gateway/backends/http.py",
    "gateway/backends/http_exchange.py",
    "gateway/snapshot.py",
    "gateway/admission.py",
    "gateway/observability/loopmetrics.py",
    "gateway/observability/metrics.py",
    "gateway/budget.py",
    "gateway/frontend/h1listen.py",
    "gateway/codec/bounds.py",
    "gateway/headers.py",
    "gateway/routing/table.py",
    "gateway/observability/access.py",
]


def _compiler() -> bool:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


H2_EXTENSION = "gateway.h2._h2"

# Symbols of libnghttp2 newer than Debian bookworm's 1.52 that _h2.c uses when the installed
# library has them. Probed by compiling and linking, not by version: Debian backports some of them
# without changing NGHTTP2_VERSION_NUM (docs/h2-design.md, "Versions").
H2_FEATURES = {
    "H2_HAVE_SSIZE2": "nghttp2_session_mem_recv2",
    "H2_HAVE_MAX_CONTINUATIONS": "nghttp2_option_set_max_continuations",
    "H2_HAVE_STREAM_RESET_LIMIT": "nghttp2_option_set_stream_reset_rate_limit",
}


def _mypyc_modules() -> list:
    if os.environ.get("OIP_GATEWAY_COMPILE", "1") == "0":
        return []
    if not _compiler():
        print("oip-gateway: no C compiler here; installing the pure-Python modules")
        return []
    from mypyc.build import mypycify

    # One shared library for them all, named for the project (else a hash of the module list).
    return mypycify(COMPILED, opt_level="3", debug_level="1", group_name="oip_gateway")


def _nghttp2_include_dirs() -> list[str] | None:
    """Where nghttp2/nghttp2.h is ([] for the compiler's default path), or None without it."""
    dirs: list[str] = []
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--cflags-only-I", "libnghttp2"], capture_output=True, text=True)
        if found.returncode == 0:
            dirs = [flag[2:] for flag in found.stdout.split() if flag.startswith("-I")]
    for d in [*dirs, "/usr/include", "/usr/local/include"]:
        if os.path.exists(os.path.join(d, "nghttp2", "nghttp2.h")):
            return [d] if d in dirs else []
    return None


def _h2_modules() -> list:
    if os.environ.get("OIP_GATEWAY_H2", "1") == "0" or not _compiler():
        return []
    include_dirs = _nghttp2_include_dirs()
    if include_dirs is None:
        print("oip-gateway: no nghttp2/nghttp2.h (install libnghttp2-dev); leaving out gateway.h2._h2, "
              "so gRPC will run on grpcio: the same behaviour, 2-5x the CPU per call (docs/h2-design.md)")
        return []
    return [Extension(H2_EXTENSION, ["gateway/h2/_h2.c"], include_dirs=include_dirs, libraries=["nghttp2"])]


JSONSKIP_EXTENSION = "gateway.codec._jsonskip"
JSONDATA_EXTENSION = "gateway.codec._jsondata"
FILL_EXTENSION = "gateway._fill"
RAWIO_EXTENSION = "gateway._rawio"


def _jsonskip_modules() -> list:
    """codec/jsonscan.py's byte loop and codec/jsonfast.py's data reader in C, and the HTTP/1.1
    client's whole-answer buffer (gateway/_fill.c), and rawbody.py's buffers and socket mark
    (gateway/_rawio.c); without them, the same in Python, slower."""
    if os.environ.get("OIP_GATEWAY_COMPILE", "1") == "0" or not _compiler():
        return []
    return [Extension(JSONSKIP_EXTENSION, ["gateway/codec/_jsonskip.c"], extra_compile_args=["-O2"]),
            Extension(JSONDATA_EXTENSION, ["gateway/codec/_jsondata.c"], extra_compile_args=["-O2"]),
            Extension(FILL_EXTENSION, ["gateway/_fill.c"], extra_compile_args=["-O2"]),
            Extension(RAWIO_EXTENSION, ["gateway/_rawio.c"], extra_compile_args=["-O2"])]


def ext_modules() -> list:
    return _mypyc_modules() + _h2_modules() + _jsonskip_modules()


def _links(compiler, ext: Extension, symbol: str) -> bool:
    """Whether a program taking the address of ``symbol`` from nghttp2.h compiles and links."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("#include <nghttp2/nghttp2.h>\n"
                    f"int main(void) {{ void *p = (void *)&{symbol}; return p == 0; }}\n")
        try:
            objs = compiler.compile([src], output_dir=tmp, include_dirs=ext.include_dirs)
            compiler.link_executable(objs, os.path.join(tmp, "probe"), libraries=ext.libraries,
                                     library_dirs=ext.library_dirs)
        except Exception:
            print(f"oip-gateway: this libnghttp2 has no {symbol} (the compiler error above is that probe's)")
            return False
    return True


class BuildExt(build_ext):
    """build_ext that marks every extension it leaves next to the sources as built now: mypyc
    relinks a module only when its generated C changed, so an edit to a comment would leave an
    extension older than its source, which the tests and benchmarks/ab.py take as stale.

    For gateway.h2._h2 it first probes which newer libnghttp2 symbols are there (H2_FEATURES) and
    turns on the compiler's warnings."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name == H2_EXTENSION:
            ext.define_macros = [(macro, "1") for macro, symbol in H2_FEATURES.items()
                                 if _links(self.compiler, ext, symbol)]
        if ext.name in (H2_EXTENSION, JSONSKIP_EXTENSION, JSONDATA_EXTENSION, FILL_EXTENSION) and \
                self.compiler.compiler_type == "unix":
            ext.extra_compile_args = [*ext.extra_compile_args, "-Wall", "-Wextra"]
        super().build_extension(ext)

    def run(self) -> None:
        super().run()
        if self.inplace:
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.utime(path)


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
