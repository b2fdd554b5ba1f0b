"""Gates through a real mount (SPEC §4): a write that breaks a file is refused at close()
with EBADMSG, the file keeps its old bytes, and the draft and the reason are under .rw/.
The files are real ones (this Python's standard library), broken the way models break them.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.checks import gates, parsers
from rwfs.policy import DEFAULT_TEXT

REAL = inspect.getsource(json.decoder)  # a real module of a few hundred lines


def write(path: Path, data: str) -> OSError | None:
    try:
        with open(path, "w") as f:
            f.write(data)
    except OSError as exc:
        return exc
    return None


def envelope(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "last-error").read_text())


def events(m: Mount, op: str) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["op"] == op]


@pytest.fixture
def real(mount: Mount) -> Path:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    return f


def test_syntax_error_is_refused_and_the_old_file_kept(mount: Mount, real: Path) -> None:
    broken = REAL.replace("def _decode_uXXXX(s, pos", "def _decode_uXXXX(s, pos:", 1)
    err = write(real, broken)
    assert err is not None and err.errno == errno.EBADMSG
    assert real.read_text() == REAL
    env = envelope(mount)
    assert env["ok"] is False and env["error"] == "blocked" and env["errno"] == "EBADMSG"
    assert env["reason_hint"] == "syntax" and env["path"] == "decoder.py"
    assert env["details"]["line"] > 0 and env["retry_budget"] == 3  # retries left
    assert "unchanged" in env["message"] and env["draft"] in env["message"]
    # The draft is never lost, and why/<path> holds the same envelope.
    assert (mount.path / env["draft"]).read_text() == broken
    assert json.loads((mount.path / ".rw" / "why" / "decoder.py").read_text()) == env
    refusals = events(mount, "refuse")
    assert [(e["gate"], e["path"]) for e in refusals] == [("syntax", "decoder.py")]
    assert json.loads((mount.path / ".rw" / "status").read_text())["counts"]["refusals"] == 1


def test_truncated_file_is_refused(mount: Mount, real: Path) -> None:
    cut = REAL[: len(REAL) // 2].rsplit("\n", 1)[0] + "\n"
    err = write(real, cut)
    assert err is not None and err.errno == errno.EBADMSG
    assert envelope(mount)["reason_hint"] == "truncation"
    assert real.read_text() == REAL


WRAP = inspect.getsource(textwrap)  # a real module of about 500 lines, one long class


def refused_by(m: Mount, path: Path, new: str, old: str) -> set[str]:
    """Write ``new`` over ``path``: refused at close() with EBADMSG, the file unchanged;
    the gates that refused it."""
    err = write(path, new)
    assert err is not None and err.errno == errno.EBADMSG
    assert path.read_text() == old
    env = envelope(m)
    assert env["path"] == path.name and "unchanged" in env["message"]
    return set(env["details"]["gates"])


def test_half_a_file_with_a_final_newline_is_refused(mount: Mount, real: Path) -> None:
    lines = REAL.split("\n")
    half = len(lines) // 2
    cut = "\n".join(lines[:half]) + "\n" + lines[half][: len(lines[half]) // 2]
    for tail in ("\n", "\n\n", "   \n", "\n}\n", "\n# [truncated]\n"):
        assert "truncation" in refused_by(mount, real, cut + tail, REAL)
    crlf = (cut + "\n").replace("\n", "\r\n")
    assert "truncation" in refused_by(mount, real, crlf, REAL)


def test_a_placeholder_over_300_lines_is_refused(mount: Mount) -> None:
    f = mount.path / "wrap.py"
    f.write_text(WRAP)
    lines = WRAP.split("\n")
    first = next(i for i, x in enumerate(lines) if x.startswith("    def "))
    end = lines.index("def dedent(text):") - 2  # the class's methods, wrap(), fill() ...
    assert end - first > 300
    new = lines[:first] + ["    # ... (code omitted for brevity) ..."] + lines[end:]
    assert refused_by(mount, f, "\n".join(new), WRAP) == {"elision"}  # it parses


def test_a_bare_ellipsis_over_a_function_body_is_refused(mount: Mount) -> None:
    f = mount.path / "wrap.py"
    f.write_text(WRAP)
    lines = WRAP.split("\n")
    start = lines.index("def dedent(text):")
    end = lines.index("def indent(text, prefix, predicate=None):")
    stubbed = lines[: start + 1] + ["    ..."] + lines[end - 2 :]
    assert refused_by(mount, f, "\n".join(stubbed), WRAP) == {"elision", "stub"}
    head = lines[start].replace(":", ":  # unchanged")
    marked = lines[:start] + [head, "    ..."] + lines[end - 2 :]
    assert refused_by(mount, f, "\n".join(marked), WRAP) == {"elision", "stub"}


JS = """\
'use strict'

const { readFile } = require('node:fs/promises')

async function load (path) {
  const text = await readFile(path, 'utf8')
  const lines = text.split('\\n')
  return lines.filter((line) => line.trim() !== '')
}

function count (lines) {
  const seen = new Map()
  for (const line of lines) {
    seen.set(line, (seen.get(line) || 0) + 1)
  }
  return seen
}

module.exports = { load, count }
"""


def test_a_js_file_missing_a_brace_is_refused(mount: Mount) -> None:
    f = mount.path / "lines.js"
    f.write_text(JS)
    broken = JS.replace("  }\n  return seen", "  return seen", 1)
    assert broken != JS
    assert refused_by(mount, f, broken, JS) == {"syntax"}


def test_deleting_a_function_stubbing_a_protocol_and_rewriting_pass(mount: Mount) -> None:
    f = mount.path / "wrap.py"
    f.write_text(WRAP)
    lines = WRAP.split("\n")
    start = lines.index("def shorten(text, width, **kwargs):")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# "))
    fewer = "\n".join(lines[:start] + lines[end:])  # shorten() deleted
    assert write(f, fewer) is None and f.read_text() == fewer
    protocol = (
        "from typing import Protocol\n\n\n"
        "class Wrapper(Protocol):\n"
        "    width: int\n\n"
        "    def wrap(self, text: str) -> list[str]: ...\n"
        "    def fill(self, text: str) -> str:\n"
        "        ...\n\n\n"
    )
    stubbed = fewer.replace("class TextWrapper:", protocol + "class TextWrapper:", 1)
    assert write(f, stubbed) is None and f.read_text() == stubbed
    assert write(f, REAL) is None and f.read_text() == REAL  # a different file entirely
    assert events(mount, "refuse") == []


def test_elided_middle_is_refused(mount: Mount, real: Path) -> None:
    lines = REAL.splitlines(True)
    elided = "".join(lines[:30] + ["    # ... rest of the code unchanged ...\n"] + lines[-10:])
    err = write(real, elided)
    assert err is not None and err.errno == errno.EBADMSG
    env = envelope(mount)
    assert env["reason_hint"] in ("elision", "syntax") and "elision" in env["details"]["gates"]
    assert real.read_text() == REAL


def test_good_edits_new_files_and_deliberate_deletions_pass(mount: Mount, real: Path) -> None:
    edited = REAL.replace("def JSONArray(", "# ... see the JSON spec for arrays\ndef JSONArray(", 1)
    assert write(real, edited) is None and real.read_text() == edited
    start = edited.index("\ndef JSONObject(")
    end = edited.index("\ndef ", start + 1)
    fewer = edited[:start] + edited[end:]  # a whole function deleted on purpose
    assert write(real, fewer) is None and real.read_text() == fewer
    assert write(mount.path / "new_broken.py", "def f(:\n") is None  # nothing to break
    assert write(mount.path / "new_broken.py", "def g(:\n") is None  # it was broken already
    (mount.path / "decoder.py").unlink()  # deleting a file is no truncation
    assert events(mount, "refuse") == []


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        (
            "conf.json",
            '{"a": [1, 2, 3], "b": {"c": true}}\n',
            '{"a": [1, 2, 3], "b": {"c": true}\n',
        ),
        ("pyproject.toml", '[project]\nname = "x"\nversion = "1"\n', '[project\nname = "x"\n'),
        ("ci.yml", "jobs:\n  test:\n    steps: [a, b]\n", "jobs:\n  test:\n    steps: [a, b\n"),
    ],
)
def test_data_formats_refuse_a_regression(mount: Mount, name: str, good: str, bad: str) -> None:
    f = mount.path / name
    assert write(f, good) is None
    err = write(f, bad)
    assert err is not None and err.errno == errno.EBADMSG
    assert f.read_text() == good
    assert envelope(mount)["details"]["format"] in ("json", "toml", "yaml")


def test_retry_budget_counts_down_for_the_same_draft(mount: Mount, real: Path) -> None:
    broken = REAL + "\ndef broken(:\n"
    budgets = []
    for _ in range(4):
        assert write(real, broken) is not None
        budgets.append(envelope(mount)["retry_budget"])
    assert budgets == [3, 2, 1, 0]
    assert "change strategy" in envelope(mount)["message"]
    assert write(real, REAL + "\ndef other(:\n") is not None
    assert envelope(mount)["retry_budget"] == 3  # another draft has its own budget


def test_fsync_reports_the_refusal(mount: Mount, real: Path) -> None:
    fd = os.open(real, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"def f(:\n" + REAL.encode())
        with pytest.raises(OSError) as err:
            os.fsync(fd)
        assert err.value.errno == errno.EBADMSG
    finally:
        os.close(fd)
    assert real.read_text() == REAL


def test_a_shell_redirect_is_refused_silently_but_visible_under_rw(
    mount: Mount, real: Path
) -> None:
    # bash ignores close() errors of a builtin's redirection: the file and .rw/ tell.
    subprocess.run(["bash", "-c", f"printf 'def f(:\\n' > '{real}'"], check=True)
    assert real.read_text() == REAL
    assert envelope(mount)["reason_hint"] == "syntax"


def test_many_writers_refused_at_once(mount: Mount) -> None:
    files = [mount.path / f"m{i}.py" for i in range(12)]
    for f in files:
        f.write_text(REAL)
    errors: list[int] = []

    def breaker(f: Path) -> None:
        err = write(f, REAL.replace("import re", "import re(", 1))
        errors.append(err.errno if err else 0)

    threads = [threading.Thread(target=breaker, args=(f,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [errno.EBADMSG] * len(files)
    assert all(f.read_text() == REAL for f in files)
    assert len(os.listdir(mount.path / ".rw" / "rejected")) >= 1  # identical drafts share one
    assert len(events(mount, "refuse")) == len(files)


def test_warn_policy_lets_the_write_through_and_records_it(workspace: Path) -> None:
    prepare_state(
        workspace,
        DEFAULT_TEXT.replace(
            '[gates.syntax]\naction = "reject"', '[gates.syntax]\naction = "warn"'
        ),
    )
    (workspace / "a.py").write_text(REAL)
    m = Mount(workspace).start()
    try:
        assert write(m.path / "a.py", REAL + "\ndef f(:\n") is None
        writes = [e for e in events(m, "write") if e["path"] == "a.py"]
        assert writes[-1]["warnings"][0]["gate"] == "syntax"
        assert json.loads((m.path / ".rw" / "status").read_text())["counts"]["warnings"] == 1
    finally:
        m.stop()
    check_clean(m)


def test_override_turns_gates_off_for_fixtures(workspace: Path) -> None:
    policy = DEFAULT_TEXT + '\n[[gates.override]]\npaths = ["tests/fixtures/**"]\nsyntax = "off"\n'
    prepare_state(workspace, policy)
    (workspace / "tests" / "fixtures").mkdir(parents=True)
    (workspace / "tests" / "fixtures" / "x.py").write_text(REAL)
    (workspace / "y.py").write_text(REAL)
    m = Mount(workspace).start()
    try:
        assert write(m.path / "tests" / "fixtures" / "x.py", "def f(:\n" + REAL) is None
        assert write(m.path / "y.py", "def f(:\n" + REAL) is not None
    finally:
        m.stop()
    check_clean(m)


def test_refused_drafts_stay_listed_after_remount(workspace: Path) -> None:
    (workspace / "a.py").write_text(REAL)
    m = Mount(workspace).start()
    try:
        assert write(m.path / "a.py", REAL + "\ndef f(:\n") is not None
        draft = envelope(m)["draft"]
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        assert (m.path / draft).read_text() == REAL + "\ndef f(:\n"
    finally:
        m.stop()
    check_clean(m)


def test_a_refusal_inside_write_temp_then_rename_fails_the_rename(mount: Mount, real: Path) -> None:
    tmp = mount.path / ".decoder.py.swp-new"
    tmp.write_text(REAL.replace("import re", "import re(", 1))
    with pytest.raises(OSError) as err:
        os.replace(tmp, real)
    assert err.value.errno == errno.EBADMSG
    assert real.read_text() == REAL  # the target keeps its bytes
    assert tmp.exists()  # and the temp file is still there
    env = envelope(mount)
    assert env["path"] == "decoder.py" and env["reason_hint"] == "syntax"
    assert (mount.path / env["draft"]).read_text() == tmp.read_text()
    good = mount.path / "decoder.new"
    good.write_text(REAL.replace("import re", "import re  # regular expressions", 1))
    os.replace(good, real)  # a good save through a rename passes
    assert "regular expressions" in real.read_text()


# Small but real-shaped programs per tree-sitter language, and the way models break them:
# a closing brace, paren or keyword dropped.
SOURCES = {
    "app.js": (
        "import { readFile } from 'node:fs/promises';\n\n"
        "export async function load(path) {\n  const text = await readFile(path, 'utf8');\n"
        "  return text.split('\\n').filter((line) => line.trim() !== '');\n}\n\n"
        "export const double = (xs) => xs.map((x) => x * 2);\n",
        ("filter((line) => line.trim() !== '')", "filter((line) => line.trim() !== ''"),
    ),
    "types.ts": (
        "export interface User {\n  id: number;\n  name: string;\n}\n\n"
        "export function greet(u: User): string {\n  return `hello ${u.name}`;\n}\n",
        ("  name: string;\n}", "  name: string;\n"),
    ),
    "View.tsx": (
        "import React from 'react';\n\nexport function View({ items }: { items: string[] }) {\n"
        "  return (\n    <ul>\n      {items.map((i) => (\n        <li key={i}>{i}</li>\n"
        "      ))}\n    </ul>\n  );\n}\n",
        ("      ))}\n", "      )}\n"),
    ),
    "Main.java": (
        "package demo;\n\nimport java.util.List;\n\npublic class Main {\n"
        "    static int sum(List<Integer> xs) {\n        int s = 0;\n"
        "        for (int x : xs) { s += x; }\n        return s;\n    }\n}\n",
        ("for (int x : xs) { s += x; }", "for (int x : xs) { s += x; "),
    ),
    "main.go": (
        'package main\n\nimport "fmt"\n\nfunc sum(xs []int) int {\n\ts := 0\n'
        "\tfor _, x := range xs {\n\t\ts += x\n\t}\n\treturn s\n}\n\n"
        "func main() {\n\tfmt.Println(sum([]int{1, 2, 3}))\n}\n",
        ("\t\ts += x\n\t}\n", "\t\ts += x\n"),
    ),
    "lib.rs": (
        "pub fn sum(xs: &[i64]) -> i64 {\n    xs.iter().copied().sum()\n}\n\n"
        "#[cfg(test)]\nmod tests {\n    #[test]\n    fn sums() {\n"
        "        assert_eq!(super::sum(&[1, 2]), 3);\n    }\n}\n",
        ("assert_eq!(super::sum(&[1, 2]), 3);", "assert_eq!(super::sum(&[1, 2], 3);"),
    ),
    "util.c": (
        "#include <stdio.h>\n\nstatic int sum(const int *xs, int n) {\n    int s = 0;\n"
        "    for (int i = 0; i < n; i++) {\n        s += xs[i];\n    }\n    return s;\n}\n\n"
        'int main(void) {\n    int xs[] = {1, 2, 3};\n    printf("%d\\n", sum(xs, 3));\n'
        "    return 0;\n}\n",
        ("        s += xs[i];\n    }\n", "        s += xs[i];\n"),
    ),
    "vec.cpp": (
        "#include <vector>\n#include <numeric>\n\nnamespace demo {\n"
        "int total(const std::vector<int>& v) {\n"
        "    return std::accumulate(v.begin(), v.end(), 0);\n}\n}  // namespace demo\n",
        ("v.end(), 0);", "v.end(), 0;"),
    ),
    "shop.rb": (
        "class Cart\n  def initialize\n    @items = []\n  end\n\n"
        "  def add(item)\n    @items << item\n    self\n  end\n\n"
        "  def total\n    @items.sum(&:price)\n  end\nend\n",
        ("    self\n  end\n", "    self\n"),
    ),
    "deploy.sh": (
        '#!/usr/bin/env bash\nset -euo pipefail\n\nfor host in "$@"; do\n'
        '  if ping -c1 "$host" >/dev/null; then\n    echo "up: $host"\n  fi\ndone\n',
        ('    echo "up: $host"\n  fi\n', '    echo "up: $host"\n'),
    ),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_tree_sitter_languages_refuse_a_regression(mount: Mount, name: str) -> None:
    good, (old, new) = SOURCES[name]
    f = mount.path / name
    assert write(f, good) is None
    assert write(f, good + "\n") is None  # an edit that keeps it valid passes
    broken = good.replace(old, new, 1)
    assert broken != good
    err = write(f, broken)
    assert err is not None and err.errno == errno.EBADMSG, name
    assert f.read_text() == good + "\n"
    assert envelope(mount)["details"]["line"] >= 1


FAKE_KEY = "sk-ant-api03-" + "Zx9" * 14  # shaped like a key, not one


def test_secrets_warn_by_default_and_never_leak(mount: Mount) -> None:
    text = f"ANTHROPIC_API_KEY={FAKE_KEY}\nGITHUB_TOKEN=ghp_{'a1' * 18}\n"
    assert write(mount.path / "settings.env", text) is None  # warn: the write proceeds
    (write_ev,) = [e for e in events(mount, "write") if e["path"] == "settings.env"]
    (warning,) = write_ev["warnings"]
    # Two families (0.35 each, the paper's weights): a "high" verdict, still only a warning.
    assert warning["gate"] == "secrets" and warning["verdict"] == "high"
    assert set(warning["detected_patterns"]) == {"api_key", "github_pat"}
    journal = (mount.path / ".rw" / "journal").read_text()
    assert FAKE_KEY[:8] not in journal and "sk-ant" not in journal  # no part of it
    assert {"pattern": "api_key", "line": 1, "column": 19} in warning["matches"]


def test_secrets_reject_at_refuses_and_the_envelope_does_not_leak(workspace: Path) -> None:
    prepare_state(workspace, DEFAULT_TEXT.replace('reject_at = "off"', 'reject_at = "medium"'))
    m = Mount(workspace).start()
    try:
        f = m.path / "config.py"
        f.write_text("DEBUG = True\n")
        err = write(f, f"DEBUG = True\nKEY = '{FAKE_KEY}'\nTOKEN = 'ghp_{'a1' * 18}'\n")
        assert err is not None and err.errno == errno.EBADMSG
        assert f.read_text() == "DEBUG = True\n"
        env_text = (m.path / ".rw" / "last-error").read_text()
        assert FAKE_KEY not in env_text
        env = json.loads(env_text)
        assert env["reason_hint"] == "secrets" and env["details"]["verdict"] == "high"
    finally:
        m.stop()
    check_clean(m)


def test_validate_and_risk_views_diagnose_without_writing(workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "ok.py").write_text(REAL)
    (workspace / "src" / "bad.json").write_text('{"a": [1, 2}\n')  # broken before any mount
    (workspace / "notes.txt").write_text(f"key: {FAKE_KEY}\n")
    m = Mount(workspace).start()
    try:
        view = m.path / ".rw" / "validate"
        assert json.loads((view / "src" / "ok.py").read_text()) == {
            "valid": True,
            "format": "python",
            "errors": [],
        }
        bad = json.loads((view / "src" / "bad.json").read_text())
        assert bad["valid"] is False and bad["format"] == "json" and bad["errors"][0]["line"] == 1
        risk = json.loads((m.path / ".rw" / "risk" / "notes.txt").read_text())
        assert risk["verdict"] == "low" and risk["detected_patterns"] == ["api_key"]
        assert FAKE_KEY not in (m.path / ".rw" / "risk" / "notes.txt").read_text()
        assert not (view / "src" / "missing.py").exists()
        with pytest.raises(OSError):
            (view / "src" / "ok.py").write_text("x")  # views are read-only
        assert events(m, "write") == []  # nothing was written
    finally:
        m.stop()
    check_clean(m)


def test_refusal_errno_and_stats(workspace: Path) -> None:
    prepare_state(
        workspace, DEFAULT_TEXT.replace('refusal_errno = "EBADMSG"', 'refusal_errno = "EIO"')
    )
    (workspace / "a.py").write_text(REAL)
    m = Mount(workspace).start()
    try:
        err = write(m.path / "a.py", REAL + "\ndef f(:\n")
        assert err is not None and err.errno == errno.EIO
        assert envelope(m)["errno"] == "EIO" and envelope(m)["error"] == "blocked"
        assert write(m.path / "a.py", REAL + "\n# fine\n") is None
        (m.path / ".rw" / "ctl").write_text("sync\n")
        stats = json.loads((m.path / ".rw" / "stats").read_text())
        assert stats["counts"]["gate.syntax.refused"] == 1
        assert stats["counts"]["commits"] == 1
        assert stats["hot_paths"] == [{"path": "a.py", "commits": 1}]
        assert stats["latency_ms"]["gates"]["n"] == 2
        assert stats["latency_ms"]["gates"]["p99"] >= stats["latency_ms"]["gates"]["p50"] > 0
    finally:
        m.stop()
    check_clean(m)


def test_refusal_errno_must_name_an_errno(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    with pytest.raises(OSError) as err:
        pol.write_text(
            pol.read_text().replace('refusal_errno = "EBADMSG"', 'refusal_errno = "ENOPE"')
        )
    assert err.value.errno == errno.EINVAL
    assert 'refusal_errno = "EBADMSG"' in pol.read_text()


def test_a_file_read_is_parsed_ahead_of_its_edit(mount: Mount, real: Path) -> None:
    """Once the mount is idle, the file last opened to read is parsed the way its next
    commit will parse it; that commit then keeps its own parse, so reading the new version
    parses nothing more. The gate still refuses a regression afterwards."""

    def primed() -> int:
        stats = json.loads((mount.path / ".rw" / "stats").read_text())
        return int(stats["counts"].get("gates.primed", 0))

    def settled() -> int:
        deadline = time.monotonic() + 10
        while primed() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # idle long enough for any prime still to come
        return primed()

    assert primed() == 0  # a new file has nothing to check against: nothing parsed
    assert real.read_text() == REAL
    assert settled() == 1
    real.read_text()  # the same bytes: kept already
    assert settled() == 1
    edited = REAL.replace("def py_scanstring(", "def py_scanstring_renamed(", 1)
    assert write(real, edited) is None
    assert real.read_text() == edited
    assert settled() == 1  # the commit kept the new version's parse
    err = write(real, edited.replace("def JSONObject(", "def JSONObject((", 1))
    assert err is not None and err.errno == errno.EBADMSG
    assert real.read_text() == edited


# ---- elision judged by structure (in-process: gates.check on bytes, default policy) ----


def gated(name: str, old: str, new: str) -> list[str]:
    """The gates that refuse ``new`` over ``old`` at ``name`` (the default policy)."""
    from rwfs.checks import gates
    from rwfs.policy import Policy

    found = gates.check(name.encode(), old.encode(), new.encode(), Policy().gate)
    return [f.gate for f in found if f.action == "reject"]


def wrap_lines() -> list[str]:
    return WRAP.split("\n")


@pytest.mark.parametrize(
    "words",
    [
        "# as in the current version",
        "# keep as is",
        "# come nella versione attuale",
        "# 其余代码保持不变",
        '"""wie bisher"""',
        "# ... igual que antes ...",
    ],
)
def test_a_middle_block_replaced_by_a_comment_in_any_words_is_refused(words: str) -> None:
    lines = wrap_lines()
    start = lines.index("def dedent(text):")
    end = lines.index("def indent(text, prefix, predicate=None):")
    first = next(i for i, x in enumerate(lines) if x.startswith("def wrap("))
    new = lines[:first] + [words] + lines[start:]  # wrap(), fill(), shorten() left out
    assert gated("wrap.py", WRAP, "\n".join(new)) == ["elision"]
    # A JS function's body left out, in other words.
    body = "".join(f"  total += step({i}, values[{i}]);\n" for i in range(14))
    js = f"function sum(values) {{\n  let total = 0;\n{body}  return total;\n}}\n\n{JS}"
    kept = js.split("\n")
    stubbed = kept[:1] + ["  // " + words.strip('#" .')] + kept[17:]
    assert gated("sum.js", js, "\n".join(stubbed)) == ["elision", "stub"]  # (both, rightly)
    # One definition deleted with a note where it was is a deletion: it passes.
    note = lines[:start] + ["# " + words.strip('#" .')] + lines[end - 2 :]
    assert gated("wrap.py", WRAP, "\n".join(note)) == []


def test_data_files_refuse_a_placeholder_entry_where_keys_were() -> None:
    data = {f"key_{i}": {"value": i, "enabled": i % 2 == 0} for i in range(12)}
    old = json.dumps(data, indent=2) + "\n"
    lines = old.split("\n")
    k = lines.index('  "key_3": {')
    end = lines.index('  "key_9": {')
    for entry in ('"...": "..."', '"…": "…"'):
        new = lines[:k] + ["  " + entry + ","] + lines[end:]
        assert gated("conf.json", old, "\n".join(new)) == ["elision"], entry
    yml = "".join(f"key_{i}:\n  value: {i}\n  on: true\n" for i in range(12))
    ys = yml.split("\n")
    for entry in ("...: ...", "key_3: ...", "# as in the current version"):
        assert gated("c.yaml", yml, "\n".join(ys[:9] + [entry] + ys[27:])) == ["elision"]
    # Keys removed, nothing in their place; the last ones removed, brackets closed.
    assert gated("conf.json", old, "\n".join(lines[:k] + lines[end:])) == []
    words = json.dumps({"keywords": [f"word{i}" for i in range(15)], "v": 1}, indent=2)
    one = words.replace('"word0",', '"word0"', 1).split("\n")
    assert gated("package.json", words, "\n".join(one[:3] + one[17:])) == []  # one kept
    last = lines[: lines.index('  "key_9": {')]
    last[-1] = last[-1].rstrip(",")
    assert gated("conf.json", old, "\n".join([*last, "}", ""])) == []


def test_what_the_old_file_had_is_no_evidence() -> None:
    # Stubs whose "..." the old file had, a comment line it had (twice), and a function
    # deleted between them: neither stands for the function.
    def stubs(prefix: str) -> str:
        return "".join(f"def {prefix}_{i}(x: int) -> int:\n    ...\n\n\n" for i in range(6))

    body = "".join(f"    y = y + x * {i}\n" for i in range(30))
    old = f"#\n{stubs('a')}def helper(x):\n    y = 0\n{body}    return y\n\n\n#\n{stubs('b')}"
    assert gated("m.pyi", old, f"#\n{stubs('a')}#\n{stubs('b')}") == []
    # ... while a new comment there stands for it.
    assert gated("m.pyi", old, f"#\n{stubs('a')}# wie bisher\n#\n{stubs('b')}") == ["elision"]


def test_prose_docstrings_overloads_doctests_and_strings_are_not_placeholders() -> None:
    lines = wrap_lines()
    start = lines.index("def dedent(text):")
    end = lines.index("def indent(text, prefix, predicate=None):")
    fewer = lines[:start] + lines[end - 2 :]  # dedent() deleted
    doc = next(
        i
        for i, x in enumerate(fewer)
        if i > 40
        and x.strip().startswith('"""')
        and len(x.strip()) > 3
        and '"""' not in x.strip()[3:]
    )
    for line in ("    Unchanged:", "    Everything else is unchanged."):
        assert gated("wrap.py", WRAP, "\n".join(fewer[: doc + 1] + [line] + fewer[doc + 1 :])) == []
    overloads = [
        "@overload",
        "def convert(value: int) -> int:",
        "    ...",
        "",
        "",
        "@overload",
        "def convert(value: str) -> str:",
        "    ...",
        "",
        "",
    ]
    assert gated("wrap.py", WRAP, "\n".join(lines[:start] + overloads + lines[end - 2 :])) == []
    strings = ["STATES = (", '    "unchanged",', '    "omitted",', ")", "", ""]
    assert gated("wrap.py", WRAP, "\n".join(lines[:start] + strings + lines[end - 2 :])) == []
    # Prose: a section deleted, a sentence and a bullet that use the words, a doctest.
    md = "".join(f"## Part {i}\n\nSome words about part {i}, and more.\n\n" for i in range(20))
    ps = md.split("\n")
    for line in ("* Everything else is unchanged.", "The rest of the file stays the same."):
        assert gated("notes.md", md, "\n".join(ps[:8] + [line] + ps[40:])) == []
    doctest = [">>> add(1,", "...     2)", "3", ">>> for x in range(2):", "...     print(x)", "..."]
    assert gated("usage.txt", md, "\n".join(ps[:8] + doctest + ps[40:])) == []
    # ... while a comment standing for the section is an elision.
    assert gated("notes.md", md, "\n".join(ps[:8] + ["<!-- wie bisher -->"] + ps[40:])) == [
        "elision"
    ]


def test_pruning_most_tests_keeps_the_file_whole() -> None:
    fixtures = "import pytest\n\n\n@pytest.fixture\ndef data():\n    return [1, 2, 3]\n\n\n"
    tests = "".join(
        f"def test_case_{i}(data):\n    x = sum(data) + {i}\n    assert x > 0\n    assert x < 100\n\n\n"
        for i in range(30)
    )
    klass = "class TestGroup:\n" + "".join(
        f"    def test_m_{i}(self):\n        assert {i} + 1 > {i}\n\n" for i in range(20)
    )
    old = fixtures + tests + klass
    keep = (
        fixtures
        + tests.split("\n\n\ndef test_case_3(")[0]
        + "\n\n\n"
        + ("class TestGroup:\n    def test_m_0(self):\n        assert 0 + 1 > 0\n")
    )
    assert gated("test_m.py", old, keep) == []
    # The last tests deleted: no cut either.
    assert gated("test_m.py", old, fixtures + tests) == []
    # A fragment kept (the fixture gone too) is still refused.
    fragment = "import pytest\n\n\n" + tests.split("\n\n\ndef test_case_3(")[0] + "\n"
    assert gated("test_m.py", old, fragment) != []
    # A write cut off at a test, or inside one, is a cut: what is gone is the file's end.
    old = fixtures + tests
    at_a_test = old.split("\n\n\ndef test_case_20(")[0] + "\n"
    assert gated("test_m.py", old, at_a_test) == ["truncation"]
    inside = old.split("    x = sum(data) + 20\n")[0] + "    x = sum(data) + 20\n"
    assert gated("test_m.py", old, inside) == ["truncation"]


def test_a_stand_in_refusal_names_the_allowance(mount: Mount) -> None:
    f = mount.path / "wrap.py"
    f.write_text(WRAP)
    lines = wrap_lines()
    first = next(i for i, x in enumerate(lines) if x.startswith("def wrap("))
    start = lines.index("def dedent(text):")
    new = "\n".join(lines[:first] + ["# come nella versione attuale"] + lines[start:])
    assert refused_by(mount, f, new, WRAP) == {"elision"}
    env = envelope(mount)
    assert env["details"]["signal"] == "stand-in"
    assert env["allow"]["command"] == f"rwfs allow {mount.path}/wrap.py"
    assert env["allow"]["command"] in env["message"]


def test_a_licence_header_or_a_docstring_made_short_is_no_stand_in() -> None:
    licence = "".join(f"# Licence text, line {i}: terms and conditions.\n" for i in range(20))
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(10))
    old = licence + "\n" + body
    assert gated("m.py", old, "# SPDX-License-Identifier: MIT\n\n" + body) == []
    doc = '"""Helpers.\n\n' + "".join(f"Paragraph {i} of the long story.\n" for i in range(20))
    old = doc + '"""\n\n' + body
    assert gated("m.py", old, '"""Helpers."""\n\n' + body) == []
    # Code is not a docstring: the same short string where functions were is refused.
    code = "".join(f"def g{i}(x):\n    y = x * {i}\n    return y\n\n\n" for i in range(8))
    old = body + code + "X = 1\n"
    assert gated("m.py", old, body + '"""Helpers."""\n\n\nX = 1\n') == ["elision"]


# ---- stubbed bodies and text written twice ----

CFG = {"stub": {"min_lines": 5}, "duplication": {"min_lines": 8}}
BODY_PY = "".join(f"    total += step * {i}\n" for i in range(6)) + "    return total\n"


def stub_of(name: str, old: str, new: str) -> str | None:
    """The gate that refuses ``new`` over ``old`` (stub or duplication), in-process."""
    for gate, judge in (("stub", gates.stub), ("duplication", gates.duplication)):
        if judge(old.encode(), new.encode(), CFG[gate], name.encode()) is not None:
            return gate
    return None


# An implemented body (over 5 lines of code) and the same definition stubbed, in every
# format the syntax gate knows that has functions: (name, old, new).
BODY_C = "".join(f"    total += step * {i};\n" for i in range(6))
STUBBED = {
    "pass": ("m.py", "def f(step):\n    total = 0\n" + BODY_PY, "def f(step):\n    pass\n"),
    "...": ("m.py", "def f(step):\n    total = 0\n" + BODY_PY, "def f(step):\n    ...\n"),
    "raise NotImplementedError": (
        "m.py",
        "class A:\n    def f(self, step):\n        total = 0\n"
        + BODY_PY.replace("    ", "        "),
        "class A:\n    def f(self, step):\n        raise NotImplementedError\n",
    ),
    "docstring and a TODO": (
        "m.py",
        'def f(step):\n    """Sum."""\n    total = 0\n' + BODY_PY,
        'def f(step):\n    """Sum."""\n    # TODO: implement\n    return None\n',
    ),
    "throw new Error": (
        "m.js",
        "function f (step) {\n  let total = 0\n" + BODY_C + "  return total\n}\n",
        "function f (step) {\n  throw new Error('TODO')\n}\n",
    ),
    "TS method emptied": (
        "m.ts",
        "class A {\n  f(step: number): number {\n    let total = 0;\n"
        + BODY_C
        + "    return total;\n  }\n}\n",
        "class A {\n  f(step: number): number {\n    // TODO\n  }\n}\n",
    ),
    "Java UnsupportedOperationException": (
        "A.java",
        "class A {\n  int f(int step) {\n    int total = 0;\n"
        + BODY_C
        + "    return total;\n  }\n}\n",
        "class A {\n  int f(int step) {\n    throw new UnsupportedOperationException();\n  }\n}\n",
    ),
    "Go panic": (
        "m.go",
        "package m\n\nfunc F(step int) int {\n\ttotal := 0\n"
        + BODY_C.replace(";", "")
        + "\treturn total\n}\n",
        'package m\n\nfunc F(step int) int {\n\tpanic("not implemented")\n}\n',
    ),
    "Rust todo!": (
        "m.rs",
        "fn f(step: i64) -> i64 {\n    let mut total = 0;\n" + BODY_C + "    total\n}\n",
        "fn f(step: i64) -> i64 {\n    todo!()\n}\n",
    ),
    "C comment": (
        "m.c",
        "int f(int step) {\n    int total = 0;\n" + BODY_C + "    return total;\n}\n",
        "int f(int step) {\n    /* TODO */\n    return 0;\n}\n",
    ),
    "Ruby": (
        "m.rb",
        "def f(step)\n  total = 0\n"
        + BODY_PY.replace("    ", "  ").replace("return ", "")
        + "end\n",
        "def f(step)\n  raise NotImplementedError\nend\n",
    ),
    "Bash": (
        "m.sh",
        "f() {\n  local total=0\n"
        + "".join(f"  total=$((total + $1 * {i}))\n" for i in range(6))
        + '  echo "$total"\n}\n',
        "f() {\n  :  # TODO\n}\n",
    ),
}


@pytest.mark.parametrize("kind", sorted(STUBBED))
def test_an_implemented_body_replaced_by_a_stub_is_refused(kind: str) -> None:
    name, old, new = STUBBED[kind]
    assert stub_of(name, old, new) == "stub", kind
    found = gates.stub(old.encode(), new.encode(), CFG["stub"], name.encode())
    assert found is not None and found.details["lines_before"] >= 5
    assert "stub" in found.message and found.details["name"].endswith(("f", "F"))


ABC_OLD = "class Base:\n    def run(self, step):\n        total = 0\n" + BODY_PY.replace(
    "    ", "        "
)
LEGIT_STUBS = {
    # the body moved into a helper, and the method calls it
    "a call to a new helper": (
        "m.py",
        ABC_OLD,
        "class Base:\n    def run(self, step):\n        return _run(step)\n\n\n"
        "def _run(step):\n    total = 0\n" + BODY_PY,
    ),
    "made abstract": (
        "m.py",
        ABC_OLD,
        "from abc import ABC, abstractmethod\n\n\nclass Base(ABC):\n    @abstractmethod\n"
        "    def run(self, step):\n        raise NotImplementedError\n",
    ),
    "overloads added": (
        "m.py",
        "def f(step):\n    total = 0\n" + BODY_PY,
        "@overload\ndef f(step: int) -> int: ...\n@overload\ndef f(step: str) -> str: ...\n"
        "def f(step):\n    total = 0\n" + BODY_PY,
    ),
    "deleted": (
        "m.py",
        ABC_OLD + "    def keep(self):\n        return 1\n",
        "class Base:\n    def keep(self):\n        return 1\n",
    ),
    "a new stub": (
        "m.py",
        ABC_OLD,
        ABC_OLD + "\n    def later(self):\n        raise NotImplementedError\n",
    ),
    "says subclasses implement it": (
        "m.js",
        "class A {\n  run (step) {\n    let total = 0\n" + BODY_C + "    return total\n  }\n}\n",
        "class A {\n  run (step) {\n    throw new Error('not implemented: subclasses override run()')\n  }\n}\n",
    ),
    "Java made abstract": (
        "A.java",
        "class A {\n  int f(int step) {\n    int total = 0;\n"
        + BODY_C
        + "    return total;\n  }\n}\n",
        "abstract class A {\n  abstract int f(int step);\n}\n",
    ),
}


@pytest.mark.parametrize("kind", sorted(LEGIT_STUBS))
def test_stubs_by_design_and_moved_bodies_pass(kind: str) -> None:
    name, old, new = LEGIT_STUBS[kind]
    assert stub_of(name, old, new) is None, kind


def _wrap_stubbed() -> str:
    lines = WRAP.split("\n")
    start = lines.index("def dedent(text):")
    end = lines.index("def indent(text, prefix, predicate=None):")
    doc = next(i for i in range(start + 2, end) if lines[i].strip().endswith('"""'))
    return "\n".join(lines[: doc + 1] + ["    raise NotImplementedError", "", ""] + lines[end:])


@pytest.mark.parametrize("kept", [False, True], ids=["cold", "old parse kept"])
@pytest.mark.parametrize("kind", ["textwrap.dedent", *sorted(STUBBED), *sorted(LEGIT_STUBS)])
def test_the_stub_gate_judges_alike_whether_the_old_versions_parse_is_kept(
    kind: str, kept: bool
) -> None:
    # A file's last parse is kept (per path) so that its next commit parses only around
    # the edit; a body replaced by a stub lies inside its definition's body, and must be
    # judged with the definition around it (it once went unseen when the parse was kept).
    if kind == "textwrap.dedent":
        name, old, new, want = "textwrap.py", WRAP, _wrap_stubbed(), "stub"
    else:
        name, old, new = STUBBED.get(kind) or LEGIT_STUBS[kind]
        want = "stub" if kind in STUBBED else None
    path = f"kept-{kept}/{kind}/{name}".encode()
    if kept:
        parsers.parse_errors(path, old.encode())
    found = gates.stub(old.encode(), new.encode(), CFG["stub"], path)
    assert (found and found.gate) == want


FUNC_JS = (
    "function total (xs) {\n"
    + "".join(f"  const a{i} = xs[{i}] * {i + 1}\n" for i in range(8))
    + "  return a0 + a7\n}\n"
)
README = "# Tool\n\n## Linux\n\n" + "".join(
    f"Step {i}: run the installer with option {i}.\n\n" for i in range(9)
)


def test_text_written_twice_is_refused_in_any_format() -> None:
    src = "'use strict'\n\n" + FUNC_JS + "\nmodule.exports = { total }\n"
    twice = src.replace(FUNC_JS, FUNC_JS + "\n" + FUNC_JS)
    assert stub_of("m.js", src, twice) == "duplication"
    assert stub_of("m.js", src, src + src) == "duplication"
    assert stub_of("notes.txt", README, README + README) == "duplication"  # no format
    found = gates.duplication(
        README.encode(), (README + README).encode(), CFG["duplication"], b"README.md"
    )
    assert found is not None and found.details["held_before"] == 1
    lock = json.dumps(
        {
            "packages": {
                "node_modules/a": {
                    "version": "1",
                    "dependencies": {f"d{i}": f"^{i}.0.0" for i in range(9)},
                }
            }
        },
        indent=2,
    )
    lock += "\n"
    assert stub_of("package-lock.json", lock, lock + lock) == "duplication"


def test_repeated_structure_is_not_text_written_twice() -> None:
    # A test copied, renamed, one line changed: its body repeats under another header.
    test = "def test_a():\n" + "".join(f"    check(value_{i}, expected={i})\n" for i in range(10))
    copy = test.replace("test_a", "test_b").replace("expected=5", "expected=50")
    assert stub_of("test_m.py", test, test + "\n\n" + copy) is None
    # A README section repeated under another heading.
    again = README + README.replace("# Tool\n\n## Linux", "## macOS")
    assert stub_of("README.md", README, again) is None
    # A lockfile: the same package, nested under another one (its fields under a new key).
    entry = {
        "version": "1.2.3",
        "license": "MIT",
        "dependencies": {f"d{i}": f"^{i}.0.0" for i in range(9)},
    }
    lock = {"packages": {"node_modules/a": entry, "node_modules/b": {"version": "2"}}}
    more = {"packages": {**lock["packages"], "node_modules/b/node_modules/a": entry}}
    assert (
        stub_of("package-lock.json", json.dumps(lock, indent=2), json.dumps(more, indent=2)) is None
    )
    # A block the old file repeated already: one more of it is its structure.
    rows = "".join(f"    row({i}, 'a', 'b', 'c', 'd', 'e')  # same\n" for i in range(1))
    table = "ROWS = [\n" + (FUNC_JS.replace("function", "// fn") * 2) + rows + "]\n"
    assert (
        stub_of("t.js", table, table.replace("]\n", FUNC_JS.replace("function", "// fn") + "]\n"))
        is None
    )


# Setup that tests share, as real test suites repeat it (each line is distinct).
SETUP = "".join(f"    server{i} = make_server(port={8000 + i}, name='s{i}')\n" for i in range(9))


def test_lines_shared_by_different_blocks_are_not_text_written_twice() -> None:
    # A new test whose setup repeats another test's, in JavaScript and in Python.
    js_setup = SETUP.replace("    ", "\t").replace("\n", ";\n")
    one = "test('first', async t => {\n" + js_setup + "\tt.pass();\n});\n"
    two = one.replace("first", "second").replace("t.pass", "t.true")
    assert stub_of("test/a.ts", one, one + "\n" + two) is None
    # ...also when the test's name is on a line of its own (a formatter's wrapping).
    consts = SETUP.replace("    server", "    const server").replace(")\n", ");\n")
    wrapped = "test(\n  'first',\n  () => {\n    const a = 'first';\n" + consts
    wrapped += "    expect(a).toBe('first');\n  },\n);\n"
    again = wrapped.replace("first", "second")
    assert stub_of("test/b.test.js", wrapped, wrapped + "\n" + again) is None
    py = "def test_first():\n" + SETUP + "    assert server1\n"
    assert stub_of("test_a.py", py, py + "\n\n" + py.replace("first", "second")) is None
    # The same method in two classes (a method of the same name in each, too).
    cls = "class IntRange:\n    def convert(self, value):\n" + SETUP.replace("    ", "        ")
    other = cls.replace("IntRange", "FloatRange")
    assert stub_of("types.py", cls, cls + "\n\n" + other) is None
    # ...but a method written twice in its own class is text written twice.
    method = "    def convert(self, value):\n" + SETUP.replace("    ", "        ") + "\n"
    assert stub_of("types.py", cls, cls + "\n" + method) == "duplication"
    # Overloads repeat their signature; two functions' doc comments can be alike.
    params = "".join(f"    p{i}: int = {i},\n" for i in range(10))
    impl = "def f(\n" + params + ") -> int:\n    return p0\n"
    over = "@t.overload\ndef f(\n" + params + ") -> int: ...\n\n\n"
    assert stub_of("m.py", impl, over + impl) is None
    doc = "".join(f" * `opt{i}` is option number {i} of the call\n" for i in range(9))
    fn = "/**\n" + doc + " */\nfunction sendFile(path) {\n  return send(path);\n}\n"
    alias = fn.replace("sendFile", "sendfile").replace("send(path)", "sendFile(path)")
    fn = "'use strict'\n\n" + FUNC_JS + "\n" + fn
    assert stub_of("lib/response.js", fn, fn + "\n" + alias) is None


def test_docs_repeat_examples_and_skeletons_but_not_sections() -> None:
    # An example shown twice in reST; a changelog's empty subsections under a new version.
    example = "".join(f"    invoke(cli, args=['--opt{i}'])  # try {i}\n" for i in range(9))
    rst = "Intro\n=====\n\n.. click:run::\n\n" + example + "\nMore text.\n"
    assert stub_of("docs/a.rst", rst, rst + "\n.. click:run::\n\n" + example) is None
    subs = "".join(f"Kind {i} of change:\n^^^^^^^^^^^^^^^^^^\n\n*none*\n\n" for i in range(4))
    old = "Changelog\n=========\n\n1.0 (2017)\n----------\n\n" + subs
    new = old.replace(
        "1.0 (2017)", "2.0 (UNRELEASED)\n----------------\n\n" + subs + "\n1.0 (2017)"
    )
    assert stub_of("CHANGELOG.rst", old, new) is None
    # ...a section written twice, its heading and all, is text written twice.
    section = "## Usage\n\n" + "".join(
        f"Step {i}: run the tool with flag -{i}.\n" for i in range(9)
    )
    md = "# Tool\n\n" + section + "\n## License\n\nMIT\n"
    assert stub_of("README.md", md, md.replace("## License", section + "\n## License")) == (
        "duplication"
    )


def test_a_stub_is_refused_through_the_mount_and_allowed_on_purpose(mount: Mount) -> None:
    f = mount.path / "wrap.py"
    f.write_text(WRAP)
    stubbed = _wrap_stubbed()
    assert refused_by(mount, f, stubbed, WRAP) == {"stub"}
    env = envelope(mount)
    assert env["reason_hint"] == "stub" and env["details"]["name"] == "dedent"
    assert "dedent" in env["message"] and "stub" in env["message"]
    assert env["allow"]["command"] in env["message"]  # a deliberate change has a way
    twice = WRAP + WRAP
    assert refused_by(mount, f, twice, WRAP) == {"duplication"}
    assert envelope(mount)["reason_hint"] == "duplication"
    (mount.path / ".rw" / "ctl").write_text("allow wrap.py\n")
    assert write(f, stubbed) is None and f.read_text() == stubbed  # allowed, once
    (allowed,) = [e for e in events(mount, "write") if e.get("allowed")]
    assert [w["gate"] for w in allowed["allowed"]["waived"]] == ["stub"]


def _mocha(groups: int, tests: int, size: int = 4) -> str:
    """A mocha test file: one describe holding ``groups`` describes of ``tests`` tests,
    each of ``size`` lines and six more."""

    def test(g: int, t: int, ind: str) -> str:
        body = "".join(f"{ind}  var v{i} = thing.run({g}, {t}, {i});\n" for i in range(size))
        return (
            f"{ind}it('should work in case {g}.{t}', function(done){{\n"
            f"{ind}  var app = express();\n{body}"
            f"{ind}  request(app)\n{ind}  .get('/')\n{ind}  .expect(200, done);\n{ind}}})\n"
        )

    blocks = "\n".join(
        f"  describe('.part{g}()', function(){{\n"
        + "\n".join(test(g, t, "    ") for t in range(tests))
        + "  })\n"
        for g in range(groups)
    )
    head = "var express = require('../');\nvar thing = require('./thing');\n\n"
    return f"{head}describe('thing', function(){{\n{blocks}}})\n"


def test_the_last_tests_of_a_describe_deleted_are_no_cut() -> None:
    # The last two describes of the enclosing one deleted: the new text ends as the old
    # one did (its "})"), and describes are kept there: tests pruned.
    old = _mocha(4, 2)
    lines = old.split("\n")
    last = lines.index("  describe('.part2()', function(){")
    assert gated("test/thing.js", old, "\n".join(lines[: last - 1] + lines[-2:])) == []
    # The last test of a describe deleted, the closing lines of both describes kept.
    one = _mocha(1, 2, size=14)
    ls = one.split("\n")
    second = ls.index("    it('should work in case 0.1', function(done){")
    assert gated("test/thing.js", one, "\n".join(ls[: second - 1] + ls[-3:])) == []
    # Cut off there (the old end not kept), or inside a test with the old end written
    # after it: refused.
    assert "truncation" in gated("test/thing.js", old, "\n".join(lines[: last - 1]) + "\n")
    assert "truncation" in gated("test/thing.js", old, "\n".join(lines[: last + 3] + lines[-2:]))
    # Blocks of a callee with no call kept there (all of its family gone) are refused.
    other = old.replace("  describe('.part2", "  context('.part2").replace(
        "  describe('.part3", "  context('.part3"
    )
    os_ = other.split("\n")
    assert gated("test/thing.js", other, "\n".join(os_[: last - 1] + os_[-2:])) == ["truncation"]


def _module(n: int) -> str:
    """A CommonJS module: ``n`` functions assigned to ``exports``, of 15 lines each."""
    return "var path = require('path');\n\n" + "\n".join(
        f"/**\n * Helper {i}.\n */\n\nexports.helper{i} = function(value) {{\n"
        + "".join(f"  value = path.join(value, '{i}.{j}');\n" for j in range(8))
        + "  return value;\n};\n"
        for i in range(n)
    )


def test_the_last_definition_assigned_or_a_block_deleted_is_no_cut() -> None:
    # The last function assigned to exports deleted, with its comment.
    big = _module(1) + "\n/**\n * Mixin.\n */\n\nexports.mixin = function(a, b) {\n"
    big += "".join(f"  a['k{i}'] = b['k{i}'];\n" for i in range(30)) + "  return a;\n};\n"
    assert gated("lib/utils.js", big, _module(1)) == []
    # A block (a call given a function: deprecated stubs made in a loop) deleted.
    stubs = "".join(f"  'name{i}',\n" for i in range(24))
    loop = f"\n[\n{stubs}].forEach(function (name) {{\n  exports[name] = function () {{\n"
    loop += "    throw new Error(name + ' is gone');\n  };\n});\n"
    assert gated("lib/express.js", _module(2) + loop, _module(2)) == []
    # Cut off at a definition, three of them gone, or inside the last one: refused.
    many = _module(6)
    ms = many.split("\n")
    three = ms.index("exports.helper3 = function(value) {") - 4
    assert gated("lib/utils.js", many, "\n".join(ms[:three]) + "\n") == ["truncation"]
    assert "truncation" in gated("lib/utils.js", big, big[: big.index("  a['k9']")])


def test_a_deleted_definition_whose_strings_hold_brackets_is_no_cut() -> None:
    """A bracket inside a string or a comment of the deleted lines is not code: they are
    still one whole definition (the quick count of brackets strips strings and comments
    first; a pattern of the elision gate's had shadowed that one, and such deletions
    were refused)."""
    body = "".join(f"  const v{i} = {i};\n" for i in range(40))
    last = f'\nfunction report() {{\n  console.log("a {{ brace"); // and ( one\n{body}}}\n'
    assert gated("lib/report.js", _module(3) + last, _module(3)) == []
    # Cut inside it: refused as before.
    whole = _module(3) + last
    assert "truncation" in gated("lib/report.js", whole, whole[: whole.index("  const v9")])


def _esm(n: int) -> list[str]:
    """An ES module's functions, ``export``ed, of 12 lines each."""
    return [
        f"export function helper{i}(value) {{\n"
        + "".join(f"  value = join(value, '{i}.{j}');\n" for j in range(10))
        + "  return value;\n}\n"
        for i in range(n)
    ]


def test_an_exported_function_deleted_with_a_note_where_it_was_passes() -> None:
    # An exported definition is a definition (npm's ES modules: `export function`).
    parts = _esm(6)
    old = "import { join } from 'path';\n\n" + "\n".join(parts)
    note = "// the loop below runs 1..n\n"
    new = old.replace(parts[2], note)
    assert gated("lib/esm.js", old, new) == []
    assert gated("lib/esm.ts", old, new) == []
    # A placeholder where it was is still an elision.
    elided = old.replace(parts[2], "// ... rest of the helpers unchanged\n")
    assert "elision" in gated("lib/esm.js", old, elided)
    # The last one deleted: a deletion, not a cut.
    assert gated("lib/esm.js", old, old[: old.index(parts[-1])]) == []


def test_an_emptied_file_is_refused_and_says_so() -> None:
    from rwfs.checks import gates
    from rwfs.policy import Policy

    old = _module(3).encode()
    for new in (b"", b"\n", b"\n\n"):
        found = gates.truncation(old, new, Policy().gate("truncation", b"t.js"), b"t.js")
        assert found is not None and "is empty" in found.message, new
    # Docs cut to their title: refused too (a cut at a heading looks the same).
    doc = "API\n===\n\n" + "".join(f"Part {i}\n------\n\nText {i}.\n\n" for i in range(10))
    assert "truncation" in gated("docs/api.rst", doc, "API\n===\n")


def test_an_emptied_file_refusal_names_the_allowance(mount: Mount) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    assert refused_by(mount, f, "", REAL) == {"truncation"}
    env = envelope(mount)
    assert "is empty" in env["message"]
    assert env["allow"]["command"] == f"rwfs allow {mount.path}/decoder.py"
    assert env["allow"]["command"] in env["message"]


# ---- elision on real version history: what maintainers do that is no elision ----


def test_an_ellipsis_the_old_file_had_as_a_stub_or_a_yaml_document_end_is_kept() -> None:
    stubs = "".join(
        f"    @overload\n    def main(\n        self,\n        args: None = None,\n"
        f"    ) -> {r}:\n        ...\n\n"
        for r in ("NoReturn", "int")
    )
    steps = "".join(f"        total += self.step({i})\n" for i in range(12))
    main = (
        "    def main(self, args=None):\n        total = 0\n" + steps + "        return total\n\n"
    )
    kept = "".join(f"    def kept_{i}(self):\n        return {i}\n\n" for i in range(6))
    gone = "".join(f"    def gone_{i}(self):\n        return -{i}\n\n" for i in range(6))
    old = "class Command:\n" + stubs + main + kept + gone
    # The method moved below others, its stubs with it, where other methods were: the
    # "..." is the old stubs'.
    short = "    def main(self, args=None):\n        return sum(self.steps())\n"
    assert gated("cmd.py", old, "class Command:\n" + kept + stubs + short) == []
    # ... while "..." as the body of a method whose head the old file had over code is
    # code left out.
    elided = "    def main(self, args=None):\n        ...\n\n"
    assert "elision" in gated("cmd.py", old, "class Command:\n" + stubs + elided + kept + gone)
    # YAML: a document end marker after keys replaced; an entry "..." where keys were.
    steps = "".join(f"      - name: step {i}\n        run: make step-{i}\n" for i in range(8))
    yml = f"name: ci\non: [push]\njobs:\n  test:\n    steps:\n{steps}"
    ended = (
        "---\nname: ci\non: [push]\njobs:\n  test:\n    steps:\n      - uses: one/action@v1\n...\n"
    )
    assert gated("ci.yml", yml, ended) == []
    keys = "".join(f"key_{i}:\n  value: {i}\n" for i in range(12))
    middle = keys.split("key_2:")[0] + "...\n" + "key_11:" + keys.split("key_11:")[1]
    assert "elision" in gated("c.yaml", keys, middle)


def test_a_comment_kept_reworded_or_over_kept_code_is_no_stand_in() -> None:
    branch = "".join(f"        out.append(legacy_{i}(value))\n" for i in range(10))
    others = "".join(f"def other_{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
    old = others + (
        "import sys\n\n\ndef convert(value):\n    out = []\n"
        "    # On the old runtime, convert each value the legacy way first.\n"
        "    if sys.version_info[0] == 2:\n" + branch + "        return out\n\n"
        "    # And in any case, convert each value the new way.\n"
        "    out.append(modern(value))\n    return out\n"
    )
    head, tail = old.split("    # On the old runtime")[0], old.split("    out.append(modern")[1]
    # The old runtime's branch deleted, the comment that stays reworded.
    reworded = head + "    # convert each value the new way.\n    out.append(modern" + tail
    assert gated("convert.py", old, reworded) == []
    # ... while a comment in other words there stands for the branch.
    for words in ("# as in the current version", "# come nella versione attuale"):
        elided = head + f"    {words}\n\n    out.append(modern" + tail
        assert gated("convert.py", old, elided) == ["elision"], words
        elided = head + f"    {words}\n    return out\n"
        assert gated("convert.py", old, elided) == ["elision"], words
    # A JS function's helpers replaced by a call, a new comment over the code that stays,
    # where the old file had one.
    helpers = "".join(
        f"  function on{i}(err) {{\n    if (done) return;\n    done = true;\n    next(err);\n  }}\n\n"
        for i in range(4)
    )
    js = "".join(f"exports.f{i} = function (x) {{\n  return x + {i};\n}};\n\n" for i in range(8))
    js += (
        "res.send = function send(path, fn) {\n  var done;\n  var next = this.req.next;\n\n"
        + helpers
        + "  // transfer\n  var file = open(path);\n  file.pipe(this);\n};\n"
    )
    top, rest = js.split(helpers)
    again = top + "  // create the file stream\n  var file = open(path);\n  file.pipe(this);\n};\n"
    assert gated("res.js", js, again) == []
    # ... while a comment where the old file had code above the line that stays is one.
    plain = js.replace("  // transfer\n", "")
    assert gated("res.js", plain, again.replace("the file stream", "wie bisher")) == ["elision"]


def test_a_rest_comment_between_whole_sections_is_no_stand_in() -> None:
    sections = "".join(
        f"{v}.0.0\n------\n\nChanges:\n\n"
        + "".join(f"- change {v}.{i}\n" for i in range(10))
        + "\n\n"
        for v in (9, 8, 7, 6)
    )
    old = "Changelog\n=========\n\nIntroduction.\n\n\n" + sections
    first = sections.split("8.0.0")[0]
    rest = sections[len(first) :]
    # The unreleased section, now a marker where a tool writes the next one.
    marker = "Changelog\n=========\n\nIntroduction.\n\n.. release notes start\n\n\n" + rest
    assert gated("CHANGELOG.rst", old, marker) == []
    # ... but not one indented (in a block: a code block's, a quotation's), ...
    indented = marker.replace(".. release notes start", "  .. release notes start")
    assert gated("CHANGELOG.rst", old, indented) == ["elision"]
    # ... nor one where part of a section was (not whole sections): those stand for it.
    lines = old.split("\n")
    cut = lines[:9] + ["..  wie bisher"] + lines[21:]
    assert gated("CHANGELOG.rst", old, "\n".join(cut)) == ["elision"]


def test_most_of_a_file_moved_out_is_a_deletion_and_a_fragment_is_not() -> None:
    helpers = "".join(
        f"def helper_{i}(x):\n    y = x * {i}\n    return y + {i}\n\n\n" for i in range(2)
    )
    moved = "".join(
        f"def strategy_{i}(draw):\n    value = draw({i})\n    return value\n\n\n" for i in range(14)
    )
    old = "import os\nfrom strategies import draw\n\n\n" + helpers + moved
    kept = "import os\n\n\n" + helpers.replace("return y", "return os.sep and y")
    # Most of the file moved to another module: the rest whole, its layout kept.
    old = old.replace("return y", "return os.sep and y")
    assert gated("utils.py", old, kept) == []
    # ... while the same lines glued together, or a kept line that uses what was cut, or
    # imports alone that nothing uses, are a fragment.
    glued = kept.replace("\n\n\n", "\n")
    assert gated("utils.py", old, glued) == ["elision"]
    aliases = "import os\nimport sys\n\n# aliases\nA = os.sep\nB = sys.argv\n\n\n" + moved
    assert gated("utils.py", aliases, "import os\nimport sys\nA = os.sep\nB = sys.argv\n") == [
        "elision"
    ]  # glued where the changed lines begin
    assert gated("utils.py", aliases, "import os\nimport sys\n\nA = os.sep\nB = sys.argv\n") == []
    uses = old.replace("def strategy_9(", "REGISTRY = {}\n\n\ndef strategy_9(")
    uses = uses.replace("return os.sep and y", "return REGISTRY and y")
    assert gated(
        "utils.py", uses, kept.replace("return os.sep and y", "return REGISTRY and y")
    ) == ["elision"]
    assert gated("utils.py", old, "import os\nfrom strategies import draw\n") != []
    # A C header's guard: its "#endif" kept and its "#ifndef" cut is a fragment.
    decls = "".join(f"int call_{i}(int x);\n" for i in range(20))
    header = f"/* api.h */\n#ifndef API_H\n#define API_H\n\n{decls}#endif /* API_H */\n"
    assert gated("api.h", header, "/* api.h */\n#endif /* API_H */\n") == ["elision"]
    # A block's last tests deleted, its closer now under the test kept: a deletion.
    its = "".join(
        f"  it('case {i}', function () {{\n    var x = run({i});\n    check(x);\n  }})\n  \n"
        for i in range(12)
    )
    spec = "var run = require('./run');\n\ndescribe('run', function () {\n" + its + "})\n"
    first = spec.split("\n  \n")[0] + "\n})\n"
    assert "elision" not in gated("run.js", spec, first)
    # ... and so is a licence's last line glued to what was kept (a seam less indented).
    lic = "/* Licence terms,\n   more terms.  */\n\n"
    nested = lic + header.replace(
        "#endif /* API_H */", "#if defined X\n# include <x.h>\n#endif\n#endif"
    )
    kept_c = "/* Licence terms,\n   more terms.  */\n#if defined X\n# include <x.h>\n#endif\n"
    assert gated("api.h", nested, kept_c) == ["elision"]


def test_an_example_written_anew_in_docs_may_abbreviate_with_an_ellipsis() -> None:
    head = "Streaming\n=========\n\nSome words about streaming, and more.\n\n"
    old_example = "".join(f"    line_{i} = old_call({i})\n" for i in range(12))
    tail = "\nMore prose after the example, kept as it was.\n" * 3
    old = head + "Like this::\n\n" + old_example + tail
    # The section rewritten: a new example that abbreviates itself with "...".
    new_example = "".join(f"    step_{i} = stream_template({i})\n" for i in range(6))
    new = head + "Flask now provides helpers::\n\n" + new_example + "    ...\n" + new_example
    assert gated("docs/streaming.rst", old, new + tail) == []
    # ...while "..." standing alone where the example was is still an elision.
    assert gated("docs/streaming.rst", old, head + "Like this::\n\n    ...\n" + tail) == ["elision"]


def test_a_tool_directive_or_a_string_argument_is_no_stand_in() -> None:
    # A branch folded into one raise: the message's middle string, reworded, continues
    # the call (its neighbours are strings too), it stands for nothing.
    old = (
        "def register(self, app, name):\n    if name in app.blueprints:\n"
        '        existing = f" {name}"\n\n        if app.blueprints[name] is not self:\n'
        "            raise ValueError(\n"
        '                f"The name {name} is already registered for"\n'
        "                f\" a different blueprint{existing}. Use 'name='\"\n"
        '                " to provide a unique name."\n            )\n        else:\n'
        "            import warnings\n\n            warnings.warn(\n"
        '                f"The name {name} is already registered for"\n'
        "                f\" this blueprint{existing}. Use 'name=' to\"\n"
        '                f" provide a unique name. This will become an error"\n'
        '                " in a later version.",\n                stacklevel=4,\n'
        "            )\n\n    app.blueprints[name] = self\n"
    )
    new = (
        "def register(self, app, name):\n    if name in app.blueprints:\n"
        '        desc = "this" if app.blueprints[name] is self else "a different"\n'
        '        existing = f" {name}"\n\n        raise ValueError(\n'
        '            f"The name {name} is already registered for"\n'
        "            f\" {desc} blueprint{existing}. Use 'name=' to\"\n"
        '            f" provide a unique name."\n        )\n\n    app.blueprints[name] = self\n'
    )
    assert gated("bp.py", old, new) == []
    # A linter's directive over a new import, where most of a module moved out.
    types = "".join(f"export type Option{i} = 'json' | 'text' | 'buffer{i}';\n" for i in range(40))
    tail = "".join(f"export const v{i} = {i};\n" for i in range(6))
    ts_old = "import * as P from 'p-cancelable';\n" + types + tail
    ts_new = (
        "import * as P from 'p-cancelable';\n// eslint-disable-next-line import/no-duplicates\n"
    )
    assert gated("types.ts", ts_old, ts_new + "import type Request from '../core';\n" + tail) == []
    # ...while the same places hold a note, they are refused.
    assert "elision" in gated("types.ts", ts_old, ts_new.replace("eslint", "rest as") + tail)
    note = (
        new.split("        raise")[0] + '        "as it was"\n\n    app.blueprints[name] = self\n'
    )
    assert "elision" in gated("bp.py", old, note)


def test_jsonc_files_take_comments_and_trailing_commas() -> None:
    old = '{\n  "compilerOptions": {\n    "target": "es2016"\n  },\n  "include": ["source"]\n}\n'
    new = old.replace(
        '"es2016"', '"es2017",\n    // TODO: drop when converted\n    "allowJs": true,'
    )
    for name in ("tsconfig.json", "web/tsconfig.build.json", ".vscode/settings.json", "a.jsonc"):
        assert gated(name, old, new) == [], name
    assert gated("package.json", old, new) == ["syntax"]  # plain JSON has no comments
    assert gated("tsconfig.json", old, new.replace('"allowJs": true', '"allowJs":')) == ["syntax"]
