"""Hostile input against a real broker, through the ingest (issue 6, item 4; issue 14).

Hypothesis generates a batch of source records -- malformed, truncated, huge, deeply
nested, wrong-typed, NaN/infinity, negative, unicode, forged ``dpstream`` headers (tick
markers and the events topic's own envelopes, which only dpstream writes, in its events
topic), envelopes that mix good and bad events, and duplicates of all of these --
together with good records that are odd but valid (unicode user ids, extra and deeply
nested fields, negative or huge values where a count ignores them, foreign headers,
envelopes of many users). Each goes to the SOURCE topic as users' producers would send
it: to a fixed partition or the one librdkafka's partitioner picks, keyed by the user id,
by something else or not at all, into a source topic whose partition count is not the
events topic's. One worker run per noise mode (its ingest in a child process, small
ingest batches) is fed the batch, shuffled into seeded good traffic, over about ten
ticks.

Each generated record carries what it must become: the good events it holds (with their
index in the record) and the dead-letter entries (index, reason) it must produce. So the
test knows, without the pipeline's decoder, that

* the worker (and its ingest) never crashes, logs no traceback, and never takes its
  "internal error" path;
* the dead-letter topic holds exactly the expected (source partition, source offset,
  index, reason) entries, each once, all naming the source topic -- no bad record is
  lost, no good one dead-lettered -- and the source topic holds only what was produced;
* exactly the good events are accepted, each once: the events ``export-log`` gives are,
  as a multiset, the good events produced (in ``records.event_json`` form); the events
  topic holds each at its source position (partition, offset, index), and each user's
  events of one source partition are counted, and exported, in source order. (Which tick
  an event lands in is the ingest's timing, not the source's: the ticks are taken from
  the export.)
* the releases are exactly what the exported log gives: ``replay`` of it, byte for byte,
  in both noise modes; with zero noise also the truncated counts and sums computed here
  from scratch over its ticks (every release stamped ``insecure``); with keyed noise no
  release is stamped and most differ from the exact values.

Generation is derandomized (a fixed seed per run of the strategy), without shrinking, so
CI sees the same batch every time; a failure names the record category.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import orjson
import pytest
import yaml
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.ingest.consumer import source_lag
from dpstream.pipeline.ingest.route import SourceRecord, route
from dpstream.pipeline.kafka.clients import read_topic
from dpstream.pipeline.stages.drivers import Stage1Driver
from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.wire.records import (
    BATCH,
    ENVELOPE,
    HEADER,
    TICK,
    decode_envelope,
    event_json,
    header_kind,
    limits_for,
    partition_for,
)
from dpstream.pipeline.worker.keys import load_noise
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.testing import unique_names
from tests.integration.producers import create_source_topic
from tests.integration.support import WorkerProcess, readers, wait_for_first_release, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 3  # dpstream's events topic (stage 1)
SOURCE_PARTITIONS = 4  # the users' source topic: not the events topic's count
INGEST_BATCH = 64  # source records per ingest batch: the batch spans many batches
TICK_SECONDS = 0.5
ROUNDS = 10  # one slice of the shuffled records per tick
MAX_RECORD_BYTES = 8192
MAX_USER_ID = 64
MAX_VALUE = 10  # the sum statistic's R
KEYS = ("view", "click", "buy")
MALFORMED = "malformed JSON"
NON_FINITE = "non-finite number (NaN or infinity)"
UNKNOWN_HEADER = "unknown dpstream header"

STATISTICS = [
    {"name": "views", "epsilon": 1.0, "tau": 3, "key": "view"},
    {"name": "clicks", "epsilon": 1.0, "tau": 2, "key": "click", "mechanism": "kary_subtract",
     "k": 3},
    {"name": "spend", "kind": "sum", "epsilon": 1.0, "tau": 12, "max_value": MAX_VALUE,
     "key": "buy", "mechanism": "kary", "k": 4},
    {"name": "views_exp", "epsilon": 0.1, "tau": 2, "key": "view", "mechanism": "expiring",
     "lambda": 1, "horizon_ticks": 100},
]  # fmt: skip


def pipeline_config(noise: dict) -> dict:
    return {
        "input": {
            "partitions": PARTITIONS,
            "max_record_bytes": MAX_RECORD_BYTES,
            "max_user_id_length": MAX_USER_ID,
            "ingest_batch": INGEST_BATCH,
        },
        "ticks": {"interval_seconds": TICK_SECONDS},
        "noise": noise,
        "privacy": {"total_epsilon": 5.0},
        "statistics": STATISTICS,
    }


# Users: plain, unicode (CJK, emoji = surrogate pairs in UTF-16, combining marks, RTL
# override, NUL, zero-width), and one of exactly the maximum length.
POOL = [f"user-{i:03d}" for i in range(24)] + [
    "ユーザー一",
    "用户二",
    "😀-three",
    "👩‍👩‍👧‍👦",
    "e\u0301le\u0300ve",
    "\u202eevil",
    "nul\u0000id",
    "zero\u200bwidth",
    "Ωmega",
    "x" * MAX_USER_ID,
    " padded ",
    "tab\tbed",
]


# ---------------------------------------------------------------------------------------
# Records and what they must become


@dataclass(frozen=True)
class Rec:
    """One source record, the good events it carries and the dead letters it must cause."""

    what: str
    value: bytes | None
    partition: int | None = None  # None: the producer's partitioner picks
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    good: tuple[dict, ...] = ()  # canonical events (user_id, key, value as float)
    indexes: tuple[int, ...] | None = None  # the good events' indexes (None: 0, 1, ...)
    bad: tuple[tuple[int | None, str], ...] = ()  # (index in an envelope, reason)

    def good_at(self) -> list[tuple[int, dict]]:
        """(index in the record, canonical event) of each good event."""
        indexes = range(len(self.good)) if self.indexes is None else self.indexes
        return list(zip(indexes, self.good, strict=True))


def canonical(obj: dict) -> dict:
    """An event in ``records.event_json``'s form (an insert: no "op")."""
    out = {"user_id": obj["user_id"], "key": obj["key"]}
    if obj.get("value") is not None:
        out["value"] = float(obj["value"])
    return out


def clean_text(min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    # records.py labels malformed JSON containing "NaN"/"Infinity" as non-finite; keep the
    # generated text clear of that (reported) ambiguity.
    return st.text(min_size=min_size, max_size=max_size).filter(
        lambda s: "NaN" not in s and "Infinity" not in s
    )


finite = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_leaf = st.one_of(st.none(), st.booleans(), finite, clean_text(max_size=6))
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(clean_text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
non_string = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.lists(json_leaf, max_size=2),
    st.dictionaries(clean_text(max_size=3), json_leaf, max_size=2),
)
WHITESPACE = [chr(c) for c in range(0x3001) if chr(c).isspace()]


@st.composite
def good_event(draw, users: list[str]) -> dict:
    """A valid event: each statistic that counts it can use it."""
    obj: dict = {"user_id": draw(st.sampled_from(users)), "key": draw(st.sampled_from(KEYS))}
    if obj["key"] == "buy":
        # A sum needs an integer in [1, R]; 3.0 is one.
        obj["value"] = draw(st.one_of(st.integers(1, MAX_VALUE), st.sampled_from([1.0, 7.0])))
    else:
        value = draw(st.one_of(st.none(), finite))  # counts ignore values: negative is fine
        if value is not None:
            obj["value"] = value
    ts = draw(st.one_of(st.none(), finite, clean_text()))
    if ts is not None:
        obj["ts"] = ts
    if draw(st.booleans()):
        obj["op"] = "insert"
    for name, value in draw(st.dictionaries(clean_text(1, 5), json_any, max_size=2)).items():
        obj[f"x_{name}"] = value  # unknown fields are ignored
    return obj


FAULTS = (
    "not object", "no user", "null user", "user type", "blank user", "long user", "key type",
    "unknown key", "no key", "value type", "ts type", "op", "delete", "sum missing",
)  # fmt: skip


@st.composite
def bad_event(draw, users: list[str], fault: str | None = None) -> tuple[object, str]:
    """A JSON value that is not a usable event, with exactly one fault, and its reason."""
    obj = draw(good_event(users))
    if fault is None:
        fault = draw(st.sampled_from(FAULTS))
    if fault == "not object":
        return draw(st.one_of(json_leaf, st.lists(json_leaf, max_size=3))), (
            "event is not a JSON object"
        )
    if fault in ("no user", "null user"):
        if fault == "no user":
            del obj["user_id"]
        else:
            obj["user_id"] = None
        return obj, "missing user_id"
    if fault == "user type":
        obj["user_id"] = draw(non_string)
        return obj, "user_id is not a string"
    if fault == "blank user":
        obj["user_id"] = "".join(draw(st.lists(st.sampled_from(WHITESPACE), max_size=4)))
        return obj, "empty user_id"
    if fault == "long user":
        obj["user_id"] = draw(
            st.text(st.characters(categories=["L"]), min_size=MAX_USER_ID + 1, max_size=300)
        )
        return obj, "user_id too long"
    if fault == "key type":
        obj["key"] = draw(non_string)
        return obj, "key is not a string"
    if fault == "unknown key":
        obj["key"] = draw(clean_text(max_size=8).filter(lambda k: k not in KEYS))
        return obj, "unknown statistic key"
    if fault == "no key":
        if draw(st.booleans()):
            del obj["key"]
        else:
            obj["key"] = None
        return obj, "missing key"
    if fault == "value type":  # a buy: the sum needs its value (the counts need none)
        obj["key"] = "buy"
        obj["value"] = draw(st.one_of(clean_text(), st.booleans(), st.lists(finite, max_size=2)))
        return obj, "value is not a number (statistic spend)"
    if fault == "ts type":
        obj["ts"] = draw(st.one_of(st.booleans(), st.lists(finite, max_size=2), st.just({})))
        return obj, "ts is not a number or string"
    if fault == "op":
        obj["op"] = draw(st.one_of(clean_text().filter(lambda o: o not in ("insert", "delete")),
                                   st.none(), finite))  # fmt: skip
        return obj, "op is not insert or delete"
    if fault == "delete":
        obj["op"] = "delete"
        return obj, "op delete: no statistic with deletions counts this event"
    obj["key"] = "buy"  # the sum's fault: out of range or fractional is clipped, not bad
    obj.pop("value", None)
    return obj, "missing value (statistic spend)"


@st.composite
def placement(draw, user: str | None) -> dict:
    """Where a producer sends a record: a partition it names, or the one its partitioner
    picks (librdkafka's: CRC32 of the key, random without one); the key is the user id,
    anything else, or none. The ingest must not care."""
    partition = draw(st.one_of(st.none(), st.integers(0, SOURCE_PARTITIONS - 1)))
    keys = [st.none(), st.binary(min_size=1, max_size=8)]
    if user is not None:
        keys.append(st.just(user.encode()))
    return {"partition": partition, "key": draw(st.one_of(*keys))}


def single(what: str, obj: dict, where: dict, **kw) -> Rec:
    return Rec(what, orjson.dumps(obj), **where, good=(canonical(obj),), **kw)


GOOD_KINDS = ("single", "envelope", "deep", "foreign header")


@st.composite
def good_record(draw, kind: str) -> Rec:
    if kind == "envelope":
        # Any users: the ingest routes each event to its user's events partition.
        events = draw(st.lists(good_event(POOL), max_size=6))
        return Rec(
            "good envelope",
            orjson.dumps(events),
            **draw(placement(None)),
            headers=((HEADER, BATCH),),
            good=tuple(canonical(e) for e in events),
        )
    obj = draw(good_event(POOL))
    where = draw(placement(obj["user_id"]))
    if kind == "deep":
        # Legal nesting (orjson allows 1024 levels; the event object is one).
        depth = draw(st.integers(1, 1000))
        base = orjson.dumps({"user_id": obj["user_id"], "key": obj["key"], **(
            {"value": obj["value"]} if "value" in obj else {})})  # fmt: skip
        value = base[:-1] + b',"x_deep":' + b"[" * depth + b"]" * depth + b"}"
        return Rec("good deep", value, **where, good=(canonical(obj),))
    if kind == "foreign header":
        name = draw(st.sampled_from(["x-trace", "Dpstream", "DPSTREAM", "dpstream "]))
        header = draw(
            st.one_of(st.none(), st.binary(max_size=8), st.sampled_from([TICK, ENVELOPE]))
        )
        return single("good, foreign header", obj, where, headers=((name, header),))
    return single("good", obj, where)


def _cut(draw, data: bytes) -> bytes:
    return data[: draw(st.integers(1, len(data) - 1))]


def forged_reason(value: bytes) -> str:
    """Why a record with a header only dpstream's own topic may carry is rejected: the
    ingest parses it first (so malformed JSON says so), then refuses the header."""
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return MALFORMED
    return UNKNOWN_HEADER


BAD_KINDS = (
    "bad event", "envelope", "truncated", "truncated envelope", "garbage", "invalid utf-8",
    "lone surrogate", "bom", "empty", "null", "too deep", "non-finite",
    "non-finite in envelope", "oversized", "unknown header", "batch not array",
    "forged tick", "forged envelope",
)  # fmt: skip


@st.composite
def bad_record(draw, kind: str, fault: str | None = None) -> Rec:
    user = draw(st.sampled_from(POOL))
    where = draw(placement(user))
    good = draw(good_event([user]))
    if kind == "bad event":
        obj, reason = draw(bad_event(POOL, fault))
        return Rec(f"bad event: {reason}", orjson.dumps(obj), **where, bad=((None, reason),))
    if kind == "envelope":
        items, goods, indexes, bads = [], [], [], []
        for i in range(draw(st.integers(1, 8))):
            if draw(st.booleans()):
                item = draw(good_event(POOL))
                goods.append(canonical(item))
                indexes.append(i)
            else:
                item, reason = draw(bad_event(POOL))
                bads.append((i, reason))
            items.append(item)
        return Rec(
            "mixed envelope",
            orjson.dumps(items),
            **draw(placement(None)),
            headers=((HEADER, BATCH),),
            good=tuple(goods),
            indexes=tuple(indexes),
            bad=tuple(bads),
        )
    record_level = {
        "truncated": lambda: _cut(draw, orjson.dumps(good)),
        "truncated envelope": lambda: _cut(draw, orjson.dumps([good, good])),
        "garbage": lambda: (
            b"}"
            + draw(
                st.binary(max_size=64).filter(lambda b: b"NaN" not in b and b"Infinity" not in b)
            )
        ),
        "invalid utf-8": lambda: (
            b'{"user_id": "'
            + draw(
                st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
            )
            + b'", "key": "view"}'
        ),  # fmt: skip
        "lone surrogate": lambda: b'{"user_id": "a\\ud800b", "key": "view"}',
        "bom": lambda: b"\xef\xbb\xbf" + orjson.dumps(good),
        "empty": lambda: draw(st.sampled_from([b"", b" ", b"\n\t "])),
        "too deep": lambda: (
            draw(st.sampled_from([b"", b'{"user_id": "a", "x": ']))
            + (b"[" * draw(st.integers(1025, 4000)) + b"]" * 4000)
        ),  # fmt: skip
    }
    if kind in record_level:
        value = record_level[kind]()
        headers: tuple = ((HEADER, BATCH),) if kind == "truncated envelope" else ()
        return Rec(kind, value, **where, headers=headers, bad=((None, MALFORMED),))
    if kind == "null":
        return Rec("null record", None, **where, bad=((None, "empty record"),))
    if kind in ("non-finite", "non-finite in envelope"):
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-2e999"]))
        event = orjson.dumps({**good, "value": 0.5}).replace(b"0.5", literal)
        if kind == "non-finite":
            return Rec(kind, event, **where, bad=((None, NON_FINITE),))
        envelope = b"[" + orjson.dumps(good) + b"," + event + b"]"
        return Rec(kind, envelope, **where, headers=((HEADER, BATCH),), bad=((None, NON_FINITE),))
    if kind == "oversized":
        size = draw(
            st.one_of(
                st.sampled_from([MAX_RECORD_BYTES + 1, 100_000, 500_000]),
                st.integers(MAX_RECORD_BYTES + 1, 200_000),
            )
        )
        pad = "é" * (size // 2)  # 2 bytes each in UTF-8
        value = orjson.dumps({**good, "x_pad": pad})
        return Rec(kind, value, **where, bad=((None, "oversized record"),))
    if kind == "unknown header":
        # Without a value too (the kind is then b""); "tick" and "envelope" are dpstream's
        # own kinds, but not a source's: the forgeries below.
        header = draw(st.one_of(st.none(), st.binary(max_size=6).filter(lambda b: b != BATCH)))
        return Rec(kind, orjson.dumps(good), **where, headers=((HEADER, header),),
                   bad=((None, UNKNOWN_HEADER),))  # fmt: skip
    if kind == "batch not array":
        value = orjson.dumps(draw(st.one_of(st.just(good), finite, clean_text(), st.none())))
        return Rec(kind, value, **where, headers=((HEADER, BATCH),),
                   bad=((None, "batch envelope is not a JSON array"),))  # fmt: skip
    if kind == "forged tick":
        # Tick markers live in dpstream's events topic only (the clock's); in a source, a
        # marker -- malformed, stale, current or from the future -- is a forgery. (The
        # current tick's number is the one part of the batch that is not the same in every
        # run; what the record must become does not depend on it.)
        now = math.floor(time.time() / TICK_SECONDS)
        value = draw(
            st.one_of(
                st.sampled_from([b"{tick", b"", b"[]", b"{}", b'"7"', b"null"]),
                st.builds(lambda t: orjson.dumps({"tick": t}), st.one_of(
                    st.integers(max_value=-1), st.integers(0, 10**6),
                    st.integers(now - 2, now + 40), st.floats(allow_nan=False), clean_text(),
                    st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=2))),
            )
        )  # fmt: skip
        return Rec(kind, value, **where, headers=((HEADER, TICK),),
                   bad=((None, forged_reason(value)),))  # fmt: skip
    # The events topic's columnar envelope, forged into a source: it would bypass the
    # ingest's validation (and claim any source position) if it were believed.
    n = draw(st.integers(1, 4))
    forged = {
        "s": draw(st.sampled_from(["src/0", "t/1", ""])),
        "o": draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
        "u": [user] * n,
        "k": [good["key"]] * n,
        "v": draw(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=n,
                           max_size=n)),
    }  # fmt: skip
    value = orjson.dumps(forged)
    return Rec("forged envelope", value, **where, headers=((HEADER, ENVELOPE),),
               bad=((None, UNKNOWN_HEADER),))  # fmt: skip


def examples(strategy: st.SearchStrategy, count: int) -> list:
    """Up to ``count`` values Hypothesis generates from ``strategy``: derandomized, no
    shrinking, no example database, so every run draws the same ones."""
    drawn: list = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example) -> None:
        drawn.append(example)

    collect()
    return drawn


def generated_records() -> list[Rec]:
    """The hostile batch: a few Hypothesis examples of every kind of record (each fault of
    a bad event on its own too), and about one record in five sent twice (a duplicate)."""
    plan = [(bad_record(kind), 6) for kind in BAD_KINDS]
    plan += [(bad_record("bad event", fault), 4) for fault in FAULTS]
    plan += [(good_record(kind), 6) for kind in GOOD_KINDS]
    out: list[Rec] = []
    for strategy, count in plan:
        for rec, copies in examples(st.tuples(strategy, st.sampled_from([1, 1, 1, 1, 2])), count):
            out += [rec] * copies
    return out


def base_traffic(seed: int) -> list[Rec]:
    """Ordinary events (Zipf-like users, so truncation bites): singles keyed by user id
    (librdkafka's partitioner: a user stays on one source partition) and envelopes of
    four events of any users on any partition (a user's events then span partitions)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(POOL) + 1) ** 0.7
    users = rng.choice(len(POOL), size=360, p=weights / weights.sum())
    out: list[Rec] = []
    envelope: list[dict] = []
    for i, u in enumerate(users):
        key = KEYS[int(rng.integers(3))]
        obj = {"user_id": POOL[u], "key": key}
        if key == "buy":
            obj["value"] = int(rng.integers(1, MAX_VALUE + 1))
        if i % 3:
            out.append(single("traffic", obj, {"key": POOL[u].encode()}))
            continue
        envelope.append(obj)
        if len(envelope) == 4:
            out.append(
                Rec(
                    "traffic envelope",
                    orjson.dumps(envelope),
                    partition=int(rng.integers(SOURCE_PARTITIONS)),
                    headers=((HEADER, BATCH),),
                    good=tuple(canonical(e) for e in envelope),
                )  # fmt: skip
            )
            envelope = []
    return out


# ---------------------------------------------------------------------------------------
# One worker run per noise mode

Position = tuple[int, int, int]  # (source partition, offset, index in the record)


@dataclass
class Run:
    cfg: PipelineConfig
    records: list[Rec]
    placed: dict[tuple[int, int], Rec]  # (source partition, offset) -> the record there
    releases: dict[str, list[bytes]]
    dead: list[dict]
    exported: list[bytes]
    # The events topic's events in the order stage 1 counts them (per events partition),
    # with their source positions: (events partition, position, event_json bytes).
    counted: list[tuple[int, Position, bytes]]
    sent: int  # events in the events topic's envelopes, re-sends included
    source: dict[int, list]  # the source topic after the run, as read_topic gives it
    log: str
    noise: dict


def source_topic(cfg: PipelineConfig) -> str:
    return cfg.input.topics[0]


def produce(bootstrap: str, cfg: PipelineConfig, records: list[Rec]) -> dict:
    """Send ``records`` to the source topic in ROUNDS slices, one per tick; return
    (partition, offset) -> Rec."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "log_level": 0,
            "message.max.bytes": 1_000_000,
        }  # fmt: skip
    )
    placed: dict[tuple[int, int], Rec] = {}
    failures: list[str] = []

    def delivered(rec: Rec):
        def callback(err, msg) -> None:
            if err is not None:
                failures.append(f"{rec.what}: {err}")
            else:
                placed[msg.partition(), msg.offset()] = rec

        return callback

    per_round = math.ceil(len(records) / ROUNDS)
    for i in range(ROUNDS):
        for rec in records[i * per_round : (i + 1) * per_round]:
            where = {} if rec.partition is None else {"partition": rec.partition}
            producer.produce(
                source_topic(cfg),
                value=rec.value,
                key=rec.key,
                headers=list(rec.headers),
                on_delivery=delivered(rec),
                **where,
            )
            producer.poll(0)
        producer.flush(30)
        time.sleep(TICK_SECONDS)
    assert producer.flush(30) == 0
    assert failures == []
    assert len(placed) == len(records)
    return placed


@contextmanager
def hostile_worker(bootstrap: str, directory, noise: dict) -> Iterator[WorkerProcess]:
    """A worker on its own topics, its source topic created first with SOURCE_PARTITIONS
    partitions and the broker's defaults (as a user's topic would be)."""
    data = unique_names(pipeline_config(noise))
    cfg = parse_config(data)
    create_source_topic(bootstrap, source_topic(cfg), SOURCE_PARTITIONS)
    config_path = directory / f"{cfg.app_id}.yaml"
    config_path.write_text(yaml.safe_dump(data))
    log_path = directory / f"{cfg.app_id}.log"
    worker = WorkerProcess(
        cfg, config_path, log_path, spawn_worker(config_path, bootstrap, log_path)
    )
    try:
        yield worker
    finally:
        worker.stop()


def counted_events(cfg: PipelineConfig, bootstrap: str) -> tuple[list, int]:
    """The events topic's events in the order stage 1 counts them: each envelope's events
    after the last source position its partition counted (``Stage1Driver.unseen``, as
    stage 1 and export-log do), with their positions; and how many the envelopes held."""
    counted: list[tuple[int, Position, bytes]] = []
    sent = 0
    for p, records in read_topic(bootstrap, cfg.events_topic, PARTITIONS).items():
        sources: dict = {}
        for _, headers, value, _ in records:
            if header_kind(headers) != ENVELOPE:
                continue
            envelope = decode_envelope(value)
            topic, _, source_partition = envelope.source.rpartition("/")
            assert topic == source_topic(cfg), envelope.source
            positions = envelope.positions()
            sent += len(positions)
            kept = Stage1Driver.unseen(sources, envelope)
            fresh = positions[len(positions) - len(kept) :]
            for (offset, index), event in zip(fresh, kept, strict=True):
                line = orjson.dumps(event_json(event))
                counted.append((p, (int(source_partition), offset, index), line))
    return counted, sent


def worker_run(bootstrap, directory, noise: dict) -> Run:
    records = generated_records() + base_traffic(seed=7)
    random.Random(11).shuffle(records)
    with hostile_worker(bootstrap, directory, noise) as worker:
        cfg = worker.cfg
        rd = readers(bootstrap, worker)
        try:
            wait_for_first_release(worker, rd["views"])
            placed = produce(bootstrap, cfg, records)

            # The ingest commits a source offset only after the events topic (and the
            # dead-letter topic) acknowledged what it sent of the records before it.
            def ingested() -> bool:
                lag = source_lag(cfg, bootstrap)
                return len(lag) == SOURCE_PARTITIONS and all(v["lag"] == 0 for v in lag.values())

            wait_until(ingested, 60, "the ingest to commit the whole source topic", worker)
            # Every event is now in the events topic, so before the markers of tick
            # last - 1, which the clock writes once that tick ends, after now: the releases
            # up to tick ``last`` cover every event.
            last = math.floor(time.time() / TICK_SECONDS) + 1

            def done() -> bool:
                return all(
                    (r := rd[s.name].drain()) and r[-1]["tick"] >= last for s in cfg.statistics
                )

            wait_until(done, 90, f"releases up to tick {last}", worker)
            expected_dead = sum(len(r.bad) for r in records)
            wait_until(
                lambda: len(rd["_dead"].drain()) >= expected_dead, 30, "dead letters", worker
            )
            worker.assert_running()
            counted, sent = counted_events(cfg, bootstrap)
            return Run(
                cfg=cfg,
                records=records,
                placed=placed,
                releases={s.name: rd[s.name].records[:] for s in cfg.statistics},
                dead=rd["_dead"].drain(),
                exported=list(export_log(cfg, bootstrap)),
                counted=counted,
                sent=sent,
                source=read_topic(bootstrap, source_topic(cfg), SOURCE_PARTITIONS),
                log=worker.log_path.read_text(errors="replace"),
                noise=noise,
            )
        finally:
            for r in rd.values():
                r.close()


def exact_totals(lines: list[bytes]) -> dict[str, dict[int, int]]:
    """Truncated running counts and sums from scratch: each user's first tau units."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    out: dict[str, dict[int, int]] = defaultdict(dict)
    for line in lines:
        obj = orjson.loads(line)
        if "user_id" not in obj:
            if "tick" in obj:  # a marker, not the log's header
                for s in STATISTICS:
                    out[s["name"]][obj["tick"]] = total[s["name"]]
            continue
        for s in STATISTICS:
            if obj["key"] != s["key"]:
                continue
            units = int(obj["value"]) if s.get("kind") == "sum" else 1
            before = used[s["name"], obj["user_id"]]
            total[s["name"]] += min(max(s["tau"] - before, 0), units)
            used[s["name"], obj["user_id"]] = before + units
    return out


@pytest.fixture(scope="module", params=["insecure_zero", "keyed"])
def run(request, bootstrap, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "keyed":
        key_file = directory / "noise.key"
        key_file.write_text(np.random.default_rng(17).bytes(32).hex())
        noise = {"mode": "keyed", "key_file": str(key_file)}
    else:
        noise = {"mode": "insecure_zero"}
    return worker_run(bootstrap, directory, noise)


def good_events(run: Run) -> dict[Position, bytes]:
    """Each good event produced, by its source position, in canonical JSON: from what the
    test generated, not from the pipeline's decoder."""
    return {
        (p, offset, index): orjson.dumps(event)
        for (p, offset), rec in run.placed.items()
        for index, event in rec.good_at()
    }


def user_of(line: bytes) -> str:
    return orjson.loads(line)["user_id"]


# ---------------------------------------------------------------------------------------
# The properties


def test_the_generated_batch_covers_every_kind_of_hostile_record():
    records = generated_records()
    kinds = Counter(r.what.split(":")[0] for r in records)
    reasons = Counter(reason for r in records for _, reason in r.bad)
    for kind in ["bad event", "mixed envelope", "truncated", "garbage", "too deep",
                 "non-finite", "oversized", "forged tick", "forged envelope", "good",
                 "good envelope", "good deep", "unknown header", "null record"]:  # fmt: skip
        assert kinds[kind] > 0, kind
    assert len(reasons) >= 18, reasons  # 20 before a sum clipped its values (issue 26)
    assert reasons[UNKNOWN_HEADER] > 0 and reasons[MALFORMED] > 0
    assert max(len(r.value or b"") for r in records) > 10 * MAX_RECORD_BYTES
    assert len({r.value for r in records}) < len(records)  # duplicates
    # Producers as users have them: a named partition or the partitioner's pick, keyed by
    # the user id, by something else or not at all.
    assert {r.partition is None for r in records} == {True, False}
    assert {r.key is None for r in records} == {True, False}
    assert any(r.key and r.good and r.key != r.good[0]["user_id"].encode() for r in records)
    # Envelopes whose good events belong to users of different events partitions.
    assert any(len({partition_for(e["user_id"], PARTITIONS) for e in r.good}) > 1 for r in records)


def test_the_worker_survives_without_an_internal_error(run):
    assert "Traceback" not in run.log
    assert "internal error" not in run.log
    assert "the ingest stopped" not in run.log


def test_every_bad_record_is_dead_lettered_once_with_its_reason(run):
    expected = Counter(
        (p, offset, index, reason)
        for (p, offset), rec in run.placed.items()
        for index, reason in rec.bad
    )
    got = Counter((d["partition"], d["offset"], d["index"], d["reason"]) for d in run.dead)
    missing, extra = expected - got, got - expected
    what = {key: rec.what for key, rec in run.placed.items()}
    assert not missing, [(what[p, o], i, r) for p, o, i, r in missing]
    assert not extra, [(what.get((p, o)), i, r) for p, o, i, r in extra]
    for d in run.dead:
        assert d["topic"] == source_topic(run.cfg)  # none from stage 1: the events topic
        value = run.placed[d["partition"], d["offset"]].value or b""
        text = value.decode("utf-8", errors="replace")
        assert d["payload"] == text[:4096]
        assert d["payload_truncated"] is (len(text) > 4096)


def test_the_source_topic_holds_only_what_was_produced(run):
    # The ingest only reads it: no marker, no envelope, nothing re-written.
    assert sum(len(records) for records in run.source.values()) == len(run.placed)
    for p, records in run.source.items():
        for offset, _, value, _ in records:
            assert run.placed[p, offset].value == value, (p, offset)


def test_exactly_the_good_events_are_accepted_each_once(run):
    good = good_events(run)
    # export-log: the multiset of events is that of the good events produced. The run
    # waited for releases past the tick in which the ingest had sent everything, so every
    # event is in a closed tick.
    exported = [line for line in run.exported if b'"user_id"' in line]
    missing = Counter(good.values()) - Counter(exported)
    extra = Counter(exported) - Counter(good.values())
    assert not missing, list(missing.elements())[:10]
    assert not extra, list(extra.elements())[:10]
    # The events topic: each good event once, at its source position, and nothing was
    # re-sent in a run without failures.
    by_position = {position: line for _, position, line in run.counted}
    assert len(by_position) == len(run.counted) == run.sent
    assert by_position == good
    # Each user's events of one source partition are counted in source order (stage 1 and
    # export-log keep the events topic's order), and export-log lists each user's events
    # in the order stage 1 counts them.
    positions: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    counted_lines: dict[str, list[bytes]] = defaultdict(list)
    for _, (p, offset, index), line in run.counted:
        positions[user_of(line), p].append((offset, index))
        counted_lines[user_of(line)].append(line)
    for (user, p), seen in positions.items():
        assert seen == sorted(seen), (user, p)
    exported_lines: dict[str, list[bytes]] = defaultdict(list)
    for line in exported:
        exported_lines[user_of(line)].append(line)
    assert exported_lines == counted_lines
    # A user's events do span source partitions (the order across them is the ingest's).
    assert any(len({p for u, p in positions if u == user}) > 1 for user in counted_lines)


def test_releases_are_what_the_exported_log_gives(run):
    cfg = run.cfg
    replayed: dict[str, list[bytes]] = defaultdict(list)
    for release in replay(cfg, run.exported, load_noise(cfg)):
        replayed[release["statistic"]].append(orjson.dumps(release))
    truth = exact_totals(run.exported)
    for s in cfg.statistics:
        released = run.releases[s.name]
        assert len(released) >= ROUNDS, s.name
        assert released == replayed[s.name][: len(released)], s.name  # byte for byte
        values = [orjson.loads(r) for r in released]
        ticks = [v["tick"] for v in values]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), s.name
        if run.noise["mode"] == "insecure_zero":
            assert all(v["insecure"] == "insecure_zero" for v in values)
            assert [v["value"] for v in values] == [truth[s.name].get(t, 0) for t in ticks]
        else:
            assert all("insecure" not in v for v in values)
            exact = [truth[s.name].get(t, 0) for t in ticks]
            assert (
                sum(v["value"] != e for v, e in zip(values, exact, strict=True)) > len(ticks) // 2
            )
    # Truncation did bite, so the bound matters.
    events = [orjson.loads(x) for x in run.exported if b'"user_id"' in x]
    views = sum(e["key"] == "view" for e in events)
    assert max(truth["views"].values()) < views


# ---------------------------------------------------------------------------------------
# Found by the hostile batch; each pins a bug once fixed in pipeline/.


def test_a_dpstream_header_without_a_value_is_an_ordinary_bad_record():
    # In a source record: an unknown kind of dpstream header (the ingest's route).
    cfg = parse_config(pipeline_config({"mode": "insecure_zero"}))
    event = orjson.dumps({"user_id": POOL[0], "key": "view"})
    routed = route(
        [
            SourceRecord("src", 2, 40, [(HEADER, None)], event),
            SourceRecord("src", 2, 41, [("x-trace", None)], event),
            SourceRecord("src", 2, 42, [(HEADER.upper(), None)], event),
        ],
        limits_for(cfg),
        PARTITIONS,
    )
    assert [orjson.loads(d) for d in routed.dead_letters] == [
        {"reason": UNKNOWN_HEADER, "topic": "src", "partition": 2, "offset": 40, "index": None,
         "payload": event.decode(), "payload_truncated": False},
    ]  # fmt: skip
    assert routed.events == 2


def test_a_dpstream_header_without_a_value_in_the_events_topic_is_skipped(bootstrap):
    from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics
    from dpstream.pipeline.wire.records import encode_tick

    cfg = parse_config(unique_names(pipeline_config({"mode": "insecure_zero"})))
    create_source_topics(cfg, bootstrap)
    ensure_topics(cfg, bootstrap)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    tick = math.floor(time.time() / TICK_SECONDS) - 1  # just ended: the marker is honest
    for p in range(PARTITIONS):  # export-log stops at the first partition without a marker
        producer.produce(cfg.events_topic, b"{}", partition=p, headers=[(HEADER, None)])
        producer.produce(cfg.events_topic, encode_tick(tick), partition=p, headers=[(HEADER, TICK)])
    assert producer.flush(30) == 0
    # Its header, then the tick: the bad record is not an event (and must not raise).
    assert list(export_log(cfg, bootstrap))[1:] == [orjson.dumps({"tick": tick})]


def test_a_tick_marker_from_the_future_is_dead_lettered(bootstrap, worker_factory):
    worker = worker_factory(pipeline_config({"mode": "insecure_zero"}))
    rd = readers(bootstrap, worker)
    try:
        wait_for_first_release(worker, rd["views"])
        forged = math.floor(time.time() / TICK_SECONDS) + 20  # ends 10 s from now
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        for p in range(PARTITIONS):  # anyone who may write dpstream's events topic
            producer.produce(
                worker.cfg.events_topic,
                orjson.dumps({"tick": forged}),
                partition=p,
                headers=[(HEADER, TICK)],
            )
        assert producer.flush(30) == 0
        time.sleep(4 * TICK_SECONDS)
        releases = rd["views"].drain()
        dead = rd["_dead"].drain()
        # After the drains: a drain keeps reading until the topic is quiet for 0.2 s, so
        # it may pick up honest releases of ticks that ended while it ran.
        received = time.time()
        worker.assert_running()
    finally:
        for r in rd.values():
            r.close()
    early = [r["tick"] for r in releases if r["tick_end_unix"] > received]
    assert early == [], f"released {len(early)} ticks before they ended"
    assert forged not in [r["tick"] for r in releases]
    assert [d["reason"] for d in dead] == ["tick marker from the future"] * PARTITIONS
    assert {d["topic"] for d in dead} == {worker.cfg.events_topic}
    assert sorted(d["partition"] for d in dead) == list(range(PARTITIONS))
