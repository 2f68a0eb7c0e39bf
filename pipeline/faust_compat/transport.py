"""The worker's Kafka transport: Faust's aiokafka transport, with one fix, for dpstream's app.

At a rebalance Faust clears the records its agents had buffered but not processed, then
seeks every partition to its committed offset (``Consumer.perform_seek``). aiokafka's
``seek_to_committed`` (0.14.0) seeks only when the committed offset is positive: a
partition without one (no commit yet: a worker that had run for less than a commit
interval, or whose commits were discarded at the revocation) keeps its fetch position,
which is past the cleared records. Those records were never processed and never are.
Seen in ``test_two_workers_one_dies_the_survivor_takes_over`` (docs/reliability.md): the
first worker kept partitions 2 and 3 at the second worker's join, had fetched offsets
21-26 and 17-27 of them, and went on at 27 and 28.

The fix seeks such partitions of the app's stream topics to their beginning, which is
what ``auto_offset_reset = earliest`` promises; stage 1 and stage 2 are idempotent per
record, so records already processed change nothing. Changelog partitions are left alone
(Faust's recovery positions them itself). It applies to the consumers of apps whose
broker URL uses :data:`SCHEME` only: the worker's (``pipeline/app.py``).
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka

SCHEME = "dpstream-kafka"
"""Broker URLs ``dpstream-kafka://host:port`` select :class:`Transport`."""


async def seek_uncommitted_to_beginning(
    consumer: AIOKafkaConsumer, changelogs: frozenset[str] | set[str], *partitions: Any
) -> dict:
    """aiokafka's ``seek_to_committed``, then a seek to 0 for every stream partition
    without a committed offset (a plain seek: ``seek_to_beginning`` waits for the fetcher
    to reset the position, which it cannot while Faust is in this call; offset 0 gone to
    retention resets to the earliest one by ``auto_offset_reset``)."""
    committed = await AIOKafkaConsumer.seek_to_committed(consumer, *partitions)
    for tp, at in committed.items():
        if not at and tp.topic not in changelogs:
            consumer.seek(tp, 0)
    return committed


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        tables = self.app.tables

        async def seek_to_committed(*partitions: Any) -> dict:
            changelogs = tables.changelog_topics  # known once the tables are set up
            return await seek_uncommitted_to_beginning(consumer, changelogs, *partitions)

        consumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
        return consumer


class Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer


def register_transport() -> None:
    """Make :data:`SCHEME` URLs resolve to :class:`Transport` (Faust's transport registry)."""
    TRANSPORTS.aliases[SCHEME] = f"{__name__}:Transport"
