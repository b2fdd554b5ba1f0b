"""Shared fixtures: real rwfs mounts in temporary directories, always unmounted.

A mount test starts the real console entry point (``rwfs mount --foreground``) in a
subprocess, waits for the mount while checking that the daemon is alive, and in teardown
unmounts (``fusermount3 -u``, then ``-u -z``, then SIGKILL of the daemon it started), checks
that the daemon logged no traceback and that ``rwfs fsck`` agrees with the tree.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rwfs.core.workspace import Workspace
from rwfs.journal.store import Store
from rwfs.policy import Policy

RWFS = [sys.executable, "-m", "rwfs.cli"]


def _end_with_parent() -> None:
    """In the daemon, before exec: SIGTERM (rwfs then unmounts and exits) when the test
    process dies. pytest-timeout ends a hung test with os._exit, which runs no fixture
    teardown: without this its mounts would stay."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _require_fuse() -> None:
    # Never skip: on a machine without FUSE the mount tests must fail loudly.
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tests need FUSE")


def rwfs_mounted(point: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == point and line.split()[2] == "fuse.rwfs" for line in f)


GATES_OFF = "\n".join(f'[gates.{g}]\naction = "off"' for g in ("truncation", "elision", "syntax"))


def prepare_state(workspace: Path, policy: str) -> None:
    """Give a workspace rwfs state with this policy before its first mount."""
    rw = workspace / ".rw"
    rw.mkdir(mode=0o700, exist_ok=True)
    (rw / "rwfs-state").write_text("rwfs state\n")
    (rw / "policy.toml").write_text(policy)


class Mount:
    """One rwfs daemon serving ``workspace`` at ``mountpoint``."""

    def __init__(
        self,
        workspace: Path,
        mountpoint: Path | None = None,
        options: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        self.workspace = workspace
        self.mountpoint = mountpoint or workspace
        # RWFS_TEST_FASTPATH=off|on: every mount of the run so, unless it says (scripts/test
        # runs the matrix again with the fast path off).
        fast = os.environ.get("RWFS_TEST_FASTPATH")
        if fast and not any(o.startswith("fastpath=") for o in options):
            options = (*options, f"fastpath={fast}")
        self.options = options
        self.env = env or {}
        self.log = log or workspace.parent / f"daemon-{workspace.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def path(self) -> Path:
        return self.mountpoint

    def start(self, timeout: float = 30.0) -> Mount:
        _require_fuse()
        cmd = [*RWFS, "mount", "--foreground"]
        for o in self.options:
            cmd += ["-o", o]
        cmd += [str(self.workspace), str(self.mountpoint)]
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=logf,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            preexec_fn=_end_with_parent,
        )
        logf.close()
        deadline = time.monotonic() + timeout
        while not rwfs_mounted(str(self.mountpoint)):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"rwfs daemon exited {self.proc.returncode}: {self.log.read_text()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(
                    f"rwfs did not mount within {timeout}s: {self.log.read_text()}"
                )
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Unmount cleanly and wait for the daemon to finish its commits."""
        if self.proc is None:
            return
        if rwfs_mounted(str(self.mountpoint)):
            res = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            if res.returncode != 0:
                time.sleep(0.5)
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True
                )
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"the daemon did not exit after unmount: {self.log.read_text()}"
            ) from None
        finally:
            self.proc = None

    def kill(self, reap: bool = True) -> None:
        """SIGKILL the daemon (a crash), then clear the dead mount. ``reap=False`` leaves
        the dead mount (every access fails with ENOTCONN) for the caller to clear with
        ``reap()`` once its writers have stopped: a writer that outlived the clearing would
        write the raw tree, behind rwfs's back."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None
        if reap:
            self.reap()

    def reap(self) -> None:
        if rwfs_mounted(str(self.mountpoint)):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)

    def wait_dead(self, timeout: float = 30.0) -> int:
        """Wait for a daemon that kills itself (a fault point); returns its exit status."""
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self.proc = None
        self.reap()
        return code

    def fsck(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RWFS, "fsck", str(self.workspace)],
            capture_output=True,
            text=True,
            errors="replace",  # (a drift it names may be a path of any bytes)
            timeout=120,
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A small XFS filesystem in a loop image: it shares extents (a stage is a reflink)."""
    image, point = tmp_path / "xfs.img", tmp_path / "xfs"
    with open(image, "wb") as f:
        f.truncate(512 << 20)  # sparse: the host stores only what XFS writes
    subprocess.run(["mkfs.xfs", "-q", str(image)], check=True, timeout=60)
    point.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True, timeout=60)
    try:
        yield point
    finally:
        if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs: a disk that fills."""
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def mount(workspace: Path) -> Iterator[Mount]:
    """A workspace mounted over itself; checked clean (no traceback, fsck 0) afterwards."""
    m = Mount(workspace).start()
    try:
        yield m
    finally:
        m.stop()
    check_clean(m)


def mounted_beside(tmp_path: Path) -> tuple[Path, Path, Mount]:
    """A workspace mounted at a separate mount point: its raw tree stays visible."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    return ws, mp, Mount(ws, mp).start()


def check_clean(m: Mount) -> None:
    log = m.log_text()
    assert "Traceback" not in log, f"the daemon logged an exception:\n{log}"
    res = m.fsck()
    assert res.returncode == 0, f"fsck found drift:\n{res.stdout}{res.stderr}"


def as_nobody(cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a shell command as user and group 65534 (nobody), as another user would."""
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    """A core ``Workspace`` over a temporary tree, no mount (``ws.tree`` is the tree)."""
    root = tmp_path / "tree"
    (root / ".rw").mkdir(parents=True)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    state_fd = os.open(root / ".rw", os.O_RDONLY | os.O_DIRECTORY)
    store = Store(str(root / ".rw" / "journal"))
    w = Workspace(root_fd, state_fd, store, Policy())
    w.tree = root  # type: ignore[attr-defined]
    yield w
    store.close()
    os.close(root_fd)
    os.close(state_fd)


async def submit_new(ws: Any, i: int, wait: bool, owner: Any = None) -> Any:
    """Commit ``new <i>`` over the file ``f<i>`` of the tree through ``ws.committer.submit``."""
    from rwfs.core.commits import Commit

    fd = os.open(ws.tree / f"f{i}", os.O_RDONLY)
    try:
        stage = await ws.stages.new(fd, truncate=True)
    finally:
        os.close(fd)
    os.pwrite(stage.fd, b"new %d" % i, 0)
    stage.sealed = True
    intended, size, _ = await ws.stages.seal(stage)
    return await ws.committer.submit(
        Commit(b"f%d" % i, stage, intended, size, {}, owner=owner), wait
    )
