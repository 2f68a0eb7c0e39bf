"""The two-stage pipeline against a real Kafka broker: 50 users over 20+ public ticks.

* zero noise: every release equals the truncated true count exactly, one per tick, in
  order; bad records land in the dead-letter topic with their reasons, and the good ones
  around them are counted exactly;
* keyed noise: the pipeline's releases equal ``dpstream replay`` of the exported log,
  byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import orjson
import pytest

from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.wire.records import partition_for
from dpstream.testing import unique_names
from tests.integration.scenarios import USERS, drive, pipeline_equals_replay_with_the_same_key
from tests.integration.support import (
    PARTITIONS,
    WorkerProcess,
    pipeline_config,
    readers,
    truncated_counts,
    wait_for_first_release,
    worker_pool,
)

pytestmark = pytest.mark.integration

UNKNOWN_HEADER = "unknown dpstream header"


def bad_records(worker: WorkerProcess) -> list[tuple[bytes, dict, str]]:
    """(value, produce kwargs, expected dead-letter reason)."""
    topic_p = {"partition": partition_for("bad", PARTITIONS)}
    batch = {**topic_p, "headers": [("dpstream", b"batch")]}
    return [
        (b"{not json", topic_p, "malformed JSON"),
        (b'{"value": 3}', topic_p, "missing user_id"),
        (b'{"user_id": 17}', topic_p, "user_id is not a string"),
        (b'{"user_id": ""}', topic_p, "empty user_id"),
        (b'{"user_id": "bad", "value": NaN}', topic_p, "non-finite number (NaN or infinity)"),
        (b'{"user_id": "bad", "key": "nope"}', topic_p, "unknown statistic key"),
        (b'{"user_id": "bad"}', topic_p, "missing key"),
        (b'{"user_id": "bad", "pad": "' + b"x" * 6000 + b'"}', topic_p, "oversized record"),
        (b'[{"user_id": "bad", "key": "view"}, {"user_id": 5}]', batch, "user_id is not a string"),
        # Tick markers are the clock's, in dpstream's own topic: in a source, a forgery.
        (b'{"tick": 7}', {**topic_p, "headers": [("dpstream", b"tick")]}, UNKNOWN_HEADER),
    ]


@pytest.fixture(scope="module")
def zero_noise_run(bootstrap, tmp_path_factory):
    """One worker run with the zero noise source, good and bad records interleaved."""
    with worker_pool(bootstrap, tmp_path_factory.mktemp("zero")) as start:
        worker = start(pipeline_config({"mode": "insecure_zero"}))
        rd = readers(bootstrap, worker)
        try:
            wait_for_first_release(worker, rd["views"])
            good = drive(bootstrap, worker, rd, bad_records(worker))
            worker.assert_running()
            yield {
                "worker": worker,
                "releases": {s.name: rd[s.name].drain() for s in worker.cfg.statistics},
                "dead": rd["_dead"].drain(),
                "ledger": rd["_ledger"].drain(),
                "log": list(export_log(worker.cfg, bootstrap)),
                "good": good,
            }
        finally:
            for r in rd.values():
                r.close()


def test_one_release_per_tick_in_order_none_missing(zero_noise_run):
    for name, releases in zero_noise_run["releases"].items():
        ticks = [r["tick"] for r in releases]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), name
        assert [r["step"] for r in releases] == list(range(1, len(releases) + 1)), name
    log = zero_noise_run["log"]
    busy = sum(
        1
        for a, b in zip(log, log[1:], strict=False)
        if b'"user_id"' in a and b.startswith(b'{"tick"')
    )
    assert busy >= 20, f"only {busy} ticks carried events"
    users = {orjson.loads(x)["user_id"] for x in log if b'"user_id"' in x}
    assert len(users & {f"user-{i:05d}" for i in range(USERS)}) == USERS


def test_zero_noise_releases_equal_the_truncated_true_count(zero_noise_run):
    cfg = zero_noise_run["worker"].cfg
    truth = truncated_counts(zero_noise_run["log"], cfg)
    for name, releases in zero_noise_run["releases"].items():
        assert releases, name
        for rel in releases:
            assert rel["value"] == truth[name].get(rel["tick"], 0), (name, rel["tick"])
            assert rel["insecure"] == "insecure_zero"
            # The interval around the exact count, raised to 0 (design.md section 5c).
            low, high = rel["interval"]
            assert low < rel["value"] < high or low == rel["value"] == 0 < high
            assert rel["value"] == rel["unbiased"] and rel["interval_of"] == "truncated"
            assert rel["std"] > 0 and rel["schema_version"] == 5
            assert rel["epsilon"] == next(s.epsilon for s in cfg.statistics if s.name == name)
        # Truncation did bite: heavy users sent more than tau.
        true_total = sum(1 for x in zero_noise_run["log"] if b'"user_id"' in x)
        assert releases[-1]["value"] < true_total
    assert {r["mechanism"] for r in zero_noise_run["releases"]["clicks"]} == {"kary_tree_subtract"}


def test_every_good_event_is_counted_once(zero_noise_run):
    events = [x for x in zero_noise_run["log"] if b'"user_id"' in x]
    assert len(events) == zero_noise_run["good"]


def test_bad_records_land_in_the_dead_letter_topic_with_their_reason(zero_noise_run):
    dead = zero_noise_run["dead"]
    expected = Counter(reason for _, _, reason in bad_records(zero_noise_run["worker"]))
    assert Counter(d["reason"] for d in dead) == expected
    cfg = zero_noise_run["worker"].cfg
    for d in dead:
        assert d["topic"] == cfg.input.topics[0] and d["offset"] >= 0
    oversized = next(d for d in dead if d["reason"] == "oversized record")
    assert oversized["payload_truncated"] is True
    envelope = next(d for d in dead if d["index"] is not None)
    assert envelope["index"] == 1


def test_ledger_records_each_statistic_once(zero_noise_run):
    ledger = {e["statistic"]: e for e in zero_noise_run["ledger"] if "statistic" in e}
    assert sorted(ledger) == ["clicks", "clicks_exp", "views", "views4"]
    # The worker's statement at start: the accountant's composition of the four.
    (statement,) = [e for e in zero_noise_run["ledger"] if e.get("event") == "statement"]
    assert statement["relation"] == "whole_user" and statement["public_counts"] is False
    assert [c["statistic"] for c in statement["statistics"]] == ["views", "clicks", "views4",
                                                                 "clicks_exp"]  # fmt: skip
    assert statement["per_user_total"] == pytest.approx(sum(
        c["epsilon"] for c in statement["statistics"]))  # fmt: skip
    assert all(
        ledger[name]["fingerprint"] == statement["identities"][name]["fingerprint"]
        for name in ledger
    )
    # views names no mechanism: a new statistic without a horizon runs the default tree.
    assert [ledger[n]["mechanism"] for n in ("views", "clicks", "views4", "clicks_exp")] == [
        "kary_tree_subtract",
        "kary_tree_subtract",
        "kary_tree",
        "expiring_tree",
    ]
    assert all(e["total_epsilon"] == 10.0 for e in ledger.values())
    curve = ledger["clicks_exp"]["expiration"]
    # lambda = 1: an item d ticks old has lost 0.1 * 2 * (floor(log2 d) + 1).
    assert [c["age_ticks"] for c in curve[:4]] == [1, 2, 4, 8]
    assert [c["epsilon"] for c in curve[:4]] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert "expiration" not in ledger["views"]


@pytest.mark.parametrize("accounting", ["pure", "zcdp"])
def test_pipeline_equals_replay_with_the_same_key(bootstrap, worker_factory, tmp_path, accounting):
    """Pure: every tree mechanism; zcdp: the square-root factorization counter."""
    pipeline_equals_replay_with_the_same_key(bootstrap, worker_factory, tmp_path, accounting)


def test_tail_cli_prints_the_releases(zero_noise_run, bootstrap):
    worker = zero_noise_run["worker"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpstream.pipeline.tools.cli",
            "tail",
            "clicks",
            "--config",
            str(worker.config_path),
            "--bootstrap",
            bootstrap,
            "--from-beginning",
            "--max",
            "3",
            "--timeout",
            "30",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert lines == zero_noise_run["releases"]["clicks"][:3]


def test_produce_cli_sends_jsonl_events_and_batch_envelopes(bootstrap, tmp_path):
    import yaml

    from dpstream.config.schema import parse_config
    from dpstream.pipeline.kafka.clients import read_topic
    from dpstream.pipeline.wire.records import header_kind

    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump(data))
    events = tmp_path / "events.jsonl"
    events.write_text("".join(f'{{"user_id": "u{i % 7}", "key": "view"}}\n' for i in range(30)))
    cli = [
        sys.executable,
        "-m",
        "dpstream.pipeline.tools.cli",
        "produce",
        "--config",
        str(config),
        "--bootstrap",
        bootstrap,
        "--events",
        str(events),
    ]
    subprocess.run(cli, check=True, capture_output=True, timeout=60)
    subprocess.run([*cli, "--batch", "4"], check=True, capture_output=True, timeout=60)
    cfg = parse_config(data)
    records = read_topic(bootstrap, cfg.input.topics[0], PARTITIONS)
    singles, batched = [], []
    for recs in records.values():
        for _, headers, value, _ in recs:
            if header_kind(headers) == b"batch":
                batched += orjson.loads(value)
            else:
                singles.append(orjson.loads(value))
    expected = [{"user_id": f"u{i % 7}", "key": "view"} for i in range(30)]
    assert sorted(map(str, singles)) == sorted(map(str, batched)) == sorted(map(str, expected))
