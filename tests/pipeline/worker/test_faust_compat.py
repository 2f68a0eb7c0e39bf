"""pipeline/worker/faust_compat, one test per piece of Faust or aiokafka internals we rely on."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from types import SimpleNamespace

import faust
import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from dpstream.config.schema import parse_config
from dpstream.pipeline.worker import faust_compat
from dpstream.pipeline.worker.app import create_app
from dpstream.pipeline.worker.faust_compat import recovery, transport
from dpstream.pipeline.worker.keys import PipelineKey


def test_the_versions_it_was_written_for_are_checked():
    faust_compat.check_versions()  # the pinned ones are installed
    with pytest.raises(faust_compat.FaustVersionError) as info:
        faust_compat.check_versions({"faust-streaming": "0.15.3", "aiokafka": "0.13.0"})
    assert "written for aiokafka 0.14.0, faust-streaming 0.15.3; found aiokafka 0.13.0" in str(
        info.value
    )


def test_only_the_workers_app_gets_the_fixed_transport(tmp_path):
    cfg = parse_config({"privacy": {"total_epsilon": 1}, "noise": {"mode": "insecure_zero"},
                        "statistics": [{"name": "e", "epsilon": 1, "tau": 1}]})  # fmt: skip
    app = create_app(cfg, "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path)
    assert type(app.transport) is transport.Transport
    assert app.transport.Consumer is transport.Consumer
    assert (
        transport.Consumer._new_consumer_thread is not faust_aiokafka.Consumer._new_consumer_thread
    )
    # A plain Faust app in the same process keeps Faust's own transport: no global patch.
    plain = faust.App("plain", broker="kafka://127.0.0.1:9")
    assert type(plain.transport) is faust_aiokafka.Transport
    assert AIOKafkaConsumer.seek_to_committed.__module__.startswith("aiokafka")


def test_uncommitted_stream_partitions_seek_to_their_beginning(monkeypatch):
    events, changelog = TopicPartition("events", 0), TopicPartition("app-stage1-changelog", 0)
    resumed = TopicPartition("events", 1)

    async def committed(self, *partitions):
        return {events: None, changelog: None, resumed: 17}

    monkeypatch.setattr(AIOKafkaConsumer, "seek_to_committed", committed)

    class Recorder:
        seeks: list = []

        def seek(self, tp, offset):
            self.seeks.append((tp, offset))

    consumer = Recorder()
    out = asyncio.run(transport.seek_uncommitted_to_beginning(consumer, {"app-stage1-changelog"}))
    assert out == {events: None, changelog: None, resumed: 17}
    assert consumer.seeks == [(events, 0)]  # not the changelog, not a committed partition


def test_a_producer_flush_sends_the_windows_first_and_waits_for_the_buffer():
    # What Faust's ProducerBuffer offers and the hook uses: its sender task reads
    # _send_pending once, when it starts (so the hook, installed before, is the one used).
    real = faust.App("flush-test", broker="kafka://127.0.0.1:9").producer.buffer
    assert callable(real.flush_atmost) and real.size == 0 and callable(real._send_pending)
    assert "send_pending = self._send_pending" in inspect.getsource(type(real)._handle_pending.fun)
    order: list[str] = []

    class Buffer:  # two sends pending, one leaves per flush_atmost
        size = 2

        async def flush_atmost(self, n):
            order.append(f"buffer {n}")
            self.size -= 1

        async def _send_pending(self, fut):
            pass

    app = SimpleNamespace(producer=SimpleNamespace(buffer=Buffer()))

    async def send():
        order.append("windows")

    faust_compat.send_first_on_flush(app, send)
    asyncio.run(app.producer.buffer.flush())
    assert order == ["windows", "buffer None", "buffer None"]


def test_a_producer_flush_waits_for_a_message_on_its_way_to_aiokafka():
    # The buffer is empty (its sender took the message) but the send has not reached
    # aiokafka yet: the flush must not return before it has.
    order: list[str] = []
    arrived = None

    class Buffer:
        size = 0

        async def flush_atmost(self, n):
            raise AssertionError("nothing is in the buffer")

        async def _send_pending(self, fut):
            await arrived.wait()
            order.append(f"sent {fut}")

    async def send():
        order.append("windows")

    app = SimpleNamespace(producer=SimpleNamespace(buffer=Buffer()))
    faust_compat.send_first_on_flush(app, send)

    async def run() -> None:
        nonlocal arrived
        arrived = asyncio.Event()
        buffer = app.producer.buffer
        sender = asyncio.ensure_future(buffer._send_pending("m1"))  # as _handle_pending does
        await asyncio.sleep(0)
        flush = asyncio.ensure_future(buffer.flush())
        await asyncio.sleep(0.01)
        assert not flush.done()
        arrived.set()
        await flush
        order.append("flushed")
        await sender

    asyncio.run(run())
    assert order == ["windows", "sent m1", "flushed"]


def test_a_memory_table_exposes_its_entries_and_key_partitions():
    app = faust.App("store-test", broker="kafka://127.0.0.1:9", store="memory://")
    table = app.Table("t", partitions=2, key_type=str)
    data, key_partition = faust_compat.memory_store(table)
    data["k"] = {"v": 1}
    key_partition["k"] = 1
    assert table.data.data["k"] == {"v": 1} and table.data._key_partition == {"k": 1}


class SeekRecorder:
    """What the watchdog uses of Faust's consumer, recorded; aiokafka's state of every
    partition: read up to its highwater, 85."""

    def __init__(self) -> None:
        self.resumed: list[set] = []
        self.seeks: list[dict] = []
        self.flow_active = True
        self._active_partitions: set = set()  # Faust paused them all
        read_out = SimpleNamespace(has_valid_position=True, position=85, highwater=85)
        assignment = SimpleNamespace(state_value=lambda tp: read_out)
        aiokafka = SimpleNamespace(
            _subscription=SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))
        )
        self._thread = SimpleNamespace(_ensure_consumer=lambda: aiokafka)

    def resume_partitions(self, tps) -> None:
        self.resumed.append(set(tps))

    async def seek_wait(self, partitions) -> None:
        self.seeks.append(dict(partitions))


def test_a_stalled_table_recovery_is_sought_again_then_the_worker_stops(monkeypatch, caplog):
    # Faust's own Recovery object and state, as its recovery sets them.
    app = faust.App("recovery-test", broker="kafka://127.0.0.1:9", store="memory://")
    faust_recovery = app.tables.recovery
    stalled, done, moving = (TopicPartition("app-stage1-changelog", p) for p in range(3))
    faust_recovery.active_highwaters.update({stalled: 85, done: 40, moving: 90})
    faust_recovery.active_offsets.update({stalled: -1, done: 40, moving: 12})
    faust_recovery._set_recovery_started()  # what _restart_recovery does before reading
    started = faust_recovery._recovery_started_at
    assert app.in_recovery and faust_recovery.in_recovery

    crashes: list[int] = []  # exit_now, at once: Faust's app.crash can hang
    monkeypatch.setattr(recovery, "exit_now", lambda: crashes.append(1))

    consumer = SeekRecorder()
    now = [started]
    fake = SimpleNamespace(tables=app.tables, consumer=consumer)
    watchdog = faust_compat.RecoveryWatchdog(fake, stall_after=15.0, clock=lambda: now[0])

    def at(seconds: float, moving_received: float | None = None) -> None:
        now[0] = started + seconds
        if moving_received is not None:
            faust_recovery._active_events_received_at[moving] = started + moving_received
        asyncio.run(watchdog.check())

    at(14.0, moving_received=14.0)
    assert consumer.seeks == [] and crashes == []
    # 15 s without a record of `stalled` (none since the start; -1 is read from 0); `done`
    # has nothing left; `moving` received one 1 s ago.
    with caplog.at_level(logging.WARNING):
        at(15.0, moving_received=14.0)
    assert consumer.resumed == [{stalled}] and consumer.seeks == [{stalled: 0}]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "table recovery: no changelog record for 15 s from app-stage1-changelog[0]@0; "
        "seeking them again",
        "table recovery: before the seek, Faust's flow on; "
        "app-stage1-changelog[0] at 85 of 85, paused",
    ]
    at(29.0, moving_received=28.0)  # still nothing, but the seek was 14 s ago
    assert len(consumer.seeks) == 1 and crashes == []
    with caplog.at_level(logging.CRITICAL):
        at(30.0, moving_received=29.0)
    assert len(consumer.seeks) == 1 and crashes == [1]
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert line.getMessage() == (
        "table recovery still stalled at app-stage1-changelog[0]@0 after a new seek; "
        "stopping the worker"
    )

    # A later recovery starts over: a seek first, not a crash.
    faust_recovery._set_recovery_started()
    started = faust_recovery._recovery_started_at
    at(15.0, moving_received=15.0)
    assert len(consumer.seeks) == 2 and len(crashes) == 1
    faust_recovery._set_recovery_ended()
    at(60.0)
    assert len(consumer.seeks) == 2 and len(crashes) == 1  # not in recovery: nothing to do


def test_the_worker_app_runs_the_recovery_watchdog(tmp_path, monkeypatch):
    watched: list = []
    monkeypatch.setattr(faust_compat, "watch_recovery", watched.append)
    cfg = parse_config({"privacy": {"total_epsilon": 1}, "noise": {"mode": "insecure_zero"},
                        "statistics": [{"name": "e", "epsilon": 1, "tau": 1}]})  # fmt: skip
    app = create_app(cfg, "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path)
    assert watched == [app]
    # It starts at the first assignment, before Faust's first recovery (app timers start
    # after it), and once.
    plain = faust.App("watch-test", broker="kafka://127.0.0.1:9")
    watchdog = recovery.watch_recovery(plain, stall_after=8.0)
    started: list = []
    monkeypatch.setattr(plain, "add_future", lambda coro: started.append(coro) or coro)

    async def assigned_twice() -> None:
        await plain.on_partitions_assigned.send(set())
        await plain.on_partitions_assigned.send(set())

    asyncio.run(assigned_twice())
    assert len(started) == 1 and started[0].cr_code.co_name == "run"
    assert watchdog.task is started[0] and watchdog.stall_after == 8.0
    started[0].close()


class FetchingConsumer:
    """What the consumer thread's fetch uses of aiokafka's consumer: ``fetched_records``
    returns ``batch`` after ``during_fetch`` ran (the main thread acting meanwhile)."""

    def __init__(self, batch: dict, during_fetch=lambda: None) -> None:
        self._closed = False
        self._fetcher = SimpleNamespace(
            _closed=False,
            _subscriptions=SimpleNamespace(fetch_context=contextlib.nullcontext),
            fetched_records=self.fetched_records,
        )
        self.batch = batch
        self.during_fetch = during_fetch
        self.asked: list = []
        self.seeks: list = []

    async def fetched_records(self, partitions, timeout=0, max_records=None):
        self.asked.append(partitions)
        self.during_fetch()
        return self.batch

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))


def record(offset: int) -> SimpleNamespace:
    return SimpleNamespace(offset=offset)


def worker_consumer_thread(tmp_path):
    cfg = parse_config({"privacy": {"total_epsilon": 1}, "noise": {"mode": "insecure_zero"},
                        "statistics": [{"name": "e", "epsilon": 1, "tau": 1}]})  # fmt: skip
    thread = create_app(cfg, "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path).consumer._thread
    assert type(thread) is transport.ConsumerThread
    return thread


def test_a_fetch_asks_for_the_partitions_active_when_it_starts_never_all(tmp_path):
    thread = worker_consumer_thread(tmp_path)
    events, changelog = TP("events", 0), TP("app-stage1-changelog", 1)
    active = {events}  # Faust's live set, as its fetch loop passes it
    batch = {events: [record(5), record(6)]}
    aiokafka = FetchingConsumer(batch, during_fetch=lambda: active.add(changelog))
    assert asyncio.run(thread._fetch_records(aiokafka, active, timeout=1.0)) == batch
    assert aiokafka.asked == [{events}]  # a copy: the live set changed during the call
    assert aiokafka.seeks == []
    # Faust paused every partition (the set is empty, in place): aiokafka would read an
    # empty set as every partition; nothing is asked for and nothing returned.
    active.clear()
    assert asyncio.run(thread._fetch_records(aiokafka, active, timeout=1.0)) == {}
    assert len(aiokafka.asked) == 1


def test_records_fetched_after_the_flow_stopped_are_handed_back_to_aiokafka(tmp_path):
    thread = worker_consumer_thread(tmp_path)
    faust_consumer = thread.consumer
    events, changelog = TP("events", 2), TP("app-stage1-changelog", 3)
    faust_consumer.resume_partitions({events, changelog})
    active = faust_consumer._get_active_partitions()  # the live set Faust's loop passes

    def revocation() -> None:  # what Faust's on_rebalance does while aiokafka waits
        faust_consumer.stop_flow()
        faust_consumer.pause_partitions(set(active))

    batch = {changelog: [record(0), record(1), record(2)], events: [record(40)]}
    aiokafka = FetchingConsumer(batch, during_fetch=revocation)
    assert asyncio.run(thread._fetch_records(aiokafka, active, timeout=1.0)) == {}
    assert aiokafka.asked == [{events, changelog}] and active == set()
    # Each partition back to its first returned record: fetched again, nothing lost.
    assert sorted(aiokafka.seeks) == [(changelog, 0), (events, 40)]
    # A fetch that starts while the flow is stopped returns nothing (Faust's own check).
    faust_consumer.resume_partitions({events})
    assert asyncio.run(thread._fetch_records(aiokafka, {events}, timeout=1.0)) == {}
    assert len(aiokafka.asked) == 1


async def timed_failed_update(client) -> float:
    """Seconds one metadata update of ``client`` takes where no broker answers (it knows no
    node: the update fails at once, as a refused connection does)."""
    started = time.monotonic()
    assert await client._metadata_update(client.cluster, set()) is False
    return time.monotonic() - started


def test_a_failed_metadata_update_waits_the_retry_backoff_before_the_next(tmp_path):
    # With the broker gone, a few hundred sends waiting for metadata kept aiokafka's
    # metadata task failing about 5,000 times a second: a core, and megabytes of log.
    async def run() -> tuple[float, float]:
        plain = AIOKafkaClient(bootstrap_servers="127.0.0.1:9", retry_backoff_ms=300)
        fixed = AIOKafkaClient(bootstrap_servers="127.0.0.1:9", retry_backoff_ms=300)
        transport.back_off_failed_metadata(fixed)
        return await timed_failed_update(plain), await timed_failed_update(fixed)

    plain, fixed = asyncio.run(run())
    assert plain < 0.3 <= fixed


def test_the_workers_producer_and_consumer_back_off_failed_metadata_updates(tmp_path):
    thread = worker_consumer_thread(tmp_path)
    app = thread.app

    async def run() -> list[float]:
        producer = app.producer._new_producer()
        consumer = thread._create_worker_consumer(app.transport)
        try:
            return [await timed_failed_update(c) for c in (producer.client, consumer._client)]
        finally:
            await producer.stop()
            await consumer.stop()

    backoff = 0.1  # aiokafka's default retry_backoff_ms, which Faust keeps
    assert all(seconds >= backoff for seconds in asyncio.run(run()))


def test_the_workers_consumer_group_is_the_apps_worker_group(tmp_path):
    """Faust's group id is the app id, which a prefixed ACL on "<app_id>-" does not cover;
    the worker's is "<app_id>-worker", like every group of dpstream (pipeline/topics.py)."""
    thread = worker_consumer_thread(tmp_path)

    async def group_of_a_new_consumer() -> str:
        consumer = thread._create_worker_consumer(thread.transport)
        await consumer.stop()  # never started: only closes what was made
        return consumer._group_id  # what aiokafka joins with at start

    assert thread.app.conf.id == "dpstream"
    assert asyncio.run(group_of_a_new_consumer()) == "dpstream-worker"
