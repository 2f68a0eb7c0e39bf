"""The command line stops on bad config with the field named, and refuses to run keyless."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
GOOD = {
    "privacy": {"total_epsilon": 1.0},
    "noise": {"mode": "keyed", "key_env": "DPSTREAM_CLI_TEST_KEY"},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 4}],
}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_check_config_accepts_the_demo_and_prints_the_budget():
    demo = Path(__file__).resolve().parents[3] / "config" / "demo.yaml"
    out = run("check-config", str(demo))
    assert out.returncode == 0, out.stderr
    assert "tick 1s (released 1.25s after its end)" in out.stdout
    assert "privacy statement (whole_user neighbours):" in out.stdout
    assert "events: 1 (whole_user; tree counter, whole infinite stream)" in out.stdout
    assert (
        "one user can lose at most 3 over the whole stream (basic composition) of "
        "total_epsilon=3" in out.stdout
    )
    # The accuracy plan (statistics.accuracy): each statistic's std, what its interval covers.
    assert "accuracy plan (std of a release at tick t" in out.stdout
    assert "events: binary_tree, tree binary k=2, pure_dp, noise discrete_laplace" in out.stdout
    assert "std in events release: 76.7, 336.6, 643.0  (t=10, t=1,000, t=100,000)" in out.stdout


def test_bad_config_stops_with_the_field_named(tmp_path):
    bad = {**GOOD, "statistics": [{"name": "events", "epsilon": 0, "tau": 4}]}
    for command in (["check-config"], ["worker", "--bootstrap", "127.0.0.1:1", "--config"]):
        out = run(*command, write(tmp_path, bad))
        assert out.returncode == 2
        assert "statistics[0] (events).epsilon: Input should be greater than 0" in out.stderr


def test_worker_refuses_to_start_without_a_noise_key(tmp_path):
    out = run("worker", "--bootstrap", "127.0.0.1:1", "--config", write(tmp_path, GOOD))
    assert out.returncode == 2
    assert "noise.key_env: environment variable DPSTREAM_CLI_TEST_KEY is not set" in out.stderr


def test_replay_cli_prints_releases_as_jsonl(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text('{"user_id": "a"}\n{"user_id": "a"}\n{"tick": 1}\n{"tick": 2}\n')
    config = write(tmp_path, {**GOOD, "noise": {"mode": "insecure_zero"}})
    out = run("replay", "--config", config, "--events", str(log))
    assert out.returncode == 0, out.stderr
    lines = [yaml.safe_load(line) for line in out.stdout.splitlines()]
    assert [(r["step"], r["value"]) for r in lines] == [(1, 2), (2, 2)]


MEAN = {
    "name": "latency",
    "kind": "mean",
    "epsilon": 1.0,
    "mean": {"max_samples_per_user": 8},
}
GEORGE_MEAN = {**MEAN, "mean": {"max_users": 100, "max_samples_per_user": 8}}


def test_check_config_states_public_counts_and_refuses_a_mix(tmp_path):
    public = {**GOOD, "privacy": {"total_epsilon": 1.0, "public_counts": True}}
    out = run("check-config", write(tmp_path, {**public, "statistics": [GEORGE_MEAN]}))
    assert out.returncode == 0, out.stderr
    assert "privacy statement (public_counts neighbours):" in out.stdout
    assert "PUBLIC COUNTS: who sent how many events when is NOT protected" in out.stdout
    assert "continual mean (George et al., Alg. 6)" in out.stdout
    # A count beside George et al.'s mean: its exact truncated value would be "samples".
    mixed = {**GOOD, "privacy": {"total_epsilon": 2.0, "public_counts": True}}
    mixed["statistics"] = [*GOOD["statistics"], GEORGE_MEAN]
    out = run("check-config", write(tmp_path, mixed))
    assert out.returncode == 2
    assert "statistics[0]: 'events' (count) protects whole users" in out.stderr
    # Its caps on users mean nothing to the whole-user mean: refused, the field named.
    mixed["privacy"] = {"total_epsilon": 2.0}
    out = run("check-config", write(tmp_path, mixed))
    assert out.returncode == 2
    assert (
        "statistics[1] (latency).mean.max_users: applies only with privacy.public_counts"
        in out.stderr
    )


def test_check_config_accepts_the_review_reproduction_with_the_whole_user_mean(tmp_path):
    # Issue 13 item 3: a count with tau 8 and a default mean with m = 8 over the same
    # events, one total_epsilon; the mean releases no exact count.
    pair = {**GOOD, "privacy": {"total_epsilon": 2.0}}
    pair["statistics"] = [{"name": "events", "epsilon": 1.0, "tau": 8}, MEAN]
    out = run("check-config", write(tmp_path, pair))
    assert out.returncode == 0, out.stderr
    assert (
        "latency: whole-user mean of values in [0, 1] on 1024 grid units, epsilon=1 (half to "
        "the noisy count of kept samples, half to their noisy sum), each user's first 8 "
        "samples; releases no exact count -> dp.latency" in out.stdout
    )
    assert "privacy statement (whole_user neighbours):" in out.stdout
    assert (
        "latency: 1 (whole_user; whole-user mean: kept-samples counter at 0.5 (sensitivity "
        "8) + grid-units counter at 0.5 (sensitivity 8192), tree counters over the whole "
        "infinite stream)" in out.stdout
    )
    assert "one user can lose at most 2 over the whole stream (basic composition)" in out.stdout
    assert "PUBLIC COUNTS" not in out.stdout
    pair["privacy"] = {"total_epsilon": 2.0, "neighbours": "any_subset"}
    out = run("check-config", write(tmp_path, pair))
    assert out.returncode == 0, out.stderr
    assert "counter at 0.5 (sensitivity 16) + grid-units counter at 0.5 (sensitivity 16384)" in (
        out.stdout
    )


def test_check_config_states_twice_the_epoch_cap_for_strict_cells_under_any_subset(tmp_path):
    # Issue 24 item 2: strict cells a and b, epsilon 0.5 per cell, epoch_cap 0.5. Under
    # any_subset one user can lose 1.0 (2B): check-config printed 0.5 and accepted
    # total_epsilon 0.5.
    cells = {"name": "speed", "kind": "cell_mean", "epsilon": 0.5,
             "cells": {"field": "cell", "keys": ["a", "b"], "mechanism": "noisy_ratio",
                       "contribution_cap": 1, "lower": 0, "upper": 10, "step": 1,
                       "slot_ticks": 1, "epoch_slots": 1, "epoch_cap": 0.5}}  # fmt: skip
    data = {**GOOD, "statistics": [cells]}
    data["privacy"] = {"total_epsilon": 1.0, "neighbours": "any_subset"}
    out = run("check-config", write(tmp_path, data))
    assert out.returncode == 0, out.stderr
    assert (
        "speed: 1 per epoch (any_subset; 2B, epoch cap B = 0.5 over disjoint cells of epsilon "
        "0.5 each: under any_subset, dropping some of a user's events can admit the user into "
        "cells it was dropped from at the cap)" in out.stdout
    )
    assert (
        "one user can lose at most 1 per accounting epoch (basic composition) of "
        "total_epsilon=1" in out.stdout
    )
    data["privacy"]["total_epsilon"] = 0.5
    out = run("check-config", write(tmp_path, data))
    assert out.returncode == 2
    assert "privacy.total_epsilon: statistics spend 1 in total (speed 1)" in out.stderr
    # Whole-user neighbours: removing the user changes only the cells that kept it: B.
    data["privacy"] = {"total_epsilon": 0.5}
    out = run("check-config", write(tmp_path, data))
    assert out.returncode == 0, out.stderr
    assert "one user can lose at most 0.5 per accounting epoch" in out.stdout


def test_check_config_names_the_input_format_and_its_registry(tmp_path):
    url = "https://registry.example/apis/ccompat/v7"
    data = {**GOOD, "input": {"format": "protobuf", "schema_registry": {"url": url}}}
    out = run("check-config", write(tmp_path, data))
    assert out.returncode == 0, out.stderr
    assert f"(protobuf, schemas from {url}, user id: user_id)" in out.stdout
    assert "(json, user id: user_id)" in run("check-config", write(tmp_path, GOOD)).stdout


def test_produce_refuses_what_it_cannot_write(tmp_path):
    path = write(tmp_path, GOOD)
    for flags, message in (
        (["--format", "avro"], "input.schema_registry: required to produce Avro"),
        (["--schema", "event.avsc"], "--schema: only applies to --format avro"),
    ):
        out = run("produce", "--config", path, "--bootstrap", "127.0.0.1:1",
                  "--synthetic-users", "2", "--count", "1", *flags)  # fmt: skip
        assert out.returncode == 2 and message in out.stderr, out.stderr


SHOP = {
    "input": {"user_id_field": "actor.id"},
    "privacy": {"total_epsilon": 3.0},
    "noise": {"mode": "insecure_zero"},
    "statistics": [
        {"name": "views", "epsilon": 1.0, "tau": 16, "where": {"event_type": "page_view"}},
        {
            "name": "revenue",
            "epsilon": 1.0,
            "kind": "sum",
            "tau": 5,
            "upper": 200,
            "resolution": 20000,
            "value_field": "order.amount",
            "where": {"event_type": ["purchase", "refund"]},
        },
        {
            "name": "basket",
            "epsilon": 1.0,
            "kind": "mean",
            "value_field": "amount",
            "key": "buy",
            "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4},
        },
    ],
}


def test_check_config_names_the_fields_each_statistic_reads(tmp_path):
    out = run("check-config", write(tmp_path, SHOP))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert '    reads user id actor.id, only event_type = "page_view"' in lines
    assert (
        "    reads user id actor.id, value order.amount clipped into [0, 200] on a 0.01 grid, "
        'only event_type in ["purchase","refund"]'
    ) in lines
    assert "    reads user id actor.id, value amount clipped into [0, 200], only key = buy" in lines


def test_check_config_refuses_a_filter_no_event_could_match_naming_it(tmp_path):
    cases = [
        ({"where": {"event_type": []}}, "statistics[1] (revenue).where.event_type: an empty list"),
        (
            {"where": {"order.amount": "big"}},
            "statistics[1] (revenue).where.order.amount: the statistic's",
        ),
        (
            {"where": {"order": "x"}},
            "statistics[1] (revenue).where.order: order.amount is read below it",
        ),
        (
            {"key": "buy", "where": {"key": "sell"}},
            "statistics[1] (revenue).where.key: contradicts key: buy",
        ),
    ]
    for change, message in cases:
        stats = [SHOP["statistics"][0], {**SHOP["statistics"][1], **change}]
        out = run("check-config", write(tmp_path, {**SHOP, "statistics": stats}))
        assert out.returncode != 0 and message in out.stderr, (change, out.stderr)
    counted = {**SHOP["statistics"][0], "value_field": "amount"}
    out = run("check-config", write(tmp_path, {**SHOP, "statistics": [counted]}))
    assert "statistics[0] (views).value_field: kind count takes no value" in out.stderr


def test_metrics_endpoint_from_the_config_and_the_flags():
    from dpstream.config.base import ConfigError
    from dpstream.config.schema import parse_config
    from dpstream.pipeline.tools.cli import build_parser, metrics_endpoint

    base = {"privacy": {"total_epsilon": 1.0}, "statistics": [{"name": "n", "epsilon": 1.0}]}
    off = parse_config(base)
    on = parse_config({**base, "metrics": {"enabled": True, "host": "0.0.0.0", "port": 9000}})
    assert metrics_endpoint(off, None) is None  # off by default
    assert metrics_endpoint(on, None) == ("0.0.0.0", 9000)
    # --metrics-port turns it on and overrides the port (several workers on one host).
    assert metrics_endpoint(off, 9465) == ("127.0.0.1", 9465)
    assert metrics_endpoint(on, 9465) == ("0.0.0.0", 9465)
    assert metrics_endpoint(on, None, off=True) is None
    with pytest.raises(ConfigError, match="--metrics-port"):
        metrics_endpoint(off, 70000)
    args = build_parser().parse_args(["worker", "--config", "c.yaml", "--metrics-port", "9470"])
    assert (args.metrics_port, args.no_metrics) == (9470, False)
    with pytest.raises(SystemExit):  # one or the other
        build_parser().parse_args(
            ["worker", "--config", "c", "--metrics-port", "1", "--no-metrics"]
        )


def test_check_config_refuses_a_release_topic_that_is_the_events_topic(tmp_path):
    # Issue 27's reproduction: check-config said OK; the worker then crashed at start.
    data = {**GOOD, "outputs": {"release_topic_prefix": "dpstream-"}}
    for command in (["check-config"], ["worker", "--bootstrap", "127.0.0.1:1", "--config"]):
        out = run(*command, write(tmp_path, data))
        assert out.returncode == 2
        assert "statistics[0].name: the release topic" in out.stderr
        assert "'dpstream-events' is also dpstream's events topic (app_id)" in out.stderr


def test_check_config_states_a_zcdp_pipeline_in_rho_and_epsilon_delta(tmp_path):
    zcdp = {
        **GOOD,
        "privacy": {"accounting": "zcdp", "total_rho": 0.5, "delta": 1e-8},
        "statistics": [{"name": "events", "rho": 0.5, "tau": 4}],
    }
    out = run("check-config", write(tmp_path, zcdp))
    assert out.returncode == 0, out.stderr
    assert "events: count via sqrt_factorization, rho=0.5, tau=4 -> dp.events" in out.stdout
    assert "privacy statement (whole_user neighbours, rho-zCDP):" in out.stdout
    assert "one user can lose at most rho=0.5 over the whole stream" in out.stdout
    assert "-DP at delta=1e-08 (Canonne-Kamath-Steinke 2020 Cor. 13" in out.stdout
    assert "events: sqrt_factorization, zcdp, noise discrete_gaussian" in out.stdout
    # An epsilon under zcdp is refused, the field named.
    zcdp["statistics"] = [{"name": "events", "epsilon": 1.0, "tau": 4}]
    out = run("check-config", write(tmp_path, zcdp))
    assert out.returncode == 2
    assert "statistics[0] (events).epsilon: does not apply with privacy.accounting: zcdp" in (
        out.stderr
    )
