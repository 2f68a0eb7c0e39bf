"""Parameter checks with one message format: ``{name} must be {condition}, got {value!r}``."""

from __future__ import annotations

import math
from fractions import Fraction

from .errors import InvalidOperatorConfig


def invalid(name: str, condition: str, value: object) -> InvalidOperatorConfig:
    return InvalidOperatorConfig(f"{name} must be {condition}, got {value!r}")


def check_positive(name: str, value: float | Fraction) -> None:
    """Raise unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise invalid(name, "a number", value)
    if not (math.isfinite(value) and value > 0):
        raise invalid(name, "finite and > 0", value)


def check_int_ge(name: str, value: int, minimum: int) -> None:
    """Raise unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, "an integer", value)
    if value < minimum:
        raise invalid(name, f">= {minimum}", value)


def check_probability(name: str, value: float | Fraction) -> None:
    """Raise unless ``value`` lies in the open interval (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise invalid(name, "a number", value)
    if not 0 < value < 1:
        raise invalid(name, "in (0, 1)", value)


def exact_fraction(name: str, value: float | int | str | Fraction) -> Fraction:
    """The exact rational a config value denotes: ``0.1`` is 1/10, not the binary double.

    Noise scales are rationals so that the discrete sampler is exact; going through the
    shortest decimal repr of a float recovers what the user typed.
    """
    if isinstance(value, bool):
        raise invalid(name, "a number", value)
    try:
        frac = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, TypeError, ZeroDivisionError) as exc:
        raise invalid(name, "a finite rational number", value) from exc
    return frac
