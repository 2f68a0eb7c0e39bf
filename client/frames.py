"""``to_dataframe``: typed records as a pandas DataFrame (``pip install dpstream[pandas]``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .records import DeadLetter, LedgerEntry, Release


def to_dataframe(records: Iterable[Release | LedgerEntry | DeadLetter]) -> Any:
    """One row per record, one column per typed attribute (``interval`` as
    ``interval_low`` and ``interval_high``; ``fields``, the whole record, as a column of
    dicts; ``position`` as ``kafka_topic``, ``kafka_partition``, ``kafka_offset`` and
    ``kafka_timestamp_ms``, where the record was read).

    Raises:
        ImportError: pandas is not installed (it is an optional extra).
    """
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "to_dataframe needs pandas, an optional extra: pip install 'dpstream[pandas]'"
        ) from None
    return pandas.DataFrame([_row(r) for r in records])


def _row(record: Release | LedgerEntry | DeadLetter) -> dict[str, Any]:
    row = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    position = row.pop("position")
    if isinstance(record, Release):
        interval = row.pop("interval")
        row["interval_low"], row["interval_high"] = interval or (None, None)
    if isinstance(record, DeadLetter):
        del row["payload"]  # user data: read it from the record, never in bulk by accident
    if position is not None:
        row.update({f"kafka_{k}": v for k, v in dataclasses.asdict(position).items()})
    return row
