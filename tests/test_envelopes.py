"""What a writer is told, through a real mount (SPEC §4.3, §7.2): a program that empties a
file and closes it learns of the refusal at close(); every refusal is in ``why/`` and
``last-error``; a later successful write of the path supersedes its ``why/`` entry."""

from __future__ import annotations

import errno
import inspect
import json
import os
import pty
import socket
import subprocess
import sys
import tty

from conftest import Mount

REAL = inspect.getsource(json.decoder)  # a real module of a few hundred lines


def why(m: Mount, name: str) -> dict:
    return json.loads((m.path / ".rw" / "why" / name).read_text())


def last_error(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "last-error").read_text())


def refusals(m: Mount, name: str) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["op"] == "refuse" and e["path"] == name]


def test_emptying_a_module_is_refused_at_close(mount: Mount) -> None:
    assert last_error(mount)["ok"] is True  # JSON before the first error too
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    res = subprocess.run(["cp", "/dev/null", str(f)], capture_output=True, text=True)
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    assert f.read_text() == REAL
    assert (why(mount, "decoder.py")["error"], last_error(mount)["path"]) == (
        "blocked",
        "decoder.py",
    )
    code = (
        "import errno, sys\n"
        "try:\n"
        "    open(sys.argv[1], 'w').close()\n"
        "except OSError as e:\n"
        "    sys.exit(e.errno)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True)
    assert res.returncode == errno.EBADMSG, res
    assert f.read_text() == REAL
    assert len(refusals(mount, "decoder.py")) == 2


def test_a_shell_redirect_is_judged_on_what_it_writes_not_on_the_empty_moment(
    mount: Mount,
) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    other = "\n".join(f"value_{n} = {n}" for n in range(300)) + "\n"
    res = subprocess.run(
        ["bash", "-c", 'printf "%s" "$BODY" > decoder.py'],
        cwd=mount.path,
        env={"BODY": other, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res
    assert f.read_text() == other
    assert refusals(mount, "decoder.py") == []


def test_a_refusal_names_its_lsn_and_writer_and_a_later_write_supersedes_it(
    mount: Mount,
) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    broken = REAL.replace("def ", "def (", 1)
    code = (
        "import sys\n"
        "try:\n"
        "    with open(sys.argv[1], 'w') as f:\n"
        "        f.write(sys.argv[2])\n"
        "except OSError as e:\n"
        "    sys.exit(e.errno)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(f), broken], capture_output=True)
    assert res.returncode == errno.EBADMSG, res
    (event,) = refusals(mount, "decoder.py")
    env = last_error(mount)
    assert (env["lsn"], env["pid"], env["path"]) == (event["lsn"], event["pid"], "decoder.py")
    assert env["comm"] == event["comm"] and env["comm"]
    shown = why(mount, "decoder.py")
    assert shown == env and "recent" not in shown  # (no earlier refusal of it)
    fixed = REAL + "\n# one more line\n"
    f.write_text(fixed)
    (mount.path / ".rw" / "ctl").write_text("sync\n")
    now = why(mount, "decoder.py")
    assert (now["ok"], now["path"]) == (True, "decoder.py")
    writes = [
        e
        for e in map(json.loads, (mount.path / ".rw" / "journal").read_text().splitlines())
        if e["op"] == "write" and e["path"] == "decoder.py"
    ]
    assert (now["intended"], now["lsn"]) == (writes[-1]["intended"], writes[-1]["lsn"])


def test_views_and_the_journal_show_every_acknowledged_write(mount: Mount) -> None:
    """Read-your-writes (SPEC §5: control files are generated fresh): right after close(),
    with the group committer's interval not yet over."""
    rw = mount.path / ".rw"
    (rw / "policy.toml").write_text("commit_interval_ms = 60000\n")
    f = mount.path / "m.py"
    f.write_text("def f(:\n")  # a new file: never refused
    assert json.loads((rw / "validate" / "m.py").read_text())["valid"] is False
    f.write_text("def f():\n    return 1\n")
    assert json.loads((rw / "validate" / "m.py").read_text())["valid"] is True
    last = json.loads((rw / "journal").read_text().splitlines()[-1])
    assert (last["op"], last["path"]) == ("write", "m.py")
    status = json.loads((rw / "status").read_text())
    assert status["counts"]["commits"] >= 2
    # Inside a batch the views judge the draft the mount shows, not the tree's file.
    (rw / "batches" / "b").mkdir()
    try:
        (mount.path / "g.py").write_text("def g(:\n")  # a new file of the batch: its draft
        shown = json.loads((rw / "validate" / "g.py").read_text())
        assert (shown.get("valid"), shown.get("error")) == (False, None), shown
    finally:
        (rw / "batches" / "b" / "ctl").write_text("abort\n")


def test_a_refused_rename_of_a_temporary_is_explained_under_both_names(mount: Mount) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    res = subprocess.run(
        ["sed", "-i", "s/^def /def (/", "decoder.py"], cwd=mount.path, capture_output=True
    )
    assert res.returncode != 0 and b"Bad message" in res.stderr, res
    temp = res.stderr.decode().split("cannot rename ")[1].split(":")[0].removeprefix("./")
    assert temp.startswith("sed") and f.read_text() == REAL
    assert why(mount, temp) == why(mount, "decoder.py")
    assert (why(mount, temp)["path"], why(mount, temp)["source"]) == ("decoder.py", temp)


# ---- the line on the writer's stderr (notice.py) ----

BREAK = (
    "import sys\n"
    "try:\n"
    "    with open(sys.argv[1], 'w') as f:\n"
    "        f.write(open(sys.argv[1]).read().replace('def ', 'def (', 1))\n"
    "except OSError as e:\n"
    "    sys.exit(e.errno)\n"
)


def told(m: Mount, name: str) -> str:
    return f"rwfs: Your write to {name} was refused because"


def test_a_refused_writer_that_never_heard_of_rwfs_is_told_why_on_its_stderr(
    mount: Mount,
) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    res = subprocess.run(
        ["sed", "-i", "s/^def /def (/", "decoder.py"], cwd=mount.path, capture_output=True
    )
    err = res.stderr.decode()
    assert res.returncode != 0 and f.read_text() == REAL, res
    # One line from rwfs, naming the file sed does not name, before sed's own message.
    first, rest = err.split("\n", 1)
    assert first.startswith(told(mount, "decoder.py")), err
    assert first.endswith(f"Details: {mount.path}/.rw/why/decoder.py"), err
    assert rest.startswith("sed: cannot rename") and "rwfs:" not in rest, err
    # Node-style captured output: stderr is a socket, not a pipe.
    a, b = socket.socketpair()
    with a, b:
        res = subprocess.run([sys.executable, "-c", BREAK, str(f)], stderr=b)
        a.settimeout(5)
        line = a.recv(4096).decode()
    assert res.returncode == errno.EBADMSG and f.read_text() == REAL
    assert line.startswith(told(mount, "decoder.py")) and line.endswith("\n"), line


def test_no_line_goes_to_a_file_a_full_screen_program_or_anywhere_when_off(
    mount: Mount, tmp_path
) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    log = tmp_path / "stderr.txt"
    with open(log, "wb") as out:  # a log file: not rwfs's to write into
        res = subprocess.run([sys.executable, "-c", BREAK, str(f)], stderr=out)
    assert res.returncode == errno.EBADMSG and log.read_bytes() == b""

    def on_terminal(raw: bool) -> bytes:
        master, slave = pty.openpty()
        try:
            if raw:  # as a full-screen program leaves it
                tty.setraw(slave)
            res = subprocess.run([sys.executable, "-c", BREAK, str(f)], stderr=slave)
            assert res.returncode == errno.EBADMSG
            os.set_blocking(master, False)
            try:
                return os.read(master, 4096)
            except BlockingIOError:
                return b""
        finally:
            os.close(slave)
            os.close(master)

    assert on_terminal(raw=False).decode().startswith(told(mount, "decoder.py"))
    assert on_terminal(raw=True) == b""  # a full-screen program's display is left alone
    policy = mount.path / ".rw" / "policy.toml"
    text = policy.read_text()
    policy.write_text(text.replace('tell_writer = "auto"', 'tell_writer = "always"'))
    assert on_terminal(raw=True).decode().startswith(told(mount, "decoder.py"))
    policy.write_text(text.replace('tell_writer = "auto"', 'tell_writer = "off"'))
    res = subprocess.run([sys.executable, "-c", BREAK, str(f)], capture_output=True)
    assert (res.returncode, res.stderr) == (errno.EBADMSG, b"")
    assert on_terminal(raw=False) == b""
    assert why(mount, "decoder.py")["error"] == "blocked"  # .rw/ tells, whatever the setting
    try:
        policy.write_text(text.replace('tell_writer = "auto"', 'tell_writer = "loud"'))
    except OSError as exc:
        assert exc.errno == errno.EINVAL
    else:
        raise AssertionError("an unknown tell_writer was accepted")
    assert 'tell_writer = "off"' in policy.read_text()
    assert "tell_writer" in last_error(mount)["message"]


# ---- why/: current right after a write, with the path's recent refusals ----


def test_why_lists_recent_refusals_and_a_write_supersedes_it_before_its_record(
    mount: Mount,
) -> None:
    """Read-your-writes: with the group committer's interval far off, why/ says a write
    succeeded as soon as its close() returned, and gains its LSN once it is recorded. The
    path's earlier refusals stay listed under "recent", newest first, each its own."""
    rw = mount.path / ".rw"
    (rw / "policy.toml").write_text("commit_interval_ms = 60000\n")
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    breaks = [
        REAL.replace("def ", "def (", 1),  # syntax
        "".join(REAL.splitlines(keepends=True)[:40]),  # truncation
        REAL.replace("class ", "class (", 1),  # syntax again, elsewhere
    ]
    for text in breaks:
        res = subprocess.run(
            ["bash", "-c", 'printf "%s" "$T" > decoder.py'],
            cwd=mount.path,
            env={"T": text, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        assert "rwfs: Your write to decoder.py was refused" in res.stderr, res
    assert f.read_text() == REAL
    events = refusals(mount, "decoder.py")
    assert len(events) == 3
    shown = why(mount, "decoder.py")
    assert (shown["ok"], shown["lsn"]) == (False, events[2]["lsn"])
    assert [e["lsn"] for e in shown["recent"]] == [events[1]["lsn"], events[0]["lsn"]]
    assert "cut off after line 40" in shown["recent"][0]["message"]
    assert "recent" not in shown["recent"][0]  # each one its own envelope
    f.write_text(REAL + "\n# fixed\n")  # queued: the committer's interval is a minute
    now = why(mount, "decoder.py")
    assert (now["ok"], now["lsn"], now["path"]) == (True, None, "decoder.py"), now
    assert [e["lsn"] for e in now["recent"]] == [e["lsn"] for e in reversed(events)]
    (rw / "ctl").write_text("sync\n")
    writes = [
        e
        for e in map(json.loads, (rw / "journal").read_text().splitlines())
        if e["op"] == "write" and e["path"] == "decoder.py"
    ]
    now = why(mount, "decoder.py")
    assert (now["ok"], now["lsn"], now["intended"]) == (
        True,
        writes[-1]["lsn"],
        writes[-1]["intended"],
    )


def test_rwfs_putting_back_a_removed_file_is_its_own_write_and_keeps_the_refusal(
    mount: Mount,
) -> None:
    """rm f; cp new f: the save by re-creation is refused and rwfs puts the old bytes
    back. That write is rwfs's (the daemon's pid, comm rwfs, the refusal's LSN), not
    cp's, and why/ still tells of the refusal once it is recorded."""
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    (mount.path / "new.txt").write_text("def (:\n")
    res = subprocess.run(
        ["bash", "-c", "rm decoder.py && cp new.txt decoder.py"],
        cwd=mount.path,
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    assert res.stderr.startswith("rwfs: Your write to decoder.py was refused"), res
    assert f.read_text() == REAL
    (refused,) = refusals(mount, "decoder.py")  # (synced)
    events = [json.loads(e) for e in (mount.path / ".rw" / "journal").read_text().splitlines()]
    (put,) = [e for e in events if e["op"] == "write" and e["path"] == "decoder.py"][-1:]
    daemon = json.loads((mount.path / ".rw" / "status").read_text())["pid"]
    assert (put["pid"], put["comm"], put["put_back"]) == (daemon, "rwfs", True), put
    assert put["refused_lsn"] == refused["lsn"] < put["lsn"]
    shown = why(mount, "decoder.py")
    assert (shown["ok"], shown["lsn"], shown["error"]) == (False, refused["lsn"], "blocked")
