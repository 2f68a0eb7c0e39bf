"""Smoke test of the Kafka benchmark (bench/throughput/): a tiny run against the real broker,
the peers among its contenders, produces a well-formed table. Nothing here asserts on
timings: it is a benchmark, and the numbers of a tiny run on a busy machine mean nothing."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.integration.support import require_peer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PEERS = ["kafka-streams:exactly_once_v2", "quix:exactly-once"]  # the targets' peers
CONTENDERS = ["aiokafka", "confluent", "faust-naive", *PEERS, "dpstream"]
SINGLE, ENVELOPES = "single-event records", "our envelopes (columnar, events topic)"


def number(cell: str) -> float:
    return float(cell.replace(",", "").split()[0])


def table_after(text: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[i].strip("|").split("|")]
    assert set(lines[i + 1].replace("|", "").replace("-", "").replace(":", "").strip()) == set()
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return header, rows


def test_tiny_run_writes_a_well_formed_table(bootstrap, tmp_path):
    for peer in PEERS:
        require_peer(peer)
    out, results = tmp_path / "benchmarks.md", tmp_path / "results.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.throughput",
        "--runs=1",
        "--users=100",
        "--singles=300",
        "--span=quix=400",
        "--envelope-events=2000",
        "--batch=50",
        "--latency-batch=50",
        "--latency-rate=500",
        "--latency-seconds=2",
        "--latency-wait=20",
        "--memory-users=",
        "--state-users=1000",
        "--state-ticks=50",
        f"--contenders={','.join(CONTENDERS)}",
        f"--out={out}",
        f"--json={results}",
        f"--workdir={tmp_path / 'work'}",
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    text = out.read_text()
    assert "| input | contender |" in proc.stdout  # the table is printed too

    header, rows = table_after(text, "| input | contender |")
    assert header[:5] == [
        "input",
        "contender",
        "span (events)",
        "runs",
        "events/s first→last (median)",
    ]
    assert header[7:9] == ["ratio to aiokafka (median)", "ratio to confluent-kafka (median)"]
    peers_only_single = [c for c in CONTENDERS if c not in PEERS]
    assert len(rows) == len(CONTENDERS) + len(peers_only_single)
    by_key = {}
    for row in rows:
        assert len(row) == len(header), row
        assert number(row[3]) == 1  # runs
        assert number(row[4]) > 0 and math.isfinite(number(row[4]))
        by_key[row[0], row[1].split(",")[0].split(" (")[0]] = row
    assert {inp for inp, _ in by_key} == {SINGLE, ENVELOPES}
    # Each contender read the whole of its topic: 300 single events, Quix its own span.
    assert number(by_key[SINGLE, "Quix Streams stateful count"][2]) == 400
    assert number(by_key[SINGLE, "Kafka Streams groupByKey().count()"][2]) == 300
    assert number(by_key[ENVELOPES, "naive Faust agent"][2]) == 2000
    for inp in (SINGLE, ENVELOPES):
        assert number(by_key[inp, "aiokafka consumer + orjson"][7]) == 1  # to itself
        assert number(by_key[inp, "confluent-kafka consumer + orjson"][8]) == 1

    assert "## Targets" in text and "## Release latency" in text and "## Memory" in text
    assert "of the plain confluent-kafka consume of the same source topic" in text
    _, targets = table_after(text, "| target |")
    against = [t for t in targets if t[0].startswith("end to end on single-event records >=")]
    assert len(against) == 2 and all(t[1].endswith(")") and "x (" in t[1] for t in against)
    assert any(t[0].startswith("on our envelopes >= 25% of the aiokafka") for t in targets)
    assert "## What dominates end to end" in text and "| ingest events/s |" in text
    _, latency = table_after(text, "| input | target rate |")
    assert len(latency) == 1 and latency[0][0] == "source batches of 50"
    assert "Machine: " in text and "cores" in text and "Kafka" in text

    data = orjson.loads(results.read_bytes())
    assert len(data["runs"]) == len(rows)
    assert {r["events"] for r in data["runs"] if r["shape"] == "envelopes"} == {2000}
    pipeline = [r for r in data["runs"] if r["contender"] == "dpstream"]
    assert {r["ingest"] for r in pipeline if r["shape"] == "envelopes"} == {"off"}
    assert all(r["dead_letters"] == 0 and r["peak_rss"] > 0 for r in pipeline)
    assert all(0 < r["ingest_seconds"] <= r["seconds"] for r in pipeline)
    assert all(r["wall_seconds"] >= r["seconds"] > 0 for r in data["runs"])
    assert data["ingest_micro"]["shapes"]["1"]["route_us"] > 0
    assert data["constants"]["python_bytes_per_user"] > 0
    assert data["errors"] == []
