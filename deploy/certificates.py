"""Certificates for a secured local broker, made with the ``openssl`` command line.

One certificate authority signs the broker's certificate (valid for ``localhost`` and
``127.0.0.1``, usable as a server and, for the broker's own inter-broker connections, as a
client) and one client certificate per principal for mutual TLS. Beside them, what the
negative tests need: a client certificate that expired in 2020 and a second CA that signed
nothing the broker presents. Keys are EC P-256 (fast to make), unencrypted PKCS#8 PEM,
mode 0600: what Kafka's ``ssl.keystore.type=PEM``, Python's ``ssl`` and librdkafka all read.

Each certificate's subject is only ``CN=<name>``, so a broker with
``ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT`` (deploy/secure_broker.py)
sees the principal ``User:<name>``, the same name a SCRAM user of that name has.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .broker import BrokerError, require_tool

BROKER_NAME = "broker"
"""The CN of the broker's certificate: its principal on the mutual-TLS listener."""

_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_RESERVED = ("ca", BROKER_NAME, "expired", "untrusted-ca", "untrusted-client")
"""Names of the files beside the clients' (``<name>.pem``, ``<name>.key``)."""

EXPIRED = ("20200101000000Z", "20200102000000Z")
"""Validity of the expired client certificate: a day in 2020."""

# `openssl ca` rather than `openssl x509 -req`: it alone sets an arbitrary validity
# (-startdate/-enddate, for the expired certificate) on OpenSSL 3.0.
_CA_CONFIG = """\
[ca]
default_ca = local
[local]
database = index.txt
new_certs_dir = issued
serial = serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
[server]
basicConstraints = CA:FALSE
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth,clientAuth
[client]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
"""


@dataclass(frozen=True)
class Certificates:
    """The files :func:`make_certificates` wrote.

    Attributes:
        directory: Where they are.
        ca: The CA certificate the broker and the clients trust (``ssl_cafile``).
        broker_keystore: The broker's key and certificate in one PEM file
            (``ssl.keystore.location`` with ``ssl.keystore.type=PEM``).
        clients: Principal name -> (certificate, key) for mutual TLS.
        expired: (certificate, key) of a client certificate, signed by ``ca`` for the first
            client's name, that expired on 2 January 2020.
        untrusted_ca: A CA certificate that signed nothing the broker presents.
        untrusted_client: (certificate, key) signed by ``untrusted_ca`` for the first client's
            name: a certificate the broker does not trust.
    """

    directory: Path
    ca: Path
    broker_keystore: Path
    clients: Mapping[str, tuple[Path, Path]]
    expired: tuple[Path, Path]
    untrusted_ca: Path
    untrusted_client: tuple[Path, Path]

    @classmethod
    def found_in(cls, directory: Path, clients: Sequence[str]) -> Certificates:
        """The certificates :func:`make_certificates` wrote into ``directory`` earlier."""
        d = Path(directory)
        return cls(
            directory=d,
            ca=d / "ca.pem",
            broker_keystore=d / "broker-keystore.pem",
            clients={name: (d / f"{name}.pem", d / f"{name}.key") for name in clients},
            expired=(d / "expired.pem", d / "expired.key"),
            untrusted_ca=d / "untrusted-ca.pem",
            untrusted_client=(d / "untrusted-client.pem", d / "untrusted-client.key"),
        )


def make_certificates(directory: Path, clients: Sequence[str], days: int = 30) -> Certificates:
    """Make a CA, the broker's certificate and one client certificate per name, plus an
    expired client certificate and an untrusted CA with a client certificate of its own.

    Args:
        directory: Where to write them (created; keys get mode 0600).
        clients: The client principals' names (at least one), e.g. ``("dpstream",)``.
        days: How long the valid certificates are valid from now.

    Returns:
        Their paths.

    Raises:
        BrokerError: No ``openssl`` on PATH, or openssl failed (its message included).
    """
    if not clients or any(not _NAME.fullmatch(n) or n in _RESERVED for n in clients):
        raise ValueError(f"clients must be one or more plain names, not {_RESERVED}: {clients!r}")
    openssl = require_tool("openssl", "Certificates for the secured broker are made with it.")
    made = Certificates.found_in(directory, clients)
    d = made.directory
    (d / "issued").mkdir(parents=True, exist_ok=True)
    (d / "index.txt").write_text("")
    (d / "serial").write_text("01\n")
    (d / "ca.cnf").write_text(_CA_CONFIG)

    def run(*args: str) -> None:
        # Fixed argument list, no shell: openssl from PATH, our own paths and names.
        done = subprocess.run(  # noqa: S603
            [openssl, *args], cwd=d, stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
        if done.returncode != 0:
            raise BrokerError(
                f"openssl {args[0]} failed: {done.stderr.decode(errors='replace').strip()}"
            )

    def key(name: str) -> str:
        run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{name}.key")  # fmt: skip
        os.chmod(d / f"{name}.key", 0o600)
        return f"{name}.key"

    def self_signed(name: str, subject: str) -> None:
        run("req", "-x509", "-new", "-key", key(name), "-out", f"{name}.pem",
            "-days", str(days), "-subj", f"/CN={subject}")  # fmt: skip

    def signed(name: str, subject: str, ca: str, extensions: str, *validity: str) -> None:
        run("req", "-new", "-key", key(name), "-out", f"{name}.csr", "-subj", f"/CN={subject}")
        run("ca", "-batch", "-notext", "-config", "ca.cnf", "-cert", f"{ca}.pem",
            "-keyfile", f"{ca}.key", "-in", f"{name}.csr", "-out", f"{name}.pem",
            "-extensions", extensions, *(validity or ("-days", str(days))))  # fmt: skip

    first = clients[0]
    self_signed("ca", "dpstream local CA")
    signed("broker", BROKER_NAME, "ca", "server")
    for name in clients:
        signed(name, name, "ca", "client")
    signed("expired", first, "ca", "client", "-startdate", EXPIRED[0], "-enddate", EXPIRED[1])
    self_signed("untrusted-ca", "an untrusted CA")
    signed("untrusted-client", first, "untrusted-ca", "client")
    keystore = (d / "broker.key").read_bytes() + (d / "broker.pem").read_bytes()
    made.broker_keystore.write_bytes(keystore)
    os.chmod(made.broker_keystore, 0o600)
    return made
