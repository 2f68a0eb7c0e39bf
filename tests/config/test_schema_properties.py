"""Configs that cannot crash the worker (issue 27 item 5), as a property: any generated
config (tests/config_strategies.py) is either refused by ``parse_config`` and by
``dpstream check-config`` with a message that names a field, or everything the worker
builds from it without a broker is built (check-config's report, the topic plan, the Faust
app) and a replay of a few ticks (the worker's drivers) releases every statistic.
tests/integration/test_configs.py starts the real worker on a few of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.kafka.topics import group_id, topic_plan
from dpstream.pipeline.tools import cli
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.app import create_app
from dpstream.pipeline.worker.keys import PipelineKey
from tests.config_builders import minimal
from tests.config_strategies import FIRST_TICK, config_documents, synthetic_log

# A line of a refusal: a config field (``statistics[0] (views).cells.epoch_cap``,
# ``app_id``) and what is wrong with it.
FIELD_LINE = re.compile(r"^  [a-z_]+(\[\d+\]( \([\w.-]+\))?)?(\.[a-z_]+(\[\d+\])?)*: \S")
KEY = PipelineKey.insecure_zero()
LOG = synthetic_log()


def assert_names_a_field(message: str) -> None:
    header, *lines = message.splitlines()
    assert header.endswith("invalid config:"), message
    assert lines and all(FIELD_LINE.match(line) for line in lines), message


def assert_topics_apart(cfg: PipelineConfig) -> None:
    """An oracle of its own for the static checks: every topic the worker makes or reads
    is one of a kind, also after Kafka's '.' to '_', and so is every consumer group."""
    written = topic_plan(cfg)
    named = [*written, *cfg.input.topics]
    assert len(written) == 7 + len(cfg.statistics), written  # none shares a name
    assert len({t.replace(".", "_") for t in named}) == len(named), named
    assert all(len(t) <= 249 and t not in (".", "..") for t in named)
    roles = ["worker", "ingest", "tools", *(f"tail-{s.name}" for s in cfg.statistics)]
    groups = [cfg.app_id, *(group_id(cfg.app_id, role) for role in roles)]
    assert len(set(groups)) == len(groups)


def check_config(data: dict, tmp_path: Path) -> int:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return cli.main(["check-config", str(path)])


@settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=config_documents())
def test_a_config_is_refused_naming_a_field_or_the_worker_s_parts_build_and_release(
    data: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    try:
        cfg = parse_config(data)
    except ConfigError as exc:
        event(f"refused: {str(exc).splitlines()[1].split(':')[0]}")
        assert_names_a_field(str(exc))
        assert check_config(data, tmp_path) == 2
        assert_names_a_field(capsys.readouterr().err.removeprefix("dpstream: config error: "))
        return
    event("accepted")
    assert check_config(data, tmp_path) == 0, capsys.readouterr().err
    assert_topics_apart(cfg)
    app = create_app(cfg, "127.0.0.1:9", KEY, tmp_path)
    # The names the checks compare are those Faust makes (its leader topic: a private name).
    changelogs = sorted(table.changelog_topic.get_topic_name() for table in app.tables.values())
    assert changelogs == sorted(cfg.changelog_topics)
    assert app._leader_assignor._leader_topic_name == cfg.leader_topic
    releases = list(replay(cfg, LOG, KEY.noise))
    released = {r["statistic"] for r in releases if r["tick"] >= FIRST_TICK}
    assert released == {s.name for s in cfg.statistics}


def test_the_oracle_sees_a_collision_the_checks_would_refuse():
    # The property's own oracle is no tautology: a config built past the checks fails it.
    cfg = parse_config(minimal())
    release = cfg.release_topic("events")
    assert_topics_apart(cfg)
    clashing = cfg.model_copy(
        update={"outputs": cfg.outputs.model_copy(update={"ledger_topic": release})}
    )
    with pytest.raises(AssertionError):
        assert_topics_apart(clashing)
