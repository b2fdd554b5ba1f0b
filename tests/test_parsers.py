"""The syntax gate's quick reparses must answer exactly what a full parse answers.

Each format keeps something of a path's last parse (a tree-sitter tree, or an outline of
blocks) and parses the next version only around the edit. These property tests drive
random edit sessions over realistic files and compare, at every step, the quick answer
(``parse(new, path, previous)``) with a fresh full parse of the same bytes. Blocks are
kept whatever their size here (``MIN_BLOCK = 0``), so that nested blocks are exercised
in small files, and each test checks that the quick path was really taken.
"""

from __future__ import annotations

import inspect
import json
import random
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rwfs.checks import outlines, parsers


@pytest.fixture
def every_block(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Keep blocks of any size, and count the reparses that did not need a full parse."""
    monkeypatch.setattr(outlines, "MIN_BLOCK", 0)
    counts = {"quick": 0, "steps": 0}
    real = parsers._reparse

    def counted(*args: Any) -> Any:
        out = real(*args)
        counts["quick"] += out is not None
        return out

    monkeypatch.setattr(parsers, "_reparse", counted)
    yield counts


PYTHON = {
    b"decoder.py": inspect.getsource(json.decoder).encode(),
    b"textwrap.py": inspect.getsource(textwrap).encode(),
}
PY_SNIPPETS = [
    b"x = 1\n",
    b"def f(a):\n",
    b"    return a\n",
    b"class C:\n",
    b"    pass\n",
    b"else:\n",
    b"elif y:\n",
    b"try:\n",
    b"except E:\n",
    b"@decorator\n",
    b"if z:\n",
    b"    if w:\n",
    b"        pass\n",
    b'"""\n',
    b"s = (1,\n",
    b")\n",
    b"t = 2 + \\\n",
    b"# comment\n",
    b"\tq = 3\n",
    b"\n",
]

YAML = b"""\
# a deployment, with what YAML files hold
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
  annotations:
    note: |
      a block scalar
        with more indent

    other: >-
      folded
spec:
  replicas: 3
  template:
    spec:
      containers:
        - name: web
          image: "nginx:1.25"
          ports:
            - containerPort: 80
            - containerPort: 443
          env:
          - name: A
            value: "1"
          - name: B
            value: &b two
        - name: side
          args: [a, b,
            c]
        -
          name: third
  anchors:
    base: &base
      x: 1
    derived:
      <<: *base
      y: 2
list:
- one
- - nested
  - seq
- key: value
  other: value
"""
YAML_SNIPPETS = [
    b"- item\n",
    b"key: value\n",
    b"  nested:\n",
    b"    deeper: 1\n",
    b"  - entry\n",
    b"note: |\n",
    b"  text\n",
    b"flow: [1,\n",
    b"]\n",
    b"'open quote\n",
    b"---\n",
    b"...\n",
    b"? complex\n",
    b": value\n",
    b"# comment\n",
    b"\n",
    b"\tkey: tab\n",
    b"&a anchor: 1\n",
]

BASH = b"""\
#!/usr/bin/env bash
set -euo pipefail

log() {
  echo "[$(date +%T)] $*" >&2
}

usage() {
  cat <<EOF
usage: $0 [-v] FILE...
  -v  verbose
EOF
}

while getopts v opt; do
  case $opt in
    v) VERBOSE=1 ;;
    *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

for f in "$@"; do
  if [[ -f $f ]]; then
    log "checking $f"
    grep -c pattern "$f" \\
      | tee -a counts.txt
  else
    log "missing $f"
  fi
done

files=(a b "c d")
echo "${files[@]}" | tr ' ' '\\n' > list.txt
"""
BASH_SNIPPETS = [
    b"echo hi\n",
    b"if true; then\n",
    b"fi\n",
    b"done\n",
    b"for x in a b; do\n",
    b"cat <<EOF\n",
    b"EOF\n",
    b"f() {\n",
    b"}\n",
    b'echo "open\n',
    b"echo a \\\n",
    b"case $x in\n",
    b"esac\n",
    b"# comment\n",
    b"  ls | wc -l\n",
    b"\n",
]


def _line_edits(snippets: list[bytes]) -> Any:
    """Edits of whole lines: (where, what, snippet, indent) applied by ``_apply``."""
    return st.lists(
        st.tuples(
            st.floats(0, 1),
            st.sampled_from(["insert", "delete", "duplicate", "indent", "dedent", "replace"]),
            st.sampled_from(snippets),
            st.sampled_from([b"", b"  ", b"    ", b"        "]),
        ),
        min_size=1,
        max_size=6,
    )


def _apply(data: bytes, edit: tuple[float, str, bytes, bytes]) -> bytes:
    where, what, snippet, indent = edit
    lines = data.splitlines(keepends=True)
    i = min(int(where * len(lines)), len(lines) - 1) if lines else 0
    if what == "insert" or not lines:
        lines.insert(i, indent + snippet)
    elif what == "delete":
        del lines[i]
    elif what == "duplicate":
        lines.insert(i, lines[i])
    elif what == "indent":
        lines[i] = b"  " + lines[i]
    elif what == "dedent":
        lines[i] = lines[i][2:] if lines[i].startswith(b"  ") else lines[i]
    else:
        lines[i] = indent + snippet
    return b"".join(lines)


def _session(lang: str, path: bytes, data: bytes, edits: list[Any], counts: dict[str, int]) -> None:
    parse = parsers.PARSERS[lang]
    assert parse(data, path) is None, "the sample must parse"
    for edit in edits:
        new = _apply(data, edit)
        quick = parse(new, path, data)
        assert quick == parse(new), (lang, data, new)
        counts["steps"] += 1
        if quick is None:
            data = new  # the next edit starts from the version that parsed


SESSIONS = {
    "python": [(path, data, PY_SNIPPETS) for path, data in PYTHON.items()],
    "yaml": [(b"deploy.yaml", YAML, YAML_SNIPPETS)],
    "bash": [(b"run.sh", BASH, BASH_SNIPPETS)],
}


@pytest.mark.parametrize("lang", sorted(SESSIONS))
def test_quick_reparse_agrees_with_a_full_parse(lang: str, every_block: dict[str, int]) -> None:
    samples = SESSIONS[lang]

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        path, text, snippets = data.draw(st.sampled_from(samples))
        _session(lang, path, text, data.draw(_line_edits(snippets)), every_block)

    check()
    assert every_block["quick"] > every_block["steps"] // 5, every_block


def test_nested_blocks_bound_the_reparse(monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit inside one method of a large class reparses that method's entries, not the
    class: the piece handed to the parser is small."""
    methods = "".join(
        f"    def m{i}(self, x):\n        y = x + {i}\n        return y * 2\n\n" for i in range(400)
    )
    old = ("import os\n\n\nclass Big:\n" + methods).encode()
    assert len(old) > 20_000
    new = old.replace(b"x + 200\n", b"x + 201\n")
    seen: list[int] = []
    real = outlines.PythonOutline.piece

    def spy(self: Any, block: Any, text: bytes) -> Any:
        seen.append(len(text))
        return real(self, block, text)

    monkeypatch.setattr(outlines.PythonOutline, "piece", spy)
    parse = parsers.PARSERS["python"]
    assert parse(old, b"big.py") is None
    assert parse(new, b"big.py", old) is None
    assert seen and max(seen) < 200, seen
    # ... and a break inside it is still found, at the right line, by the full parse.
    broken = new.replace(b"return y * 2\n", b"return (y * 2\n", 1)
    assert parse(broken, b"big.py", new) == parse(broken)
    assert parse(broken) is not None


_TS_SAMPLES = {
    b"a.js": b"export function f(xs) {\n  return xs.map((x) => x * 2);\n}\nconst y = [1, 2];\n",
    b"a.rs": b"pub fn f(x: i64) -> i64 {\n    x * 2\n}\nfn g() { let v = vec![1, 2]; }\n",
    b"a.c": b"static int f(int x) {\n    return x * 2;\n}\nint y[] = {1, 2};\n",
    b"a.rb": b"def f(x)\n  x * 2\nend\nY = [1, 2]\n",
}


def test_incremental_tree_sitter_parse_agrees_with_a_full_parse() -> None:
    """Each version is parsed from the previous one's tree (kept per path); the result
    must be what a fresh parse of the same bytes gives, whatever the edit."""
    edits = st.lists(
        st.tuples(
            st.floats(0, 1),
            st.integers(0, 6),
            st.sampled_from([b"", b"}", b"{", b"(", b")", b"\n", b"x", b"end\n", b";", b"  "]),
        ),
        min_size=1,
        max_size=8,
    )

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(sorted(_TS_SAMPLES)), edits)
    def check(path: bytes, steps: list[tuple[float, int, bytes]]) -> None:
        data = _TS_SAMPLES[path]
        parse = parsers.PARSERS[parsers.language(path) or ""]
        parse(data, path, None)  # the first version: a full parse, its tree kept
        for where, cut, insert in steps:
            at = int(where * len(data))
            new = data[:at] + insert + data[at + cut :]
            assert parse(new, path, data) == parse(new), (path, data, new)
            parse(new, path, None)  # keep the tree of ``new`` for the next step
            data = new

    check()


def test_toml_refusals_are_tomllib_s() -> None:
    """TOML is read by rtoml first, but only tomllib may refuse a file: its message and
    line are the ones reported."""
    parse = parsers.PARSERS["toml"]
    good = b'[tool.x]\nname = "a"\nitems = [1, 2]\n'
    assert parse(good) is None
    line, message = parse(good + b"[tool.x]\nother = 1\n") or (0, "")
    assert (line, "twice" in message) == (4, True), (line, message)
    assert parse(b'a = "unterminated\n') is not None
    rng = random.Random(7)
    for _ in range(50):  # random cuts of a valid file: both parsers agree on each
        cut = rng.randrange(len(good))
        assert (parse(good[:cut]) is None) == _tomllib_ok(good[:cut]), good[:cut]


def _tomllib_ok(data: bytes) -> bool:
    import tomllib

    try:
        tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False
    return True


def test_kept_parses_outlast_a_checkout_and_are_bounded_by_their_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A branch switch rewrites hundreds of files, then the switch back rewrites them
    again: each path's parse must still be kept for the second to be quick. What is kept
    is bounded by its estimated memory, a tree-sitter tree weighing far more than an
    outline, the least recently parsed going first."""
    kept = parsers._Kept()
    monkeypatch.setattr(parsers, "_kept", kept)
    monkeypatch.setattr(parsers, "_reparse", lambda *a: pytest.fail("no quick reparse"))
    body = b"".join(b"def f%d(x):\n    return x + %d\n\n" % (i, i) for i in range(40))
    paths = [b"pkg/m%d.py" % i for i in range(600)]
    parse = parsers.PARSERS["python"]
    for p in paths:  # the first switch: every file parsed in full
        assert parse(body + p, p, b"x = 1\n") is None
    assert all(kept.get(("python", p), body + p) is not None for p in paths)

    monkeypatch.setattr(parsers, "_KEEP_TOTAL", 100 * len(body) * parsers.TREE_COST)
    src = b"function f(x) {\n  return x * 2;\n}\n" * 40
    for i in range(150):
        assert parsers.PARSERS["javascript"](src, b"w/a%d.js" % i) is None
    assert kept._bytes <= parsers._KEEP_TOTAL
    trees = [i for i in range(150) if kept.get(("javascript", b"w/a%d.js" % i), src) is not None]
    # Trees of 1.3 KB at 30 bytes a byte: about 100 fit with nothing else, the newest.
    assert 60 <= len(trees) < 150 and trees == list(range(150 - len(trees), 150)), trees
    assert kept.get(("python", paths[0]), body + paths[0]) is None  # the oldest went first
