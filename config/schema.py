"""Pipeline definitions: YAML loaded once into frozen, validated models.

A bad config stops the program at start with a message that names the field
(``statistics[0].epsilon: ...``). Legal but unusual values log a warning.
"""

from __future__ import annotations

import logging
import re
from enum import StrEnum
from fractions import Fraction
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dpstream.operators import accounting
from dpstream.operators.accounting import PrivacyStatement, StatementError

from .base import ConfigError, Model, env_name, identifier, topic_name
from .kafka import KafkaSecurityConfig, SchemaRegistryConfig
from .statistic import DEFAULT_DELTA, KINDS, Neighbours, StatisticConfig, kinds_with

log = logging.getLogger(__name__)

InputFormat = Literal["json", "avro", "protobuf", "json_schema"]
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


class InputConfig(Model):
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
                topic_name(topic)
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


class TickConfig(Model):
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


class OutputConfig(Model):
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

    _topics = field_validator("dead_letter_topic", "ledger_topic")(topic_name)

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


class MetricsConfig(Model):
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


class NoiseConfig(Model):
    """Where keyed noise's key comes from: ``key_file``, else the environment variable
    ``key_env`` (read by the worker at start, pipeline/worker/keys.py)."""

    mode: NoiseMode = NoiseMode.keyed
    key_file: Path | None = None
    key_env: str | None = "DPSTREAM_NOISE_KEY"

    _key_env = field_validator("key_env")(env_name)

    @model_validator(mode="after")
    def _key_source(self) -> NoiseConfig:
        # Found here, not at the worker's start: whether the key is there is the
        # environment's, but a keyed config that names no place for it never runs.
        if self.mode is NoiseMode.keyed and self.key_file is None and not self.key_env:
            raise ValueError("key_env: keyed mode needs noise.key_file or noise.key_env")
        return self


class PrivacyConfig(Model):
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


class PipelineConfig(Model):
    app_id: str = "dpstream"
    input: InputConfig = InputConfig()
    ticks: TickConfig = TickConfig()
    outputs: OutputConfig = OutputConfig()
    noise: NoiseConfig = NoiseConfig()
    kafka: KafkaSecurityConfig = KafkaSecurityConfig()
    metrics: MetricsConfig = MetricsConfig()
    privacy: PrivacyConfig
    statistics: list[StatisticConfig] = Field(min_length=1)

    _app_id = field_validator("app_id")(identifier)

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
                zcdp_kinds = " and ".join(kinds_with(lambda p: p.zcdp))
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
                topic_name(topic)
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
