"""`dpstream demo` stays working: it runs against the test broker, exits 0, plots."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_bounded_and_writes_its_plot(bootstrap, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpstream.pipeline.tools.cli",
            "demo",
            "--duration",
            "6",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "final releases against the truth" in out.stdout
    assert " events " in out.stdout and " clicks " in out.stdout
    png = (tmp_path / "demo.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "noise.key" not in out.stdout
    key = (tmp_path / "noise.key").read_text()
    assert key not in out.stdout + out.stderr + (tmp_path / "worker.log").read_text()


@pytest.mark.registry
def test_the_demo_in_avro_reads_what_it_produced_through_the_registry(
    bootstrap, schema_registry, tmp_path
):
    out = subprocess.run(
        [sys.executable, "-m", "dpstream.pipeline.tools.cli", "demo", "--format", "avro",
         "--duration", "4", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
             "DPSTREAM_SCHEMA_REGISTRY_URL": schema_registry},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the events go out as Avro" in out.stdout
    config = (tmp_path / "demo-config.yaml").read_text()
    assert "format: avro" in config and schema_registry in config
    # Every event produced was read and counted: the truth the demo compares with is the
    # exported events topic, and "events" (no key filter) counts them all.
    produced = int(out.stdout.split("produced ")[1].split()[0])
    assert produced > 0
    assert f"true count {produced}," in out.stdout
