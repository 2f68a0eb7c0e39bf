"""A soak (issue 27 item 6): dpstream on a three-broker cluster for half an hour.

A plain confluent-kafka producer writes Zipf-distributed users' events at a steady rate;
one zero-noise worker releases a fixed-tau count and a ``tau: auto`` count; the worker is
SIGKILLed every few minutes and restarted right away; one broker (the leader of events
partition 0) is SIGKILLed mid-run and restarted a minute later. Every few seconds: the
RSS of the worker's process tree (the Faust worker and its ingest child), the ingest lag,
and the latency of the releases received since (Kafka timestamp minus the tick's end).
At the end, the checks (printed as a table; exit status 1 when one fails):

* RSS: within each worker life, growth from its warm-up sample to its last sample stays
  within the documented per-user constant (docs/benchmarks.md, "Memory") times the users
  first seen meanwhile, plus ``--rss-slack-mib``;
* no event lost or doubled: the exported log holds exactly the events the producer sent;
* no user lost or double-counted: the fixed-tau count released at the first tick by which
  every event was ingested equals sum over users of min(events sent, tau);
* the releases equal the replay of the exported log, byte for byte.

    .venv/bin/python -m bench.soak --minutes 30 --rate 500 --out .dpstream/soak
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.common import proc_status
from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.deploy.cluster import KafkaCluster
from dpstream.pipeline.ingest.consumer import source_lag
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.keys import load_noise
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker

PER_USER_BYTES = 640  # docs/benchmarks.md "Memory": VmRSS fit, 89.8 MiB + 640 B x users
# Faust's group timeouts from the environment, as the fault tests set them: a SIGKILLed
# member's partitions are reassigned in seconds, not after Faust's 60 s default.
FAST_REJOIN = {
    "BROKER_SESSION_TIMEOUT": "6",
    "BROKER_HEARTBEAT_INTERVAL": "1",
    "BROKER_REBALANCE_TIMEOUT": "10",
}
FIXED, AUTO = "views_fixed", "views_auto"


# --------------------------------------------------------------------------- pure helpers


def zipf_weights(users: int, exponent: float) -> list[float]:
    """P(user k) proportional to 1 / k**exponent, k = 1..users (normalized)."""
    raw = [1.0 / k**exponent for k in range(1, users + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def user_id(k: int) -> str:
    return f"user-{k:05d}"


def truncated_total(sent: Counter[str], tau: int) -> int:
    """The exact fixed-tau count: each user's events, at most tau of them."""
    return sum(min(n, tau) for n in sent.values())


def tick_end(tick: int, interval: float) -> float:
    """Unix time at which ``tick`` ends (tick t covers [t I, (t + 1) I))."""
    return (tick + 1) * interval


def first_copies(records: Sequence[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    """One (record, timestamp ms) per tick, the first seen (a restarted worker may send a
    tick's release again: byte-identical, else ValueError), in tick order."""
    first: dict[int, tuple[bytes, int]] = {}
    for value, ts in records:
        tick = orjson.loads(value)["tick"]
        if first.setdefault(tick, (value, ts))[0] != value:
            raise ValueError(f"tick {tick} released twice with different contents")
    return [first[t] for t in sorted(first)]


def rss_growth(samples: Sequence[dict], warmup: float, first_seen: dict[str, float]) -> list[dict]:
    """Per worker life (pid) that outlived ``warmup`` seconds: RSS at its first sample
    after warm-up and at its last, the users first sent in between and the growth the
    per-user constant allows for them."""
    lives: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        if s["pid"] is not None and s["rss"] is not None:
            lives[s["pid"]].append(s)
    seen = sorted(first_seen.values())
    out = []
    for pid, rows in lives.items():
        start = rows[0]["t"]
        warm = [r for r in rows if r["t"] >= start + warmup]
        if len(warm) < 2:
            continue
        a, b = warm[0], warm[-1]
        new_users = sum(1 for t in seen if a["t"] < t <= b["t"])
        out.append(
            {
                "pid": pid,
                "from_s": round(a["t"], 1),
                "to_s": round(b["t"], 1),
                "rss_from": a["rss"],
                "rss_to": b["rss"],
                "growth": b["rss"] - a["rss"],
                "new_users": new_users,
                "allowed_by_users": new_users * PER_USER_BYTES,
            }
        )
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# --------------------------------------------------------------------------- processes


def tree_rss(pid: int) -> int | None:
    """VmRSS of ``pid`` plus its children's (the ingest process), bytes; None if gone."""
    own = proc_status(pid).get("VmRSS")
    if own is None:
        return None
    total = own
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:"):
                if int(line.split()[1]) == pid:
                    total += proc_status(int(entry.name)).get("VmRSS", 0)
                break
    return total


class Traffic(threading.Thread):
    """A plain producer (acks=all, idempotent): ``rate`` events/s in 10 slots a second,
    Zipf users, each event {"user_id", "key": "view"} keyed by its user."""

    def __init__(self, bootstrap: str, topic: str, rate: int, weights: list[float], seed: int):
        super().__init__(name="traffic", daemon=True)
        self.topic, self.rate, self.weights = topic, rate, weights
        self.rng = random.Random(seed)  # noqa: S311 - synthetic workload, not noise
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 20,
                "log_level": 0,
            }
        )
        self.sent: Counter[str] = Counter()
        self.first_seen: dict[str, float] = {}
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.started_at = 0.0

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failures.append(str(err))

    def run(self) -> None:
        slot, per_slot = 0.1, self.rate / 10
        population = range(1, len(self.weights) + 1)
        owed = 0.0
        self.started_at = next_at = time.time()
        while not self.stopping.is_set():
            owed += per_slot
            count, owed = int(owed), owed - int(owed)
            for k in self.rng.choices(population, self.weights, k=count):
                uid = user_id(k)
                self.producer.produce(
                    self.topic,
                    key=uid.encode(),
                    value=orjson.dumps({"user_id": uid, "key": "view"}),
                    on_delivery=self._delivered,
                )
                self.sent[uid] += 1
                self.first_seen.setdefault(uid, time.time())
            self.producer.poll(0)
            next_at += slot
            time.sleep(max(0.0, next_at - time.time()))

    def finish(self) -> int:
        """Stop; the events still undelivered after two minutes."""
        self.stopping.set()
        self.join(30)
        return self.producer.flush(120)


class ReleaseFollower(threading.Thread):
    """Every record of the release topics from their start, with its Kafka timestamp."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        super().__init__(name="releases", daemon=True)
        self.by_topic = {topic: name for name, topic in topics.items()}
        self.records: dict[str, list[tuple[bytes, int]]] = {name: [] for name in topics}
        self.arrivals: list[tuple[float, float]] = []  # (received, latency s), first copies
        self._ticks: dict[str, set[int]] = {name: set() for name in topics}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "soak-reader",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        self._consumer.assign([TopicPartition(t, 0, 0) for t in topics.values()])
        self._halt = threading.Event()
        self.interval = 1.0

    def run(self) -> None:
        while not self._halt.is_set():
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            name = self.by_topic[msg.topic()]
            ts = msg.timestamp()[1]
            self.records[name].append((msg.value(), ts))
            tick = orjson.loads(msg.value())["tick"]
            if tick not in self._ticks[name]:
                self._ticks[name].add(tick)
                self.arrivals.append((time.time(), ts / 1000 - tick_end(tick, self.interval)))

    def newest_tick(self, name: str) -> int | None:
        return max(self._ticks[name], default=None)

    def close(self) -> None:
        self._halt.set()
        self.join(10)
        self._consumer.close()


# --------------------------------------------------------------------------- the run


def soak_config(partitions: int, interval: float, tau: int) -> dict:
    return {
        "input": {"partitions": partitions},
        "ticks": {"interval_seconds": interval},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 10.0},
        "statistics": [
            {"name": FIXED, "epsilon": 1.0, "tau": tau, "key": "view"},
            {"name": AUTO, "epsilon": 1.0, "key": "view"},
        ],
    }


@dataclass
class Run:
    args: argparse.Namespace
    cluster: KafkaCluster
    cfg: PipelineConfig
    config_path: Path
    out: Path
    t0: float = 0.0
    proc: object = None
    lives: int = 0
    samples: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # kills and restarts, seconds from t0

    def log(self, what: str) -> None:
        at = time.time() - self.t0
        self.events.append({"t": round(at, 1), "what": what})
        print(f"[{at:7.1f} s] {what}", flush=True)

    def start_worker(self) -> None:
        self.lives += 1
        log_path = self.out / f"worker.{self.lives}.log"
        env = {**FAST_REJOIN, "PYTHONUNBUFFERED": "1"}
        self.proc = spawn_worker(self.config_path, self.cluster.bootstrap, log_path, env)

    def kill_worker(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
        self.proc.wait(10)  # type: ignore[attr-defined]
        self.log(f"worker SIGKILLed (life {self.lives})")
        self.start_worker()
        self.log(f"worker restarted (life {self.lives})")


def events_leader(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return admin.list_topics(timeout=30).topics[topic].partitions[0].leader


def schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(seconds from the start, action): worker kills every ``kill_every`` seconds, the
    broker kill at ``broker_at`` of the run, its restart ``broker_down`` seconds later."""
    duration = args.minutes * 60
    plan = [(t, "kill-worker") for t in _range(args.kill_every, duration, args.kill_every)]
    down = args.broker_at * duration
    plan += [(down, "kill-broker"), (down + args.broker_down, "restart-broker")]
    return sorted(plan)


def _range(start: float, stop: float, step: float) -> Iterator[float]:
    t = start
    while t < stop - 1e-9:
        yield t
        t += step


def sample(run: Run, follower: ReleaseFollower, since: float) -> float:
    now = time.time()
    try:
        lag: int | None = sum(p["lag"] for p in source_lag(run.cfg, run.cluster.bootstrap).values())
    except Exception:  # the lag is unknown while a broker or the group moves
        lag = None
    pid = run.proc.pid  # type: ignore[attr-defined]
    latencies = [lat for at, lat in follower.arrivals if since < at <= now]
    run.samples.append(
        {
            "t": round(now - run.t0, 2),
            "pid": pid,
            "rss": tree_rss(pid),
            "lag": lag,
            "latency_max": max(latencies) if latencies else None,
            "latency_median": percentile(latencies, 0.5),
            "releases": len(latencies),
        }
    )
    return now


def drive(run: Run, traffic: Traffic, follower: ReleaseFollower) -> None:
    """The timed part: traffic, samples, kills and the broker restart."""
    args, plan = run.args, schedule(run.args)
    end = run.t0 + args.minutes * 60
    victim = 0
    last_sample = time.time()
    while time.time() < end:
        while plan and time.time() >= run.t0 + plan[0][0]:
            _, action = plan.pop(0)
            if action == "kill-worker":
                run.kill_worker()
            elif action == "kill-broker":
                victim = events_leader(run.cluster.bootstrap, run.cfg.events_topic)
                run.cluster.kill(victim)
                run.log(f"broker {victim} SIGKILLed")
            else:
                run.cluster.restart(victim, timeout=120)
                run.log(f"broker {victim} restarted")
        if run.proc.poll() is not None:  # type: ignore[attr-defined]
            run.log(f"worker exited by itself (life {run.lives}); restarting")
            run.start_worker()
        if time.time() - last_sample >= args.sample:
            last_sample = sample(run, follower, last_sample)
        time.sleep(0.2)


def settle(run: Run, traffic: Traffic, follower: ReleaseFollower) -> tuple[int, int]:
    """Stop the traffic, wait until the ingest has read every event and both statistics
    have released a tick that ended after that; (undelivered events, that tick)."""
    undelivered = traffic.finish()
    run.log(f"traffic stopped: {sum(traffic.sent.values())} events sent")
    deadline = time.time() + 300
    last_sample = time.time()
    while time.time() < deadline:
        last_sample = sample(run, follower, last_sample)
        if run.samples[-1]["lag"] == 0:
            break
        time.sleep(run.args.sample)
    tick = math.floor(time.time() / run.cfg.ticks.interval_seconds) + 1
    while time.time() < deadline:
        newest = [follower.newest_tick(n) for n in (FIXED, AUTO)]
        if all(t is not None and t >= tick for t in newest):
            break
        time.sleep(0.5)
    run.log(f"every event ingested by tick {tick}")
    return undelivered, tick


def checks(run: Run, traffic: Traffic, follower: ReleaseFollower, tick: int) -> list[dict]:
    """The table of checks (name, passed, numbers)."""
    args, cfg, out = run.args, run.cfg, []
    first_seen = {u: t - run.t0 for u, t in traffic.first_seen.items()}
    growth = rss_growth(run.samples, args.warmup, first_seen)
    slack = args.rss_slack_mib * 2**20
    worst = max(growth, key=lambda g: g["growth"] - g["allowed_by_users"], default=None)
    out.append(
        {
            "check": "RSS growth per life <= 640 B x new users + slack",
            "ok": bool(growth)
            and all(g["growth"] <= g["allowed_by_users"] + slack for g in growth),
            "numbers": (
                f"{len(growth)} lives; worst: {worst['growth'] / 2**20:+.1f} MiB over "
                f"{(worst['to_s'] - worst['from_s']) / 60:.1f} min, {worst['new_users']} new "
                f"users allow {worst['allowed_by_users'] / 2**20:.2f} MiB"
                f" + {args.rss_slack_mib} MiB"
                if worst
                else "no life outlived the warm-up"
            ),
        }
    )
    # The releases before the export: the worker goes on releasing (empty ticks) while the
    # export reads, and the log it returns ends at the last tick closed before then.
    releases = {n: first_copies(follower.records[n][:]) for n in (FIXED, AUTO)}
    log = list(export_log(cfg, run.cluster.bootstrap))
    logged = Counter(o["user_id"] for o in map(orjson.loads, log) if "user_id" in o)
    sent = sum(traffic.sent.values())
    out.append(
        {
            "check": "exported log holds every event sent, once",
            "ok": logged == traffic.sent and not traffic.failures,
            "numbers": f"sent {sent}, logged {sum(logged.values())}, "
            f"users {len(traffic.sent)}, delivery errors {len(traffic.failures)}",
        }
    )
    at_tick = [orjson.loads(v) for v, _ in releases[FIXED] if orjson.loads(v)["tick"] == tick]
    truth = truncated_total(traffic.sent, args.tau)
    released = at_tick[0]["value"] if at_tick else None
    out.append(
        {
            "check": f"fixed-tau count at tick {tick} = sum min(sent, tau={args.tau})",
            "ok": released == truth,
            "numbers": f"released {released}, exact {truth}",
        }
    )
    replayed: dict[str, list[bytes]] = defaultdict(list)
    for r in replay(cfg, log, load_noise(cfg)):
        replayed[r["statistic"]].append(orjson.dumps(r))
    for name in (FIXED, AUTO):
        mine = [v for v, _ in releases[name]]
        theirs = replayed[name]
        both = min(len(mine), len(theirs))
        covered = bool(theirs) and orjson.loads(theirs[-1])["tick"] >= tick
        out.append(
            {
                "check": f"{name}: releases = replay of the exported log",
                "ok": covered and both > 0 and mine[:both] == theirs[:both],
                "numbers": f"{len(mine)} releases, {len(theirs)} replayed, first {both} "
                f"equal: {mine[:both] == theirs[:both]}, replay reaches tick {tick}: {covered}",
            }
        )
    return out


def summary(run: Run, follower: ReleaseFollower) -> dict:
    rss = [s["rss"] for s in run.samples if s["rss"] is not None]
    lag = [s["lag"] for s in run.samples if s["lag"] is not None]
    lat = [lat for _, lat in follower.arrivals]
    mib = 2**20
    return {
        "rss_mib": {
            "min": min(rss) / mib,
            "median": percentile(rss, 0.5) / mib,
            "max": max(rss) / mib,
        }
        if rss
        else None,
        "lag_events": {
            "median": percentile(lag, 0.5),
            "p99": percentile(lag, 0.99),
            "max": max(lag),
        }
        if lag
        else None,
        "latency_s": {"median": percentile(lat, 0.5), "p99": percentile(lat, 0.99), "max": max(lat)}
        if lat
        else None,
        "releases": len(lat),
    }


def plot(run: Run, follower: ReleaseFollower, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    t = [s["t"] / 60 for s in run.samples]
    axes[0].plot(t, [s["rss"] / 2**20 if s["rss"] else math.nan for s in run.samples])
    axes[0].set_ylabel("worker RSS (MiB)")
    axes[1].plot(t, [s["lag"] if s["lag"] is not None else math.nan for s in run.samples])
    axes[1].set_ylabel("ingest lag (events)")
    at = [(a - run.t0) / 60 for a, _ in follower.arrivals]
    axes[2].plot(at, [lat for _, lat in follower.arrivals], ".", markersize=2)
    axes[2].set_ylabel("release latency (s)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("minutes")
    down = [e["t"] / 60 for e in run.events if "broker" in e["what"]]
    for ax in axes:
        for e in run.events:
            if "SIGKILLed (life" in e["what"]:
                ax.axvline(e["t"] / 60, color="red", linestyle="--", linewidth=0.8)
        if len(down) == 2:
            ax.axvspan(down[0], down[1], color="grey", alpha=0.25)
    axes[0].set_title(
        f"soak: {run.args.rate} events/s, {run.args.users} Zipf users; "
        "red: worker SIGKILL, grey: a broker down"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(run: Run, follower: ReleaseFollower, table: list[dict], info: dict) -> None:
    with open(run.out / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(run.samples[0]))
        writer.writeheader()
        writer.writerows(run.samples)
    with open(run.out / "releases.jsonl", "wb") as out:
        for name in (FIXED, AUTO):
            out.writelines(value + b"\n" for value, _ in follower.records[name])
    with open(run.out / "latencies.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["received_s", "latency_s"])
        writer.writerows((round(a - run.t0, 3), round(lat, 4)) for a, lat in follower.arrivals)
    (run.out / "soak.json").write_text(
        json.dumps(
            {**info, "checks": table, "events": run.events, "samples": run.samples}, indent=1
        )
    )
    plot(run, follower, run.out / "soak.png")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--rate", type=int, default=500, help="events per second")
    p.add_argument("--users", type=int, default=3000)
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the users")
    p.add_argument("--tau", type=int, default=5, help="the fixed-tau count's tau")
    p.add_argument("--tick", type=float, default=1.0, help="ticks.interval_seconds")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--kill-every", type=float, default=300, help="seconds between SIGKILLs")
    p.add_argument("--broker-at", type=float, default=0.4, help="broker kill, run fraction")
    p.add_argument("--broker-down", type=float, default=60, help="seconds the broker is down")
    p.add_argument("--sample", type=float, default=5, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=60, help="seconds of a life before RSS counts")
    p.add_argument("--rss-slack-mib", type=float, default=16)
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--out", type=Path, default=Path(".dpstream/soak"))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    data = soak_config(args.partitions, args.tick, args.tau)
    cfg = parse_config(data)
    config_path = args.out / "soak.yaml"
    config_path.write_text(yaml.safe_dump(data))
    cluster = KafkaCluster.start()
    run = Run(args, cluster, cfg, config_path, args.out, t0=time.time())
    follower = traffic = None
    try:
        create_source_topics(cfg, cluster.bootstrap)
        run.start_worker()
        run.log(f"cluster {cluster.bootstrap}; worker started")
        topics = {s.name: cfg.release_topic(s.name) for s in cfg.statistics}
        traffic = Traffic(
            cluster.bootstrap,
            cfg.input.topics[0],
            args.rate,
            zipf_weights(args.users, args.zipf),
            args.seed,
        )
        traffic.start()
        follower = ReleaseFollower(cluster.bootstrap, topics)
        follower.interval = args.tick
        follower.start()
        drive(run, traffic, follower)
        undelivered, tick = settle(run, traffic, follower)
        table = checks(run, traffic, follower, tick)
        table.append(
            {
                "check": "producer delivered everything",
                "ok": undelivered == 0,
                "numbers": f"{undelivered} undelivered",
            }
        )
        info = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "summary": summary(run, follower),
            "lives": run.lives,
        }
        write(run, follower, table, info)
    finally:
        try:
            if run.proc is not None:
                stop_worker(run.proc)  # type: ignore[arg-type]
            if follower is not None:
                follower.close()
        finally:
            cluster.stop()
    print(json.dumps(info["summary"], indent=1))
    for row in table:
        print(f"{'PASS' if row['ok'] else 'FAIL'}  {row['check']}: {row['numbers']}")
    print(f"samples, latencies, plot: {args.out}/")
    return 0 if all(row["ok"] for row in table) else 1


if __name__ == "__main__":
    sys.exit(main())
