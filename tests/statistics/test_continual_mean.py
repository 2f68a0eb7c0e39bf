"""kind mean (George et al. Alg. 6) in the pipeline's stages: replay equals the operator's own
two-stage simulation over the same partitions, exactly, with zero and with keyed noise."""

from __future__ import annotations

import copy
import random
import re
from fractions import Fraction

import orjson
import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.operators.means import continual_mean as cm
from dpstream.operators.noise import KeyedNoise, ScopedNoise, ZeroNoise
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.pipeline.stages.stage2_state import OFFLINE_RUN
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.wire.records import partition_for
from dpstream.statistics import identity
from dpstream.statistics.events import Event

PARTITIONS = 3


def config(
    mode: str = "insecure_zero", partitions: int = PARTITIONS, epsilon: float = 1.0, **mean
) -> object:
    return parse_config(
        {
            "input": {"partitions": partitions},
            "noise": {"mode": mode},
            "privacy": {"total_epsilon": epsilon, "public_counts": True},
            "statistics": [
                {
                    "name": "latency",
                    "kind": "mean",
                    "epsilon": epsilon,
                    "key": "rtt",
                    "mean": {"max_users": 40, "max_samples_per_user": 16, **mean},
                },
            ],
        }
    )


def stream(seed: int, ticks: int, users: int = 30) -> list[list[tuple[str, float]]]:
    """Bernoulli(0.3)-ish samples of ``users`` users over ``ticks`` ticks, heavy users
    first (they reach levels 2-4 and activate them)."""
    rng = random.Random(seed)
    out = []
    for _ in range(ticks):
        tick = []
        for _ in range(rng.randrange(5, 25)):
            user = f"u{min(rng.randrange(users), rng.randrange(users))}"
            tick.append((user, float(rng.random() < 0.3)))
        out.append(tick)
    return out


def log_of(ticks: list[list[tuple[str, float]]], first_tick: int = 100) -> list[bytes]:
    lines = []
    for t, tick in enumerate(ticks):
        for user, x in tick:
            lines.append(orjson.dumps({"user_id": user, "key": "rtt", "value": x}))
        lines.append(orjson.dumps({"tick": first_tick + t}))
    return lines


def simulated(cfg, ticks, noise) -> list[cm.MeanRelease]:
    """The operator's own driver: P partitions by the pipeline's partitioner, no feedback."""
    stat = cfg.statistics[0]
    spec = cm.make_continual_mean(
        Fraction(repr(stat.epsilon)),
        stat.mean.delta,
        stat.mean.max_users,
        stat.mean.max_samples_per_user,
        lower=Fraction(repr(stat.mean.lower)),
        upper=Fraction(repr(stat.mean.upper)),
        resolution=stat.mean.resolution,
        partitions=cfg.input.partitions,
        node_prefix=(stat.name, 0),
    )
    sim = cm.Simulation(
        spec, partition_of=lambda u: partition_for(u, cfg.input.partitions), feedback=False
    )
    # The pipeline draws a statistic's noise under its identity (operators.accounting).
    fingerprint = identity.fingerprint(stat, cfg)
    scope = (cfg.app_id, stat.name, fingerprint, OFFLINE_RUN.run_id, 100)
    scoped = ScopedNoise(noise, scope)
    return [sim.tick(tick, scoped) for tick in ticks]


def means(releases) -> list[dict]:
    return [r for r in releases if r["statistic"] == "latency"]


@pytest.mark.parametrize("mode", ["insecure_zero", "keyed"])
def test_replay_equals_the_operators_two_stage_simulation(mode):
    # A large epsilon so that levels 2 and 3 gather their K_l median arrays (11, 12).
    cfg = config(mode, epsilon=64.0)
    noise = ZeroNoise() if mode == "insecure_zero" else KeyedNoise(b"k" * 32)
    ticks = stream(seed=7, ticks=60)
    got = means(replay(cfg, log_of(ticks), noise))
    want = simulated(cfg, ticks, noise)
    assert len(got) == len(want) == 60
    for release, rel in zip(got, want, strict=True):
        assert release["value"] == rel.value
        assert release["std"] == rel.std
        assert release["interval"] == [rel.value - rel.ci95, rel.value + rel.ci95]
        assert release["samples_covered"] == rel.total
        assert release["active_levels"] == rel.active
        assert release["medians"] == [list(m) for m in rel.medians]
    assert want[-1].active >= 2  # a level was activated by its private median


def test_zero_noise_mean_is_the_exact_mean_of_the_covered_samples():
    """Values in [10, 20] by affine scaling; every user sends 15 or 17 alternately, so the
    covered samples' mean is known exactly at every tick (grid of 1/10 per unit)."""
    cfg = config(lower=10.0, upper=20.0, resolution=10)
    lines = []
    for t in range(8):
        for u in range(5):
            lines.append(orjson.dumps({"user_id": f"u{u}", "key": "rtt", "value": 15.0}))
            lines.append(orjson.dumps({"user_id": f"u{u}", "key": "rtt", "value": 17.0}))
        lines.append(orjson.dumps({"tick": 50 + t}))
    releases = means(replay(cfg, lines, ZeroNoise()))
    assert [r["tick"] for r in releases] == list(range(50, 58))
    for r in releases:
        assert r["value"] == pytest.approx(16.0, abs=1e-12)
        assert r["bounds"] == [10.0, 20.0]
        assert r["insecure"] == "insecure_zero"
        assert r["mechanism"] == cm.MECHANISM
        assert r["neighbours"] == "user_values_same_arrivals"
    # m = 16 samples per user: 5 users x 16 samples after 8 ticks, nothing over the cap yet.
    assert releases[-1]["samples"] == 80
    assert releases[-1]["samples_over_cap"] == 0


def test_users_and_samples_beyond_the_caps_are_counted_not_used():
    cfg = config(partitions=1, max_users=2, max_samples_per_user=2)
    lines = [
        orjson.dumps({"user_id": u, "key": "rtt", "value": 1.0}) for u in ["a", "a", "a", "b", "c"]
    ] + [orjson.dumps({"tick": 9})]
    (release,) = means(replay(cfg, lines, ZeroNoise()))
    assert release["samples"] == 3  # a's first two and b's
    assert release["samples_over_cap"] == 2  # a's third (beyond m), c's (beyond n)
    assert (release["users"], release["users_over_cap"]) == (2, 1)


def test_a_tick_without_samples_releases_a_data_independent_value():
    cfg = config()
    lines = [orjson.dumps({"tick": 1}), orjson.dumps({"tick": 2})]
    releases = means(replay(cfg, lines, ZeroNoise()))
    assert [r["value"] for r in releases] == [0.5, 0.5]  # the centre of [0, 1]
    assert [r["step"] for r in releases] == [1, 2]


def test_stage1_mean_state_is_idempotent_whichever_table_write_a_crash_lost():
    """As for counts: the user entry and the partition state are written in that order;
    a re-delivered record after losing either write leaves the same state."""
    cfg = config(partitions=1)
    stage1 = Stage1(cfg)
    warmup = [Event(f"u{i}", "rtt", 0.25 * (i % 4)) for i in range(6)]
    record = [Event("u1", "rtt", 1.0), Event("new", "rtt", 0.5), Event("u2", "rtt", 0.0)]

    def apply(pstate, users, events, offset):
        stage1.add_events(pstate, users, events, offset, 0)
        pstate["last_offset"] = max(pstate["last_offset"], offset)

    pstate, users = new_partition_state(), {}
    apply(pstate, users, warmup, 0)
    before = copy.deepcopy((pstate, users))
    apply(pstate, users, record, 1)
    full = copy.deepcopy((pstate, users))
    # (1) nothing persisted: the record is applied from scratch.
    p, u = copy.deepcopy(before)
    apply(p, u, record, 1)
    assert (p, u) == full
    # (2) user entries persisted, partition state lost: the redo records restore it.
    p, u = copy.deepcopy(before[0]), copy.deepcopy(full[1])
    apply(p, u, record, 1)
    assert (p, u) == full
    # (3) only some user entries persisted (a suffix of the writes lost).
    p, u = copy.deepcopy(before[0]), copy.deepcopy(full[1])
    u["u2"] = copy.deepcopy(before[1]["u2"])
    apply(p, u, record, 1)
    assert (p, u) == full
    # (4) everything persisted: a re-delivery changes nothing.
    p, u = copy.deepcopy(full)
    apply(p, u, record, 1)
    assert (p, u) == full


def test_stage2_waits_for_every_partition_and_merges_their_messages():
    cfg = config()
    stage1, stage2 = Stage1(cfg), Stage2(cfg, ZeroNoise(), PARTITIONS)
    users: dict[str, dict] = {}
    pstates = [new_partition_state() for _ in range(PARTITIONS)]
    events = [Event(f"u{i}", "rtt", 1.0) for i in range(12)]
    for p, pstate in enumerate(pstates):
        mine = [e for e in events if partition_for(e.user_id, PARTITIONS) == p]
        stage1.add_events(pstate, users, mine, 0, p)
    sstate = Stage2.new_state()
    out = []
    for p, pstate in enumerate(pstates):
        (report,) = [r for r in stage1.close_tick(pstate, p, 5) if r.statistic == "latency"]
        releases, ledger = stage2.on_report(sstate, report)
        out.append((releases, ledger))
    assert all(not releases for releases, _ in out[:-1])
    (release,), (entry,) = out[-1]
    assert release["value"] == 1.0 and release["samples"] == 12
    assert entry["neighbours"] == "user_values_same_arrivals"
    assert entry["split"]["total"] <= 1.0
    assert "tau" not in entry


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mean": None}, "statistics[0] (m).mean: required for kind mean"),
        ({"tau": 4}, "statistics[0] (m).tau: does not apply to kind mean"),
        ({"mean": {"max_users": 4, "max_samples_per_user": 1}}, "max_samples_per_user"),
        (
            {"mean": {"max_users": 4, "max_samples_per_user": 4, "lower": 2, "upper": 1}},
            "statistics[0] (m).mean.upper: must be greater than lower",
        ),
    ],
)
def test_bad_mean_config_names_the_field(change, message):
    stat = {
        "name": "m",
        "kind": "mean",
        "epsilon": 1.0,
        "mean": {"max_users": 4, "max_samples_per_user": 4},
        **change,
    }
    if stat["mean"] is None:
        del stat["mean"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({"privacy": {"total_epsilon": 1.0}, "statistics": [stat]})


def test_a_mean_section_on_another_kind_is_rejected():
    with pytest.raises(
        ConfigError, match=r"statistics\[0\] \(c\)\.mean: only applies to kind mean"
    ):
        parse_config(
            {
                "privacy": {"total_epsilon": 1.0},
                "statistics": [
                    {
                        "name": "c",
                        "epsilon": 1.0,
                        "mean": {"max_users": 4, "max_samples_per_user": 4},
                    }
                ],
            }
        )


def test_mean_events_need_a_finite_value():
    cfg = config()
    rejected: list = []
    lines = [
        b'{"user_id": "a", "key": "rtt"}',
        b'{"user_id": "a", "key": "rtt", "value": "x"}',
        b'{"tick": 3}',
    ]
    list(replay(cfg, lines, ZeroNoise(), rejected))
    assert [reason for _, _, reason in rejected] == [
        "missing value (statistic latency)",
        "value is not a number (statistic latency)",
    ]
