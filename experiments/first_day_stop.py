"""The parts of the first-day workload (issue 26) that the worker's stop and its source
topics affect, for docs/first-day.md: a worker whose broker is stopped under it, then
SIGTERM (log volume over the outage, time to exit, exit status), and a typo in
``input.topics`` (what the worker does, whether the topic gets created).

Run with the interpreter whose dpstream is measured (``--python``: e.g. a checkout of main
for "before"); the broker and the producer are this interpreter's::

    .venv/bin/python experiments/first_day_stop.py --python /path/to/main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dpstream.deploy.broker import LocalKafka

OUTAGE_SECONDS = 35.0
STOP_WAIT_SECONDS = 90.0


def config(app_id: str, topic: str) -> dict:
    return {
        "app_id": app_id,
        "input": {"topics": [topic], "partitions": 2},
        "ticks": {"interval_seconds": 1.0},
        "outputs": {"dead_letter_topic": f"{app_id}.dead", "ledger_topic": f"{app_id}.ledger"},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 1.0},
        "statistics": [{"name": f"{app_id}-views", "epsilon": 1.0, "tau": 16}],
    }


def worker(python: str, path: Path, bootstrap: str, log: Path) -> subprocess.Popen:
    cmd = [python, "-m", "dpstream.pipeline.tools.cli", "worker", "--config", str(path)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(  # noqa: S603 - fixed arguments
            [*cmd, "--bootstrap", bootstrap], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def broker_gone_then_sigterm(python: str, directory: Path) -> dict:
    kafka = LocalKafka.start()
    app = f"fd-{uuid.uuid4().hex[:8]}"
    topic = f"{app}.events"
    try:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
        path = directory / f"{app}.yaml"
        path.write_text(yaml.safe_dump(config(app, topic)))
        log = directory / f"{app}.log"
        proc = worker(python, path, kafka.bootstrap, log)
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
        for i in range(2000):
            producer.produce(topic, orjson.dumps({"user_id": f"u{i % 200}", "key": "view"}))
        producer.flush(30)
        time.sleep(30)  # the worker up and releasing
        kafka.stop()
        before = log.read_bytes()
        time.sleep(OUTAGE_SECONDS)
        during = log.read_bytes()[len(before) :]
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            status: int | str = proc.wait(STOP_WAIT_SECONDS)
            took = f"{time.monotonic() - asked:.1f} s"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            status, took = "SIGKILL needed", f"> {STOP_WAIT_SECONDS:g} s"
        text = log.read_bytes()
        return {
            "outage log lines": during.count(b"\n"),
            "outage log KB/s": round(len(during) / 1024 / OUTAGE_SECONDS, 2),
            "SIGTERM to exit": took,
            "exit status": status,
            "escape codes in log": b"\x1b" in text,
        }
    finally:
        kafka.stop()


def typo_in_input_topics(python: str, directory: Path) -> dict:
    kafka = LocalKafka.start()
    app = f"fd-{uuid.uuid4().hex[:8]}"
    topic = f"{app}.evnets"  # the typo: nothing was ever produced there
    try:
        path = directory / f"{app}.yaml"
        path.write_text(yaml.safe_dump(config(app, topic)))
        log = directory / f"{app}-typo.log"
        proc = worker(python, path, kafka.bootstrap, log)
        try:
            status: int | str = proc.wait(60)
        except subprocess.TimeoutExpired:
            status = "still running after 60 s"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
        created = topic in admin.list_topics(timeout=30).topics
        said = [ln for ln in log.read_text(errors="replace").splitlines() if "input.topics" in ln]
        return {"worker": status, "topic created": created, "message": said[:1]}
    finally:
        kafka.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the dpstream measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="first-day-") as tmp:
        print(orjson.dumps(broker_gone_then_sigterm(args.python, Path(tmp))).decode())
        print(orjson.dumps(typo_in_input_topics(args.python, Path(tmp))).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
