"""Gates: checks that refuse a write that would break a file (SPEC §4).

Each gate looks at the previous bytes of a file and the sealed new bytes and returns a
``Finding`` or None. ``check`` runs the gates in the order of SPEC §4.1 and gives each
finding the action the policy sets for that gate and path (``reject``, ``warn``, ``off``).
Pure functions over bytes: no FUSE, no I/O; the caller runs them in a worker thread.

A new file (no previous bytes) is never refused: there is nothing it could have broken.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import threading
import tomllib
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

# Gates read at most this much of a file; larger files are left alone (their content is
# not what a model writes by hand, and reading them would slow every commit).
MAX_GATED_BYTES = 8 << 20


@dataclass
class Finding:
    gate: str
    message: str  # what the gate saw, in plain words
    details: dict[str, Any] = field(default_factory=dict)
    action: str = "reject"


# ---- truncation ----


def truncation(old: bytes, new: bytes, cfg: dict[str, Any]) -> Finding | None:
    """The new bytes are the old ones cut short: the old file's tail is gone."""
    if len(new) >= len(old) or not old.startswith(new):
        return None
    old_lines = old.count(b"\n") + (not old.endswith(b"\n"))
    lost = old[len(new) :]
    lost_lines = lost.count(b"\n") + (not lost.endswith(b"\n"))
    if lost_lines <= cfg["min_lines"] or lost_lines / max(old_lines, 1) <= cfg["min_ratio"]:
        return None
    kept = new.count(b"\n") + 1
    return Finding(
        "truncation",
        f"the new text is the old text cut off after line {kept - 1}: its last "
        f"{lost_lines} of {old_lines} lines are gone",
        {"line": kept, "lines_lost": lost_lines, "lines_before": old_lines},
    )


# ---- elision ----

# Words that say "the code that stood here is left out". A placeholder line is a comment
# (or a bare line) whose whole text, once ellipses and brackets are stripped, is such words.
_SUFFIX = rb"(?:\s+(?:is\s+|are\s+|remains?\s+|stays?\s+)?(?:unchanged|the\s+same|as\s+before|omitted|elided|here|not\s+shown))?"
_ELIDED = re.compile(
    rb"(?i)(?:"
    rb"(?:the\s+)?(?:rest|remainder)\s+of\s+(?:the\s+)?(?:file|code|class|function|method|module|implementation|body|content|tests?)s?"
    + _SUFFIX
    + rb"|(?:existing|previous|original|remaining|other|unchanged|more)\s+(?:code|content|implementation|methods|functions|lines|imports|tests|logic|fields|properties|cases|handlers|routes)"
    + _SUFFIX
    + rb"|(?:code|content|implementation|rest|everything(?:\s+else)?)\s+(?:is\s+|remains\s+|stays\s+)?(?:unchanged|the\s+same|as\s+before|omitted|elided|not\s+shown)"
    + rb"|unchanged|omitted|elided|truncated|same\s+as\s+(?:before|above|original)"
    + rb"|keep\s+(?:the\s+)?(?:existing|rest)(?:\s+\w+)?"
    + rb")"
)
_COMMENT = re.compile(rb"^\s*(?:#+|//+|/\*+|<!--|--|;+|\*)(.*?)(?:\*/|-->)?\s*$")
_AROUND = b" \t.:;,()[]{}\xe2\x80\xa6"  # blanks, dots, brackets, the ellipsis character


def _placeholder(line: bytes) -> bool:
    m = _COMMENT.match(line)
    text = (m.group(1) if m else line).strip(_AROUND)
    return bool(text) and _ELIDED.fullmatch(text) is not None


def elision(old: bytes, new: bytes, cfg: dict[str, Any]) -> Finding | None:
    """Placeholder lines stand where many lines of the old file were removed."""
    old_lines = old.splitlines()
    new_lines = new.splitlines()
    old_set = set(old_lines)
    markers = [
        (n, line)
        for n, line in enumerate(new_lines, 1)
        if line not in old_set and _placeholder(line)
    ]
    if not markers:
        return None
    removed = sum((Counter(old_lines) - Counter(new_lines)).values())
    if removed < cfg["min_lines"]:
        return None
    line, text = markers[0]
    return Finding(
        "elision",
        f"line {line} ({text.decode(errors='replace').strip()[:60]!r}) stands for code that "
        f"was left out: {removed} lines of the old file are gone",
        {"line": line, "lines_removed": removed, "placeholders": len(markers)},
    )


# ---- syntax ----


def _python(data: bytes) -> tuple[int, str] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences: not errors
            ast.parse(data)
    except SyntaxError as exc:
        return exc.lineno or 0, exc.msg
    except ValueError as exc:  # null bytes
        return 0, str(exc)
    return None


def _json(data: bytes) -> tuple[int, str] | None:
    try:
        json.loads(data)
    except UnicodeDecodeError as exc:
        return 0, str(exc)
    except json.JSONDecodeError as exc:
        return exc.lineno, exc.msg
    return None


def _toml(data: bytes) -> tuple[int, str] | None:
    try:
        tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return 0, str(exc)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        return (int(m.group(1)) if m else 0), str(exc).split(" (at ")[0]
    return None


# libyaml's safe loader when the wheel has it (about ten times faster), else PyYAML's own.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml(data: bytes) -> tuple[int, str] | None:
    try:
        for _ in yaml.parse(data, Loader=_YAML_LOADER):  # events only: syntax, no objects
            pass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        return (mark.line + 1 if mark else 0), str(exc.problem or exc)
    except yaml.YAMLError as exc:
        return 0, str(exc)
    return None


# tree-sitter grammars, each from its own wheel: format -> (module, function).
_GRAMMARS = {
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "java": ("tree_sitter_java", "language"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "ruby": ("tree_sitter_ruby", "language"),
    "bash": ("tree_sitter_bash", "language"),
}
_parsers = threading.local()  # a tree-sitter Parser is not safe to share between threads


# The last tree parsed for each path, so that its next version is parsed incrementally:
# an edit touches a few lines, and tree-sitter then reparses only around them (about a
# millisecond instead of ten or more at 100 KB). Trees are shared between the worker
# threads (each edits a copy); only files up to _TREE_BYTES are kept, at most _TREES_MAX.
_trees: dict[tuple[str, bytes], tuple[bytes, Any]] = {}
_trees_lock = threading.Lock()
_TREES_MAX = 128
_TREE_BYTES = 1 << 20


def _tree_sitter(lang: str) -> Callable[..., tuple[int, str] | None]:
    def parse(
        data: bytes, path: bytes | None = None, previous: bytes | None = None
    ) -> tuple[int, str] | None:
        cache = _parsers.__dict__
        parser = cache.get(lang)
        if parser is None:
            import tree_sitter

            module, func = _GRAMMARS[lang]
            grammar = getattr(importlib.import_module(module), func)()
            parser = cache[lang] = tree_sitter.Parser(tree_sitter.Language(grammar))
        key = (lang, path or b"")
        old_tree = None
        if path is not None and previous is not None:
            with _trees_lock:
                hit = _trees.get(key)
            if hit is not None and hit[0] == previous:
                old_tree = hit[1].copy()
                _edit(old_tree, previous, data)
        tree = parser.parse(data, old_tree) if old_tree is not None else parser.parse(data)
        if path is not None and len(data) <= _TREE_BYTES:
            with _trees_lock:
                _trees.pop(key, None)
                _trees[key] = (data, tree)
                if len(_trees) > _TREES_MAX:
                    del _trees[next(iter(_trees))]  # the least recently parsed
        root = tree.root_node
        if not root.has_error:
            return None
        node = _first_error(root)
        if node is None:
            return 0, "syntax error"
        what = f"missing {node.type!r}" if node.is_missing else "syntax error"
        return node.start_point[0] + 1, what

    return parse


def _edit(tree: Any, old: bytes, new: bytes) -> None:
    """Tell a tree of ``old`` which bytes became ``new``: the span between their common
    prefix and their common suffix."""
    start = _common_prefix(old, new)
    limit = min(len(old), len(new)) - start
    end = _common_prefix(old[::-1], new[::-1], limit)
    old_end, new_end = len(old) - end, len(new) - end
    tree.edit(
        start_byte=start,
        old_end_byte=old_end,
        new_end_byte=new_end,
        start_point=_point(old, start),
        old_end_point=_point(old, old_end),
        new_end_point=_point(new, new_end),
    )


def _common_prefix(a: bytes, b: bytes, limit: int | None = None) -> int:
    """The length of the longest common prefix (at most ``limit``), by halving: each step
    compares slices in C."""
    lo, hi = 0, min(len(a), len(b), limit if limit is not None else len(a))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _point(data: bytes, offset: int) -> tuple[int, int]:
    """(row, column) of a byte offset, as tree-sitter counts them (bytes)."""
    row = data.count(b"\n", 0, offset)
    return row, offset - (data.rfind(b"\n", 0, offset) + 1)


def _first_error(node: Any) -> Any:
    """The first ERROR or MISSING node, depth first (where a parser gave up)."""
    if node.is_error or node.is_missing:
        return node
    for child in node.children:
        if child.has_error or child.is_missing:
            found = _first_error(child)
            if found is not None:
                return found
    return None


PARSERS: dict[str, Callable[..., tuple[int, str] | None]] = {
    **{lang: _tree_sitter(lang) for lang in _GRAMMARS},
    "python": _python,
    "json": _json,
    "toml": _toml,
    "yaml": _yaml,
}
_SUFFIXES = {
    ".py": "python",
    ".pyi": "python",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".java": "java",
    ".go": "go",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hh": "cpp",
    ".hpp": "cpp",
    ".hxx": "cpp",
    ".rb": "ruby",
    ".sh": "bash",
    ".bash": "bash",
}


def language(path: bytes) -> str | None:
    """The format of a file, from its name (None: not a format rwfs can parse)."""
    name = path.rsplit(b"/", 1)[-1].decode("utf-8", "replace").lower()
    dot = name.rfind(".")
    return _SUFFIXES.get(name[dot:]) if dot > 0 else None


def parse_errors(
    path: bytes, data: bytes, previous: bytes | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """(format, errors) of a file's bytes: errors is empty when it parses. ``previous``:
    the bytes this version replaces, whose tree (if kept) makes the parse incremental."""
    lang = language(path)
    if lang is None:
        return None, []
    err = PARSERS[lang](data, path, previous) if lang in _GRAMMARS else PARSERS[lang](data)
    return lang, ([] if err is None else [{"line": err[0], "message": err[1]}])


def syntax(path: bytes, old: bytes, new: bytes) -> Finding | None:
    """A regression: the old version parsed and the new one does not."""
    lang, errors = parse_errors(path, new, old)
    if not errors:
        return None
    if parse_errors(path, old, new)[1]:
        return None  # it was broken already: not this write's doing
    err = errors[0]
    return Finding(
        "syntax",
        f"the new {lang} does not parse (line {err['line']}: {err['message']}), "
        "while the previous version did",
        {"format": lang, **err},
    )


# ---- secrets: the "Resilient Write" paper's L0 risk score ----

# Most of a file matches none of the patterns, and scanning it with a regex that starts
# with \b or a lookbehind costs about half a millisecond per 100 KB per pattern. So each
# pattern runs only where cheap byte searches say it could match: "needles" that any match
# contains, searched in a "view" of the bytes (as they are, lower-cased, or with every
# digit turned into 0 or every base64 character into "a"). Emails are searched only near
# an "@". The result is what the patterns alone would give (a test checks it), save for
# an email whose local part is longer than 256 bytes.
_DIGITS = bytes(ord("0") if chr(c).isdigit() and c < 128 else c for c in range(256))
_BASE64 = bytes(
    ord("a") if (c < 128 and chr(c).isalnum()) or chr(c) in "+/" else ord(" ") for c in range(256)
)
_VIEWS: dict[str, Callable[[bytes], bytes]] = {
    "raw": lambda data: data,
    "lower": bytes.lower,
    "digits": lambda data: data.translate(_DIGITS),
    "base64": lambda data: data.translate(_BASE64),
}


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[bytes]
    needles: tuple[bytes, ...]  # a match holds at least one of these, in ``view``
    view: str = "raw"
    # An email: run only where the part from the "@" on matches ``domain``, starting at
    # most 256 bytes before the "@" (RFC 5321 allows a local part of 64).
    domain: re.Pattern[bytes] | None = None


def _p(regex: bytes, *needles: bytes, view: str = "raw", domain: bytes = b"") -> _Pattern:
    return _Pattern(re.compile(regex), needles, view, re.compile(domain) if domain else None)


# Pattern families and weights (the paper's §3.1). A family's contribution is damped:
# w * min(1.5, 1 + 0.25 * (distinct matches - 1)).
_FAMILIES: dict[str, tuple[float, list[_Pattern]]] = {
    "api_key": (
        0.35,
        [
            _p(rb"sk-ant-[A-Za-z0-9_-]{20,}", b"sk-ant-"),
            _p(rb"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}", b"sk-"),
            _p(rb"\bAKIA[0-9A-Z]{16}\b", b"AKIA"),
            _p(
                rb"(?i)\b(?:datadog|dd)[_-]?(?:api|app)[_-]?key\W{0,3}[:=]\s*['\"]?[a-f0-9]{32,40}",
                *(
                    a + b + c
                    for a in (b"dd", b"dog")
                    for b in (b"", b"_", b"-")
                    for c in (b"api", b"app")
                ),
                view="lower",
            ),
            _p(rb"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{20,}=*", b"bearer", view="lower"),
        ],
    ),
    "github_pat": (
        0.35,
        [
            _p(rb"\bgh[pousr]_[A-Za-z0-9]{36,}", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
            _p(rb"\bgithub_pat_[A-Za-z0-9_]{22,}", b"github_pat_"),
        ],
    ),
    "jwt": (
        0.25,
        [_p(rb"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", b"eyJ")],
    ),
    "pem_block": (0.50, [_p(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", b"-----BEGIN ")]),
    "aws_secret": (
        0.40,
        [
            _p(
                rb"(?i)aws[A-Za-z0-9_.-]{0,30}(?:secret|key)[A-Za-z0-9_.-]{0,20}['\"]?\s*[:=]\s*['\"]?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
                b"aws",
                view="lower",
            )
        ],
    ),
    "pii": (
        0.15,
        [
            _p(
                rb"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
                b"@",
                domain=rb"@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
            ),
            _p(rb"\b\d{3}-\d{2}-\d{4}\b", b"000-00-0000", view="digits"),
            _p(
                rb"(?<![\d-])\(?\d{3}\)?[-. ]\d{3}[-. ]\d{4}(?![\d-])",
                *(b"%c000%c0000" % (a, b) for a in b"-. " for b in b"-. "),
                view="digits",
            ),
        ],
    ),
    "binary_hint": (0.20, [_p(rb"[A-Za-z0-9+/]{200,}={0,2}", b"a" * 200, view="base64")]),
}
VERDICTS = (("high", 0.70), ("medium", 0.40), ("low", 0.10))
_RANK = {"off": 99, "high": 3, "medium": 2, "low": 1, "safe": 0}
_CONTROLS = bytes(c for c in range(32) if c < 9 or c > 13)


def _matches(p: _Pattern, data: bytes, views: dict[str, bytes]) -> set[bytes]:
    if p.view not in views:
        views[p.view] = _VIEWS[p.view](data)
    view = views[p.view]
    if not any(n in view for n in p.needles):
        return set()
    if p.domain is None:
        return {m.group(0) for m in p.regex.finditer(data)}
    found: set[bytes] = set()
    done, at = 0, data.find(b"@")
    while at >= 0:
        tail = p.domain.match(data, at)
        if tail is not None:
            m = p.regex.search(data, max(at - 256, done), tail.end())
            if m is not None:
                found.add(m.group(0))
                done = m.end()
        at = data.find(b"@", at + 1)
    return found


def risk(data: bytes) -> dict[str, Any]:
    """The risk score of content: ``{score, verdict, detected_patterns, matches}``.

    Matches are cut to 16 characters, so that the report never carries the secret itself.
    """
    score = 0.0
    found: dict[str, set[bytes]] = {}
    views: dict[str, bytes] = {}
    for family, (weight, patterns) in _FAMILIES.items():
        hits = set().union(*(_matches(p, data, views) for p in patterns))
        if hits:
            found[family] = hits
            score += weight * min(1.5, 1.0 + 0.25 * (len(hits) - 1))
    head = data[:65536]
    controls = len(head) - len(head.translate(None, _CONTROLS))
    if data and controls > len(head) // 10 and "binary_hint" not in found:
        found["binary_hint"] = {b"<non-printable bytes>"}
        score += _FAMILIES["binary_hint"][0]
    if len(data) > 100 << 10:
        score += 0.15
    if any(len(line) > 2000 for line in data.split(b"\n")):
        score += 0.20
    score = max(0.0, min(1.0, score))
    verdict = next((name for name, floor in VERDICTS if score >= floor), "safe")
    return {
        "score": round(score, 3),
        "verdict": verdict,
        "detected_patterns": sorted(found),
        "matches": [
            {"pattern": f, "match": m.decode("utf-8", "replace")[:16]}
            for f in sorted(found)
            for m in sorted(found[f])[:5]
        ],
    }


def secrets(new: bytes, cfg: dict[str, Any]) -> Finding | None:
    """The new content's risk score reaches the policy's ``warn_at`` or ``reject_at``."""
    report = risk(new)
    rank = _RANK[report["verdict"]]
    if rank >= _RANK[cfg["reject_at"]]:
        action = "reject"
    elif rank >= _RANK[cfg["warn_at"]]:
        action = "warn"
    else:
        return None
    found = Finding(
        "secrets",
        f"it looks like it holds secrets or personal data ({', '.join(report['detected_patterns'])}; "
        f"risk {report['verdict']}, score {report['score']})",
        report,
    )
    found.action = action
    return found


# ---- running them ----

GATES = ("truncation", "elision", "syntax", "secrets")


def check(
    path: bytes, old: bytes, new: bytes, config: Callable[[str, bytes], dict[str, Any]]
) -> list[Finding]:
    """Every finding of every gate that is not ``off`` for ``path``, in gate order.

    ``config(gate, path)`` gives the gate's settings for this path (``action`` and its
    thresholds), after per-path overrides.
    """
    if len(old) > MAX_GATED_BYTES or len(new) > MAX_GATED_BYTES:
        return []
    out = []
    for gate in GATES:
        cfg = config(gate, path)
        if cfg["action"] == "off" or (not old and gate != "secrets"):
            continue  # a new file has nothing to break; it can still hold a secret
        if gate == "truncation":
            found = truncation(old, new, cfg)
        elif gate == "elision":
            found = elision(old, new, cfg)
        elif gate == "syntax":
            found = syntax(path, old, new)
        else:
            found = secrets(new, cfg)
            if found is not None and found.action == "reject" and cfg["action"] != "reject":
                found.action = cfg["action"]  # "warn" caps what the score may do
            if found is not None:
                out.append(found)
            continue
        if found is not None:
            found.action = cfg["action"]
            out.append(found)
    return out
