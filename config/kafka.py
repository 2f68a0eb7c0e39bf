"""How dpstream reaches Kafka and a Schema Registry: the ``kafka:`` section (security
protocol, SASL, TLS, OAUTHBEARER) and ``schema_registry:`` sections, with the secrets
they name but never hold."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from .base import ENV_NAME, Model, env_name, no_inline_secret

log = logging.getLogger(__name__)


class SchemaRegistryConfig(Model):
    """A Schema Registry: where the source records' schemas come from (``input.format``
    avro, protobuf or json_schema), or where the release topics' schemas are registered
    (``outputs.format`` avro): any registry that serves Confluent's API, Confluent's own or
    Apicurio's ``/apis/ccompat/v7``. Mapped by ``pipeline/kafka/schema_registry.py``; see
    docs/security.md.

    ``url``: http(s), without credentials in it. Basic auth: ``username`` with the password
    from the environment variable ``password_env`` or the file ``password_file``, read when
    the client is built, never written here. TLS (an https URL): ``ssl_cafile`` (else the
    system's CAs), ``ssl_certfile``/``ssl_keyfile`` for a client certificate.
    """

    url: str
    username: str | None = Field(None, min_length=1)
    password_env: str | None = None
    password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: object) -> object:
        names = ("password", "basic_auth_user_info", "ssl_key_password")
        return no_inline_secret(data, names, "password_env or password_file")

    _password_env = field_validator("password_env")(env_name)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            # The message never repeats the URL: it holds a secret.
            raise ValueError(
                "credentials are never written in the URL; use username with password_env "
                "or password_file"
            )
        return v.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> SchemaRegistryConfig:
        if self.username is not None and (self.password_env is None) == (
            self.password_file is None
        ):
            raise ValueError(
                "password_env: set exactly one of password_env and password_file with username"
            )
        if self.username is None:
            for name in ("password_env", "password_file"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only applies with username (basic auth)")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            missing = "ssl_keyfile" if self.ssl_keyfile is None else "ssl_certfile"
            raise ValueError(f"{missing}: ssl_certfile and ssl_keyfile go together")
        if not self.url.startswith("https://"):
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only applies to an https:// url")
            if self.username is not None:
                log.warning("schema_registry: basic auth over http sends the password unencrypted")
        return self


_SASL = ("SASL_PLAINTEXT", "SASL_SSL")
_TLS = ("SSL", "SASL_SSL")


class OAuthConfig(Model):
    """SASL/OAUTHBEARER tokens from an OpenID Connect provider: the OAuth 2.0 client
    credentials grant at ``token_endpoint_url`` (what managed clusters such as Confluent
    Cloud take; docs/security.md). The client secret comes from ``client_secret_env`` or
    ``client_secret_file``, never from the config.
    """

    token_endpoint_url: str
    client_id: str = Field(min_length=1)
    client_secret_env: str | None = None
    client_secret_file: Path | None = None
    scope: str | None = Field(None, min_length=1)
    # SASL extensions sent with the token (Confluent Cloud: logicalCluster, identityPoolId).
    extensions: dict[str, str] = {}

    @model_validator(mode="before")
    @classmethod
    def no_inline_secret(cls, data: object) -> object:
        if isinstance(data, dict) and "client_secret" in data:
            raise ValueError(
                "client_secret: secrets are never written in the config; "
                "use client_secret_env or client_secret_file"
            )
        return data

    @field_validator("token_endpoint_url")
    @classmethod
    def _https(cls, v: str) -> str:
        # The client secret goes to this URL: TLS, except to this machine (tests).
        loopback = re.match(r"^http://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?/", v)
        if not (v.startswith("https://") or loopback):
            raise ValueError("must be an https:// URL (http:// only on localhost)")
        return v

    @field_validator("client_secret_env")
    @classmethod
    def env_name(cls, v: str | None) -> str | None:
        if v is not None and not ENV_NAME.match(v):
            raise ValueError("must be the name of an environment variable")
        return v

    @field_validator("extensions")
    @classmethod
    def _extensions(cls, v: dict[str, str]) -> dict[str, str]:
        # librdkafka takes them as "k1=v1,k2=v2"; RFC 7628 keys are letters only.
        for key, value in v.items():
            if not re.fullmatch(r"[A-Za-z]+", key) or key == "auth":
                raise ValueError(f"{key!r}: an extension key is letters only, not 'auth'")
            if any(c in value for c in ",=\x01"):
                raise ValueError(f"{key}: a value may not contain ',', '=' or \\x01")
        return v

    @model_validator(mode="after")
    def _one_secret(self) -> OAuthConfig:
        if (self.client_secret_env is None) == (self.client_secret_file is None):
            raise ValueError(
                "client_secret_env: set exactly one of client_secret_env and client_secret_file"
            )
        return self


class KafkaSecurityConfig(Model):
    """How every Kafka client connects: Faust (aiokafka), the producer and the consumer
    tools (confluent-kafka). Mapped by ``pipeline/kafka/security.py``; see docs/security.md.

    No secret is ever written here: the SASL password comes from the environment variable
    named by ``password_env`` or from ``password_file``, read when a client is built; an
    OAUTHBEARER client secret likewise (``oauth``).
    """

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    username: str | None = Field(None, min_length=1)
    password_env: str | None = None
    password_file: Path | None = None
    oauth: OAuthConfig | None = None  # with sasl_mechanism OAUTHBEARER
    ssl_cafile: Path | None = None  # None: the system's trusted CAs
    ssl_certfile: Path | None = None  # client certificate (mutual TLS), with ssl_keyfile
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="before")
    @classmethod
    def no_inline_secret(cls, data: object) -> object:
        names = ("password", "sasl_password", "ssl_password", "ssl_key_password")
        return no_inline_secret(data, names, "password_env or password_file")

    _password_env = field_validator("password_env")(env_name)

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurityConfig:
        proto = self.security_protocol
        if proto in _SASL:
            self._check_sasl()
        else:
            for name in ("sasl_mechanism", "username", "password_env", "password_file", "oauth"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only applies to SASL_PLAINTEXT and SASL_SSL")
        if proto not in _TLS:
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"):
                # A default written out (e.g. by model_dump) is not a TLS setting.
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name}: only applies to SSL and SASL_SSL")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            missing = "ssl_keyfile" if self.ssl_keyfile is None else "ssl_certfile"
            raise ValueError(f"{missing}: ssl_certfile and ssl_keyfile go together")
        if proto == "SASL_PLAINTEXT" and self.sasl_mechanism in ("PLAIN", "OAUTHBEARER"):
            log.warning(
                "kafka: SASL %s over SASL_PLAINTEXT sends the %s unencrypted",
                self.sasl_mechanism,
                "password" if self.sasl_mechanism == "PLAIN" else "token",
            )
        if proto in _TLS and not self.ssl_check_hostname:
            log.warning("kafka.ssl_check_hostname is false: the broker's name is not verified")
        return self

    def _check_sasl(self) -> None:
        proto = self.security_protocol
        if self.sasl_mechanism is None:
            raise ValueError(f"sasl_mechanism: required for security_protocol {proto}")
        if self.sasl_mechanism == "OAUTHBEARER":
            if self.oauth is None:
                raise ValueError("oauth: required for sasl_mechanism OAUTHBEARER")
            for name in ("username", "password_env", "password_file"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: OAUTHBEARER takes its token from oauth")
            return
        if self.oauth is not None:
            raise ValueError("oauth: only applies to sasl_mechanism OAUTHBEARER")
        if self.username is None:
            raise ValueError(f"username: required for security_protocol {proto}")
        if (self.password_env is None) == (self.password_file is None):
            raise ValueError(
                f"password_env: set exactly one of password_env and password_file "
                f"for security_protocol {proto}"
            )
