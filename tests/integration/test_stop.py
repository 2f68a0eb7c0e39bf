"""A worker stops when asked, whatever the broker does (docs/reliability.md, "A broker that
goes away"): with its broker stopped under it, a worker logged every failed retry (3,840
lines in 35 s), then ignored SIGTERM for minutes. Now its log holds one line per cause per
interval, and SIGTERM ends it within its stop bound, with the status that says it could
not flush (75); a clean stop exits 0 (test_ingest.py's Ctrl-C test)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter

import pytest
import yaml

from dpstream.config.schema import parse_config
from dpstream.deploy.broker import LocalKafka
from dpstream.pipeline.kafka.client_logs import INTERVAL_SECONDS
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.worker.exits import EXIT_STOPPED_UNFLUSHED
from dpstream.pipeline.worker.lifecycle import STOP_SECONDS
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.testing import unique_names
from tests.integration.support import TopicReader, pipeline_config, wait_until

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 25.0
PREFIX = re.compile(r"^\[[^\]]*\] \[[^\]]*\] ")  # [time] [pid] of Faust's and the ingest's lines
HELD_BACK = re.compile(r" \(and \d+ more like it since the last such line\)\s*$")


def causes(lines: list[str]) -> Counter[str]:
    """How many lines of each cause (a line without its time, process and held-back count)."""
    return Counter(HELD_BACK.sub("", PREFIX.sub("", line)).strip() for line in lines)


def test_a_worker_whose_broker_is_gone_stops_within_its_bound_and_logs_each_cause_rarely(
    tmp_path,
):
    kafka = LocalKafka.start()  # its own broker: this test stops it
    proc: subprocess.Popen | None = None
    try:
        data = unique_names(pipeline_config({"mode": "insecure_zero"}))
        cfg = parse_config(data)
        config_path = tmp_path / "worker.yaml"
        config_path.write_text(yaml.safe_dump(data))
        log_path = tmp_path / "worker.log"
        create_source_topics(cfg, kafka.bootstrap)
        # WARNING: the level at which Faust's spinner wrote terminal codes into the log.
        proc = spawn_worker(config_path, kafka.bootstrap, log_path, loglevel="warning")
        reader = TopicReader(kafka.bootstrap, cfg.release_topic("views"))
        try:
            wait_until(lambda: reader.drain() != [], 120, "the worker's first release")
        finally:
            reader.close()
        kafka.stop()
        gone = log_path.stat().st_size
        time.sleep(OUTAGE_SECONDS)
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=STOP_SECONDS + 60)  # generous: a loaded machine
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker ignored SIGTERM for {STOP_SECONDS + 60:g} s")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        kafka.stop()
    log = log_path.read_bytes()
    assert b"\x1b" not in log  # no terminal codes in a file
    assert status == EXIT_STOPPED_UNFLUSHED, log[-3000:].decode(errors="replace")
    after = log[gone:].decode(errors="replace").splitlines()
    assert f"did not stop within {STOP_SECONDS:g} s" in log[gone:].decode(errors="replace")
    # Every cause at most once per interval over the outage and the stop (the first line
    # of a cause, then one per interval): before, "Unable connect to node" alone came
    # hundreds of times a second.
    most = int((OUTAGE_SECONDS + STOP_SECONDS) / INTERVAL_SECONDS) + 2
    frequent = {cause: n for cause, n in causes(after).items() if n > most}
    assert not frequent, "\n".join(after[-80:])
