"""watch_file on real temp files. Synchronisation is on observed polls (a counting wrapper
around ``watch.file_id``) and on an event the callback sets, never on sleeps."""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
from collections.abc import AsyncIterator

import pytest

from gateway import watch

TIMEOUT = 5.0


class Watcher:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.calls = 0
        self.fail_on: set[int] = set()  # calls (1-based) that raise, as a failed reload would
        self.seen: list[str] = []
        self.changed = asyncio.Event()
        self.polls = 0
        self._polled = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def count_poll(self, real, path: str):
        self.polls += 1
        self._polled.set()
        return real(path)

    async def on_change(self) -> None:
        self.calls += 1
        self.seen.append(self.path.read_text())
        self.changed.set()
        if self.calls in self.fail_on:
            raise RuntimeError("reload blew up")

    async def polls_pass(self, n: int = 2) -> None:
        """Wait until the watcher has looked at the file ``n`` more times."""
        target = self.polls + n
        while self.polls < target:
            self._polled.clear()
            await asyncio.wait_for(self._polled.wait(), TIMEOUT)

    async def change_seen(self) -> None:
        await asyncio.wait_for(self.changed.wait(), TIMEOUT)
        self.changed.clear()


@contextlib.asynccontextmanager
async def watching(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                   recheck_every: int = 1000) -> AsyncIterator[Watcher]:
    """watch_file(path) running as a task of the test's own loop (the periodic
    recheck far away unless a test asks for it)."""
    w = Watcher(path)
    real = watch.file_id
    monkeypatch.setattr(watch, "file_id", lambda p: w.count_poll(real, p))
    w.task = asyncio.create_task(watch.watch_file(str(path), w.on_change, interval=0.01,
                                                  recheck_every=recheck_every))
    try:
        await w.polls_pass(1)  # the initial stat is taken: changes from now on are changes
        yield w
    finally:
        w.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w.task


@pytest.fixture
def config_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "config.yaml"
    path.write_text("version: 1\n")
    return path


async def test_content_change_calls_back_once(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        watched.path.write_text("version: 2, longer\n")
        await watched.change_seen()
        await watched.polls_pass()
        assert watched.calls == 1 and watched.seen == ["version: 2, longer\n"]


async def test_same_size_rewrite_is_seen(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        st = watched.path.stat()
        watched.path.write_text("version: 9\n")
        os.utime(watched.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        await watched.change_seen()
        assert watched.calls == 1


async def test_no_change_no_call(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        watched.path.read_text()  # reading changes nothing that stat reports
        await watched.polls_pass(5)
        assert watched.calls == 0


async def test_touch_is_left_to_the_callback(config_file, monkeypatch):
    # watch_file reports a changed file; whether its bytes changed is for on_change to
    # decide (Gateway.reload_file(if_changed=True) compares digests, also across SIGHUPs).
    async with watching(config_file, monkeypatch) as watched:
        st = watched.path.stat()
        os.utime(watched.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        await watched.change_seen()
        await watched.polls_pass()
        assert watched.calls == 1 and watched.seen == ["version: 1\n"]


async def test_failing_callback_does_not_end_the_watch(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        watched.fail_on = {1}
        watched.path.write_text("version: 2, longer\n")
        await watched.change_seen()
        watched.path.write_text("version: 3, longer still\n")
        await watched.change_seen()
        assert watched.calls == 2 and not watched.task.done()


async def test_atomic_rename_calls_back(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        tmp = watched.path.with_name("config.yaml.tmp")
        tmp.write_text("version: 3\n")  # same size: only the inode tells
        os.replace(tmp, watched.path)
        await watched.change_seen()
        assert watched.seen == ["version: 3\n"]


async def test_configmap_symlink_swap_calls_back(tmp_path, monkeypatch):
    # Kubernetes' ConfigMap volume: config.yaml -> ..data/config.yaml, ..data -> ..v1;
    # an update writes ..v2 and renames a new ..data link over the old one.
    root = tmp_path / "cm"
    (root / "..v1").mkdir(parents=True)
    (root / "..v1" / "config.yaml").write_text("version: 1\n")
    os.symlink("..v1", root / "..data")
    os.symlink("..data/config.yaml", root / "config.yaml")
    async with watching(root / "config.yaml", monkeypatch) as w:
        (root / "..v2").mkdir()
        (root / "..v2" / "config.yaml").write_text("version: 2\n")
        os.symlink("..v2", root / "..data_tmp")
        os.replace(root / "..data_tmp", root / "..data")
        (root / "..v1" / "config.yaml").unlink()
        (root / "..v1").rmdir()
        await w.change_seen()
        await w.polls_pass()
        assert w.calls == 1 and w.seen == ["version: 2\n"]


async def test_briefly_missing_file_is_waited_out(config_file, monkeypatch):
    async with watching(config_file, monkeypatch) as watched:
        watched.path.unlink()
        await watched.polls_pass(3)
        assert watched.calls == 0 and not watched.task.done()
        watched.path.write_text("version: 4, longer\n")  # another size: inode and mtime may be reused
        await watched.change_seen()
        assert watched.calls == 1 and watched.seen == ["version: 4, longer\n"] and not watched.task.done()


async def test_rewrite_within_one_timestamp_tick_is_seen(config_file, monkeypatch):
    async with watching(config_file, monkeypatch, recheck_every=4) as watched:
        st = watched.path.stat()
        watched.path.write_text("version: 7\n")  # same size as "version: 1\n"
        os.utime(watched.path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a coarse clock would leave it
        await watched.polls_pass(5)
        # The stat did not change: the periodic recheck calls back; the callback
        # (Gateway.reload_file(if_changed=True)) finds the new content by its digest.
        assert watched.calls >= 1
