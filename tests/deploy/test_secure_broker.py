"""deploy/secure_broker.py without a broker: the settings of the secured node and the
client settings it hands out. (Running: tests/integration/test_secure.py.)"""

from __future__ import annotations

from pathlib import Path

from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.deploy.broker import LocalKafka
from dpstream.deploy.certificates import Certificates
from dpstream.deploy.secure_broker import USERS, SecureKafka, is_secure, secure_settings


def secured(tmp_path: Path) -> SecureKafka:
    """A SecureKafka over a data dir laid out as start() lays it out (no JVM)."""
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "ca.pem").write_text("CA")
    (tmp_path / "server.properties").write_text(
        "listeners=SASL_SSL://127.0.0.1:9101,SSL://127.0.0.1:9102,CONTROLLER://127.0.0.1:9103\n"
    )
    node = LocalKafka("127.0.0.1:9101", 0, tmp_path, tmp_path / "broker.log")
    return SecureKafka.found_in(node)


def test_no_plaintext_client_listener_and_acls_enforced(tmp_path):
    certs = Certificates.found_in(tmp_path, USERS)
    settings = secure_settings(certs)([9101, 9102, 9103], tmp_path / "data")
    assert settings["listeners"] == (
        "SASL_SSL://127.0.0.1:9101,SSL://127.0.0.1:9102,CONTROLLER://127.0.0.1:9103"
    )
    assert settings["listener.security.protocol.map"] == (
        "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT"  # PLAINTEXT: the controller only
    )
    assert settings["listener.name.ssl.ssl.client.auth"] == "required"
    assert settings["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert settings["ssl.keystore.type"] == settings["ssl.truststore.type"] == "PEM"
    assert settings["authorizer.class.name"].endswith("StandardAuthorizer")
    assert settings["allow.everyone.if.no.acl.found"] == "false"
    assert settings["super.users"] == "User:broker;User:ANONYMOUS;User:admin"
    assert settings["ssl.principal.mapping.rules"] == "RULE:^CN=([^,]+)$/$1/,DEFAULT"


def test_the_kafka_sections_are_valid_configs_without_a_password(tmp_path):
    broker = secured(tmp_path)
    assert is_secure(tmp_path)
    assert (broker.sasl_bootstrap, broker.ssl_bootstrap) == ("127.0.0.1:9101", "127.0.0.1:9102")
    sasl = KafkaSecurityConfig(**broker.kafka_section("reader"))
    assert (sasl.security_protocol, sasl.sasl_mechanism, sasl.username) == (
        "SASL_SSL", "SCRAM-SHA-512", "reader"
    )  # fmt: skip
    assert sasl.password_file == tmp_path / "secrets" / "reader.password"
    assert sasl.ssl_cafile == tmp_path / "tls" / "ca.pem"
    by_env = KafkaSecurityConfig(**broker.kafka_section("dpstream", password_env="PW"))
    assert by_env.password_env == "PW" and by_env.password_file is None
    mtls = KafkaSecurityConfig(**broker.kafka_section("dpstream", "SSL"))
    assert mtls.ssl_certfile == tmp_path / "tls" / "dpstream.pem"
    assert mtls.ssl_keyfile == tmp_path / "tls" / "dpstream.key"
    assert mtls.sasl_mechanism is None


def test_the_admin_properties_hold_the_password_privately(tmp_path):
    broker = secured(tmp_path)
    path = broker.admin_properties()
    password = broker.admin_client_config()["sasl.password"]
    assert len(password) == 32 and password in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert broker.password_file("admin").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert "ssl.truststore.type=PEM" in path.read_text()
