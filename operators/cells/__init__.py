"""User-level means of disjoint cells (key x time slot): Rameshwar et al.

* ``cell_mean``: one cell's mean by Baseline, Array-Averaging, Levy or Quantile.
* ``pseudo_users``: WrapAround and BestFit, users' samples grouped into arrays (Sec. III-A).
* ``clip_user``: Clip-User, (user, cell) pairs suppressed to lower the worst per-user loss.
* ``cell_accountant``: per-user loss over disjoint cells (Thm II.3) with a per-epoch cap.
* ``slot_release``: one slot's cells released under the cap: admission, Clip-User, charge.

*May import:* ``noise``, ``selection`` and the top-level ``errors``, ``_validate``,
``state_codec``.
"""

from . import cell_accountant, cell_mean, clip_user, pseudo_users, slot_release

__all__ = ["cell_accountant", "cell_mean", "clip_user", "pseudo_users", "slot_release"]
