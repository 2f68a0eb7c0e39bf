"""``to_dataframe``: one row per record, the interval in two columns, and a clear message
where pandas is missing."""

from __future__ import annotations

import sys

import orjson
import pytest

from dpstream.client import records, to_dataframe
from dpstream.client.records import Position


def release(tick: int, value: int) -> records.Release:
    record = {
        "schema_version": 3, "statistic": "views", "kind": "count", "tick": tick,
        "tick_end": "2026-11-27T10:00:07+00:00", "tick_end_unix": 1795773607.0,
        "confidence": 0.95, "epsilon": 1.0, "neighbours": "add/remove one user",
        "mechanism": "binary_tree", "step": tick, "value": value, "std": 1.5,
        "interval": [value - 3, value + 3], "tau": 2,
    }  # fmt: skip
    return records.release(orjson.dumps(record), Position("dp.views", 0, tick, 0))


def test_releases_as_a_dataframe():
    pytest.importorskip("pandas")  # the optional extra (`make install` has it)
    frame = to_dataframe([release(1, 10), release(2, 12)])
    assert list(frame["tick"]) == [1, 2] and list(frame["value"]) == [10, 12]
    assert list(frame["interval_low"]) == [7, 9] and list(frame["interval_high"]) == [13, 15]
    assert list(frame["kafka_offset"]) == [1, 2] and "interval" not in frame


def test_without_pandas_the_message_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'dpstream\[pandas\]'"):
        to_dataframe([release(1, 10)])
