"""A model test: random operations through the mount and on a plain directory agree.

A hypothesis state machine applies the same operation (write, append, truncate, rename,
unlink, link, mkdir, rmdir, chmod, fsync, reads through fresh and long-lived descriptors)
to an rwfs mount and to a plain directory on the same filesystem, side by side. After each
step both trees must hold the same names, file types, modes, link counts and bytes, and an
operation that fails must fail with the same errno on both. One mount serves the whole run.

Names under ``node_modules/`` are a passthrough path: their opens are the kernel's (the
fast path). The one difference from a plain directory allowed is the documented one: a
rename or link that would give a journaled name to a file held open there fails with
EBUSY, and changes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import GATES_OFF, Mount, check_clean, prepare_state
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

NAMES = ["a", "b", "c", "d", "d/a", "d/b", "d/e", "d/e/a", "e"]
NAMES += ["node_modules", "node_modules/a", "node_modules/d", "node_modules/d/a"]
MODES = [0o600, 0o644, 0o755, 0o400, 0o711]

names = st.sampled_from(NAMES)
data = st.binary(min_size=0, max_size=64) | st.sampled_from([b"same", b"x" * 5000])
offsets = st.sampled_from([0, 1, 3, 100, 4096, 10_000])
sizes = st.sampled_from([0, 1, 5, 64, 4097, 20_000])


def outcome(fn: Callable[[Path], Any], root: Path) -> Any:
    try:
        return ("ok", fn(root))
    except OSError as exc:
        return ("error", errno.errorcode.get(exc.errno or 0, exc.errno))


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            s = os.lstat(full)
            body = None
            if stat.S_ISREG(s.st_mode):
                with open(full, "rb") as f:
                    body = f.read()
            out[os.path.relpath(full, root)] = (
                stat.S_IFMT(s.st_mode),
                stat.S_IMODE(s.st_mode),
                s.st_size if stat.S_ISREG(s.st_mode) else None,
                s.st_nlink,
                body,
            )
    return out


class Sides:
    """The mount and the plain directory one run works in (set by the test)."""

    mount: Mount
    plain: Path
    n = 0


class FsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Sides.n += 1
        sub = f"run{Sides.n}"
        self.roots = (Sides.mount.path / sub, Sides.plain / sub)
        for r in self.roots:
            r.mkdir()
            (r / "node_modules").mkdir()  # (from the start: its names are the fast path's)
        # Long-lived descriptors: (mount fd, plain fd, name), closed in teardown.
        self.fds: list[tuple[int, int, str]] = []

    def both(self, fn: Callable[[Path], Any]) -> Any:
        got = [outcome(fn, r) for r in self.roots]
        assert got[0] == got[1], f"mount: {got[0]!r}\nplain: {got[1]!r}"
        return got[0]

    def both_fd(self, idx: int, fn: Callable[[int], Any]) -> Any:
        fm, fp, _ = self.fds[idx % len(self.fds)]
        got = []
        for fd in (fm, fp):
            try:
                got.append(("ok", fn(fd)))
            except OSError as exc:
                got.append(("error", errno.errorcode.get(exc.errno or 0, exc.errno)))
        assert got[0] == got[1], f"mount: {got[0]!r}\nplain: {got[1]!r}"
        return got[0]

    # ---- path operations ----

    @rule(name=names, buf=data, off=offsets)
    def write(self, name: str, buf: bytes, off: int) -> None:
        def run(root: Path) -> int:
            fd = os.open(root / name, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                return os.pwrite(fd, buf, off)
            finally:
                os.close(fd)

        self.both(run)

    @rule(name=names, buf=data)
    def replace_contents(self, name: str, buf: bytes) -> None:
        def run(root: Path) -> None:
            fd = os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, buf)
            finally:
                os.close(fd)

        self.both(run)

    @rule(name=names, buf=data)
    def append(self, name: str, buf: bytes) -> None:
        def run(root: Path) -> int:
            fd = os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, buf)
                return os.fstat(fd).st_size
            finally:
                os.close(fd)

        self.both(run)

    @rule(name=names, size=sizes)
    def truncate(self, name: str, size: int) -> None:
        self.both(lambda root: os.truncate(root / name, size))

    def held_passed_through(self, src: str, dst: str) -> bool:
        """Whether ``src`` is (or holds) a file of node_modules/ a long-lived descriptor
        has open, and ``dst`` is outside node_modules/: the fast path's EBUSY."""
        top = "node_modules"
        if src.split("/")[0] != top or dst.split("/")[0] == top:
            return False
        held = {os.fstat(fm).st_ino for fm, _, _ in self.fds}
        p = self.roots[0] / src
        try:
            found = {os.lstat(p).st_ino}
        except OSError:
            return False
        for dirpath, _, files in os.walk(p):
            found |= {os.lstat(os.path.join(dirpath, f)).st_ino for f in files}
        return bool(held & found)

    def both_or_busy(self, fn: Callable[[Path], Any], src: str, dst: str) -> None:
        explained = self.held_passed_through(src, dst)
        got = outcome(fn, self.roots[0])
        if got == ("error", "EBUSY") and explained:
            return  # (the invariant checks that the mount changed nothing)
        plain = outcome(fn, self.roots[1])
        assert got == plain, f"mount: {got!r}\nplain: {plain!r}"

    @rule(src=names, dst=names)
    def rename(self, src: str, dst: str) -> None:
        self.both_or_busy(lambda root: os.rename(root / src, root / dst), src, dst)

    @rule(name=names)
    def unlink(self, name: str) -> None:
        self.both(lambda root: os.unlink(root / name))

    @rule(src=names, dst=names)
    def link(self, src: str, dst: str) -> None:
        self.both_or_busy(lambda root: os.link(root / src, root / dst), src, dst)

    @rule(name=names)
    def mkdir(self, name: str) -> None:
        self.both(lambda root: os.mkdir(root / name))

    @rule(name=names)
    def rmdir(self, name: str) -> None:
        self.both(lambda root: os.rmdir(root / name))

    @rule(name=names, mode=st.sampled_from(MODES))
    def chmod(self, name: str, mode: int) -> None:
        self.both(lambda root: os.chmod(root / name, mode))

    @rule(name=names, buf=data)
    def write_fsync(self, name: str, buf: bytes) -> None:
        def run(root: Path) -> bytes:
            fd = os.open(root / name, os.O_RDWR)
            try:
                os.pwrite(fd, buf, 0)
                os.fsync(fd)
                return os.pread(fd, 1 << 16, 0)
            finally:
                os.close(fd)

        self.both(run)

    @rule(name=names)
    def reopen_and_read(self, name: str) -> None:
        def run(root: Path) -> tuple[bytes, int]:
            fd = os.open(root / name, os.O_RDONLY)
            try:
                return os.read(fd, 1 << 16), os.fstat(fd).st_size
            finally:
                os.close(fd)

        self.both(run)

    # ---- long-lived descriptors ----

    @precondition(lambda self: len(self.fds) < 3)
    @rule(name=names)
    def open_fd(self, name: str) -> None:
        opened = []
        got = []
        for root in self.roots:
            try:
                opened.append(os.open(root / name, os.O_RDWR))
                got.append("ok")
            except OSError as exc:
                got.append(errno.errorcode[exc.errno or 0])
        if len(opened) == 2:
            self.fds.append((opened[0], opened[1], name))
        else:
            for fd in opened:
                os.close(fd)
        assert got[0] == got[1], f"open {name}: mount {got[0]}, plain {got[1]}"

    @precondition(lambda self: self.fds)
    @rule(idx=st.integers(0, 2), buf=data, off=offsets)
    def fd_write(self, idx: int, buf: bytes, off: int) -> None:
        self.both_fd(idx, lambda fd: os.pwrite(fd, buf, off))

    @precondition(lambda self: self.fds)
    @rule(idx=st.integers(0, 2))
    def fd_read(self, idx: int) -> None:
        def run(fd: int) -> Any:
            s = os.fstat(fd)
            return os.pread(fd, 1 << 16, 0), s.st_size, s.st_nlink, stat.S_IMODE(s.st_mode)

        self.both_fd(idx, run)

    @precondition(lambda self: self.fds)
    @rule(idx=st.integers(0, 2), size=sizes)
    def fd_truncate(self, idx: int, size: int) -> None:
        self.both_fd(idx, lambda fd: os.ftruncate(fd, size))

    @precondition(lambda self: self.fds)
    @rule(idx=st.integers(0, 2))
    def fd_fsync(self, idx: int) -> None:
        self.both_fd(idx, os.fsync)

    @precondition(lambda self: self.fds)
    @rule(idx=st.integers(0, 2))
    def fd_close(self, idx: int) -> None:
        fm, fp, _ = self.fds.pop(idx % len(self.fds))
        got = []
        for fd in (fm, fp):
            try:
                os.close(fd)
                got.append("ok")
            except OSError as exc:
                got.append(errno.errorcode[exc.errno or 0])
        assert got[0] == got[1], f"close: mount {got[0]}, plain {got[1]}"

    # ---- the check after every step ----

    @invariant()
    def trees_agree(self) -> None:
        assert tree(self.roots[0]) == tree(self.roots[1])

    def teardown(self) -> None:
        for fm, fp, _ in self.fds:
            os.close(fm)
            os.close(fp)
        self.fds = []
        for r in self.roots:
            shutil.rmtree(r)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    base = tmp_path_factory.mktemp("model")
    ws = base / "ws"
    ws.mkdir()
    (base / "plain").mkdir()
    # The model is plain POSIX: the gates, which refuse some writes on purpose, are off.
    prepare_state(ws, GATES_OFF)
    m = Mount(ws).start()
    try:
        Sides.mount, Sides.plain = m, base / "plain"
        yield m
    finally:
        m.stop()
    check_clean(m)


def test_mount_matches_plain_directory(sides: Mount) -> None:
    run_state_machine_as_test(
        FsModel,
        settings=settings(
            max_examples=150,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    status = json.loads((sides.path / ".rw" / "status").read_text())
    if "fastpath=off" not in sides.options:
        assert status["passthrough"]["opens"] > 0, status["passthrough"]  # the fast path ran
