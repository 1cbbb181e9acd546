"""Lowering of the integer Python AST expressions of sas to Triton (and torch) expression text.

The walker and its printers live in `sas.codegen.printers` (one walker, a printer per target:
Triton, torch, C++); this module is the Triton backend's view of it, with the names the rest of
sas imports. See `sas.codegen.printers` for the expression language and its semantics.
"""

from __future__ import annotations

import ast
from typing import Mapping

from sas.codegen.printers import (  # noqa: F401 - re-exported
    ExprWalker,
    LoweredFunction,
    TableRef,
    _body_statements,
    _params,
    check_identifier,
    find_function,
    lower_expr,
    lower_function,
    lower_predicate,
    table_refs,
)
from sas.errors import KernelError


class Lowering(ExprWalker):
    """The walker for `dialect` "triton" or "torch" (`names`, `tables`, `functions`, `prefix`
    as in `sas.codegen.printers.ExprWalker`)."""

    def __init__(self, names: Mapping[str, str], tables: Mapping[str, TableRef] | None = None,
                 dialect: str = "triton", functions: Mapping[str, ast.FunctionDef] | None = None,
                 prefix: str = "t_"):
        if dialect not in ("triton", "torch"):
            raise KernelError(f"unknown lowering dialect {dialect!r}: expected 'triton' or 'torch'")
        super().__init__(names, tables, dialect, functions, prefix)


__all__ = ["Lowering", "LoweredFunction", "TableRef", "check_identifier", "find_function", "lower_expr",
           "lower_function", "lower_predicate", "table_refs"]
