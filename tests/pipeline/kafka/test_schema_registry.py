"""``input.format``, ``outputs.format`` and their ``schema_registry``: validation (errors
name the field and never repeat a secret) and the mapping onto confluent-kafka's
SchemaRegistryClient (pipeline/kafka/schema_registry.py). No registry is contacted:
clients are only built."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.consumer import source_decoder
from dpstream.pipeline.kafka.schema_registry import client_config, describe, make_client
from dpstream.pipeline.wire.records import limits_for
from dpstream.pipeline.wire.registry_formats import RegistryDecoder

SECRET = "r3g1stry-Ω-secret"  # noqa: S105 - a test password
ENV = "DPSTREAM_TEST_REGISTRY_PASSWORD"
URL = "https://registry.example:8081/apis/ccompat/v7"
BASE = {
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
}


def config(input_section: dict):
    return parse_config({**BASE, "input": input_section})


def registry(**section):
    return config({"format": "avro", "schema_registry": {"url": URL, **section}}).input


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"format": "avro"}, "input.schema_registry: required for format avro"),
        (
            {"schema_registry": {"url": URL}},
            "input.schema_registry: only applies to format avro, protobuf or json_schema",
        ),
        ({"format": "xml"}, "input.format: Input should be 'json', 'avro', 'protobuf'"),
        (
            {"format": "avro", "schema_registry": {"url": "registry:8081"}},
            "input.schema_registry.url: must be an http:// or https:// URL",
        ),
        (
            {"format": "avro", "schema_registry": {"url": URL, "password": SECRET}},
            "input.schema_registry.password: secrets are never written in the config",
        ),
        (
            {"format": "avro", "schema_registry": {"url": f"https://me:{SECRET}@registry:8081"}},
            "input.schema_registry.url: credentials are never written in the URL",
        ),
        (
            {"format": "avro", "schema_registry": {"url": URL, "username": "me"}},
            "input.schema_registry.password_env: set exactly one of password_env and",
        ),
        (
            {"format": "avro", "schema_registry": {"url": URL, "password_env": ENV}},
            "input.schema_registry.password_env: only applies with username",
        ),
        (
            {"format": "avro", "schema_registry": {"url": URL, "ssl_certfile": "c.pem"}},
            "input.schema_registry.ssl_keyfile: ssl_certfile and ssl_keyfile go together",
        ),
        (
            {
                "format": "avro",
                "schema_registry": {"url": "http://registry:8081", "ssl_cafile": "ca.pem"},
            },
            "input.schema_registry.ssl_cafile: only applies to an https:// url",
        ),
    ],
)
def test_bad_sections_name_the_field_and_never_the_secret(section, message):
    with pytest.raises(ConfigError) as info:
        config(section)
    assert message in str(info.value)
    assert SECRET not in str(info.value)


def test_json_needs_no_registry_and_builds_no_decoder():
    cfg = parse_config(BASE)
    assert (cfg.input.format, cfg.input.schema_registry) == ("json", None)
    assert source_decoder(cfg, limits_for(cfg)) is None


def test_a_plain_registry_maps_to_a_bounded_client():
    section = registry().schema_registry
    assert client_config(section) == {
        "url": URL,
        "timeout": 10.0,
        "max.retries": 2,
        "retries.wait.ms": 500,
        "retries.max.wait.ms": 5000,
    }
    assert describe(section) == f"{URL}, CA system"


def test_basic_auth_comes_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, SECRET)
    section = registry(username="dpstream", password_env=ENV).schema_registry
    assert client_config(section)["basic.auth.user.info"] == f"dpstream:{SECRET}"
    assert SECRET not in describe(section) and f"${ENV}" in describe(section)
    client = make_client(section)
    assert client._rest_client.auth == ("dpstream", SECRET)
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")
    section = registry(username="dpstream", password_file=str(secret_file)).schema_registry
    assert client_config(section)["basic.auth.user.info"] == f"dpstream:{SECRET}"


def test_a_missing_password_names_the_field(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    section = registry(username="dpstream", password_env=ENV).schema_registry
    with pytest.raises(ConfigError, match=f"input.schema_registry.password_env: .*{ENV}"):
        client_config(section)
    missing = registry(username="u", password_file=str(tmp_path / "nope")).schema_registry
    with pytest.raises(ConfigError, match="input.schema_registry.password_file: cannot read"):
        client_config(missing)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A CA and a client certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command line")
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=dpstream-test-ca")  # fmt: skip
    run("req", *ec, "-keyout", "client.key", "-out", "client.csr",
        "-subj", "/CN=dpstream-client")  # fmt: skip
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "client.pem", "-days", "2")  # fmt: skip
    return {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key"}


def test_tls_files_map_to_the_client_and_a_missing_one_names_its_field(certs, tmp_path):
    section = registry(
        ssl_cafile=str(certs["ca"]), ssl_certfile=str(certs["cert"]), ssl_keyfile=str(certs["key"])
    ).schema_registry
    conf = client_config(section)
    assert (conf["ssl.ca.location"], conf["ssl.certificate.location"]) == (
        str(certs["ca"]),
        str(certs["cert"]),
    )
    assert conf["ssl.key.location"] == str(certs["key"])
    make_client(section)  # the files load
    mismatched = registry(
        ssl_certfile=str(certs["cert"]), ssl_keyfile=str(certs["ca"])
    ).schema_registry
    with pytest.raises(ConfigError, match="input.schema_registry.ssl_certfile: does not load"):
        make_client(mismatched)
    gone = registry(ssl_cafile=str(tmp_path / "gone.pem")).schema_registry
    with pytest.raises(ConfigError, match="input.schema_registry.ssl_cafile: no such file"):
        client_config(gone)


def test_the_ingest_builds_the_formats_decoder():
    cfg = parse_config(
        {
            **BASE,
            "input": {"format": "protobuf", "schema_registry": {"url": "http://127.0.0.1:1"}},
        }
    )
    decoder = source_decoder(cfg, limits_for(cfg))
    assert isinstance(decoder, RegistryDecoder) and decoder.format == "protobuf"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"format": "avro"}, "outputs.schema_registry: required for format avro"),
        ({"schema_registry": {"url": URL}}, "outputs.schema_registry: only applies to format avro"),
        ({"format": "protobuf", "schema_registry": {"url": URL}}, "outputs.format"),
    ],
)
def test_bad_outputs_sections_name_the_field(section, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, "outputs": section})


def test_the_outputs_registry_is_its_own_section_and_names_it(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    outputs = {"format": "avro", "schema_registry": {"url": URL, "username": "dpstream",
                                                     "password_env": ENV}}  # fmt: skip
    cfg = parse_config({**BASE, "outputs": outputs})
    assert cfg.input.format == "json" and cfg.input.schema_registry is None
    section = cfg.outputs.schema_registry
    with pytest.raises(ConfigError, match=f"outputs.schema_registry.password_env: .*{ENV}"):
        client_config(section, "outputs.schema_registry")
    monkeypatch.setenv(ENV, SECRET)
    client = make_client(section, "outputs.schema_registry")
    assert client._rest_client.auth == ("dpstream", SECRET)
