"""The pattern language: primitives, operators, op chains and the `.sas` text front-end."""

from sas.lang.pattern import And, Not, Or, Pattern, Spread
from sas.lang.primitives import Causal, Diag, Dynamic, Rect

__all__ = ["Pattern", "Or", "And", "Not", "Spread", "Rect", "Diag", "Causal", "Dynamic"]
