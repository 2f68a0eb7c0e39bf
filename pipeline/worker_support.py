"""Small pieces the worker, replay and tools share: limits, noise key loading."""

from __future__ import annotations

import base64
import binascii
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from dpstream.config.schema import ConfigError, NoiseMode, PipelineConfig
from dpstream.operators.noise import NoiseSource

from .keys import PipelineKey
from .kinds import value_rule
from .records import Limits

MIN_KEY_BYTES = 32
KEY_FORM = (
    "32 or more random bytes written as hex or base64, e.g. "
    "python -c 'import secrets; print(secrets.token_hex(32))'"
)


def limits_for(cfg: PipelineConfig) -> Limits:
    # A statistic without a key filter counts every event, whatever its key.
    counts_every_key = any(s.key is None for s in cfg.statistics)
    keys = frozenset(s.key for s in cfg.statistics if s.key is not None)
    return Limits(
        max_record_bytes=cfg.input.max_record_bytes,
        max_user_id_length=cfg.input.max_user_id_length,
        known_keys=None if counts_every_key else keys,
        value_rules=tuple(value_rule(s) for s in cfg.statistics),
        cell_fields=tuple(sorted({s.cells.field for s in cfg.statistics if s.cells})),
        max_cell_key_length=cfg.input.max_cell_key_length,
        user_id_path=tuple(cfg.input.user_id_field.split(".")),
    )


def load_noise(cfg: PipelineConfig) -> NoiseSource:
    """The noise source the config asks for (``load_key``'s)."""
    return load_key(cfg).noise


def load_key(cfg: PipelineConfig) -> PipelineKey:
    """The pipeline's key as the config gives it: noise, ledger MACs, key commitment
    (``pipeline.keys``). The key is read here and never logged.

    Raises:
        ConfigError: keyed mode without a usable key; the message names the field.
    """
    if cfg.noise.mode is NoiseMode.insecure_zero:
        return PipelineKey.insecure_zero()
    if cfg.noise.key_file is not None:
        try:
            text = cfg.noise.key_file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"noise.key_file: cannot read key file: {exc.strerror}") from None
        key = noise_key(text, "noise.key_file")
    elif cfg.noise.key_env:
        value = os.environ.get(cfg.noise.key_env)
        if value is None:
            raise ConfigError(
                f"noise.key_env: environment variable {cfg.noise.key_env} is not set "
                f"(set it, or noise.key_file, to {KEY_FORM})"
            )
        key = noise_key(value.encode(), "noise.key_env")
    else:
        raise ConfigError("noise: keyed mode needs noise.key_file or noise.key_env")
    return PipelineKey.from_key(key)


def noise_key(text: bytes, field: str) -> bytes:
    """The key's bytes from its text form: hex (64+ digits) or base64 of 32+ bytes.

    A password is not a key. Refused, each with a message that names the field and never
    the key:

    * text that decodes to fewer than 256 bits, or is neither hex nor base64;
    * bytes with fewer than 16 distinct values (a repeated pattern; 32 random bytes have
      fewer with probability below 2^-60);
    * bytes that are all text (printable ASCII, tab, line feed, carriage return): a
      passphrase written as hex or base64, e.g. ``xxd -p`` of a sentence. 32 random bytes
      are all text with probability (98/256)^32, about 4.5e-14;
    * text that reads as words: more than half of its characters (base64 padding aside)
      are the nine commonest English letters (e t a o i n s h r) in one case, as in a
      passphrase that happens to be valid base64
      (``CorrectHorseBatteryStapleBlueMoonRiverDance1``: 27 of 44). English words are
      about 70% these letters; a character of a random key's hex or base64 is one of them
      in a given case with probability at most 9/64, so a random key of 32 or more bytes
      is refused with probability below 2 * P(Binomial(43, 9/64) > 21.5), about 1.9e-8.

    No test proves randomness: the key must come from a CSPRNG (docs/security.md).
    """
    try:
        compact = text.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{field}: the noise key must be text: {KEY_FORM}") from None
    key = _decode_key(compact)
    if key is None or len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{field}: the noise key must be at least 256 bits: {KEY_FORM}")
    if len(set(key)) < 16:
        raise ConfigError(f"{field}: the noise key is not random (a repeated pattern): {KEY_FORM}")
    if _TEXT_BYTES.issuperset(key):
        raise ConfigError(
            f"{field}: the noise key decodes to text (every byte printable ASCII), a "
            f"passphrase written as hex or base64, not random bytes: {KEY_FORM}"
        )
    if _reads_as_words(compact.rstrip("=")):
        raise ConfigError(
            f"{field}: the noise key reads as words (more than half its characters are "
            f"common English letters), a passphrase, not random bytes: {KEY_FORM}"
        )
    return key


_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}
_COMMON_LETTERS = "etaoinshr"  # the nine commonest letters of English text


def _reads_as_words(text: str) -> bool:
    """More than half of ``text`` is common English letters of one case (``noise_key``)."""
    lower = sum(text.count(c) for c in _COMMON_LETTERS)
    upper = sum(text.count(c) for c in _COMMON_LETTERS.upper())
    return 2 * max(lower, upper) > len(text)


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_BASE64_URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def _decode_key(text: str) -> bytes | None:
    """Hex first (a hex string is also valid base64), then base64, then URL-safe base64."""
    if _HEX.fullmatch(text):
        return bytes.fromhex(text)
    bare = text.rstrip("=")
    padded = bare + "=" * (-len(bare) % 4)
    try:
        if _BASE64.fullmatch(text):
            return base64.b64decode(padded, validate=True)
        if _BASE64_URL.fullmatch(text):
            return base64.urlsafe_b64decode(padded)
    except (binascii.Error, ValueError):
        return None
    return None


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
        "dpstream.pipeline.cli",
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
