"""A corpus for the gates: real files on this machine, broken the way model output breaks
them, and edited the way people and tools legitimately edit them.

Sources (each one skipped when absent): the Python standard library (under
``sys.base_prefix``), the packages of this environment's site-packages (``.py`` and
``.pyi``), npm's own JavaScript and Markdown (``/usr/lib/node_modules``,
``/usr/share/nodejs``) and C headers (``/usr/include``). ``corpus(seed, per_group)`` draws
a fixed sample of files and makes every variant of each: a list of ``Case``, each a
failure variant (``bad``: the gates should refuse it) or a legitimate edit (they should
let it through). ``evaluate`` runs ``rwfs.checks.gates.check`` on each with the default policy.
Used by tests/test_gate_corpus.py and by ``scripts/bench gates``.
"""

from __future__ import annotations

import ast
import random
import re
import sys
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rwfs.checks import gates, parsers
from rwfs.policy import Policy


@dataclass(frozen=True)
class Case:
    kind: str  # the variant's kind: a row of the report
    bad: bool  # a failure variant (to be refused), else a legitimate edit
    name: str  # the file's name as gated: its suffix gives the format
    old: bytes
    new: bytes
    source: str  # the real file it was made from


# The placeholder phrasings models write where they leave code out, each written below in
# every comment syntax of the file's format.
PHRASINGS = (
    "... (code omitted for brevity) ...",
    "[snip]",
    "No changes below this line",
    "<previous code here>",
    "... rest of module unchanged ...",
    "rest of the file",
    "... existing code ...",
    "remains the same",
    "same as before",
    "unchanged",
    "omitted",
    "truncated",
    "etc.",
    "... rest of the code unchanged ...",
    "(unchanged)",
    "Rest of the class remains unchanged",
    "... other methods ...",
    "keep existing imports",
    "... 120 more lines ...",
    "[rest of code remains the same]",
    "Implementation unchanged",
    "... previous implementation ...",
    "The rest of the file stays the same",
    "existing tests unchanged",
    "...",
    "…",
    "[...]",
)
SYNTAXES = {
    "python": ("# {}", '"""{}"""'),
    "javascript": ("// {}", "/* {} */", "{{/* {} */}}"),
    "c": ("// {}", "/* {} */"),
    "text": ("<!-- {} -->", "-- {}", "; {}", "# {}"),
}
# Legitimate comments with dots in them (and Ellipsis in code), never placeholders.
DOTTED = (
    "see ... for details",
    "wait for it...",
    "TODO: handle this... later",
    "x[..., 0] picks the first column",
    "the loop below runs 1..n",
    "Note: the rest of this module handles parsing.",
    "unchanged behaviour for old callers, see the changelog",
    "formats: json, yaml, toml, etc. are read by load()",
)
CLOSERS = {"python": ")", "javascript": "}", "c": "}", "text": "end"}
GROUPS = ("stdlib", "site-packages", "pyi", "javascript", "c", "text")
_MIN_LINES, _MAX_BYTES = 80, 60_000


def _sources() -> dict[str, list[Path]]:
    """Candidate files per group: whatever of them exists on this machine."""
    out: dict[str, list[Path]] = {g: [] for g in GROUPS}
    base = Path(sys.base_prefix) / "lib"
    for lib in sorted(base.glob("python3.*")):
        out["stdlib"] += [
            p
            for p in sorted(lib.glob("**/*.py"))
            if not any(x in p.parts for x in ("site-packages", "test", "tests", "idle_test"))
        ]
    site = Path(sysconfig.get_paths()["purelib"])
    if site.is_dir():
        out["site-packages"] = sorted(site.glob("**/*.py"))
        out["pyi"] = sorted(site.glob("**/*.pyi"))
    for root in (Path("/usr/lib/node_modules"), Path("/usr/share/nodejs")):
        if root.is_dir():
            out["javascript"] += sorted(root.glob("**/*.js"))
            out["text"] += sorted(root.glob("**/*.md"))
    if Path("/usr/include").is_dir():
        out["c"] = sorted(Path("/usr/include").glob("*.h"))
    return out


def _language(group: str) -> str:
    return {"stdlib": "python", "site-packages": "python", "pyi": "python"}.get(group, group)


def _name(group: str) -> str:
    return {"pyi": "m.pyi", "javascript": "m.js", "c": "m.h", "text": "m.md"}.get(group, "m.py")


def _usable(name: str, data: bytes) -> bool:
    if not (_MIN_LINES <= data.count(b"\n") and len(data) <= _MAX_BYTES):
        return False
    if b"\r" in data or b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not parsers.parse_errors(name.encode(), data)[1]


def sample(seed: int, per_group: int) -> list[tuple[str, Path, bytes]]:
    """``per_group`` usable files of each group, drawn with ``seed``."""
    rng = random.Random(seed)
    out = []
    for group, paths in _sources().items():
        paths = list(paths)
        rng.shuffle(paths)
        taken = 0
        for p in paths:
            if taken == per_group:
                break
            try:
                data = p.read_bytes()
            except OSError:
                continue
            if _usable(_name(group), data):
                out.append((group, p, data))
                taken += 1
    return out


# ---- where the functions are ----


@dataclass(frozen=True)
class Func:
    start: int  # first line (0-based; decorators included)
    body: int  # first line of the body
    end: int  # one past the last line
    name: str
    indent: str  # the body's indentation


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _functions(lang: str, text: str) -> list[Func]:
    lines = text.split("\n")
    out = []
    if lang == "python":
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                body = node.body[0].lineno - 1
                out.append(Func(start, body, node.end_lineno, node.name, _indent(lines[body])))
        return out
    if lang not in ("javascript", "c"):
        return out
    parser = parsers._ts_parser(lang)
    tree = parser.parse(text.encode())
    kinds = {
        "javascript": (
            "function_declaration",
            "method_definition",
            "generator_function_declaration",
        ),
        "c": ("function_definition",),
    }[lang]
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type not in kinds:
            continue
        body = node.child_by_field_name("body")
        name = node.child_by_field_name("name") or node.child_by_field_name("declarator")
        if body is None or name is None:
            continue
        first, last = body.start_point[0], body.end_point[0]
        if last - first < 2 or not lines[first].rstrip().endswith("{"):
            continue
        if lines[last].strip() not in ("}", "};", "},", "});", "})"):
            continue
        ident = re.match(r"[A-Za-z_$][\w$]*", name.text.decode()) if name.text else None
        if ident is None:
            continue
        out.append(
            Func(
                node.start_point[0], first + 1, last + 1, ident.group(0), _indent(lines[first + 1])
            )
        )
    return out


# ---- failure variants ----


def _cut(text: str) -> str:
    """Cut in half: after half the lines, in the middle of the next one."""
    lines = text.split("\n")
    k = len(lines) // 2
    return "\n".join([*lines[:k], lines[k][: len(lines[k]) // 2]])


def _starts(lang: str, text: str) -> list[int]:
    """Lines where a statement begins (at any depth): where a model's placeholder goes."""
    if lang == "python":
        return sorted({n.lineno - 1 for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt)})
    if lang == "text":
        return list(range(text.count("\n")))
    tree = parsers._ts_parser(lang).parse(text.encode())
    out, stack = set(), [tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type.endswith(("statement", "declaration", "definition", "directive")):
            out.add(node.start_point[0])
    return sorted(out)


def _block(lang: str, text: str, rng: random.Random) -> tuple[int, int]:
    """A large block, 30 to 60 percent of the file, from one statement's start to
    another's."""
    n = text.count("\n")
    starts = [k for k in _starts(lang, text) if k >= 3] or [3]
    size = rng.randint(max(30, n * 3 // 10), max(31, n * 6 // 10))
    a = rng.choice([k for k in starts if k + size < n] or starts[:1])
    b = min((k for k in starts if k >= a + size), default=min(n - 1, a + size))
    return a, b


def _top_level(lang: str, text: str) -> list[tuple[int, int]]:
    """Line spans (start, end) of the top-level statements."""
    if lang == "python":
        return [(s.lineno - 1, s.end_lineno or s.lineno) for s in ast.parse(text).body]
    tree = parsers._ts_parser(lang).parse(text.encode())
    return [(c.start_point[0], c.end_point[0] + 1) for c in tree.root_node.children]


def _parses(name: str, data: bytes) -> bool:
    return not parsers.parse_errors(name.encode(), data)[1]


def failures(
    group: str, name: str, text: str, rng: random.Random, turn: int
) -> Iterator[tuple[str, str]]:
    """(kind, new text) for each failure variant of a file."""
    lang = _language(group)
    lines = text.split("\n")
    half = _cut(text)
    yield "cut + newline", half + "\n"
    yield "cut + blank line", half + "\n\n"
    yield "cut + trailing spaces", half + "   \n"
    yield "cut + CRLF", (half + "\n").replace("\n", "\r\n")
    yield "cut + closing token", "\n".join([*lines[: len(lines) // 2], CLOSERS[lang]]) + "\n"
    # Each phrasing in each of the format's comment syntaxes, over a large block; the
    # phrasings are dealt round the files so that every pair turns up.
    for k, syntax in enumerate(SYNTAXES[lang]):
        phrase = PHRASINGS[(turn * 3 + k) % len(PHRASINGS)]
        for p in (phrase, PHRASINGS[(turn * 3 + k + 11) % len(PHRASINGS)]):
            a, b = _block(lang, text, rng)
            mark = _indent(lines[a]) + syntax.format(p)
            kind = "placeholder " + syntax.format("").replace("  ", " ").strip()
            yield kind, "\n".join(lines[:a] + [mark] + lines[b:])
    # A model that writes only what it changed: a new function and a placeholder for
    # the rest of the file, before or after it.
    say = SYNTAXES[lang][0].format(PHRASINGS[(turn + 5) % len(PHRASINGS)])
    if turn % 2:
        yield "new code + placeholder", ADDED[lang] + "\n" + say + "\n"
    else:
        yield "new code + placeholder", say + "\n\n" + ADDED[lang]
    # Bodies of 12 lines or more that are not blank: the elision gate's min_lines (10)
    # is a count of lines of the old file that are gone.
    funcs = [
        f
        for f in _functions(lang, text)
        if sum(1 for x in lines[f.body : f.end] if x.strip()) >= 12
    ]
    if funcs:
        f = rng.choice(funcs)
        yield (
            "bare ... over a body",
            "\n".join(lines[: f.body] + [f.indent + "..."] + lines[f.end - (lang != "python") :]),
        )
        if lang == "python":
            head = lines[f.start : f.body]
            head[-1] = head[-1].rstrip() + "  # unchanged"
            yield (
                "def ...:  # unchanged",
                "\n".join(lines[: f.start] + head + [f.indent + "..."] + lines[f.end :]),
            )
    if lang != "text":
        spans = _top_level(lang, text)
        if len(spans) >= 4:
            # Keep the first statements (imports) and a few more, about a tenth of the
            # lines in all, so that what is left still parses.
            budget = max(3, len(lines) // 10)
            keep = []
            for s in [spans[0], *rng.sample(spans[1:], len(spans) - 1)]:
                if sum(e - b for b, e in keep) + s[1] - s[0] <= budget:
                    keep.append(s)
            keep.sort()
            new = "\n".join("\n".join(lines[b:e]) for b, e in keep) + "\n"
            if _parses(name, new.encode()):
                yield "90% of lines dropped", new


# ---- legitimate edits ----

ADDED = {
    "python": 'def added_helper(values, limit=10):\n    """Keep the first values."""\n'
    "    out = []\n    for v in values[:limit]:\n        out.append(v)\n    return out\n",
    "javascript": "function addedHelper(values, limit = 10) {\n  const out = [];\n"
    "  for (const v of values.slice(0, limit)) {\n    out.push(v);\n  }\n  return out;\n}\n",
    "c": "static inline int added_helper(const int *xs, int n) {\n    int s = 0;\n"
    "    for (int i = 0; i < n; i++) {\n        s += xs[i];\n    }\n    return s;\n}\n",
    "text": "## Added section\n\nSome words about it, and a list:\n\n- one\n- two\n",
}
PROTOCOL = (
    "class SupportsAdded(Protocol):\n"
    "    name: str\n\n"
    "    def size(self) -> int: ...\n"
    "    def read(self, n: int = -1) -> bytes: ...\n"
    "    @property\n"
    "    def closed(self) -> bool: ...\n"
    "    def close(self) -> None:\n"
    "        ...\n\n\n"
    "class Empty(Exception):\n"
    "    ...\n"
)
DOCTEST = (
    "def added_doctest(xs):\n"
    '    """Sum, with a doctest.\n\n'
    "    >>> added_doctest([1, 2,\n"
    "    ...     3])\n"
    "    6\n"
    "    >>> list(range(100))  # doctest: +ELLIPSIS\n"
    "    [0, 1, ..., 99]\n"
    "    >>> print('a'); print('b')\n"
    "    a\n"
    "    ...\n"
    '    """\n'
    "    return sum(xs)\n"
)
COMMENT = {"python": "# {}", "javascript": "// {}", "c": "/* {} */", "text": "<!-- {} -->"}


def _boundary(lang: str, text: str, rng: random.Random) -> int:
    """A line where a new top-level definition can go."""
    if lang == "text":
        return rng.randint(1, text.count("\n"))
    spans = _top_level(lang, text)
    return rng.choice(spans)[0] if spans else 0


def _reindent(text: str) -> str:
    out = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        n = len(line) - len(body)
        out.append(" " * (n // 2 if n % 4 == 0 else n) + body)
    return "\n".join(out)


def legit(
    group: str, name: str, text: str, rng: random.Random, other: str
) -> Iterator[tuple[str, str]]:
    """(kind, new text) for each legitimate edit of a file."""
    lang = _language(group)
    lines = text.split("\n")
    funcs = _functions(lang, text)
    if funcs:
        f = rng.choice(funcs)
        end = f.end + (f.end < len(lines) and not lines[f.end].strip())
        yield "delete a function", "\n".join(lines[: f.start] + lines[end:])
        # A function deleted with a note in its place (one of under a third of the file:
        # a note where most of the file was is what the mass-deletion signal is for).
        note = COMMENT[lang].format(rng.choice(DOTTED))
        small = [g for g in funcs if g.end - g.start < len(lines) // 3]
        if small:
            g = rng.choice(small)
            yield (
                "comment with dots",
                "\n".join(lines[: g.start] + [_indent(lines[g.start]) + note] + lines[g.end :]),
            )
        names = [g.name for g in funcs if len(g.name) > 3 and text.count(g.name) >= 2]
        if names:
            old_name = rng.choice(names)
            yield "rename", re.sub(rf"\b{re.escape(old_name)}\b", old_name + "_renamed", text)
    at = _boundary(lang, text, rng)
    yield "add a function", "\n".join(lines[:at] + ADDED[lang].split("\n") + lines[at:])
    if lang == "python":
        yield (
            "protocol stub with ...",
            "\n".join(
                lines[:at]
                + ["from typing import Protocol", "", ""]
                + PROTOCOL.split("\n")
                + lines[at:]
            ),
        )
        if funcs:
            f = rng.choice(funcs)
            yield (
                "doctest with ...",
                "\n".join(
                    lines[: f.start]
                    + [_indent(lines[f.start]) + x if x else x for x in DOCTEST.split("\n")]
                    + lines[f.end :]
                ),
            )
    yield "reformat (reindent)", _reindent(text)
    yield "CRLF conversion", text.replace("\n", "\r\n")
    yield "rewrite entirely", other
    yield "append", text.rstrip("\n") + "\n\n\n" + ADDED[lang]
    k = rng.randint(5, len(lines) - 5)
    small = lines[:k] + [lines[k] + COMMENT[lang].format("changed"), lines[k + 1]] + lines[k + 3 :]
    yield "small edit", "\n".join(small)


def corpus(seed: int = 15, per_group: int = 12) -> list[Case]:
    """The cases, from ``per_group`` files of each group (a fixed draw for a seed).
    A legitimate edit that does not parse is left out: it is not one."""
    files = sample(seed, per_group)
    rng = random.Random(seed)
    by_group: dict[str, list[str]] = {}
    for group, _, data in files:
        by_group.setdefault(group, []).append(data.decode())
    cases = []
    for turn, (group, path, data) in enumerate(files):
        name = _name(group)
        text = data.decode()
        peers = [t for t in by_group[group] if t != text] or [ADDED[_language(group)]]
        for kind, new in failures(group, name, text, rng, turn):
            cases.append(Case(kind, True, name, data, new.encode(), str(path)))
        for kind, new in legit(group, name, text, rng, rng.choice(peers)):
            raw = new.encode()
            if raw != data and _parses(name, raw):
                cases.append(Case(kind, False, name, data, raw, str(path)))
    return cases


def refused(case: Case, config: Callable[[str, bytes], dict[str, Any]] | None = None) -> list[str]:
    """The gates that refuse the case's new bytes (default policy)."""
    cfg = config or Policy().gate
    found = gates.check(case.name.encode(), case.old, case.new, cfg)
    return [f.gate for f in found if f.action == "reject"]


Results = dict[tuple[bool, str], tuple[int, int, list[Case], Counter[str]]]


def evaluate(cases: list[Case]) -> Results:
    """Per (bad, kind): (cases, refused, the cases judged wrongly, how often each gate
    refused)."""
    out: Results = {}
    cfg = Policy().gate
    for c in cases:
        n, r, wrong, by = out.get((c.bad, c.kind), (0, 0, [], Counter()))
        found = refused(c, cfg)
        if bool(found) != c.bad:
            wrong = [*wrong, c]
        out[(c.bad, c.kind)] = (n + 1, r + bool(found), wrong, by + Counter(found))
    return out


def table(results: Results) -> str:
    """The report: recall per failure kind, false refusals per legitimate kind, and the
    gates that refused (a case can be refused by several)."""
    rows = [f"{'kind':<26}{'cases':>6}{'refused':>8}{'rate':>8}   refused by"]
    for bad, title in (
        (True, "failure variants (recall)"),
        (False, "legitimate edits (false refusals)"),
    ):
        rows.append(f"-- {title}")
        total = hits = 0
        for (b, kind), (n, r, _, by) in sorted(results.items()):
            if b != bad:
                continue
            gates_ = ", ".join(f"{g} {k}" for g, k in by.most_common())
            rows.append(f"{kind:<26}{n:>6}{r:>8}{100 * r / n:>7.1f}%   {gates_}".rstrip())
            total, hits = total + n, hits + r
        if total:
            rows.append(f"{'all':<26}{total:>6}{hits:>8}{100 * hits / total:>7.1f}%")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(evaluate(corpus())))
