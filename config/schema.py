"""Pipeline definitions: YAML loaded once into frozen, validated models.

A bad config stops the program at start with a message that names the field
(``statistics[0].epsilon: ...``). Legal but unusual values log a warning.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dpstream.operators import accounting
from dpstream.operators.accounting import PrivacyStatement, StatementError, StatisticTerms
from dpstream.operators.accounting.accountant import Form
from dpstream.operators.cells import cell_accountant, cell_mean
from dpstream.operators.cells.cell_accountant import CellAccountantSpec
from dpstream.operators.cells.cell_mean import CellMeanSpec
from dpstream.operators.errors import DpStreamError, InvalidOperatorConfig
from dpstream.operators.noise import snapping

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _topic_name(v: str) -> str:
    # Kafka's rules (kafka.common.internals.Topic.validate): the broker refuses any other.
    if not _TOPIC.match(v) or v in (".", ".."):
        raise ValueError("must be a Kafka topic name ([A-Za-z0-9._-], 1-249 chars, not . or ..)")
    return v


def _identifier(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError("must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 100 chars)")
    return v


class ConfigError(DpStreamError, ValueError):
    """The pipeline definition is invalid; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


def _env_name(v: str | None) -> str | None:
    if v is not None and not _ENV_NAME.match(v):
        raise ValueError("must be the name of an environment variable")
    return v


def _no_inline_secret(data: object, names: tuple[str, ...], remedy: str) -> object:
    # Checked before anything else, and the message never repeats the value.
    if isinstance(data, dict):
        for name in names:
            if name in data:
                raise ValueError(f"{name}: secrets are never written in the config; use {remedy}")
    return data


class SchemaRegistryConfig(_Model):
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
        return _no_inline_secret(data, names, "password_env or password_file")

    _password_env = field_validator("password_env")(_env_name)

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


InputFormat = Literal["json", "avro", "protobuf", "json_schema"]
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


class InputConfig(_Model):
    """Where events come from, and how stage 1 is split.

    ``topics``: the source topics, the users' own: the ingest reads them in a consumer
    group and never writes to them or changes their settings; any partition count, any
    producer, any record key. ``format``: how their values are written: JSON (the
    default), or Avro, Protobuf or JSON Schema in a Schema Registry's wire format (a zero
    byte, the schema id, the payload), with ``schema_registry`` saying where the schemas
    are. ``user_id_field``: where an event's user id is, a dotted path for a nested field
    (``actor.id``), in any format. ``partitions``: the partitions of dpstream's own events
    topic (``<app_id>-events``), stage 1's parallelism.
    """

    topics: list[str] = Field(["dpstream.events"], min_length=1)
    format: InputFormat = "json"
    schema_registry: SchemaRegistryConfig | None = None
    user_id_field: str = "user_id"
    partitions: int = Field(4, ge=1, le=1024)
    # A single record (event or batch envelope) larger than this is dead-lettered.
    max_record_bytes: int = Field(1_000_000, ge=256, le=50_000_000)
    max_user_id_length: int = Field(256, ge=1, le=4096)
    # A cell key (kind cell_mean's ``cells.field`` attribute) longer than this is rejected.
    max_cell_key_length: int = Field(128, ge=1, le=4096)
    # The ingest's batch of source records; it holds at most two (one unacknowledged by
    # the events topic while the next is read): its memory bound.
    ingest_batch: int = Field(5000, ge=1, le=1_000_000)
    # How long the ingest waits for a batch to fill once its first record is there: at a
    # moderate rate of single-event records, larger envelopes cost stage 1 less per event.
    # Releases are not delayed (ticks are closed by the clock's markers).
    ingest_wait_ms: int = Field(50, ge=0, le=10_000)
    # Where a new pipeline's ingest group starts reading the sources: the oldest record
    # kept (``earliest``) or what arrives from now on (``latest``). The group's committed
    # offsets win once it has them: for an existing pipeline this changes nothing.
    start: Literal["earliest", "latest"] = "earliest"
    # dpstream never creates a source topic; a missing one stops the worker and the
    # ingest at start, naming input.topics, unless they wait this long for it (for
    # deployments that create topics after the pipeline).
    wait_for_topics_seconds: float = Field(0.0, ge=0, le=86_400)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "topic" in data:
            raise ValueError("topic: now topics, a list of source topics (topics: [name])")
        return data

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        for i, topic in enumerate(v):
            try:
                _topic_name(topic)
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
        if len(set(v)) < len(v):
            raise ValueError("a topic is listed twice")
        return v

    @field_validator("user_id_field")
    @classmethod
    def _user_id_field(cls, v: str) -> str:
        if not v or any(not part for part in v.split(".")):
            raise ValueError("must be a field name or a dotted path of field names")
        return v

    @model_validator(mode="after")
    def _registry_for_format(self) -> InputConfig:
        if self.format in REGISTRY_FORMATS and self.schema_registry is None:
            raise ValueError(f"schema_registry: required for format {self.format}")
        if self.format == "json" and self.schema_registry is not None:
            raise ValueError(
                "schema_registry: only applies to format avro, protobuf or json_schema"
            )
        return self


# What stage 1 and stage 2 need at least, after the clock's marker period, to report and
# absorb a tick before its release deadline (docs/design.md section 1).
MIN_RELEASE_MARGIN_SECONDS = 0.25
# The default margin: 1 s where a healthy worker needs milliseconds (stage 1's close with
# 100,000 users held: under 1 ms, docs/design.md section 1), room for event-loop stalls.
DEFAULT_RELEASE_MARGIN_SECONDS = 1.0


class TickConfig(_Model):
    """Public time. Tick n covers wall-clock [n*I, (n+1)*I) of Unix time
    (``interval_seconds``); its releases are published at its deadline
    (n+1)*I + ``release_delay_seconds``, with that deadline as their Kafka timestamp. None:
    the clock's marker period plus 1 s (1.25 s for 1 s ticks)."""

    interval_seconds: float = Field(1.0, gt=0, le=86_400)
    release_delay_seconds: float | None = Field(None, gt=0, le=86_400)

    @property
    def marker_period_seconds(self) -> float:
        """How often the leader's clock looks for a tick or a deadline that has passed:
        a marker leaves at most this long after its time."""
        return min(self.interval_seconds / 4, 1.0)

    @property
    def release_delay(self) -> float:
        """Seconds from a tick's end to its release deadline."""
        if self.release_delay_seconds is not None:
            return self.release_delay_seconds
        return self.marker_period_seconds + DEFAULT_RELEASE_MARGIN_SECONDS

    @model_validator(mode="after")
    def _delay_covers_the_pipeline(self) -> TickConfig:
        # The tick marker leaves up to one marker period after the tick's end; stage 1
        # and stage 2 need the rest of the delay before the release marker comes.
        least = self.marker_period_seconds + MIN_RELEASE_MARGIN_SECONDS
        if self.release_delay < least:
            raise ValueError(
                f"release_delay_seconds: must be at least {least:g} (the clock's marker period "
                f"min(interval_seconds / 4, 1) = {self.marker_period_seconds:g} s plus "
                f"{MIN_RELEASE_MARGIN_SECONDS:g} s for stage 1 and stage 2), "
                f"got {self.release_delay:g}"
            )
        return self


OutputFormat = Literal["json", "avro"]


class OutputConfig(_Model):
    """Where and how the worker publishes. ``format``: how the release topics' values are
    written: JSON (the default), or Avro in a Schema Registry's wire format (a zero byte,
    the schema id, the payload) with each topic's schema registered under the subject
    ``<topic>-value`` in ``schema_registry``, which avro requires: its own section, not
    ``input.schema_registry``'s, since registering needs write access where the input
    only reads, and the two registries can differ (docs/design.md section 7a). The ledger
    and the dead letters stay JSON in either format."""

    # A statistic's release topic is this prefix and its name (PipelineConfig.release_topic).
    release_topic_prefix: str = "dp."
    dead_letter_topic: str = "dpstream.dead-letter"
    ledger_topic: str = "dpstream.ledger"
    format: OutputFormat = "json"
    schema_registry: SchemaRegistryConfig | None = None

    _topics = field_validator("dead_letter_topic", "ledger_topic")(_topic_name)

    @model_validator(mode="after")
    def _registry_for_format(self) -> OutputConfig:
        if self.format == "avro" and self.schema_registry is None:
            raise ValueError("schema_registry: required for format avro")
        if self.format == "json" and self.schema_registry is not None:
            raise ValueError("schema_registry: only applies to format avro")
        return self

    @field_validator("release_topic_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        # Its length is checked with each statistic's name (PipelineConfig._topics_apart).
        if not re.fullmatch(r"[A-Za-z0-9._-]*", v):
            raise ValueError("must be the start of a Kafka topic name ([A-Za-z0-9._-] only)")
        return v


class MetricsConfig(_Model):
    """The worker's operations endpoint: Prometheus metrics on ``/metrics`` and the health
    probes ``/livez`` and ``/readyz``, on one port (docs/operations.md). Off by default;
    ``dpstream worker --metrics-port`` turns it on at another port (several workers on one
    host), ``--no-metrics`` off. The numbers it serves are exact and data-dependent
    (docs/security.md section 5): the default host is this host only."""

    enabled: bool = False
    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(9464, ge=1, le=65535)


class NoiseMode(StrEnum):
    keyed = "keyed"
    # Zero noise releases exact (truncated) values: NOT private. Tests and debugging only;
    # every release is stamped with it.
    insecure_zero = "insecure_zero"


class NoiseConfig(_Model):
    """Where keyed noise's key comes from: ``key_file``, else the environment variable
    ``key_env`` (read by the worker at start, pipeline/worker/keys.py)."""

    mode: NoiseMode = NoiseMode.keyed
    key_file: Path | None = None
    key_env: str | None = "DPSTREAM_NOISE_KEY"

    _key_env = field_validator("key_env")(_env_name)

    @model_validator(mode="after")
    def _key_source(self) -> NoiseConfig:
        # Found here, not at the worker's start: whether the key is there is the
        # environment's, but a keyed config that names no place for it never runs.
        if self.mode is NoiseMode.keyed and self.key_file is None and not self.key_env:
            raise ValueError("key_env: keyed mode needs noise.key_file or noise.key_env")
        return self


_SASL = ("SASL_PLAINTEXT", "SASL_SSL")
_TLS = ("SSL", "SASL_SSL")


class OAuthConfig(_Model):
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
    def _no_inline_secret(cls, data: object) -> object:
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
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
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


class KafkaSecurityConfig(_Model):
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
    def _no_inline_secret(cls, data: object) -> object:
        names = ("password", "sasl_password", "ssl_password", "ssl_key_password")
        return _no_inline_secret(data, names, "password_env or password_file")

    _password_env = field_validator("password_env")(_env_name)

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


class Neighbours(StrEnum):
    # Neighbouring streams differ by all events of one user (the paper's constants).
    whole_user = "whole_user"
    # Neighbours may drop ANY subset of one user's events; truncation then moves up to
    # 2*tau leaf units (Dong-Luo-Yi Alg. 3; docs/papers.md), so the per-level sensitivity doubles.
    any_subset = "any_subset"


# sqrt_factorization: the square-root factorization counter with discrete Gaussian noise,
# the one mechanism of privacy.accounting: zcdp (operators/trees/sqrt_factorization.py).
Mechanism = Literal["binary", "kary", "kary_subtract", "expiring", "auto", "sqrt_factorization"]

# The delta check-config and the ledger state a zCDP pipeline's (epsilon, delta) at when
# privacy.delta is not given (docs/security.md).
DEFAULT_DELTA = 1e-6


@dataclass(frozen=True, slots=True)
class KindEntry:
    """What config validation and the event checks need to know of one kind.

    ``needs_value``: its events must carry a value. ``section``: the kind is bounded by
    the caps of its own section (``mean``, ``cells``), which it requires and no other kind
    takes; tau and the tree parameters do not apply. ``values``: its event values are
    integers in [1, R], R given by this field (``max_value``, ``bins``). ``rank``: it takes
    ``rank`` and ``halve_margin``. ``fixed_tau``: an integer tau (Alg. 3) is allowed besides
    tau: auto. ``deletions``: ``deletions: true`` is supported (tau: auto). ``trees``: with
    tau: auto its instances may run the k-ary trees (``kary``, ``kary_subtract``) besides
    Dong-Luo-Yi's binary tree. ``zcdp``: with a fixed tau it runs under ``privacy.accounting:
    zcdp`` (the square-root factorization counter).
    """

    needs_value: bool = True
    section: str | None = None
    values: str | None = None
    rank: bool = False
    fixed_tau: bool = False
    deletions: bool = True
    trees: bool = False
    zcdp: bool = False


# The kinds the schema accepts, with the parameters each takes. Their implementations are
# the statistics layer's registry (dpstream.statistics.registry), which checks at import
# that it names the same kinds: adding a kind is its module, one line there and one here.
KINDS: dict[str, KindEntry] = {
    "count": KindEntry(needs_value=False, fixed_tau=True, trees=True, zcdp=True),
    "sum": KindEntry(values="max_value", fixed_tau=True, trees=True, zcdp=True),
    "histogram": KindEntry(values="bins", trees=True),
    "kselect": KindEntry(values="bins", rank=True, deletions=False),
    "distinct": KindEntry(deletions=False),
    "mean": KindEntry(section="mean"),
    "cell_mean": KindEntry(section="cells"),
}
if TYPE_CHECKING:
    # A Literal built from KINDS at run time is no type to a checker: a kind is a str there.
    Kind = str
else:
    Kind = Literal[tuple(KINDS)]


def _kinds_with(test: Callable[[KindEntry], bool]) -> list[str]:
    return [kind for kind, params in KINDS.items() if test(params)]


def _only(field: str, kinds: list[str], kind: str) -> str:
    """The message for ``field`` set on ``kind``, which only ``kinds`` take."""
    which = f"kind {kinds[0]}" if len(kinds) == 1 else " and ".join(kinds)
    return f"{field}: only applies to {which}, not {kind}"


FilterScalar = StrictStr | StrictBool | StrictInt | StrictFloat  # a JSON scalar, as written


def _check_condition(stat: StatisticConfig, path: str, wanted: Sequence[object]) -> None:
    """One ``where`` field: a dotted path, values some event could hold there."""
    name = f"where.{path}"
    if any(not part for part in path.split(".")):
        raise ValueError(f"{name}: must be a field name or a dotted path of field names")
    if not wanted:
        raise ValueError(f"{name}: an empty list matches no event")
    # A field compared with a value holds no fields of its own: a filter or value field
    # below it could never be met.
    read = [*(stat.where or {}), stat.value_field or "value"]
    below = [p for p in read if p.startswith(path + ".")]
    if below:
        raise ValueError(
            f"{name}: {below[0]} is read below it, but it is compared with a value: "
            "no event could match"
        )
    if path == (stat.value_field or "value") and KINDS[stat.kind].needs_value:
        text = [w for w in wanted if type(w) not in (int, float)]
        if text:
            raise ValueError(
                f"{name}: the statistic's own value field holds numbers; {text[0]!r} never matches"
            )
    if path == "key" and stat.key is not None and stat.key not in wanted:
        raise ValueError(f"{name}: contradicts key: {stat.key}; no event could match both")


def _check_interval(lower: float, upper: float) -> None:
    """A value range [lower, upper] of a mean: finite, and not empty."""
    for name, bound in (("lower", lower), ("upper", upper)):
        if not math.isfinite(bound):
            raise ValueError(f"{name}: must be a finite number")
    if not upper > lower:
        raise ValueError(f"upper: must be greater than lower ({lower:g})")


class MeanConfig(_Model):
    """kind mean: a user-level running mean of values clipped to [lower, upper].

    By default (``privacy.public_counts: false``) the whole-user mean
    (operators.whole_user_mean): each user's first ``max_samples_per_user`` (m) samples
    are kept, snapped to ``resolution`` grid units, and two tree counters (samples, units)
    release a noisy count and a noisy sum at epsilon / 2 each; every released number is
    noised. ``max_users`` and ``delta`` do not apply (no cap on users: the noise does not
    depend on their number) and are refused.

    With ``privacy.public_counts: true``: the continual mean of George et al. Alg. 6
    (private only when who sent how many samples when is public). Values are clipped
    (and counted); ``max_users`` (n, required) and m are declared caps: the noise is
    calibrated to them, and a user or sample beyond them is not used, and is counted. The
    cap on users is split evenly over the events topic's partitions
    (operators.continual_mean.user_quota).
    """

    lower: float = 0.0
    upper: float = 1.0
    max_users: int | None = Field(None, ge=1, le=1 << 40)  # public counts only
    max_samples_per_user: int = Field(ge=2, le=1 << 30)
    # Public counts only: utility failure probability of the clipping intervals (not a
    # privacy parameter).
    delta: float = Field(0.1, gt=0, le=1)
    resolution: int = Field(1024, ge=1, le=1 << 20)  # grid units per (upper - lower)

    @model_validator(mode="after")
    def _bounds(self) -> MeanConfig:
        _check_interval(self.lower, self.upper)
        return self


# Event attributes with a meaning of their own: a cell key cannot live in one of them.
RESERVED_EVENT_FIELDS = ("user_id", "key", "value", "ts", "op", "tick")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class CellConfig(_Model):
    """kind cell_mean: a user-level mean per cell = (cell key, slot), Rameshwar et al.

    An event's cell key is its attribute ``field`` (a string, e.g. an H3 index); its slot
    is ``tick // slot_ticks``. The statistic's ``epsilon`` is what one cell release costs
    each user it keeps; ``epoch_cap`` (B) is the most one user may lose through this
    statistic in one accounting epoch of ``epoch_slots`` slots (operators.cell_accountant).

    ``counts_public: false`` (default, our strict mode, docs/papers.md): add/remove-user
    neighbours; only ``noisy_ratio`` with a ``contribution_cap``, no Clip-User, and the
    public cell domain ``keys`` is released in every slot, empty or not (which cells have
    data is itself private). ``counts_public: true``: the paper's model (Rameshwar
    et al. Sec. II-D), where who is in which cell and how often is public and only values are
    protected; every mechanism, Clip-User and ``on_cap: skip_cell`` become available.
    """

    field: str
    slot_ticks: int = Field(ge=1, le=1 << 30)
    lower: float
    upper: float
    step: float = Field(gt=0)
    mechanism: Literal["baseline", "array_averaging", "levy", "quantile", "noisy_ratio"] = (
        "noisy_ratio"
    )
    grouping: Literal["best_fit", "wrap_around"] = "best_fit"
    # Array capacity: "median", "eq10" or an integer; None: the mechanism's default.
    m_ub: Literal["median", "eq10"] | int | None = None
    gamma: float = Field(0.2, gt=0, lt=1)  # levy: failure probability of eq. (8)
    quantile: Literal["fixed", "optimized"] = "fixed"
    quantile_step: float | None = Field(None, gt=0)
    # Values stage 1 keeps per (cell, user) for the array mechanisms (m_UB <= head_cap).
    head_cap: int = Field(256, ge=1, le=1 << 16)
    contribution_cap: int | None = Field(None, ge=1, le=1 << 16)  # noisy_ratio: c
    counts_public: bool = False
    clip_user: bool = False
    clip_kappa: float = Field(1.0, ge=0, le=1000)
    epoch_slots: int = Field(ge=1, le=1 << 30)
    epoch_cap: float = Field(gt=0)
    on_cap: Literal["drop_user", "skip_cell"] = "drop_user"
    # The public cell domain: required in strict mode; with public counts it restricts
    # the accepted cells. An event whose cell is not listed is dead-lettered.
    keys: list[str] | None = Field(None, min_length=1, max_length=1 << 20)

    @field_validator("field")
    @classmethod
    def _field_name(cls, v: str) -> str:
        if not _FIELD.match(v):
            raise ValueError("must be an attribute name ([A-Za-z_][A-Za-z0-9_]*, <= 64 chars)")
        if v in RESERVED_EVENT_FIELDS:
            raise ValueError(f"{v!r} is an event attribute of its own; name another one")
        return v

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for i, key in enumerate(v):
            if not key.strip():
                raise ValueError(f"keys[{i}] is empty")
        if len(set(v)) != len(v):
            raise ValueError("has duplicate cell keys")
        return v

    @model_validator(mode="after")
    def _modes(self) -> CellConfig:
        _check_interval(self.lower, self.upper)
        if not self.counts_public:
            if self.mechanism != "noisy_ratio":
                raise ValueError(
                    f"counts_public: mechanism {self.mechanism} treats who is in which cell as "
                    "public (Rameshwar et al. Sec. II-D); set counts_public: true, or use "
                    "noisy_ratio (strict mode)"
                )
            if self.clip_user:
                raise ValueError("clip_user: needs counts_public: true (it reads all counts)")
            if self.on_cap == "skip_cell":
                raise ValueError(
                    "on_cap: skip_cell needs counts_public: true (skipping a cell for one "
                    "user's history would reveal that user to the others' release)"
                )
            if self.keys is None:
                raise ValueError(
                    "keys: required when counts_public is false: every slot releases every "
                    "listed cell, empty or not (which cells have data is private)"
                )
        if self.mechanism == "noisy_ratio" and self.contribution_cap is None:
            raise ValueError(
                "contribution_cap: required for mechanism noisy_ratio (c values per cell and user)"
            )
        if self.mechanism != "noisy_ratio" and self.contribution_cap is not None:
            raise ValueError(f"contribution_cap: only applies to noisy_ratio, not {self.mechanism}")
        if "clip_kappa" in self.model_fields_set and not self.clip_user:
            raise ValueError("clip_kappa: only applies with clip_user: true")
        try:  # what only the operators check (grid multiples, ...), named as here
            self.operator_spec(1.0)
            self.accountant_spec()
        except InvalidOperatorConfig as exc:
            name, _, rest = str(exc).partition(" must be ")
            raise ValueError(f"{name}: must be {rest}" if rest else str(exc)) from None
        return self

    def head_cap_used(self) -> int:
        """Values stage 1 keeps per (cell, user): Baseline needs none beyond count and sum
        (1), noisy_ratio its first c, the array mechanisms ``head_cap``."""
        if self.mechanism == "baseline":
            return 1
        if self.mechanism == "noisy_ratio":
            assert self.contribution_cap is not None
            return self.contribution_cap
        return self.head_cap

    def operator_spec(self, epsilon: float, any_subset: bool = False) -> CellMeanSpec:
        """The ``operators.cell_mean`` spec of one cell release at ``epsilon``; ``any_subset``
        is the strict mode's neighbouring relation (privacy.neighbours)."""

        def exact(x: float) -> str:
            return repr(x)  # the decimal the user wrote: 0.1 is 1/10 (exact_fraction)

        return cell_mean.make_cell_mean(
            self.mechanism,
            exact(epsilon),
            exact(self.lower),
            exact(self.upper),
            exact(self.step),
            counts_public=self.counts_public,
            grouping=self.grouping,
            m_ub=self.m_ub,
            gamma=exact(self.gamma),
            quantile=self.quantile,
            quantile_step=None if self.quantile_step is None else exact(self.quantile_step),
            head_cap=self.head_cap_used(),
            contribution_cap=self.contribution_cap,
            any_subset=any_subset,
        )

    def accountant_spec(self) -> CellAccountantSpec:
        """The ``operators.cell_accountant`` spec: B per epoch, the mode, on_cap."""
        return cell_accountant.make_cell_accountant(
            repr(self.epoch_cap), self.counts_public, self.on_cap
        )


_NOT_FOR_OWN_CAPS = (
    "tau",
    "beta",
    "theta",
    "practical",
    "practical_instances",
    "tracker_share",
    "series",
    "tau_start",
    "deletions",
    "mechanism",
    "k",
    "lam",
    "delay",
    "horizon_ticks",
)


class StatisticConfig(_Model):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    # count: events; sum: integer values in [1, max_value]; histogram: counts of integer
    # values in [1, bins] (and their max frequency); kselect: the rank-th largest value
    # in [1, bins] (max, median or an integer k); distinct: distinct event values.
    kind: Kind = "count"
    # Its budget: epsilon under privacy.accounting: pure, rho (zCDP) under zcdp; one of them.
    epsilon: float | None = Field(None, gt=0)
    rho: float | None = Field(None, gt=0)
    # auto: the user-level mechanism (Dong-Luo-Yi Alg. 5): no contribution bound to guess;
    # an SVT tracker finds it. An integer: fixed truncation (Alg. 3), count and sum only.
    tau: int | Literal["auto"] = "auto"
    # User-level (tau: auto) parameters, Dong-Luo-Yi Algs. 4-5 and App. C-A.
    beta: float = Field(0.1, gt=0, lt=1)
    theta: float = Field(1.0, gt=0, le=4)
    practical: bool = True  # tracker starts at tau = 64 with the shifted series (App. C-A)
    practical_instances: bool = False  # the shifted series for the instances too
    # tau: auto count, sum, histogram (docs/user-level.md section 6): the tracker's share
    # of epsilon (Alg. 5: 0.5), the epsilon series of both the tracker's SVTs and the
    # instances ("dly": Dong-Luo-Yi's, with theta; "telescoping": x / (i (i+1))), and
    # tau_1, the tracker's first bound (a power of two; App. C-A: 64). None (not named):
    # resolved before anything runs it (statistics.registry.resolved): a statistic the
    # ledger ran keeps Alg. 5's (0.5, dly, 64 or 2), a new one gets 0.25, telescoping and
    # 256 (a histogram 64; 2 with practical: false).
    tracker_share: float | None = Field(None, gt=0, lt=1)
    series: Literal["dly", "telescoping"] | None = None
    tau_start: int | None = Field(None, ge=2, le=1 << 40)
    max_value: int | None = Field(None, ge=1, le=1 << 20)  # sum: R (values in [0, R], tau in units)
    # sum: real values clipped into [lower, upper] and snapped to a grid of ``resolution``
    # units over that range (the mean's words); a fixed tau then counts a user's events.
    lower: float | None = None
    upper: float | None = None
    resolution: int | None = Field(None, ge=1, le=1 << 30)
    bins: int | None = Field(None, ge=1, le=4096)  # histogram, kselect: R
    rank: Literal["max", "median"] | int | None = None  # kselect
    # kselect: threshold k + Delta/2 (Dong-Luo-Yi, Appendix C-A) instead of k + Delta.
    # Opt-in: the release is then no longer <= the true k-th with probability >= 1 - beta.
    halve_margin: bool = False
    # Events with "op": "delete" form a second stream; count, sum and histogram release
    # F_ins - F_del, each at epsilon / 2 (Dong-Luo-Yi Sec. VI).
    deletions: bool = False
    # binary: Dong-Luo-Yi Alg. 2; kary / kary_subtract: Andersson-Pagh-Torkamani (k-ary
    # tree, with balanced negative digits); expiring: Andersson et al. (expiration) Alg. 3
    # (lambda, delay B); auto: the tree with the least exact MSE over horizon_ticks
    # (choosing costs no privacy). None (not named): resolved before anything runs it
    # (statistics.registry.resolved): a statistic the ledger ran keeps the tree it ran, a
    # new fixed-tau count or sum without a horizon gets the least-error unbounded tree,
    # any other the binary tree (docs/design.md section 5a).
    mechanism: Mechanism | None = None
    k: int | None = Field(None, ge=2, le=1024)
    lam: float | None = Field(None, alias="lambda", ge=0, le=16)
    delay: int = Field(0, ge=0, description="the delay B: no privacy loss for B steps")
    horizon_ticks: int | None = Field(None, ge=1)
    # kind mean: its bounds and caps (George et al.).
    mean: MeanConfig | None = None
    # kind cell_mean: cells, slots, mechanism and the epoch cap (Rameshwar et al.).
    cells: CellConfig | None = None
    # Count only events whose ``key`` equals this; None counts every event.
    key: str | None = None
    # The event field holding its value, a dotted path for a nested field (None: "value");
    # a histogram's or kselect's bin, a distinct count's item.
    value_field: str | None = None
    # Which events it counts: {field: value} (equality) or {field: [values]} (one of
    # them), fields ANDed, dotted paths for nested fields; beside ``key``, if given.
    where: dict[str, FilterScalar | list[FilterScalar]] | None = None

    _name = field_validator("name")(_identifier)

    @field_validator("value_field")
    @classmethod
    def _value_field(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(not part for part in v.split("."))):
            raise ValueError("must be a field name or a dotted path of field names")
        return None if v == "value" else v  # the default, spelled out: the same statistic

    @model_validator(mode="after")
    def _fields(self) -> StatisticConfig:
        """What it reads of an event: a value where its kind takes one, and a filter that
        some event could match."""
        if self.value_field is not None and not KINDS[self.kind].needs_value:
            raise ValueError(f"value_field: kind {self.kind} takes no value")
        where = self.where
        if where is None:
            return self
        if not where:
            raise ValueError("where: an empty filter; leave it out to count every event")
        for path, wanted in where.items():
            _check_condition(self, path, wanted if isinstance(wanted, list) else [wanted])
        return self

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: float | None) -> float | None:
        if v is not None and v > 5:
            log.warning("epsilon=%s is large; the privacy guarantee is weak", v)
        return v

    @model_validator(mode="after")
    def _budget(self) -> StatisticConfig:
        """One budget: epsilon (pure DP) or rho (zCDP); which one the pipeline's
        ``privacy.accounting`` allows is checked there (``PipelineConfig``)."""
        if self.epsilon is None and self.rho is None:
            raise ValueError("epsilon: required (rho instead under privacy.accounting: zcdp)")
        if self.epsilon is not None and self.rho is not None:
            raise ValueError("rho: give epsilon (pure DP) or rho (zCDP), not both")
        return self

    @property
    def zcdp(self) -> bool:
        """Accounted in rho-zCDP (``privacy.accounting: zcdp``; its budget is ``rho``)."""
        return self.rho is not None

    @property
    def pure_epsilon(self) -> float:
        """Its epsilon, for the mechanisms that run under pure accounting only."""
        assert self.epsilon is not None, "a pure-DP statistic has an epsilon (validated)"
        return self.epsilon

    @field_validator("tau")
    @classmethod
    def _tau(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1_000_000:
            raise ValueError("must be 'auto' or an integer in [1, 1000000]")
        return v

    @property
    def own_caps(self) -> bool:
        """Bounded by its own section's caps (a mean, per-cell means), not by tau."""
        return KINDS[self.kind].section is not None

    @property
    def user_level(self) -> bool:
        """The contribution bound is tracked privately (Dong-Luo-Yi Alg. 5), not configured."""
        return self.tau == "auto" and not self.own_caps

    @property
    def fixed_tau(self) -> int:
        assert isinstance(self.tau, int)
        return self.tau

    @model_validator(mode="after")
    def _kind_parameters(self) -> StatisticConfig:
        kind = self.kind
        params = KINDS[kind]
        for section in ("mean", "cells"):
            (owner,) = [k for k, p in KINDS.items() if p.section == section]
            if (kind == owner) != (getattr(self, section) is not None):
                raise ValueError(
                    f"{section}: required for kind {owner}"
                    if kind == owner
                    else _only(section, [owner], kind)
                )
        if self.cells is not None:
            self._check_cells(self.cells)
        self._check_sum_grid()
        for field in ("max_value", "bins"):
            owners = [k for k, p in KINDS.items() if p.values == field]
            if field == "max_value" and self.upper is not None:
                continue  # a sum on a grid (_check_sum_grid)
            if params.values == field and getattr(self, field) is None:
                grid = (
                    " or upper and resolution (real values on a grid)"
                    if field == "max_value"
                    else ""
                )
                raise ValueError(f"{field}: required for kind {kind} (values 1..R){grid}")
            if params.values != field and getattr(self, field) is not None:
                raise ValueError(_only(field, owners, kind))
        ranked = _kinds_with(lambda p: p.rank)
        if params.rank and self.rank is None:
            raise ValueError(f"rank: required for kind {kind} (max, median or an integer k)")
        if not params.rank and self.rank is not None:
            raise ValueError(_only("rank", ranked, kind))
        if isinstance(self.rank, int) and self.rank < 1:
            raise ValueError("rank: an integer rank must be >= 1")
        if not params.rank and self.halve_margin:
            raise ValueError(_only("halve_margin", ranked, kind))
        if self.own_caps:
            # Its own mechanism bounds each user's contribution; none of these apply.
            for name in _NOT_FOR_OWN_CAPS:
                if name in self.model_fields_set:
                    raise ValueError(f"{name}: does not apply to kind {kind}")
            return self
        if not self.user_level and not params.fixed_tau:
            fixed = " and ".join(_kinds_with(lambda p: p.fixed_tau))
            raise ValueError(f"tau: kind {kind} needs tau: auto (fixed tau: {fixed})")
        trees = ("binary", "kary", "kary_subtract") if params.trees else ("binary",)
        if self.user_level and self.mechanism not in (None, *trees):
            raise ValueError(
                f"mechanism: tau: auto runs kind {kind}'s instances on {' or '.join(trees)}"
            )
        if not self.user_level and (self.deletions or self.practical_instances):
            raise ValueError("deletions: only with tau: auto")
        for name in ("tracker_share", "series", "tau_start"):
            if getattr(self, name) is not None and not (self.user_level and params.trees):
                tuned = " and ".join(_kinds_with(lambda p: p.trees))
                raise ValueError(f"{name}: only with tau: auto, kinds {tuned}")
        if self.tau_start is not None and self.tau_start & (self.tau_start - 1):
            raise ValueError("tau_start: must be a power of two")
        if self.deletions and not params.deletions:
            # Distinct count with deletions is open (Dong-Luo-Yi Sec. VI).
            raise ValueError(f"deletions: not supported for kind {kind}")
        return self

    def _check_sum_grid(self) -> None:
        """``lower``/``upper``/``resolution``: a sum's real values on a grid; with tau:
        auto never below 0 (Alg. 5 ranks users by non-negative contributions)."""
        owners = _kinds_with(lambda p: p.values == "max_value")
        given = [f for f in ("lower", "upper", "resolution") if getattr(self, f) is not None]
        if not given:
            return
        if KINDS[self.kind].values != "max_value":
            raise ValueError(_only(given[0], owners, self.kind))
        if self.max_value is not None:
            raise ValueError(f"{given[0]}: give either max_value or lower/upper/resolution")
        if self.upper is None:
            raise ValueError("upper: required with lower or resolution (a sum's values' bound)")
        if self.resolution is None:
            raise ValueError(
                "resolution: required with upper (grid units per (upper - lower): "
                "20000 for a 0.01 grid over [0, 200])"
            )
        lower = self.value_bounds[0]
        _check_interval(lower, self.upper)
        if lower < 0 and self.user_level:
            raise ValueError(
                "lower: tau: auto (Dong-Luo-Yi Alg. 5) ranks users by non-negative "
                "contributions; a negative lower needs a fixed tau"
            )

    @property
    def value_bounds(self) -> tuple[float, float]:
        """A sum's declared value range: [lower (default 0), upper], or [0, max_value]."""
        if self.upper is not None:
            return (0.0 if self.lower is None else self.lower), self.upper
        assert self.max_value is not None
        return 0.0, float(self.max_value)

    def _check_cells(self, cells: CellConfig) -> None:
        if self.epsilon is not None and cells.epoch_cap < self.epsilon:
            raise ValueError(
                f"cells.epoch_cap: B = {cells.epoch_cap:g} is below one cell's epsilon "
                f"({self.epsilon:g}), so no cell could ever be released"
            )

    @model_validator(mode="after")
    def _mechanism_parameters(self) -> StatisticConfig:
        m = self.mechanism or "the default tree"
        if m in ("kary", "kary_subtract") and self.k is None:
            raise ValueError(f"k: required for mechanism {m}")
        if m == "kary_subtract" and self.k is not None and self.k < 3:
            # Odd k: Andersson-Pagh-Torkamani Alg. 2; even k: its App. A.3 variant.
            raise ValueError(f"k: must be >= 3 for kary_subtract, got {self.k}")
        if m not in ("kary", "kary_subtract") and self.k is not None:
            raise ValueError(f"k: only applies to kary and kary_subtract, not {m}")
        if m == "expiring" and self.lam is None:
            raise ValueError("lambda: required for mechanism expiring")
        if m == "expiring" and self.horizon_ticks is None:
            # An item's loss grows with its age; the budget is charged at this age.
            raise ValueError("horizon_ticks: required for mechanism expiring")
        if m != "expiring" and (self.lam is not None or self.delay):
            raise ValueError(f"lambda: lambda and delay only apply to expiring, not {m}")
        if m == "auto" and self.horizon_ticks is None:
            raise ValueError("horizon_ticks: required for mechanism auto")
        return self

    def terms(self, public_counts: bool = False) -> StatisticTerms:
        """What the accountant (``operators.accounting``) needs to charge this statistic;
        ``public_counts`` is the pipeline's ``privacy.public_counts`` (a mean's algorithm)."""

        def exact(x: float) -> Fraction:
            return Fraction(repr(x))  # the decimal the user wrote: 0.1 is 1/10

        cells, mean = self.cells, self.mean
        form: Form = "tree_counter"
        if cells is not None:
            form = "per_cell_mean"
        elif mean is not None:
            form = "continual_mean" if public_counts else "whole_user_mean"
        return StatisticTerms(
            name=self.name,
            kind=self.kind,
            epsilon=exact(self.epsilon or 0.0),  # not charged under zcdp (rho is)
            form=form,
            # every tree counter is charged alike; under zcdp only the square-root
            # factorization runs (registry.resolved)
            mechanism="sqrt_factorization" if self.zcdp else self.mechanism or "binary",
            lam=None if self.lam is None else exact(self.lam),
            delay=self.delay,
            horizon_ticks=self.horizon_ticks,
            epoch_cap=None if cells is None else exact(cells.epoch_cap),
            counts_public=(
                cells.counts_public if cells is not None else mean is not None and public_counts
            ),
            max_samples=None if mean is None else mean.max_samples_per_user,
            resolution=None if mean is None else mean.resolution,
            rho=None if self.rho is None else exact(self.rho),
            sensitivity=self._leaf_sensitivity(),
        )

    def _leaf_sensitivity(self) -> int:
        """A fixed-tau count's or sum's bound on one user's leaves, sum_t |x_t|: tau units
        (a count's events, a ``max_value`` sum's value units), or on a grid tau events of
        at most the grid's largest magnitude in units each (``snapping``); 1 where it does
        not apply (tau: auto, own caps). Stage 2 builds the same (``fixed_tau.py``)."""
        if self.user_level or self.own_caps:
            return 1
        if KINDS[self.kind].values != "max_value" or self.max_value is not None:
            return self.fixed_tau
        lower, upper = self.value_bounds
        assert self.resolution is not None
        step = (Fraction(repr(upper)) - Fraction(repr(lower))) / self.resolution
        grid = snapping.make_grid(step)
        # statistics.bounding.ValueGrid.bound: the most grid units one event moves the sum
        units = max(abs(snapping.to_units(grid, lower)), abs(snapping.to_units(grid, upper)))
        return self.fixed_tau * units


class PrivacyConfig(_Model):
    # pure: epsilon-DP, epsilons add up (basic composition); zcdp: rho-zCDP, rhos add up
    # (Bun-Steinke Lemma 1.7), every statistic a fixed-tau count or sum on the
    # square-root factorization counter with discrete Gaussian noise. A pipeline is one
    # or the other (operators.accounting).
    accounting: Literal["pure", "zcdp"] = "pure"
    # What one user may lose across all statistics of this pipeline (basic composition,
    # operators.accounting): under pure accounting.
    total_epsilon: float | None = Field(None, gt=0)
    # Under zcdp: the rho one user may lose, and the delta at which the statement also
    # says the (epsilon, delta)-DP it implies (DEFAULT_DELTA when not given).
    total_rho: float | None = Field(None, gt=0)
    delta: float | None = Field(None, gt=0, lt=1)
    neighbours: Neighbours = Neighbours.whole_user
    # True: who sent how many events when is public and only values are protected (the
    # continual mean of George et al., per-cell means with counts_public). Such a pipeline
    # holds only statistics of that relation, and every release says so
    # (docs/security.md). False (default): a mean is the whole-user mean.
    public_counts: bool = False
    # What one user may lose across every pipeline (app id) of the ledger topic that
    # reads one of this pipeline's source topics: checked at worker start against their
    # latest statements (pipeline/worker/ledger.py). None: their sum is logged as a warning.
    cross_pipeline_epsilon: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _accounting_fields(self) -> PrivacyConfig:
        """Each accounting's own budget fields, and none of the other's."""
        if self.accounting == "pure":
            for name in ("total_rho", "delta"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: applies only with accounting: zcdp")
            if self.total_epsilon is None:
                raise ValueError("total_epsilon: required (total_rho with accounting: zcdp)")
            return self
        for name in ("total_epsilon", "cross_pipeline_epsilon"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{name}: does not apply with accounting: zcdp, whose budget is "
                    "total_rho (the statement states the (epsilon, delta) it implies)"
                )
        if self.total_rho is None:
            raise ValueError("total_rho: required with accounting: zcdp")
        return self

    @property
    def stated_total_epsilon(self) -> float:
        """The total a statement states in epsilon: ``total_epsilon``, or under zcdp the
        epsilon ``total_rho`` implies at ``stated_delta`` (``accounting.implied_epsilon``)."""
        if self.total_rho is None:
            assert self.total_epsilon is not None
            return self.total_epsilon
        rho = Fraction(repr(self.total_rho))
        return float(accounting.implied_epsilon(rho, self.stated_delta))

    @property
    def stated_delta(self) -> float:
        """The delta of a zCDP statement's (epsilon, delta): ``delta`` or DEFAULT_DELTA."""
        return DEFAULT_DELTA if self.delta is None else self.delta


# The worker's Faust tables (pipeline/worker/app.py); Faust names their changelogs
# <app_id>-<table>-changelog.
FAUST_TABLES = ("stage1", "stage2")


class PipelineConfig(_Model):
    app_id: str = "dpstream"
    input: InputConfig = InputConfig()
    ticks: TickConfig = TickConfig()
    outputs: OutputConfig = OutputConfig()
    noise: NoiseConfig = NoiseConfig()
    kafka: KafkaSecurityConfig = KafkaSecurityConfig()
    metrics: MetricsConfig = MetricsConfig()
    privacy: PrivacyConfig
    statistics: list[StatisticConfig] = Field(min_length=1)

    _app_id = field_validator("app_id")(_identifier)

    @model_validator(mode="after")
    def _budget_and_names(self) -> PipelineConfig:
        names = [s.name for s in self.statistics]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"statistics[{i}].name: duplicate statistic name {name!r}")
        self._check_mean_modes()
        self._check_accounting()
        try:
            self.privacy_statement()
        except StatementError as exc:
            raise ValueError(str(exc)) from None
        return self

    def _check_mean_modes(self) -> None:
        """The fields of George et al.'s mean have no meaning for the whole-user mean: a
        config that sets them expects a cap that would not hold, so it is refused."""
        for i, stat in enumerate(self.statistics):
            mean = stat.mean
            if mean is None:
                continue
            if self.privacy.public_counts and mean.max_users is None:
                raise ValueError(
                    f"statistics[{i}].mean.max_users: required with privacy.public_counts: "
                    "true (George et al.'s cap on users)"
                )
            if not self.privacy.public_counts:
                for name in ("max_users", "delta"):
                    if name in mean.model_fields_set:
                        raise ValueError(
                            f"statistics[{i}].mean.{name}: applies only with "
                            "privacy.public_counts: true (George et al.'s continual mean); "
                            "the whole-user mean bounds each user by max_samples_per_user "
                            "alone and its noise does not depend on the number of users"
                        )

    def _check_accounting(self) -> None:
        """Every statistic in the pipeline's accounting: its budget field, and under zcdp
        only what the square-root factorization counter runs (a fixed-tau count or sum)."""
        zcdp = self.privacy.accounting == "zcdp"
        for i, stat in enumerate(self.statistics):
            at = f"statistics[{i}]"
            if not zcdp:
                if stat.rho is not None:
                    raise ValueError(f"{at}.rho: applies only with privacy.accounting: zcdp")
                if stat.mechanism == "sqrt_factorization":
                    raise ValueError(
                        f"{at}.mechanism: sqrt_factorization (Gaussian noise) runs only with "
                        "privacy.accounting: zcdp"
                    )
                continue
            if stat.epsilon is not None:
                raise ValueError(
                    f"{at}.epsilon: does not apply with privacy.accounting: zcdp; give rho"
                )
            if not KINDS[stat.kind].zcdp:
                zcdp_kinds = " and ".join(_kinds_with(lambda p: p.zcdp))
                raise ValueError(
                    f"{at}.kind: {stat.kind} has no zCDP mechanism; privacy.accounting: zcdp "
                    f"runs {zcdp_kinds} with a fixed tau (the square-root factorization)"
                )
            if stat.user_level:
                raise ValueError(
                    f"{at}.tau: privacy.accounting: zcdp needs a fixed tau: tau: auto's "
                    "tracker and instances (Dong-Luo-Yi Alg. 5) are pure-DP mechanisms"
                )
            if stat.mechanism not in (None, "auto", "sqrt_factorization"):
                raise ValueError(
                    f"{at}.mechanism: {stat.mechanism} adds Laplace noise (pure DP); "
                    "privacy.accounting: zcdp runs sqrt_factorization"
                )

    @model_validator(mode="after")
    def _topics_apart(self) -> PipelineConfig:
        """Every topic the pipeline reads or writes is a legal Kafka topic name and is no
        other's, not even after Kafka's '.' to '_' (the broker refuses to create a topic
        that collides so with one it has): two of them in one topic would crash the
        worker at start or mix records that must stay apart."""
        seen: dict[str, tuple[str, str, str]] = {}
        for field, what, topic in self.named_topics():
            try:
                _topic_name(topic)
            except ValueError as exc:
                raise ValueError(f"{field}: {what} {topic!r}: {exc}") from None
            clash = seen.get(topic.replace(".", "_"))
            if clash is not None:
                other_field, other_what, other = clash
                if other == topic:
                    raise ValueError(
                        f"{field}: {what} {topic!r} is also {other_what} ({other_field})"
                    )
                raise ValueError(
                    f"{field}: {what} {topic!r} collides with {other_what} {other!r} "
                    f"({other_field}): Kafka takes '.' for '_' when it compares topic names "
                    "and refuses to create the second"
                )
            seen[topic.replace(".", "_")] = (field, what, topic)
        for i, topic in enumerate(self.input.topics):
            if topic.startswith(f"{self.app_id}-"):
                raise ValueError(
                    f"input.topics[{i}]: the source topic {topic!r} starts with "
                    f"'{self.app_id}-', the prefix of dpstream's own topics (app_id): their "
                    "prefixed ACL would let the worker write it (docs/security.md)"
                )
        return self

    def named_topics(self) -> list[tuple[str, str, str]]:
        """Every topic of the pipeline as (config field naming it, what it is, name):
        dpstream's own under ``<app_id>-`` (the events and stage-2 topics, Faust's
        changelogs and leader topic), the dead-letter and ledger topics, each statistic's
        release topic, the sources."""
        own = [
            ("events topic", self.events_topic),
            ("stage-2 topic", self.stage2_topic),
            *(("Faust changelog", topic) for topic in self.changelog_topics),
            ("Faust leader topic", self.leader_topic),
        ]
        prefix = self.outputs.release_topic_prefix
        return [
            *(("app_id", f"dpstream's {what}", topic) for what, topic in own),
            ("outputs.dead_letter_topic", "the dead-letter topic", self.outputs.dead_letter_topic),
            ("outputs.ledger_topic", "the ledger topic", self.outputs.ledger_topic),
            *(
                (
                    f"statistics[{i}].name",
                    f"the release topic (outputs.release_topic_prefix {prefix!r} + name)",
                    self.release_topic(s.name),
                )
                for i, s in enumerate(self.statistics)
            ),
            *(
                (f"input.topics[{i}]", "the source topic", t)
                for i, t in enumerate(self.input.topics)
            ),
        ]

    def privacy_statement(self, retired: tuple = ()) -> PrivacyStatement:
        """The pipeline's privacy statement (operators.accounting); ``retired``: charges of
        statistics this app id ran before and no longer runs."""
        privacy = self.privacy
        zcdp = privacy.accounting == "zcdp"
        return accounting.statement(
            self.app_id,
            [s.terms(privacy.public_counts) for s in self.statistics],
            privacy.neighbours.value,
            privacy.public_counts,
            None if privacy.total_epsilon is None else Fraction(repr(privacy.total_epsilon)),
            retired,
            total_rho=None if privacy.total_rho is None else Fraction(repr(privacy.total_rho)),
            delta=privacy.stated_delta if zcdp else None,
        )

    def release_topic(self, statistic: str) -> str:
        return f"{self.outputs.release_topic_prefix}{statistic}"

    @property
    def events_topic(self) -> str:
        """dpstream's own topic of validated events, partitioned by user (ingest.py)."""
        return f"{self.app_id}-events"

    @property
    def stage2_topic(self) -> str:
        return f"{self.app_id}-stage2"

    @property
    def changelog_topics(self) -> list[str]:
        """The changelogs of the worker's Faust tables (``FAUST_TABLES``)."""
        return [f"{self.app_id}-{table}-changelog" for table in FAUST_TABLES]

    @property
    def leader_topic(self) -> str:
        """Faust's leader-election topic (one partition; its holder runs the public clock)."""
        return f"{self.app_id}-__assignor-__leader"


def _field_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


_STATISTIC_AT = re.compile(r"^statistics\[(\d+)\]")


def _named(line: str, data: object) -> str:
    """``statistics[2].epsilon: ...`` as ``statistics[2] (revenue).epsilon: ...`` where the
    document names that statistic: a user thinks of statistics by name, not position, and
    the position stays for the ones a name cannot find (a duplicate, a missing name)."""
    at = _STATISTIC_AT.match(line)
    stats = data.get("statistics") if isinstance(data, dict) else None
    if at is None or not isinstance(stats, list) or int(at.group(1)) >= len(stats):
        return line
    stat = stats[int(at.group(1))]
    name = stat.get("name") if isinstance(stat, dict) else None
    if not isinstance(name, str) or not name or line[at.end() :].startswith(".name"):
        return line  # no name, or the name is what is wrong
    if f"'{name}'" in line:  # the message names it already
        return line
    return f"{at.group(0)} ({name}){line[at.end() :]}"


def parse_config(data: object, source: str = "<config>") -> PipelineConfig:
    """Validate a decoded YAML document; raise ConfigError naming the offending field."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            field = _field_path(err["loc"])
            # Model-level checks start their message with the field they are about.
            inner = re.match(r"^(\w+(?:\.\w+)*): ", msg)
            if not err["loc"]:
                lines.append(_named(msg, data))
            elif inner and err["type"] == "value_error":
                lines.append(_named(f"{field}.{msg}", data))
            else:
                lines.append(_named(f"{field}: {msg}", data))
        raise ConfigError(f"{source}: invalid config:\n  " + "\n  ".join(lines)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a YAML pipeline definition."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))
