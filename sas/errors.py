"""One exception hierarchy for everything sas reports to users.

Every message names the offending argument (or primitive) and says what would be valid.
"""

from __future__ import annotations


class SASError(Exception):
    """Base class of every error sas raises on bad user input."""


class PatternError(SASError):
    """A primitive or operator was given arguments outside its domain."""


class ParseError(SASError):
    """A `.sas` text could not be parsed; carries the line and column."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


class AnalysisError(SASError):
    """The analyzer was asked something the pattern or the arguments do not allow."""


class AnalysisLimitError(AnalysisError):
    """An analysis step would build more runs of attended cells, or column shapes, than its
    limit: the message names the numbers. `analyze` answers such a periodic analysis per token
    instead; elsewhere it reaches the user."""


class EmptyPatternError(AnalysisError):
    """The pattern attends no key within the length analysed: there is nothing to cache."""


class KernelError(SASError):
    """A kernel was called with tensors or options it cannot accept."""


class NotYetSupportedError(SASError):
    """A feature that is designed but not built yet; the message says which issue owns it."""


class IntegrationError(SASError):
    """A model integration (sas.integrations) was given a model, pattern or call it cannot run."""
