"""Code generation: lowering of pattern predicates and synthesized cache functions to backend
expressions, and template rendering (templates/<backend>/)."""

from sas.codegen.lower_triton import check_identifier, lower_expr, lower_function, lower_predicate

__all__ = ["check_identifier", "lower_expr", "lower_function", "lower_predicate", "compile_pattern"]


def __getattr__(name: str):
    if name == "compile_pattern":
        # Lazy: sas.codegen.compile imports sas.plan, which imports sas.codegen.triton_backend
        # (and so this package): importing compile here eagerly would be a cycle.
        from sas.codegen.compile import compile_pattern

        return compile_pattern
    raise AttributeError(name)
