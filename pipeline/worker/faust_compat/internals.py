"""What ``pipeline/worker/changelog.py`` needs of a Faust app and table beyond public APIs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import faust

if TYPE_CHECKING:
    # The classes behind the app's producer and its buffer (our transport is Faust's
    # aiokafka one): Faust types them by interfaces, without what this module reaches.
    from faust.transport.drivers.aiokafka import Producer
    from faust.transport.producer import ProducerBuffer


def aiokafka_producer(app: faust.App) -> Any:
    """The app's aiokafka producer (``create_batch``, ``send_batch``)."""
    return cast("Producer", app.producer)._ensure_producer()


def memory_store(table: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """A memory-store table's entries and its key -> partition map.

    Faust's memory store learns a key's partition only from recovery; a writer that sets
    it lets Faust drop a revoked partition's entries instead of keeping them stale.
    """
    store = table.data  # faust.stores.memory.Store, created lazily by Faust
    return store.data, store._key_partition


def send_first_on_flush(app: faust.App, send: Callable[[], Awaitable[None]]) -> None:
    """Make the app's producer flush (before a commit, at a rebalance, at shutdown) await
    ``send`` first, then wait until Faust's own send buffer is empty and no message of it
    is still on its way to aiokafka.

    Faust's ``ProducerBuffer.flush`` gives up after 0.1 s without a send (``flush_atmost``,
    faust-streaming 0.15.3), so offsets were committed while changelog writes of the
    committed records still sat in the buffer, and a crash lost them for good
    (docs/reliability.md). The loop waits for them. Its ``size`` also drops as soon as its
    sender task takes a message, before that message reaches aiokafka's accumulator
    (``publish_message`` awaits the producer and the send): aiokafka's flush, which comes
    next, would not wait for it. Counting the sends under way closes that gap. Call this
    before the app starts (the sender task reads ``_send_pending`` when it starts).
    """
    buffer = cast("ProducerBuffer", app.producer.buffer)
    send_pending = buffer._send_pending
    under_way = 0

    async def counted_send_pending(fut: Any) -> None:
        nonlocal under_way
        under_way += 1
        try:
            await send_pending(fut)
        finally:
            under_way -= 1

    async def flush() -> None:
        await send()
        while buffer.size or under_way:
            if buffer.size:
                await buffer.flush_atmost(None)
            else:
                await asyncio.sleep(0.001)

    buffer._send_pending = counted_send_pending  # type: ignore[method-assign]
    buffer.flush = flush  # type: ignore[method-assign]
