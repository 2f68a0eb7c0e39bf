"""What ``pipeline/changelog.py`` needs of a Faust app and table beyond public APIs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import faust


def aiokafka_producer(app: faust.App) -> Any:
    """The app's aiokafka producer (``create_batch``, ``send_batch``)."""
    return app.producer._ensure_producer()


def memory_store(table: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """A memory-store table's entries and its key -> partition map.

    Faust's memory store learns a key's partition only from recovery; a writer that sets
    it lets Faust drop a revoked partition's entries instead of keeping them stale.
    """
    store = table.data  # faust.stores.memory.Store, created lazily by Faust
    return store.data, store._key_partition


def send_first_on_flush(app: faust.App, send: Callable[[], Awaitable[None]]) -> None:
    """Make the app's producer flush (before a commit, at a rebalance, at shutdown) await
    ``send`` first, then wait until Faust's own send buffer is empty.

    Faust's ``ProducerBuffer.flush`` gives up after 0.1 s without a send (``flush_atmost``,
    faust-streaming 0.15.3), so offsets were committed while changelog writes of the
    committed records still sat in the buffer, and a crash lost them for good
    (docs/reliability.md). The loop waits for them.
    """
    buffer = app.producer.buffer

    async def flush() -> None:
        await send()
        while buffer.size:
            await buffer.flush_atmost(None)

    buffer.flush = flush  # type: ignore[method-assign]
