"""Static analysis: cache size, decomposition, events, synthesized cache functions."""

from sas.analysis.analyze import Analysis, analyze

__all__ = ["Analysis", "analyze"]
