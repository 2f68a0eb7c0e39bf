"""The pipeline's privacy statement: the one accountant (``accountant``) and its API, and
the zero-concentrated DP helpers (``zcdp``).

What one user can lose across the statistics of a pipeline, under which neighbouring
relation, the sensitivity multipliers and the statistics' fingerprints. Config validation,
``dpstream check-config``, the worker's ledger and stage 2 all ask this package. ``zcdp``
holds the Gaussian mechanism's rho, composition and the conversions to (epsilon, delta).

*May import:* ``trees`` and ``means`` (the expiration curve, the whole-user mean's terms)
and the top-level ``errors``. Only config and the pipeline import it.
"""

from . import accountant, zcdp
from .accountant import (
    ANY_SUBSET,
    PUBLIC_COUNTS,
    WHOLE_USER,
    Charge,
    PrivacyStatement,
    StatementError,
    StatisticTerms,
    changed_fields,
    charge_of,
    fingerprint,
    implied_epsilon,
    lifetime_steps,
    sensitivity_multiplier,
    sqrt_counter,
    statement,
)

__all__ = [
    "ANY_SUBSET",
    "PUBLIC_COUNTS",
    "WHOLE_USER",
    "Charge",
    "PrivacyStatement",
    "StatementError",
    "StatisticTerms",
    "accountant",
    "changed_fields",
    "charge_of",
    "fingerprint",
    "implied_epsilon",
    "lifetime_steps",
    "sensitivity_multiplier",
    "sqrt_counter",
    "statement",
    "zcdp",
]
