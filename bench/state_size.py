"""Bytes of stage-1 state per user and of stage-2 state per statistic (issue 4, 7).

Feeds N users' events through the pipeline's own Stage1/Stage2 (no Kafka) and measures
what the Faust tables would hold: the JSON bytes of each changelog value, and the
Python heap per user entry (tracemalloc).

    .venv/bin/python bench/state_size.py --users 100000
"""

from __future__ import annotations

import argparse
import random
import tracemalloc

import orjson

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.statistics.events import Event

STATISTICS = [
    {"name": "views_fixed", "epsilon": 1, "tau": 8},
    {"name": "views", "epsilon": 1},
    {"name": "amount", "epsilon": 1, "kind": "sum", "max_value": 100},
    {"name": "levels", "epsilon": 1, "kind": "histogram", "bins": 16},
    {"name": "top", "epsilon": 1, "kind": "kselect", "bins": 16, "rank": "median"},
    {"name": "kinds", "epsilon": 1, "kind": "distinct"},
]


def measure(users: int, events_per_user: int, ticks: int, seed: int) -> dict[str, float]:
    cfg = parse_config(
        {
            "input": {"partitions": 1},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 6},
            "statistics": STATISTICS,
        }
    )
    rng = random.Random(seed)  # noqa: S311 - synthetic workload, not noise
    stage1, stage2 = Stage1(cfg), Stage2(cfg, ZeroNoise(), partitions=1)
    pstate, entries = new_partition_state(), {}
    sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
    per_tick = users * events_per_user // ticks
    tracemalloc.start()
    offset = 0
    for tick in range(1, ticks + 1):
        for _ in range(per_tick // 100):
            batch = [
                Event(f"user-{rng.randrange(users):07d}", None, float(rng.randint(1, 16)))
                for _ in range(100)
            ]
            offset += 1
            stage1.add_events(pstate, entries, batch, offset)
            pstate["last_offset"] = offset
        for report in stage1.close_tick(pstate, 0, tick):
            stage2.on_report(sstates[report.statistic], report)
    heap, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    json_bytes = sum(len(orjson.dumps(v)) + len(k) for k, v in entries.items())
    out = {
        "users": len(entries),
        "json_bytes_per_user": json_bytes / len(entries),
        "heap_bytes_per_user": heap / len(entries),
    }
    for name, state in sstates.items():
        out[f"stage2_json_bytes[{name}]"] = len(orjson.dumps(state.statistic_state))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--events-per-user", type=int, default=10)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    result = measure(args.users, args.events_per_user, args.ticks, seed=1)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value:,.0f}")


if __name__ == "__main__":
    main()
