"""Gates: checks that refuse a write that would break a file (SPEC §4).

Each gate looks at the previous bytes of a file and the sealed new bytes and returns a
``Finding`` or None. ``check`` runs the gates in the order of SPEC §4.1 and gives each
finding the action the policy sets for that gate and path (``reject``, ``warn``, ``off``).
Pure functions over bytes: no FUSE, no I/O; the caller runs them in a worker thread.

A new file (no previous bytes) is never refused: there is nothing it could have broken.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ahocorasick_rs import BytesAhoCorasick

from . import parsers

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


def syntax(path: bytes, old: bytes, new: bytes) -> Finding | None:
    """A regression: the old version parsed and the new one does not."""
    lang, errors = parsers.parse_errors(path, new, old)
    if not errors:
        return None
    if parsers.parse_errors(path, old, new)[1]:
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
# digit turned into 0 or every base64 character into "a"). One Aho-Corasick pass finds
# which of a view's needles occur (37 substring searches took three times as long).
# Emails are searched only near an "@". The result is what the patterns alone would give
# (a test checks it), save for an email whose local part is longer than 256 bytes.
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


class _Needles:
    """Which of each view's needles occur in the bytes: one pass per view."""

    def __init__(self) -> None:
        by_view: dict[str, list[bytes]] = {}
        for _, patterns in _FAMILIES.values():
            for p in patterns:
                by_view.setdefault(p.view, []).extend(p.needles)
        self.needles = {v: sorted(set(ns)) for v, ns in by_view.items()}
        self.automata = {v: BytesAhoCorasick(ns) for v, ns in self.needles.items()}

    def present(self, view: str, data: bytes) -> set[bytes]:
        names = self.needles[view]
        if len(names) == 1:  # a plain search: overlapping matches of one needle add nothing
            return set(names) if names[0] in data else set()
        hits = self.automata[view].find_matches_as_indexes(data, overlapping=True)
        return {names[i] for i, _, _ in hits}


_NEEDLES = _Needles()
VERDICTS = (("high", 0.70), ("medium", 0.40), ("low", 0.10))
_RANK = {"off": 99, "high": 3, "medium": 2, "low": 1, "safe": 0}
_CONTROLS = bytes(c for c in range(32) if c < 9 or c > 13)


def _matches(p: _Pattern, data: bytes, present: dict[str, set[bytes]]) -> set[bytes]:
    if p.view not in present:
        present[p.view] = _NEEDLES.present(p.view, _VIEWS[p.view](data))
    if not any(n in present[p.view] for n in p.needles):
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
    present: dict[str, set[bytes]] = {}
    for family, (weight, patterns) in _FAMILIES.items():
        hits = set().union(*(_matches(p, data, present) for p in patterns))
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
    if max(map(len, data.split(b"\n"))) > 2000:
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


# The gates that read the bytes as lines of text (source code, config).
TEXT_GATES = ("truncation", "elision", "syntax")


def is_binary(data: bytes) -> bool:
    """Binary content: it holds a NUL byte, which no text format has (git's rule, over
    the whole content rather than its first 8,000 bytes)."""
    return b"\0" in data


def check(
    path: bytes,
    old: bytes,
    new: bytes,
    config: Callable[[str, bytes], dict[str, Any]],
    cut: bool = False,
) -> list[Finding]:
    """Every finding of every gate that is not ``off`` for ``path``, in gate order.

    ``config(gate, path)`` gives the gate's settings for this path (``action`` and its
    thresholds), after per-path overrides.

    Gates judge written text. ``cut``: the new bytes' last change is a truncation to a
    length the caller chose (truncate(2), ftruncate(2), O_TRUNC), a deliberate cut that
    the truncation and elision gates do not judge. A binary file (its old bytes hold a
    NUL) is never judged by the text gates: it has no lines or syntax to break. A text
    file whose new bytes hold NULs (padded with zeros, binary written over source) is
    still judged: that is a text file broken. The secrets gate's risk score, which has
    a family of its own for binary blobs, looks at both.
    """
    if len(old) > MAX_GATED_BYTES or len(new) > MAX_GATED_BYTES:
        return []
    binary = is_binary(old)
    out = []
    for gate in GATES:
        cfg = config(gate, path)
        if cfg["action"] == "off" or (not old and gate != "secrets"):
            continue  # a new file has nothing to break; it can still hold a secret
        if (binary and gate in TEXT_GATES) or (cut and gate in ("truncation", "elision")):
            continue
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
