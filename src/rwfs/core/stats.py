"""What a mount has done, for ``.rw/stats``: counts, latency samples, hot paths."""

from __future__ import annotations

import time
from typing import Any

from .syscalls import fsdecode


class Stats:
    """What this mount has done: counts, latency samples, hot paths (for ``.rw/stats``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.samples: dict[str, list[float]] = {}
        self.paths: dict[bytes, int] = {}
        self.started = time.monotonic()

    def count(self, name: str, by: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + by

    def sample(self, name: str, seconds: float) -> None:
        got = self.samples.setdefault(name, [])
        got.append(seconds)
        if len(got) > 2000:  # keep the newest 1000
            del got[:1000]

    def commit(self, path: bytes) -> None:
        self.count("commits")
        self.paths[path] = self.paths.get(path, 0) + 1
        if len(self.paths) > 10_000:
            self.paths.clear()

    def report(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float:
            ordered = sorted(xs)
            return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 3)

        elapsed = max(time.monotonic() - self.started, 1e-9)
        hot = sorted(self.paths.items(), key=lambda kv: -kv[1])[:10]
        return {
            "since_mount_s": round(elapsed, 1),
            "counts": dict(sorted(self.counts.items())),
            "commits_per_second": round(self.counts.get("commits", 0) / elapsed, 3),
            "latency_ms": {
                name: {"n": len(xs), "p50": pct(xs, 0.5), "p99": pct(xs, 0.99)}
                for name, xs in sorted(self.samples.items())
                if xs
            },
            "hot_paths": [{"path": fsdecode(p), "commits": n} for p, n in hot],
        }
