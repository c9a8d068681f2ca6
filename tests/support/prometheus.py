"""A real Prometheus server (Debian's ``prometheus`` package) as a test process.

::

    with Prometheus(workdir, {"oip-gateway": [gw.metrics_url]}, rule_files=[RULES]) as prom:
        prom.wait_scraped_after("oip-gateway", time.time())
        prom.query('sum(oip_gateway_requests_total)')

Its own storage directory and config in ``workdir``; every target scraped every second
(``scrape_interval`` 1 s) and rules evaluated every second. It listens on
``127.0.0.1:0``: Prometheus (Go's net.Listen) accepts port 0 though it reports only the
configured address, so the port it got is read back from /proc (``procs.listening_ports``) —
no probing for a free port (DESIGN.md, Habit 5) — and then checked by asking the API for its
build info. The process gets SIGTERM when the test process dies (``terminate_with_parent``).

The Debian package also installs a system service (prometheus.service: port 9090,
/var/lib/prometheus). Nothing here uses it; where systemd runs it is a separate process
on another port and storage, harmless to the tests.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .procs import listening_ports, terminate, terminate_with_parent, wait_for

__all__ = ["PROMETHEUS", "PROMTOOL", "PromQLError", "Prometheus", "Sample", "promtool"]

PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")

Sample = tuple[dict[str, str], float]  # (labels, value) of one instant-vector element


class PromQLError(Exception):
    """The query API refused a query: HTTP 400 (``bad_data``: it does not parse) or 422
    (``execution``: it parsed but could not run)."""

    def __init__(self, status: int, error_type: str, error: str, query: str) -> None:
        super().__init__(f"HTTP {status} {error_type}: {error}\n  query: {query}")
        self.status = status
        self.error_type = error_type
        self.error = error
        self.query = query


def promtool(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run promtool; the caller checks ``returncode`` (its output says why)."""
    return subprocess.run([_binary(PROMTOOL), *args], capture_output=True, text=True, timeout=timeout)


def _binary(path: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise FileNotFoundError(f"{path} not found: install Debian's prometheus package "
                                "(apt-get install --no-install-recommends prometheus)")
    return found


class Prometheus:
    """``prometheus`` scraping ``targets`` ({job: ["host:port", ...]}) every ``scrape_interval``."""

    def __init__(
        self,
        workdir: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        rule_files: Iterable[Path | str] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        name: str = "prometheus",
    ) -> None:
        self.workdir = workdir
        self.storage = workdir / f"{name}-data"
        self.config_path = workdir / f"{name}.yml"
        self.log_path = workdir / f"{name}.log"
        self.config: dict[str, Any] = {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,  # must not exceed the interval (default 10 s)
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addrs)}]}
                for job, addrs in targets.items()
            ],
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.version = ""  # the server's, read from its API at start

    # ------------------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 30.0) -> Prometheus:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        check = promtool("check", "config", str(self.config_path))
        if check.returncode != 0:
            raise RuntimeError(f"promtool check config failed:\n{check.stdout}{check.stderr}")
        shutil.rmtree(self.storage, ignore_errors=True)
        log = open(self.log_path, "wb")
        parent = os.getpid()
        self.proc = subprocess.Popen(
            [
                _binary(PROMETHEUS),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.storage}",
                "--storage.tsdb.retention.time=1h",
                "--web.listen-address=127.0.0.1:0",
                "--log.level=info",
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.workdir,
            preexec_fn=lambda: terminate_with_parent(parent),
        )
        log.close()
        try:
            self.port = wait_for(self._bound_port, timeout=timeout, what="prometheus listening")
            # The port is this process's own (from /proc); the API answering proves it is up.
            info = wait_for(lambda: self._api("/api/v1/status/buildinfo"), timeout=timeout,
                            what="prometheus API")
            self.version = info.get("version", "?")
            wait_for(self._ready, timeout=timeout, what="prometheus /-/ready")
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"prometheus did not start: {exc}\n{self.log_tail()}") from None
        return self

    def _bound_port(self) -> int | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
        ports = listening_ports(self.proc.pid, include_children=False)
        if len(ports) > 1:
            raise RuntimeError(f"prometheus listens on several ports {sorted(ports)}; expected one")
        return next(iter(ports), None)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as resp:
            return resp.status == 200

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------------------------ API

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.url}{path}"
        data = urllib.parse.urlencode(params).encode() if params else None  # POST: long queries fit
        try:
            with urllib.request.urlopen(url, data=data, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise exc from None
            raise PromQLError(exc.code, body.get("errorType", "?"), body.get("error", "?"),
                              (params or {}).get("query", path)) from None
        if body.get("status") != "success":
            raise PromQLError(200, body.get("errorType", "?"), body.get("error", "?"),
                              (params or {}).get("query", path))
        return body["data"]

    def query_raw(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """``/api/v1/query``: ``{"resultType": ..., "result": ...}``; PromQLError when refused."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("/api/v1/query", params)

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant vector as (labels, value) pairs (a scalar result is one pair with no labels)."""
        data = self.query_raw(expr, at)
        if data["resultType"] == "vector":
            return [(r["metric"], float(r["value"][1])) for r in data["result"]]
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        raise ValueError(f"{expr!r} gave a {data['resultType']}, not an instant vector")

    def values(self, expr: str, by: Sequence[str]) -> dict[tuple[str, ...], float]:
        """``query`` keyed by the values of the labels ``by`` (missing labels read as "")."""
        out: dict[tuple[str, ...], float] = {}
        for labels, value in self.query(expr):
            key = tuple(labels.get(k, "") for k in by)
            if key in out:
                raise ValueError(f"{expr!r}: two series with {dict(zip(by, key))}")
            out[key] = value
        return out

    def rule_groups(self) -> list[dict[str, Any]]:
        return self._api("/api/v1/rules")["groups"]

    def targets(self) -> list[dict[str, Any]]:
        return self._api("/api/v1/targets")["activeTargets"]

    # ------------------------------------------------------------------------------ waiting

    def last_scrape(self, job: str) -> float:
        """Unix time of the newest scrape of ``job`` (its oldest target's), 0 before any."""
        got = self.query(f'min(timestamp(up{{job="{job}"}}))')
        return got[0][1] if got else 0.0

    def wait_scraped_after(self, job: str, t: float, timeout: float = 15.0) -> float:
        """Wait (bounded) until every target of ``job`` was scraped by a scrape that began
        after ``t`` (Unix time) and succeeded; return that scrape's time."""

        def scraped() -> float | None:
            if self.query(f'up{{job="{job}"}} == 0'):
                raise RuntimeError(f"a target of {job} is down: {self.targets()}")
            last = self.last_scrape(job)
            return last if last > t else None

        return wait_for(scraped, timeout=timeout, interval=0.1, what=f"a scrape of {job} after {t:.3f}")

    def wait_rules_evaluated_after(self, t: float, timeout: float = 15.0) -> None:
        """Wait (bounded) until every rule group finished an evaluation that began after ``t``."""

        def evaluated() -> bool:
            groups = self.rule_groups()
            if not groups:
                raise RuntimeError("no rule groups loaded")
            return all(_rfc3339(g["lastEvaluation"]) > t for g in groups)

        wait_for(evaluated, timeout=timeout, interval=0.1, what=f"rule evaluations after {t:.3f}")


_RFC3339 = re.compile(r"^(?P<base>[^.Z+]+?)(?:\.(?P<frac>\d+))?(?P<zone>Z|[+-]\d\d:\d\d)$")


def _rfc3339(stamp: str) -> float:
    """Prometheus's RFC 3339 timestamps (Go's: nanoseconds, 'Z' or an offset) as Unix time;
    Python before 3.11's fromisoformat takes neither nanoseconds nor 'Z'."""
    m = _RFC3339.match(stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    zone = "+00:00" if m["zone"] == "Z" else m["zone"]
    base = datetime.fromisoformat(m["base"] + zone).timestamp()
    if base < 0:
        return 0.0  # Go's zero time (0001-01-01…): never evaluated
    return base + (float("0." + m["frac"]) if m["frac"] else 0.0)
