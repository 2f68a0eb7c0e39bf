"""The readiness and liveness rules (pipeline/worker/health.py), over small states."""

from __future__ import annotations

import dataclasses

from dpstream.pipeline.worker.health import (
    CONDITIONS,
    LIVENESS_STALL_SECONDS,
    HealthState,
    conditions,
    live,
    ready,
    ticks_released,
)

# A worker holding events partitions 0 and 1 and stage-2 partition 0 (statistic "count"),
# at a moment when tick 100 is the latest that has ended and 99 the latest that is due.
HEALTHY = HealthState(
    heartbeat_age=0.4,
    events_partitions=frozenset({0, 1}),
    stage2_partitions=frozenset({0}),
    tables_recovered=True,
    ingest_running=True,
    stage1_closed={0: 100, 1: 99},
    owned_statistics=frozenset({"count"}),
    released={"count": 98},
    ended_tick=100,
    due_tick=99,
)


def test_a_healthy_worker_is_live_and_ready_on_every_condition():
    assert live(HEALTHY) and ready(HEALTHY)
    assert list(conditions(HEALTHY)) == list(CONDITIONS)
    assert all(conditions(HEALTHY).values())


def test_live_is_the_heartbeat_within_the_stall_limit_and_nothing_else():
    stalled = dataclasses.replace(HEALTHY, heartbeat_age=LIVENESS_STALL_SECONDS + 0.1)
    assert not live(stalled) and not ready(stalled)
    assert [c for c, ok in conditions(stalled).items() if not ok] == ["event_loop"]
    # Waiting for the broker, the group or a recovery: still live.
    waiting = dataclasses.replace(
        HEALTHY,
        events_partitions=frozenset(),
        stage2_partitions=frozenset(),
        tables_recovered=False,
        ingest_running=False,
    )
    assert live(waiting) and not ready(waiting)
    assert live(dataclasses.replace(HEALTHY, heartbeat_age=LIVENESS_STALL_SECONDS))


def test_ticks_released_allows_two_ticks_behind_and_not_three():
    # Stage 1: closed >= ended - 2 = 98 on every partition held.
    assert ticks_released(dataclasses.replace(HEALTHY, stage1_closed={0: 98, 1: 98}))
    assert not ticks_released(dataclasses.replace(HEALTHY, stage1_closed={0: 98, 1: 97}))
    # A partition held with no tick closed yet is behind.
    assert not ticks_released(dataclasses.replace(HEALTHY, stage1_closed={0: 100}))
    # Stage 2: released >= due - 2 = 97 for every statistic held.
    assert ticks_released(dataclasses.replace(HEALTHY, released={"count": 97}))
    assert not ticks_released(dataclasses.replace(HEALTHY, released={"count": 96}))
    assert not ticks_released(dataclasses.replace(HEALTHY, released={}))
    # Statistics and partitions not held do not count.
    assert ticks_released(
        dataclasses.replace(
            HEALTHY, stage1_closed={0: 100, 1: 99, 7: 3}, released={"count": 98, "x": 1}
        )
    )


def test_each_condition_fails_alone():
    cases = {
        "partitions_assigned": {"stage2_partitions": frozenset()},
        "tables_recovered": {"tables_recovered": False},
        "ingest_running": {"ingest_running": False},
        "ticks_released": {"released": {"count": 50}},
    }
    for condition, change in cases.items():
        state = dataclasses.replace(HEALTHY, **change)
        assert not ready(state)
        assert [c for c, ok in conditions(state).items() if not ok] == [condition]
    # A worker holding no events partition (beyond the partition count) is never ready.
    idle = dataclasses.replace(HEALTHY, events_partitions=frozenset(), stage1_closed={})
    assert [c for c, ok in conditions(idle).items() if not ok] == ["partitions_assigned"]
