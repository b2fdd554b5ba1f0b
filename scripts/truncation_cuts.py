"""Cuts that still parse: how many the gates refuse.

A write cut off where the text still parses is the truncation gate's hardest case: the
syntax gate sees nothing wrong. This cuts real files (the hard corpus's sources,
``gate_corpus_hard.sample``, or the files under ``--dir``) where what is left parses: at a
top-level statement, at a nested one (a method, a statement of a function's body), at a
blank line, at a YAML or TOML key, at a JSON entry, at a Markdown or reST heading or list
item. In JavaScript and TypeScript a nested cut is also closed by the writer: with a lone
``}``, or with exactly the old file's closing lines of the block it fell in (the bytes of
the block's last statements deleted, which the gate lets through when they are whole
definitions or tests pruned: docs/gates.md). Each kind's count of cuts and of refusals
(by any gate) is printed.

    scripts/truncation_cuts.py [--seed N] [--files N] [--group G]... [--dir DIR]... [--misses]

Also run as ``scripts/bench cuts``.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gate_corpus_hard as hard  # noqa: E402

from rwfs.checks import gates, parsers  # noqa: E402
from rwfs.policy import Policy  # noqa: E402

CONFIG = Policy().gate
CLOSERS = re.compile(r"\s*[)\]};,]*\s*")
KEY = {
    "yaml": re.compile(r"[A-Za-z_\"'-]"),
    "toml": re.compile(r"[A-Za-z_\[\"]"),
    "json": re.compile(r'\s+"[^"]*":'),
}
HEADING = re.compile(r"#+ |\S.*\n(?:=+|-+)$")
ITEM = re.compile(r"\s*(?:[-*+]|\d+\.) ")


def _far(lines: list[str], k: int) -> bool:
    """Whether a cut after ``k`` lines loses what the truncation gate counts: more than
    its min_lines (20) and min_ratio (0.3) of the lines, with some margin."""
    lost = len(lines) - k
    return lost > 24 and lost / len(lines) > 0.35


def _starts(lang: str, data: bytes) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Lines where a top-level and a nested statement begin, and (JavaScript) pairs of a
    nested statement's line and the line of the closing brace of its block, when every
    line from there on only closes."""
    text = data.decode()
    if lang == "python":
        tree = ast.parse(text)

        def start(s: ast.stmt) -> int:
            decorators = getattr(s, "decorator_list", [])
            return min([s.lineno, *(d.lineno for d in decorators)]) - 1

        nested = [
            start(s)
            for node in ast.walk(tree)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            for s in node.body
        ]
        return [start(s) for s in tree.body], nested, []
    root = parsers._ts_parser(lang).parse(data).root_node
    lines = text.split("\n")
    top = [c.start_point[0] for c in root.named_children]
    nested, closed = [], []
    stack = [root]
    while stack:
        node = stack.pop()
        for c in node.named_children:
            if c.type in ("statement_block", "class_body"):
                end = c.end_point[0]
                rows = [x.start_point[0] for x in c.named_children]
                nested += rows
                if all(CLOSERS.fullmatch(x) for x in lines[end:]):
                    closed += [(r, end) for r in rows]
            stack.append(c)
    return top, nested, closed


def cuts(group: str, path: str, data: bytes, rng: random.Random) -> list[tuple[str, str]]:
    """(kind, new text) for a few cuts of one file, each one that still parses."""
    text = data.decode()
    lines = text.split("\n")
    lang = parsers.language(path.encode())
    out: list[tuple[str, str]] = []

    def some(rows: list[int], n: int = 3) -> list[int]:
        rows = sorted({k for k in rows if _far(lines, k)})
        return rng.sample(rows, min(n, len(rows)))

    def cut(k: int) -> str:
        return "\n".join(lines[:k]) + "\n"

    if lang in ("python", "javascript", "typescript"):
        top, nested, closed = _starts(lang, data)
        out += [("top-level statement", cut(k)) for k in some(top)]
        for k in some(nested, 4):
            if lang == "python":
                out.append(("nested statement", cut(k)))
            else:
                out.append(("nested + }", "\n".join([*lines[:k], "}"]) + "\n"))
        ends = dict(closed)
        for k in some(list(ends), 4):
            out.append(("nested + its closing lines", "\n".join(lines[:k] + lines[ends[k] :])))
    blanks = [k for k, x in enumerate(lines) if not x.strip()]
    out += [("blank line", cut(k)) for k in some(blanks)]
    if group in KEY:
        keys = [k for k, x in enumerate(lines) if KEY[group].match(x)]
        out += [(f"{group} key", cut(k)) for k in some(keys)]
    if group in ("markdown", "rst"):
        heads = [k for k in range(len(lines) - 1) if HEADING.match(lines[k] + "\n" + lines[k + 1])]
        out += [("heading", cut(k)) for k in some(heads)]
        out += [
            ("list item", cut(k)) for k in some([k for k, x in enumerate(lines) if ITEM.match(x)])
        ]
    prose = group in ("markdown", "rst")
    return [(kind, new) for kind, new in out if prose or hard._parses(path, new)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--files", type=int, default=30, help="files per group (30)")
    ap.add_argument("--group", action="append", help="only these groups of the hard corpus")
    ap.add_argument("--dir", action="append", type=Path, help="the .js/.py files under DIR instead")
    ap.add_argument("--misses", action="store_true", help="list the cuts let through")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    if args.dir:
        files = []
        for d in args.dir:
            for p in sorted(d.rglob("*")):
                group = hard._group(str(p)) if p.is_file() else None
                if group in ("python", "pytest", "javascript", "typescript"):
                    data = p.read_bytes()
                    if hard._usable(group, data):
                        files.append((group, str(p), data))
    else:
        files = [
            f for f in hard.sample(args.seed, args.files) if not args.group or f[0] in args.group
        ]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses: list[tuple[str, str]] = []
    for group, source, data in files:
        path = "m" + hard.SUFFIX[group]
        for kind, new in cuts(group, path, data, rng):
            found = gates.check(path.encode(), data, new.encode(), CONFIG)
            counts[kind][0] += 1
            if any(f.action == "reject" for f in found):
                counts[kind][1] += 1
            else:
                misses.append((kind, source))
    print(f"{len(files)} files, seed {args.seed}")
    print(f"{'cut at':<28}{'cuts':>6}{'refused':>9}{'rate':>8}")
    for kind, (n, refused) in sorted(counts.items()):
        print(f"{kind:<28}{n:>6}{refused:>9}{100 * refused / n:>7.1f}%")
    if args.misses:
        for kind, source in misses:
            print("LET THROUGH", kind, source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
