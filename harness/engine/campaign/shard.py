"""``--shard K/N``: one of N runs that together do one run's work, on as many machines.

The split is by property, round robin over the properties in the order the run
lists them, so it is the same on every machine and every night, and every shard
searches with the run's seed: shard K's verdict on a property is the one a single
run would give. Saved repros and last night's failures are replayed by shard 1
only (every shard replaying them would report each finding N times).
``vmfuzz merge`` joins the shards' reports.
"""

from __future__ import annotations

import re

SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str, properties: int) -> tuple[int, int]:
    """``K/N`` with 1 <= K <= N <= properties; ValueError (one line) otherwise."""
    m = SHARD.match(text or "")
    if not m:
        raise ValueError(f"--shard {text!r}: expected K/N, e.g. 1/4")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be between 1 and N")
    if n > properties:
        raise ValueError(f"--shard {text!r}: {n} shards but only {properties} properties to split "
                         "(the split is by property)")
    return k, n


def shard_properties(properties: list[str], k: int, n: int) -> list[str]:
    """Shard ``k``'s properties (1-based): every n-th from the (k-1)-th."""
    return [p for i, p in enumerate(properties) if i % n == k - 1]
