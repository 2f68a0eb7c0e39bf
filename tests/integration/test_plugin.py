"""dpstream's pytest plugin as a user meets it: the README's example test, verbatim in
spirit -- a worker on a zero-noise config, events in, exact releases out."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from tests.integration.scenarios import CONFIG, zero_noise_count_of_clicks

pytestmark = pytest.mark.integration


def test_zero_noise_count_of_clicks(dpstream_pipeline):
    zero_noise_count_of_clicks(dpstream_pipeline)


def test_a_nested_user_id_through_pipeline_produce_and_dpstream_produce(
    dpstream_pipeline, tmp_path
):
    # Before, both raised KeyError: 'user_id' when input.user_id_field is actor.id.
    config = {**CONFIG, "input": {**CONFIG["input"], "user_id_field": "actor.id"}}
    pipeline = dpstream_pipeline(config)
    pipeline.produce([{"actor": {"id": f"u{i % 3}"}, "key": "click"} for i in range(9)])
    # Three users, each counted at most tau = 2 times.
    pipeline.releases("clicks", until=lambda r: r[-1]["value"] == 6)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(orjson.dumps({"actor": {"id": "u7"}, "key": "click"}) + b"\n"
                                for _ in range(3)))  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "dpstream.pipeline.tools.cli", "produce", "--config",
         str(pipeline.config_path), "--bootstrap", pipeline.bootstrap, "--events", str(events)],
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    pipeline.releases("clicks", until=lambda r: r[-1]["value"] == 8)  # u7 counted twice


def test_tail_exits_at_the_end_of_the_topic_unless_it_follows(dpstream_pipeline):
    # Before, `dpstream tail` followed the topic for ever (the README did not say so).
    pipeline = dpstream_pipeline(CONFIG)
    pipeline.produce([{"user_id": "u1", "key": "click"}])
    seen = len(pipeline.releases("clicks", until=lambda r: r[-1]["value"] == 1))

    def tail(*args: str) -> list[dict]:
        out = subprocess.run(
            [sys.executable, "-m", "dpstream.pipeline.tools.cli", "tail", "clicks", "--config",
             str(pipeline.config_path), "--bootstrap", pipeline.bootstrap, *args],
            capture_output=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr.decode()
        return [orjson.loads(line) for line in out.stdout.splitlines()]

    every = tail("--from-beginning")  # exits at the topic's end as it was
    assert len(every) >= seen and [r["tick"] for r in every[:seen]] == [
        r["tick"] for r in pipeline.releases("clicks")[:seen]
    ]
    (latest,) = tail()
    assert latest["tick"] >= every[-1]["tick"]
    followed = tail("--follow", "--max", "2", "--timeout", "60")  # the next two releases
    assert len(followed) == 2 and followed[0]["tick"] > latest["tick"]
