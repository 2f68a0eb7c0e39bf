"""pipeline/tools/synthetic.py: the synthetic events put the user id where the config
reads it (``input.user_id_field``), so ``dpstream produce --synthetic-users`` feeds a
pipeline with a nested user id."""

from __future__ import annotations

from dpstream.config.schema import parse_config
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.pipeline.wire.records import limits_for, parse_event
from tests.config_builders import minimal


def test_the_user_id_goes_at_the_configured_dotted_path():
    cfg = parse_config(minimal(input__user_id_field="actor.id"))
    flat = list(synthetic_events(20, 50, seed=3))
    nested = list(synthetic_events(20, 50, seed=3, user_id_field="actor.id"))
    assert [
        {"actor": {"id": e["user_id"]}, "key": e["key"], "value": e["value"]} for e in flat
    ] == nested
    users = [parse_event(e, limits_for(cfg)).user_id for e in nested]
    assert users == [e["user_id"] for e in flat]  # the ingest reads the same users
