"""The worker's stop after a failure (pipeline/worker/exits.py): its exit status, and the lines
logged before it are written, though the process ends without any shutdown."""

from __future__ import annotations

import subprocess
import sys

from dpstream.pipeline.worker.exits import EXIT_INTERNAL_ERROR

STOPS = """
import logging
import sys

from dpstream.pipeline.worker.exits import exit_now

logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
logging.getLogger("w").critical("the ingest stopped (exit code -9); stopping the worker")
exit_now()
print("after exit_now", file=sys.stderr)
"""


def test_exit_now_ends_the_process_with_status_70_after_writing_the_log():
    assert EXIT_INTERNAL_ERROR == 70  # sysexits' EX_SOFTWARE, as the docs state
    done = subprocess.run(
        [sys.executable, "-c", STOPS], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == EXIT_INTERNAL_ERROR
    assert done.stderr == "CRITICAL the ingest stopped (exit code -9); stopping the worker\n"
