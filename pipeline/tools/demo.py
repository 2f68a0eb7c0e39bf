"""``dpstream demo``: a broker, a worker, synthetic users, and private counts streaming out.

Bounded: it produces for ``duration`` seconds, waits for the last ticks to be released,
prints how the releases compare with the truth, writes a plot, and exits 0.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import secrets
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import orjson
import yaml

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.deploy.broker import kafka_broker

from ..kafka.clients import make_producer, produce_events, read_releases
from ..kafka.topics import ensure_topics
from ..worker.processes import spawn_worker, stop_worker
from .export import export_log
from .replay import replay
from .synthetic import synthetic_events

log = logging.getLogger(__name__)


def demo_config(run_id: str, key_file: Path) -> dict:
    text = importlib.resources.files("dpstream.config").joinpath("demo.yaml").read_text()
    data = yaml.safe_load(text)
    # Fresh names per run, so a demo against a long-lived broker never mixes runs.
    data["app_id"] = f"dpstream-demo-{run_id}"
    data["input"]["topics"] = [f"dpstream.events.{run_id}"]
    data["outputs"] = {
        "release_topic_prefix": f"dp.{run_id}.",
        "dead_letter_topic": f"dpstream.dead-letter.{run_id}",
        "ledger_topic": f"dpstream.ledger.{run_id}",
    }
    data["noise"] = {"mode": "keyed", "key_file": str(key_file), "key_env": None}
    return data


def _row(rel: dict) -> str:
    half = (rel["interval"][1] - rel["interval"][0]) / 2
    return (
        f"{rel['step']:>5}  {rel['tick_end'][11:19]}  {rel['statistic']:<8}"
        f"{rel['value']:>9} ± {half:<7.1f} std {rel['std']:.1f}"
    )


def run_demo(duration: float, users: int, rate: float, out: Path, fmt: str = "json") -> int:
    """``fmt`` avro: the events are produced as Avro through a Schema Registry (a local
    one, ``deploy/registry.py``, unless ``DPSTREAM_SCHEMA_REGISTRY_URL`` names one), as
    ``dpstream produce --format avro`` writes them, and the worker reads them so."""
    out.mkdir(parents=True, exist_ok=True)
    key_file = out / "noise.key"
    key_file.write_bytes(secrets.token_hex(32).encode())
    key_file.chmod(0o600)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    data = demo_config(run_id, key_file)
    config_path = out / "demo-config.yaml"

    print("starting a Kafka broker ...", flush=True)
    with kafka_broker() as bootstrap, _registry(fmt) as registry:
        if registry is not None:
            print(f"Schema Registry at {registry}; the events go out as Avro", flush=True)
            data["input"] |= {"format": "avro", "schema_registry": {"url": registry}}
        cfg = parse_config(data, "demo config")
        config_path.write_text(yaml.safe_dump(data, sort_keys=False))
        print(f"broker at {bootstrap}; starting a dpstream worker", flush=True)
        ensure_topics(cfg, bootstrap)
        worker = spawn_worker(config_path, bootstrap, out / "worker.log", loglevel="warning")
        try:
            releases = _drive(cfg, bootstrap, worker, duration, users, rate)
            truth = _truth(cfg, bootstrap)
        finally:
            stop_worker(worker)
    _summary(cfg, releases, truth)
    _plot(cfg, releases, truth, out / "demo.png")
    return 0


def _registry(fmt: str) -> contextlib.AbstractContextManager[str | None]:
    if fmt == "json":
        return contextlib.nullcontext()
    from dpstream.deploy.registry import schema_registry

    print("starting a Schema Registry ...", flush=True)
    return schema_registry()


def _drive(
    cfg: PipelineConfig,
    bootstrap: str,
    worker: subprocess.Popen,
    duration: float,
    users: int,
    rate: float,
) -> dict[str, list[dict]]:
    producer = make_producer(bootstrap, cfg.kafka)
    consumer = read_releases(
        bootstrap,
        "^" + cfg.outputs.release_topic_prefix.replace(".", r"\.") + ".*",
        group=f"{cfg.app_id}-demo",
        security=cfg.kafka,
    )
    events = synthetic_events(users, int(rate * duration) + 1, seed=7)
    serialize: Callable[[dict], bytes] = orjson.dumps
    if cfg.input.format == "avro":
        from .avro_events import avro_serializer

        serialize = avro_serializer(cfg, list(synthetic_events(users, 1000, seed=7)), None)
    releases: dict[str, list[dict]] = defaultdict(list)
    interval = cfg.ticks.interval_seconds
    print(f"producing ~{rate:g} events/s from {users} synthetic users for {duration:g}s\n")
    print(" step  tick end  statistic  released  ±95%      std")
    start = time.monotonic()
    stop_producing = start + duration
    # Wait for the ticks that cover the traffic to close and be released.
    stop_at = stop_producing + 3 * interval + 15
    last_tick_wanted = None
    sent = 0
    try:
        while time.monotonic() < stop_at:
            if worker.poll() is not None:
                raise RuntimeError("the worker exited; see its log in the demo folder")
            now = time.monotonic()
            if now < stop_producing:
                due = int((now - start) * rate) - sent
                batch = [next(events) for _ in range(max(0, due))]
                sent += produce_events(producer, cfg, batch, serialize=serialize)
            elif last_tick_wanted is None:
                producer.flush(30)
                last_tick_wanted = int(time.time() / interval)
            msg = consumer.poll(0.05)
            # A record without a value holds no release.
            if msg is not None and not msg.error() and (value := msg.value()) is not None:
                rel = orjson.loads(value)
                releases[rel["statistic"]].append(rel)
                print(_row(rel), flush=True)
                if last_tick_wanted is not None and all(
                    releases[s.name] and releases[s.name][-1]["tick"] >= last_tick_wanted
                    for s in cfg.statistics
                ):
                    break
    finally:
        consumer.close()
    print(f"\nproduced {sent} events")
    return releases


def _truth(cfg: PipelineConfig, bootstrap: str) -> dict[str, dict[int, tuple[int, int]]]:
    """Per statistic and tick: (true running count, truncated running count), exact."""
    log_lines = list(export_log(cfg, bootstrap))
    zero = parse_config(
        {**cfg.model_dump(mode="json"), "noise": {"mode": "insecure_zero"}}, "zero-noise copy"
    )
    from dpstream.operators.noise import ZeroNoise

    truncated = {
        (r["statistic"], r["tick"]): r["value"] for r in replay(zero, log_lines, ZeroNoise())
    }
    running = dict.fromkeys((s.name for s in cfg.statistics), 0)
    out: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    for line in log_lines:
        obj = orjson.loads(line)
        if "user_id" not in obj and "tick" not in obj:
            continue  # the log's header
        if "tick" in obj and "user_id" not in obj:
            for s in cfg.statistics:
                out[s.name][obj["tick"]] = (
                    running[s.name],
                    truncated.get((s.name, obj["tick"]), 0),
                )
            continue
        for s in cfg.statistics:
            if s.key is None or obj.get("key") == s.key:
                running[s.name] += 1
    return out


def _summary(cfg, releases, truth) -> None:
    print("\nfinal releases against the truth (exact counts are never published):")
    for s in cfg.statistics:
        if not releases[s.name]:
            print(f"  {s.name}: no release")
            continue
        last = releases[s.name][-1]
        true, trunc = truth[s.name].get(last["tick"], (None, None))
        lo, hi = last["interval"]
        bound = f"tracked tau={last['tau']}" if s.user_level else f"tau={s.tau}"
        print(
            f"  {s.name:<8} released {last['value']} (95% interval {lo:.0f}..{hi:.0f}); "
            f"true count {true}, after truncation to {bound}: {trunc}"
        )


def _plot(cfg, releases, truth, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed; no plot (pip install 'dpstream[demo]')")
        return
    fig, axes = plt.subplots(
        len(cfg.statistics), 1, figsize=(9, 3.2 * len(cfg.statistics)), squeeze=False
    )
    for ax, s in zip(axes[:, 0], cfg.statistics, strict=True):
        rel = releases[s.name]
        steps = [r["step"] for r in rel]
        ax.fill_between(
            steps,
            [r["interval"][0] for r in rel],
            [r["interval"][1] for r in rel],
            alpha=0.25,
            label="95% interval",
        )
        ax.plot(steps, [r["value"] for r in rel], lw=1.5, label=f"released (eps={s.epsilon:g})")
        tr = [truth[s.name].get(r["tick"]) for r in rel]
        ok = [(st, t) for st, t in zip(steps, tr, strict=True) if t is not None]
        ax.plot([st for st, _ in ok], [t[0] for _, t in ok], "k--", lw=1, label="true count")
        ax.plot(
            [st for st, _ in ok],
            [t[1] for _, t in ok],
            "g:",
            lw=1.2,
            label="truncated count (tracked tau, zero-noise replay)"
            if s.user_level
            else f"truncated count (tau={s.tau})",
        )
        ax.set_title(f"{s.name}: private running count")
        ax.set_xlabel(f"tick ({cfg.ticks.interval_seconds:g}s)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")
