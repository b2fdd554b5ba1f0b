"""``rwfs run`` and the command line's manners, through real mounts.

Each test drives the real console entry point in a subprocess. A workspace that
``rwfs run`` (or a verb) mounts for itself must be unmounted again when it returns; the
``loose`` fixture clears any mount a failing test leaves behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RWFS, Mount, check_clean, rwfs_mounted

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def rwfs(
    *args: str, cwd: Path | str | None = None, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RWFS, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
        env=ENV,
    )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A small project (a git work tree's top: where ``rwfs run`` starts a workspace),
    never mounted; any mount left on it is cleared afterwards."""
    ws = tmp_path / "proj"
    (ws / "src").mkdir(parents=True)
    (ws / ".git").mkdir()
    (ws / "src" / "app.py").write_text("x = 1\n")
    (ws / "notes.txt").write_text("hello\n")
    (ws / "old.txt").write_text("to be removed\n")
    try:
        yield ws
    finally:
        if rwfs_mounted(str(ws)):
            subprocess.run(["fusermount3", "-u", "-z", str(ws)], capture_output=True)
            raise AssertionError(f"{ws} was left mounted")


SCRIPT = """
set -u
printf 'x = 2\\n' > app.py                        # an edit (cwd: src/)
printf 'new\\n' > ../new.txt                      # a new file
rm ../old.txt                                     # a deletion
printf 'x = (\\n' > "$TMPBAD"
cp "$TMPBAD" app.py || echo "cp refused" >&2       # a refusal: a syntax regression
echo "session=$RWFS_SESSION control=$RWFS_CONTROL ws=$RWFS_WORKSPACE pwd=$(pwd)"
exit 7
"""


def run_script(project: Path, tmp_path: Path, *opts: str) -> subprocess.CompletedProcess[str]:
    bad = tmp_path / "bad.py"
    return subprocess.run(
        [*RWFS, "run", *opts, "--", "sh", "-c", SCRIPT],
        cwd=project / "src",
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "TMPBAD": str(bad)},
    )


def test_run_edits_refuses_deletes_summary_undo(project: Path, tmp_path: Path) -> None:
    res = run_script(project, tmp_path)
    assert res.returncode == 7, res.stderr  # COMMAND's exit status
    assert not rwfs_mounted(str(project))  # it mounted, so it unmounted
    env = dict(w.split("=", 1) for w in res.stdout.split())
    name = env["session"]
    assert name.startswith("run-")
    assert env["control"] == f"{project}/.rw"
    assert env["ws"] == str(project)
    assert env["pwd"] == f"{project}/src"  # the same relative place, inside the mount
    err = res.stderr
    assert "cp refused" in err
    assert f"session {name} ended, exit status 7" in err
    assert "changed 1 (src/app.py)" in err
    assert "created 1 (new.txt)" in err
    assert "deleted 1 (old.txt)" in err
    assert "refused src/app.py: " in err and "does not parse" in err
    refused = [ln for ln in err.splitlines() if ln.startswith("  refused src/app.py")]
    assert len(refused) == 1 and refused[0].count("(draft: ") == 1  # the draft, once
    # ... at a path that is there after the unmount: the refused bytes.
    assert Path(refused[0].rsplit("(draft: ", 1)[1].rstrip(")")).read_text() == "x = (\n"
    leaves = [ln for ln in err.splitlines() if ln.startswith("  undo leaves ")]
    assert len(leaves) == 1 and "passthrough paths (.git/" in leaves[0], err
    assert f"rwfs undo {name} -C {project}" in err
    assert (project / "src" / "app.py").read_text() == "x = 2\n"
    assert not (project / "old.txt").exists()

    # The printed undo command puts the tree back, in one step (mounting for itself).
    undo = rwfs("undo", name, "-C", str(project))
    assert undo.returncode == 0, undo.stderr
    assert not rwfs_mounted(str(project))
    assert (project / "src" / "app.py").read_text() == "x = 1\n"
    assert (project / "old.txt").read_text() == "to be removed\n"
    assert not (project / "new.txt").exists()
    # ... and the undo is undoable.
    redo = rwfs("undo", f"undo-{name}", "-C", str(project))
    assert redo.returncode == 0, redo.stderr
    assert (project / "src" / "app.py").read_text() == "x = 2\n"
    assert (project / "new.txt").exists() and not (project / "old.txt").exists()
    fsck = rwfs("fsck", str(project))
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_run_json_summary(project: Path, tmp_path: Path) -> None:
    res = run_script(project, tmp_path, "--json")
    assert res.returncode == 7, res.stderr
    summary = json.loads(res.stderr.strip().splitlines()[-1])
    assert summary["exit_status"] == 7
    assert summary["changed"] == ["src/app.py"]
    assert summary["created"] == ["new.txt"]
    assert summary["deleted"] == ["old.txt"]
    assert [r["path"] for r in summary["refusals"]] == ["src/app.py"]
    assert summary["refusals"][0]["draft"].startswith(".rw/rejected/")
    assert summary["mounted_by_run"] is True
    assert summary["undo"].startswith(f"rwfs undo {summary['session']}")


def test_run_in_mounted_workspace_leaves_it_mounted(project: Path) -> None:
    m = Mount(project).start()
    try:
        res = rwfs("run", "--", "sh", "-c", "printf 'x = 3\\n' > app.py", cwd=project / "src")
        assert res.returncode == 0, res.stderr
        assert rwfs_mounted(str(project))  # it did not mount it, so it did not unmount it
        assert "changed 1 (src/app.py)" in res.stderr
        # Writes from outside the session are not the session's: undo leaves them.
        (project / "notes.txt").write_text("outside\n")
        name = res.stderr.split("session ", 1)[1].split()[0]
        undo = rwfs("undo", name, cwd=project / "src")
        assert undo.returncode == 0, undo.stderr
        assert (project / "src" / "app.py").read_text() == "x = 1\n"
        assert (project / "notes.txt").read_text() == "outside\n"
    finally:
        m.stop()
    check_clean(m)


def test_run_batch_holds_the_session(project: Path) -> None:
    m = Mount(project).start()
    try:
        res = rwfs(
            "run",
            "--batch",
            "agent1",
            "--",
            "sh",
            "-c",
            "printf 'x = 4\\n' > src/app.py; printf 'b\\n' > notes.txt; cat src/app.py",
            cwd=project,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == "x = 4\n"  # the mount shows the held bytes to the session
        assert "batch agent1 is open, holding 2 files" in res.stderr
        assert "rwfs batch commit agent1" in res.stderr
        st = json.loads((project / ".rw" / "batches" / "agent1" / "status").read_text())
        assert st["state"] == "open"
        # Another process's writes are not captured by the session's batch.
        (project / "old.txt").write_text("mine\n")
        st = json.loads((project / ".rw" / "batches" / "agent1" / "status").read_text())
        assert sorted(p["path"] for p in st["paths"]) == ["notes.txt", "src/app.py"]
        status = json.loads((project / ".rw" / "status").read_text())
        assert [b["name"] for b in status["open_batch"]] == ["agent1"]
        assert status["open_batch"][0]["files"] == 2
        done = rwfs("batch", "commit", "agent1", cwd=project)
        assert done.returncode == 0, done.stderr
    finally:
        m.stop()
    check_clean(m)
    assert (project / "src" / "app.py").read_text() == "x = 4\n"


def test_run_review_without_terminal_leaves_batch_open(project: Path) -> None:
    res = rwfs("run", "--review", "--", "sh", "-c", "printf 'x = 5\\n' > src/app.py", cwd=project)
    try:
        assert res.returncode == 0, res.stderr
        assert " src/app.py | +1 -1" in res.stderr  # the diff stat
        assert "is open, holding 1 files" in res.stderr
        # An open batch keeps the mount: the summary says so, and how to finish.
        assert rwfs_mounted(str(project))
        assert "stays mounted" in res.stderr
        name = res.stderr.split("batch ", 1)[1].split()[0]
        abort = rwfs("batch", "abort", name, cwd=project)
        assert abort.returncode == 0, abort.stderr
        assert (project / "src" / "app.py").read_text() == "x = 1\n"
    finally:
        out = rwfs("umount", str(project))
        assert out.returncode == 0, out.stderr


def test_run_passes_sigint_to_command(project: Path) -> None:
    prog = (
        "import signal, sys, time\n"
        "def bye(*a):\n"
        "    open('got-sigint', 'w').write('yes')\n"
        "    sys.exit(42)\n"
        "signal.signal(signal.SIGINT, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(50)\n"
    )
    proc = subprocess.Popen(
        [*RWFS, "run", "--", sys.executable, "-c", prog],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 42, err
    assert (project / "got-sigint").read_text() == "yes"
    assert "created 1 (got-sigint)" in err


def test_run_usage_errors_exit_2(project: Path) -> None:
    res = rwfs("run", cwd=project)
    assert res.returncode == 2
    assert "usage: rwfs run" in res.stderr
    res = rwfs("run", "--batch", "b", "--review", "--", "true", cwd=project)
    assert res.returncode == 2
    res = rwfs("run", "--batch", "--", "true", cwd=project)  # `--` is no batch's name
    assert res.returncode == 2 and "--batch needs a value" in res.stderr, res.stderr
    assert not (project / ".rw").exists()  # nothing was made


def test_run_that_cannot_start_leaves_no_mount(project: Path) -> None:
    m = Mount(project).start()
    try:
        (project / ".rw" / "batches" / "taken").mkdir()
    finally:
        m.stop()
    check_clean(m)
    res = rwfs("run", "--batch", "taken", "--", "true", cwd=project)
    assert res.returncode == 1 and "taken" in res.stderr, res.stderr
    assert not rwfs_mounted(str(project))  # it mounted, failed, and unmounted
    bad = rwfs("run", "--batch", "..", "--", "true", cwd=project)
    assert bad.returncode == 2 and "is not a batch name" in bad.stderr


def test_run_command_not_found_is_127(project: Path) -> None:
    res = rwfs("run", "--", "no-such-command-rwfs", cwd=project)
    assert res.returncode == 127
    assert "command not found" in res.stderr
    assert not rwfs_mounted(str(project))


def test_run_session_keeps_daemonized_descendants(project: Path) -> None:
    # A grandchild in a new Linux session whose parent has exited (a daemon's double
    # fork) still belongs to the run session: rwfs run is its subreaper.
    script = (
        "(setsid sh -c 'printf d > daemon.txt; printf 1 > done' &); "
        "while [ ! -e done ]; do sleep 0.05; done"
    )
    res = rwfs("run", "--json", "--", "sh", "-c", script, cwd=project)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stderr.strip().splitlines()[-1])
    assert summary["created"] == ["daemon.txt", "done"]
    undo = rwfs("undo", summary["session"], "-C", str(project))
    assert undo.returncode == 0, undo.stderr
    assert not (project / "daemon.txt").exists() and not (project / "done").exists()


# ---- the command line's manners (issue 17, item 3) ----


def test_verbs_find_the_workspace_from_a_subdirectory(project: Path) -> None:
    m = Mount(project).start()
    try:
        sub = project / "src"
        (sub / "app.py").write_text("x = 9\n")
        st = rwfs("status", "--json", cwd=sub)
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["mounted"] is True
        # PATH is relative to the cwd; the journal names it from the workspace's top.
        log = rwfs("log", "--json", "app.py", cwd=sub)
        assert log.returncode == 0, log.stderr
        assert [json.loads(ln)["path"] for ln in log.stdout.splitlines()] == ["src/app.py"]
        assert rwfs("fsck", cwd=sub).returncode == 0
        assert rwfs("fsck", "-C", str(sub)).returncode == 0  # -C on every verb
        none = rwfs("log", "nosuchfile", cwd=sub)
        assert none.returncode == 0 and "no journal events for src/nosuchfile" in none.stderr
    finally:
        m.stop()
    check_clean(m)
    st = rwfs("status", "--json", cwd=project / "src")  # unmounted, still found
    assert st.returncode == 0 and json.loads(st.stdout)["mounted"] is False


def test_status_text_uses_json_values(project: Path) -> None:
    m = Mount(project).start()
    try:
        st = rwfs("status", cwd=project)
        assert st.returncode == 0, st.stderr
        assert "mounted: true" in st.stdout.splitlines()
        assert "journal_ok: true" in st.stdout.splitlines()
        assert "True" not in st.stdout
        none = rwfs("conflicts", cwd=project)
        assert none.returncode == 0 and none.stdout == "rwfs: no open conflicts\n"
    finally:
        m.stop()
    check_clean(m)


def test_usage_errors_exit_2_without_traceback(project: Path) -> None:
    res = rwfs("log", "--last", "-1", cwd=project)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "usage: rwfs log" in res.stderr
    res = rwfs("batch", "begin", cwd=project)
    assert res.returncode == 2 and "usage: rwfs batch" in res.stderr
    res = rwfs("batch", "begin", "..", cwd=project)
    assert res.returncode == 2 and "is not a batch name" in res.stderr
    res = rwfs("gc", "extra", "args", cwd=project)
    assert res.returncode == 2 and "usage: rwfs gc" in res.stderr, res.stderr
    assert "unrecognized arguments: args" in res.stderr  # ("extra" is its DIR)
    for bad in ("bad/name", "../x", "a b"):  # (not "No such file or directory")
        res = rwfs("snapshot", bad, "-C", str(project))
        assert res.returncode == 2 and "is not a snapshot name" in res.stderr, res.stderr
    assert not (project / ".rw").exists()


def test_every_verb_help_describes_it_and_its_exit_codes() -> None:
    for verb in ("mount", "umount", "status", "log", "fsck", "batch", "conflicts", "undo",
                 "snapshot", "restore", "gc", "doctor", "agents-md", "run"):  # fmt: skip
        res = rwfs(verb, "--help")
        assert res.returncode == 0, (verb, res.stderr)
        usage, _, rest = res.stdout.partition("\n\n")
        assert usage.startswith(f"usage: rwfs {verb}"), verb
        assert rest.splitlines()[0].strip(), f"{verb}: no one-line description"
        assert "exit status" in res.stdout, verb
        if verb not in ("doctor", "agents-md", "run", "mount", "umount"):
            assert "-C DIR" in res.stdout, verb


def test_closed_pipe_ends_quietly(project: Path) -> None:
    m = Mount(project).start()
    try:
        (project / "notes.txt").write_text("one\n")
        r, w = os.pipe()
        os.close(r)  # the reader is gone before rwfs writes a line
        proc = subprocess.run(
            [*RWFS, "log", "-C", str(project)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=ENV,
        )
        os.close(w)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
    finally:
        m.stop()
    check_clean(m)


def test_failed_mount_names_the_option_and_leaves_nothing(project: Path) -> None:
    res = rwfs("mount", "-o", "bogusopt", str(project))
    assert res.returncode == 1
    assert "bogusopt" in res.stderr and "does not know" in res.stderr
    assert not (project / ".rw").exists()
    assert not rwfs_mounted(str(project))


def _nice_of_threads(pid: int) -> set[int]:
    """The nice value of each of a process's threads (field 19 of /proc/PID/task/TID/stat)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return out


@pytest.mark.parametrize("given", [None, "3"])
def test_the_daemon_runs_at_the_nice_value_asked_for(project: Path, given: str | None) -> None:
    # Its clients wait on it: by default it runs at -10 (as root here), with every thread.
    m = Mount(project, options=() if given is None else (f"nice={given}",)).start()
    try:
        (project / "a.txt").write_text("one\n")  # (worker threads hash and sync)
        fd = os.open(project / "a.txt", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        status = json.loads((project / ".rw" / "status").read_text())
        want = -10 if given is None else int(given)
        assert status["nice"] == want
        assert m.proc is not None and _nice_of_threads(status["pid"]) == {want}
    finally:
        m.stop()
    check_clean(m)


@pytest.mark.parametrize("bad", ["abc", "-21", "20", "1.5", ""])
def test_a_nice_value_out_of_range_is_refused_before_anything_is_made(
    project: Path, bad: str
) -> None:
    res = rwfs("mount", "-o", f"nice={bad}", str(project))
    assert res.returncode == 1
    assert f"-o nice={bad} is not a nice value" in res.stderr, res.stderr
    assert "nothing was mounted" in res.stderr
    assert not (project / ".rw").exists()
    assert not rwfs_mounted(str(project))


def test_dead_daemon_is_named_with_the_command_that_clears_it(project: Path) -> None:
    m = Mount(project).start()
    assert m.proc is not None
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(30)
    m.proc = None
    try:
        st = rwfs("status", str(project))
        assert st.returncode == 1
        assert "daemon is gone" in st.stderr and f"rwfs umount {project}" in st.stderr
        for verb in (("run", "--", "true"), ("undo", "run-1"), ("log",)):
            res = rwfs(verb[0], "-C", str(project), *verb[1:])  # (no cwd can be in it)
            assert res.returncode == 1, (verb, res.stderr)
            assert f"'rwfs umount {project}'" in res.stderr, (verb, res.stderr)
        again = rwfs("mount", str(project))
        assert again.returncode == 1
        assert "daemon is gone" in again.stderr and f"rwfs umount {project}" in again.stderr
        cleared = rwfs("umount", str(project))
        assert cleared.returncode == 0, cleared.stderr
        assert not rwfs_mounted(str(project))
    finally:
        m.reap()


def test_busy_umount_names_the_holders_and_offers_lazy(project: Path) -> None:
    assert rwfs("mount", str(project)).returncode == 0
    holder = subprocess.Popen(["sleep", "60"], cwd=project / "src")
    try:
        res = rwfs("umount", str(project))
        assert res.returncode == 1
        assert f"{holder.pid} (sleep)" in res.stderr
        assert "--lazy" in res.stderr
        assert rwfs_mounted(str(project))
    finally:
        holder.kill()
        holder.wait()
        done = rwfs("umount", str(project))
    assert done.returncode == 0, done.stderr


def test_mount_from_inside_warns_and_status_says_raw_tree(project: Path) -> None:
    # A shell that was inside the workspace before the mount keeps seeing the raw tree.
    script = f"{' '.join(RWFS)} mount . && {' '.join(RWFS)} status --json"
    res = subprocess.run(
        ["sh", "-c", script], cwd=project, capture_output=True, text=True, timeout=60, env=ENV
    )
    try:
        assert res.returncode == 0, res.stderr
        assert "raw tree" in res.stderr and "cd ." in res.stderr
        status = json.loads(res.stdout.split("\n", 1)[1])
        assert status["raw_tree_cwd"] is True
        fresh = rwfs("status", "--json", cwd=project)  # entered after the mount
        assert json.loads(fresh.stdout)["raw_tree_cwd"] is False
    finally:
        out = rwfs("umount", str(project))
    assert out.returncode == 0, out.stderr


def test_log_follow_streams_new_events_and_resumes_from_an_lsn(project: Path) -> None:
    m = Mount(project).start()
    try:
        (project / "notes.txt").write_text("before\n")
        last = json.loads(rwfs("log", "--json", "--last", "1", cwd=project).stdout)["lsn"]
        proc = subprocess.Popen(
            [*RWFS, "log", "--follow", "--json", "--since", str(last)],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        assert proc.stdout is not None
        got = []
        for n in range(3):
            (project / f"f{n}.txt").write_text(f"{n}\n")
            os.system(f"echo sync > {project}/.rw/ctl")  # committed now, not in 500 ms
            while len(got) <= n:
                ev = json.loads(proc.stdout.readline())
                if ev["op"] == "write":
                    got.append(ev)
        assert [e["path"] for e in got] == ["f0.txt", "f1.txt", "f2.txt"]
        assert all(e["lsn"] > last for e in got)
        proc.stdout.close()  # the reader goes away (| head -3): the next event ends it
        (project / "f3.txt").write_text("3\n")
        os.system(f"echo sync > {project}/.rw/ctl")
        assert proc.wait(60) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        m.stop()
    check_clean(m)


# ---- listing and journal hygiene (item 6) ----


def test_listings_show_dot_and_dotdot(project: Path) -> None:
    m = Mount(project).start()
    try:
        for d in (project, project / "src", project / ".rw", project / ".rw" / "batches"):
            res = subprocess.run(["ls", "-a1", str(d)], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            assert res.stdout.splitlines()[:2] == [".", ".."], (d, res.stdout)
        res = subprocess.run(["ls", "-a1", str(project / "src")], capture_output=True, text=True)
        assert res.stdout.splitlines() == [".", "..", "app.py"]
        # Many entries: the listing is read in several replies, each name once.
        many = project / "many"
        many.mkdir()
        for n in range(300):
            (many / f"file-{n:03d}").write_text("x")
        names = subprocess.run(["ls", "-a1", str(many)], capture_output=True, text=True)
        assert names.stdout.splitlines() == [".", ".."] + [f"file-{n:03d}" for n in range(300)]
        ino = subprocess.run(["ls", "-ai1", str(project / "src")], capture_output=True, text=True)
        dot = int(ino.stdout.split()[0])
        assert dot == os.stat(project / "src").st_ino
    finally:
        m.stop()
    check_clean(m)


def test_journal_ts_never_goes_back_and_a_clean_mount_says_nothing(project: Path) -> None:
    first = rwfs("mount", str(project))
    assert first.returncode == 0, first.stderr
    try:
        for n in range(6):  # creates (their own time) and writes (the group commit's)
            (project / f"n{n}.txt").write_text(f"{n}\n")
        assert rwfs("log", "-C", str(project)).returncode == 0  # (syncs)
        events = [json.loads(x) for x in rwfs("log", "--json", cwd=project).stdout.splitlines()]
        assert len(events) >= 12
        stamps = [e["ts"] for e in events]
        assert stamps == sorted(stamps)
    finally:
        assert rwfs("umount", str(project)).returncode == 0
    again = rwfs("mount", str(project))  # a clean mount: nothing to recover, nothing said
    try:
        assert again.returncode == 0, again.stderr
        assert "recovery" not in again.stderr and again.stderr == ""
    finally:
        assert rwfs("umount", str(project)).returncode == 0


def _read_until(fd: int, needle: bytes, seen: bytearray) -> None:
    """Read a pty until ``needle`` shows (or it closes; the assertion then names why)."""
    import select

    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready, f"no {needle!r} on the terminal: {seen.decode(errors='replace')}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # (EIO: the other side closed)
            chunk = b""
        assert chunk, f"the terminal closed before {needle!r}: {seen.decode(errors='replace')}"
        seen += chunk


def test_run_review_on_a_terminal_asks_and_commits(project: Path) -> None:
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: rwfs run on a terminal of its own
        try:
            os.chdir(project)
            os.execve(
                sys.executable,
                [
                    sys.executable,
                    "-m",
                    "rwfs.cli",
                    "run",
                    "--review",
                    "--",
                    "sh",
                    "-c",
                    "printf 'x = 6\\n' > src/app.py; rm old.txt",
                ],  # fmt: skip
                ENV,
            )
        finally:
            os._exit(127)
    seen = bytearray()
    try:
        _read_until(fd, b"[c/a/l] ", seen)
        assert b"src/app.py | +1 -1" in seen
        os.write(fd, b"c\n")
        _read_until(fd, b"undo all of it", seen)
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # (then the fixture clears the mount it left)
        raise
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    assert b"is committed" in seen
    assert b"changed 1 (src/app.py); created 0; deleted 1 (old.txt)" in seen  # (committed)
    assert not rwfs_mounted(str(project))  # committed: nothing kept the mount
    assert (project / "src" / "app.py").read_text() == "x = 6\n"
    assert not (project / "old.txt").exists()
    name = seen.split(b"session ", 1)[1].split()[0].decode()
    undo = rwfs("undo", name, "-C", str(project))  # the session's deletion comes back
    assert undo.returncode == 0, undo.stderr
    assert (project / "old.txt").read_text() == "to be removed\n"
    assert (project / "src" / "app.py").read_text() == "x = 1\n"


def test_progress_only_on_a_terminal(project: Path) -> None:
    import pty

    m = Mount(project).start()
    try:
        many = project / "many"
        many.mkdir()
        for n in range(1000):  # fsck reports every 1000 paths
            (many / f"f{n}").write_text("x")
    finally:
        m.stop()
    check_clean(m)
    piped = rwfs("fsck", str(project))
    assert piped.returncode == 0 and "fsck: 1000/" not in piped.stderr, piped.stderr
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve(sys.executable, [sys.executable, "-m", "rwfs.cli", "fsck", str(project)], ENV)
        finally:
            os._exit(127)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"\r\x1b[Kfsck: 1000/" in seen  # one line, rewritten in place
