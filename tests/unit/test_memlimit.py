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
    (tmp_path / "v1").write_text("4:memory:/docker/abc\n")  # cgroup v1, no memory hierarchy mounted
    assert memory_limit({}, tmp_path / "v1", root) is None


def test_cgroup_v1_memory_controller(tmp_path):
    root = tmp_path / "cgroup"
    for rel, value in {"memory": "9223372036854771712", "memory/kubepods": "8589934592",
                       "memory/kubepods/pod1": "9223372036854771712",
                       "memory/kubepods/pod1/ctr": "1073741824"}.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "memory.limit_in_bytes").write_text(value + "\n")
    proc = tmp_path / "self"
    proc.write_text("12:pids:/kubepods/pod1/ctr\n4:cpuacct,memory:/kubepods/pod1/ctr\n0::/\n")
    assert memory_limit({}, proc, root) == 1024**3
    # In a container the cgroup's own directory is the mount's root; its host path is not there.
    proc.write_text("4:memory:/docker/0123abcd\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("536870912\n")
    assert memory_limit({}, proc, root) == 512 * 1024**2
    proc.write_text("4:memory:/\n")  # no limit set anywhere
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit({}, proc, root) is None


def test_a_path_that_climbs_out_is_not_followed(tmp_path):
    proc, root = tree(tmp_path, {"/": "4096"})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "memory.max").write_text("1\n")
    proc.write_text("0::/../elsewhere\n")
    assert memory_limit({}, proc, root) == 4096


def test_injected_limit_wins(tmp_path):
    proc, root = tree(tmp_path, {"/kubepods/pod1/ctr": "1000"})
    assert memory_limit({"OIP_GATEWAY_MEMORY_LIMIT": "5000"}, proc, root) == 5000
    assert memory_limit({"OIP_GATEWAY_MEMORY_LIMIT": "lots"}, proc, root) is None


def test_a_fifth_per_worker():
    assert auto_inflight_limit(None, 4) == 0
    assert auto_inflight_limit(10_000, 1) == 2_000
    assert auto_inflight_limit(10_000, 4) == 500
