"""deploy/certificates.py: what openssl made is what the secured broker and the negative
tests need (a broker certificate for localhost, clients named by CN, an expired one, a
CA nobody trusts). Needs the openssl command line."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from datetime import UTC, datetime

import pytest

from dpstream.deploy.certificates import Certificates, make_certificates
from dpstream.pipeline.kafka.security import certificate_validity

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"), ["dpstream", "reader"])


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def verifies(ca, cert) -> bool:
    done = subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.returncode == 0


def test_the_ca_signs_the_broker_and_the_clients_named_by_cn(certs):
    clients = {name: cert for name, (cert, _) in certs.clients.items()}
    for name, cert in clients.items():
        assert verifies(certs.ca, cert)
        assert (
            openssl("x509", "-in", str(cert), "-noout", "-subject").strip()
            == f"subject=CN = {name}"
        )
        assert "TLS Web Client Authentication" in openssl(
            "x509", "-in", str(cert), "-noout", "-ext", "extendedKeyUsage"
        )
    broker = certs.directory / "broker.pem"
    assert verifies(certs.ca, broker)
    assert "DNS:localhost, IP Address:127.0.0.1" in openssl(
        "x509", "-in", str(broker), "-noout", "-ext", "subjectAltName"
    )
    # The keystore holds the key, then the certificate (Kafka's PEM key store).
    text = certs.broker_keystore.read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----") and "BEGIN CERTIFICATE" in text


def test_the_bad_ones_are_bad(certs):
    expired, _ = certs.expired
    assert not verifies(certs.ca, expired)  # signed by the CA, but expired
    why = subprocess.run(
        ["openssl", "verify", "-CAfile", str(certs.ca), str(expired)],
        capture_output=True, text=True, check=False,
    ).stderr  # fmt: skip
    assert "certificate has expired" in why
    _, not_after = certificate_validity(ssl.PEM_cert_to_DER_cert(expired.read_text()))
    assert not_after == datetime(2020, 1, 2, tzinfo=UTC)
    foreign, _ = certs.untrusted_client
    assert not verifies(certs.ca, foreign) and verifies(certs.untrusted_ca, foreign)
    assert not verifies(certs.untrusted_ca, certs.directory / "broker.pem")


def test_keys_are_private_and_found_again(certs):
    for _, key in (*certs.clients.values(), certs.expired, certs.untrusted_client):
        assert key.stat().st_mode & 0o777 == 0o600
    assert certs.broker_keystore.stat().st_mode & 0o777 == 0o600
    assert Certificates.found_in(certs.directory, ["dpstream", "reader"]) == certs


@pytest.mark.parametrize("names", [[], ["ca"], ["broker"], ["Bad Name"]])
def test_client_names_that_would_clash_are_refused(tmp_path, names):
    with pytest.raises(ValueError, match="clients must be"):
        make_certificates(tmp_path, names)
