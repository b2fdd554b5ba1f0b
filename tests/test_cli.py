"""The CLI as a user runs it: background mount, status, log, fsck, umount, doctor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import RWFS, Mount, rwfs_mounted


def rwfs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RWFS, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_mount_status_log_umount_fsck(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\n")
    res = rwfs("mount", str(workspace))
    assert res.returncode == 0, res.stderr
    try:
        assert rwfs_mounted(str(workspace))  # mount returns only once the mount is ready
        (workspace / "a.py").write_text("x = 2\n")
        st = rwfs("status", "--json", str(workspace))
        assert st.returncode == 0 and json.loads(st.stdout)["mounted"] is True
        log = rwfs("log", "--json", "-C", str(workspace), str(workspace / "a.py"))
        assert log.returncode == 0
        ops = [json.loads(line)["op"] for line in log.stdout.splitlines()]
        assert ops == ["write"]
        assert rwfs("fsck", str(workspace)).returncode == 0
    finally:
        res = rwfs("umount", str(workspace))
        if rwfs_mounted(str(workspace)):
            subprocess.run(["fusermount3", "-u", "-z", str(workspace)])
    assert res.returncode == 0, res.stderr
    assert not rwfs_mounted(str(workspace))
    # Offline: the raw tree holds the commit and every verb still reads the journal.
    assert (workspace / "a.py").read_text() == "x = 2\n"
    st = json.loads(rwfs("status", "--json", str(workspace)).stdout)
    assert st["mounted"] is False and st["counts"]["commits"] == 1
    human = rwfs("log", "-C", str(workspace)).stdout
    assert "write" in human and "a.py" in human
    assert rwfs("fsck", str(workspace)).returncode == 0


def test_fsck_reports_drift_and_exits_nonzero(workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\n")
    assert rwfs("mount", str(workspace)).returncode == 0
    try:
        (workspace / "a.txt").write_text("two\n")
    finally:
        assert rwfs("umount", str(workspace)).returncode == 0
    (workspace / "a.txt").write_text("changed behind rwfs's back\n")
    res = rwfs("fsck", str(workspace))
    assert res.returncode == 1
    assert "a.txt" in res.stdout and "journaled as" in res.stdout


def test_mount_refuses_a_foreign_dot_rw(workspace: Path) -> None:
    (workspace / ".rw").mkdir()
    (workspace / ".rw" / "mine.txt").write_text("not rwfs state\n")
    res = rwfs("mount", str(workspace))
    assert res.returncode != 0
    assert "not rwfs state" in res.stderr
    assert not rwfs_mounted(str(workspace))
    assert sorted(p.name for p in (workspace / ".rw").iterdir()) == ["mine.txt"]


def test_status_of_a_plain_directory_is_a_clear_error(tmp_path: Path) -> None:
    res = rwfs("status", str(tmp_path))
    assert res.returncode == 1
    assert "never mounted" in res.stderr and "Traceback" not in res.stderr


def test_doctor_finds_everything_here() -> None:
    res = rwfs("doctor")
    assert res.returncode == 0, res.stdout
    assert "everything rwfs needs" in res.stdout
    assert "_fuseopen" not in res.stdout, "the C extension for the kernel caches is missing"


def test_agents_md_tells_an_agent_what_a_refusal_means() -> None:
    res = rwfs("agents-md")
    assert res.returncode == 0
    for needle in ("EBADMSG", ".rw/why/", ".rw/rejected/", "retry_budget", "ESTALE", "-74"):
        assert needle in res.stdout, needle
    assert "`rwfs:` on the command's stderr" in res.stdout
    recipes = rwfs("agents-md", "--recipes")
    assert recipes.returncode == 0 and recipes.stdout != res.stdout
    for agent in ("CLAUDE.md", "AGENTS.md", "GEMINI.md", "aider --read", "rwfs run --review"):
        assert agent in recipes.stdout, agent


def test_batch_snapshot_restore_undo_and_conflicts_verbs(mount: Mount) -> None:
    p = str(mount.path)
    (mount.path / "a.txt").write_text("a0\n")
    res = rwfs("batch", "begin", "b1", "-C", p)
    assert res.returncode == 0 and "b1 is open" in res.stdout, res.stderr
    (mount.path / "a.txt").write_text("a1\n")
    diff = rwfs("batch", "diff", "b1", "-C", p)
    assert "-a0" in diff.stdout and "+a1" in diff.stdout
    listed = rwfs("batch", "status", "-C", p)
    assert listed.stdout.split("\t")[:2] == ["b1", "open"]
    res = rwfs("batch", "commit", "b1", "-C", p)
    assert res.returncode == 0 and "b1 is committed" in res.stdout, res.stderr
    assert json.loads(rwfs("batch", "status", "b1", "-C", p).stdout)["state"] == "committed"
    assert rwfs("snapshot", "s1", "-C", p).returncode == 0
    assert rwfs("snapshot", "-C", p).stdout.startswith("s1\t")
    (mount.path / "a.txt").write_text("a2\n")
    assert rwfs("restore", "s1", str(mount.path / "a.txt"), "-C", p).returncode == 0
    assert (mount.path / "a.txt").read_text() == "a1\n"
    assert rwfs("undo", "restore-s1", "-C", p).returncode == 0
    again = rwfs("undo", "restore-s1", "-C", p)  # undone already: says how to redo it
    assert again.returncode == 1 and "rwfs undo undo-restore-s1" in again.stderr, again.stderr
    assert (mount.path / "a.txt").read_text() == "a2\n"
    res = rwfs("conflicts", "-C", p, "--json")
    assert res.returncode == 0 and res.stdout == ""
    # Refusals: one line on stderr that says why, exit 1, nothing changed.
    for args, words in (
        (("batch", "commit", "nosuch"), "no batch"),
        (("batch", "begin", "b1"), "taken"),
        (("undo", "nosuch"), "no change"),
        (("restore", "nosuch"), "no snapshot"),
        (("conflicts", "resolve", "9", "keep-actual"), "no open conflict"),
    ):
        res = rwfs(*args, "-C", p)
        assert res.returncode == 1 and words in res.stderr, (args, res.stderr)
    assert (mount.path / "a.txt").read_text() == "a2\n"
    res = rwfs("batch", "status", "-C", "/")
    assert res.returncode == 1 and "not inside an rwfs mount" in res.stderr


def test_a_stopped_daemon_elsewhere_does_not_hang_a_verb_here(mount: Mount, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("a\n")
    Mount(other).start().stop()  # a workspace with state, not mounted now
    assert mount.proc is not None
    os.kill(mount.proc.pid, signal.SIGSTOP)  # as a debugger would leave it
    try:
        res = subprocess.run(
            [*RWFS, "fsck", str(other)], capture_output=True, text=True, timeout=60
        )
    finally:
        os.kill(mount.proc.pid, signal.SIGCONT)
    assert res.returncode == 0 and "agree" in res.stdout, res


# The modules only the daemon needs: a verb that imports them starts several times slower.
DAEMON_MODULES = (
    "trio",
    "pyfuse3",
    "rwfs.fuse.fs",
    "rwfs.control.tree",
    "rwfs.core.workspace",
    "rwfs.core.batches",
)

_IMPORTS = """\
import sys
import rwfs.cli.commands
try:
    rwfs.cli.commands.main(sys.argv[2:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as f:
    f.write("\\n".join(sys.modules))
"""


def _daemon_modules_of(tmp_path: Path, *args: str) -> list[str]:
    out = tmp_path / "modules.txt"
    res = subprocess.run(
        [RWFS[0], "-c", _IMPORTS, str(out), *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in res.stderr, res.stderr
    mods = out.read_text().split("\n")
    return [m for m in mods if m in DAEMON_MODULES or m.split(".")[0] in DAEMON_MODULES[:2]]


def test_verbs_start_without_the_daemons_modules(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.txt").write_text("one\n")
    m = Mount(workspace).start()
    (workspace / "a.txt").write_text("two\n")
    m.stop()
    ws = str(workspace)
    for args in (("--help",), ("status", ws), ("status", "--json", ws), ("log", "-C", ws)):
        assert _daemon_modules_of(tmp_path, *args) == [], args
    assert rwfs("mount", ws).returncode == 0
    try:
        for args in (
            ("status", ws),
            ("log", "-C", ws),
            ("undo", "-C", ws, "nosuch"),
            ("run", "-C", ws, "--", "true"),
        ):
            assert _daemon_modules_of(tmp_path, *args) == [], args
    finally:
        assert rwfs("umount", ws).returncode == 0


def test_umount_returns_once_the_daemons_pid_is_gone(workspace: Path) -> None:
    res = rwfs("mount", str(workspace))
    assert res.returncode == 0, res.stderr
    try:
        pid = json.loads((workspace / ".rw" / "status").read_text())["pid"]
        (workspace / "a.txt").write_text("one\n")
    finally:
        res = rwfs("umount", str(workspace))
    assert res.returncode == 0, res.stderr
    # Not even a zombie: the daemon's parent reaped it before umount returned.
    assert not os.path.exists(f"/proc/{pid}")
    assert (workspace / "a.txt").read_text() == "one\n"


def test_umount_says_when_the_daemon_does_not_exit(
    mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rwfs.cli import mount as mounting

    assert mount.proc is not None
    pid = mount.proc.pid
    real_run = subprocess.run

    def run(cmd: list[str], **kw: Any) -> Any:
        if cmd[0] == "fusermount3":  # the daemon stops just as it is unmounted
            os.kill(pid, signal.SIGSTOP)
        return real_run(cmd, **kw)

    monkeypatch.setattr(mounting.subprocess, "run", run)
    try:
        with pytest.raises(mounting.QuietError) as err:
            mounting.umount(str(mount.path), timeout=0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    said = str(err.value)
    assert f"its daemon (pid {pid}) has not exited after 0.5s" in said, said
    assert "unmounted" in said and "Wait for it to exit" in said
    assert not rwfs_mounted(str(mount.path))


def test_mkdir_of_a_taken_batch_name_puts_its_own_envelope(mount: Mount) -> None:
    top = mount.path / ".rw" / "batches"
    (top / "b1").mkdir()

    def other_error() -> None:  # a different envelope in last-error first
        with pytest.raises(OSError):
            (mount.path / ".rw" / "ctl").write_text("nosuchverb\n")
        assert "not a known verb" in (mount.path / ".rw" / "last-error").read_text()

    other_error()
    # The kernel sees b1 exists and fails the mkdir itself, without asking the daemon.
    with pytest.raises(FileExistsError):
        (top / "b1").mkdir()
    env = json.loads((mount.path / ".rw" / "last-error").read_text())
    assert env["errno"] == "EEXIST" and env["batch"] == "b1", env
    assert "name b1 is taken" in env["message"] and "choose another name" in env["message"]
    other_error()
    res = subprocess.run(["mkdir", "b1/"], cwd=top, capture_output=True, text=True)
    assert res.returncode == 1 and "File exists" in res.stderr  # (relative, trailing /)
    assert "name b1 is taken" in (mount.path / ".rw" / "last-error").read_text()
    other_error()
    # A lookup of b1 on the way to something else is no mkdir of b1.
    with pytest.raises(OSError):
        (top / "b1" / "sub").mkdir()
    assert "taken" not in (mount.path / ".rw" / "last-error").read_text()
    assert (top / "b1" / "status").exists()
    assert "taken" not in (mount.path / ".rw" / "last-error").read_text()
    (top / "b1" / "ctl").write_text("abort\n")
    # The same for a snapshot's and a chunk session's name.
    for where, what in (("snapshots", "snapshot s1 exists"), ("chunks", "session s1 exists")):
        (mount.path / ".rw" / where / "s1").mkdir()
        other_error()
        with pytest.raises(FileExistsError):
            (mount.path / ".rw" / where / "s1").mkdir()
        env = json.loads((mount.path / ".rw" / "last-error").read_text())
        assert env["errno"] == "EEXIST" and what in env["message"], env


def test_a_refusals_draft_path_resolves_from_the_writers_directory(mount: Mount) -> None:
    sub = mount.path / "pkg" / "deep"
    sub.mkdir(parents=True)
    (sub / "a.py").write_text("x = 1\n")
    broken = "def f(:\n"
    code = (
        "import json, os, sys\n"
        "try:\n"
        "    with open('a.py', 'w') as f:\n"
        f"        f.write({broken!r})\n"
        "except OSError:\n"
        "    pass\n"
        "env = json.load(open(os.path.join(os.environ['TOP'], '.rw', 'last-error')))\n"
        "print(json.dumps(env))\n"
        "print(open(env['draft_path']).read(), end='')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=sub,
        env={**os.environ, "TOP": str(mount.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    line, drafted = res.stdout.split("\n", 1)
    env = json.loads(line)
    assert drafted == broken  # opened from pkg/deep, by the envelope's path
    at = str(mount.path / ".rw" / "rejected") + "/"
    assert env["draft_path"].startswith(at) and env["draft"].startswith(".rw/rejected/")
    assert env["draft_path"].endswith(env["draft"].rsplit("/", 1)[1])
    assert f"your draft is at {env['draft_path']}" in env["message"]
    why = json.loads((mount.path / ".rw" / "why" / "pkg" / "deep" / "a.py").read_text())
    assert why["draft_path"] == env["draft_path"]
    assert (sub / "a.py").read_text() == "x = 1\n"
