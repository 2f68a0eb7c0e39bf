"""The one place dpstream depends on Faust's and aiokafka's internals.

Everything here was written for, and tested with, the versions in :data:`WRITTEN_FOR`
(pinned in pyproject.toml); :func:`check_versions` refuses to start a worker on others,
since each piece reaches past a public API:

* ``transport``: the worker's Kafka transport, Faust's aiokafka one with its consumer's
  seek to committed offsets and its consumer thread's fetch fixed for dpstream's own app
  (no process-wide patch), and its consumer group named ``<app_id>-worker`` (Faust's is
  the app id) like every group of dpstream.
* ``internals``: what ``pipeline/worker/changelog.py`` needs of a Faust app and table: the
  aiokafka producer, the memory store's dicts, and a producer flush that sends
  dpstream's changelog windows first.
* ``recovery``: a watchdog on Faust's table recovery, which waits for changelog records
  without a time limit: stalled partitions are sought again, then the worker stops.
* ``status``: what the health probes and metrics read: each new partition assignment,
  and whether a rebalance or a table recovery is under way (and how long it took).

Changing a version: run ``tests/pipeline/worker/test_faust_compat.py`` and the fault suite
(``tests/integration/test_faults.py``), then update :data:`WRITTEN_FOR` and the pins.
"""

from __future__ import annotations

from importlib.metadata import version

from dpstream.operators.errors import DpStreamError

from .internals import aiokafka_producer, memory_store, send_first_on_flush
from .recovery import RecoveryWatchdog, watch_recovery
from .status import TableStatus, on_assignment, table_status
from .transport import SCHEME, register_transport

__all__ = [
    "SCHEME",
    "WRITTEN_FOR",
    "FaustVersionError",
    "RecoveryWatchdog",
    "TableStatus",
    "aiokafka_producer",
    "check_versions",
    "install",
    "memory_store",
    "on_assignment",
    "send_first_on_flush",
    "table_status",
    "watch_recovery",
]

WRITTEN_FOR: dict[str, str] = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}
"""The distributions whose internals this package uses, and their versions."""


class FaustVersionError(DpStreamError):
    """An installed Faust or aiokafka is not the version dpstream's fixes were written for."""


def check_versions(installed: dict[str, str] | None = None) -> None:
    """Raise FaustVersionError unless the installed versions are :data:`WRITTEN_FOR`."""
    found = installed if installed is not None else {d: version(d) for d in WRITTEN_FOR}
    wrong = {d: v for d, v in found.items() if WRITTEN_FOR.get(d) != v}
    if wrong:
        got = ", ".join(f"{d} {v}" for d, v in sorted(wrong.items()))
        need = ", ".join(f"{d} {v}" for d, v in sorted(WRITTEN_FOR.items()))
        raise FaustVersionError(
            f"dpstream's Faust fixes (pipeline/worker/faust_compat) were written for {need}; found "
            f"{got}. Install the versions pinned in pyproject.toml."
        )


def install() -> None:
    """Check the versions and register dpstream's transport (the worker calls this before
    it builds its app; ``SCHEME`` URLs then select it)."""
    check_versions()
    register_transport()
