"""The pipeline's secret key: how it is loaded (``load_key``: from ``noise.key_file`` or
``noise.key_env``, refused unless it is 256 random bits or more) and what it gives besides
noise: the authentication of what the pipeline writes to its ledger and of the logs it
exports, and a public commitment to the key.

One key, three uses, each under its own domain tag (so that no value derived for one use
is a value of another):

* noise: ``KeyedNoise`` over SHA-256("dpstream-noise-key" || key) (operators.noise);
* the MAC key: HMAC-SHA256 under SHA-256("dpstream/ledger-mac/v1" || key) authenticates
  every ledger record the pipeline writes and every log ``dpstream export-log`` writes, so
  a record another writer put in a shared ledger topic, or an edited log, is told apart;
* the key commitment: the first 128 bits of SHA-256("dpstream/key-commitment/v1" || key),
  written in the clear in the ledger and in each statistic's stored identity, so that a
  worker started with another key (which would re-draw every released node's noise) is
  refused (docs/security.md).

``noise.mode: insecure_zero`` has no key: its MAC key is a public constant (its records
authenticate nothing, and say so: every release of such a pipeline is stamped insecure)
and its commitment is the literal ``insecure_zero``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from dpstream.config.base import ConfigError
from dpstream.config.schema import NoiseMode, PipelineConfig
from dpstream.operators.noise import KeyedNoise, NoiseSource, ZeroNoise

MAC_FIELD = "mac"
INSECURE_COMMITMENT = "insecure_zero"
_MAC_TAG = b"dpstream/ledger-mac/v1\0"
_COMMITMENT_TAG = b"dpstream/key-commitment/v1\0"
_NOISE_TAG = b"dpstream-noise-key\0"  # unchanged since the first keyed release
_INSECURE_MAC_KEY = hashlib.sha256(b"dpstream/insecure-zero/no-key\0").digest()


@dataclass(frozen=True)
class PipelineKey:
    """The noise source and the authentication derived from one pipeline key.

    Attributes:
        noise: the noise source (keyed, or zero in the insecure test mode).
        mac_key: the HMAC-SHA256 key of ledger records and exported logs.
        commitment: a public commitment to the key (hex; ``insecure_zero`` without one).
    """

    noise: NoiseSource
    mac_key: bytes
    commitment: str

    @classmethod
    def from_key(cls, key: bytes) -> PipelineKey:
        """The derivations of a secret ``key`` (its raw bytes, at least 256 bits)."""
        return cls(
            KeyedNoise(hashlib.sha256(_NOISE_TAG + key).digest()),
            hashlib.sha256(_MAC_TAG + key).digest(),
            hashlib.sha256(_COMMITMENT_TAG + key).hexdigest()[:32],
        )

    @classmethod
    def insecure_zero(cls) -> PipelineKey:
        """The insecure test mode: zero noise, a public MAC key, no commitment."""
        return cls(ZeroNoise(), _INSECURE_MAC_KEY, INSECURE_COMMITMENT)

    @property
    def secure(self) -> bool:
        return self.commitment != INSECURE_COMMITMENT

    def sign(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """``record`` with its MAC (over its canonical JSON without the MAC field)."""
        body = {k: v for k, v in record.items() if k != MAC_FIELD}
        return {**body, MAC_FIELD: self._mac(body)}

    def verify(self, record: Mapping[str, Any]) -> bool:
        """Whether ``record`` carries a valid MAC under this key."""
        mac = record.get(MAC_FIELD)
        if not isinstance(mac, str):
            return False
        body = {k: v for k, v in record.items() if k != MAC_FIELD}
        return hmac.compare_digest(mac, self._mac(body))

    def _mac(self, body: Mapping[str, Any]) -> str:
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        return hmac.new(self.mac_key, canonical, hashlib.sha256).hexdigest()

    def log_mac(self) -> LogMac:
        """An incremental MAC over the lines of an exported log."""
        return LogMac(hmac.new(self.mac_key, b"dpstream/log/v1\0", hashlib.sha256))


class LogMac:
    """The MAC of a log, fed line by line: each line's length, then its bytes (so no two
    different sequences of lines have the same input)."""

    def __init__(self, state: hmac.HMAC) -> None:
        self._state = state

    def update(self, line: bytes) -> None:
        self._state.update(len(line).to_bytes(8, "big"))
        self._state.update(line)

    def hexdigest(self) -> str:
        return self._state.hexdigest()


MIN_KEY_BYTES = 32


KEY_FORM = (
    "32 or more random bytes written as hex or base64, e.g. "
    "python -c 'import secrets; print(secrets.token_hex(32))'"
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
    else:
        # Config validation refuses a keyed mode with neither (NoiseConfig).
        assert cfg.noise.key_env is not None
        value = os.environ.get(cfg.noise.key_env)
        if value is None:
            raise ConfigError(
                f"noise.key_env: environment variable {cfg.noise.key_env} is not set "
                f"(set it, or noise.key_file, to {KEY_FORM})"
            )
        key = noise_key(value.encode(), "noise.key_env")
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
