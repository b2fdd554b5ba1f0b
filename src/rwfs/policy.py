"""The policy: ``WORKSPACE/.rw/policy.toml``, validated as a whole before it takes effect.

Path globs follow ``.gitignore`` rules, with one difference that matches what people mean by
``node_modules/**``: a glob that does not start with ``/`` matches at any depth.
"""

from __future__ import annotations

import errno
import math
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pathspec

DEFAULT_PASSTHROUGH = [
    ".git/**",
    "node_modules/**",
    ".venv/**",
    "venv/**",
    "__pycache__/**",
    "*.pyc",
    ".mypy_cache/**",
    ".pytest_cache/**",
    ".ruff_cache/**",
    ".tox/**",
    "build/**",
    "dist/**",
    "target/**",
    "*.sqlite",
    "*.sqlite3",
    "*.db",
    "*-journal",
    "*-wal",
    "*-shm",
    "*.log",
    "*.swp",
    "*.swx",
]

DEFAULT_TEXT = (
    """\
# rwfs policy. Edit through the mount at .rw/policy.toml; an invalid write is refused
# (EINVAL) and the old policy stays. Reference: docs/policy.md in the rwfs repository.

# "group": close() returns once the commit survives a crash of the daemon; syncs are shared
# by every commit of a commit_interval_ms window. "strict": close() waits until it is on disk.
durability = "group"
commit_interval_ms = 500

# Files larger than this are written in place, unjournaled.
max_journaled_bytes = 268435456

# How many times the same refused bytes may be written to the same path before the
# refusal tells the writer to change strategy rather than retry.
retry_budget = 3

# The errno a gate's refusal returns (Node.js, for one, shows EBADMSG as "Unknown system
# error -74"; EIO is known everywhere).
refusal_errno = "EBADMSG"

# A refused writer that never heard of rwfs sees only that errno. "auto": rwfs also writes
# one line saying why on its stderr when that is a pipe or socket (what an agent's shell
# tool reads) or a terminal in line mode; "always": also on a terminal a full-screen
# program holds (the line draws over its display); "off".
tell_writer = "auto"

# An explicit batch whose commit was interrupted by a crash: "manual" (it waits for
# `resume` or `rollback` in .rw/batches/NAME/ctl) or "auto" (recovery rolls it forward).
resume = "manual"

# A lost update: a process replaces a file it read before another process changed it.
# "warn" (the commit proceeds, recorded with a warning), "conflict" (refused with ESTALE,
# a conflict is opened with the writer's bytes) or "off".
stale_write = "warn"

# History retention (docs/history.md). rwfs collects old versions by itself, oldest first,
# in the background: a version replaced more than retain_days ago goes; and the object
# store (.rw/objects) is kept under a budget: retain_ratio times the tree's bytes, but
# never under retain_min_bytes, and never above retain_bytes (0: no such cap). When the
# disk's free space falls under min_free_ratio of it, old versions go until it does not.
# Snapshots, open conflicts, unfinished batches, refused drafts, pending receipts and every
# file's current bytes are kept whatever these say, and count toward the budget.
retain_days = 30
retain_ratio = 1.0
retain_min_bytes = 67108864
retain_bytes = 0
min_free_ratio = 0.05

# false: .rw/scratch/ is a deposit box (files can be written there, not read back).
scratch_readable = true

# Who may read .rw/journal, status, stats, last-error, notices and the handoff note,
# which name every file and its digests: "owner" (the workspace's owner, and root) or "all".
journal_readable_by = "owner"

# Paths written in place, unjournaled (.gitignore syntax; a glob not starting with "/"
# matches at any depth).
passthrough = [
"""
    + "".join(f'    "{g}",\n' for g in DEFAULT_PASSTHROUGH)
    + "]\n"
    + """
# Gates refuse a write that would break a file (docs/gates.md). Each has an action,
# "reject", "warn" (recorded, the write proceeds) or "off", and its thresholds.
[gates.truncation]
action = "reject"
min_lines = 20
min_ratio = 0.3

[gates.elision]
action = "reject"
min_lines = 10
# Mass deletion: this part of the file's lines gone with a placeholder-like line (a lone
# comment, "pass", "...") where they were, or cut_ratio of them gone with nothing new.
mass_ratio = 0.5
cut_ratio = 0.8

# An implemented body (min_lines lines of code or more) replaced by a stub: pass, ...,
# raise NotImplementedError, throw new Error("TODO"), a lone TODO comment.
[gates.stub]
action = "reject"
min_lines = 5

# A block of min_lines lines or more repeated word for word that the old file held once
# (a file pasted twice, a function written out twice).
[gates.duplication]
action = "reject"
min_lines = 8

[gates.syntax]
action = "reject"

# The risk score of the "Resilient Write" paper: API keys, tokens, private keys, personal
# data. Warns from a "medium" verdict; set reject_at = "high" to refuse such writes.
[gates.secrets]
action = "reject"
warn_at = "medium"
reject_at = "off"

# A gate that cannot judge a write (a file nested deeper than its parser goes, a parser
# out of memory): "warn" (the write proceeds, the finding is recorded), "reject" or "off".
[gates.cannot_judge]
action = "warn"

# Per-path actions, e.g. for deliberately broken test fixtures:
# [[gates.override]]
# paths = ["tests/fixtures/**"]
# syntax = "off"
# truncation = "warn"
"""
)

try:  # pathspec ≥ 1.0 names the .gitignore dialect "gitignore"; older releases "gitwildmatch"
    pathspec.PathSpec.from_lines("gitignore", [])
    _DIALECT = "gitignore"
except (KeyError, LookupError):
    _DIALECT = "gitwildmatch"

_KEYS: dict[str, type | tuple[type, ...]] = {
    "durability": str,
    "commit_interval_ms": int,
    "max_journaled_bytes": int,
    "passthrough": list,
    "retry_budget": int,
    "refusal_errno": str,
    "tell_writer": str,
    "resume": str,
    "stale_write": str,
    "retain_days": int,
    "retain_bytes": int,
    "retain_ratio": (int, float),
    "retain_min_bytes": int,
    "min_free_ratio": (int, float),
    "scratch_readable": bool,
    "journal_readable_by": str,
    "gates": dict,
}

# The gates' defaults (SPEC §4.1): the action, then each threshold with its type.
GATE_DEFAULTS: dict[str, dict[str, Any]] = {
    "truncation": {"action": "reject", "min_lines": 20, "min_ratio": 0.3},
    "elision": {"action": "reject", "min_lines": 10, "mass_ratio": 0.5, "cut_ratio": 0.8},
    "stub": {"action": "reject", "min_lines": 5},
    "duplication": {"action": "reject", "min_lines": 8},
    "syntax": {"action": "reject"},
    # The risk score's verdict (low, medium, high) at which to warn and to refuse ("off").
    "secrets": {"action": "reject", "warn_at": "medium", "reject_at": "off"},
    # Not a gate: what a gate that could not decide does (a file nested deeper than its
    # parser goes): "warn" (the write proceeds, recorded), "reject" or "off".
    "cannot_judge": {"action": "warn"},
}
VERDICT_SETTINGS = ("off", "low", "medium", "high")
ACTIONS = ("reject", "warn", "off")


def _globs(globs: list[str]) -> pathspec.PathSpec:
    anchored = [g if g.startswith(("/", "**/", "!")) else "**/" + g for g in globs]
    return pathspec.PathSpec.from_lines(_DIALECT, anchored)


def _check_gates(raw: Any) -> None:
    """Validate the ``[gates]`` table: per-gate settings and ``[[gates.override]]``."""
    for name, value in raw.items():
        if name == "override":
            if not isinstance(value, list):
                raise PolicyError("gates.override must be an array of tables ([[gates.override]])")
            for n, rule in enumerate(value, 1):
                if not isinstance(rule, dict) or "paths" not in rule:
                    raise PolicyError(f"gates.override #{n} needs paths = [globs]")
                paths = rule["paths"]
                if not isinstance(paths, list) or not all(isinstance(g, str) and g for g in paths):
                    raise PolicyError(f"gates.override #{n}: paths must be a list of globs")
                for gate, action in rule.items():
                    if gate == "paths":
                        continue
                    if gate not in GATE_DEFAULTS:
                        raise PolicyError(f"gates.override #{n}: unknown gate {gate!r}")
                    if action not in ACTIONS:
                        raise PolicyError(
                            f"gates.override #{n}: {gate} must be one of {', '.join(ACTIONS)}"
                        )
            continue
        defaults = GATE_DEFAULTS.get(name)
        if defaults is None:
            raise PolicyError(f"unknown gate {name!r}; gates: {', '.join(GATE_DEFAULTS)}")
        if not isinstance(value, dict):
            raise PolicyError(f"gates.{name} must be a table")
        for key, setting in value.items():
            if key not in defaults:
                raise PolicyError(
                    f"gates.{name} has no setting {key!r}; it has: {', '.join(defaults)}"
                )
            if key == "action":
                if setting not in ACTIONS:
                    raise PolicyError(f"gates.{name}.action must be one of {', '.join(ACTIONS)}")
            elif isinstance(defaults[key], str):
                if setting not in VERDICT_SETTINGS:
                    raise PolicyError(
                        f"gates.{name}.{key} must be one of {', '.join(VERDICT_SETTINGS)}"
                    )
            else:
                _check_number(f"gates.{name}.{key}", setting)


# The range of every number the policy holds: (integers only, least, most or None). A
# value out of range is refused, never taken: min_ratio = 7.5 would turn the truncation
# gate off without a word.
RANGES: dict[str, tuple[bool, int, int | None]] = {
    "commit_interval_ms": (True, 1, 60_000),
    "max_journaled_bytes": (True, 1, None),
    "retry_budget": (True, 0, None),
    "retain_days": (True, 0, None),
    "retain_bytes": (True, 0, None),
    "retain_ratio": (False, 0, 1000),
    "retain_min_bytes": (True, 0, None),
    "min_free_ratio": (False, 0, 1),
    "gates.truncation.min_lines": (True, 0, None),
    "gates.truncation.min_ratio": (False, 0, 1),
    "gates.elision.min_lines": (True, 0, None),
    "gates.elision.mass_ratio": (False, 0, 1),
    "gates.elision.cut_ratio": (False, 0, 1),
    "gates.stub.min_lines": (True, 1, None),
    "gates.duplication.min_lines": (True, 2, None),
}


def allowed(key: str) -> str:
    """The range of a numeric key, in words."""
    whole, least, most = RANGES[key]
    kind = "an integer" if whole else "a number"
    return f"{kind} from {least} to {most}" if most is not None else f"{kind} of {least} or more"


def _check_number(key: str, value: Any) -> None:
    whole, least, most = RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        what = "is not allowed"
    elif least <= value and (most is None or value <= most):
        return
    else:  # (NaN is in no range: both comparisons are false)
        what = "is out of range"
    raise PolicyError(
        f"{key} = {value!r} {what}: it must be {allowed(key)}",
        key=key,
        # (as a string unless JSON holds it: a list, NaN and inf are not JSON numbers)
        value=value
        if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        else repr(value),
        allowed=allowed(key),
    )


class PolicyError(ValueError):
    """The policy text is invalid; the message says which key and why (``details``: the
    key, its value and what is allowed, when one value is at fault)."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


@dataclass
class Policy:
    durability: str = "group"
    commit_interval_ms: int = 500
    max_journaled_bytes: int = 256 << 20
    passthrough: list[str] = field(default_factory=lambda: list(DEFAULT_PASSTHROUGH))
    retry_budget: int = 3
    refusal_errno: str = "EBADMSG"
    tell_writer: str = "auto"
    resume: str = "manual"
    stale_write: str = "warn"
    retain_days: int = 30
    retain_bytes: int = 0
    retain_ratio: float = 1.0
    retain_min_bytes: int = 64 << 20
    min_free_ratio: float = 0.05
    scratch_readable: bool = True
    journal_readable_by: str = "owner"
    gates: dict[str, Any] = field(default_factory=dict)
    text: str = DEFAULT_TEXT

    def __post_init__(self) -> None:
        self._spec = _globs(self.passthrough)
        self._memo: dict[tuple[bytes, bool], bool] = {}  # glob matching is regex work
        self._gate_base = {
            gate: {**defaults, **self.gates.get(gate, {})}
            for gate, defaults in GATE_DEFAULTS.items()
        }
        self._overrides = [
            (_globs(rule["paths"]), {k: v for k, v in rule.items() if k != "paths"})
            for rule in self.gates.get("override", [])
        ]

    def gate(self, gate: str, path: bytes) -> dict[str, Any]:
        """A gate's settings for ``path``: the defaults, the [gates.NAME] table, then the
        action of the last [[gates.override]] whose paths match."""
        cfg = self._gate_base[gate]
        text = path.decode("utf-8", "surrogateescape")
        for spec, actions in self._overrides:
            if gate in actions and spec.match_file(text):
                cfg = {**cfg, "action": actions[gate]}
        return cfg

    def is_passthrough(self, path: bytes, is_dir: bool = False) -> bool:
        """True if ``path`` (relative, bytes) is written in place without journaling."""
        key = (path, is_dir)
        hit = self._memo.get(key)
        if hit is None:
            text = path.decode("utf-8", "surrogateescape")
            hit = self._memo[key] = bool(self._spec.match_file(text + "/" if is_dir else text))
            if len(self._memo) > 100_000:
                self._memo.clear()
        return hit

    @classmethod
    def parse(cls, text: str) -> Policy:
        try:
            raw: dict[str, Any] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy.toml is not valid TOML: {exc}") from None
        except (RecursionError, MemoryError):  # tomllib recurses: a few thousand levels
            raise PolicyError(
                "policy.toml is nested deeper than it can be read (no setting nests more than four levels)"
            ) from None
        for key, value in raw.items():
            if key in RANGES:
                _check_number(key, value)
                continue
            want = _KEYS.get(key)
            if want is None:
                raise PolicyError(f"unknown policy key {key!r}; known keys: {', '.join(_KEYS)}")
            if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
                raise PolicyError(f"policy key {key!r} must be a {want.__name__}")  # type: ignore[union-attr]
        if raw.get("durability", "group") not in ("group", "strict"):
            raise PolicyError('durability must be "group" or "strict"')
        if raw.get("stale_write", "warn") not in ("warn", "conflict", "off"):
            raise PolicyError('stale_write must be "warn", "conflict" or "off"')
        if raw.get("tell_writer", "auto") not in ("auto", "always", "off"):
            raise PolicyError('tell_writer must be "auto", "always" or "off"')
        if raw.get("journal_readable_by", "owner") not in ("owner", "all"):
            raise PolicyError('journal_readable_by must be "owner" or "all"')
        if raw.get("resume", "manual") not in ("manual", "auto"):
            raise PolicyError('resume must be "manual" or "auto"')
        name = raw.get("refusal_errno", "EBADMSG")
        if not name.startswith("E") or not isinstance(getattr(errno, name, None), int):
            raise PolicyError(
                f"refusal_errno must name an errno, like EBADMSG or EIO, not {name!r}"
            )
        _check_gates(raw.get("gates", {}))
        globs = raw.get("passthrough", DEFAULT_PASSTHROUGH)
        if not all(isinstance(g, str) and g.strip() for g in globs):
            raise PolicyError("passthrough must be a list of non-empty glob strings")
        try:
            return cls(**{k: v for k, v in raw.items()}, text=text)
        except Exception as exc:  # pathspec rejects a malformed glob
            raise PolicyError(f"passthrough has an invalid glob: {exc}") from None
