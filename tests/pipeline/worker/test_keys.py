"""One key, three uses under their own domain tags (pipeline/worker/keys.py): noise, the MAC of
ledger records and exported logs, and a public commitment."""

from __future__ import annotations

import hashlib

from dpstream.operators.noise import KeyedNoise
from dpstream.pipeline.worker.keys import INSECURE_COMMITMENT, PipelineKey

RAW = bytes(range(32))


def test_the_noise_is_the_keyed_noise_of_before_and_the_uses_are_separated():
    key = PipelineKey.from_key(RAW)
    before = KeyedNoise(hashlib.sha256(b"dpstream-noise-key\0" + RAW).digest())
    assert key.noise.discrete_laplace(("n", 1), 7) == before.discrete_laplace(("n", 1), 7)
    assert key.commitment == hashlib.sha256(b"dpstream/key-commitment/v1\0" + RAW).hexdigest()[:32]
    assert key.mac_key == hashlib.sha256(b"dpstream/ledger-mac/v1\0" + RAW).digest()
    assert len({key.mac_key.hex()[:32], key.commitment}) == 2
    assert key.secure and not PipelineKey.insecure_zero().secure
    assert PipelineKey.insecure_zero().commitment == INSECURE_COMMITMENT


def test_a_signed_record_verifies_and_any_change_does_not():
    key, other = PipelineKey.from_key(RAW), PipelineKey.from_key(RAW[::-1])
    record = key.sign({"event": "statement", "per_user_total": 3.0, "retired": [1, 2]})
    assert key.verify(record) and not other.verify(record)
    assert key.verify({k: record[k] for k in reversed(list(record))})  # order is not signed
    for changed in ({"per_user_total": 2.0}, {"retired": []}, {"extra": 1}, {"mac": "00"}):
        assert not key.verify({**record, **changed})
    assert not key.verify({k: v for k, v in record.items() if k != "mac"})


def test_the_log_mac_covers_every_line_and_their_boundaries():
    key = PipelineKey.from_key(RAW)

    def mac(lines: list[bytes]) -> str:
        state = key.log_mac()
        for line in lines:
            state.update(line)
        return state.hexdigest()

    assert mac([b"ab", b"c"]) == mac([b"ab", b"c"])
    assert mac([b"ab", b"c"]) != mac([b"a", b"bc"])
    assert mac([b"ab", b"c"]) != mac([b"ab", b"c", b""])
