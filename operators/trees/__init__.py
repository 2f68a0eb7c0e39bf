"""Continual counters over a stream of integers: trees of noisy partial sums.

* ``tree_counter``: the binary tree on an infinite stream (Chan-Shi-Song; Dong-Luo-Yi Alg. 2).
* ``binary_mechanism``: the binary mechanism with a declared capacity (George et al. Alg. 1).
* ``kary_tree``: k-ary trees, with subtraction and the even-k variant
  (Andersson-Pagh-Torkamani).
* ``expiring_tree``: gradual privacy expiration (Andersson et al. (expiration)).
* ``sqrt_factorization``: the square-root factorization as a BLT with exact discrete
  Gaussian noise, rho-zCDP (Henzinger-Upadhyay-Upadhyay; Dvijotham et al. (BLT)).

Each module is one mechanism (``make_<mechanism>``, a frozen state, ``init``, ``step``).
*May import:* ``noise`` and the top-level ``errors``, ``_validate``, ``state_codec``.
"""

from . import binary_mechanism, expiring_tree, kary_tree, sqrt_factorization, tree_counter

__all__ = ["binary_mechanism", "expiring_tree", "kary_tree", "sqrt_factorization", "tree_counter"]
