"""The ``dpstream`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig, load_config
from dpstream.config.statistic import StatisticConfig
from dpstream.operators.errors import DpStreamError

log = logging.getLogger("dpstream")

# Where a worker runs its ingest unless told (docs/benchmarks.md measured both).
INGEST_DEFAULT = "process"


def resolve_bootstrap(arg: str | None) -> str:
    """--bootstrap, else KAFKA_BOOTSTRAP_SERVERS, else the broker of `dpstream broker start`."""
    if arg:
        return arg
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    from dpstream.deploy.broker import status_detached

    status = status_detached()
    if status and status.get("alive"):
        return str(status["bootstrap"])
    raise DpStreamError(
        "no Kafka broker: pass --bootstrap, set KAFKA_BOOTSTRAP_SERVERS, "
        "or run `dpstream broker start`"
    )


PASSWORD_ENV = "DPSTREAM_KAFKA_PASSWORD"  # noqa: S105 - a variable name, not a password
"""The variable `dpstream broker start --secure` tells users to put the password in."""


def cmd_broker(args: argparse.Namespace) -> int:
    from dpstream.deploy import broker, secure_broker

    if args.action == "fetch":
        print(broker.fetch_jars())
    elif args.action == "start" and args.secure:
        print(secured_broker_start())
    elif args.action == "start":
        info = broker.start_detached(data_dir=_data_dir(args))
        if secure_broker.is_secure(Path(info["data_dir"])):
            raise DpStreamError("a secured broker is running: `dpstream broker stop` it first")
        print(f"Kafka broker running at {info['bootstrap']}")
        print(f"  export KAFKA_BOOTSTRAP_SERVERS={info['bootstrap']}")
    elif args.action == "stop":
        print(_broker_stopped(broker.status_detached(), broker.stop_detached()))
    else:
        status = broker.status_detached()
        if not status:
            print("no local broker")
            return 1
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2, default=str).decode())
        return 0 if status.get("alive") else 1
    return 0


def _broker_stopped(status: dict | None, stopped: bool) -> str:
    if not stopped:
        return "no local broker was running"
    if status is not None and not status.get("owns_data_dir", True):
        return f"stopped; its data is kept in {status['data_dir']} (broker start --data)"
    return "stopped"


def _data_dir(args: argparse.Namespace) -> Path | None:
    """``broker start --data DIR``: the broker's data there, kept by ``broker stop``."""
    if args.data is None:
        return None
    if args.secure:
        raise DpStreamError("broker start: --data is for the plaintext broker, not --secure")
    return Path(args.data).expanduser().resolve()


def secured_broker_start() -> str:
    """Start (or find) the local secured broker; what a user needs to reach it."""
    import yaml

    from dpstream.deploy import broker, secure_broker

    def start(timeout: float) -> broker.LocalKafka:
        return secure_broker.SecureKafka.start(timeout=max(timeout, 90.0)).node

    info = broker.start_detached(start=start)
    node = broker.running_detached()
    if node is None or not secure_broker.is_secure(node.data_dir):
        raise DpStreamError("a plain broker is running: `dpstream broker stop` it first")
    secured = secure_broker.SecureKafka.found_in(node)
    users = ", ".join(secure_broker.USERS)
    sasl = secured.kafka_section(password_env=PASSWORD_ENV)
    mtls = secured.kafka_section(listener="SSL")
    return "\n".join(
        [
            f"Kafka broker (secured) {'already ' if info['already_running'] else ''}running",
            f"  SASL_SSL, {secure_broker.MECHANISM}, users {users}: {secured.sasl_bootstrap}",
            f"  SSL with client certificates (mutual TLS), the same users: {secured.ssl_bootstrap}",
            "  the users may do nothing until ACLs grant it: dpstream acls --config FILE --apply",
            "",
            f"export KAFKA_BOOTSTRAP_SERVERS={secured.sasl_bootstrap}",
            f'export {PASSWORD_ENV}="$(cat {secured.password_file("dpstream")})"',
            "",
            "# the pipeline config's kafka: section (SASL_SSL, user dpstream)",
            yaml.safe_dump({"kafka": sasl}, sort_keys=False).rstrip(),
            f"# or over mutual TLS (bootstrap {secured.ssl_bootstrap})",
            yaml.safe_dump({"kafka": mtls}, sort_keys=False).rstrip(),
        ]
    )


def cmd_acls(args: argparse.Namespace) -> int:
    from dpstream.deploy import broker, secure_broker

    from ..kafka.acls import Principals, all_args, script

    cfg = load_config(args.config)
    principals = Principals(args.worker, args.reader or None, args.producer or None)
    if not args.apply:
        print(script(cfg, principals), end="")
        return 0
    node = broker.running_detached()
    if node is None or not secure_broker.is_secure(node.data_dir):
        raise DpStreamError(
            "--apply needs the local secured broker: dpstream broker start --secure"
        )
    secured = secure_broker.SecureKafka.found_in(node)
    commands = all_args(cfg, principals)
    for argv in commands:
        secured.kafka_acls(argv)
    print(f"granted {len(commands)} ACL commands on the secured broker {secured.sasl_bootstrap}")
    return 0


def connected(cfg: PipelineConfig, arg: str | None) -> str:
    """The bootstrap servers (:func:`resolve_bootstrap`), once a connection with the
    config's ``kafka:`` settings worked: a refused one stops here, naming the setting."""
    from ..kafka.security import check_connection

    bootstrap = resolve_bootstrap(arg)
    check_connection(cfg.kafka, bootstrap)
    return bootstrap


def cmd_registry(args: argparse.Namespace) -> int:
    from dpstream.deploy import registry

    if args.action == "fetch":
        print(registry.fetch_registry())
    elif args.action == "start":
        info = registry.start_detached()
        print(f"Schema Registry running at {info['url']}")
        print(f"  export {registry.URL_ENV}={info['url']}")
    elif args.action == "stop":
        print("stopped" if registry.stop_detached() else "no local Schema Registry was running")
    else:
        status = registry.status_detached()
        if not status:
            print("no local Schema Registry")
            return 1
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0 if status["alive"] else 1
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from dpstream.statistics.accuracy import plan_lines
    from dpstream.statistics.registry import default_tree, describe

    cfg = load_config(args.file)
    statement = cfg.privacy_statement()
    live = _live_lines(cfg, args) if args.live else []  # a refusal stops before "OK"
    print(f"{args.file}: OK")
    print(
        f"  source {', '.join(cfg.input.topics)} ({_format_line(cfg)}, "
        f"user id: {cfg.input.user_id_field}), "
        f"events topic {cfg.events_topic} ({cfg.input.partitions} partitions), "
        f"tick {cfg.ticks.interval_seconds:g}s (released {cfg.ticks.release_delay:g}s after its "
        f"end), noise {cfg.noise.mode.value}"
    )
    for s in cfg.statistics:
        # An unnamed mechanism: a new statistic's default; one the ledger ran keeps its tree
        # (under zcdp there is one counter: nothing to keep).
        new_tree = s.mechanism is None and not s.zcdp and default_tree(s)[0] != "binary"
        default = " (default for a new statistic; one that ran keeps its tree)" if new_tree else ""
        print(f"  {s.name}: {describe(s, cfg)}{default} -> {cfg.release_topic(s.name)}")
        print(f"    {_reads(s, cfg)}")
    for line in live or statement.describe():
        print(f"  {line}")
    for line in plan_lines(cfg):
        print(f"  {line}")
    return 0


def _live_lines(cfg: PipelineConfig, args: argparse.Namespace) -> list[str]:
    """``check-config --live``: what a worker starting now would refuse, it refuses."""
    from .ledger_view import live_check

    return live_check(cfg, resolve_bootstrap(args.bootstrap))


def _reads(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """The event fields ``stat`` reads: user id, value (its bounds, its grid), filter."""
    from dpstream.statistics.registry import value_rule

    rule = value_rule(stat)
    parts = [f"user id {cfg.input.user_id_field}"]
    if rule.needs_value:
        value = f"value {rule.value_path or 'value'}"
        if rule.bounds is not None:
            value += f" clipped into [{rule.bounds[0]:g}, {rule.bounds[1]:g}]"
        if stat.resolution is not None:
            lower, upper = stat.value_bounds
            value += f" on a {(upper - lower) / stat.resolution:g} grid"
        parts.append(value)
    if rule.cell_field is not None:
        parts.append(f"cell {rule.cell_field}")
    if stat.key is not None:
        parts.append(f"only key = {stat.key}")
    for path, wanted in (stat.where or {}).items():
        if isinstance(wanted, list):
            parts.append(f"only {path} in {orjson.dumps(wanted).decode()}")
        else:
            parts.append(f"only {path} = {orjson.dumps(wanted).decode()}")
    return "reads " + ", ".join(parts)


def _format_line(cfg: PipelineConfig) -> str:
    registry = cfg.input.schema_registry
    if registry is None:
        return cfg.input.format
    return f"{cfg.input.format}, schemas from {registry.url}"


def cmd_worker(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    endpoint = metrics_endpoint(cfg, args.metrics_port, args.no_metrics)
    return run_worker(cfg, resolve_bootstrap(args.bootstrap), args.loglevel, args.ingest, endpoint)


def metrics_endpoint(
    cfg: PipelineConfig, port: int | None, off: bool = False
) -> tuple[str, int] | None:
    """Where the worker serves its metrics and probes, (host, port), or None: the config's
    ``metrics:`` section, turned on at ``port`` by ``--metrics-port``, off by
    ``--no-metrics``."""
    if off or (port is None and not cfg.metrics.enabled):
        return None
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port: must be a port number (0-65535), got {port}")
    return cfg.metrics.host, cfg.metrics.port if port is None else port


def run_worker(
    cfg: PipelineConfig,
    bootstrap: str,
    loglevel: str = "info",
    ingest: str = INGEST_DEFAULT,
    endpoint: tuple[str, int] | None = None,
) -> int:
    """A worker of ``cfg`` until it is stopped, with its metrics and probes served on
    ``endpoint`` (host, port; None: not served). Its exit status: 0 when it stopped
    cleanly, ``EXIT_STOPPED_UNFLUSHED`` when its ingest could not flush (the stop bound
    itself ends the process with that status: ``lifecycle.Worker``)."""
    from ..ingest.consumer import IngestHandle
    from ..kafka.security import check_connection
    from ..kafka.topics import (
        adopt_former_worker_offsets,
        check_source_topics,
        ensure_topics,
        missing_topics,
        replication,
    )
    from ..worker.app import create_app
    from ..worker.exits import EXIT_STOPPED_UNFLUSHED
    from ..worker.keys import load_key
    from ..worker.ledger import record_statement, resolved_config
    from ..worker.lifecycle import Worker
    from ..worker.metrics import WorkerMetrics
    from ..worker.operations import Operations, bind
    from ..worker.release_values import release_encoders

    key = load_key(cfg)  # before anything else: no key, no start
    # A port already taken stops the worker here, before it writes anything.
    server = None if endpoint is None else bind(*endpoint)
    # A refused password or certificate stops here, with one message naming the setting.
    brokers = check_connection(cfg.kafka, bootstrap)
    check_source_topics(cfg, bootstrap)  # never created: a missing one stops here
    ensure_topics(cfg, bootstrap, only=[cfg.outputs.ledger_topic])
    # A statistic that names no mechanism runs the tree the ledger says it ran, or if it is
    # new the default tree (registry.resolved): before anything is built from the config.
    cfg = resolved_config(cfg, bootstrap, key)
    # With outputs.format avro: the release topics' schemas registered, or refused here
    # (naming outputs.schema_registry) before the ledger records a run.
    encoders = release_encoders(cfg)
    # A changelog that is gone while the ledger says its statistics released: refused
    # before the topics are made again (ledger.record_statement).
    lost = [t for t in missing_topics(cfg, bootstrap) if t in cfg.changelog_topics]
    # Refuses a statistic changed under its name, another key, a forged ledger, lost
    # state; the statement (and each statistic's run) goes to the ledger.
    plan = record_statement(cfg, bootstrap, key, lost_state=lost)
    ensure_topics(cfg, bootstrap)
    adopt_former_worker_offsets(cfg, bootstrap)
    datadir = Path(tempfile.mkdtemp(prefix=f"dpstream-{cfg.app_id}-"))
    handle = None if ingest == "off" else IngestHandle(cfg, bootstrap, ingest)
    operations = None
    status: object = 0
    try:
        replicas, _ = replication(brokers)
        metrics = WorkerMetrics(cfg, plan.statement)
        app = create_app(
            cfg, bootstrap, key, datadir, handle, plan.runs, replicas, metrics, encoders
        )
        worker = Worker(app, ingest=handle, loglevel=loglevel, quiet=True, override_logging=True)
        if server is not None:
            operations = Operations(cfg, app, metrics, handle)
            operations.start(worker.loop, server)
        worker.execute_from_commandline()
    except SystemExit as exc:  # how Faust's worker ends, 0 after a clean stop
        status = exc.code
    finally:
        if operations is not None:
            operations.stop()
        elif server is not None:
            server.server_close()
        ingest_clean = handle is None or handle.stop()
    if status in (0, None) and not ingest_clean:
        return EXIT_STOPPED_UNFLUSHED
    return status if isinstance(status, int) else 1


def cmd_ingest(args: argparse.Namespace) -> int:
    import threading

    from ..ingest.consumer import run_ingest
    from ..kafka.topics import check_source_topics, ensure_ingest_topics
    from ..worker.exits import EXIT_STOPPED_UNFLUSHED

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [ingest] %(message)s")
    cfg = load_config(args.config)
    bootstrap = connected(cfg, args.bootstrap)
    # An ingest configured for another partition count would route users to partitions
    # whose stage 1 does not own them: refused here, before it reads anything.
    check_source_topics(cfg, bootstrap)
    ensure_ingest_topics(cfg, bootstrap)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # It finishes what it sent within ingest.consumer.CLOSE_SECONDS, broker or not.
    return 0 if run_ingest(cfg, bootstrap, stop) else EXIT_STOPPED_UNFLUSHED


def cmd_lag(args: argparse.Namespace) -> int:
    from ..ingest.consumer import source_lag

    cfg = load_config(args.config)
    lags = source_lag(cfg, connected(cfg, args.bootstrap))
    for name, row in lags.items():
        print(f"{name}\tcommitted={row['committed']}\tend={row['end']}\tlag={row['lag']}")
    print(f"total lag: {sum(row['lag'] for row in lags.values())}")
    return 0


def _jsonl(path: str):
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise DpStreamError(f"{path}:{lineno}: not valid JSON") from None


def cmd_produce(args: argparse.Namespace) -> int:
    from ..kafka.clients import make_producer, produce_events
    from ..kafka.topics import create_source_topics
    from .synthetic import synthetic_events

    cfg = load_config(args.config)
    if args.events:
        events = list(_jsonl(args.events))
    else:
        events = list(
            synthetic_events(
                args.synthetic_users,
                args.count,
                seed=args.seed,
                user_id_field=cfg.input.user_id_field,
            )
        )
    serialize = _serializer(args, cfg, events)  # a wrong flag stops before Kafka is asked
    bootstrap = connected(cfg, args.bootstrap)
    # As a user's producer setup would (dpstream's worker never creates them); a producer
    # needs no right on dpstream's own topics.
    create_source_topics(cfg, bootstrap)
    producer = make_producer(bootstrap, cfg.kafka)
    chunk = max(1, int(args.rate / 10)) if args.rate else len(events)
    sent = 0
    start = time.monotonic()
    for i in range(0, len(events), chunk):
        sent += produce_events(
            producer, cfg, events[i : i + chunk], batch=args.batch, serialize=serialize
        )
        if args.rate:
            time.sleep(max(0.0, start + sent / args.rate - time.monotonic()))
    producer.flush(30)
    fmt = args.format or cfg.input.format
    print(f"produced {sent} events to {cfg.input.topics[0]} ({fmt})")
    return 0


def _serializer(args: argparse.Namespace, cfg: PipelineConfig, events: list[dict]):
    """The record value of an event for ``--format`` (default: the config's
    ``input.format``)."""
    fmt = args.format or cfg.input.format
    if fmt == "json":
        if args.schema:
            raise ConfigError("--schema: only applies to --format avro")
        return orjson.dumps
    if fmt != "avro":
        raise ConfigError(f"--format: produce writes json or avro, not {fmt}")
    if args.batch > 1:
        raise ConfigError("--batch: batch envelopes are JSON only")
    from .avro_events import avro_serializer

    return avro_serializer(cfg, events, Path(args.schema) if args.schema else None)


def cmd_tail(args: argparse.Namespace) -> int:
    from dpstream.client import releases

    cfg = load_config(args.config)
    stop = threading.Event()
    timer = threading.Timer(args.timeout, stop.set) if args.timeout else None
    # Without --follow: to the end of the topic as it is now, every release with
    # --from-beginning, else the latest one.
    latest_only = not args.follow and not args.from_beginning
    read = releases(
        args.statistic,
        connected(cfg, args.bootstrap),
        cfg,
        from_beginning=args.from_beginning or latest_only,
        follow=args.follow,
        stop=stop,
    )
    seen, latest = 0, None
    try:
        if timer:
            timer.start()
        for release in read:
            line = orjson.dumps(dict(release.fields)).decode() + "\n"
            if latest_only:
                latest = line
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
            seen += 1
            if args.max is not None and seen >= args.max:
                break
    except KeyboardInterrupt:
        pass
    finally:
        read.close()
        if timer:
            timer.cancel()
    if latest is not None and args.max != 0:
        sys.stdout.write(latest)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from .dashboard import serve

    cfg = load_config(args.config)
    serve(cfg, connected(cfg, args.bootstrap), args.host, args.port)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from ..worker.keys import load_key
    from .replay import replay_file

    cfg = load_config(args.config)
    for line in replay_file(cfg, args.events, load_key(cfg), unverified=args.unverified):
        sys.stdout.write(line.decode() + "\n")
    return 0


def cmd_export_log(args: argparse.Namespace) -> int:
    from ..worker.keys import load_key
    from .export import export_log

    cfg = load_config(args.config)
    try:
        key = load_key(cfg)
    except ConfigError as exc:
        # Without the key the log has no MAC: a keyed replay of it needs --unverified.
        print(f"dpstream: {exc}; the log is written without its MAC", file=sys.stderr)
        key = None
    out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115
    try:
        for line in export_log(cfg, connected(cfg, args.bootstrap), key):
            out.write(line + b"\n")
    finally:
        if args.out:
            out.close()
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    from ..worker.keys import load_key
    from ..worker.ledger import record_statement, resolved_config
    from .ledger_view import ledger_report

    cfg = load_config(args.config)
    bootstrap = connected(cfg, args.bootstrap)
    key = load_key(cfg)
    cfg = resolved_config(cfg, bootstrap, key)
    if args.charge_again:
        adopted = record_statement(cfg, bootstrap, key, charge_again=args.charge_again)
        for name in args.charge_again:
            print(f"{name}: new run {adopted.runs[name].run_id} (the old run stays charged)")
        for line in adopted.statement.describe():
            print(line)
        return 0
    for line in ledger_report(cfg, bootstrap, key):
        print(line)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(
        duration=args.duration,
        users=args.users,
        rate=args.rate,
        out=Path(args.out),
        fmt=args.format,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpstream", description="Differentially private running statistics over Kafka."
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", required=True, help="pipeline definition (YAML)")
        p.add_argument("--bootstrap", help="Kafka bootstrap servers (host:port,...)")
        return p

    p = sub.add_parser("broker", help="local Apache Kafka (KRaft) broker from Kafka's jars")
    p.add_argument("action", choices=["start", "stop", "status", "fetch"])
    p.add_argument(
        "--secure",
        action="store_true",
        help="start: SASL_SSL (SCRAM) and mutual TLS listeners, ACLs enforced",
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="start: keep the broker's data in DIR (stop keeps it; a start on it again has "
        "its topics, offsets and ports back)",
    )
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("acls", help="the Kafka ACLs a pipeline needs, as kafka-acls commands")
    p.add_argument("--config", required=True, help="pipeline definition (YAML)")
    p.add_argument("--worker", default="User:dpstream", help="the worker's principal")
    p.add_argument("--reader", default="User:reader", help="a release reader ('' for none)")
    p.add_argument("--producer", default="User:producer", help="a source producer ('' for none)")
    p.add_argument("--apply", action="store_true", help="grant them on the local secured broker")
    p.set_defaults(func=cmd_acls)
    p = sub.add_parser(
        "registry", help="local Schema Registry (Apicurio, Confluent's API) from Maven Central"
    )
    p.add_argument("action", choices=["start", "stop", "status", "fetch"])
    p.set_defaults(func=cmd_registry)

    p = sub.add_parser("check-config", help="validate a pipeline definition")
    p.add_argument("file")
    p.add_argument(
        "--live",
        action="store_true",
        help="also check against Kafka, reading only: the key, the connection, the source "
        "topics, the ledger (what a worker starting now would refuse)",
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap servers, with --live")
    p.set_defaults(func=cmd_check_config)

    p = with_config(sub.add_parser("worker", help="run a dpstream worker (Faust)"))
    p.add_argument("--loglevel", default="info")
    p.add_argument(
        "--ingest",
        choices=["process", "thread", "off"],
        default=INGEST_DEFAULT,
        help="where this worker's ingest runs (off: run `dpstream ingest` elsewhere)",
    )
    endpoint = p.add_mutually_exclusive_group()
    endpoint.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics, /livez and /readyz on this port (overrides metrics.port and "
        "turns them on; 0: any free port)",
    )
    endpoint.add_argument(
        "--no-metrics", action="store_true", help="do not serve them, whatever metrics: says"
    )
    p.set_defaults(func=cmd_worker)

    p = with_config(sub.add_parser("ingest", help="run only an ingest (source -> events topic)"))
    p.set_defaults(func=cmd_ingest)

    p = with_config(sub.add_parser("lag", help="the ingest's lag per source partition"))
    p.set_defaults(func=cmd_lag)

    p = with_config(sub.add_parser("produce", help="produce events to the first source topic"))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--events", help="JSONL file of events")
    src.add_argument("--synthetic-users", type=int, help="generate events from N users")
    p.add_argument("--count", type=int, default=10_000, help="synthetic events to produce")
    p.add_argument(
        "--rate", type=float, default=0, help="events per second (0: as fast as possible)"
    )
    p.add_argument("--batch", type=int, default=1, help="events per batch envelope (1: none)")
    p.add_argument(
        "--format",
        choices=["json", "avro"],
        help="record values in JSON or Avro through input.schema_registry "
        "(default: the config's input.format)",
    )
    p.add_argument(
        "--schema", help="Avro schema file (.avsc; default: made from the events' fields)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_produce)

    p = with_config(sub.add_parser("tail", help="print a statistic's releases as JSONL"))
    p.add_argument("statistic")
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="every release so far (default: the latest; with --follow: only new ones)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing releases as they come (until Ctrl-C); default: exit at the end",
    )
    p.add_argument("--max", type=int, help="print at most this many releases")
    p.add_argument("--timeout", type=float, help="with --follow: stop after this many seconds")
    p.set_defaults(func=cmd_tail)

    p = with_config(
        sub.add_parser("dashboard", help="a live web page of the releases, budget and lag")
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=8050, help="the port (0: any free one)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("replay", help="run the pipeline offline over a JSONL event log")
    p.add_argument("--config", required=True)
    p.add_argument("--events", required=True, help='JSONL log with {"tick": n} markers')
    p.add_argument(
        "--unverified",
        action="store_true",
        help="replay a log this pipeline did not export with its key: the output is as "
        "sensitive as the key (docs/security.md)",
    )
    p.set_defaults(func=cmd_replay)

    p = with_config(sub.add_parser("ledger", help="the ledger: what was spent, and runs"))
    p.add_argument(
        "--charge-again",
        nargs="+",
        metavar="STATISTIC",
        help="begin these statistics anew (their state was lost): the old runs stay "
        "charged and the new ones are charged too",
    )
    p.set_defaults(func=cmd_ledger)

    p = with_config(sub.add_parser("export-log", help="write the events topic as a replay log"))
    p.add_argument("--out", help="output file (default: stdout)")
    p.set_defaults(func=cmd_export_log)

    p = sub.add_parser("demo", help="broker + worker + synthetic users, live private counts")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of event traffic")
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--rate", type=float, default=300.0, help="events per second")
    p.add_argument("--out", default="demo-out", help="folder for the plot and logs")
    p.add_argument(
        "--format",
        choices=["json", "avro"],
        default="json",
        help="avro: produce through a local Schema Registry (Apicurio, from Maven Central)",
    )
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"dpstream: config error: {exc}", file=sys.stderr)
        return 2
    except DpStreamError as exc:
        print(f"dpstream: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
