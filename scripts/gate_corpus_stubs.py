"""A corpus for the stub and duplication gates: real files of packages installed on this
machine, with their implemented bodies stubbed and their text pasted twice (to be
refused), and edits that look risky but are not (to be let through).

Sources, each one left out when absent: Python's standard library and this environment's
site-packages (its tests too: test files repeat similar blocks), npm's JavaScript and
Markdown (``/usr/lib/node_modules``), the JDK's Java sources (``lib/src.zip``), the C
examples packages ship in ``/usr/share/doc``, Go from ``/usr/share/doc``, shell scripts
of ``/etc/init.d`` and ``/usr/share``, and a ``package-lock.json`` built from the
``package.json`` files npm bundles (a generated file whose entries repeat).

``cases(seed, per_group)`` is a plain list of ``Case(kind, name, old, new, expect_refused)``
(``name``: the file's name as gated; its suffix gives the format), so that it can be
joined with other corpora. Run it to print recall and false refusals per kind, with the
gates as they are and with the stub and duplication gates off (what came before them)::

    .venv/bin/python scripts/gate_corpus_stubs.py [--files 25] [--seed 28]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import sysconfig
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from rwfs.checks import gates, parsers
from rwfs.policy import Policy


class Case(NamedTuple):
    kind: str
    name: str
    old: bytes
    new: bytes
    expect_refused: bool


_MIN_LINES, _MAX_BYTES = 40, 120_000
STUB_LINES = 5  # a body stubbed holds at least this many lines of code
DUP_LINES = 8  # a block written twice holds at least this many lines


# ---- sources ----


def _files(group: str) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(name, its bytes when called) of each candidate file of a group, in a fixed order."""
    if group in ("python", "python tests"):
        roots = [Path(p) for p in sorted(set(sysconfig.get_paths().values())) if p]
        roots += sorted(Path(sys.base_prefix, "lib").glob("python3.*"))
        for root in dict.fromkeys(roots):
            for p in sorted(root.glob("**/*.py")):
                test = p.name.startswith("test") or "tests" in p.parts
                if test == (group == "python tests"):
                    yield p.name, partial(_read, p)
    elif group in ("javascript", "markdown"):
        ext = "js" if group == "javascript" else "md"
        for root in (Path("/usr/lib/node_modules"), Path("/usr/share/nodejs")):
            for p in sorted(root.glob(f"**/*.{ext}")):
                yield p.name, partial(_read, p)
    elif group == "java":
        for z in sorted(Path("/usr/lib/jvm").glob("*/lib/src.zip"))[:1]:
            with zipfile.ZipFile(z) as f:
                names = sorted(n for n in f.namelist() if n.startswith("java.base/java/util"))
                for n in names:
                    if n.endswith(".java"):
                        yield n.rsplit("/", 1)[-1], partial(_zipped, z, n)
    elif group in ("c", "go"):
        for p in sorted(Path("/usr/share/doc").glob(f"**/*.{group}")):
            yield p.name, partial(_read, p)
    elif group == "bash":
        for p in sorted([*Path("/etc/init.d").glob("*"), *Path("/usr/share").glob("**/*.sh")]):
            data = _read(p)[:64] if p.suffix != ".sh" else b""
            if data.startswith((b"#!/bin/sh", b"#!/bin/bash", b"#! /bin/sh")) or p.suffix == ".sh":
                yield p.name.removesuffix(".sh") + ".sh", partial(_read, p)
    elif group == "lockfile":
        lock = _lockfile()
        if lock:
            yield "package-lock.json", lambda: lock


def _zipped(z: Path, name: str) -> bytes:
    with zipfile.ZipFile(z) as f:
        return f.read(name)


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes() if p.is_file() else b""
    except OSError:
        return b""


GROUPS = ("python", "python tests", "javascript", "java", "c", "go", "bash", "markdown", "lockfile")


def _packages() -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path("/usr/lib/node_modules").glob("**/node_modules/*/package.json")):
        try:
            meta = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and "version" in meta:
            out.append(meta)
    return out


def _entry(meta: dict[str, Any]) -> dict[str, Any]:
    name, version = meta["name"], str(meta["version"])
    entry: dict[str, Any] = {
        "version": version,
        "resolved": f"https://registry.npmjs.org/{name}/-/{name.split('/')[-1]}-{version}.tgz",
        "integrity": "sha512-" + str(abs(hash((name, version))) % 10**40).rjust(40, "0"),
    }
    if meta.get("license") and isinstance(meta["license"], str):
        entry["license"] = meta["license"]
    deps = meta.get("dependencies")
    if isinstance(deps, dict) and deps:
        entry["dependencies"] = {k: str(v) for k, v in sorted(deps.items())}
    engines = meta.get("engines")
    if isinstance(engines, dict) and engines:
        entry["engines"] = {k: str(v) for k, v in sorted(engines.items())}
    return entry


def _lockfile(extra: list[dict[str, Any]] | None = None, nested: bool = False) -> bytes:
    """A package-lock.json (lockfileVersion 3) of npm's bundled packages."""
    metas = _packages()
    if not metas:
        return b""
    packages: dict[str, Any] = {"": {"name": "npm", "version": "10.0.0"}}
    for meta in metas[:-5] + (extra or []):
        packages[f"node_modules/{meta['name']}"] = _entry(meta)
    if nested:  # the same version again, nested under a package that pins it
        for meta in metas[:3]:
            packages[f"node_modules/{metas[5]['name']}/node_modules/{meta['name']}"] = _entry(meta)
    doc = {"name": "npm", "version": "10.0.0", "lockfileVersion": 3, "requires": True}
    doc["packages"] = packages
    return (json.dumps(doc, indent=2) + "\n").encode()


def _usable(name: str, data: bytes) -> bool:
    if not data or len(data) > _MAX_BYTES or data.count(b"\n") < _MIN_LINES:
        return False
    if b"\r" in data or b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not parsers.parse_errors(name.encode(), data)[1]


def sample(seed: int, per_group: int) -> list[tuple[str, str, bytes]]:
    """(group, name, bytes): ``per_group`` usable files of each group, drawn with ``seed``."""
    rng = random.Random(seed)
    out = []
    for group in GROUPS:
        files = list(_files(group))
        rng.shuffle(files)
        seen: set[bytes] = set()
        for name, load in files:
            if sum(1 for g, _, _ in out if g == group) == per_group:
                break
            data = load()
            if data not in seen and _usable(name, data):
                seen.add(data)
                out.append((group, name, data))
    return out


# ---- bodies ----


class Body(NamedTuple):
    name: str
    start: int  # the definition's first line (0-based, decorators included)
    first: int  # the body's first line to replace
    end: int  # one past its last line to replace
    indent: str
    code: int  # lines of code in it


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _code(lines: list[str]) -> int:
    return sum(
        1
        for x in lines
        if x.strip().strip("{}()[];,") and not x.strip().startswith(("#", "//", "/*", "*"))
    )


_TS_KINDS = {
    "javascript": ("function_declaration", "method_definition"),
    "java": ("method_declaration", "constructor_declaration"),
    "c": ("function_definition",),
    "go": ("function_declaration", "method_declaration"),
    "bash": ("function_definition",),
}


def bodies(lang: str, text: str) -> list[Body]:
    """The implemented bodies of a file, each as lines to replace."""
    lines = text.split("\n")
    out = []
    if lang == "python":
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.end_lineno:
                continue
            body = node.body
            doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            if doc and len(body) > 1:
                body = body[1:]
            first = body[0].lineno - 1
            if first <= node.lineno - 1 or any(
                isinstance(d, ast.Name | ast.Attribute) and "abstract" in ast.unparse(d)
                for d in node.decorator_list
            ):
                continue
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            out.append(
                Body(
                    node.name,
                    start,
                    first,
                    node.end_lineno,
                    _indent_of(lines[first]),
                    _code(lines[first : node.end_lineno]),
                )
            )
        return out
    tree = parsers._ts_parser(lang).parse(text.encode())
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type not in _TS_KINDS[lang]:
            continue
        body = node.child_by_field_name("body")
        if body is None:
            continue
        a, b = body.start_point[0], body.end_point[0]
        if b - a < 2 or not lines[a].rstrip().endswith("{") or lines[b].strip() != "}":
            continue
        name = node.child_by_field_name("name") or node.child_by_field_name("declarator")
        label = (name.text or b"").decode()[:40] if name is not None else "?"
        out.append(
            Body(
                label,
                node.start_point[0],
                a + 1,
                b,
                _indent_of(lines[a + 1]),
                _code(lines[a + 1 : b]),
            )
        )
    return out


# Stubs models write in place of a body, per format.
STUBS = {
    "python": {
        "pass": ["pass"],
        "...": ["..."],
        "raise NotImplementedError": ["raise NotImplementedError"],
        "raise NotImplementedError(msg)": ['raise NotImplementedError("TODO: implement this")'],
        "TODO comment + pass": ["# TODO: implement", "pass"],
        "TODO + return None": ["# TODO: implement the logic", "return None"],
    },
    "javascript": {
        'throw new Error("TODO")': ['throw new Error("TODO");'],
        "throw not implemented": ["throw new Error('Not implemented')"],
        "TODO comment": ["// TODO: implement"],
        "empty body": [],
        "return null + TODO": ["// TODO", "return null;"],
    },
    "java": {
        "throw UnsupportedOperation": [
            'throw new UnsupportedOperationException("Not implemented yet");'
        ],
        "TODO auto-generated": ["// TODO Auto-generated method stub"],
        'throw RuntimeException("TODO")': ['throw new RuntimeException("TODO");'],
    },
    "c": {
        "TODO comment": ["/* TODO: implement */"],
        "return 0 + TODO": ["return 0; /* TODO */"],
        "empty body": [],
    },
    "go": {
        'panic("not implemented")': ['panic("not implemented")'],
        "TODO + return nil": ["// TODO: implement", "return nil"],
    },
    "bash": {
        ": # TODO": [":  # TODO: implement"],
        "echo TODO": ['echo "TODO: not implemented" >&2'],
    },
}
LANG = {
    "python": "python",
    "python tests": "python",
    "javascript": "javascript",
    "java": "java",
    "c": "c",
    "go": "go",
    "bash": "bash",
}


def _join(lines: list[str]) -> str:
    return "\n".join(lines)


def _stubbed(lines: list[str], b: Body, stub: list[str]) -> list[str]:
    return lines[: b.first] + [b.indent + s for s in stub] + lines[b.end :]


def _parses(name: str, text: str) -> bool:
    return not parsers.parse_errors(name.encode(), text.encode())[1]


def variants(
    group: str, name: str, text: str, rng: random.Random
) -> Iterator[tuple[str, str, bool]]:
    """(kind, new text, to be refused) for each variant of a file."""
    lang = LANG.get(group)
    lines = text.split("\n")
    # -- duplication: every format --
    yield "dup: file pasted twice", text + text, True
    yield "dup: file pasted twice after a blank line", text.rstrip("\n") + "\n\n" + text, True
    if lang is not None:
        found = bodies(lang, text)
        big = [b for b in found if b.code >= STUB_LINES]
        if big:
            b = rng.choice(big)
            size = "10+" if b.code >= 10 else "5-9"
            for kind, stub in STUBS[lang].items():
                new = _stubbed(lines, b, stub)
                yield f"stub {size}: {kind}", _join(new), True
            yield from _legit_bodies(lang, lines, found, b, rng)
        whole = [
            b for b in found if sum(1 for x in lines[b.start : b.end] if x.strip()) >= DUP_LINES
        ]
        if whole:
            b = rng.choice(whole)
            end = b.end + (lang != "python")  # the closing brace
            unit = lines[b.start : end]
            yield (
                "dup: function written twice",
                _join(lines[:end] + [""] + unit + lines[end:]),
                True,
            )
            if not _indent_of(lines[b.start]):  # (a method belongs at its class's end)
                yield "dup: function written twice at the end", _join([*lines, "", *unit]), True
            # A copy renamed with one line changed: what a maintainer does to add a test.
            copy = list(unit)
            name = b.name.split("(")[0]
            at = next((i for i, x in enumerate(copy) if name in x), 0)
            copy[at] = copy[at].replace(name, name + "_variant", 1)
            mid = (len(copy) + (b.first - b.start)) // 2
            copy[mid] = (
                re.sub(r"\d+", "7", copy[mid])
                if re.search(r"\d", copy[mid])
                else copy[mid]
                + "  "
                + {"python": "# changed", "bash": "# changed"}.get(lang, "// changed")
            )
            yield (
                "legit: copy a definition, rename it, change a line",
                _join(lines[:end] + [""] + copy + lines[end:]),
                False,
            )
    if group == "markdown":
        yield from _markdown(lines, rng)
    if group == "lockfile":
        metas = _packages()
        if len(metas) > 10:
            yield "legit: lockfile adds a package", _lockfile([metas[-5]]).decode(), False
            new = _lockfile(metas[-5:-2], nested=True).decode()
            yield "legit: lockfile adds packages, one nested", new, False


def _legit_bodies(
    lang: str, lines: list[str], found: list[Body], b: Body, rng: random.Random
) -> Iterator[tuple[str, str, bool]]:
    body = lines[b.first : b.end]
    call = {
        "python": f"return _{b.name}_impl(*args, **kwargs)",
        "javascript": f"return {b.name}Impl.apply(this, arguments);",
        "java": f"{b.name}Impl();",
        "c": f"return {b.name.split('(')[0]}_impl();",
        "go": f"return {b.name}Impl()",
        "bash": f'{b.name}_impl "$@"',
    }[lang]
    if lang == "python":
        helper = (
            ["", "", f"def _{b.name}_impl(*args, **kwargs):"]
            + ["    " + x.strip() for x in body if x.strip()][:1]
            + ["    return None"]
        )
        helper = ["", "", f"def _{b.name}_impl(*args, **kwargs):", "    return None"]
        moved = _stubbed(lines, b, [call]) + helper
    else:
        moved = _stubbed(lines, b, [call])
    yield "legit: body -> call to a helper", _join(moved), False
    end = b.end + (lang != "python")
    yield "legit: delete the definition", _join(lines[: b.start] + lines[end:]), False
    last = next((x.strip() for x in reversed(body) if x.strip().startswith("return ")), None)
    if last is not None and len(last) > 12:
        yield "legit: shorter body", _join(_stubbed(lines, b, [last])), False
    if lang == "python" and b.indent.count(" ") >= 8:
        head = lines[b.start]
        deco = _indent_of(head) + "@abstractmethod"
        new = (
            lines[: b.start]
            + [deco]
            + lines[b.start : b.first]
            + [b.indent + "raise NotImplementedError"]
            + lines[b.end :]
        )
        yield (
            "legit: make a method abstract",
            _join(["from abc import abstractmethod", *new]),
            False,
        )
    if lang == "python":
        over = [
            _indent_of(lines[b.start]) + "@overload",
            _indent_of(lines[b.start]) + f"def {b.name}(*args: int) -> int: ...",
            _indent_of(lines[b.start]) + "@overload",
            _indent_of(lines[b.start]) + f"def {b.name}(*args: str) -> str: ...",
        ]
        new = ["from typing import overload", *lines[: b.start], *over, *lines[b.start :]]
        yield "legit: add overloads", _join(new), False
        stub = [
            "",
            "",
            "def added_later(x):",
            '    """Not written yet."""',
            "    raise NotImplementedError",
            "",
        ]
        yield "legit: a new stub", _join(lines + stub), False
    if lang == "java" and "abstract" not in lines[b.start] and "static" not in lines[b.start]:
        head = lines[b.start : b.first]
        sig = " ".join(x.strip() for x in head).rstrip("{").rstrip()
        new = (
            lines[: b.start]
            + [_indent_of(lines[b.start]) + "abstract " + sig + ";"]
            + lines[b.end + 1 :]
        )
        yield "legit: make a method abstract", _join(new), False


def _markdown(lines: list[str], rng: random.Random) -> Iterator[tuple[str, str, bool]]:
    heads = [i for i, x in enumerate(lines) if re.match(r"#{1,6} ", x)]
    sections = [
        (a, b)
        for a, b in zip(heads, [*heads[1:], len(lines)], strict=False)
        if _code(lines[a:b]) >= DUP_LINES
    ]
    if not sections:
        return
    a, b = rng.choice(sections)
    section = lines[a:b]
    yield "dup: section written twice", _join(lines[:b] + section + lines[b:]), True
    renamed = [section[0] + " (again, for another platform)", *section[1:]]
    yield (
        "legit: a section repeated under another heading",
        _join(lines[:b] + renamed + lines[b:]),
        False,
    )


# ---- running ----


def cases(seed: int = 28, per_group: int = 25) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for group, name, data in sample(seed, per_group):
        text = data.decode()
        for kind, new, bad in variants(group, name, text, rng):
            raw = new.encode()
            if raw == data or (not bad and not _parses(name, new)):
                continue  # a legitimate edit that does not parse is not one
            if bad and kind.startswith("stub") and not _parses(name, new):
                continue  # the syntax gate's: not what this corpus measures
            out.append(
                Case(
                    f"{group}: {kind}" if group in ("markdown", "lockfile") else kind,
                    name,
                    data,
                    raw,
                    bad,
                )
            )
    return out


def evaluate(
    found: list[Case], config: Callable[[str, bytes], dict[str, Any]]
) -> dict[tuple[bool, str], tuple[int, int, Counter[str], list[Case]]]:
    out: dict[tuple[bool, str], tuple[int, int, Counter[str], list[Case]]] = {}
    for c in found:
        hits = [
            f.gate
            for f in gates.check(c.name.encode(), c.old, c.new, config)
            if f.action == "reject"
        ]
        n, r, by, wrong = out.get((c.expect_refused, c.kind), (0, 0, Counter(), []))
        if bool(hits) != c.expect_refused:
            wrong = [*wrong, c]
        out[(c.expect_refused, c.kind)] = (n + 1, r + bool(hits), by + Counter(hits), wrong)
    return out


def without(policy: Policy, off: tuple[str, ...]) -> Callable[[str, bytes], dict[str, Any]]:
    def config(gate: str, path: bytes) -> dict[str, Any]:
        cfg = policy.gate(gate, path)
        return {**cfg, "action": "off"} if gate in off else cfg

    return config


def table(now: dict, before: dict) -> str:
    rows = [f"{'kind':<52}{'cases':>6}{'before':>8}{'now':>8}   refused by (now)"]
    for bad, title in (
        (True, "stubs and duplicates (recall)"),
        (False, "legitimate edits (false refusals)"),
    ):
        rows.append(f"-- {title}")
        tn = tb = tr = 0
        for (b, kind), (n, r, by, _) in sorted(now.items()):
            if b != bad:
                continue
            r0 = before[(b, kind)][1]
            who = ", ".join(f"{g} {k}" for g, k in by.most_common())
            rows.append(
                f"{kind:<52}{n:>6}{100 * r0 / n:>7.1f}%{100 * r / n:>7.1f}%   {who}".rstrip()
            )
            tn, tb, tr = tn + n, tb + r0, tr + r
        if tn:
            rows.append(f"{'all':<52}{tn:>6}{100 * tb / tn:>7.1f}%{100 * tr / tn:>7.1f}%")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", type=int, default=25, help="files per source group (25)")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--wrong", action="store_true", help="list the cases judged wrongly")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    found = cases(args.seed, args.files)
    policy = Policy()
    now = evaluate(found, policy.gate)
    before = evaluate(found, without(policy, ("stub", "duplication")))
    groups = Counter(c.name for c in found)
    print(f"stub and duplication corpus: {len(found)} cases from {len(groups)} files' names")
    print(
        f"(seed {args.seed}, {args.files} files per source group; {time.perf_counter() - t:.0f} s)"
    )
    print(table(now, before))
    if args.wrong:
        for (bad, kind), (_, _, _, wrong) in sorted(now.items()):
            for c in wrong[:3]:
                print(f"WRONG {'missed' if bad else 'refused'}: {kind}: {c.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
