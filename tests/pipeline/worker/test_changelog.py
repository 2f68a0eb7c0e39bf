"""Stage 1's changelog (pipeline/worker/changelog.py): a window keeps the latest value per key,
sealed at its size, its values at their own size; a record's user entries go in at once;
a flush with nothing to send touches no producer; a failed changelog write ends the worker
at once."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc

import faust
import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError

from dpstream.pipeline.worker import changelog
from dpstream.pipeline.worker.changelog import (
    RECORD_OVERHEAD,
    WINDOW_BYTES,
    BatchedTable,
    ChangelogWindow,
    PartitionEntries,
)


def test_a_window_keeps_its_values_at_their_size():
    # One value per user written since the last flush: 10,000 users' entries must not
    # take orjson's 4 KiB buffer each (40 MB), only about their own size.
    window = ChangelogWindow(max_bytes=1 << 30)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):  # as PartitionEntries writes: the value is the window's
            window.add(0, f"u:{i}", orjson.dumps({"used": {"events": i}, "offset": i}))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 10_000 * 200, grown


def test_a_window_keeps_the_latest_value_per_key_and_seals_at_its_size():
    window = ChangelogWindow(max_bytes=3 * (3 + 2 + RECORD_OVERHEAD))
    window.add(0, "u:a", b"11")
    window.add(1, "u:a", b"12")
    window.add(0, "u:b", b"21")
    window.add(0, "u:a", b"13")  # replaces 11 in place
    assert not window.full
    window.add(0, "u:c", b"31")
    window.add(0, "p:0", b"41")  # the fourth key of partition 0: seals the first three
    assert window.full
    assert window.take() == [
        (0, [("u:a", b"13"), ("u:b", b"21"), ("u:c", b"31")]),
        (0, [("p:0", b"41")]),
        (1, [("u:a", b"12")]),
    ]
    assert window.take() == [] and not window.full


@pytest.mark.parametrize("max_bytes", [120, 400, WINDOW_BYTES])
def test_a_records_user_entries_written_at_once_are_the_same_writes(max_bytes):
    """``PartitionEntries.update`` (stage 1 writes a record's users in one call) leaves
    the store, the keys' partitions and the windows (sealed where they were) as the
    same writes one at a time."""
    values = [(f"{i % 7}", {"used": {"all": i}, "offset": i}) for i in range(40)]

    def run(at_once: bool) -> tuple:
        data: dict = {}
        key_partition: dict = {}
        window = ChangelogWindow(max_bytes)
        users = PartitionEntries(data, key_partition, window, 3, "u:")
        if at_once:
            users.update(values)
        else:
            for key, value in values:
                users[key] = value
        return data, key_partition, window.full, window.take()

    at_once = run(True)
    assert at_once == run(False)
    assert at_once[0]["u:6"] == {"used": {"all": 34}, "offset": 34}
    assert at_once[1] == {f"u:{i}": 3 for i in range(7)}


def test_a_flush_with_nothing_to_send_touches_no_producer():
    # At shutdown Faust flushes its producer buffer (and so this table) once more after
    # the producer has stopped: asking for the producer then raised NotReady and logged
    # a traceback at every clean stop.
    class StoppedApp:
        @property
        def producer(self):
            raise AssertionError("the producer was asked for")

    asyncio.run(BatchedTable(StoppedApp(), table=None).flush(delivered=True))


class RecordingProducer:
    """The part of aiokafka's producer a flush uses; each window's delivery is a future
    the test completes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, list]] = []
        self.deliveries: list[asyncio.Future] = []

    def create_batch(self) -> RecordingBatch:
        return RecordingBatch()

    async def send_batch(self, batch, topic: str, partition: int) -> asyncio.Future:
        self.sent.append((topic, partition, batch.records))
        self.deliveries.append(asyncio.get_running_loop().create_future())
        return self.deliveries[-1]


class RecordingBatch:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def append(self, key: bytes, value: bytes, timestamp: None) -> object:
        self.records.append((key, value))
        return object()  # not None: the record fits

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("outcome", "failure"),
    [("failed", "KafkaTimeoutError()"), ("cancelled", "cancelled"), ("delivered", None)],
)
def test_a_failed_changelog_write_ends_the_worker_at_once_naming_its_partition(
    monkeypatch, caplog, outcome, failure
):
    # Its state would be lost at the next crash while its input offsets get committed.
    # Faust's app.crash stopped the worker gracefully here, a stop that can hang.
    app = faust.App("changelog-test", broker="kafka://127.0.0.1:9", store="memory://")
    table = app.Table("stage1", partitions=4, key_type=str)
    producer, exits = RecordingProducer(), []
    monkeypatch.setattr(changelog, "aiokafka_producer", lambda _app: producer)
    monkeypatch.setattr(changelog, "exit_now", lambda: exits.append(1))
    batched = BatchedTable(app, table)
    batched.for_partition(3)["p:3"] = {"offset": 7}

    async def write() -> None:
        await batched.flush()
        [delivery] = producer.deliveries
        if outcome == "failed":
            delivery.set_exception(KafkaTimeoutError())
        elif outcome == "cancelled":
            delivery.cancel()
        else:
            delivery.set_result(None)
        await asyncio.sleep(0)  # the delivery's callbacks run

    with caplog.at_level(logging.DEBUG):
        asyncio.run(write())
    assert producer.sent == [("changelog-test-stage1-changelog", 3, [(b'"p:3"', b'{"offset":7}')])]
    if failure is None:
        assert exits == [] and [r for r in caplog.records if r.name == changelog.__name__] == []
        return
    assert exits == [1]
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert line.getMessage() == (
        f"stage-1 changelog write to changelog-test-stage1-changelog[3] failed: {failure}; "
        "stopping the worker"
    )


def test_a_flush_cancelled_while_it_waits_leaves_the_deliveries_alone(monkeypatch):
    # At shutdown Faust cancels the agent while it may wait for a marker's flush; a
    # delivery cancelled with it would read as a failed write and stop the worker (70).
    app = faust.App("changelog-test", broker="kafka://127.0.0.1:9", store="memory://")
    producer, exits = RecordingProducer(), []
    monkeypatch.setattr(changelog, "aiokafka_producer", lambda _app: producer)
    monkeypatch.setattr(changelog, "exit_now", lambda: exits.append(1))
    batched = BatchedTable(app, app.Table("stage1", partitions=4, key_type=str))
    batched.for_partition(1)["p:1"] = {"offset": 3}

    async def cancel_a_waiting_flush() -> None:
        waiting = asyncio.ensure_future(batched.flush(delivered=True))
        await asyncio.sleep(0.01)  # the window is sent, the flush waits for its delivery
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        [delivery] = producer.deliveries
        assert not delivery.done()
        delivery.set_result(None)
        await asyncio.sleep(0)

    asyncio.run(cancel_a_waiting_flush())
    assert exits == []
