"""The ``kafka:`` config section mapped onto each Kafka client dpstream uses.

One source of truth (``KafkaSecurityConfig``), three spellings of it:

* Faust (the worker): ``broker_credentials``, a ``faust.SASLCredentials`` or
  ``faust.SSLCredentials`` carrying an ``ssl.SSLContext``; Faust hands it to every
  aiokafka consumer, producer and admin client it creates;
* aiokafka directly (benchmarks, raw loops): the constructor keyword arguments;
* confluent-kafka / librdkafka (the producer, the export and tail consumers, the admin
  calls): configuration properties.

Secrets: the SASL password is read from ``password_env`` or ``password_file`` only when a
client is built, is never part of a log message or an error message, and the helpers
below that return it (in a credentials object or a config dict) are the only places it
exists. ``redacted`` turns a confluent config into something safe to log.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpstream.config.schema import ConfigError, KafkaSecurityConfig

SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "sasl_plain_password"})


def uses_sasl(sec: KafkaSecurityConfig) -> bool:
    return sec.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def uses_tls(sec: KafkaSecurityConfig) -> bool:
    return sec.security_protocol in ("SSL", "SASL_SSL")


def read_password(sec: KafkaSecurityConfig) -> str | None:
    """The SASL password from its environment variable or file (None without SASL).

    Raises:
        ConfigError: the variable is unset or empty, or the file cannot be read or is
            empty. The message names the field, never the value.
    """
    if not uses_sasl(sec):
        return None
    return read_secret("kafka", sec.password_env, sec.password_file)


def read_secret(section: str, env: str | None, file: Path | None) -> str:
    """A password from the environment variable ``env``, else from ``file`` (one of the
    two is set); ``section`` names the config section in errors (``kafka``).

    Raises:
        ConfigError: the variable is unset or empty, or the file cannot be read or is
            empty. The message names the field, never the value.
    """
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise ConfigError(f"{section}.password_env: environment variable {env} is not set")
        return value
    assert file is not None  # the schema requires one of the two
    try:
        # One trailing newline (as `echo secret > file` writes) is not part of the password.
        value = file.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{section}.password_file: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{section}.password_file: not UTF-8 text") from None
    if not value:
        raise ConfigError(f"{section}.password_file: the file is empty")
    return value


def readable(field: str, path: Path, section: str = "kafka") -> str:
    """``path`` as a string if it is a file; else ConfigError naming ``section.field``."""
    if not path.is_file():
        raise ConfigError(f"{section}.{field}: no such file: {path}")
    return str(path)


def ssl_context(sec: KafkaSecurityConfig) -> ssl.SSLContext | None:
    """The TLS context for aiokafka/Faust (None unless the protocol is SSL or SASL_SSL).

    Verifies the broker's certificate against ``ssl_cafile`` (else the system CAs) and,
    unless ``ssl_check_hostname`` is false, its host name; presents the client
    certificate when ``ssl_certfile``/``ssl_keyfile`` are set.
    """
    if not uses_tls(sec):
        return None
    cafile = readable("ssl_cafile", sec.ssl_cafile) if sec.ssl_cafile else None
    try:
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except ssl.SSLError as exc:
        raise ConfigError(f"kafka.ssl_cafile: not a usable CA file ({exc.reason})") from None
    if sec.ssl_certfile is not None and sec.ssl_keyfile is not None:
        certfile = readable("ssl_certfile", sec.ssl_certfile)
        keyfile = readable("ssl_keyfile", sec.ssl_keyfile)
        try:
            context.load_cert_chain(certfile, keyfile)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"kafka.ssl_certfile: certificate and ssl_keyfile do not load ({exc.reason})"
            ) from None
    # The order matters: CERT_NONE is never set; check_hostname only loosens the name check.
    context.check_hostname = sec.ssl_check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def faust_credentials(sec: KafkaSecurityConfig) -> Any:
    """Faust's ``broker_credentials`` for the config (None for PLAINTEXT)."""
    import faust

    proto = sec.security_protocol
    if proto == "PLAINTEXT":
        return None
    context = ssl_context(sec)
    if proto == "SSL":
        return faust.SSLCredentials(context)
    # SASLCredentials switches its protocol to SASL_SSL when it gets an SSL context.
    return faust.SASLCredentials(
        username=sec.username,
        password=read_password(sec),
        ssl_context=context,
        mechanism=sec.sasl_mechanism,
    )


def aiokafka_kwargs(sec: KafkaSecurityConfig) -> dict[str, Any]:
    """Keyword arguments for an aiokafka client (AIOKafkaConsumer/Producer/AdminClient)."""
    kwargs: dict[str, Any] = {"security_protocol": sec.security_protocol}
    if uses_tls(sec):
        kwargs["ssl_context"] = ssl_context(sec)
    if uses_sasl(sec):
        kwargs["sasl_mechanism"] = sec.sasl_mechanism
        # aiokafka takes PLAIN and SCRAM credentials in the same two arguments.
        kwargs["sasl_plain_username"] = sec.username
        kwargs["sasl_plain_password"] = read_password(sec)
    return kwargs


def confluent_config(sec: KafkaSecurityConfig) -> dict[str, str]:
    """librdkafka properties for a confluent-kafka Producer, Consumer or AdminClient."""
    conf: dict[str, str] = {"security.protocol": sec.security_protocol}
    if uses_tls(sec):
        # Load the files once here too, so a bad one is a ConfigError naming its field
        # instead of a librdkafka error when the client is built.
        ssl_context(sec)
        # "probe": librdkafka looks for the system's CA bundle, as Python's default context does.
        conf["ssl.ca.location"] = (
            readable("ssl_cafile", sec.ssl_cafile) if sec.ssl_cafile else "probe"
        )
        if sec.ssl_certfile is not None and sec.ssl_keyfile is not None:
            conf["ssl.certificate.location"] = readable("ssl_certfile", sec.ssl_certfile)
            conf["ssl.key.location"] = readable("ssl_keyfile", sec.ssl_keyfile)
        conf["enable.ssl.certificate.verification"] = "true"
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if sec.ssl_check_hostname else "none"
        )
    if uses_sasl(sec):
        conf["sasl.mechanisms"] = str(sec.sasl_mechanism)
        conf["sasl.username"] = str(sec.username)
        conf["sasl.password"] = str(read_password(sec))
    return conf


def redacted(conf: Mapping[str, object]) -> dict[str, object]:
    """A client config that is safe to log: secret values replaced by ``<redacted>``."""
    return {k: "<redacted>" if k in SECRET_KEYS else v for k, v in conf.items()}


def describe(sec: KafkaSecurityConfig) -> str:
    """One line for the worker's start-up log; never includes the password."""
    parts: list[str] = [sec.security_protocol]
    if uses_sasl(sec):
        source = f"${sec.password_env}" if sec.password_env else str(sec.password_file)
        parts.append(f"{sec.sasl_mechanism} as {sec.username} (password from {source})")
    if uses_tls(sec):
        parts.append(f"CA {sec.ssl_cafile or 'system'}")
        if sec.ssl_certfile:
            parts.append(f"client cert {sec.ssl_certfile}")
        if not sec.ssl_check_hostname:
            parts.append("host name NOT checked")
    return ", ".join(parts)
