"""The gates on a corpus of real files (tests/gate_corpus.py): failure variants made the
way model output breaks are refused, legitimate edits pass (issue 15's targets: at least
95% of each kind of failure refused, at most 1% of each kind of legitimate edit).

In-process: ``rwfs.checks.gates.check`` on bytes, a fixed seed and a bounded sample of the files
this machine has. Sources that are absent are left out; the standard library is always
there, so the test never skips.
"""

from __future__ import annotations

import pytest
from gate_corpus import (
    DOTTED,
    PHRASINGS,
    SYNTAXES,
    Case,
    Results,
    corpus,
    evaluate,
    refused,
    sample,
    table,
)

from rwfs.checks import gates, placeholders

SEED, PER_GROUP = 15, 20
FAILURES = {
    "cut + newline",
    "cut + blank line",
    "cut + trailing spaces",
    "cut + CRLF",
    "cut + closing token",
    "placeholder #",
    'placeholder """"""',
    "bare ... over a body",
    "def ...:  # unchanged",
    "90% of lines dropped",
    "new code + placeholder",
}
LEGIT = {
    "delete a function",
    "add a function",
    "rename",
    "reformat (reindent)",
    "comment with dots",
    "protocol stub with ...",
    "doctest with ...",
    "CRLF conversion",
    "rewrite entirely",
    "append",
    "small edit",
}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return corpus(SEED, PER_GROUP)


@pytest.fixture(scope="module")
def results(cases: list[Case]) -> Results:
    return evaluate(cases)


def _wrong(found: list[Case]) -> list[str]:
    return [f"{c.kind}: {c.source}: {refused(c)}" for c in found[:5]]


def test_the_corpus_has_every_kind(cases: list[Case]) -> None:
    groups = {g for g, _, _ in sample(SEED, PER_GROUP)}
    assert "stdlib" in groups  # the standard library is always there
    kinds = {(c.bad, c.kind) for c in cases}
    assert {(True, k) for k in FAILURES} <= kinds
    assert {(False, k) for k in LEGIT} <= kinds
    if "javascript" in groups:  # npm's sources, where installed
        assert {(True, "placeholder //"), (True, "placeholder /* */")} <= kinds


def test_failure_variants_are_refused(
    results: Results,
) -> None:
    print("\n" + table(results))
    low = {
        kind: (r, n, _wrong(wrong))
        for (bad, kind), (n, r, wrong, _) in results.items()
        if bad and r < 0.95 * n
    }
    assert low == {}
    n = sum(n for (bad, _), (n, _, _, _) in results.items() if bad)
    r = sum(r for (bad, _), (_, r, _, _) in results.items() if bad)
    assert r >= 0.95 * n


def test_legitimate_edits_pass(
    results: Results,
) -> None:
    high = {
        kind: (r, n, _wrong(wrong))
        for (bad, kind), (n, r, wrong, _) in results.items()
        if not bad and r > 0.01 * n
    }
    assert high == {}


@pytest.mark.parametrize("syntax", sorted({s for ss in SYNTAXES.values() for s in ss}))
def test_every_phrasing_in_every_comment_syntax_is_a_placeholder(syntax: str) -> None:
    for phrase in PHRASINGS:
        line = syntax.format(phrase).encode()
        assert placeholders.marker(line) >= placeholders.WEAK, line


def test_ordinary_comments_and_code_with_dots_are_not_placeholders() -> None:
    for syntax in ("# {}", "// {}", "/* {} */", "<!-- {} -->"):
        for text in DOTTED:
            line = syntax.format(text).encode()
            assert placeholders.marker(line) < placeholders.WEAK, line
    for line in (
        b"def f(self) -> int: ...",
        b"x = y[..., 0]",
        b"return foo(...)",
        b"...options,",
        b"]: ...",
        b"print('rest of the file')",
        b"rest_of_file = unchanged",
        b"# Other helper functions",
        b"// More tests",
        b"# Deprecated helpers removed",
    ):
        assert placeholders.marker(line) < placeholders.WEAK, line


def _module(body: str) -> str:
    helpers = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(40))
    return (
        '"""A module.\n\n>>> f(1,\n...   2)\n3\n"""\n\n\n'
        + helpers
        + "def f(a, b):\n"
        + body
        + "\n\ndef g():\n    return helper_1(2)\n"
    )


BODY = "".join(f"    a = a + b * {i}\n" for i in range(14)) + "    return a\n"


@pytest.mark.parametrize("rename", [False, True])
def test_an_ellipsis_the_old_file_also_had_still_stands_for_code(rename: bool) -> None:
    # The old file has a "..." line (a doctest's); the new one's "..." is a new one, also
    # when the edit's changed span is long (a rename throughout the file).
    old = _module(BODY).encode()
    new = _module("    ...\n")
    if rename:
        new = new.replace("helper_", "aide_")
    cfg = {"min_lines": 10, "mass_ratio": 0.5, "cut_ratio": 0.8}
    found = gates.elision(old, new.encode(), cfg, b"m.py")
    assert found is not None and found.details["signal"] == "ellipsis", found
    # A "..." in a docstring is not one, even where the body was.
    doc = _module('    """Sum.\n\n    >>> f(1, 2)\n    ...\n    """\n    return a\n')
    assert gates.elision(old, doc.encode(), cfg, b"m.py") is None


def test_docstrings_are_told_from_code() -> None:
    src = (
        b'x = 1\ns = """a\n...\n"""\nt = r\'"""\'\nu = 2  # """\n'
        b'def f():\n    """doc\n    ...\n    """\n    ...\n'
    )
    lines = src.split(b"\n")
    inside = [
        placeholders.in_docstring(src, sum(len(x) + 1 for x in lines[:i]))
        for i in range(len(lines))
    ]
    at = {i for i, flag in enumerate(inside) if flag}
    assert {2, 8} <= at and not at & {0, 1, 4, 5, 6, 7, 10}
