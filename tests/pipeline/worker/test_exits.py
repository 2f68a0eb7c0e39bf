"""The worker's stop after a failure (pipeline/worker/exits.py): its exit status, and the lines
logged before it are written, though the process ends without any shutdown; a stop asked
for that cannot finish ends at its deadline with status 75."""

from __future__ import annotations

import subprocess
import sys

from dpstream.pipeline.worker.exits import (
    EXIT_INTERNAL_ERROR,
    EXIT_STOPPED_UNFLUSHED,
)

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


DEADLINE = """
import logging
import sys
import time

from dpstream.pipeline.worker.exits import StopDeadline

logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
deadline = StopDeadline(0.5)
deadline.arm()
deadline.arm()  # a second signal changes nothing
time.sleep(120)  # a stop that waits for a broker that is gone
"""


def test_a_stop_that_does_not_finish_in_time_ends_the_process_with_status_75():
    assert EXIT_STOPPED_UNFLUSHED == 75  # sysexits' EX_TEMPFAIL, as the docs state
    done = subprocess.run(
        [sys.executable, "-c", DEADLINE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == EXIT_STOPPED_UNFLUSHED
    assert done.stderr.startswith("ERROR the worker did not stop within 0.5 s")
