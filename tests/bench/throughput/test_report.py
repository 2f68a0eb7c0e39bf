"""The benchmark's report (bench/throughput/report.py) rendered from numbers, no broker: the
tables hold one row per measured contender and input, the targets are the ratios of the
same run, a run's JSON reads back to the same document. No timing is asserted: the numbers
here are made up or read from a saved run."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.throughput import cli
from bench.throughput.datasets import ENVELOPES, SINGLE, Dataset
from bench.throughput.report import (
    Results,
    document,
    results_from_json,
    results_json,
    targets_section,
    throughput_table,
)

SAVED = Path(__file__).parent / "data" / "quick-run.json"
INFO = {"cpu": "test", "cores": "2", "ram": "1 GiB", "platform": "test", "python": "3"}
INFO |= {"libs": "none"}


def rows_of(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def made_up(rates: dict[str, list[float]], argv: list[str] | None = None) -> Results:
    """A run of single-event records whose contenders had these events/s, run by run."""
    args = cli.parse_args(argv or ["--quick"])
    res = Results(args=args, info=INFO, kafka="test", load_start="0 0 0")
    res.datasets[SINGLE] = Dataset(SINGLE, SINGLE, "t", 4, 1000, 1000, {0: 1000}, 1.0)
    for contender, per_run in rates.items():
        for run, rate in enumerate(per_run):
            res.runs.append(
                {
                    "run": run,
                    "dataset": SINGLE,
                    "shape": SINGLE,
                    "contender": contender,
                    "events": 1000,
                    "rate": rate,
                    "seconds": 1000 / rate,
                    "wall_seconds": 1000 / rate + 2,
                    "cpu_seconds": 0.5,
                    "peak_rss": 2**20,
                }
            )
    return res


def test_targets_are_ratios_to_the_peers_of_the_same_run():
    res = made_up(
        {
            "aiokafka": [400.0, 400.0, 400.0],
            "quix:exactly-once": [50.0, 100.0, 40.0],
            "kafka-streams:exactly_once_v2": [200.0, 200.0, 400.0],
            "dpstream": [100.0, 100.0, 100.0],
        }
    )
    targets = {row[0].split(" (")[0]: row[1:] for row in rows_of(targets_section(res))}
    quix = targets[
        "end to end on single-event records >= Quix Streams stateful count, exactly-once"
    ]
    kstreams = targets[
        "end to end on single-event records >= Kafka Streams groupByKey().count(), exactly_once_v2"
    ]
    # Per run 2.0, 1.0, 2.5: the median of the per-run ratios, and their min-max.
    assert quix == ["2.00x (1.00-2.50)", "yes"]
    assert kstreams == ["0.50x (0.25-0.50)", "no"]


def test_a_peer_that_was_not_measured_is_said_so():
    res = made_up({"aiokafka": [400.0], "dpstream": [100.0]})
    rows = [r for r in rows_of(targets_section(res)) if "Quix" in r[0] or "Kafka Streams" in r[0]]
    assert [r[1:] for r in rows] == [["not measured in this run", "n/a"]] * 2


def test_throughput_table_has_a_row_per_contender_with_its_span():
    res = made_up(
        {"aiokafka": [400.0, 500.0, 300.0], "quix:at-least-once": [60.0, 70.0, 50.0]},
        ["--quick", "--span", "quix=5000"],
    )
    for r in res.runs:
        if r["contender"].startswith("quix"):
            r["events"] = 5000
    rows = rows_of(throughput_table(res))
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
        ("aiokafka consumer + orjson (ceiling)", "1,000", "3", "400", "300-500"),
        ("Quix Streams stateful count, at-least-once", "5,000", "3", "60", "50-70"),
    ]
    assert rows[0][7] == "1.000"  # the ceiling's ratio to itself
    assert rows[1][7] == f"{60 / 400:.3f}"  # the median of 60/400, 70/500, 50/300


def test_spans_parse_into_every_contender_of_a_family():
    args = cli.parse_args(["--span", "kafka-streams=5000000"])
    assert args.spans == {
        "kafka-streams:at_least_once": 5_000_000,
        "kafka-streams:exactly_once_v2": 5_000_000,
    }
    with pytest.raises(SystemExit):
        cli.parse_args(["--span", "nobody=10"])


def test_a_saved_run_renders_its_tables(tmp_path):
    data = orjson.loads(SAVED.read_bytes())
    out = tmp_path / "benchmarks.md"
    assert cli.render(SAVED, out) == 0
    text = out.read_text()
    for section in ("## Throughput", "## Targets", "## Release latency", "## Memory"):
        assert section in text
    table = throughput_table(results_from_json(data, cli.parse_args(data["argv"])))
    assert table in text
    # One row per (input, contender) measured: both inputs, every peer, the ceilings.
    rows = rows_of(table)
    assert len(rows) == len({(r["shape"], r["contender"]) for r in data["runs"]})
    assert {r[0] for r in rows} == {
        "single-event records",
        "our envelopes (columnar, events topic)",
    }
    assert {r[1] for r in rows if r[0] == "single-event records"} >= {
        "Kafka Streams groupByKey().count(), at_least_once",
        "Kafka Streams groupByKey().count(), exactly_once_v2",
        "Quix Streams stateful count, at-least-once",
        "Quix Streams stateful count, exactly-once",
    }
    for row in rows:  # the span: every record of the topic it read
        shape = SINGLE if row[0] == "single-event records" else ENVELOPES
        assert row[2] == f"{data['datasets'][shape]['events']:,}"
    targets = rows_of(targets_section(results_from_json(data, cli.parse_args(data["argv"]))))
    assert len([t for t in targets if "same run, same topic" in t[0]]) == 2


def test_results_json_reads_back_to_the_same_numbers(tmp_path):
    data = orjson.loads(SAVED.read_bytes())
    args = cli.parse_args([*data["argv"], f"--out={tmp_path / 'none.md'}"])
    res = results_from_json(data, args)
    assert orjson.loads(results_json(res)) == {**data, "argv": args.argv}
    again = results_from_json(orjson.loads(results_json(res)), args)
    assert document(again) == document(res)
