"""Bad input never splits the view from the tree (SPEC §9, "Bad input"; issue 26).

Each case writes something hostile through a real mount (nesting deeper than any parser
goes, out-of-range policy values, option-like names, restores of paths that name nothing,
a write over the size limit) and checks that the writer gets a clear answer (success, or
an errno with an envelope in ``.rw/last-error``), and that what the mount shows is what
the tree holds once unmounted.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.checks import gates, parsers
from rwfs.policy import DEFAULT_TEXT, Policy

DEEP = 100_000

# name: (a valid old version, the deep new one, what the syntax gate can say of it)
NESTED = {
    "deep.json": (b"[1]\n", b"[" * DEEP + b"]" * DEEP + b"\n", "cannot_judge"),
    "deep.yaml": (b"a: 1\n", b"a: " + b"[" * DEEP + b"]" * DEEP + b"\n", "cannot_judge"),
    "deep.toml": (b"a = 1\n", b"a = " + b"[" * DEEP + b"]" * DEEP + b"\n", "cannot_judge"),
    # CPython itself refuses more than 200 nested brackets: a real syntax error.
    "parens.py": (b"x = 1\n", b"x = " + b"(" * DEEP + b"1" + b")" * DEEP + b"\n", "syntax"),
    "lists.py": (b"x = 1\n", b"x = " + b"[" * DEEP + b"]" * DEEP + b"\n", "syntax"),
    # No bracket at all: CPython's parser runs out of its own stack.
    "unary.py": (b"x = 1\n", b"x = " + b"-" * DEEP + b"1\n", "cannot_judge"),
}


def write_bytes(path: Path, data: bytes) -> OSError | None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        return exc
    return None


def last_error(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "last-error").read_text())


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def alive(m: Mount) -> None:
    assert m.proc is not None and m.proc.poll() is None, m.log_text()
    assert json.loads((m.path / ".rw" / "status").read_text())["pid"] == m.proc.pid


# ---- B.1: a gate that cannot judge ----


def test_parsers_say_they_cannot_judge_deep_nesting() -> None:
    for name, (old, new, said) in NESTED.items():
        if said == "cannot_judge":
            with pytest.raises(parsers.CannotJudge, match="nested deeper|out of memory"):
                parsers.parse_errors(name.encode(), new)
        else:
            lang, errors = parsers.parse_errors(name.encode(), new)
            assert errors and errors[0]["line"] == 1, name
        assert parsers.parse_errors(name.encode(), old)[1] == []
    # tree-sitter looks for its first error by a loop: any depth.
    deep_js = b"x = " + b"[" * DEEP + b"1 2" + b"]" * DEEP + b";\n"
    assert parsers.parse_errors(b"a.js", deep_js)[1][0]["line"] == 1


def test_check_turns_a_gate_that_cannot_judge_into_a_finding() -> None:
    old, new, _ = NESTED["deep.json"]
    (found,) = gates.check(b"deep.json", old, new, Policy().gate)
    assert (found.gate, found.action) == ("cannot_judge", "warn")
    assert found.details == {
        "by": "syntax",
        "reason": "it is nested deeper than the json parser goes",
    }
    strict = Policy.parse(
        DEFAULT_TEXT.replace(
            '[gates.cannot_judge]\naction = "warn"', '[gates.cannot_judge]\naction = "reject"'
        )
    )
    assert [f.action for f in gates.check(b"deep.json", old, new, strict.gate)] == ["reject"]
    off = Policy.parse('[gates.cannot_judge]\naction = "off"\n')
    assert gates.check(b"deep.json", old, new, off.gate) == []
    per_path = Policy.parse('[[gates.override]]\npaths = ["gen/**"]\ncannot_judge = "reject"\n')
    assert [f.action for f in gates.check(b"gen/deep.json", old, new, per_path.gate)] == ["reject"]
    assert [f.action for f in gates.check(b"deep.json", old, new, per_path.gate)] == ["warn"]

    def broken(*args: object) -> None:
        raise KeyError("a secret value")

    saved = gates.truncation
    gates.truncation = broken  # type: ignore[assignment]
    try:
        (found,) = gates.check(b"a.txt", b"a\n" * 30, b"b\n", Policy().gate)
    finally:
        gates.truncation = saved  # type: ignore[assignment]
    assert found.gate == "cannot_judge" and "KeyError" in found.message
    assert "secret value" not in found.message  # an exception's text is never quoted


@pytest.mark.parametrize("mode", ["warn", "reject"])
def test_deep_nesting_through_a_mount(tmp_path: Path, mode: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = DEFAULT_TEXT.replace(
        '[gates.cannot_judge]\naction = "warn"', f'[gates.cannot_judge]\naction = "{mode}"'
    )
    assert policy != DEFAULT_TEXT or mode == "warn"
    prepare_state(ws, policy)
    m = Mount(ws).start()
    shown: dict[str, bytes] = {}
    try:
        for name, (old, new, said) in NESTED.items():
            f = m.path / name
            assert write_bytes(f, old) is None
            err = write_bytes(f, new)
            refused = said == "syntax" or mode == "reject"
            if refused:
                assert err is not None and err.errno == errno.EBADMSG, (name, err)
                env = last_error(m)
                assert env["path"] == name and env["reason_hint"] == said
                assert env["draft"] and (m.path / env["draft"]).read_bytes() == new
                assert f.read_bytes() == old, name
            else:
                assert err is None, (name, err)
                assert f.read_bytes() == new, name
                ev = [e for e in journal(m) if e["op"] == "write" and e["path"] == name][-1]
                (warning,) = ev["warnings"]
                assert (warning["gate"], warning["by"]) == ("cannot_judge", "syntax")
                assert "nested deeper" in warning["reason"] or "memory" in warning["reason"]
            view = json.loads((m.path / ".rw" / "validate" / name).read_text())
            assert view["valid"] is (True if refused else None), (name, view)
            shown[name] = f.read_bytes()  # compared with the tree's once unmounted
        alive(m)
    finally:
        m.stop()
    for name, data in shown.items():
        assert (ws / name).read_bytes() == data, name  # the tree holds what the mount showed
    check_clean(m)
    m = Mount(ws).start()  # and a remount shows it too
    try:
        for name, data in shown.items():
            assert (m.path / name).read_bytes() == data, name
    finally:
        m.stop()


# ---- B.3: policy values are range-checked ----

OUT_OF_RANGE = [
    ("commit_interval_ms = 0", "commit_interval_ms", 0),
    ("commit_interval_ms = 60001", "commit_interval_ms", 60001),
    ("max_journaled_bytes = 0", "max_journaled_bytes", 0),
    ("retry_budget = -1", "retry_budget", -1),
    ("retain_days = -1", "retain_days", -1),
    ("retain_bytes = -5", "retain_bytes", -5),
    ("[gates.truncation]\nmin_lines = -1", "gates.truncation.min_lines", -1),
    ("[gates.truncation]\nmin_lines = 2.5", "gates.truncation.min_lines", 2.5),
    ("[gates.truncation]\nmin_ratio = 7.5", "gates.truncation.min_ratio", 7.5),
    ("[gates.truncation]\nmin_ratio = nan", "gates.truncation.min_ratio", "nan"),
    ("[gates.truncation]\nmin_ratio = true", "gates.truncation.min_ratio", True),
    ("[gates.elision]\nmin_lines = -3", "gates.elision.min_lines", -3),
    ("[gates.elision]\nmass_ratio = 1.01", "gates.elision.mass_ratio", 1.01),
    ("[gates.elision]\ncut_ratio = -0.1", "gates.elision.cut_ratio", -0.1),
    ("retry_budget = 1.5", "retry_budget", 1.5),
]


@pytest.mark.parametrize("text,key,value", OUT_OF_RANGE)
def test_policy_numbers_out_of_range_are_refused(text: str, key: str, value: object) -> None:
    from rwfs.policy import RANGES, PolicyError

    assert key in RANGES
    with pytest.raises(PolicyError) as caught:
        Policy.parse(text)
    assert caught.value.details["key"] == key and caught.value.details["value"] == value
    assert key in str(caught.value) and caught.value.details["allowed"] in str(caught.value)
    # The edges of each range are taken.
    whole, least, most = RANGES[key]
    edge = text.rsplit("=", 1)[0] + f"= {least if most is None else most}"
    Policy.parse(edge)


def test_every_numeric_policy_key_has_a_range() -> None:
    from rwfs.policy import _KEYS, GATE_DEFAULTS, RANGES

    numeric = {k for k, t in _KEYS.items() if t in (int, (int, float))}
    numeric |= {
        f"gates.{g}.{k}"
        for g, d in GATE_DEFAULTS.items()
        for k, v in d.items()
        if isinstance(v, int | float)
    }
    assert numeric == set(RANGES)


def test_an_out_of_range_policy_through_the_mount_is_refused_whole(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    before = pol.read_text()
    bad = before.replace("min_ratio = 0.3", "min_ratio = 7.5")
    assert bad != before
    with pytest.raises(OSError) as caught:
        pol.write_text(bad)
    assert caught.value.errno == errno.EINVAL
    env = last_error(mount)
    assert env["path"] == ".rw/policy.toml" and env["errno"] == "EINVAL"
    assert env["details"] == {
        "key": "gates.truncation.min_ratio",
        "value": 7.5,
        "allowed": "a number from 0 to 1",
    }
    assert "gates.truncation.min_ratio = 7.5" in env["message"]
    assert "from 0 to 1" in env["message"] and "was not changed" in env["message"]
    assert pol.read_text() == before
    # The truncation gate is still on: a file cut short is refused.
    f = mount.path / "long.txt"
    f.write_text("".join(f"line {i}\n" for i in range(100)))
    err = write_bytes(f, "".join(f"line {i}\n" for i in range(10)).encode())
    assert err is not None and err.errno == errno.EBADMSG
    assert last_error(mount)["reason_hint"] == "truncation"
    alive(mount)


# ---- B.4: names a tool would read as options ----


def test_plain_name_refuses_a_leading_dash() -> None:
    from rwfs.journal.store import plain_name

    for bad in (b"-x", b"--help", b"-", b"-rf", b".", b"..", b"a/b", b"", b"x" * 65):
        assert plain_name(bad) is None, bad
    for good in (b"a-b", b"x-", b"v1.2", b"_x", b".hidden", b"x" * 64):
        assert plain_name(good) == good.decode()


@pytest.mark.parametrize("top", ["batches", "snapshots", "chunks"])
def test_names_starting_with_a_dash_are_refused(mount: Mount, top: str) -> None:
    d = mount.path / ".rw" / top
    before = sorted(os.listdir(d))
    for bad in ("-x", "--help", "-"):
        with pytest.raises(OSError) as caught:
            os.mkdir(d / bad)
        assert caught.value.errno == errno.EINVAL, (top, bad)
        env = last_error(mount)
        assert env["errno"] == "EINVAL" and "not starting with a dash" in env["message"]
        assert sorted(os.listdir(d)) == before
    os.mkdir(d / "ok-1")  # a dash inside a name is fine
    assert "ok-1" in os.listdir(d)
    alive(mount)


def test_the_cli_refuses_a_batch_name_starting_with_a_dash(mount: Mount) -> None:
    import subprocess

    from conftest import RWFS

    # (argparse takes a positional "-x" for an option; an option's value can be one)
    res = subprocess.run(
        [*RWFS, "run", "--batch=-x", str(mount.path), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "not starting with a dash" in res.stderr, res.stderr
    assert "-x" not in os.listdir(mount.path / ".rw" / "batches")


# ---- B.5: restore of a path that names nothing journaled ----


def ctl_fails(m: Mount, line: bytes) -> dict:
    with pytest.raises(OSError) as caught:
        with open(m.path / ".rw" / "ctl", "wb") as f:
            f.write(line)
    assert caught.value.errno == errno.EINVAL, line
    env = last_error(m)
    assert env["errno"] == "EINVAL" and env["path"] == ".rw/ctl"
    return env


def test_restore_of_a_path_that_names_nothing_fails(mount: Mount) -> None:
    import subprocess

    from conftest import RWFS

    (mount.path / "src").mkdir()
    f = mount.path / "src" / "a.txt"
    f.write_text("then\n")
    os.mkdir(mount.path / ".rw" / "snapshots" / "s1")
    f.write_text("now\n")
    batches = sorted(os.listdir(mount.path / ".rw" / "batches"))
    for arg, said in [
        (b"'src/a\0b'", "NUL byte"),
        (b".rw/journal", "control directory"),
        (b".rw", "control directory"),
        (b"x" * 300, "longer than a path can be"),
        (b"never.txt", "names nothing the journal has a version of"),
        (b"src/a.txt never.txt", "names nothing"),  # one bad path: nothing restored
        (b"src/a.txt/b", "names nothing"),
        (b"''", "is empty"),
    ]:
        env = ctl_fails(mount, b"restore s1 " + arg + b"\n")
        assert said in env["message"] and env["message"].startswith("Nothing was restored"), arg
        assert f.read_text() == "now\n", arg
        assert sorted(os.listdir(mount.path / ".rw" / "batches")) == batches
    # The CLI says so and exits 1.
    res = subprocess.run(
        [*RWFS, "restore", "-C", str(mount.path), "s1", "never.txt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "names nothing the journal has" in res.stderr, res
    res = subprocess.run(
        [*RWFS, "undo", "-C", str(mount.path), "no-such-batch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "Nothing was undone" in res.stderr, res
    assert f.read_text() == "now\n"
    # A journaled file, and a directory holding one, are restored.
    (mount.path / ".rw" / "ctl").write_bytes(b"restore s1 src\n")
    assert f.read_text() == "then\n"
    f.write_text("now\n")
    (mount.path / ".rw" / "ctl").write_bytes(b"restore s1 src/a.txt\n")
    assert f.read_text() == "then\n"
    # Unchanged since the snapshot: nothing to do, and that is no error.
    (mount.path / ".rw" / "ctl").write_bytes(b"restore s1 src/a.txt\n")
    alive(mount)


# ---- B.2: a policy nested deeper than tomllib goes ----

DEEP_POLICY = "a = " + "[" * 5000 + "]" * 5000 + "\n"


def test_a_deep_policy_is_a_policy_error() -> None:
    from rwfs.policy import PolicyError

    for text in (DEEP_POLICY, "[gates]\nx = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"):
        with pytest.raises(PolicyError, match="nested deeper than it can be read"):
            Policy.parse(text)


def test_a_deep_policy_through_the_mount_is_einval(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    before = pol.read_text()
    with pytest.raises(OSError) as caught:
        pol.write_text(DEEP_POLICY)
    assert caught.value.errno == errno.EINVAL
    env = last_error(mount)
    assert env["path"] == ".rw/policy.toml" and "nested deeper" in env["message"]
    assert env["message"].startswith("The policy was not changed")
    assert pol.read_text() == before
    alive(mount)


def test_a_deep_policy_at_mount_time_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    from conftest import RWFS, rwfs_mounted

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    prepare_state(ws, DEEP_POLICY)
    try:
        res = subprocess.run([*RWFS, "mount", str(ws)], capture_output=True, text=True, timeout=60)
    finally:
        if rwfs_mounted(str(ws)):
            subprocess.run(["fusermount3", "-u", str(ws)], capture_output=True)
            raise AssertionError("mounted with a policy it cannot read")
    assert res.returncode != 0
    assert ".rw/policy.toml: policy.toml is nested deeper than it can be read" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert (ws / ".rw" / "policy.toml").read_text() == DEEP_POLICY  # left as it was


# ---- B.6: a write over a size limit ----


@pytest.mark.parametrize("name", ["policy.toml", "handoff"])
def test_a_control_write_over_its_limit_is_refused_whole(mount: Mount, name: str) -> None:
    """A single write() over a control file's limit (1 MiB): the kernel sends it in
    pieces and reports the pieces before the limit as a short count, which a writer may
    not check; then close() used to return 0 with nothing applied. Now the next write and
    close() fail with EFBIG, and the envelope says nothing was applied."""
    f = mount.path / ".rw" / name
    before = f.read_bytes()
    text = b"# " + b"x" * (1 << 20) + b"\n"
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    try:
        try:
            n = os.write(fd, text)
        except OSError as exc:
            assert exc.errno == errno.EFBIG
        else:
            assert n < len(text)  # short: the part the kernel sent before the limit
            with pytest.raises(OSError) as again:
                os.write(fd, text[n:])
            assert again.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError) as closed:
            os.close(fd)
    assert closed.value.errno == errno.EFBIG
    env = last_error(mount)
    assert (env["errno"], env["path"], env["details"]) == (
        "EFBIG",
        f".rw/{name}",
        {"limit": 1 << 20},
    )
    assert env["message"].startswith(f"Nothing you wrote to .rw/{name} was applied")
    assert "1 MiB" in env["message"]
    assert not (mount.path / ".rw" / "why" / name).exists()  # not a workspace file's
    if name == "policy.toml":
        assert f.read_bytes() == before
    else:
        assert b"x" * 100 not in f.read_bytes()
    # Python's buffered writer retries the rest, and raises.
    with pytest.raises(OSError) as caught:
        with open(f, "wb") as out:
            out.write(text)
    assert caught.value.errno == errno.EFBIG
    # Within the limit, a write is taken.
    if name == "policy.toml":
        f.write_bytes(before + b"# fits\n")
        assert f.read_bytes() == before + b"# fits\n"
    alive(mount)


def test_a_file_over_the_limit_with_a_commit_queued_stays_journaled(tmp_path: Path) -> None:
    """A file written past max_journaled_bytes while a commit of it is queued. An O_TRUNC
    open (or a truncate) then took the file for an unjournaled one and truncated the tree's
    file in place, under the queued commit: the commit landed after, and the next write
    went over its bytes (3,000 new bytes and 2,000 old ones), with the tree emptied and fsck
    finding a drift. Now the crossing write commits what is queued first and the file
    leaves journaling there: the mount and the tree agree at every step."""
    ws = tmp_path / "ws"
    ws.mkdir()
    prepare_state(
        ws,
        DEFAULT_TEXT.replace("max_journaled_bytes = 268435456", "max_journaled_bytes = 1000")
        # Commits stay queued until a sync: the window where it happened, made wide.
        .replace("commit_interval_ms = 500", "commit_interval_ms = 60000"),
    )
    m = Mount(ws).start()
    try:
        f = m.path / "f.txt"
        f.write_bytes(b"a" * 500)
        (m.path / ".rw" / "ctl").write_text("sync\n")
        f.write_bytes(b"b" * 5000)  # over the limit, journaled: its commit is queued
        f.write_bytes(b"c" * 3000)  # O_TRUNC, then a write
        assert f.read_bytes() == b"c" * 3000
        f.write_bytes(b"d" * 4000)
        os.truncate(f, 10)  # a truncate(2) with a commit queued
        assert f.read_bytes() == b"d" * 10
        (m.path / ".rw" / "ctl").write_text("sync\n")
        evs = [e for e in journal(m) if e["path"] == "f.txt"]
        sizes = [e["size"] for e in evs if e["op"] == "write"]
        # Past the limit the file left journaling (docs/policy.md), and no commit, stage or
        # kept version was ever larger than the limit.
        assert sizes[0] == 500 and max(sizes) <= 1000, sizes
        assert [e["size"] for e in evs if e["op"] == "unjournaled"][0] == 5000
        # Landed and over the limit: an O_TRUNC open now empties the tree's file in place.
        f.write_bytes(b"e" * 5000)
        (m.path / ".rw" / "ctl").write_text("sync\n")
        f.write_bytes(b"g" * 2000)
        assert f.read_bytes() == b"g" * 2000
        shown = f.read_bytes()
        alive(m)
    finally:
        m.stop()
    assert (ws / "f.txt").read_bytes() == shown
    check_clean(m)
