"""A harder corpus for the elision and truncation gates: real files of published packages
on this machine, elided in words no vocabulary lists, and edited the risky ways
maintainers do edit them.

Failure variants (to be refused): a middle block replaced by a comment or a string in
many phrasings and several languages; a function's body replaced by one; a placeholder
entry (``"…": "…"``, ``key: ...``) where keys of a JSON, YAML or TOML file were. Legitimate
edits (to be let through): pruning most tests of a test module, deleting deprecated
definitions, a block deleted under a comment that stays, prose and docstring lines that
use the placeholder words, an ellipsis the old file had, ``@overload`` stubs, doctests in
docs, string elements, a body rewritten shorter, keys removed from data files.

Sources (each one skipped when absent): the site-packages of this environment and of
its base interpreter, ``/usr/lib/python3/dist-packages``, npm's modules, the Google Cloud
SDK's tree and ``/usr/share/doc``. Python, JavaScript, TypeScript, JSON, YAML, TOML,
Markdown, reStructuredText and shell.

``cases(seed, per_group)`` is a list of ``Case(kind, path, old, new, bad)``: a plain tuple,
so that other generators' lists can be joined to it. ``scripts/bench_gates.py --hard``
prints the table; ``python scripts/gate_corpus_hard.py`` too.
"""

from __future__ import annotations

import ast
import os
import random
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from rwfs.checks import gates, parsers
from rwfs.policy import Policy


class Case(NamedTuple):
    kind: str
    path: str  # the name as gated: its suffix gives the format
    old: bytes
    new: bytes
    bad: bool  # expected to be refused


# Placeholders in words outside the gate's vocabulary: what a model writes where it left
# a block out, in English and in other languages.
ENGLISH = (
    "as in the current version",
    "keep as is",
    "previous definitions stay here",
    "same helpers as before",
    "this part does not change",
    "left as it was",
    "nothing to change here",
    "what was here before",
    "as previously written",
    "identical to what you already have",
    "untouched from your version",
    "carry over from the old file",
    "everything in between as you had it",
    "paste the old implementation back here",
    "the usual stuff",
    "you already have this part",
)
FOREIGN = (
    "come nella versione attuale",  # Italian
    "resto del codice invariato",
    "lascia invariato",
    "wie bisher",  # German
    "Rest des Codes bleibt gleich",
    "unverändert lassen",
    "其余代码保持不变",  # Chinese
    "与之前相同",
    "保持原样",
    "igual que antes",  # Spanish
    "el resto del código sin cambios",
    "sin modificaciones",
    "le reste du code est inchangé",  # French
    "comme avant",
    "以下省略",  # Japanese
    "変更なし",
    "restante do código inalterado",  # Portuguese
    "остальной код без изменений",  # Russian
    "как было",
)
DATA_PLACEHOLDERS = {
    "json": ('"...": "..."', '"…": "…"', '"...": null', '"…"'),
    "yaml": ("...: ...", '"…": "…"', "- ...", "…: …"),
    "toml": ('"..." = "..."', '"…" = "…"', "# ..."),
}
COMMENT = {
    "python": ("# {}",),
    "pytest": ("# {}",),
    "javascript": ("// {}", "/* {} */"),
    "typescript": ("// {}", "/* {} */"),
    "yaml": ("# {}",),
    "toml": ("# {}",),
    "shell": ("# {}",),
    "markdown": ("<!-- {} -->",),
    "rst": ("..  {}",),
}
SUFFIX = {
    "python": ".py",
    "pytest": ".py",
    "pyi": ".pyi",
    "javascript": ".js",
    "typescript": ".ts",
    "json": ".json",
    "yaml": ".yaml",
    "toml": ".toml",
    "markdown": ".md",
    "rst": ".rst",
    "shell": ".sh",
}
GROUPS = tuple(SUFFIX)
_MIN_LINES, _MAX_BYTES = 40, 60_000


def _roots() -> list[Path]:
    base = Path(sys.base_prefix) / "lib"
    out = [Path(sysconfig.get_paths()["purelib"])]
    out += sorted(base.glob("python3.*/site-packages"))
    out += [
        Path(p)
        for p in (
            "/usr/lib/python3/dist-packages",
            "/usr/lib/node_modules",
            "/usr/share/nodejs",
            "/usr/lib/google-cloud-sdk",
            "/usr/share/doc",
        )
    ]
    return [p for p in out if p.is_dir()]


def _group(path: str) -> str | None:
    name = os.path.basename(path)
    if name.endswith(".d.ts"):
        return None
    ext = os.path.splitext(name)[1].lower()
    if ext == ".py":
        return "pytest" if name.startswith("test_") else "python"
    return {
        ".pyi": "pyi",
        ".js": "javascript",
        ".ts": "typescript",
        ".json": "json",
        ".yaml": "yaml",
        ".yml": "yaml",
        ".toml": "toml",
        ".md": "markdown",
        ".rst": "rst",
        ".txt": "rst",
        ".sh": "shell",
    }.get(ext)


def _sources() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {g: [] for g in GROUPS}
    seen: set[str] = set()
    for root in _roots():
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(top, f)
                g = _group(p)
                real = os.path.realpath(p)
                if g is not None and real not in seen:
                    seen.add(real)
                    out[g].append(p)
    return out


def _usable(group: str, data: bytes) -> bool:
    if not (_MIN_LINES <= data.count(b"\n") and len(data) <= _MAX_BYTES):
        return False
    if b"\r" in data or b"\0" in data:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if group == "rst" and ">>> " not in text and not text.lstrip().startswith(("=", "#")):
        return False  # a .txt of prose (or a doctest file), not a list of names
    return not parsers.parse_errors(("m" + SUFFIX[group]).encode(), data)[1]


def sample(seed: int, per_group: int) -> list[tuple[str, str, bytes]]:
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
                data = Path(p).read_bytes()
            except OSError:
                continue
            if _usable(group, data):
                out.append((group, p, data))
                taken += 1
    return out


# ---- where things are ----


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _py_defs(text: str) -> list[tuple[int, int, str, int]]:
    """(start, end, name, depth) of Python functions and classes (decorators included)."""
    out = []

    def walk(body: list[ast.stmt], depth: int) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                out.append((start, node.end_lineno or node.lineno, node.name, depth))
                if isinstance(node, ast.ClassDef):
                    walk(node.body, depth + 1)

    walk(ast.parse(text).body, 0)
    return out


def _top(lang: str, text: str) -> list[tuple[int, int]]:
    """Line spans of the top-level statements (comments aside)."""
    if lang in ("python", "pytest", "pyi"):
        return [
            (
                min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", []))]) - 1,
                s.end_lineno or s.lineno,
            )
            for s in ast.parse(text).body
        ]
    ts = {"javascript": "javascript", "typescript": "typescript", "shell": "bash"}.get(lang)
    if ts is None:
        return []
    root = parsers._ts_parser(ts).parse(text.encode()).root_node
    return [
        (c.start_point[0], c.end_point[0] + 1)
        for c in root.named_children
        if "comment" not in c.type
    ]


def _js_bodies(lang: str, text: str) -> list[tuple[int, int]]:
    """(first, last) body lines of JS functions whose braces are on their own lines."""
    root = parsers._ts_parser(lang).parse(text.encode()).root_node
    lines = text.split("\n")
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type in ("function_declaration", "method_definition", "function_expression"):
            body = node.child_by_field_name("body")
            if body is None:
                continue
            a, b = body.start_point[0], body.end_point[0]
            if (
                b - a >= 14
                and lines[a].rstrip().endswith("{")
                and lines[b].strip() in ("}", "},", "};")
            ):
                out.append((a + 1, b))
    return out


def _data_runs(lines: list[str]) -> list[tuple[int, int]]:
    """Runs of at least 12 lines at one indent or deeper, starting where an entry of that
    indent starts: keys of a mapping (or items of a list) that a placeholder can replace."""
    out = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith(("#", "}", "]")):
            continue
        ind = len(_indent(line))
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(_indent(lines[j])) >= ind):
            if len(_indent(lines[j])) == ind and lines[j].lstrip().startswith(("}", "]")):
                break
            j += 1
        # end the run where an entry of the same indent starts
        while j > i and (len(_indent(lines[j - 1])) > ind or not lines[j - 1].strip()):
            j -= 1
        if j - i >= 12:
            out.append((i, j))
    return out


def _parses(path: str, data: str) -> bool:
    return not parsers.parse_errors(path.encode(), data.encode())[1]


# ---- failure variants ----


def _block(spans: list[tuple[int, int]], n: int, rng: random.Random) -> tuple[int, int] | None:
    """Consecutive top-level statements, 25-60% of the file, not the first two."""
    cands = []
    for i in range(2, len(spans)):
        for j in range(i, len(spans)):
            size = spans[j][1] - spans[i][0]
            if size > 0.6 * n:
                break
            if size >= max(15, 0.25 * n) and j + 1 < len(spans):
                cands.append((spans[i][0], spans[j][1]))
    return rng.choice(cands) if cands else None


def failures(group: str, path: str, text: str, rng: random.Random) -> list[tuple[str, str]]:
    lines = text.split("\n")
    out: list[tuple[str, str]] = []
    lang = "python" if group in ("pytest", "pyi") else group
    if group == "pyi":
        return out

    def standin(words: str, where: tuple[int, int], syntax: str) -> str:
        a, b = where
        return "\n".join(lines[:a] + [_indent(lines[a]) + syntax.format(words)] + lines[b:])

    if lang in ("python", "javascript", "typescript", "shell"):
        spans = _top(lang, text)
        for kind, words in (
            ("middle: English words", ENGLISH),
            ("middle: other language", FOREIGN),
        ):
            for syntax in COMMENT[lang]:
                where = _block(spans, len(lines), rng)
                if where:
                    phrase = rng.choice(words)
                    if rng.random() < 0.3:
                        phrase = "... " + phrase + " ..."
                    out.append((kind, standin(phrase, where, syntax)))
        if lang == "python":
            where = _block(spans, len(lines), rng)
            if where:
                out.append(
                    ("middle: string", standin(rng.choice(ENGLISH + FOREIGN), where, '"""{}"""'))
                )
            for start, end, _, depth in _py_defs(text):
                head = next((i for i in range(start, end) if lines[i].rstrip().endswith(":")), None)
                if head is None or depth > 1 or rng.random() < 0.6:
                    continue
                if sum(1 for i in range(head + 1, end) if lines[i].strip()) < 14:
                    continue
                ind = _indent(lines[head + 1]) or "    "
                mark = ind + "# " + rng.choice(ENGLISH + FOREIGN)
                new = lines[: head + 1] + [mark, ind + "..."] + lines[end:]
                out.append(("body: comment + ...", "\n".join(new)))
                break
        if lang in ("javascript", "typescript"):
            bodies = _js_bodies(lang, text)
            if bodies:
                a, b = rng.choice(bodies)
                mark = _indent(lines[a]) + "// " + rng.choice(ENGLISH + FOREIGN)
                out.append(("body: comment", "\n".join(lines[:a] + [mark] + lines[b:])))
    elif lang in ("json", "yaml", "toml"):
        runs = _data_runs(lines)
        if runs:
            a, b = rng.choice(runs)
            ind = _indent(lines[a])
            entry = rng.choice(DATA_PLACEHOLDERS[lang])
            if lang == "json":
                comma = "," if lines[b - 1].rstrip().endswith(",") else ""
                if not lines[a].lstrip().startswith('"') or ":" not in lines[a]:
                    entry = '"…"'  # a list's items
                new = lines[:a] + [ind + entry + comma] + lines[b:]
            else:
                if lang == "yaml" and lines[a].lstrip().startswith("- "):
                    entry = "- ..."
                new = lines[:a] + [ind + entry] + lines[b:]
            out.append(("data: placeholder entry", "\n".join(new)))
        if lang in ("yaml", "toml") and runs:
            a, b = rng.choice(runs)
            words = rng.choice(ENGLISH + FOREIGN)
            new = lines[:a] + [_indent(lines[a]) + "# " + words] + lines[b:]
            out.append(("data: comment", "\n".join(new)))
    elif lang in ("markdown", "rst"):
        n = len(lines)
        a = rng.randint(n // 5, n // 2)
        b = min(n - 2, a + max(15, n // 3))
        a = next((i for i in range(a, max(0, a - 20), -1) if not lines[i - 1].strip()), a)
        syntax = rng.choice(COMMENT[lang] + ("[{}]",))
        out.append(("middle: prose", standin(rng.choice(ENGLISH + FOREIGN), (a, b), syntax)))
    return [(k, new) for k, new in out if _parses(path, new) or lang in ("markdown", "rst")]


# ---- legitimate edits ----

PROSE = (
    "Unchanged:",
    "Returns the rest of the lines unchanged.",
    "Other options are passed through unchanged.",
    "The remaining arguments are the same as before.",
    "Everything else is unchanged.",
    "If nothing changed, the input is returned as is.",
)
# Comments maintainers write over code, in several languages.
NOTES = (
    "compute it in one pass now",
    "simpler: the helper does the work",
    "see the changelog for the old behaviour",
    "calcola il risultato in un solo passaggio",
    "berechnet das Ergebnis direkt",
    "直接计算结果",
    "calcula el resultado de una vez",
    "calcule le résultat directement",
)
STRINGS = ("unchanged", "omitted", "truncated", "same as before", "rest of the file")


def _deletable(lang: str, text: str) -> list[tuple[int, int]]:
    """Runs of 1-3 consecutive top-level definitions of at most a third of the file."""
    spans = _top(lang, text)
    n = text.count("\n")
    out = []
    for i in range(1, len(spans) - 1):
        for j in range(i, min(i + 3, len(spans) - 1)):
            size = spans[j][1] - spans[i][0]
            if 12 <= size <= n / 3:
                out.append((spans[i][0], spans[j][1]))
    return out


def legit(group: str, path: str, text: str, rng: random.Random) -> list[tuple[str, str]]:
    lines = text.split("\n")
    out: list[tuple[str, str]] = []
    lang = "python" if group in ("pytest", "pyi") else group
    code = lang in ("python", "javascript", "typescript", "shell")

    def drop(a: int, b: int, put: list[str] | None = None) -> list[str]:
        while b < len(lines) and not lines[b].strip() and b - a < len(lines):
            b += 1
        return lines[:a] + (put or []) + lines[b:]

    if group == "pytest":
        defs = _py_defs(text)
        tests = [d for d in defs if d[2].startswith("test")]
        if len(tests) >= 4:
            keep = set(rng.sample(range(len(tests)), max(1, len(tests) // 5)))
            gone = sorted(
                ((s, e) for k, (s, e, _, _) in enumerate(tests) if k not in keep), reverse=True
            )
            new = list(lines)
            for s, e in gone:
                while e < len(new) and not new[e].strip():
                    e += 1
                del new[s:e]
            out.append(("prune tests", "\n".join(new)))
    if code:
        runs = _deletable(lang, text)
        if runs:
            a, b = rng.choice(runs)
            out.append(("delete deprecated code", "\n".join(drop(a, b))))
            # deleted under a comment of the old file, which stays
            comments = [
                i for i in range(1, len(lines)) if lines[i].lstrip().startswith(("#", "//"))
            ]
            after = [(a, b) for a, b in runs if a - 1 in comments or a - 2 in comments]
            if after:
                a, b = rng.choice(after)
                out.append(("delete under a kept comment", "\n".join(drop(a, b))))
            a, b = rng.choice(runs)
            if lang == "python":
                # a deleted function, and overload stubs of a new one where it was
                stubs = [
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
                    "def convert(value: Any) -> Any:",
                    "    return value",
                    "",
                    "",
                ]
                head = ["from typing import Any, overload"]
                out.append(("overloads where code was", "\n".join(head + drop(a, b, stubs))))
                strings = ["STATES = ("] + [f'    "{s}",' for s in STRINGS] + [")", "", ""]
                a, b = rng.choice(runs)
                out.append(("string elements", "\n".join(drop(a, b, strings))))
    # A licence header replaced by its SPDX line; a long docstring made one line.
    if code or lang in ("yaml", "toml"):
        mark = "//" if lang in ("javascript", "typescript") else "#"
        k = next((i for i, x in enumerate(lines) if not x.startswith(mark) and x.strip()), 0)
        first = 1 if lines[0].startswith("#!") else 0
        if k - first >= 10:
            spdx = f"{mark} SPDX-License-Identifier: MIT"
            out.append(("licence header to SPDX", "\n".join(lines[:first] + [spdx] + lines[k:])))
    if lang == "python":
        for i, x in enumerate(lines):
            s = x.strip()
            if s.startswith('"""') and len(s) > 3 and '"""' not in s[3:]:
                end = next((j for j in range(i + 1, len(lines)) if '"""' in lines[j]), None)
                if end is not None and end - i >= 12:
                    one = _indent(x) + s.rstrip(".") + '."""'
                    out.append(
                        ("docstring shortened", "\n".join(lines[:i] + [one] + lines[end + 1 :]))
                    )
                    break
        # a docstring line in the placeholder words, and a function deleted elsewhere
        doc = [
            i
            for i, x in enumerate(lines)
            if x.strip().startswith('"""') and not x.strip().endswith('"""', 3)
        ]
        runs = _deletable(lang, text)
        if doc and runs:
            d = rng.choice(doc)
            a, b = rng.choice(runs)
            new = list(lines)
            new.insert(d + 1, _indent(lines[d]) + rng.choice(PROSE))
            if d + 1 < a:
                a, b = a + 1, b + 1
            new[a:b] = []
            if _parses(path, "\n".join(new)):
                out.append(("docstring prose", "\n".join(new)))
        # a body rewritten shorter, with a comment in other words
        for start, end, _, _ in _py_defs(text):
            head = next((i for i in range(start, end) if lines[i].rstrip().endswith(":")), None)
            if head is None or not lines[head].lstrip().startswith(("def ", "async def ")):
                continue
            if not 14 <= end - head <= 60 or rng.random() < 0.5:
                continue
            ind = _indent(lines[head + 1]) or "    "
            note = rng.choice(NOTES)
            body = [ind + "# " + note, ind + "result = _compute(*args)", ind + "return result"]
            new = lines[: head + 1] + body + lines[end:]
            if _parses(path, "\n".join(new)):
                out.append(("body rewritten shorter", "\n".join(new)))
            break
    if group == "pyi" or (lang == "python" and re.search(r"^\s*\.\.\.$|: \.\.\.$", text, re.M)):
        spans = _top(lang, text)
        n = len(lines)
        cands = [
            (spans[i][0], spans[j][1])
            for i in range(1, len(spans))
            for j in range(i, len(spans) - 1)
            if 0.5 * n <= spans[j][1] - spans[i][0] <= 0.7 * n
        ]
        if cands:
            a, b = rng.choice(cands)
            out.append(("'...' already there", "\n".join(drop(a, b))))
    if lang in ("markdown", "rst"):
        n = len(lines)
        a = rng.randint(n // 5, n // 2)
        a = next((i for i in range(a, max(0, a - 20), -1) if not lines[i - 1].strip()), a)
        b = min(n - 1, a + max(12, n // 4))
        b = next((i for i in range(b, min(n - 1, b + 20)) if not lines[i].strip()), b)
        para = [i for i in range(1, a) if lines[i].strip() and not lines[i + 1].strip()]
        new = list(lines)
        del new[a:b]
        if para:
            p = rng.choice(para)
            bullet = rng.choice(("", "* ", "- "))
            new.insert(p + 1, bullet + rng.choice(PROSE))
        out.append(("prose edit", "\n".join(new)))
        doctest = [
            "",
            ">>> total = add(1,",
            "...           2)",
            ">>> print(total)",
            "3",
            ">>> for x in range(3):",
            "...     print(x)",
            "...",
            "0",
            "1",
            "2",
            "",
        ]
        new = list(lines)
        new[a:b] = doctest
        out.append(("doctest in docs", "\n".join(new)))
    if lang in ("json", "yaml", "toml"):
        runs = [(a, b) for a, b in _data_runs(lines) if b - a <= len(lines) / 2]
        if runs:
            a, b = rng.choice(runs)
            new = list(lines)
            if lang == "json" and not lines[b].lstrip().startswith(('"', "{", "[")):
                # the last entries: the one before them loses its comma
                new[a - 1] = new[a - 1].rstrip().rstrip(",")
            del new[a:b]
            out.append(("data: keys removed", "\n".join(new)))
    return [(k, new) for k, new in out if _parses(path, new) and new != text]


def cases(seed: int = 28, per_group: int = 25) -> list[Case]:
    files = sample(seed, per_group)
    rng = random.Random(seed)
    out = []
    for group, _, data in files:
        path = "m" + SUFFIX[group] if group != "pytest" else "test_m.py"
        text = data.decode()
        try:
            bad = failures(group, path, text, rng)
            good = legit(group, path, text, rng)
        except (SyntaxError, ValueError, RecursionError):
            continue
        out += [Case(k, path, data, new.encode(), True) for k, new in bad]
        out += [Case(k, path, data, new.encode(), False) for k, new in good]
    return out


def refused(case: Case) -> list[str]:
    found = gates.check(case.path.encode(), case.old, case.new, Policy().gate)
    return [f.gate for f in found if f.action == "reject"]


def table(found: list[tuple[Case, list[str]]]) -> str:
    rows = [f"{'kind':<30}{'cases':>6}{'refused':>8}{'rate':>8}   refused by"]
    for bad, title in (
        (True, "failure variants (recall)"),
        (False, "legitimate edits (false refusals)"),
    ):
        rows.append(f"-- {title}")
        per: dict[str, tuple[int, int, Counter[str]]] = {}
        for c, gs in found:
            if c.bad != bad:
                continue
            n, r, by = per.get(c.kind, (0, 0, Counter()))
            per[c.kind] = (n + 1, r + bool(gs), by + Counter(gs))
        for kind, (n, r, by) in sorted(per.items()):
            who = ", ".join(f"{g} {k}" for g, k in by.most_common())
            rows.append(f"{kind:<30}{n:>6}{r:>8}{100 * r / n:>7.1f}%   {who}".rstrip())
        n = sum(v[0] for v in per.values())
        r = sum(v[1] for v in per.values())
        if n:
            rows.append(f"{'all':<30}{n:>6}{r:>8}{100 * r / n:>7.1f}%")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--files", type=int, default=25, help="files per group (25)")
    ap.add_argument("--wrong", action="store_true", help="list the cases judged wrongly")
    args = ap.parse_args(argv)
    cs = cases(args.seed, args.files)
    found = [(c, refused(c)) for c in cs]
    print(f"{len(cs)} cases (seed {args.seed}, {args.files} files per group)")
    print(table(found))
    if args.wrong:
        for c, gs in found:
            if bool(gs) != c.bad:
                print("WRONG", c.kind, c.path, gs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
