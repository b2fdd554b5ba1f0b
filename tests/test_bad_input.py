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
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs import gates, parsers
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


def agree(m: Mount, name: str) -> bytes:
    """The file's bytes through the mount; the caller compares them with the tree's after
    unmounting."""
    return (m.path / name).read_bytes()


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
            shown[name] = agree(m, name)
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
