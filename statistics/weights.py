"""The keys of a report's weights (``Report.weights``): the one place that spells them.

Stage 1 sums what each user contributes to a tick under these keys and stage 2 reads them
back. They are the stages' wire format: the stage-2 topic's JSON, the export log and stage
1's changelog (the users' "kept", the partitions' "pending") hold them as built here: a
changed spelling changes those bytes, and stage 2 would misread the reports and state
written before it. The order of the keys in a dict is part of the bytes too; stage 1
decides it (``pipeline.counting``: per user, crossed powers then rank bands).

======================  ============================  ====================================
key                     built by                      what it counts
======================  ============================  ====================================
``"w"``                 ``KEPT_UNITS``                fixed tau: the kept units
                                                      (Dong-Luo-Yi Alg. 3)
``"c"``, ``"s"``        ``MEAN_SAMPLES``,             whole-user mean: the kept samples
                        ``MEAN_UNITS``                C_t and their grid units S_t
``"<s>b<band>/<bin>"``  ``band_key(s, band, bin)``    tau: auto: the units in rank band
                                                      ``band`` (Dong-Luo-Yi Alg. 5), per
                                                      histogram bin (0 for count and sum)
``"<s>x<j>"``           ``crossing_key(s, j)``        tau: auto: the users whose total
                                                      passed 2^j (Count(D_t, 2^j))
``"b<band>/<repr>"``    ``distinct_key(band, v)``     distinct: value ``v`` (as its
                                                      ``repr``, -0.0 as 0.0) at a rank in
                                                      band ``band``
======================  ============================  ====================================

``<s>`` is the stream: ``INSERTS`` ("+") or ``DELETES`` ("-"). A distinct count has no
deletions, so its value keys carry no stream. ``parse_key`` reads one key back,
``parse_weights`` and ``distinct_values`` a whole report's weights as the operators take
them. For example, a sum item of 2 units from a user who had sent 2 before: its units
have ranks 3 and 4 (rank band 2) and the user's total passes 2^1.

>>> weights = {crossing_key(INSERTS, 1): 1, band_key(INSERTS, 2, 0): 2}
>>> weights
{'+x1': 1, '+b2/0': 2}
>>> parse_weights(weights, INSERTS)
([[], [], [2]], [0, 1])
>>> parse_key("-b2/0")
BandKey(stream='-', band=2, column=0)
>>> parse_key(distinct_key(3, 2.5)), parse_key(KEPT_UNITS)
(DistinctKey(band=3, value='2.5'), None)
"""

from __future__ import annotations

from typing import NamedTuple

# The streams of a statistic with deletions (Dong-Luo-Yi Sec. VI): its insertions and its
# deletions are counted apart, under keys that start with the stream.
INSERTS, DELETES = "+", "-"
STREAMS = (INSERTS, DELETES)

# The keys of one number each: a fixed tau's kept units; the whole-user mean's kept
# samples C_t and their grid units S_t.
KEPT_UNITS = "w"
MEAN_SAMPLES, MEAN_UNITS = "c", "s"
SCALAR_KEYS = (KEPT_UNITS, MEAN_SAMPLES, MEAN_UNITS)


def band_key(stream: str, band: int, column: int) -> str:
    """The key of the units of ``stream`` in rank band ``band``, histogram bin ``column``."""
    return f"{stream}b{band}/{column}"


def crossing_key(stream: str, power: int) -> str:
    """The key of the users of ``stream`` whose total passed 2^``power``."""
    return f"{stream}x{power}"


def distinct_key(band: int, value: object) -> str:
    """The key of ``value`` (by its ``repr``) seen at a rank in band ``band``. -0.0 is
    keyed as 0.0: one number, as ``==`` and SQL's COUNT(DISTINCT) have it."""
    if type(value) is float:
        value += 0.0  # -0.0 + 0.0 is 0.0
    return f"b{band}/{value!r}"


class BandKey(NamedTuple):
    """A parsed ``band_key``."""

    stream: str
    band: int
    column: int


class CrossingKey(NamedTuple):
    """A parsed ``crossing_key``."""

    stream: str
    power: int


class DistinctKey(NamedTuple):
    """A parsed ``distinct_key``."""

    band: int
    value: str  # the value's repr, as stage 1 wrote it: stage 2 keys its state by it


def parse_key(key: str) -> BandKey | CrossingKey | DistinctKey | None:
    """What ``key`` counts; None for the keys of one number (``SCALAR_KEYS``).

    Raises:
        ValueError: ``key`` is none of the forms above.
    """
    head = key[:1]
    # tuple.__new__ skips the NamedTuples' Python-level __new__: stage 2 parses every key
    # of every report (a distinct count's: one per value).
    try:
        if head == "b":
            band, value = key[1:].split("/", 1)
            return tuple.__new__(DistinctKey, (int(band), value))
        if head in STREAMS:
            form = key[1:2]
            if form == "x":
                return tuple.__new__(CrossingKey, (head, int(key[2:])))
            if form == "b":
                band, column = key[2:].split("/")
                return tuple.__new__(BandKey, (head, int(band), int(column)))
        elif key in SCALAR_KEYS:
            return None
    except ValueError as exc:  # a number that is not one, a missing or extra "/"
        raise _not_a_key(key) from exc
    raise _not_a_key(key)


def _not_a_key(key: str) -> ValueError:
    # Its first two characters only: a distinct key holds an event's value after them.
    return ValueError(
        f"weight key must be one of the forms of pipeline.weight_keys, got {key[:2]!r}..."
    )


def parse_weights(weights: dict[str, int], stream: str) -> tuple[list[list[int]], list[int]]:
    """``bands[b][r]`` (the units in rank band b, bin r) and ``crossings[j]`` (the users
    passing 2^j) of one stream from a merged stage-1 report; other keys are skipped."""
    bands: list[list[int]] = []
    crossings: list[int] = []
    for key, value in weights.items():
        if key[:1] != stream:  # the other stream's, or no stream's
            continue
        parsed = parse_key(key)
        if isinstance(parsed, CrossingKey):
            crossings.extend([0] * (parsed.power + 1 - len(crossings)))
            crossings[parsed.power] += value
        elif isinstance(parsed, BandKey):
            while len(bands) <= parsed.band:
                bands.append([])
            row = bands[parsed.band]
            row.extend([0] * (parsed.column + 1 - len(row)))
            row[parsed.column] += value
    return bands, crossings


def distinct_values(weights: dict[str, int]) -> list[list[str]]:
    """``values_by_band[b]``: the distinct values (their reprs, sorted) seen this tick with
    a rank in band b; other keys are skipped."""
    by_band: list[list[str]] = []
    for key in weights:
        parsed = parse_key(key)
        if isinstance(parsed, DistinctKey):
            while len(by_band) <= parsed.band:
                by_band.append([])
            by_band[parsed.band].append(parsed.value)
    return [sorted(values) for values in by_band]
