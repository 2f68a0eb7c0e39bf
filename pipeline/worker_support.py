"""Small pieces the worker, replay and tools share: limits, noise key loading."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from dpstream.config.schema import ConfigError, NoiseMode, PipelineConfig, StatisticConfig
from dpstream.operators.noise import KeyedNoise, NoiseSource, ZeroNoise

from .records import Limits, ValueRule

MIN_KEY_BYTES = 16


def limits_for(cfg: PipelineConfig) -> Limits:
    keys = {s.key for s in cfg.statistics}
    return Limits(
        max_record_bytes=cfg.input.max_record_bytes,
        max_user_id_length=cfg.input.max_user_id_length,
        # A statistic without a key filter counts every event, whatever its key.
        known_keys=None if None in keys else frozenset(keys),
        value_rules=tuple(value_rule(s) for s in cfg.statistics),
        cell_fields=tuple(sorted({s.cells.field for s in cfg.statistics if s.cells})),
        max_cell_key_length=cfg.input.max_cell_key_length,
    )


def value_rule(stat: StatisticConfig) -> ValueRule:
    """Count ignores values; distinct needs one; sum, histogram and kselect need 1..R;
    mean and cell_mean any finite number (clipped by the mechanism), and cell_mean the
    cell attribute (in ``cells.keys`` when that is given)."""
    bound = stat.max_value if stat.kind == "sum" else stat.bins
    cells = stat.cells
    return ValueRule(
        stat.name,
        stat.key,
        stat.kind != "count",
        bound,
        stat.deletions,
        cell_field=None if cells is None else cells.field,
        cell_keys=None if cells is None or cells.keys is None else frozenset(cells.keys),
    )


def load_noise(cfg: PipelineConfig) -> NoiseSource:
    """The noise source the config asks for. The key is read here and never logged.

    Raises:
        ConfigError: keyed mode without a usable key; the message names the field.
    """
    if cfg.noise.mode is NoiseMode.insecure_zero:
        return ZeroNoise()
    material: bytes | None = None
    if cfg.noise.key_file is not None:
        try:
            material = cfg.noise.key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"noise.key_file: cannot read key file: {exc.strerror}") from None
        field = "noise.key_file"
    elif cfg.noise.key_env:
        value = os.environ.get(cfg.noise.key_env)
        if value is None:
            raise ConfigError(
                f"noise.key_env: environment variable {cfg.noise.key_env} is not set "
                "(set it, or noise.key_file, to at least 16 secret random bytes)"
            )
        material = value.strip().encode()
        field = "noise.key_env"
    else:
        raise ConfigError("noise: keyed mode needs noise.key_file or noise.key_env")
    if len(material) < MIN_KEY_BYTES:
        raise ConfigError(f"{field}: the noise key must be at least {MIN_KEY_BYTES} bytes")
    # Fixed-length key for the keyed construction, whatever the material's length.
    return KeyedNoise(hashlib.sha256(b"dpstream-noise-key\0" + material).digest())


def spawn_worker(
    config_path: Path,
    bootstrap: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    loglevel: str = "info",
) -> subprocess.Popen:
    """Start ``dpstream worker`` as a child process logging to ``log_path``."""
    cmd = [
        sys.executable,
        "-m",
        "dpstream.pipeline.cli",
        "worker",
        "--config",
        str(config_path),
        "--bootstrap",
        bootstrap,
        "--loglevel",
        loglevel,
    ]
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
