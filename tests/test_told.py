"""Whoever holds the descriptor at the commit point is told of a refusal on its stderr
(notice.py), through a real mount: a program a shell exec'd after it opened the file
(``cmd > f``), even one that never checks ``close()`` and exits 0, and a program started
without a shell whose stderr its starter reads; never a process of another user, never a
file or /dev/null."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, check_clean

from rwfs.fuse import notice

REAL = inspect.getsource(json.decoder)  # a real module of a few hundred lines
CUT = "".join(REAL.splitlines(keepends=True)[:40])  # its first 40 lines: a truncation
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON3 = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # one nobody may run


def told(name: str) -> str:
    return f"rwfs: Your write to {name} was refused because"


def lines_of_rwfs(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rwfs:")]


def write_helpers(top: Path) -> None:
    """Writers that print a broken module, and one that prints its first 40 lines."""
    (top / "gen.py").write_text("print('def (:')\n")
    (top / "gen.js").write_text("console.log('def (:')\n")
    (top / "cut.py").write_text(f"import sys\nsys.stdout.write({CUT!r})\n")


def test_every_cmd_redirect_is_told_by_the_shell_that_ran_it(mount: Mount) -> None:
    """The shell opens f, then execs the program: python3 and node never see close() fail
    (the kernel closes f as they exit, when their descriptors are gone), so the line goes
    to the stderr the shell gave them, which the shell still holds; cat, sort and jq close
    f themselves and are told directly. Each line gives its own refusal's reason."""
    write_helpers(mount.path)
    f = mount.path / "decoder.py"
    cases = [
        ("python3 gen.py > decoder.py", 0, "does not parse"),
        ("node gen.js > decoder.py", 0, "does not parse"),
        ("cat > decoder.py <<'EOF'\ndef (:\nEOF", 1, "does not parse"),
        ("printf 'def (:\\n' | sort > decoder.py", 2, "does not parse"),
        ("echo '\"def (:\"' | jq -r . > decoder.py", 2, "does not parse"),
        ("python3 cut.py > decoder.py", 0, "cut off after line 40"),
        ("cd . && sh -c 'python3 gen.py > decoder.py'", 0, "does not parse"),
        ("exec 3>decoder.py; python3 gen.py >&3; exec 3>&-", 0, "does not parse"),
    ]
    for cmd, code, reason in cases:
        f.write_text(REAL)
        res = subprocess.run(
            ["bash", "-c", cmd], cwd=mount.path, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == code and f.read_text() == REAL, (cmd, res)
        first = res.stderr.split("\n", 1)[0]
        assert first.startswith(told("decoder.py")) and reason in first, (cmd, res.stderr)
        assert first.endswith(f"Details: {mount.path}/.rw/why/decoder.py"), first
        assert len(lines_of_rwfs(res.stderr)) == 1, (cmd, res.stderr)
    # A writer whose stderr was sent away is told nowhere else (its shell's stays quiet).
    for away in ("2>/dev/null", "2>err.log"):
        f.write_text(REAL)
        res = subprocess.run(
            ["bash", "-c", f"python3 gen.py > decoder.py {away}"],
            cwd=mount.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (res.returncode, res.stderr, f.read_text()) == (0, "", REAL), res
    assert (mount.path / "err.log").read_text() == ""  # a file is never written into


@pytest.fixture
def shared() -> Iterator[Path]:
    """A workspace another user can reach (pytest's directories are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="rwfs-told-"))
    top.chmod(0o755)
    ws = top / "ws"
    ws.mkdir(mode=0o777)
    try:
        yield ws
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_program_started_without_a_shell_is_told_but_never_across_users(
    shared: Path,
) -> None:
    """No shell between: the program's starter opened f and reads the program's stderr
    through a pipe, so the line goes into that pipe, but only if the writer may signal the
    starter: another user's exiting writer is told nothing through root's pipe."""
    m = Mount(shared, options=("allow_other",)).start()
    try:
        write_helpers(m.path)
        f = m.path / "decoder.py"

        def run(prefix: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
            f.write_text(REAL)
            f.chmod(0o666)
            with open(f, "w") as out:
                res = subprocess.run(
                    [*prefix, *argv],
                    cwd=m.path,
                    stdout=out,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=60,
                )
            assert res.returncode == 0 and f.read_text() == REAL, res
            return res

        for argv in (["python3", "gen.py"], ["node", "gen.js"]):
            res = run([], argv)
            assert res.stderr.startswith(told("decoder.py")), (argv, res.stderr)
            assert len(lines_of_rwfs(res.stderr)) == 1, res.stderr
        # nobody's python3, exec'd straight from this root process: root's pipe is not
        # one nobody could reach, so nothing comes through it.
        assert run(NOBODY, [PYTHON3, "gen.py"]).stderr == ""
        # nobody's own shell holds its stderr: told there.
        res = run(NOBODY, ["sh", "-c", f"{PYTHON3} gen.py >decoder.py"])
        assert res.stderr.startswith(told("decoder.py")), res.stderr
    finally:
        m.stop()
    check_clean(m)


def test_notice_writes_only_to_the_process_it_names_and_may_signal(tmp_path: Path) -> None:
    """In-process: the line reaches a live writer's stderr pipe; not a process of a uid
    the writer's could not signal, not one whose start time says the pid was reused, and
    never a regular file."""
    r, w = os.pipe()
    log = open(tmp_path / "stderr.txt", "wb")
    piped = subprocess.Popen(["sleep", "30"], stderr=w)
    filed = subprocess.Popen(["sleep", "30"], stderr=log)
    os.close(w)
    log.close()
    try:
        me = os.getuid()
        assert notice.tell(notice.Writer(piped.pid, me), "rwfs: one\n")
        assert os.read(r, 100) == b"rwfs: one\n"
        assert notice.stderr_of(piped.pid).startswith("pipe:")
        start = notice.start_of(piped.pid)
        assert notice.tell(notice.Writer(piped.pid, me, start=start), "rwfs: two\n")
        assert os.read(r, 100) == b"rwfs: two\n"
        assert not notice.tell(notice.Writer(piped.pid, me, start=start + 1), "rwfs: no\n")
        if me == 0:  # a writer of another uid may not signal root's process
            assert not notice.tell(notice.Writer(piped.pid, 65534), "rwfs: no\n")
        assert not notice.tell(notice.Writer(filed.pid, me), "rwfs: no\n")
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 100)
        assert (tmp_path / "stderr.txt").read_bytes() == b""
    finally:
        for p in (piped, filed):
            p.kill()
            p.wait()
        os.close(r)
