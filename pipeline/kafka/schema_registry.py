"""The ``input.schema_registry`` and ``outputs.schema_registry`` sections mapped onto
confluent-kafka's Schema Registry client (``section``: which one, for the messages).

One source of truth (``SchemaRegistryConfig``), one spelling: the client's configuration
properties (``client_config``), used by the ingest's decoders and by ``dpstream produce
--format``. The basic-auth password is read from ``password_env`` or ``password_file`` only
when a client is built, exists only in the dict ``client_config`` returns, and is never
part of a log or error message (``describe`` says where it comes from, not what it is).

Timeouts and retries are set here, not left to the client: its default waits without a
limit for an answer, and an ingest that waits without a limit for a registry stops
reading without saying why. A request gets ``TIMEOUT_SECONDS``; a failed one is tried
``MAX_RETRIES`` more times with backoff; after that the ingest pauses and tries the batch
again (``ingest/consumer.py``).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from dpstream.config.base import ConfigError
from dpstream.config.kafka import SchemaRegistryConfig

from .security import read_secret, readable

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

EXTRA = "schema-registry"

SECTION = "input.schema_registry"
TIMEOUT_SECONDS = 10.0
MAX_RETRIES = 2
RETRY_WAIT_MS = 500
RETRY_MAX_WAIT_MS = 5000


def client_config(reg: SchemaRegistryConfig, section: str = SECTION) -> dict[str, object]:
    """Configuration properties of a ``SchemaRegistryClient`` for the section.

    Raises:
        ConfigError: a password or file that cannot be read; the message names the field.
    """
    conf: dict[str, object] = {
        "url": reg.url,
        "timeout": TIMEOUT_SECONDS,
        "max.retries": MAX_RETRIES,
        "retries.wait.ms": RETRY_WAIT_MS,
        "retries.max.wait.ms": RETRY_MAX_WAIT_MS,
    }
    if reg.username is not None:
        password = read_secret(section, reg.password_env, reg.password_file)
        conf["basic.auth.user.info"] = f"{reg.username}:{password}"
    if reg.ssl_cafile is not None:
        conf["ssl.ca.location"] = readable("ssl_cafile", reg.ssl_cafile, section)
    if reg.ssl_certfile is not None and reg.ssl_keyfile is not None:
        conf["ssl.certificate.location"] = readable("ssl_certfile", reg.ssl_certfile, section)
        conf["ssl.key.location"] = readable("ssl_keyfile", reg.ssl_keyfile, section)
    return conf


def make_client(reg: SchemaRegistryConfig, section: str = SECTION) -> SchemaRegistryClient:
    """A client of the registry (it caches schemas by id for its lifetime).

    Raises:
        ConfigError: as ``client_config``, or TLS files that do not load.
    """
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError:
        raise ConfigError(
            f"{section.partition('.')[0]}.format: a Schema Registry format needs dpstream's "
            f"{EXTRA} extra "
            f"(pip install 'dpstream[{EXTRA}]')"
        ) from None
    conf = client_config(reg, section)
    try:
        return SchemaRegistryClient(conf)
    except ssl.SSLError as exc:
        field = "ssl_certfile" if "ssl.certificate.location" in conf else "ssl_cafile"
        raise ConfigError(f"{section}.{field}: does not load ({exc.reason})") from None


def describe(reg: SchemaRegistryConfig) -> str:
    """One line for the start-up log; never includes the password."""
    parts = [reg.url]
    if reg.username is not None:
        source = f"${reg.password_env}" if reg.password_env else str(reg.password_file)
        parts.append(f"basic auth as {reg.username} (password from {source})")
    if reg.url.startswith("https://"):
        parts.append(f"CA {reg.ssl_cafile or 'system'}")
        if reg.ssl_certfile:
            parts.append(f"client cert {reg.ssl_certfile}")
    return ", ".join(parts)
