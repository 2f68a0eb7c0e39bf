"""pipeline/kafka/clients.py without a broker: what the producer tools send, keyed by the
user id wherever ``input.user_id_field`` puts it."""

from __future__ import annotations

import orjson

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.clients import produce_events
from tests.config_builders import minimal


class Recorder:
    """The part of a confluent-kafka Producer that ``produce_events`` uses."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes = b"", **_: object):
        self.sent.append((topic, key, value))

    def poll(self, timeout: float) -> int:
        return 0


def test_events_are_keyed_by_a_nested_user_id():
    # Before: KeyError: 'user_id' (dpstream produce --events, Pipeline.produce).
    cfg = parse_config(minimal(input__user_id_field="actor.id", input__topics=["src"]))
    events = [{"actor": {"id": "u1"}, "key": "view"}, {"actor": {"id": 7}}, {"key": "view"}]
    producer = Recorder()
    assert produce_events(producer, cfg, events) == 3  # type: ignore[arg-type]
    assert producer.sent == [
        ("src", b"u1", orjson.dumps(events[0])),
        ("src", b"7", orjson.dumps(events[1])),  # as str() would, the ingest then refuses it
        ("src", None, orjson.dumps(events[2])),  # no user id: no key, the ingest dead-letters
    ]


def test_a_top_level_user_id_keys_as_before():
    cfg = parse_config(minimal(input__topics=["src"]))
    producer = Recorder()
    produce_events(producer, cfg, [{"user_id": "u2", "key": "view"}])  # type: ignore[arg-type]
    assert [key for _, key, _ in producer.sent] == [b"u2"]
