"""What the local JVM services (deploy/broker.py's Kafka, deploy/registry.py's Schema
Registry) share as processes: whether one still runs after this Python process let it go
(``detach``, then ``dpstream broker|registry status`` in another process), its signals and
its stop, and the small JSON file that records a detached one."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def proc_cmdline(pid: int) -> str | None:
    """The command line of ``pid`` on Linux, ``None`` where /proc is unavailable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return "" if Path("/proc/self").exists() else None
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace")


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is our exited child (no zombie left)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class ServiceProcess:
    """A service's JVM, leading its own process group: started here (``_proc``) or found
    again by its pid. A subclass (a dataclass) has ``pid`` and ``_proc`` and says by
    ``_is_ours`` which command line is its own, so a reused pid is not taken for it."""

    pid: int
    _proc: subprocess.Popen[bytes] | None

    def _is_ours(self, cmdline: str) -> bool:
        raise NotImplementedError

    def stop(self, timeout: float = 20.0) -> None:
        raise NotImplementedError

    def is_alive(self) -> bool:
        """Whether the process still runs (a zombie or a reused pid does not count)."""
        if self._proc is not None:
            return self._proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False  # PermissionError: someone else's process; ours is signalable
        if is_zombie(self.pid):
            reap(self.pid)
            return False
        cmdline = proc_cmdline(self.pid)
        return cmdline is None or self._is_ours(cmdline)  # None: no /proc, trust the pid

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def _wait_exit(self, timeout: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.is_alive():
            if time.monotonic() >= deadline:
                return False
            reap(self.pid)
            time.sleep(0.1)
        return True

    def _terminate(self, timeout: float, what: str) -> bool:
        """SIGTERM, SIGKILL after ``timeout``; whether it has exited (after at most 10 s
        more). ``what`` names it in the warning about an ignored SIGTERM."""
        atexit.unregister(self._atexit_stop)
        exited = True
        if self.is_alive():
            self._signal(signal.SIGTERM)
            if not self._wait_exit(timeout):
                logger.warning(
                    "%s pid %d ignored SIGTERM for %.0f s; killing", what, self.pid, timeout
                )
                self._signal(signal.SIGKILL)
                exited = self._wait_exit(10.0)
        reap(self.pid)
        return exited

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=10.0)

    def detach(self) -> None:
        """Let the process outlive this Python process (no stop at exit, no child handle)."""
        atexit.unregister(self._atexit_stop)
        if self._proc is not None:
            with warnings.catch_warnings():
                # Popen warns when dropped while its child runs; that is the point here.
                warnings.simplefilter("ignore", ResourceWarning)
                self._proc = None


def read_state(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object recorded at ``path`` for a detached service, or None (none, or an
    unreadable one, warned about naming ``what``)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable %s state %s: %s", what, path, exc)
        return None
    return state if isinstance(state, dict) else None


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Record ``state`` at ``path`` whole or not at all (a temp file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
