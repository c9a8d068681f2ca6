"""memlimit.py: the cgroup v2 memory limit (a pod's), and admission control's default from it."""
from __future__ import annotations

from pathlib import Path

from gateway.memlimit import auto_inflight_limit, memory_limit


def tree(tmp_path: Path, limits: dict[str, str], own: str = "/kubepods/pod1/ctr") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, value in limits.items():
        d = root / rel.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(value + "\n")
    (root / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup-of-self"
    proc.write_text(f"0::{own}\n")
    return proc, root


def test_the_tightest_limit_up_the_tree(tmp_path):
    proc, root = tree(tmp_path, {"/kubepods": "8589934592", "/kubepods/pod1": "2147483648",
                                 "/kubepods/pod1/ctr": "max"})
    assert memory_limit({}, proc, root) == 2 * 1024**3


def test_unlimited_or_unknown(tmp_path):
    proc, root = tree(tmp_path, {"/kubepods/pod1/ctr": "max"})
    assert memory_limit({}, proc, root) is None
    assert memory_limit({}, tmp_path / "missing", root) is None
    (tmp_path / "v1").write_text("4:memory:/docker/abc\n")  # cgroup v1 only: not read
    assert memory_limit({}, tmp_path / "v1", root) is None


def test_injected_limit_wins(tmp_path):
    proc, root = tree(tmp_path, {"/kubepods/pod1/ctr": "1000"})
    assert memory_limit({"OIP_GATEWAY_MEMORY_LIMIT": "5000"}, proc, root) == 5000
    assert memory_limit({"OIP_GATEWAY_MEMORY_LIMIT": "lots"}, proc, root) is None


def test_a_fifth_per_worker():
    assert auto_inflight_limit(None, 4) == 0
    assert auto_inflight_limit(10_000, 1) == 2_000
    assert auto_inflight_limit(10_000, 4) == 500
