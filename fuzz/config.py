"""Fuzz target: the config loader (gateway/config/loader.py), YAML text → GatewayConfig.

The input is a config file's bytes, read as ``oip-gateway check`` and ``--watch`` /
SIGHUP reloads read it (``read_config``). The contract: a config is either loaded or
refused with ConfigError (one message per problem); any other exception is a bug (the
CLI and the reloader catch ConfigError only). A loaded config must hold together: every
route names a backend the config has.
"""
from __future__ import annotations

import atexit
import os
import pathlib
import tempfile

from fuzz._support import check, instrumented, run

with instrumented(__name__ == "__main__", ("gateway", "yaml")):
    from gateway.config.loader import read_config
    from gateway.errors import ConfigError

__all__ = ["one_input"]

_FILE: pathlib.Path | None = None


def _path() -> pathlib.Path:
    """One scratch file per process, rewritten for every input."""
    global _FILE
    if _FILE is None:
        fd, name = tempfile.mkstemp(prefix="oip-fuzz-config-", suffix=".yaml")
        os.close(fd)
        _FILE = pathlib.Path(name)
        atexit.register(_FILE.unlink, missing_ok=True)
    return _FILE


def one_input(data: bytes) -> None:
    path = _path()
    path.write_bytes(data)
    try:
        config, digest = read_config(path)
    except ConfigError as exc:
        check(bool(exc.problems) and all(isinstance(p, str) and p for p in exc.problems),
              f"ConfigError without a message per problem: {exc.problems!r}")
        return
    check(config is not None and len(digest) == 32, "read_config returned no config")
    assert config is not None
    for route in config.routes:
        for name in route.backends:
            check(name in config.backends, f"route {route.model!r} names unknown backend {name!r}")


if __name__ == "__main__":
    run(one_input)
