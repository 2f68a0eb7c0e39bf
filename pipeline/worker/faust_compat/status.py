"""What the worker's health probes and metrics need of Faust's state (docs/operations.md):
the partitions each rebalance assigns, and whether its tables are being recovered.

* Assignment: Faust sends ``App.on_partitions_assigned`` with the member's whole new
  assignment (aiokafka's eager protocol: what is not in it was revoked) once its own
  handling of the rebalance is done, before the table recovery starts.
* Recovery: ``App.rebalancing`` is set when a rebalance starts (the revocation) and cleared
  by ``App.on_rebalance_end``, which Faust's ``Recovery`` calls only once the recovery of
  the tables from their changelogs has ended and the streams are resumed
  (faust-streaming 0.15.3, ``tables/recovery.py``); ``Recovery.in_recovery`` is set while
  changelog records are read, and ``_recovery_started_at`` / ``_recovery_ended_at`` (their
  ``time.monotonic()``) bound that reading. A rebalance with nothing to read sets neither
  time anew.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import faust

if TYPE_CHECKING:
    # The class behind the app's tables: Faust types them by an interface without
    # ``recovery``.
    from faust.tables.manager import TableManager


@dataclass(frozen=True)
class TableStatus:
    """Faust's rebalance and table recovery, at one moment.

    Attributes:
        rebalancing: a rebalance started and its recovery has not ended.
        in_recovery: changelog records are being read into the tables.
        recovery_started: when the latest reading of changelog records began
            (``time.monotonic()``; None: never).
        recovery_ended: when it ended (None: it has not, or never began).
    """

    rebalancing: bool
    in_recovery: bool
    recovery_started: float | None
    recovery_ended: float | None

    @property
    def recovered(self) -> bool:
        """No rebalance or recovery is under way: the tables hold their partitions' state."""
        return not self.rebalancing and not self.in_recovery


def table_status(app: faust.App) -> TableStatus:
    """Where ``app``'s rebalance and table recovery stand (call it in the app's loop).
    Faust makes its ``Recovery`` service when its tables start: none yet, no recovery."""
    recovery = cast("TableManager", app.tables)._recovery
    if recovery is None:
        return TableStatus(bool(app.rebalancing), False, None, None)
    return TableStatus(
        bool(app.rebalancing),
        bool(recovery.in_recovery),
        recovery._recovery_started_at,
        recovery._recovery_ended_at,
    )


def on_assignment(app: faust.App, assigned: Callable[[frozenset[tuple[str, int]]], None]) -> None:
    """Call ``assigned`` with the (topic, partition)s of every new assignment of ``app``'s
    consumer (changelog partitions included), in the app's loop."""

    async def receive(*args: Any, **_kwargs: Any) -> None:
        tps: Set[Any] = args[1]  # the signal's receivers get (app, assigned)
        assigned(frozenset((tp.topic, tp.partition) for tp in tps))

    app.on_partitions_assigned.connect(receive)
