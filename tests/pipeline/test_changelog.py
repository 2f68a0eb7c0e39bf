"""A changelog window (pipeline/changelog.py): the latest value per key, sealed at its size,
its values kept at their own size."""

from __future__ import annotations

import tracemalloc

import orjson

from dpstream.pipeline.changelog import RECORD_OVERHEAD, ChangelogWindow


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
