"""Synthetic user-tagged events for the demo and tests (public, seeded, no DP here)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def synthetic_events(
    users: int, count: int, seed: int = 0, click_share: float = 0.3, user_id_field: str = "user_id"
) -> Iterator[dict]:
    """``count`` events from ``users`` users with Zipf-like activity, so a few heavy users
    exceed the contribution bound and truncation shows; the user id at ``user_id_field``
    (``input.user_id_field``: ``actor.id`` nests it as ``{"actor": {"id": ...}}``)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1) ** 0.8
    weights /= weights.sum()
    who = rng.choice(users, size=count, p=weights)
    clicks = rng.random(count) < click_share
    values = rng.integers(1, 6, size=count)
    *parents, last = user_id_field.split(".")
    for u, click, value in zip(who, clicks, values, strict=True):
        event: dict = {}
        holder = event
        for name in parents:
            holder = holder.setdefault(name, {})
        holder[last] = f"user-{u:05d}"
        yield event | {"key": "click" if click else "view", "value": int(value)}
