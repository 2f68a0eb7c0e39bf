"""dpstream against a real Kafka broker and against what users would write instead:
throughput, release latency, memory (issues 7, 14 and 16).

One command measures, in one run and on the same events, pre-produced once per input shape
(single-event records in a source topic; dpstream's columnar envelopes in a topic shaped
like its events topic) by a plain confluent-kafka Producer, each contender in a fresh
process reading the whole topic:

  a. the ceilings: a plain consumer (aiokafka, confluent-kafka, and confluent-kafka with
     ``fetch.queue.backoff.ms=10``) reading and parsing the topic;
  b. the naive Faust agent that only parses and counts (and, when named in
     ``--contenders``, three diagnostic variants of it with stage 1's table writes);
  c. the peers, on single-event records: Kafka Streams ``groupByKey().count()``
     (at_least_once, exactly_once_v2) and a Quix Streams stateful count (at-least-once,
     exactly-once);
  d. the dpstream pipeline end to end (the worker's ingest + stage 1 + stage 2 +
     releases) on single-event records, with the ingest in a child process or a thread of
     the worker (``--ingest-mode``); and on our envelopes with the ingest off;
  e. release latency (release time minus tick end) while events arrive at a fixed rate;
  f. the worker's peak RSS, its growth per user, the bytes of state per user and per tree;
  g. in process: the ingest's routing and stage 1 on its envelopes, in µs per event;

prints a table (events/s, wall time from process start, CPU µs per event, peak RSS, each
contender's ratio to the ceilings of the same run) and the targets as ratios to the peers
of the same run, and writes docs/benchmarks.md. ``--profile`` adds py-spy and cProfile
profiles of the worker (section "Profile: <label>", kept across runs with other labels).

    .venv/bin/python -m bench.throughput                 # full: 3 runs, ~20-40 min
    .venv/bin/python -m bench.throughput --quick         # 1 run, small sizes, ~2 min
    .venv/bin/python -m bench.throughput --span quix=2000000  # a longer span for Quix
    .venv/bin/python -m bench.throughput --profile --profile-label after
    .venv/bin/python -m bench.throughput --render RUN.json [OUT.md]  # re-render a --json run

The modules: ``datasets`` (events, records, pre-produced topics), ``workers`` (a dpstream
worker's config, process and watcher), ``peers`` (building and running Kafka Streams and
Quix Streams), ``contenders`` (one run of each contender; latency and memory runs),
``micro`` (in-process measurements), ``report`` (the document), ``cli`` (this command).

The broker is ``KAFKA_BOOTSTRAP_SERVERS`` if set, else one started for the run
(``deploy/broker.py``). Definitions are in the document this writes ("How it is
measured"); this is a benchmark: nothing in the test suite asserts on its timings.
"""
