"""A statistic's identity: everything that shapes its noise, its sensitivity or what one
user contributes, and the fingerprint of it (docs/design.md sections 4a and 4b).

The ledger records the parameters and their fingerprint of every statistic a worker
starts, and refuses a statistic whose fingerprint changed under its name; stage 2 draws
every node of a statistic under its fingerprint (with its run and start tick) and refuses
state made under another. What is left out of the identity, and why, is in
docs/design.md section 4b.
"""

from __future__ import annotations

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.noise import discrete_laplace

from .registry import TUNING_FIELDS, identity, legacy_tuning, resolved


def identity_parameters(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """``stat``'s identity: its whole definition, the pipeline's relation, the tick length
    (steps count ticks), the accounting (under zcdp: with the rho, the Gaussian counter
    and sampler, so a zCDP statistic's noise scope never meets a pure one's), the privacy
    unit (``input.user_id_field``: another field is another set of users, each with a
    fresh bound inside the same trees), the noise mode
    (zero and keyed noise never share a statistic), what its kind adds (the mechanism as
    resolved and its algorithms' versions, and e.g. a continual mean's partitions, over
    which its cap on users is split) and the noise sampler's version. A mechanism not
    named is resolved first (``registry.resolved``): the identity records the tree."""
    stat = resolved(stat)
    out: dict[str, object] = {
        "app_id": cfg.app_id,
        "statistic": _definition(stat),
        "neighbours": cfg.privacy.neighbours.value,
        "public_counts": cfg.privacy.public_counts,
        "interval_seconds": cfg.ticks.interval_seconds,
        "user_id_field": cfg.input.user_id_field,
        "noise_mode": cfg.noise.mode.value,
        **identity(stat, cfg),
        "noise_sampler": discrete_laplace.VERSION,
    }
    if cfg.privacy.accounting == "zcdp":
        # Only under zcdp, so a pure statistic keeps its fingerprint; its kind's part
        # names the Gaussian counter and sampler, its definition the rho.
        out["accounting"] = "zcdp"
    return out


# Fields added to a statistic's config after statistics ran: left out of its definition
# while unset, so a statistic that does not use them keeps its fingerprint (and its ledger
# entries, its state and its noise).
LATER_FIELDS = ("lower", "upper", "resolution", "value_field", "where", "rho")


def _definition(stat: StatisticConfig) -> dict[str, object]:
    definition = stat.model_dump(mode="json", by_alias=True)
    for name in LATER_FIELDS:
        if definition[name] is None:
            del definition[name]
    # Left out at Alg. 5's values too: what every statistic ran before they existed.
    legacy = legacy_tuning(stat)
    for name in TUNING_FIELDS:
        if definition[name] is None or definition[name] == legacy[name]:
            del definition[name]
    return definition


def fingerprint(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """``stat``'s identity as ``operators.accounting.fingerprint`` hashes it."""
    return accounting.fingerprint(identity_parameters(stat, cfg))
