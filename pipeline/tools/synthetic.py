"""Synthetic user-tagged events for the demo and tests (public, seeded, no DP here)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def synthetic_events(
    users: int, count: int, seed: int = 0, click_share: float = 0.3
) -> Iterator[dict]:
    """``count`` events from ``users`` users with Zipf-like activity, so a few heavy users
    exceed the contribution bound and truncation shows."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1) ** 0.8
    weights /= weights.sum()
    who = rng.choice(users, size=count, p=weights)
    clicks = rng.random(count) < click_share
    values = rng.integers(1, 6, size=count)
    for u, click, value in zip(who, clicks, values, strict=True):
        yield {"user_id": f"user-{u:05d}", "key": "click" if click else "view", "value": int(value)}
