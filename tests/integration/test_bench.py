"""Smoke test of the Kafka benchmark (bench/throughput.py): a tiny run against the real
broker produces a well-formed table. Nothing here asserts on timings: it is a benchmark,
and the numbers of a tiny run on a busy machine mean nothing."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONTENDERS = ["aiokafka", "confluent", "faust-naive", "dpstream"]


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
    out, results = tmp_path / "benchmarks.md", tmp_path / "results.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.throughput",
        "--runs=1",
        "--users=100",
        "--singles=300",
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
    assert header[:4] == ["input", "contender", "events", "events/s (median)"]
    assert len(rows) == 2 * len(CONTENDERS)
    by_key = {}
    for row in rows:
        assert len(row) == len(header), row
        assert number(row[2]) in (300, 2000)
        assert number(row[3]) > 0 and math.isfinite(number(row[3]))
        assert number(row[5]) == 1  # runs
        by_key[row[0], row[1].split()[0]] = row
    assert {inp for inp, _ in by_key} == {"single-event records", "envelopes of 50"}
    assert header[6:8] == ["ratio to aiokafka (median)", "ratio to confluent-kafka (median)"]
    for inp in ("single-event records", "envelopes of 50"):
        assert number(by_key[inp, "aiokafka"][6]) == 1  # the ceiling's ratio to itself
        assert number(by_key[inp, "confluent-kafka"][7]) == 1

    assert "## Targets" in text and "## Release latency" in text and "## Memory" in text
    assert "of the plain confluent-kafka consume of the same source topic" in text
    assert "## What dominates end to end" in text and "| ingest events/s |" in text
    _, latency = table_after(text, "| input | target rate |")
    assert len(latency) == 1 and latency[0][0] == "envelopes of 50"
    assert "Machine: " in text and "cores" in text and "Kafka" in text

    data = orjson.loads(results.read_bytes())
    assert len(data["runs"]) == 2 * len(CONTENDERS)
    pipeline = [r for r in data["runs"] if r["contender"] == "dpstream"]
    assert all(r["dead_letters"] == 0 and r["peak_rss"] > 0 for r in pipeline)
    assert all(0 < r["ingest_seconds"] <= r["seconds"] for r in pipeline)
    assert data["ingest_micro"]["shapes"]["1"]["route_us"] > 0
    assert data["constants"]["python_bytes_per_user"] > 0
    assert data["errors"] == []
