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
from confluent_kafka import Consumer, KafkaError, Producer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from dpstream.config.base import ConfigError
from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest import consumer as ingest
from dpstream.pipeline.kafka import clients
from dpstream.pipeline.kafka.security import (
    OidcTokenProvider,
    aiokafka_kwargs,
    certificate_validity,
    check_certificate_dates,
    check_connection,
    confluent_config,
    describe,
    faust_credentials,
    read_password,
    redacted,
    refused_setting,
    ssl_context,
    token_provider,
)
from dpstream.pipeline.tools import export

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
    from dpstream.pipeline.worker.app import create_app
    from dpstream.pipeline.worker.keys import PipelineKey

    cfg = parse_config({**BASE, "kafka": sasl_ssl(certs, password_env).model_dump(mode="json")})
    app = create_app(cfg, "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path)
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
        list(export.export_log(cfg, "b:9092"))  # export-log's consumer
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


# ---------------------------------------------------------------------------------------
# OAUTHBEARER: the same tokens for librdkafka and aiokafka

CLIENT_SECRET = "oauth-s3cret+/="  # noqa: S105 - a test secret (needs quoting in Basic auth)
SECRET_ENV = "DPSTREAM_TEST_OAUTH_SECRET"


class TokenEndpoint:
    """A local OAuth token endpoint: records each request, answers with a new token."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[tuple[dict, str]] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                endpoint.requests.append((dict(self.headers), body))
                answer = f'{{"access_token": "token-{len(endpoint.requests)}", "expires_in": 60}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_endpoint():
    endpoint = TokenEndpoint()
    yield endpoint
    endpoint.close()


def oauth(url: str, **extra) -> KafkaSecurityConfig:
    section = {
        "token_endpoint_url": url,
        "client_id": "dpstream-prod",
        "client_secret_env": SECRET_ENV,
        "scope": "kafka",
        "extensions": {"logicalCluster": "lkc-abc123", "identityPoolId": "pool-xyz"},
        **extra,
    }
    return config(
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "oauth": section}
    ).kafka


def test_oauthbearer_maps_to_librdkafkas_oidc_and_aiokafkas_token_provider(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    sec = oauth("https://login.example.com/oauth2/token")
    conf = confluent_config(sec)
    assert {k: v for k, v in conf.items() if k.startswith("sasl")} == {
        "sasl.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://login.example.com/oauth2/token",
        "sasl.oauthbearer.client.id": "dpstream-prod",
        "sasl.oauthbearer.client.secret": CLIENT_SECRET,
        "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "identityPoolId=pool-xyz,logicalCluster=lkc-abc123",
    }
    assert conf["security.protocol"] == "SASL_SSL" and conf["ssl.ca.location"] == "probe"
    assert redacted(conf)["sasl.oauthbearer.client.secret"] == "<redacted>"
    kwargs = aiokafka_kwargs(sec)
    assert kwargs["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(kwargs["sasl_oauth_token_provider"], OidcTokenProvider)
    assert "sasl_plain_password" not in kwargs
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.OAuthCredentials) and creds.protocol.value == "SASL_SSL"
    # Faust's own translation hands aiokafka the same provider and TLS.
    faust_kwargs = credentials_to_aiokafka_auth(creds)
    assert faust_kwargs["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(faust_kwargs["sasl_oauth_token_provider"], OidcTokenProvider)
    assert faust_kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert CLIENT_SECRET not in repr(creds) + repr(kwargs) + describe(sec)
    assert describe(sec) == (
        "SASL_SSL, OAUTHBEARER as client dpstream-prod of "
        "https://login.example.com/oauth2/token (secret from $DPSTREAM_TEST_OAUTH_SECRET), "
        "CA system"
    )


def test_the_token_provider_asks_as_librdkafka_does_and_reuses_the_token(
    token_endpoint, monkeypatch
):
    import base64
    import urllib.parse

    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    provider = token_provider(oauth(token_endpoint.url))

    async def twice() -> list[str]:
        return [await provider.token(), await provider.token()]

    assert asyncio.run(twice()) == ["token-1", "token-1"]  # 60 s lifetime: reused
    assert provider.extensions() == {"logicalCluster": "lkc-abc123", "identityPoolId": "pool-xyz"}
    ((headers, body),) = token_endpoint.requests
    assert urllib.parse.parse_qs(body) == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
    user, _, secret = (
        base64.b64decode(headers["Authorization"].removeprefix("Basic ")).decode().partition(":")
    )
    assert (urllib.parse.unquote(user), urllib.parse.unquote(secret)) == (
        "dpstream-prod",
        CLIENT_SECRET,
    )
    # Past 80% of its lifetime a new one is fetched.
    provider._refresh_at = 0.0
    assert asyncio.run(twice()) == ["token-2", "token-2"]
    # librdkafka and aiokafka take the settings (the consumer is built, not connected).
    sec = oauth(token_endpoint.url)
    Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0, **confluent_config(sec)}).flush(0)
    asyncio.run(build_aiokafka_clients(aiokafka_kwargs(sec)))


def test_a_token_endpoint_that_refuses_is_named(token_endpoint, monkeypatch, tmp_path):
    """By aiokafka's provider, and by librdkafka's own OIDC client at the connection
    check, before any broker is reached."""
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    refused = oauth(token_endpoint.url, scope=None)
    token_endpoint.server.RequestHandlerClass.do_POST = lambda self: self.send_error(401)
    provider = token_provider(refused)
    with pytest.raises(ConfigError) as info:
        provider.fetch()
    assert str(info.value).startswith("kafka.oauth: no token from http://127.0.0.1:")
    assert "for client dpstream-prod (HTTP 401)" in str(info.value)
    with pytest.raises(ConfigError) as info:
        check_connection(refused, "127.0.0.1:9", timeout=10)
    assert (
        str(info.value)
        == f"kafka.oauth: no token from {token_endpoint.url} for client dpstream-prod"
    )
    assert CLIENT_SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("oauth_section", "field"),
    [
        ({"client_id": "c", "client_secret_env": "S"}, "kafka.oauth.token_endpoint_url: Field"),
        (
            {"token_endpoint_url": "http://idp.example.com/t", "client_id": "c",
             "client_secret_env": "S"},
            "kafka.oauth.token_endpoint_url: must be an https:// URL",
        ),
        (
            {"token_endpoint_url": "https://i/t", "client_id": "c"},
            "kafka.oauth.client_secret_env: set exactly one",
        ),
        (
            {"token_endpoint_url": "https://i/t", "client_id": "c", "client_secret": CLIENT_SECRET},
            "kafka.oauth.client_secret: secrets are never written in the config",
        ),
        (
            {"token_endpoint_url": "https://i/t", "client_id": "c", "client_secret_env": "S",
             "extensions": {"a": "b,c"}},
            "kafka.oauth.extensions.a: a value may not contain",
        ),
    ],
)  # fmt: skip
def test_oauth_config_errors_name_the_field(oauth_section, field):
    with pytest.raises(ConfigError) as info:
        config({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                "oauth": oauth_section})  # fmt: skip
    assert field in str(info.value)
    assert CLIENT_SECRET not in str(info.value)


def test_oauthbearer_and_passwords_do_not_mix():
    section = {"token_endpoint_url": "https://i/t", "client_id": "c", "client_secret_env": "S"}
    with pytest.raises(ConfigError, match="kafka.oauth: required for sasl_mechanism OAUTHBEARER"):
        config({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"})
    with pytest.raises(ConfigError, match="kafka.username: OAUTHBEARER takes its token"):
        config({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                "oauth": section, "username": "u"})  # fmt: skip
    with pytest.raises(ConfigError, match="kafka.oauth: only applies to sasl_mechanism"):
        config({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "username": "u",
                "password_env": "P", "oauth": section})  # fmt: skip
    with pytest.raises(ConfigError, match="kafka.oauth: only applies to SASL_PLAINTEXT"):
        config({"security_protocol": "SSL", "oauth": section})


# ---------------------------------------------------------------------------------------
# The connection check: what the broker refused, named


def sec_of(**kafka) -> KafkaSecurityConfig:
    return KafkaSecurityConfig(**kafka)


SCRAM = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": "dp"}


@pytest.mark.parametrize(
    ("kafka", "code", "text", "message"),
    [
        (
            {**SCRAM, "password_env": "P"},
            KafkaError._AUTHENTICATION,
            "sasl_ssl://h:1/bootstrap: SASL authentication error: Authentication failed during "
            "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
            "kafka.password_env: the broker refused the SCRAM-SHA-512 login of user 'dp' "
            "(wrong password, or no such user)",
        ),
        (
            {**SCRAM, "password_file": "/p"},
            KafkaError._AUTHENTICATION,
            "SASL authentication error: Authentication failed",
            "kafka.password_file: the broker refused",
        ),
        (
            {**SCRAM, "password_env": "P"},
            KafkaError._AUTHENTICATION,
            "Unsupported SASL mechanism: broker's supported mechanisms: PLAIN",
            "kafka.sasl_mechanism: the broker does not offer SCRAM-SHA-512",
        ),
        (
            {"security_protocol": "SSL", "ssl_cafile": "/ca.pem"},
            KafkaError._SSL,
            "ssl://h:1/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
            "verify failed: broker certificate could not be verified",
            "kafka.ssl_cafile: the broker's certificate is not signed by a CA in /ca.pem",
        ),
        (
            {"security_protocol": "SSL"},
            KafkaError._SSL,
            "SSL handshake failed: certificate verify failed: Hostname mismatch",
            "kafka.ssl_check_hostname: the broker's certificate does not name the host of h:1",
        ),
        (
            {"security_protocol": "SSL", "ssl_certfile": "/c.pem", "ssl_keyfile": "/c.key"},
            KafkaError._TRANSPORT,
            "ssl://h:1/bootstrap: Receive failed: error:0A000416:SSL routines::ssl/tls alert "
            "certificate unknown: SSL alert number 46 (after 23ms in state APIVERSION_QUERY)",
            "kafka.ssl_certfile: the broker refused the client certificate /c.pem (TLS alert: "
            "certificate unknown)",
        ),
        (
            {"security_protocol": "SSL"},
            KafkaError._TRANSPORT,
            "Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL "
            "alert number 42",
            "kafka.ssl_certfile: the broker asks for a client certificate (mutual TLS)",
        ),
        (
            {"security_protocol": "SSL"},
            KafkaError._SSL,
            "SSL handshake failed: error:0A00010B:SSL routines::wrong version number",
            "kafka.security_protocol: the TLS handshake with h:1 failed",
        ),
    ],
)
def test_a_refusal_names_the_setting(kafka, code, text, message):
    refusal = refused_setting(sec_of(**kafka), KafkaError(code, text), "h:1")
    assert refusal is not None and refusal.startswith(message), refusal


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9 failed: Connection refused"),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
        (KafkaError._TRANSPORT, "Disconnected while requesting ApiVersion"),
    ],
)
def test_no_answer_is_not_a_refusal(code, text):
    assert (
        refused_setting(sec_of(**{**SCRAM, "password_env": "P"}), KafkaError(code, text), "h")
        is None
    )


def test_no_broker_is_named_after_the_timeout():
    from dpstream.operators.errors import DpStreamError

    with pytest.raises(DpStreamError) as info:
        check_connection(KafkaSecurityConfig(), "127.0.0.1:9", timeout=1.0)
    assert str(info.value).startswith("kafka: no broker at 127.0.0.1:9 answered within 1 s")
    assert "kafka.security_protocol (PLAINTEXT)" in str(info.value)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from dpstream.deploy.certificates import make_certificates

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command line")
    return make_certificates(tmp_path_factory.mktemp("made"), ["dp"], days=3)


def test_certificate_dates_are_read_from_der(made):
    from datetime import UTC, datetime, timedelta

    der = ssl.PEM_cert_to_DER_cert(made.expired[0].read_text())
    assert certificate_validity(der) == (
        datetime(2020, 1, 1, tzinfo=UTC),
        datetime(2020, 1, 2, tzinfo=UTC),
    )
    begin, end = certificate_validity(ssl.PEM_cert_to_DER_cert(made.clients["dp"][0].read_text()))
    assert end - begin == timedelta(days=3)
    with pytest.raises(ValueError):
        certificate_validity(der[:40])


def test_an_expired_or_future_client_certificate_is_refused_before_connecting(made):
    from datetime import UTC, datetime

    def mtls(cert, key) -> KafkaSecurityConfig:
        return sec_of(security_protocol="SSL", ssl_certfile=cert, ssl_keyfile=key)

    with pytest.raises(ConfigError) as info:
        check_certificate_dates(mtls(*made.expired))
    assert str(info.value) == (
        f"kafka.ssl_certfile: the certificate {made.expired[0]} expired on 2020-01-02 00:00 UTC"
    )
    valid = mtls(*made.clients["dp"])
    check_certificate_dates(valid)
    with pytest.raises(ConfigError, match="is not valid before"):
        check_certificate_dates(valid, now=datetime(2001, 1, 1, tzinfo=UTC))
    with pytest.raises(ConfigError, match="kafka.ssl_certfile: no PEM certificate"):
        check_certificate_dates(mtls(made.clients["dp"][1], made.clients["dp"][1]))
