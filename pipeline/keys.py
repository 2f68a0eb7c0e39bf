"""What the pipeline's secret key gives besides noise: the authentication of what it writes
to its ledger and of the logs it exports, and a public commitment to the key.

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

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

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
