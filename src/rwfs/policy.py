"""The policy: ``WORKSPACE/.rw/policy.toml``, validated as a whole before it takes effect.

Path globs follow ``.gitignore`` rules, with one difference that matches what people mean by
``node_modules/**``: a glob that does not start with ``/`` matches at any depth.
"""

from __future__ import annotations

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

# Paths written in place, unjournaled (.gitignore syntax; a glob not starting with "/"
# matches at any depth).
passthrough = [
"""
    + "".join(f'    "{g}",\n' for g in DEFAULT_PASSTHROUGH)
    + "]\n"
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
}


class PolicyError(ValueError):
    """The policy text is invalid; the message says which key and why."""


@dataclass
class Policy:
    durability: str = "group"
    commit_interval_ms: int = 500
    max_journaled_bytes: int = 256 << 20
    passthrough: list[str] = field(default_factory=lambda: list(DEFAULT_PASSTHROUGH))
    text: str = DEFAULT_TEXT

    def __post_init__(self) -> None:
        anchored = [g if g.startswith(("/", "**/", "!")) else "**/" + g for g in self.passthrough]
        self._spec = pathspec.PathSpec.from_lines(_DIALECT, anchored)
        self._memo: dict[tuple[bytes, bool], bool] = {}  # glob matching is regex work

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
        for key, value in raw.items():
            want = _KEYS.get(key)
            if want is None:
                raise PolicyError(f"unknown policy key {key!r}; known keys: {', '.join(_KEYS)}")
            if not isinstance(value, want) or isinstance(value, bool):
                raise PolicyError(f"policy key {key!r} must be a {want.__name__}")  # type: ignore[union-attr]
        if raw.get("durability", "group") not in ("group", "strict"):
            raise PolicyError('durability must be "group" or "strict"')
        if not 1 <= raw.get("commit_interval_ms", 500) <= 60_000:
            raise PolicyError("commit_interval_ms must be between 1 and 60000")
        if raw.get("max_journaled_bytes", 1) < 1:
            raise PolicyError("max_journaled_bytes must be positive")
        globs = raw.get("passthrough", DEFAULT_PASSTHROUGH)
        if not all(isinstance(g, str) and g.strip() for g in globs):
            raise PolicyError("passthrough must be a list of non-empty glob strings")
        try:
            return cls(**{k: v for k, v in raw.items()}, text=text)
        except Exception as exc:  # pathspec rejects a malformed glob
            raise PolicyError(f"passthrough has an invalid glob: {exc}") from None
