"""Shared pieces of the Kafka benchmarks (``bench/throughput/`` and its contenders).

Nothing here times anything: process and machine facts from ``/proc`` and percentiles
(pre-producing topics is ``bench/throughput/datasets.py``).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- /proc


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (peak RSS) / VmSize of ``pid`` in bytes; {} once it has exited."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "VmSize"):
            out[name] = int(rest.split()[0]) * 1024
    return out


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    # Fields 14 and 15 of proc(5) (utime, stime); fields[0] here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine() -> dict[str, str]:
    """CPU model, cores, RAM, OS, Python and the Kafka client/broker versions."""
    info = {"cpu": "unknown", "cores": str(os.cpu_count()), "ram": "unknown"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    info["python"] = f"{platform.python_implementation()} {platform.python_version()}"
    info["platform"] = platform.platform()
    info["libs"] = library_versions()
    return info


def library_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("faust-streaming", "mode-streaming", "aiokafka", "confluent-kafka", "orjson"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    try:
        import confluent_kafka

        parts.append(f"librdkafka {confluent_kafka.libversion()[0]}")
    except ImportError:
        pass
    return ", ".join(parts)


# --------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, never an interpolation.

    With fewer than 100 values the 99th percentile is the maximum.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def spread(values: Iterable[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return (min(vals), max(vals)) if vals else (math.nan, math.nan)


def fmt_rate(x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x:,.0f}"


def fmt_bytes(n: float) -> str:
    if n is None or math.isnan(n):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return math.nan, my
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx
