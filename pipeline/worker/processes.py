"""``dpstream worker`` as a child process, for tests, benchmarks and the demo: start it,
stop it, read its partition assignment from its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def spawn_worker(
    config_path: Path,
    bootstrap: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    loglevel: str = "info",
    command: tuple[str, ...] = ("worker",),
) -> subprocess.Popen:
    """Start ``dpstream worker`` (or another ``command``, e.g. ``("ingest",)`` or
    ``("worker", "--ingest", "thread")``) as a child process logging to ``log_path``."""
    cmd = [
        sys.executable,
        "-m",
        "dpstream.pipeline.tools.cli",
        *command,
        "--config",
        str(config_path),
        "--bootstrap",
        bootstrap,
    ]
    if command[0] == "worker":
        cmd += ["--loglevel", loglevel]
    with open(log_path, "wb") as log:
        # Fixed argument list, no shell.
        return subprocess.Popen(  # noqa: S603
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def stop_worker(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM (Faust shuts down cleanly), then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def assigned_partitions(log_text: str, topic: str) -> set[int]:
    """``topic``'s partitions in a worker's latest assignment, read from Faust's INFO log
    (its "Setting newly assigned partitions" table): for tests and benchmarks."""
    tables = log_text.split("Setting newly assigned partitions")
    if len(tables) < 2:
        return set()
    for line in tables[-1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] == topic:
            out: set[int] = set()
            for part in cells[1].strip("{}").split(","):
                lo, _, hi = part.strip().partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
            return out
    return set()
