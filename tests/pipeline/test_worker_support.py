"""The worker's noise source (pipeline/worker_support.py): the key is required, read from
the environment or a file, and never echoed."""

from __future__ import annotations

import copy

import pytest

from dpstream.config.schema import ConfigError, parse_config
from dpstream.pipeline.worker_support import load_noise

BASE = {
    "privacy": {"total_epsilon": 2.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 4}],
}


def _cfg(**changes):
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        target = data
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        target[last] = value
    return data


def test_noise_key_is_required_and_never_echoed(monkeypatch, tmp_path):
    cfg = parse_config(_cfg(noise__key_env="DPSTREAM_TEST_KEY"))
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
    from_file = load_noise(parse_config(_cfg(noise__key_file=str(key_file))))
    assert from_file.discrete_laplace(("n", 1), 10) == load_noise(cfg).discrete_laplace(
        ("n", 1), 10
    )
    with pytest.raises(ConfigError, match="noise.key_file: cannot read key file"):
        load_noise(parse_config(_cfg(noise__key_file=str(tmp_path / "missing"))))
