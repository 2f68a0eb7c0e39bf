"""pipeline/acls.py: the ACLs docs/security.md lists are the ones `dpstream acls` prints
and the tests grant, and they cover every name dpstream uses and nothing of the sources
but reading. (Applied on a real secured broker: tests/integration/test_secure.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from dpstream.config.schema import load_config, parse_config
from dpstream.pipeline.kafka import acls
from dpstream.pipeline.kafka.acls import Principals, bindings, grants, script, worker_grants
from dpstream.pipeline.kafka.topics import group_id, topic_plan
from dpstream.pipeline.tools.cli import main

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "config" / "demo.yaml"
LOCAL = Principals("User:dpstream", "User:reader", "User:producer")

CFG = parse_config(
    {
        "app_id": "prod",
        "input": {"topics": ["clicks", "views"]},
        "outputs": {"dead_letter_topic": "ops.dead", "ledger_topic": "ops.ledger"},
        "privacy": {"total_epsilon": 2.0},
        "statistics": [{"name": "a", "epsilon": 1.0, "tau": 2}, {"name": "b", "epsilon": 1.0}],
    }
)


def test_the_docs_list_what_dpstream_acls_prints_for_the_demo(capsys):
    text = (ROOT / "docs" / "security.md").read_text()
    block = re.search(r"<!-- dpstream acls --config config/demo.yaml.*?```sh\n(.*?)```", text, re.S)
    assert block is not None
    assert block.group(1) == script(load_config(DEMO), LOCAL)
    assert main(["acls", "--config", str(DEMO)]) == 0
    assert capsys.readouterr().out == block.group(1)


def allowed(principal: str, resource: str, name: str) -> set[str]:
    """The operations ``grants`` allow ``principal`` on a topic or group, as Kafka matches
    ACLs (a literal name, or a prefix of it)."""
    out: set[str] = set()
    for who, grant in grants(CFG, LOCAL):
        if who != principal or grant.resource != resource:
            continue
        if any(name.startswith(n) if grant.prefixed else name == n for n in grant.names):
            out |= set(grant.operations)
    return out


def test_the_worker_may_only_read_the_sources():
    for source in CFG.input.topics:
        assert allowed("User:dpstream", "topic", source) == {"Read", "Describe"}
    assert allowed("User:producer", "topic", "clicks") == {"Write", "Describe"}
    assert allowed("User:reader", "topic", "clicks") == set()


def test_every_topic_and_group_of_the_worker_is_covered():
    for topic in topic_plan(CFG):
        assert {"Write", "Describe"} <= allowed("User:dpstream", "topic", topic), topic
    for topic in (CFG.events_topic, CFG.stage2_topic, CFG.outputs.ledger_topic):
        assert "Read" in allowed("User:dpstream", "topic", topic), topic
    for role in ("worker", "ingest", "tools"):
        assert allowed("User:dpstream", "group", group_id("prod", role)) == {"Read", "Describe"}
    # Faust's default group, the app id, is not covered: the worker's is prod-worker.
    assert allowed("User:dpstream", "group", "prod") == set()
    # No prefix that covers another app's names ("prod2-...") or a source.
    prefixes = [n for g in worker_grants(CFG) if g.prefixed for n in g.names]
    assert prefixes == ["prod-", "prod-"]


def test_a_reader_reads_the_releases_and_the_ledger_in_tails_groups_only():
    for topic in (CFG.release_topic("a"), CFG.release_topic("b"), "ops.ledger"):
        assert allowed("User:reader", "topic", topic) == {"Read", "Describe"}
    assert allowed("User:reader", "topic", CFG.events_topic) == set()
    assert allowed("User:reader", "topic", "ops.dead") == set()  # user ids: operators only
    assert allowed("User:reader", "group", group_id("prod", "tail-a")) == {"Read", "Describe"}
    assert allowed("User:reader", "group", group_id("prod", "worker")) == set()


def test_the_admin_client_grants_are_the_same_list():
    from_bindings = {
        (
            b.principal,
            b.restype.name.lower(),
            b.name,
            b.resource_pattern_type == ResourcePatternType.PREFIXED,
            b.operation,
        )
        for b in bindings(CFG, LOCAL)
    }
    from_commands = set()
    for args in acls.all_args(CFG, LOCAL):
        principal = args[args.index("--allow-principal") + 1]
        prefixed = "--resource-pattern-type" in args
        operations = [args[i + 1] for i, a in enumerate(args) if a == "--operation"]
        for i, a in enumerate(args):
            if a in ("--topic", "--group"):
                for operation in operations:
                    upper = re.sub(r"(?<!^)([A-Z])", r"_\1", operation).upper()
                    from_commands.add(
                        (principal, a[2:], args[i + 1], prefixed, AclOperation[upper])
                    )
    assert from_bindings == from_commands
    assert {b.restype for b in bindings(CFG, LOCAL)} == {ResourceType.TOPIC, ResourceType.GROUP}
