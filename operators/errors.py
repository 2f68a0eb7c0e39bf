"""The one exception tree of dpstream.

Operators raise these; ``pipeline/`` subclasses them further. Pure code needs no
pipeline import to raise or catch them.
"""


class DpStreamError(Exception):
    """Base class of every error dpstream raises on purpose."""


class InvalidOperatorConfig(DpStreamError, ValueError):
    """A mechanism parameter is out of range or of the wrong kind."""


class BudgetExceededError(DpStreamError):
    """A release would spend more privacy budget than was configured."""


class StateSchemaError(DpStreamError):
    """Persisted operator state does not match the operator that reads it."""
