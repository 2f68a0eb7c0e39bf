"""dpstream's pytest plugin as a user meets it: the README's example test, verbatim in
spirit -- a worker on a zero-noise config, events in, exact releases out."""

from __future__ import annotations

import pytest

from dpstream.testing import Pipeline

pytestmark = pytest.mark.integration

CONFIG = {
    "input": {"partitions": 2},
    "ticks": {"interval_seconds": 0.5},
    "noise": {"mode": "insecure_zero"},  # exact releases: for tests only
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "clicks", "kind": "count", "epsilon": 1.0, "tau": 2, "key": "click"}],
}


def test_zero_noise_count_of_clicks(dpstream_pipeline):
    pipeline: Pipeline = dpstream_pipeline(CONFIG)
    events = [{"user_id": f"u{i % 3}", "key": "click"} for i in range(9)]
    events += [{"user_id": "u9", "key": "view"}]
    pipeline.produce(events)
    # Three users, each counted at most tau = 2 times; the view is not a click.
    releases = pipeline.releases("clicks", until=lambda r: r[-1]["value"] == 6)
    ticks = [r["tick"] for r in releases]  # public time: one release per tick, none skipped
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    assert all(r["value"] in (0, 6) for r in releases)
