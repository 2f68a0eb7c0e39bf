"""tau: auto's instances on a k-ary tree (``make_user_level(tree=...)``): each instance is the
k-ary counter of ``kary_tree`` over the whole re-admitted prefix Truncate(D, tau~_j), with
its own node ids; the exact sensitivity of its node vector, tested as oracle 7 tests the
binary tree's (test_counter.py); the default stays the binary tree."""

from __future__ import annotations

import itertools
import zlib
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.operators.trees import kary_tree
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import svt
from tests.noise_doubles import NodeNoise

KEY = bytes(range(32))
TREES = [("kary_subtract", 3), ("kary_subtract", 4), ("kary", 3), ("kary_subtract", 13)]

Item = tuple[int, int, int]  # (user, bin, units)


def run(spec: ul.UserLevelSpec, ticks: list[list[Item]], noise) -> list[ul.UserLevelRelease]:
    state, totals, releases = ul.init(spec), {}, []
    for items in ticks:
        bands, crossings, totals = ul.split_tick(totals, items, spec.bins)
        state, rel = ul.step(spec, state, bands, crossings, noise)
        releases.append(rel)
    return releases


def truncated_leaves(ticks: list[list[Item]], tau: int, bins: int) -> list[list[int]]:
    """Leaf s of Truncate(D, tau) per bin: each user's first tau units in time order."""
    used: dict[int, int] = {}
    leaves = []
    for items in ticks:
        leaf = [0] * bins
        for user, r, units in items:
            before = used.get(user, 0)
            leaf[r] += min(max(tau - before, 0), units)
            used[user] = before + units
        leaves.append(leaf)
    return leaves


def kary_nodes(leaves: list[list[int]], k: int) -> dict[tuple[int, int, int], list[int]]:
    """Every node of Alg. 3 under kary_tree's periods, from scratch: period p (its k^p steps
    from global step 1 + (k^p - 1) / (k - 1)), level 1..p+1, index i covering local steps
    [i k^(level-1) + 1, (i+1) k^(level-1)] -> per-bin sum of the leaves in it (missing
    leaves are 0). Only nodes that meet the stream are listed (the others hold 0)."""
    bins, horizon = len(leaves[0]), len(leaves)
    out = {}
    period, start = 0, 1
    while start <= horizon:
        for level in range(1, period + 2):
            size = k ** (level - 1)
            for index in range(k**period // size + 1):
                lo = start + index * size
                if lo > horizon or index * size >= k**period:
                    break
                hi = min(lo + size - 1, horizon)
                out[(period, level, index)] = [
                    sum(leaves[s - 1][r] for s in range(lo, hi + 1)) for r in range(bins)
                ]
        start += k**period
        period += 1
    return out


def forced(schedule: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, exponent, last_t = [], 1, 0
    for t, inc in sorted(schedule):
        if t > last_t:
            exponent += inc
            out.append((t, 1 << exponent))
            last_t = t
    return out


def stream_strategy(bins: int, max_units: int, max_ticks: int = 45):
    item = st.tuples(st.integers(0, 4), st.integers(0, bins - 1), st.integers(1, max_units))
    return st.lists(st.lists(item, max_size=4), min_size=1, max_size=max_ticks)


schedule_strategy = st.lists(st.tuples(st.integers(1, 45), st.integers(0, 2)), max_size=5)


# ---------------------------------------------------------------------------------------
# Each instance is kary_tree's counter over the whole re-admitted prefix


@pytest.mark.parametrize("tree", TREES)
@settings(max_examples=25, deadline=None)
@given(stream_strategy(2, 5), schedule_strategy)
def test_each_instance_is_the_kary_counter_over_its_truncated_prefix(tree, ticks, schedule):
    """With keyed noise, every release (each bin) equals ``kary_tree.step`` run from tick 1
    over the leaves of Truncate(D, tau~_j) of the releasing instance j, with that
    instance's tree (``instance_tree``) and the same noise: re-admission into the original
    ticks makes an instance a fresh k-ary counter over the whole prefix."""
    spec = ul.make_user_level(
        "kt", 2, Fraction(1, 10), bins=2, forced_schedule=forced(schedule), tree=tree
    )
    noise = KeyedNoise(KEY)
    releases = run(spec, ticks, noise)
    for t, rel in enumerate(releases, 1):
        assert rel.tau == svt.forced_tau(spec.tracker, t)
        kary = ul.instance_tree(spec, rel.instance, rel.tau)
        leaves = truncated_leaves(ticks[:t], rel.tau, 2)
        for r in range(2):
            state, release = kary_tree.init(kary), None
            for leaf in leaves:
                state, release = kary_tree.step(kary, state, leaf[r], BinNoise(noise, r))
            assert release is not None and rel.values[r] == release.value


class BinNoise:
    """Bin r's view of a source: the user-level ids end with the bin, kary_tree's do not."""

    def __init__(self, inner: KeyedNoise, r: int) -> None:
        self.inner, self.r = inner, r

    def discrete_laplace(self, node, scale):
        return self.inner.discrete_laplace((*node, self.r), scale)


@pytest.mark.parametrize("tree", TREES)
@settings(max_examples=25, deadline=None)
@given(stream_strategy(1, 3), schedule_strategy)
def test_a_release_is_the_analysis_variant_on_the_truncated_stream(tree, ticks, schedule):
    """Alg. 3's form: the release at t is sum over the walk of sign * (exact node + its
    noise), the nodes holding Truncate(D, tau~_t) of the WHOLE stream (future ticks too:
    the walk's signed nodes add up to the prefix). Scripted noise (a distinct value per
    node) pins every node id and sign; the recorded scales are (p+1) tau~ / epsilon_inst_j."""
    spec = ul.make_user_level("a3", 2, Fraction(1, 10), forced_schedule=forced(schedule), tree=tree)
    scripted = NodeNoise(lambda node, scale: zlib.crc32(repr(node).encode()) % 97 - 48)
    recorder = RecordingNoise(scripted)
    releases = run(spec, ticks, recorder)
    for t, rel in enumerate(releases, 1):
        nodes = kary_nodes(truncated_leaves(ticks, rel.tau, 1), tree[1])
        kary = ul.instance_tree(spec, rel.instance, rel.tau)
        value = 0
        for node, scale, sign in kary_tree.release_terms(kary, t):
            period, level, index = node[-3:]
            exact = nodes.get((period, level, index), [0])[0]
            value += sign * (exact + scripted.discrete_laplace((*node, 0), scale))
            assert scale == Fraction((period + 1) * rel.tau) / ul.epsilon_instance(
                spec, rel.instance
            )
        assert rel.value == value
    drawn = {node[:3] for node, _, _ in recorder.calls if node[1] == "inst"}
    assert drawn == {("a3", "inst", j) for j in {rel.instance for rel in releases}}


# ---------------------------------------------------------------------------------------
# Sensitivity (oracle 7 for the k-ary tree)


@pytest.mark.parametrize("k", [3, 4, 5])
@settings(max_examples=40, deadline=None)
@given(stream_strategy(2, 5, max_ticks=40), st.sampled_from([2, 4, 8]), st.data())
def test_kary_instance_sensitivity(k, ticks, tau, data):
    """Removing all of one user's items moves the node vector of Truncate(., tau) so that
    sum over nodes |delta| / (p+1) <= tau: the privacy loss sum |delta| / scale with scale
    (p+1) tau / epsilon_inst is <= epsilon_inst. Removing a subset: <= 2 tau (multiplier
    2). Every leaf of period p lies in exactly p+1 nodes (one per level), which is what
    the (p+1) of the scale pays for."""
    users = sorted({u for items in ticks for u, _, _ in items}) or [0]
    user = data.draw(st.sampled_from(users))
    full = kary_nodes(truncated_leaves(ticks, tau, 2), k)
    for subset in (None, data.draw(st.sets(st.integers(0, 40)))):
        position, reduced = 0, []
        for items in ticks:
            keep = []
            for item in items:
                if item[0] == user:
                    position += 1
                    if subset is None or position in subset:
                        continue
                keep.append(item)
            reduced.append(keep)
        other = kary_nodes(truncated_leaves(reduced, tau, 2), k)
        loss = sum(
            Fraction(sum(abs(x - y) for x, y in zip(vec, other[key], strict=True)), key[0] + 1)
            for key, vec in full.items()
        )
        assert loss <= (tau if subset is None else 2 * tau)


def test_the_kary_sensitivity_bound_is_attained():
    """A user whose tau units all fall in one tick of period p moves p+1 nodes by tau each:
    the loss is exactly tau, so the scale (p+1) tau / epsilon_inst cannot be smaller."""
    tau, k = 4, 3
    ticks = [[] for _ in range(20)]
    ticks[9] = [(0, 0, tau)]  # tick 10, in period 2 (steps 5..13)
    full = kary_nodes(truncated_leaves(ticks, tau, 1), k)
    empty = kary_nodes(truncated_leaves([[] for _ in range(20)], tau, 1), k)
    moved = {key: abs(vec[0] - empty[key][0]) for key, vec in full.items() if vec != empty[key]}
    assert {key[0] for key in moved} == {2} and len(moved) == 3
    assert sum(Fraction(d, key[0] + 1) for key, d in moved.items()) == tau


# ---------------------------------------------------------------------------------------
# The default and the validation


def test_the_default_tree_is_binary_and_unchanged():
    spec = ul.make_user_level("d", 2, Fraction(1, 10), bins=2)
    assert spec.tree == ul.BINARY == ("binary", 2)
    explicit = ul.make_user_level("d", 2, Fraction(1, 10), bins=2, tree=("binary", 2))
    assert explicit == spec
    ticks = [[(u % 3, u % 2, 1)] for u in range(20)]
    assert run(spec, ticks, KeyedNoise(KEY)) == run(explicit, ticks, KeyedNoise(KEY))
    rec = RecordingNoise(ZeroNoise())
    run(spec, ticks[:5], rec)
    binary_ids = {
        (*node_id, r)
        for t in range(1, 6)
        for _, node_id, _ in ul.release_nodes(spec, t, 1, 2)
        for r in range(2)
    }
    assert {node for node, _, _ in rec.calls if node[1] == "inst"} == binary_ids


def test_a_kary_instance_has_a_fraction_of_the_binary_variance():
    """k = 13 with subtraction against the binary tree at tick 5000 of one instance: 0.29
    of the binary tree's variance (docs/design.md, section 5a)."""
    binary = ul.make_user_level("v", 2, Fraction(1, 10), forced_schedule=[(1, 4)])
    kary = ul.make_user_level(
        "v", 2, Fraction(1, 10), forced_schedule=[(1, 4)], tree=("kary_subtract", 13)
    )

    def variance(spec: ul.UserLevelSpec) -> float:
        return sum(2 * float(b) ** 2 for b in ul.release_scales(spec, 5000, 1, 4))

    assert variance(kary) < 0.3 * variance(binary)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (("binary", 3), 'tree must be ("binary", 2), ("kary", k) or ("kary_subtract", k)'),
        (("ternary", 3), 'tree must be ("binary", 2), ("kary", k) or ("kary_subtract", k)'),
        ("kary", 'tree must be ("binary", 2), ("kary", k) or ("kary_subtract", k)'),
        (("kary_subtract", 2), "k must be >= 3 when subtract is True, got 2"),
        (("kary", 1), "k must be >= 2, got 1"),
    ],
)
def test_make_rejects_bad_trees(tree, message):
    with pytest.raises(InvalidOperatorConfig) as info:
        ul.make_user_level("v", 2, Fraction(1, 10), tree=tree)
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------------------------------
# The tuning a new statistic gets: the instances' sensitivity, exhaustively


@pytest.mark.parametrize("tree", [("kary_subtract", 3), ("kary_subtract", 13), ("kary", 3)])
def test_new_tuning_instances_privacy_loss_exhaustive(tree):
    """Every stream of 4 ticks in which each of two users sends 0, 1 or 3 items a tick
    (3^8 = 6,561 streams), under the tuning a new statistic gets (a quarter of epsilon to
    the tracker, the telescoping series; tau_1 = 2 here instead of 256 to keep the streams
    small: tau_1 only chooses which tau the instances truncate at). For instance j = 1 at
    tau 2 and j = 2 at tau 4, removing either user moves the instance's node vector by a
    privacy loss sum |delta| / scale of at most epsilon_inst_j, the scales being the
    operator's own (``kary_tree.node_scale`` of ``counter.instance_tree``), and the bound
    is attained. Count(D_t, 2^i), the tracker's query, moves by at most 1 at every t and i.
    With the exact budgets of test_counter.py, the whole is epsilon-DP."""
    spec = ul.make_user_level(
        "tn",
        1,
        Fraction(1, 10),
        tree=tree,
        tracker_share=Fraction(1, 4),
        tracker_series="telescoping",
        instance_series="telescoping",
        start_exponent=1,
    )
    assert [ul.epsilon_instance(spec, j) for j in (1, 2)] == [Fraction(3, 8), Fraction(1, 8)]
    name, k = tree
    worst = {1: Fraction(0), 2: Fraction(0)}
    for sends in itertools.product((0, 1, 3), repeat=8):
        ticks = [[(0, 0, 1)] * sends[2 * s] + [(1, 0, 1)] * sends[2 * s + 1] for s in range(4)]
        for j, tau in ((1, 2), (2, 4)):
            instance = ul.instance_tree(spec, j, tau)
            full = kary_nodes(truncated_leaves(ticks, tau, 1), k)
            for user in (0, 1):
                reduced = [[item for item in items if item[0] != user] for items in ticks]
                other = kary_nodes(truncated_leaves(reduced, tau, 1), k)
                loss = sum(
                    Fraction(abs(vec[0] - other[key][0])) / kary_tree.node_scale(instance, key[0])
                    for key, vec in full.items()
                )
                assert loss <= ul.epsilon_instance(spec, j)
                worst[j] = max(worst[j], loss)
        counts = [0, 0]
        for items in ticks:
            for user, _, _ in items:
                counts[user] += 1
            for i in range(4):  # removing a user removes at most its own crossing
                assert (
                    sum(c > 1 << i for c in counts)
                    - sum(c > 1 << i for u, c in enumerate(counts) if u != 0)
                    <= 1
                )
    assert worst == {1: Fraction(3, 8), 2: Fraction(1, 8)}
