"""Run the gateway and the reference server as real processes for tests.

Both bind port 0 and write the ports they got to a ``--port-file``; tests wait
for that file (bounded), never probe for a free port.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .procs import terminate, wait_for

__all__ = ["GatewayProcess", "ReferenceServer", "gateway_config"]


class _PortFileProcess:
    """A ``python -m gateway <args> --port-file F`` child; ports read back from F."""

    def __init__(self, args: list[str], workdir: Path, name: str, env: dict[str, str] | None = None,
                 cgroup: Path | None = None) -> None:
        self.cgroup = cgroup  # a cgroup directory the process joins before it starts (cgroup.procs)
        self.workdir = workdir
        self.port_file = workdir / f"{name}.ports.json"
        self.log_path = workdir / f"{name}.log"
        self._args = args
        self._env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 30.0) -> _PortFileProcess:
        self.port_file.unlink(missing_ok=True)
        log = open(self.log_path, "wb")
        env = dict(os.environ, **(self._env or {}))
        argv = [sys.executable, "-m", "gateway", *self._args, "--port-file", str(self.port_file)]
        if self.cgroup is not None:  # the shell joins the cgroup, then becomes the gateway
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup), *argv]
        self.proc = subprocess.Popen(
            argv,
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        log.close()

        def ready() -> dict[str, int] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.log_tail()}")
            return json.loads(self.port_file.read_text()) if self.port_file.exists() else None

        try:
            self.ports = wait_for(ready, timeout=timeout, what=f"{self.port_file.name}")
        except Exception:
            self.stop()
            raise RuntimeError(f"{self._args[0]} did not start:\n{self.log_tail()}") from None
        return self

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"127.0.0.1:{self.ports['metrics']}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ReferenceServer(_PortFileProcess):
    """The built-in reference V2 server (``oip-gateway reference``)."""

    def __init__(self, workdir: Path, name: str = "reference", *, metrics: bool = False) -> None:
        extra = ["--metrics", "127.0.0.1:0"] if metrics else []
        super().__init__(["reference", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", *extra], workdir, name)


def gateway_config(
    backends: dict[str, dict[str, Any]],
    routes: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "listen": {"http": "127.0.0.1:0", "grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0"},
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
        "backends": backends,
        "routes": routes,
    }
    cfg.update(extra)
    return cfg


class GatewayProcess(_PortFileProcess):
    """``oip-gateway serve`` on a config dict written to the work dir."""

    def __init__(self, config: dict[str, Any], workdir: Path, name: str = "gateway",
                 workers: int | None = None, env: dict[str, str] | None = None, cgroup: Path | None = None) -> None:
        cfg_path = workdir / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        args = ["serve", "--config", str(cfg_path)]
        if workers is not None:
            args += ["--workers", str(workers)]
        super().__init__(args, workdir, name, env, cgroup)
        self.config_path = cfg_path

    def access(self) -> dict[str, dict[str, Any]]:
        """The access log's entries so far (its log file), by request id."""
        out = {}
        for line in self.log_path.read_text(errors="replace").splitlines():
            if "oip_gateway.access" in line:
                entry = json.loads(line.split("oip_gateway.access", 1)[1].split(": ", 1)[1])
                out[entry["request_id"]] = entry
        return out
