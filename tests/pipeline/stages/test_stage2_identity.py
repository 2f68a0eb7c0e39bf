"""Stage 2 (pipeline/stages/stage1.py) binds the noise to a statistic's full identity (the
pipeline, the statistic, its parameters' fingerprint, its run, its start tick) and refuses
state made with other parameters, under another run or key, a state gone after its run
released, and a stage-1 partition whose state began again; exact counts appear only under
a public-counts statement."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import orjson
import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.pipeline.stages.stage2 import Stage2, StatisticChanged
from dpstream.pipeline.stages.stage2_state import OFFLINE_RUN, Stage2State, StatisticRun
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics.contract import Report
from tests.config_builders import production

KEY = hashlib.sha256(b"one key for every pipeline").digest()


def log(seed: int, ticks: int = 30, first_tick: int = 1000) -> list[bytes]:
    rng = random.Random(seed)
    lines = []
    for t in range(ticks):
        for _ in range(rng.randrange(0, 12)):
            lines.append(orjson.dumps({"user_id": f"u{rng.randrange(20)}"}))
        lines.append(orjson.dumps({"tick": first_tick + t}))
    return lines


def values(data: dict, lines: list[bytes], noise) -> list[int]:
    return [r["value"] for r in replay(parse_config(data), lines, noise)]


def test_two_pipelines_under_one_key_share_no_noise():
    # The review's reproduction: "prod" and "staging", same key, same statistic name,
    # different data. Before, the difference of their releases was the exact difference
    # of their data at every tick.
    prod_log, staging_log = log(1), log(2)
    prod_noise, staging_noise = RecordingNoise(KeyedNoise(KEY)), RecordingNoise(KeyedNoise(KEY))
    prod = values(production(app_id="prod"), prod_log, prod_noise)
    staging = values(production(app_id="staging"), staging_log, staging_noise)
    exact_prod = values(production(app_id="prod"), prod_log, ZeroNoise())
    exact_staging = values(production(app_id="staging"), staging_log, ZeroNoise())
    nodes = {node for node, _, _ in prod_noise.calls}
    assert nodes and nodes.isdisjoint(node for node, _, _ in staging_noise.calls)
    same = sum(
        a - b == x - y for a, b, x, y in zip(prod, staging, exact_prod, exact_staging, strict=True)
    )
    # Independent noise of scale ~ 6 x 8 per level: an equal difference is rare (a few
    # percent of ticks by chance; the key is fixed, so this count is too).
    assert len(prod) == 30 and same <= 3


def test_a_statistic_started_later_or_with_other_parameters_draws_other_noise():
    lines = log(3)
    first = RecordingNoise(KeyedNoise(KEY))
    values(production(), lines, first)
    restarted = RecordingNoise(KeyedNoise(KEY))  # recreated from empty state, later start
    values(production(), log(3, first_tick=5000), restarted)
    retuned = RecordingNoise(KeyedNoise(KEY))  # the same name, another epsilon
    values(production(epsilon=0.5), lines, retuned)
    nodes = {node for node, _, _ in first.calls}
    assert nodes.isdisjoint(node for node, _, _ in restarted.calls)
    assert nodes.isdisjoint(node for node, _, _ in retuned.calls)
    # Every node carries the pipeline, the statistic, its fingerprint, run and start tick.
    app_id, name, fingerprint, run, start = next(iter(nodes))[:5]
    assert (app_id, name, run, start) == ("prod", "events", OFFLINE_RUN.run_id, 1000)
    assert len(fingerprint) == 32


def test_a_restart_from_stored_state_releases_what_an_uninterrupted_run_does():
    cfg = parse_config(production())
    reports = [Report("events", p, t, t, {"w": (t * 7 + p) % 5}) for t in range(50, 70)
               for p in (0, 1)]  # fmt: skip
    whole = Stage2(cfg, KeyedNoise(KEY), 2)
    state = Stage2.new_state()
    straight = [r for rep in reports for r in whole.on_report(state, rep)[0]]
    resumed, state = [], Stage2.new_state()
    for i, rep in enumerate(reports):
        if i % 7 == 0:  # a new worker: fresh objects, the state as stored (JSON)
            stage2 = Stage2(cfg, KeyedNoise(KEY), 2)
            state = Stage2State.from_json(orjson.loads(orjson.dumps(state.to_json())))
        resumed += stage2.on_report(state, rep)[0]
    assert straight == resumed and len(straight) == 20
    assert state.identity.start_tick == 50


def test_stage2_refuses_state_made_with_other_parameters():
    old, new = parse_config(production()), parse_config(production(epsilon=0.5))
    state = Stage2.new_state()
    Stage2(old, ZeroNoise(), 1).on_report(state, Report("events", 0, 7, 7, {"w": 1}))
    with pytest.raises(StatisticChanged, match=r"statistic.epsilon changed"):
        Stage2(new, ZeroNoise(), 1).on_report(state, Report("events", 0, 8, 8, {"w": 1}))


# --------------------------------------------------------------------- runs


def run_reports(first: int, last: int, partitions: int = 2) -> list[Report]:
    return [
        Report("events", p, t, t, {"w": (t * 7 + p) % 5}, born=first)
        for t in range(first, last)
        for p in range(partitions)
    ]


def releases_of(stage2: Stage2, state: Stage2State, reports: list[Report]) -> list[dict]:
    return [r for rep in reports for r in stage2.on_report(state, rep)[0]]


def test_two_runs_of_one_statistic_under_one_key_share_no_noise():
    # The review: the same app deployed twice (a second cluster, a recovery site), starting
    # in the same tick, shared noise on different data: A - B was exact(A) - exact(B).
    cfg = parse_config(production())
    a_reports = run_reports(50, 80)
    b_reports = [dataclasses.replace(r, weights={"w": r.weights["w"] + 1}) for r in a_reports]
    noisy, exact = {}, {}
    for run, reports in (("a", a_reports), ("b", b_reports)):
        runs = {"events": StatisticRun(run, "c0")}
        stage2 = Stage2(cfg, KeyedNoise(KEY), 2, runs)
        noisy[run] = [r["value"] for r in releases_of(stage2, Stage2.new_state(), reports)]
        zero = Stage2(cfg, ZeroNoise(), 2, runs)
        exact[run] = [r["value"] for r in releases_of(zero, Stage2.new_state(), reports)]
    same = sum(
        a - b == x - y
        for a, b, x, y in zip(noisy["a"], noisy["b"], exact["a"], exact["b"], strict=True)
    )
    assert len(noisy["a"]) == 30 and same <= 3  # by chance at a few percent of ticks


def test_a_state_gone_after_its_run_released_is_refused():
    # The review: a statistic recreated from empty state (its stage-2 changelog lost) began
    # at a later tick and drew fresh noise for the same data, uncharged.
    cfg = parse_config(production())
    runs = {"events": StatisticRun("r1", "c0", start_tick=50)}
    lost = Stage2(cfg, KeyedNoise(KEY), 2, runs)
    with pytest.raises(StatisticChanged, match=r"released from tick 50, but its state is gone"):
        releases_of(lost, Stage2.new_state(), run_reports(60, 62))
    # The same start (a crash before the first state was stored): the same releases.
    first = releases_of(
        Stage2(cfg, KeyedNoise(KEY), 2, runs), Stage2.new_state(), run_reports(50, 55)
    )
    again = releases_of(
        Stage2(cfg, KeyedNoise(KEY), 2, runs), Stage2.new_state(), run_reports(50, 55)
    )
    assert first == again and len(first) == 5


def test_a_state_of_another_run_or_key_is_refused_and_a_run_begun_anew_discards_it():
    cfg = parse_config(production())
    state = Stage2.new_state()
    old = {"events": StatisticRun("r1", "c0")}
    releases_of(Stage2(cfg, ZeroNoise(), 2, old), state, run_reports(50, 53))
    assert (state.identity.run_id, state.identity.key_commitment) == ("r1", "c0")
    later = run_reports(53, 55)
    other_run = {"events": StatisticRun("r2", "c0")}
    with pytest.raises(StatisticChanged, match=r"belongs to run r1, the ledger's run is r2"):
        releases_of(Stage2(cfg, ZeroNoise(), 2, other_run), state, later)
    other_key = {"events": StatisticRun("r1", "c1")}
    with pytest.raises(StatisticChanged, match=r"drawn under another noise key"):
        releases_of(Stage2(cfg, ZeroNoise(), 2, other_key), state, later)
    # Charged again: run r2 replaces r1; r1's state is discarded and r2 starts at 53.
    anew = {"events": StatisticRun("r2", "c0", replaces=frozenset({"r1"}))}
    out = releases_of(Stage2(cfg, ZeroNoise(), 2, anew), state, later)
    assert [r["tick"] for r in out] == [53, 54] and [r["step"] for r in out] == [1, 2]
    assert (state.identity.run_id, state.identity.start_tick) == ("r2", 53)


def test_a_stage1_partition_whose_state_began_again_is_refused():
    # A lost stage-1 changelog gives every user a fresh contribution bound inside trees
    # that already hold their contributions: stage 2 sees the partition's state born again.
    cfg = parse_config(production())
    stage2, state = Stage2(cfg, ZeroNoise(), 2), Stage2.new_state()
    releases_of(stage2, state, run_reports(50, 53))
    reborn = [Report("events", 1, 53, 53, {"w": 1}, born=53)]
    with pytest.raises(StatisticChanged, match=r"partition 1 lost its state \(it began at tick 50"):
        releases_of(stage2, state, reborn)


# --------------------------------------------------------------------- exact counts


def mean_and_count(public_counts: bool) -> dict:
    # The mean's caps: George et al.'s needs a cap on users, the whole-user mean refuses one.
    caps = {"max_users": 100} if public_counts else {}
    return {
        "input": {"partitions": 1},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 2.0, "public_counts": public_counts},
        "statistics": [
            {"name": "events", "epsilon": 1.0, "tau": 8},
            {
                "name": "latency",
                "kind": "mean",
                "epsilon": 1.0,
                "mean": {**caps, "max_samples_per_user": 8},
            },
        ],
    }


def test_george_et_al_mean_never_shares_a_total_with_a_count():
    # The review: with tau 8 and m = 8 George et al.'s exact "samples" was the count's
    # exact truncated value. A public-counts pipeline refuses the count.
    with pytest.raises(ConfigError, match=r"statistics\[0\]: 'events' \(count\) protects whole"):
        parse_config(mean_and_count(public_counts=True))
    # (The default mean beside a count: tests/statistics/test_whole_user_mean.py.)


def test_a_public_counts_pipeline_says_so_on_every_release():
    data = mean_and_count(public_counts=True)
    del data["statistics"][0]
    lines = [orjson.dumps({"user_id": f"u{i}", "value": 0.5}) for i in range(5)]
    lines.append(orjson.dumps({"tick": 3}))
    releases = list(replay(parse_config(data), lines, ZeroNoise()))
    assert releases and all(r["public_counts"] is True for r in releases)
    assert releases[0]["samples"] == 5  # exact, and covered by the statement
    plain = list(
        replay(parse_config(production(noise={"mode": "insecure_zero"})), lines, ZeroNoise())
    )
    assert plain and all("public_counts" not in r for r in plain)
