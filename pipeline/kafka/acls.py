"""The Kafka ACLs a pipeline needs, least privilege, in one list: what docs/security.md
shows as ``kafka-acls`` commands, what ``dpstream acls`` prints (and ``--apply`` runs on the
local secured broker), and what the tests grant before they run a pipeline under them.

Three principals: the **worker** (the worker with its ingest, and ``export-log``, ``lag``),
a **reader** of the releases (``dpstream tail``, downstream consumers) and a **producer**
of the source topics (``dpstream produce``, the users' producers). dpstream's own topics
and consumer groups all start with ``<app_id>-`` (``pipeline/topics.py``), so one prefixed
ACL of each kind covers them; the topics a config names (sources, releases, dead letters,
ledger) are granted by name. No transactional id: dpstream's producers are idempotent, not
transactional, and an idempotent producer needs no cluster right where it may write a
topic (KIP-679).
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dpstream.config.schema import PipelineConfig

from .topics import group_id

Resource = Literal["topic", "group"]


@dataclass(frozen=True)
class Grant:
    """One ``kafka-acls --add``: ``operations`` on ``names`` (literal, or prefixes).

    Attributes:
        why: What needs it (a comment above the command).
        resource: ``topic`` or ``group``.
        names: The topic or group names, or their prefixes.
        operations: Kafka's operation names (``Read``, ``Write``, ``Describe``, ...).
        prefixed: Whether ``names`` are prefixes (``--resource-pattern-type prefixed``).
    """

    why: str
    resource: Resource
    names: tuple[str, ...]
    operations: tuple[str, ...]
    prefixed: bool = False


@dataclass(frozen=True)
class Principals:
    """Who gets which grants (``User:<name>``); a role left out is not granted."""

    worker: str = "User:dpstream"
    reader: str | None = None
    producer: str | None = None


def worker_grants(cfg: PipelineConfig) -> tuple[Grant, ...]:
    """What the worker, its ingest, ``export-log`` and ``lag`` need."""
    own = f"{cfg.app_id}-"
    outputs = tuple(cfg.release_topic(s.name) for s in cfg.statistics)
    return (
        Grant(
            "the ingest reads the source topics (and `lag` their ends): read only",
            "topic",
            tuple(cfg.input.topics),
            ("Read", "Describe"),
        ),
        Grant(
            "dpstream's own topics (events, stage 2, the changelogs, Faust's leader topic): "
            "created at the first start, their timestamp type checked at every start, then "
            "written and read",
            "topic",
            (own,),
            ("Read", "Write", "Describe", "Create", "DescribeConfigs"),
            prefixed=True,
        ),
        Grant(
            f"dpstream's consumer groups: {group_id(cfg.app_id, 'worker')}, "
            f"{group_id(cfg.app_id, 'ingest')}, {group_id(cfg.app_id, 'tools')}",
            "group",
            (own,),
            ("Read", "Describe"),
            prefixed=True,
        ),
        Grant(
            "the release topics: created at the first start, their timestamp type checked "
            "at every start, then written",
            "topic",
            outputs,
            ("Write", "Describe", "Create", "DescribeConfigs"),
        ),
        Grant(
            "the dead-letter topic: created at the first start, then written",
            "topic",
            (cfg.outputs.dead_letter_topic,),
            ("Write", "Describe", "Create"),
        ),
        Grant(
            "the ledger: its retention, cleanup policy and timestamp type checked and its "
            "statements read back at start, created at the first start, then written",
            "topic",
            (cfg.outputs.ledger_topic,),
            ("Read", "Write", "Describe", "Create", "DescribeConfigs"),
        ),
    )


def reader_grants(cfg: PipelineConfig) -> tuple[Grant, ...]:
    """What a reader of the releases and the ledger needs (``dpstream tail`` included)."""
    return (
        Grant(
            "the releases and the ledger: public, read only",
            "topic",
            (*(cfg.release_topic(s.name) for s in cfg.statistics), cfg.outputs.ledger_topic),
            ("Read", "Describe"),
        ),
        Grant(
            "`dpstream tail`'s groups, <app_id>-tail-<statistic>",
            "group",
            (group_id(cfg.app_id, "tail-"),),
            ("Read", "Describe"),
            prefixed=True,
        ),
    )


def producer_grants(cfg: PipelineConfig) -> tuple[Grant, ...]:
    """What a producer of the source topics needs (``dpstream produce``)."""
    return (
        Grant(
            "the source topics: written by the users' producers",
            "topic",
            tuple(cfg.input.topics),
            ("Write", "Describe"),
        ),
    )


def grants(cfg: PipelineConfig, principals: Principals) -> list[tuple[str, Grant]]:
    """(principal, grant) for every role ``principals`` names."""
    roles = (
        (principals.worker, worker_grants),
        (principals.reader, reader_grants),
        (principals.producer, producer_grants),
    )
    return [(who, grant) for who, of in roles if who is not None for grant in of(cfg)]


def kafka_acls_args(principal: str, grant: Grant) -> list[str]:
    """The arguments of ``kafka-acls`` that add ``grant`` for ``principal`` (after the
    connection options ``--bootstrap-server`` and ``--command-config``)."""
    args = ["--add", "--allow-principal", principal]
    if grant.prefixed:
        args += ["--resource-pattern-type", "prefixed"]
    for operation in grant.operations:
        args += ["--operation", operation]
    for name in grant.names:
        args += [f"--{grant.resource}", name]
    return args


def script(
    cfg: PipelineConfig,
    principals: Principals,
    bootstrap: str = '"$KAFKA_BOOTSTRAP_SERVERS"',
    command_config: str = "admin.properties",
) -> str:
    """The ``kafka-acls`` commands for ``cfg``, one per grant with a comment saying why,
    as a shell script (``bootstrap`` and ``command_config`` are written as given)."""
    lines = [f"# The ACLs of pipeline {cfg.app_id} (dpstream acls --config ...)"]
    for principal, grant in grants(cfg, principals):
        args = kafka_acls_args(principal, grant)
        first_operation = args.index("--operation")
        first_name = args.index(f"--{grant.resource}")
        lines += textwrap.wrap(
            f"{principal}: {grant.why}", 88, initial_indent="# ", subsequent_indent="#   "
        )
        lines += [
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config {command_config} \\",
            f"  {_shell(args[:first_operation])} \\",
            f"  {_shell(args[first_operation:first_name])} \\",
            f"  {_shell(args[first_name:])}",
        ]
    return "\n".join(lines) + "\n"


def _shell(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def bindings(cfg: PipelineConfig, principals: Principals) -> list:
    """The same ACLs as confluent-kafka ``AclBinding``\\ s (``AdminClient.create_acls``)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    out = []
    for principal, grant in grants(cfg, principals):
        pattern = ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL
        for name in grant.names:
            for operation in grant.operations:
                out.append(
                    AclBinding(
                        ResourceType[grant.resource.upper()],
                        name,
                        pattern,
                        principal,
                        "*",
                        AclOperation[_upper_snake(operation)],
                        AclPermissionType.ALLOW,
                    )
                )
    return out


def _upper_snake(operation: str) -> str:
    """``DescribeConfigs`` -> ``DESCRIBE_CONFIGS`` (confluent-kafka's enum names)."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()


def all_args(cfg: PipelineConfig, principals: Principals) -> Sequence[list[str]]:
    """Every command's ``kafka-acls`` arguments, in :func:`script`'s order."""
    return [kafka_acls_args(principal, grant) for principal, grant in grants(cfg, principals)]
