"""``dpstream replay`` (pipeline/tools/replay.py): an exported log's header gives the runs, and a
keyed replay is refused on any log that is not one the pipeline exported with its key."""

from __future__ import annotations

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.stages.stage2_state import StatisticRun
from dpstream.pipeline.tools.export import LOG_MAC, ran_as
from dpstream.pipeline.tools.replay import LogNotVerified, replay, replay_file
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.pipeline.worker.ledger import LOG_HEADER
from dpstream.statistics.identity import identity_parameters
from dpstream.statistics.registry import with_mechanisms
from tests.config_builders import production

KEY = PipelineKey.from_key(bytes(range(32)))


def exported(lines: list[bytes], key: PipelineKey | None) -> list[bytes]:
    header = {LOG_HEADER: 1, "app_id": "prod", "runs": {"events": {"run_id": "r1"}}}
    body = [orjson.dumps(header), *lines]
    if key is None:
        return body
    mac = key.log_mac()
    for line in body:
        mac.update(line)
    return [*body, orjson.dumps({LOG_MAC: mac.hexdigest()})]


EVENTS = [orjson.dumps({"user_id": f"u{i % 3}"}) for i in range(7)] + [b'{"tick": 100}']


def write(tmp_path, lines: list[bytes]) -> str:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


ZCDP = {"privacy": {"accounting": "zcdp", "total_rho": 0.5}}
ZCDP_STATISTICS = [{"name": "events", "kind": "count", "rho": 0.5, "tau": 8}]


@pytest.mark.parametrize(
    "data",
    [production(), {**production(privacy=ZCDP["privacy"]), "statistics": ZCDP_STATISTICS}],
    ids=["pure", "zcdp"],
)
def test_a_keyed_replay_of_the_pipeline_s_own_log_runs_under_its_runs(tmp_path, data):
    cfg = parse_config(data)
    (line,) = replay_file(cfg, write(tmp_path, exported(EVENTS, KEY)), KEY)
    release = orjson.loads(line)
    assert release["tick"] == 100 and release["step"] == 1
    assert release["accounting"] == ("zcdp" if cfg.statistics[0].zcdp else "pure_dp")
    # The header's run: the same release as a replay told the run explicitly.
    (direct,) = replay(cfg, EVENTS, KEY.noise, runs={"events": StatisticRun("r1", None)})
    assert release == direct


@pytest.mark.parametrize(
    "lines",
    [
        exported(EVENTS, None),  # exported without the key: no trailer
        exported(EVENTS, KEY)[:1] + EVENTS[1:] + exported(EVENTS, KEY)[-1:],  # an event dropped
        EVENTS,  # a hand-written log
    ],
    ids=["no-trailer", "edited", "hand-written"],
)
def test_a_keyed_replay_of_any_other_log_is_refused(tmp_path, lines):
    cfg = parse_config(production())
    path = write(tmp_path, lines)
    with pytest.raises(LogNotVerified, match="as sensitive as the key"):
        list(replay_file(cfg, path, KEY))
    assert list(replay_file(cfg, path, KEY, unverified=True))  # explicitly allowed


def test_zero_noise_replays_anything(tmp_path):
    cfg = parse_config(production(noise={"mode": "insecure_zero"}))
    (line,) = replay_file(cfg, write(tmp_path, EVENTS), PipelineKey.insecure_zero())
    assert orjson.loads(line)["value"] == 7  # seven events of three users, tau 8


def test_replay_runs_a_statistic_that_names_no_mechanism_on_the_tree_the_pipeline_ran():
    # The exported log's header says which tree each statistic ran (export.log_header):
    # one that ran before the default changed replays on the binary tree; a log without
    # a header (or a statistic it does not name) on a new statistic's default.
    cfg = parse_config({**production(), "noise": {"mode": "insecure_zero"}})
    assert cfg.statistics[0].mechanism is None
    ran = {"events": {"mechanism": "binary", "k": None}}
    header = orjson.dumps({LOG_HEADER: 1, "app_id": cfg.app_id, "runs": {}, "mechanisms": ran})
    old = list(replay(cfg, [header, *EVENTS], ZeroNoise()))
    new = list(replay(cfg, EVENTS, ZeroNoise()))
    assert [r["tree"] for r in old] == [{"name": "binary", "k": 2}]
    assert [r["tree"] for r in new] == [{"name": "kary_subtract", "k": 13}]
    assert old[0]["value"] == new[0]["value"] == 7  # the same exact count either way


def test_replay_runs_a_tau_auto_statistic_with_the_tracker_tuning_the_pipeline_ran():
    # The header carries what the ledger recorded (export.ran_as): a statistic that ran
    # before the tuning existed recorded none and replays with Alg. 5's tracker (tau_1 64),
    # a new one with the tuning it recorded (tau_1 256), as does a log without a header.
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 1.0},
            "statistics": [{"name": "events", "epsilon": 1.0}],
        }
    )
    fresh = with_mechanisms(cfg, {})
    recorded = identity_parameters(fresh.statistics[0], fresh)["statistic"]
    assert recorded["tracker_share"] == 0.25 and recorded["tau_start"] == 256

    def replayed(ran):
        header = {LOG_HEADER: 1, "app_id": cfg.app_id, "runs": {}, "mechanisms": ran}
        return [r["tau"] for r in replay(cfg, [orjson.dumps(header), *EVENTS], ZeroNoise())]

    assert replayed({"events": ran_as({"mechanism": "binary"})}) == [64]
    assert replayed({"events": ran_as(recorded)}) == [256]
    assert [r["tau"] for r in replay(cfg, EVENTS, ZeroNoise())] == [256]
