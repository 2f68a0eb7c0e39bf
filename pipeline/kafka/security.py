"""The ``kafka:`` config section mapped onto each Kafka client dpstream uses.

One source of truth (``KafkaSecurityConfig``), three spellings of it:

* Faust (the worker): ``broker_credentials``, a ``faust.SASLCredentials`` or
  ``faust.SSLCredentials`` carrying an ``ssl.SSLContext``; Faust hands it to every
  aiokafka consumer, producer and admin client it creates;
* aiokafka directly (benchmarks, raw loops): the constructor keyword arguments;
* confluent-kafka / librdkafka (the producer, the export and tail consumers, the admin
  calls): configuration properties.

OAUTHBEARER (``oauth``): librdkafka fetches its tokens itself (``sasl.oauthbearer.method
= oidc``); aiokafka and Faust get an :class:`OidcTokenProvider` that does the same client
credentials request.

Secrets: the SASL password and the OAuth client secret are read from their variable or
file only when a client is built, are never part of a log message or an error message, and
the helpers below that return them (in a credentials object, a token provider or a config
dict) are the only places they exist. ``redacted`` turns a confluent config into something
safe to log.

:func:`check_connection` connects once with these settings before a program uses them,
and turns the broker's refusal (a password, a CA, a client certificate) into one
``ConfigError`` naming the setting.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from dpstream.config.base import ConfigError
from dpstream.config.kafka import KafkaSecurityConfig, OAuthConfig
from dpstream.operators.errors import DpStreamError

SECRET_KEYS = frozenset(
    {"sasl.password", "ssl.key.password", "sasl_plain_password", "sasl.oauthbearer.client.secret"}
)


def uses_oauth(sec: KafkaSecurityConfig) -> bool:
    return sec.oauth is not None


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
    if not uses_sasl(sec) or uses_oauth(sec):
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


def read_client_secret(oauth: OAuthConfig) -> str:
    """The OAuth client secret from its environment variable or file.

    Raises:
        ConfigError: unset, empty or unreadable; the message names the field, never the value.
    """
    if oauth.client_secret_env is not None:
        value = os.environ.get(oauth.client_secret_env)
        if not value:
            raise ConfigError(
                f"kafka.oauth.client_secret_env: environment variable "
                f"{oauth.client_secret_env} is not set"
            )
        return value
    assert oauth.client_secret_file is not None  # the schema requires one of the two
    try:
        value = oauth.client_secret_file.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        raise ConfigError("kafka.oauth.client_secret_file: cannot read it as text") from None
    if not value:
        raise ConfigError("kafka.oauth.client_secret_file: the file is empty")
    return value


class OidcTokenProvider(AbstractTokenProvider):
    """OAUTHBEARER tokens for aiokafka (and Faust): the OAuth 2.0 client credentials grant
    (RFC 6749 section 4.4) at ``oauth.token_endpoint_url``, with the client id and secret in
    HTTP Basic authentication and ``oauth.scope`` if set, as librdkafka's
    ``sasl.oauthbearer.method=oidc`` does. A token is reused until 80% of its lifetime has
    passed (librdkafka's refresh point).
    """

    def __init__(self, oauth: OAuthConfig, secret: str, timeout: float = 30.0) -> None:
        self._oauth = oauth
        self._secret = secret
        self._timeout = timeout
        self._token: str | None = None
        self._refresh_at = 0.0

    def __repr__(self) -> str:
        oauth = self._oauth
        return f"<OidcTokenProvider: client {oauth.client_id} at {oauth.token_endpoint_url}>"

    async def token(self) -> str:
        if self._token is None or time.monotonic() >= self._refresh_at:
            loop = asyncio.get_running_loop()
            token, lifetime = await loop.run_in_executor(None, self.fetch)
            self._token, self._refresh_at = token, time.monotonic() + 0.8 * lifetime
        return self._token

    def extensions(self) -> dict[str, str]:
        return dict(self._oauth.extensions)

    def fetch(self) -> tuple[str, float]:
        """One token request: (the access token, its lifetime in seconds).

        Raises:
            ConfigError: The endpoint refused or did not answer (naming ``kafka.oauth``).
        """
        form = {"grant_type": "client_credentials"}
        if self._oauth.scope:
            form["scope"] = self._oauth.scope
        quote = urllib.parse.quote
        basic = f"{quote(self._oauth.client_id, safe='')}:{quote(self._secret, safe='')}"
        request = urllib.request.Request(  # noqa: S310 - the schema allows https (and loopback http) only
            self._oauth.token_endpoint_url,
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": "Basic " + base64.b64encode(basic.encode()).decode(),
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310
                answer = json.loads(response.read())
            return str(answer["access_token"]), float(answer.get("expires_in", 300))
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reason = type(exc).__name__
        raise ConfigError(
            f"kafka.oauth: no token from {self._oauth.token_endpoint_url} for client "
            f"{self._oauth.client_id} ({reason})"
        )


def token_provider(sec: KafkaSecurityConfig) -> OidcTokenProvider | None:
    """The aiokafka/Faust token provider of an OAUTHBEARER config (None otherwise)."""
    if sec.oauth is None:
        return None
    return OidcTokenProvider(sec.oauth, read_client_secret(sec.oauth))


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
    provider = token_provider(sec)
    if provider is not None:
        # Like SASLCredentials, it switches to SASL_SSL when it gets an SSL context.
        return faust.OAuthCredentials(oauth_cb=provider, ssl_context=context)
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
    if uses_oauth(sec):
        kwargs["sasl_mechanism"] = sec.sasl_mechanism
        kwargs["sasl_oauth_token_provider"] = token_provider(sec)
    elif uses_sasl(sec):
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
    if sec.oauth is not None:
        conf.update(_oauth_properties(sec.oauth))
    elif uses_sasl(sec):
        conf["sasl.mechanisms"] = str(sec.sasl_mechanism)
        conf["sasl.username"] = str(sec.username)
        conf["sasl.password"] = str(read_password(sec))
    return conf


def _oauth_properties(oauth: OAuthConfig) -> dict[str, str]:
    """librdkafka's own OIDC client (``sasl.oauthbearer.method=oidc``)."""
    conf = {
        "sasl.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": oauth.token_endpoint_url,
        "sasl.oauthbearer.client.id": oauth.client_id,
        "sasl.oauthbearer.client.secret": read_client_secret(oauth),
    }
    if oauth.scope:
        conf["sasl.oauthbearer.scope"] = oauth.scope
    if oauth.extensions:
        conf["sasl.oauthbearer.extensions"] = ",".join(
            f"{k}={v}" for k, v in sorted(oauth.extensions.items())
        )
    return conf


def redacted(conf: Mapping[str, object]) -> dict[str, object]:
    """A client config that is safe to log: secret values replaced by ``<redacted>``."""
    return {k: "<redacted>" if k in SECRET_KEYS else v for k, v in conf.items()}


def describe(sec: KafkaSecurityConfig) -> str:
    """One line for the worker's start-up log; never includes the password."""
    parts: list[str] = [sec.security_protocol]
    if sec.oauth is not None:
        secret = sec.oauth.client_secret_env or sec.oauth.client_secret_file
        parts.append(
            f"OAUTHBEARER as client {sec.oauth.client_id} of {sec.oauth.token_endpoint_url} "
            f"(secret from {'$' if sec.oauth.client_secret_env else ''}{secret})"
        )
    elif uses_sasl(sec):
        source = f"${sec.password_env}" if sec.password_env else str(sec.password_file)
        parts.append(f"{sec.sasl_mechanism} as {sec.username} (password from {source})")
    if uses_tls(sec):
        parts.append(f"CA {sec.ssl_cafile or 'system'}")
        if sec.ssl_certfile:
            parts.append(f"client cert {sec.ssl_certfile}")
        if not sec.ssl_check_hostname:
            parts.append("host name NOT checked")
    return ", ".join(parts)


# --------------------------------------------------------------------------- connection check

CONNECT_SECONDS = 30.0
"""How long :func:`check_connection` waits for a broker that does not answer at all."""

# A TLS alert the broker sent during the handshake, as librdkafka reports it.
_ALERT = re.compile(r"alert ([a-z ]+?)(?::|$| \()")
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def check_connection(
    sec: KafkaSecurityConfig, bootstrap: str, timeout: float = CONNECT_SECONDS
) -> int:
    """Connect once with the config's settings, before anything else uses them.

    A broker that refuses them (a wrong password, a CA that did not sign its certificate, a
    client certificate it does not accept) answers within a second: this returns at the
    first such refusal with one message naming the setting, where the clients would retry
    forever, logging each attempt. A broker that does not answer at all is waited for up
    to ``timeout`` seconds (it may be starting).

    Returns:
        How many brokers the cluster's metadata lists.

    Raises:
        ConfigError: The broker refused the settings; the message names the field.
        DpStreamError: No broker answered at ``bootstrap`` within ``timeout``.
    """
    check_certificate_dates(sec)
    errors: list[KafkaError] = []
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "log_level": 0,  # the refusals come to error_cb, once each, not as log lines
        "error_cb": errors.append,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        **confluent_config(sec),
    }
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            return len(admin.list_topics(timeout=0.5).brokers)
        except KafkaException as exc:
            last = exc.args[0].str() if exc.args else str(exc)
        admin.poll(0)  # serves error_cb
        for error in errors:
            refusal = refused_setting(sec, error, bootstrap)
            if refusal is not None:
                raise ConfigError(refusal)
        if errors:
            last = errors[-1].str()
        if time.monotonic() >= deadline:
            raise DpStreamError(
                f"kafka: no broker at {bootstrap} answered within {timeout:.0f} s ({last}); "
                f"check the bootstrap servers and kafka.security_protocol "
                f"({sec.security_protocol}): a client of another protocol than the "
                f"listener's gets no answer"
            )


def refused_setting(sec: KafkaSecurityConfig, error: KafkaError, bootstrap: str) -> str | None:
    """The message naming the setting a broker refused, for a librdkafka error; None for
    an error that says nothing about the settings (no broker there, a restart)."""
    text = error.str()
    code = error.code()
    if code == KafkaError._AUTHENTICATION:
        return _refused_login(sec, text)
    if code == KafkaError._SSL and "certificate verify failed" in text:
        if "mismatch" in text:
            return (
                f"kafka.ssl_check_hostname: the broker's certificate does not name the host "
                f"of {bootstrap} (connect by a name it lists)"
            )
        return (
            f"kafka.ssl_cafile: the broker's certificate is not signed by a CA in "
            f"{sec.ssl_cafile or 'the system store'} (certificate verify failed)"
        )
    alert = _ALERT.search(text)
    if alert is not None and "certificate" in alert.group(1):
        if sec.ssl_certfile is None:
            return (
                "kafka.ssl_certfile: the broker asks for a client certificate (mutual TLS): "
                "set ssl_certfile and ssl_keyfile"
            )
        return (
            f"kafka.ssl_certfile: the broker refused the client certificate {sec.ssl_certfile} "
            f"(TLS alert: {alert.group(1)}): expired, not yet valid, or signed by a CA the "
            "broker does not trust"
        )
    if code == KafkaError._SSL:
        return (
            f"kafka.security_protocol: the TLS handshake with {bootstrap} failed ({text}); "
            f"is that a {sec.security_protocol} listener?"
        )
    return None


def _refused_login(sec: KafkaSecurityConfig, text: str) -> str:
    if "mechanism" in text.lower() and "unsupported" in text.lower():
        return f"kafka.sasl_mechanism: the broker does not offer {sec.sasl_mechanism}"
    if sec.oauth is not None:
        if "acquire sasl oauthbearer token" in text.lower():  # the endpoint, not the broker
            return (
                f"kafka.oauth: no token from {sec.oauth.token_endpoint_url} for client "
                f"{sec.oauth.client_id}"
            )
        return (
            f"kafka.oauth: the broker refused the token of client {sec.oauth.client_id} "
            f"from {sec.oauth.token_endpoint_url}"
        )
    field = "password_env" if sec.password_env is not None else "password_file"
    return (
        f"kafka.{field}: the broker refused the {sec.sasl_mechanism} login of user "
        f"{sec.username!r} (wrong password, or no such user)"
    )


def check_certificate_dates(sec: KafkaSecurityConfig, now: datetime | None = None) -> None:
    """Refuse a client certificate (``ssl_certfile``) outside its validity: the broker
    would refuse it with a TLS alert that does not say why.

    Raises:
        ConfigError: Expired or not yet valid (``kafka.ssl_certfile``).
    """
    if sec.ssl_certfile is None or not uses_tls(sec):
        return
    try:
        found = _PEM_CERT.search(sec.ssl_certfile.read_bytes())
        der = ssl.PEM_cert_to_DER_cert(found.group(0).decode("ascii")) if found else b""
        not_before, not_after = certificate_validity(der)
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        raise ConfigError(f"kafka.ssl_certfile: no PEM certificate in {sec.ssl_certfile}") from None
    now = now or datetime.now(UTC)
    if now > not_after:
        raise ConfigError(
            f"kafka.ssl_certfile: the certificate {sec.ssl_certfile} expired on "
            f"{not_after:%Y-%m-%d %H:%M} UTC"
        )
    if now < not_before:
        raise ConfigError(
            f"kafka.ssl_certfile: the certificate {sec.ssl_certfile} is not valid before "
            f"{not_before:%Y-%m-%d %H:%M} UTC"
        )


def certificate_validity(der: bytes) -> tuple[datetime, datetime]:
    """(notBefore, notAfter) of an X.509 certificate in DER (RFC 5280 section 4.1: the
    fifth element of tbsCertificate, after the optional version, the serial number, the
    signature algorithm and the issuer).

    Raises:
        ValueError: Not a certificate.
    """

    def element(at: int) -> tuple[int, int, int]:  # (tag, start of content, end)
        tag, size = der[at], der[at + 1]
        start = at + 2
        if size & 0x80:
            count = size & 0x7F
            size = int.from_bytes(der[start : start + count], "big")
            start += count
        if start + size > len(der):
            raise ValueError("truncated DER")
        return tag, start, start + size

    _, certificate, _ = element(0)
    _, at, _ = element(certificate)  # the first field of tbsCertificate
    tag, _, end = element(at)
    if tag == 0xA0:  # [0] version
        at = end
    for _ in range(3):  # serial number, signature algorithm, issuer
        at = element(at)[2]
    tag, validity, _ = element(at)
    if tag != 0x30:
        raise ValueError("no validity in the certificate")
    return _der_time(der, *element(validity)), _der_time(der, *element(element(validity)[2]))


def _der_time(der: bytes, tag: int, start: int, end: int) -> datetime:
    text = der[start:end].decode("ascii")
    if tag == 0x17:  # UTCTime: YYMMDDHHMMSSZ, years 1950-2049 (RFC 5280 4.1.2.5.1)
        year = int(text[:2])
        text = f"{19 if year >= 50 else 20}{text}"
    elif tag != 0x18:  # GeneralizedTime: YYYYMMDDHHMMSSZ
        raise ValueError("not a DER time")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)
