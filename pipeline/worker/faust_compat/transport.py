"""The worker's Kafka transport: Faust's aiokafka transport with three fixes, for the
clients of apps whose broker URL uses :data:`SCHEME` only: the worker's
(``pipeline/worker/app.py``).

*Partitions without a committed offset restart from their beginning.* At a rebalance
Faust clears the records its agents had buffered but not processed, then seeks every
partition to its committed offset (``Consumer.perform_seek``). aiokafka's
``seek_to_committed`` (0.14.0) seeks only when the committed offset is positive: a
partition without one (no commit yet: a worker that had run for less than a commit
interval, or whose commits were discarded at the revocation) keeps its fetch position,
which is past the cleared records. Those records were never processed and never are.
Seen in ``test_two_workers_one_dies_the_survivor_takes_over`` (docs/reliability.md): the
first worker kept partitions 2 and 3 at the second worker's join, had fetched offsets
21-26 and 17-27 of them, and went on at 27 and 28. The fix seeks such partitions of the
app's stream topics to their beginning, which is what ``auto_offset_reset = earliest``
promises; stage 1 and stage 2 are idempotent per record, so records already processed
change nothing. Changelog partitions are left alone (Faust's recovery positions them).

*Records fetched while the flow is stopped go back to aiokafka.* Faust's fetch loop
(faust-streaming 0.15.3, ``Consumer._wait_next_records``) hands the consumer thread its
*live* set of active partitions, and the thread checks ``flow_active`` only when the call
starts. At a revocation Faust stops the flow and pauses every partition, which empties
that set in place, and aiokafka's ``fetched_records`` reads an empty set as *every*
partition; the call waits for the new assignment and then takes what aiokafka fetched
meanwhile, moving its positions past those records. Faust's ``getmany`` drops a batch
that comes back while the flow is stopped and seeks only the stream partitions again
(``perform_seek``). Changelog partitions are positioned by Faust's recovery, which seeks
them before it resumes the flow: their records fetched after that seek (aiokafka keeps a
fetch under way when its offset is the one sought) were dropped, and the recovery waited
for them forever (``recovery.py``). :meth:`ConsumerThread._fetch_records` asks aiokafka
for a copy of the active partitions taken when the call starts (an empty one: nothing,
never every partition), and when the flow stopped during the call it seeks each partition
back to its first record returned (:func:`hand_back`) and returns none.

*A failed metadata update is not retried at once.* aiokafka coalesces metadata updates
in one task per client, which starts the next update as soon as anyone asks once the last
one is over; every send waiting for a topic's metadata asks again 100 ms after its last
answer (``AIOKafkaClient._wait_on_metadata``). With the broker gone, a failed update takes
well under a millisecond (a refused connection), so a few hundred such sends kept the task
failing about 5,000 times a second: 75-93% of a core and, before the client logs were
rate-limited, 250 KB/s of log (measured on a worker whose broker was stopped: about half
the runs, depending on what was under way at that moment; docs/reliability.md, "A broker
that goes away"). :func:`back_off_failed_metadata` makes that task wait
``retry_backoff_ms`` after a failed update, as each caller already does, so a client
tries at most ten times a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from faust.transport.consumer import RecordMap
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from ...kafka.topics import group_id

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


def hand_back(consumer: AIOKafkaConsumer, records: RecordMap) -> None:
    """Seek each partition of ``records`` back to its first record: aiokafka fetches them
    again (its buffered records of the partition go, as at any seek). Call it in the
    consumer thread with no await since the records were returned, so the partitions are
    still assigned and no other seek came between."""
    for tp, batch in records.items():
        if batch:
            consumer.seek(tp, batch[0].offset)


def back_off_failed_metadata(client: AIOKafkaClient) -> None:
    """Make ``client``'s metadata task wait ``retry_backoff_ms`` after a failed update
    before it returns, so that the next update starts no sooner (see the module
    docstring). A successful update returns at once."""
    update = client._metadata_update
    backoff = client._retry_backoff

    async def backing_off(cluster_metadata: Any, topics: Any) -> bool:
        updated = bool(await update(cluster_metadata, topics))
        if not updated:
            await asyncio.sleep(backoff)
        return updated

    client._metadata_update = backing_off  # type: ignore[method-assign]


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def _fetch_records(
        self,
        consumer: AIOKafkaConsumer,
        active_partitions: Set[TP] | None,
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> RecordMap:
        """Faust's fetch, from a copy of the active partitions taken now; records that
        come back after the flow stopped go back to aiokafka (see the module docstring)."""
        if active_partitions is None:  # a client-only app: Faust asks for every partition
            # Faust's annotation leaves out the None it passes here itself.
            return await super()._fetch_records(consumer, None, timeout, max_records)  # type: ignore[arg-type]
        partitions = set(active_partitions)  # a copy: Faust empties its own set in place
        if not partitions:
            return {}
        records = await super()._fetch_records(consumer, partitions, timeout, max_records)
        if records and not self.consumer.flow_active:
            hand_back(consumer, records)
            return {}
        return records

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Faust's group id is the app id; dpstream's groups all start with "<app_id>-", so
        # that one prefixed ACL covers them (pipeline/topics.py). aiokafka reads it at start.
        consumer._group_id = group_id(self.app.conf.id, "worker")
        tables = self.app.tables

        async def seek_to_committed(*partitions: Any) -> dict:
            changelogs = tables.changelog_topics  # known once the tables are set up
            return await seek_uncommitted_to_beginning(consumer, changelogs, *partitions)

        consumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
        back_off_failed_metadata(consumer._client)
        return consumer


class Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Producer(faust_aiokafka.Producer):
    def _new_producer(self, transactional_id: str | None = None) -> AIOKafkaProducer:
        producer = super()._new_producer(transactional_id)
        back_off_failed_metadata(producer.client)
        return producer


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer
    Producer = Producer


def register_transport() -> None:
    """Make :data:`SCHEME` URLs resolve to :class:`Transport` (Faust's transport registry)."""
    TRANSPORTS.aliases[SCHEME] = f"{__name__}:Transport"
