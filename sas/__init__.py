"""sas: a sparse attention synthesizer.

Describe a sparse attention pattern with geometric primitives, get back the exact
reference mask, the minimal KV-cache size, closed-form cache management functions and
kernels.
"""

from sas.errors import SASError
from sas.lang import ops
from sas.lang import sym
from sas.lang import And, Causal, Diag, Dynamic, Not, Or, Pattern, Rect, Spread

__all__ = ["SASError", "ops", "Pattern", "Rect", "Diag", "Causal", "Dynamic", "Or", "And",
           "Not", "Spread", "analyze", "load_pattern"]


def __getattr__(name: str):
    # Lazy so that `import sas` stays light and the language never pulls in the analyzer.
    if name == "analyze":
        from sas.analysis import analyze

        return analyze
    if name == "load_pattern":
        from sas.lang.loader import load_pattern

        return load_pattern
    raise AttributeError(name)
