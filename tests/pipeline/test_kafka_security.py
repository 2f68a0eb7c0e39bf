"""The ``kafka:`` config section: validation (errors name the field) and its mapping onto
Faust's broker_credentials, aiokafka's keyword arguments and librdkafka's properties.

Certificates are made by the ``openssl`` command line for the session (the TLS tests
are skipped without it). No broker is contacted: every client below is only built.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
from pathlib import Path

import faust
import pytest
from confluent_kafka import Consumer, Producer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from dpstream.config.schema import ConfigError, KafkaSecurityConfig, parse_config
from dpstream.pipeline import clients, ingest
from dpstream.pipeline.kafka_security import (
    aiokafka_kwargs,
    confluent_config,
    describe,
    faust_credentials,
    read_password,
    redacted,
    ssl_context,
)

SECRET = "s3cr3t-Ω-correct horse battery staple"  # noqa: S105 - a test password
ENV = "DPSTREAM_TEST_KAFKA_PASSWORD"

BASE = {
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
}


def config(kafka: dict):
    return parse_config({**BASE, "kafka": kafka})


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A CA and a client certificate it signed (EC keys: fast)."""
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
    (d / "garbage.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
    return {
        "ca": d / "ca.pem",
        "cert": d / "client.pem",
        "key": d / "client.key",
        "garbage": d / "garbage.pem",
    }


@pytest.fixture
def password_env(monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    return ENV


# ---------------------------------------------------------------------------------------
# The mapping


def test_default_is_plaintext_everywhere():
    sec = config({}).kafka
    assert sec == KafkaSecurityConfig()
    assert faust_credentials(sec) is None
    assert aiokafka_kwargs(sec) == {"security_protocol": "PLAINTEXT"}
    assert confluent_config(sec) == {"security.protocol": "PLAINTEXT"}
    assert credentials_to_aiokafka_auth(faust_credentials(sec)) == aiokafka_kwargs(sec)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_maps_to_all_three_clients(password_env, mechanism):
    sec = config(
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "username": "dpstream",
            "password_env": password_env,
        }
    ).kafka
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value) == ("SASL_PLAINTEXT", mechanism)
    assert (creds.username, creds.password, creds.ssl_context) == ("dpstream", SECRET, None)
    expected = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "dpstream",
        "sasl_plain_password": SECRET,
    }
    assert aiokafka_kwargs(sec) == expected
    # What Faust hands to aiokafka is what we would hand it directly.
    assert credentials_to_aiokafka_auth(creds) == {**expected, "ssl_context": None}
    assert confluent_config(sec) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
        "sasl.username": "dpstream",
        "sasl.password": SECRET,
    }


def test_sasl_ssl_with_password_file_and_ca(certs, tmp_path):
    pw = tmp_path / "kafka-password"
    pw.write_text(SECRET + "\n")  # as `echo secret > file` writes it
    sec = config(
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "username": "dpstream",
            "password_file": str(pw),
            "ssl_cafile": str(certs["ca"]),
        }
    ).kafka
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.protocol.value == "SASL_SSL" and creds.password == SECRET
    ctx = creds.ssl_context
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "dpstream-test-ca"),),)]
    auth = credentials_to_aiokafka_auth(creds)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert auth["sasl_plain_password"] == SECRET
    kwargs = aiokafka_kwargs(sec)
    assert {k: v for k, v in kwargs.items() if k != "ssl_context"} == {
        k: v for k, v in auth.items() if k != "ssl_context"
    }
    assert confluent_config(sec) == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs["ca"]),
        "enable.ssl.certificate.verification": "true",
        "ssl.endpoint.identification.algorithm": "https",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "dpstream",
        "sasl.password": SECRET,
    }


def test_mutual_tls_without_hostname_check(certs, caplog):
    with caplog.at_level(logging.WARNING):
        sec = config(
            {
                "security_protocol": "SSL",
                "ssl_cafile": str(certs["ca"]),
                "ssl_certfile": str(certs["cert"]),
                "ssl_keyfile": str(certs["key"]),
                "ssl_check_hostname": False,
            }
        ).kafka
    assert "ssl_check_hostname is false" in caplog.text
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SSLCredentials)
    # The certificate is still verified against the CA; only the name check is off.
    assert creds.context.verify_mode == ssl.CERT_REQUIRED
    assert creds.context.check_hostname is False
    assert credentials_to_aiokafka_auth(creds) == {
        "security_protocol": "SSL",
        "ssl_context": creds.context,
    }
    assert aiokafka_kwargs(sec)["security_protocol"] == "SSL"
    assert confluent_config(sec) == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs["ca"]),
        "ssl.certificate.location": str(certs["cert"]),
        "ssl.key.location": str(certs["key"]),
        "enable.ssl.certificate.verification": "true",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_ssl_without_cafile_uses_the_system_store():
    sec = config({"security_protocol": "SSL"}).kafka
    assert confluent_config(sec)["ssl.ca.location"] == "probe"
    ctx = ssl_context(sec)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def sasl_ssl(certs, password_env) -> KafkaSecurityConfig:
    return config(
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "username": "dpstream",
            "password_env": password_env,
            "ssl_cafile": str(certs["ca"]),
            "ssl_certfile": str(certs["cert"]),
            "ssl_keyfile": str(certs["key"]),
        }
    ).kafka


def test_librdkafka_and_aiokafka_accept_the_generated_settings(certs, password_env):
    """Building a client validates every property name and value (and loads the files)."""
    for sec in (
        config({}).kafka,
        config({"security_protocol": "SSL", "ssl_cafile": str(certs["ca"])}).kafka,
        sasl_ssl(certs, password_env),
    ):
        conf = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0, **confluent_config(sec)}
        Producer(conf).flush(0)
        Consumer({**conf, "group.id": "t"}).close()
        asyncio.run(build_aiokafka_clients(aiokafka_kwargs(sec)))


async def build_aiokafka_clients(kwargs: dict) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", **kwargs)
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9", **kwargs)
    await consumer.stop()
    await producer.stop()


def test_the_worker_app_gets_the_credentials(certs, password_env, tmp_path):
    from dpstream.operators.noise import ZeroNoise
    from dpstream.pipeline.app import create_app

    cfg = parse_config({**BASE, "kafka": sasl_ssl(certs, password_env).model_dump(mode="json")})
    app = create_app(cfg, "127.0.0.1:9", ZeroNoise(), tmp_path)
    creds = app.conf.broker_credentials
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.protocol.value == "SASL_SSL"
    assert (creds.mechanism.value, creds.username, creds.password) == (
        "SCRAM-SHA-256",
        "dpstream",
        SECRET,
    )
    assert creds.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_the_producer_and_the_consumer_tools_get_the_settings(password_env, monkeypatch):
    built: list[dict] = []

    class Capture:
        def __init__(self, conf: dict) -> None:
            built.append(conf)

        def __getattr__(self, name):
            raise RuntimeError("captured")

    monkeypatch.setattr(clients, "Producer", Capture)
    monkeypatch.setattr(clients, "Consumer", Capture)
    cfg = config(
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "username": "dpstream",
            "password_env": password_env,
        }
    )
    clients.make_producer("b:9092", cfg.kafka, **{"linger.ms": 7})
    with pytest.raises(RuntimeError, match="captured"):
        clients.read_releases("b:9092", "dp.events", group="g", security=cfg.kafka)
    with pytest.raises(RuntimeError, match="captured"):
        list(clients.export_log(cfg, "b:9092"))  # export-log's consumer
    # The ingest's consumer (source topics) and producer (events topic).
    built += [ingest.consumer_config(cfg, "b:9092"), ingest.producer_config("b:9092", cfg)]
    assert len(built) == 5
    for conf in built:
        assert conf["bootstrap.servers"] == "b:9092"
        assert conf["security.protocol"] == "SASL_PLAINTEXT"
        assert conf["sasl.mechanisms"] == "SCRAM-SHA-256"
        assert (conf["sasl.username"], conf["sasl.password"]) == ("dpstream", SECRET)
    assert built[0]["linger.ms"] == 7  # explicit overrides still win
    # Without a kafka section the tools stay on PLAINTEXT.
    clients.make_producer("b:9092")
    assert built[-1]["security.protocol"] == "PLAINTEXT" and "sasl.password" not in built[-1]


# ---------------------------------------------------------------------------------------
# Secrets stay out of logs, reprs and error messages


def test_the_password_is_never_logged_or_shown(certs, password_env, caplog):
    with caplog.at_level(logging.DEBUG):
        sec = sasl_ssl(certs, password_env)
        creds = faust_credentials(sec)
        conf = confluent_config(sec)
        aiokafka_kwargs(sec)
        line = describe(sec)
    assert SECRET not in caplog.text
    assert SECRET not in repr(creds) and SECRET not in repr(sec) and SECRET not in line
    assert password_env in line  # says where the password comes from
    assert redacted(conf)["sasl.password"] == "<redacted>"
    assert SECRET not in repr(redacted(conf))
    assert redacted(conf)["sasl.username"] == "dpstream"


# ---------------------------------------------------------------------------------------
# Config errors name the field


@pytest.mark.parametrize(
    ("kafka", "field"),
    [
        ({"security_protocol": "TLS"}, "kafka.security_protocol"),
        (
            {"security_protocol": "SASL_SSL", "username": "u", "password_env": "P"},
            "kafka.sasl_mechanism: required for security_protocol SASL_SSL",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "username": "u"},
            "kafka.sasl_mechanism",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "password_env": "P"},
            "kafka.username: required",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "username": "u"},
            "kafka.password_env: set exactly one of password_env and password_file",
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "username": "u",
                "password_env": "P",
                "password_file": "/p",
            },
            "kafka.password_env: set exactly one",
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "username": "u",
                "password_env": "not a name",
            },
            "kafka.password_env: must be the name of an environment variable",
        ),
        ({"username": "u"}, "kafka.username: only applies to SASL_PLAINTEXT and SASL_SSL"),
        ({"sasl_mechanism": "PLAIN"}, "kafka.sasl_mechanism: only applies"),
        ({"ssl_cafile": "/ca.pem"}, "kafka.ssl_cafile: only applies to SSL and SASL_SSL"),
        ({"ssl_check_hostname": False}, "kafka.ssl_check_hostname: only applies"),
        (
            {"security_protocol": "SSL", "ssl_certfile": "/c.pem"},
            "kafka.ssl_keyfile: ssl_certfile and ssl_keyfile go together",
        ),
        (
            {"security_protocol": "SSL", "ssl_keyfile": "/c.key"},
            "kafka.ssl_certfile: ssl_certfile and ssl_keyfile go together",
        ),
        ({"bootstrap": "x:1"}, "kafka.bootstrap: Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_field(kafka, field):
    with pytest.raises(ConfigError) as info:
        config(kafka)
    assert field in str(info.value)


@pytest.mark.parametrize("name", ["password", "sasl_password", "ssl_key_password"])
def test_an_inline_secret_is_refused_without_echoing_it(name):
    kafka = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "username": "u",
        name: SECRET,
    }
    with pytest.raises(ConfigError) as info:
        config(kafka)
    assert f"kafka.{name}: secrets are never written in the config" in str(info.value)
    assert SECRET not in str(info.value)


def test_plain_over_plaintext_warns(caplog, password_env):
    with caplog.at_level(logging.WARNING):
        config(
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "username": "u",
                "password_env": password_env,
            }
        )
    assert "sends the password unencrypted" in caplog.text


def test_missing_secrets_and_files_are_config_errors_naming_the_field(certs, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "username": "u"}
    cases = [
        ({**sasl, "password_env": ENV}, "kafka.password_env: environment variable"),
        ({**sasl, "password_file": str(tmp_path / "none")}, "kafka.password_file: cannot read"),
        ({"security_protocol": "SSL", "ssl_cafile": str(tmp_path / "none")}, "kafka.ssl_cafile"),
        ({"security_protocol": "SSL", "ssl_cafile": str(certs["garbage"])}, "kafka.ssl_cafile"),
        (
            {
                "security_protocol": "SSL",
                "ssl_certfile": str(certs["ca"]),  # the CA's certificate, the client's key
                "ssl_keyfile": str(certs["key"]),
            },
            "kafka.ssl_certfile: certificate and ssl_keyfile do not load",
        ),
    ]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cases.append(({**sasl, "password_file": str(empty)}, "kafka.password_file: the file is empty"))
    for kafka, message in cases:
        sec = config(kafka).kafka
        for build in (faust_credentials, confluent_config, aiokafka_kwargs):
            with pytest.raises(ConfigError) as info:
                build(sec)
            assert message in str(info.value), (kafka, build.__name__)


def test_read_password_is_none_without_sasl():
    assert read_password(KafkaSecurityConfig()) is None
    assert read_password(KafkaSecurityConfig(security_protocol="SSL")) is None
