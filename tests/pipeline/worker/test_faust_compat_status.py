"""What the probes read of Faust (pipeline/worker/faust_compat/status.py), on Faust's own
App and Recovery objects, set as a rebalance and a recovery set them."""

from __future__ import annotations

import asyncio

import faust
from faust.types import TP

from dpstream.pipeline.worker import faust_compat


def test_a_rebalance_and_its_recovery_are_seen_until_faust_ends_them():
    app = faust.App("status-test", broker="kafka://127.0.0.1:9", store="memory://")
    assert faust_compat.table_status(app) == faust_compat.TableStatus(False, False, None, None)
    faust_recovery = app.tables.recovery
    app.on_rebalance_start()  # the revocation
    status = faust_compat.table_status(app)
    assert status.rebalancing and not status.recovered
    faust_recovery._set_recovery_started()  # changelog records are being read
    status = faust_compat.table_status(app)
    assert status.in_recovery and status.recovery_started is not None
    assert status.recovery_ended is None and not status.recovered
    faust_recovery._set_recovery_ended()
    # Read, but the rebalance is not over until Faust resumes the streams.
    status = faust_compat.table_status(app)
    assert not status.in_recovery and status.rebalancing and not status.recovered
    assert status.recovery_ended is not None and status.recovery_ended >= status.recovery_started
    app.on_rebalance_end()
    assert faust_compat.table_status(app).recovered


def test_each_assignment_is_told_with_its_topics_and_partitions():
    app = faust.App("assign-test", broker="kafka://127.0.0.1:9")
    told: list[frozenset[tuple[str, int]]] = []
    faust_compat.on_assignment(app, told.append)
    asyncio.run(app.on_partitions_assigned.send({TP("events", 0), TP("stage2", 3)}))
    asyncio.run(app.on_partitions_assigned.send(set()))
    assert told == [frozenset({("events", 0), ("stage2", 3)}), frozenset()]
