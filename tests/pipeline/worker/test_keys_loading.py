"""The worker's noise key (pipeline/worker/processes.py): required, read from the
environment or a file, never echoed; only 256 random-looking bits, in hex or base64."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.worker.keys import load_noise, noise_key
from tests.config_builders import minimal, production

KEY = hashlib.sha256(b"one key for every pipeline").digest()


def test_noise_key_is_required_and_never_echoed(monkeypatch, tmp_path):
    cfg = parse_config(minimal(noise__key_env="DPSTREAM_TEST_KEY"))
    monkeypatch.delenv("DPSTREAM_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="noise.key_env: environment variable DPSTREAM_TEST_KEY"):
        load_noise(cfg)
    monkeypatch.setenv("DPSTREAM_TEST_KEY", "short")
    with pytest.raises(ConfigError, match="noise.key_env: the noise key must be at least 256"):
        load_noise(cfg)
    secret = "8f1c2a7e55d04b9e3a61c0ffee12ab34cd56ef7890a1b2c3d4e5f60718293a4b"
    monkeypatch.setenv("DPSTREAM_TEST_KEY", secret)
    assert secret not in repr(load_noise(cfg))
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    from_file = load_noise(parse_config(minimal(noise__key_file=str(key_file))))
    assert from_file.discrete_laplace(("n", 1), 10) == load_noise(cfg).discrete_laplace(
        ("n", 1), 10
    )
    with pytest.raises(ConfigError, match="noise.key_file: cannot read key file"):
        load_noise(parse_config(minimal(noise__key_file=str(tmp_path / "missing"))))


@pytest.mark.parametrize(
    "text",
    [
        "correct horse battery",  # a password
        "0123456789abcdef",  # 16 characters
        "ab" * 24,  # 24 bytes of hex: 192 bits
        "0123456789abcdef" * 4,  # 256 bits of a repeated pattern
        "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",  # base64 of 32 x "A"
        "not base64 at all !!",
    ],
)
def test_a_key_below_256_random_looking_bits_is_refused(text):
    with pytest.raises(ConfigError) as info:
        noise_key(text.encode(), "noise.key_env")
    assert str(info.value).startswith("noise.key_env: the noise key")
    assert text not in str(info.value)


def test_hex_and_base64_keys_of_32_bytes_are_the_same_key():
    raw = hashlib.sha256(b"k").digest()
    forms = [raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(),
             base64.urlsafe_b64encode(raw).decode().rstrip("=")]  # fmt: skip
    assert {noise_key(f.encode() + b"\n", "noise.key_file") for f in forms} == {raw}


def test_the_worker_loads_a_hex_key_from_the_environment(monkeypatch):
    data = production(noise={"mode": "keyed", "key_env": "DPSTREAM_IDENTITY_TEST_KEY"})
    monkeypatch.setenv("DPSTREAM_IDENTITY_TEST_KEY", KEY.hex())
    noise = load_noise(parse_config(data))
    assert noise.discrete_laplace(("n", 1), 10) == noise.discrete_laplace(("n", 1), 10)
    assert KEY.hex() not in repr(noise)


SENTENCE = b"the noise key of the production pipeline is this sentence"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # Issue 24 item 9: a passphrase that happens to be base64: 33 bytes, 29 distinct,
        # not all text, so only the word check refuses it.
        ("CorrectHorseBatteryStapleBlueMoonRiverDance1", "reads as words"),
        ("correct-horse-battery-staple-blue-moon-river", "reads as words"),  # URL-safe
        ("THEQUICKBROWNFOXJUMPSOVERTHELAZYDOGANDRUNSAWAY", "reads as words"),
        # Hex of an ASCII sentence (58 bytes, 16 distinct), as xxd -p writes it, with and
        # without the file's newline; base64 of it too.
        (SENTENCE.hex(), "decodes to text"),
        ((SENTENCE + b"\n").hex(), "decodes to text"),
        (SENTENCE.hex().upper(), "decodes to text"),
        (base64.b64encode(SENTENCE).decode(), "decodes to text"),
    ],
)
def test_a_passphrase_in_hex_or_base64_clothing_is_refused(text, why):
    with pytest.raises(ConfigError) as info:
        noise_key(text.encode(), "noise.key_file")
    message = str(info.value)
    assert message.startswith(f"noise.key_file: the noise key {why}")
    assert text not in message and "horse" not in message.lower()
    assert "python -c 'import secrets; print(secrets.token_hex(32))'" in message


@pytest.mark.parametrize("size", [32, 48, 64])
def test_random_keys_in_every_form_secrets_writes_are_accepted(size):
    # secrets.token_hex(n) is token_bytes(n).hex(), token_urlsafe(n) its URL-safe base64
    # without padding, and `head -c n /dev/urandom | base64` the standard form. 3,000
    # seeded keys per size in each form: the word check refuses a random 32-byte key with
    # probability below 1.9e-8, the text check below 4.5e-14 (noise_key's docstring), so
    # none may be refused.
    rng = random.Random(f"noise keys {size}")
    for _ in range(3000):
        raw = rng.randbytes(size)
        forms = [raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(),
                 base64.urlsafe_b64encode(raw).decode().rstrip("=")]  # fmt: skip
        for text in forms:
            assert noise_key(text.encode() + b"\n", "noise.key_env") == raw
