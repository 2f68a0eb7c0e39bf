"""The Schema Registry chooser (deploy/registry.py) without a registry: the URL from the
environment is used as given and nothing starts, a missing Maven is explained, a recorded
registry that is gone reads as not alive."""

from __future__ import annotations

import json

import pytest

from dpstream.deploy import broker, registry
from dpstream.deploy.registry import LocalRegistry, schema_registry


def test_the_url_from_the_environment_is_used_and_nothing_starts(monkeypatch):
    def forbidden(*_args, **_kwargs):
        raise AssertionError("schema_registry() must not start a registry when the env var is set")

    monkeypatch.setenv(registry.URL_ENV, "https://sr.example/apis/ccompat/v7")
    monkeypatch.setattr(LocalRegistry, "start", classmethod(forbidden))
    with schema_registry() as url:
        assert url == "https://sr.example/apis/ccompat/v7"


def test_fetch_explains_missing_maven(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "registry_dir", lambda: tmp_path / "apicurio")
    monkeypatch.setattr(broker.shutil, "which", lambda _name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(broker.BrokerError, match="'mvn' was not found"):
        registry.fetch_registry()


def test_a_recorded_registry_that_is_gone_is_not_alive_and_is_forgotten(monkeypatch, tmp_path):
    monkeypatch.setenv(broker.HOME_ENV, str(tmp_path))
    assert registry.status_detached() is None
    assert registry.stop_detached() is False
    state = registry.state_file()
    state.parent.mkdir(parents=True)
    gone = tmp_path / "gone"
    gone.mkdir()
    state.write_text(
        json.dumps(
            {"url": "http://127.0.0.1:1/apis/ccompat/v7", "pid": 2**22 + 7,
             "data_dir": str(gone), "log_file": str(gone / "registry.log")}
        )
    )  # fmt: skip
    assert registry.status_detached()["alive"] is False
    assert registry.stop_detached() is True
    assert not state.exists() and not gone.exists()
