"""User-level DP over event streams with unknown contributions: Dong-Luo-Yi.

* ``svt``: AboveThreshold and the continual contribution tracker (Alg. 1, Alg. 4).
* ``truncation``: fixed-tau truncation (Alg. 3).
* ``counter``: user-level count, sum and histogram with efficient restart (Alg. 5).
* ``k_selection``: max, median, any k-th value (Alg. 6), on the counter's histograms.
* ``distinct_count``: distinct count (Sec. IV-D).
* ``deletions``: insert/delete streams (Sec. VI).

*May import:* ``noise``, ``trees`` and the top-level ``errors``, ``_validate``,
``state_codec``.
"""

from . import counter, deletions, distinct_count, k_selection, svt, truncation

__all__ = ["counter", "deletions", "distinct_count", "k_selection", "svt", "truncation"]
