"""Pipeline config documents for property tests (hypothesis), the one generator of them.

``config_documents`` draws statistics of every kind with random parameters, names, topics,
release-topic prefixes and app ids, as the dict a YAML file decodes to. Names are drawn
mostly from a few that collide (a statistic named ``events`` under the prefix
``dpstream-``, ``dp.x`` beside ``dp_x``), so refusals are common; the parameters mostly
from the ranges each kind takes, so most documents are valid. ``synthetic_log`` is a few
ticks of events every statistic can read, as ``dpstream replay`` lines.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from dpstream.config.statistic import KINDS

CELL_KEYS = ["a", "b"]
FIRST_TICK = 100

_NAMES = st.one_of(
    st.sampled_from(["events", "stage2", "dead-letter", "ledger", "clicks", "c.1", "c_1"]),
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,11}", fullmatch=True),
)
_APP_IDS = st.sampled_from(["dpstream", "dp", "a.b", "a_b", "shop-1"])
_PREFIXES = st.one_of(
    st.sampled_from(["dp.", "dp-", "dp_", "dpstream-", "dpstream.", "", "a_b-"]),
    st.from_regex(r"[a-z0-9._-]{0,6}", fullmatch=True),
)
_TOPICS = st.one_of(
    st.sampled_from(["clicks", "dp.clicks", "dp_clicks", "dpstream.events", "dpstream-events"]),
    st.from_regex(r"[a-zA-Z0-9._-]{1,12}", fullmatch=True),
)


@st.composite
def _tree(draw: st.DrawFn, trees: bool, fixed: bool) -> dict[str, Any]:
    """A tree counter's mechanism and its parameters: those the kind runs, mostly."""
    choices = ["binary", "kary", "kary_subtract"] if trees or fixed else ["binary"]
    if fixed:
        choices += ["expiring", "auto"]
    mechanism = draw(st.sampled_from([None, *choices]))
    out: dict[str, Any] = {} if mechanism is None else {"mechanism": mechanism}
    if mechanism in ("kary", "kary_subtract"):
        out["k"] = draw(st.integers(2, 6))
    if mechanism == "expiring":
        out["lambda"] = draw(st.sampled_from([0.5, 1.0, 2.0]))
        out["delay"] = draw(st.integers(0, 2))
    if mechanism in ("expiring", "auto") or draw(st.booleans()):
        out["horizon_ticks"] = draw(st.integers(1, 1000))
    return out


@st.composite
def _cells(draw: st.DrawFn, epsilon: float, public_counts: bool) -> dict[str, Any]:
    """A cell mean's section: the strict mode's noisy ratio, or with public counts any of
    Rameshwar et al.'s mechanisms."""
    cells: dict[str, Any] = {
        "field": "cell",
        "slot_ticks": draw(st.integers(1, 2)),
        "lower": 0.0,
        "upper": 10.0,
        "step": 1.0,
        "epoch_slots": draw(st.integers(1, 4)),
        "epoch_cap": epsilon * draw(st.integers(1, 4)),
        "keys": CELL_KEYS,
    }
    mechanisms = ["baseline", "array_averaging", "levy", "quantile", "noisy_ratio"]
    mechanism = draw(st.sampled_from(mechanisms)) if public_counts else "noisy_ratio"
    cells["mechanism"] = mechanism
    cells["counts_public"] = public_counts
    if mechanism == "noisy_ratio":
        cells["contribution_cap"] = draw(st.integers(1, 4))
    if public_counts:
        cells["clip_user"] = draw(st.booleans())
        cells["on_cap"] = draw(st.sampled_from(["drop_user", "skip_cell"]))
        if mechanism in ("array_averaging", "levy", "quantile"):
            cells["head_cap"] = draw(st.integers(1, 8))
    return cells


@st.composite
def _statistic(draw: st.DrawFn, name: str, public_counts: bool) -> dict[str, Any]:
    # With public counts mostly the kinds of that relation; now and then another: refused.
    public_kinds = public_counts and draw(st.integers(0, 4)) > 0
    kind = draw(st.sampled_from(["mean", "cell_mean"] if public_kinds else sorted(KINDS)))
    epsilon = draw(st.sampled_from([0.25, 0.5, 1.0]))
    stat: dict[str, Any] = {"name": name, "kind": kind, "epsilon": epsilon}
    if kind == "mean":
        lower = draw(st.sampled_from([-5.0, 0.0, 1.0]))
        stat["mean"] = {
            "lower": lower,
            "upper": lower + draw(st.sampled_from([1.0, 10.0])),
            "max_samples_per_user": draw(st.integers(2, 8)),
        }
        if public_counts:
            stat["mean"]["max_users"] = draw(st.integers(1, 100))
        return stat
    if kind == "cell_mean":
        stat["cells"] = draw(_cells(epsilon, public_counts))
        return stat
    entry = KINDS[kind]
    fixed = entry.fixed_tau and draw(st.booleans())
    if fixed:
        stat["tau"] = draw(st.integers(1, 16))
    stat.update(draw(_tree(entry.trees, fixed)))
    if entry.values == "max_value":
        if draw(st.booleans()):
            stat["max_value"] = draw(st.integers(1, 10))
        else:
            lower = draw(st.sampled_from([-2.0, 0.0, 1.0] if fixed else [0.0, 1.0]))
            stat.update(lower=lower, upper=5.0, resolution=draw(st.sampled_from([1, 50])))
    if entry.values == "bins":
        stat["bins"] = draw(st.integers(1, 6))
    if entry.rank:
        stat["rank"] = draw(st.sampled_from(["max", "median", 1, 2]))
    if not fixed and entry.deletions and draw(st.integers(0, 4)) == 0:
        stat["deletions"] = True
    if draw(st.integers(0, 3)) == 0:
        stat["key"] = "click"
    elif draw(st.integers(0, 3)) == 0:
        stat["where"] = {"key": draw(st.sampled_from(["view", ["click", "view"]]))}
    if entry.needs_value and draw(st.integers(0, 3)) == 0:
        stat["value_field"] = "detail.amount"  # a nested field (synthetic_events has it)
    return stat


@st.composite
def config_documents(draw: st.DrawFn, max_statistics: int = 3) -> dict[str, Any]:
    """A pipeline config as decoded YAML; zero noise (``insecure_zero``) so that a worker
    needs no key."""
    names = draw(st.lists(_NAMES, min_size=1, max_size=max_statistics))
    # Who sent how many events when is public: only means of that relation (else refused).
    public_counts = draw(st.integers(0, 5)) == 0
    statistics = [draw(_statistic(name, public_counts)) for name in names]
    spent = sum(s["epsilon"] for s in statistics)
    outputs: dict[str, Any] = {"release_topic_prefix": draw(_PREFIXES)}
    if draw(st.booleans()):
        outputs["dead_letter_topic"] = draw(_TOPICS)
    if draw(st.booleans()):
        outputs["ledger_topic"] = draw(_TOPICS)
    return {
        "app_id": draw(_APP_IDS),
        "input": {
            "topics": draw(st.lists(_TOPICS, min_size=1, max_size=2)),
            "partitions": draw(st.integers(1, 3)),
        },
        "outputs": outputs,
        "noise": {"mode": "insecure_zero"},
        # Now and then less than the statistics spend: refused, naming total_epsilon.
        "ticks": {"interval_seconds": draw(st.sampled_from([0.5, 1.0, 60.0]))},
        "privacy": {
            "total_epsilon": spent * draw(st.sampled_from([1, 1, 1, 2, 0.5])),
            # any_subset: refused with public counts (counts are public).
            "neighbours": draw(st.sampled_from(["whole_user"] * 3 + ["any_subset"])),
            "public_counts": public_counts,
        },
        "statistics": statistics,
    }


def synthetic_events(tick: int, users: int = 4) -> list[dict[str, Any]]:
    """One tick's events: every user sends a click and a view with a value every kind
    reads (an integer in 1..3, a real in a mean's range, a nested ``detail.amount``) and a
    cell key."""
    return [
        {
            "user_id": f"user-{u}",
            "key": key,
            "value": 1 + (u + tick) % 3,
            "detail": {"amount": 0.5 + u % 3},
            "cell": CELL_KEYS[u % len(CELL_KEYS)],
        }
        for u in range(users)
        for key in ("click", "view")
    ]


def synthetic_log(ticks: int = 4) -> list[bytes]:
    """``ticks`` ticks from ``FIRST_TICK``, each its events and its marker: replay lines."""
    lines: list[bytes] = []
    for tick in range(FIRST_TICK, FIRST_TICK + ticks):
        lines += [orjson.dumps(event) for event in synthetic_events(tick)]
        lines.append(orjson.dumps({"tick": tick}))
    return lines
