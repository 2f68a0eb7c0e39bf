"""A secured single-node broker from Kafka's jars: SASL_SSL with SCRAM users, mutual TLS,
and ACLs enforced, as production clusters are set up.

* ``SASL_SSL`` listener: TLS (the broker's certificate, signed by a local CA, names
  ``localhost`` and ``127.0.0.1``), then SCRAM-SHA-512. The users are created when the
  storage is formatted (``kafka-storage format --add-scram``), each with a random password
  kept in a file of mode 0600.
* ``SSL`` listener with ``ssl.client.auth=required``: mutual TLS; a client certificate's
  ``CN`` is its principal (``ssl.principal.mapping.rules``), so the certificate of
  ``dpstream`` and the SCRAM user ``dpstream`` are the same principal, ``User:dpstream``,
  and one set of ACLs serves both listeners. It is also the inter-broker listener.
* The ``CONTROLLER`` listener stays PLAINTEXT on 127.0.0.1: its principal, ``ANONYMOUS``,
  is a super user, as the broker (``User:broker``, its certificate) and ``User:admin``
  (SCRAM) are. So anyone on this machine who reaches the controller port is a super user:
  a local test broker, not a production layout (docs/security.md).
* ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: the users other
  than ``admin`` may do nothing until ACLs grant it.
* No PLAINTEXT client listener: a plaintext client is refused.

Keys, certificates (``deploy/certificates.py``) and passwords live in the broker's data
dir (``tls/``, ``secrets/``) and go with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .broker import (
    BROKER_DEFAULTS,
    BrokerError,
    LocalKafka,
    NodeSpec,
    kafka_tool_command,
    listener_ports,
)
from .certificates import BROKER_NAME, Certificates, make_certificates

ADMIN = "admin"
"""The SCRAM super user: creates topics and ACLs for tests and `dpstream acls --apply`."""

USERS = ("dpstream", "reader", "producer")
"""SCRAM users, each with a client certificate of its name, without any right at start:
the worker's principal, a reader of the releases, a producer of the source topics."""

MECHANISM = "SCRAM-SHA-512"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"
"""Kafka's ``kafka-acls.sh`` (in ``kafka-tools``)."""

Listener = Literal["SASL_SSL", "SSL"]
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_SCRAM_JAAS = f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config"


def secure_settings(certs: Certificates) -> Callable[[Sequence[int], Path], dict[str, str]]:
    """The secured node's settings (ports: SASL_SSL, SSL, controller)."""

    def settings(ports: Sequence[int], log_dir: Path) -> dict[str, str]:
        sasl_port, ssl_port, controller_port = ports
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{ssl_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{ssl_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            _SCRAM_JAAS: f"{_SCRAM_LOGIN} required;",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{BROKER_NAME};User:ANONYMOUS;User:{ADMIN}",
            "allow.everyone.if.no.acl.found": "false",
            "log.dirs": str(log_dir),
            **BROKER_DEFAULTS,
        }

    return settings


@dataclass
class SecureKafka:
    """A running secured broker (see the module docstring).

    Attributes:
        node: The broker's JVM; its ``bootstrap`` is the SASL_SSL listener.
        certificates: The CA, the clients' certificates and the bad ones.
        sasl_bootstrap: ``127.0.0.1:<port>`` of the SASL_SSL (SCRAM-SHA-512) listener.
        ssl_bootstrap: ``127.0.0.1:<port>`` of the mutual-TLS listener.
    """

    node: LocalKafka
    certificates: Certificates
    sasl_bootstrap: str
    ssl_bootstrap: str

    @classmethod
    def start(cls, *, data_dir: Path | None = None, timeout: float = 90.0) -> SecureKafka:
        """Make certificates and passwords, format the storage with the SCRAM users, start
        the broker and wait until the admin user gets a metadata answer over SASL_SSL.

        Args:
            data_dir: Where to keep everything. Default: a new temp dir that :meth:`stop`
                removes. A given dir is kept, and reused (certificates, passwords, data) if
                it holds an earlier secured broker.
            timeout: Seconds to wait for the broker.

        Raises:
            BrokerError: No openssl, java or Maven; the broker did not start.
        """
        import tempfile

        owns = data_dir is None
        made = tempfile.mkdtemp(prefix="dpstream-kafka-secure-") if data_dir is None else data_dir
        base = Path(made).resolve()
        try:
            certs = _certificates(base)
            scram = [
                arg
                for user in (ADMIN, *USERS)
                for arg in (
                    "--add-scram",
                    f"{MECHANISM}=[name={user},password={_password(base, user)}]",
                )
            ]
            spec = NodeSpec(
                settings=secure_settings(certs),
                ports=3,
                format_args=tuple(scram),
                client=_admin_client(base, certs),
            )
            node = LocalKafka.start(data_dir=base, timeout=timeout, spec=spec, owns_data_dir=owns)
        except BaseException:
            if owns:
                shutil.rmtree(base, ignore_errors=True)
            raise
        return cls.found_in(node)

    @classmethod
    def found_in(cls, node: LocalKafka) -> SecureKafka:
        """The secured broker whose JVM is ``node`` (e.g. one `dpstream broker start
        --secure` left running), from what its data dir holds."""
        ports = listener_ports(node.data_dir / "server.properties")
        if not is_secure(node.data_dir) or len(ports) != 3:
            raise BrokerError(f"{node.data_dir} holds no secured broker")
        return cls(
            node=node,
            certificates=Certificates.found_in(node.data_dir / "tls", USERS),
            sasl_bootstrap=f"127.0.0.1:{ports[0]}",
            ssl_bootstrap=f"127.0.0.1:{ports[1]}",
        )

    def bootstrap(self, listener: Listener) -> str:
        return self.sasl_bootstrap if listener == "SASL_SSL" else self.ssl_bootstrap

    def password_file(self, user: str) -> Path:
        """The file holding ``user``'s SCRAM password (mode 0600)."""
        return _secrets(self.node.data_dir) / f"{user}.password"

    def kafka_section(
        self, user: str = USERS[0], listener: Listener = "SASL_SSL", password_env: str | None = None
    ) -> dict[str, str]:
        """A pipeline config's ``kafka:`` section for ``user`` on ``listener``.

        Over SASL_SSL the password comes from :meth:`password_file`, or from the variable
        ``password_env`` if given (set it to the file's content); over SSL the user's client
        certificate and key are presented.
        """
        section = {"security_protocol": listener, "ssl_cafile": str(self.certificates.ca)}
        if listener == "SASL_SSL":
            section |= {"sasl_mechanism": MECHANISM, "username": user}
            if password_env:
                section["password_env"] = password_env
            else:
                section["password_file"] = str(self.password_file(user))
        else:
            cert, key = self.certificates.clients[user]
            section |= {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
        return section

    def admin_client_config(self) -> dict[str, str]:
        """librdkafka settings of the admin user over SASL_SSL (``bootstrap.servers`` included)."""
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            **_admin_client(self.node.data_dir, self.certificates),
        }

    def admin_properties(self) -> Path:
        """A client properties file of the admin user for Kafka's own tools
        (``--command-config``), mode 0600: it holds the password."""
        path = _secrets(self.node.data_dir) / "admin.properties"
        if not path.exists():
            password = _password(self.node.data_dir, ADMIN)
            path.touch(mode=0o600)
            path.write_text(
                "security.protocol=SASL_SSL\n"
                f"sasl.mechanism={MECHANISM}\n"
                f'sasl.jaas.config={_SCRAM_LOGIN} required username="{ADMIN}" '
                f'password="{password}";\n'
                "ssl.truststore.type=PEM\n"
                f"ssl.truststore.location={self.certificates.ca}\n"
            )
        return path

    def kafka_acls(self, args: Sequence[str], timeout: float = 60.0) -> str:
        """Run Kafka's ``kafka-acls`` with ``args`` as the admin user; its output.

        ``--bootstrap-server`` and ``--command-config`` are added here.

        Raises:
            BrokerError: The tool failed (its output included).
        """
        cmd = kafka_tool_command(
            ACL_COMMAND,
            "--bootstrap-server",
            self.sasl_bootstrap,
            "--command-config",
            str(self.admin_properties()),
            *args,
        )
        # Fixed argument list, no shell: the tool's own arguments, our paths.
        done = subprocess.run(  # noqa: S603
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise BrokerError(f"kafka-acls {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def stop(self) -> None:
        """Stop the broker; its data dir (certificates and passwords too) goes if it owns it."""
        self.node.stop()


def is_secure(data_dir: Path) -> bool:
    """Whether ``data_dir`` is a secured broker's (:meth:`SecureKafka.start` made it)."""
    return (Path(data_dir) / "tls" / "ca.pem").is_file()


def _secrets(base: Path) -> Path:
    return base / "secrets"


def _certificates(base: Path) -> Certificates:
    if is_secure(base):
        return Certificates.found_in(base / "tls", USERS)
    return make_certificates(base / "tls", USERS)


def _password(base: Path, user: str) -> str:
    """``user``'s password, made once (random, 128 bits) and kept in a 0600 file."""
    path = _secrets(base) / f"{user}.password"
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(16) + "\n")
    return path.read_text().strip()


def _admin_client(base: Path, certs: Certificates) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs.ca),
        "sasl.mechanisms": MECHANISM,
        "sasl.username": ADMIN,
        "sasl.password": _password(base, ADMIN),
    }
