"""The `.sas` text front-end (sas.lang.text): every construct, Python's operator precedence,
size literals, and a ParseError with line and column for every kind of mistake."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sas
from sas import Causal, Diag, Dynamic, Rect, ops
from sas.errors import ParseError, PatternError, SASError
from sas.lang import And, Not, Or, Pattern, Spread
from sas.lang.ops import OpChain
from sas.lang.text import GRAMMAR_PATH, load_sas, parse_sas

from strategies import patterns


def one(text: str) -> Pattern:
    """The pattern of a one-definition text."""
    defs = parse_sas(text)
    assert len(defs) == 1
    return next(iter(defs.values()))


# --- a printer: Pattern tree -> .sas text ---------------------------------------------------

# Binding strength, loosest first, exactly Python's: >>, +, *, unary ~, atoms.
_PREC = {Spread: 1, Or: 2, And: 3, Not: 4}
_ATOM = 5


def _chain_text(chain: OpChain, python: bool) -> str:
    head, *rest = chain.nodes
    assert head.name == "attn_score"
    text = ("ops." if python else "") + "attn_score()"
    for node in rest:
        text += f".{node.name}(" + ", ".join(f"{k}={v!r}" for k, v in node.args) + ")"
    return text


def _leaf_text(p: Pattern, python: bool) -> str:
    if isinstance(p, Diag):
        stride = f", stride={p.stride}" if p.stride != 1 else ""
        return f"Diag({p.offset}, {p.size}{stride})"
    if isinstance(p, Rect):
        args = [f"{name}={getattr(p, name)!r}" for name, default in
                (("rows", (None, None)), ("cols", (None, None)), ("stride", (1, 1)), ("offset", (0, 0)))
                if getattr(p, name) != default]
        return f"Rect({', '.join(args)})"
    if isinstance(p, Dynamic):
        refresh = repr(p.refresh) if python else str(p.refresh).lower()
        return f"Dynamic(budget={p.budget}, score={_chain_text(p.score, python)}, refresh={refresh})"
    raise AssertionError(f"no printer for {p!r}")


def render(p: Pattern, *, minimal: bool, python: bool = True) -> str:
    """`.sas` expression text for `p`. `minimal`: only the parentheses precedence needs;
    else every operator is parenthesized. `python`: text that is also valid Python (`~`,
    True/False, `ops.` prefix); else the `.sas` spellings (`!`, true/false, no prefix)."""

    def go(q: Pattern) -> tuple[str, int]:
        prec = _PREC.get(type(q), _ATOM)
        if isinstance(q, Not):
            inner, ip = go(q.a)
            if not minimal or ip < prec:
                inner = f"({inner})"
            return ("~" if python else "!") + inner, prec
        if isinstance(q, (Or, And, Spread)):
            pair = q.children() if isinstance(q, Spread) else (q.a, q.b)   # n-ary sums: left-assoc view
            (left, lp), (right, rp) = go(pair[0]), go(pair[1])
            # Left-associative: the left operand needs parentheses only when it binds looser,
            # the right one also when it binds equally.
            if not minimal or lp < prec:
                left = f"({left})"
            if not minimal or rp <= prec:
                right = f"({right})"
            op = {Or: "+", And: "*", Spread: ">>"}[type(q)]
            return f"{left} {op} {right}", prec
        return _leaf_text(q, python), _ATOM

    return go(p)[0]


PY_NAMESPACE = {"Rect": Rect, "Diag": Diag, "Causal": Causal, "Dynamic": Dynamic, "ops": ops}


def python_eval(expr: str, **names: Pattern) -> Pattern:
    """What Python makes of the same expression text (the test's reference; sas never evals)."""
    return eval(expr, dict(PY_NAMESPACE, **names))  # noqa: S307


# --- definitions, comments, separators -------------------------------------------------------

def test_grammar_file_is_at_the_repo_top():
    assert GRAMMAR_PATH.is_file()
    assert GRAMMAR_PATH.parent.name == "grammar"


def test_definitions_in_order_with_comments_blank_lines_and_semicolons():
    text = """
    # a comment line

    window = Diag(offset=0, size=1K)   # a trailing comment
    sink = Rect(cols=(0, 32)); both = window + sink ;
    pattern = both * Causal()

    """
    defs = parse_sas(text)
    assert list(defs) == ["window", "sink", "both", "pattern"]
    assert defs["window"] == Diag(0, 1024)
    assert defs["sink"] == Rect(cols=(0, 32))
    assert defs["both"] == Diag(0, 1024) + Rect(cols=(0, 32))
    assert defs["pattern"] == (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal()


def test_no_trailing_newline_needed():
    assert parse_sas("a = Causal()") == {"a": Causal()}


def test_parenthesized_expressions_may_span_lines():
    text = "p = (Diag(0, 4)   # window\n     + Rect(cols=(0,\n  2)))\n\nq = p"
    defs = parse_sas(text)
    assert defs["p"] == Diag(0, 4) + Rect(cols=(0, 2))
    assert defs["q"] is defs["p"]


def test_load_sas_picks_pattern_else_last():
    assert load_sas("pattern = Diag(0, 2)\nother = Causal()") == Diag(0, 2)
    assert load_sas("a = Diag(0, 2)\nb = Causal()") == Causal()


def test_references_reuse_earlier_definitions():
    defs = parse_sas("a = Diag(0, 3)\nb = Rect(size=(2, 2))\nc = b >> a\nd = ~c + a")
    assert defs["c"] == Spread(Rect(size=(2, 2)), Diag(0, 3))
    assert defs["d"] == Or(Not(defs["c"]), Diag(0, 3))


# --- primitives ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("Diag(0, 1024)", Diag(0, 1024)),
    ("Diag(-3, 5)", Diag(-3, 5)),
    ("Diag(2, None, 4)", Diag(2, None, stride=4)),
    ("Diag(0, None, stride=512)", Diag(0, None, stride=512)),
    ("Diag(offset=-1, size=3, stride=2)", Diag(-1, 3, stride=2)),
    ("Diag(size=3)", Diag(0, 3)),
    ("Diag()", Diag()),
    ("Diag(1, 2,)", Diag(1, 2)),
    ("Causal()", Diag(0, None)),
    ("Rect()", Rect()),
    ("Rect(rows=(2, 6), cols=(1, 7))", Rect(rows=(2, 6), cols=(1, 7))),
    ("Rect((2, 6), (1, 7))", Rect(rows=(2, 6), cols=(1, 7))),
    ("Rect(rows=(None, 6), cols=(3, None))", Rect(rows=(None, 6), cols=(3, None))),
    ("Rect(rows=None, cols=(None, None))", Rect()),
    ("Rect(size=(3, 2))", Rect(size=(3, 2))),
    ("Rect(size=4)", Rect(size=4)),
    ("Rect(stride=2, offset=1)", Rect(stride=2, offset=1)),
    ("Rect(rows=(2, 8), cols=(1, 7), stride=(2, 3), offset=(1, 2))",
     Rect(rows=(2, 8), cols=(1, 7), stride=(2, 3), offset=(1, 2))),
    ("Rect(size=(4, 4), stride=(1, 2),)", Rect(size=(4, 4), stride=(1, 2))),
])
def test_static_primitives(text, expected):
    assert one(f"p = {text}") == expected


@pytest.mark.parametrize("score_text, score", [
    ("attn_score()", ops.attn_score()),
    ("attn_score().sum(dim=1)", ops.attn_score().sum(dim=1)),
    ("attn_score().sum()", ops.attn_score().sum()),
    ("attn_score().mean(dim=1)", ops.attn_score().mean(dim=1)),
    ("attn_score().max(dim=0)", ops.attn_score().max(dim=0)),
    ("attn_score().reduce(dim=1, kind='mean')", ops.attn_score().mean(dim=1)),
    ('attn_score().sum(1).pooling(kernel_size=4, kind="max")', ops.attn_score().sum(1).pooling(4, "max")),
    ("attn_score().pooling(3, 'avg').topk(k=8)", ops.attn_score().pooling(3, "avg").topk(8)),
    ("ops.attn_score().sum(dim=1)", ops.attn_score().sum(dim=1)),
    ("attn_score()\n   .sum(dim=1)", ops.attn_score().sum(dim=1)),
])
def test_dynamic_score_chains(score_text, score):
    p = one(f"p = Dynamic(budget=8, score={score_text})")
    assert p == Dynamic(budget=8, score=score)


@pytest.mark.parametrize("score_text, build", [
    ("external('draft')", lambda: ops.external("draft")),
    ("ops.external(name=\"draft\")", lambda: ops.external("draft")),
    ("reuse(3)", lambda: ops.reuse(3)),
    ("reuse(layer=3, head_map=(0,))", lambda: ops.reuse(3, head_map=(0,))),
    ("reuse(3, (0, 0, 1, 1),)", lambda: ops.reuse(3, (0, 0, 1, 1))),
    ("attn_score().sample(n=4, method='systematic')", lambda: ops.attn_score().sample(4, "systematic")),
])
def test_other_score_sources_of_sas_ops(score_text, build):
    """The text language offers every chain builder `sas.lang.ops` has (checked only where
    the installed ops module provides it)."""
    score = build()
    assert one(f"p = Dynamic(budget=8, score={score_text})") == Dynamic(budget=8, score=score)


@pytest.mark.parametrize("text, expected", [
    ("Dynamic(2)", Dynamic(2)),
    ("Dynamic(budget=2, refresh=true)", Dynamic(2, refresh=True)),
    ("Dynamic(budget=2, refresh=True)", Dynamic(2, refresh=True)),
    ("Dynamic(budget=2, refresh=false)", Dynamic(2, refresh=False)),
    ("Dynamic(budget=2, refresh=False)", Dynamic(2, refresh=False)),
    ("Dynamic(2, None, true)", Dynamic(2, None, True)),
    ("Dynamic(budget=512, score=attn_score().sum(dim=1), refresh=false)",
     Dynamic(512, ops.attn_score().sum(dim=1), False)),
])
def test_dynamic(text, expected):
    assert one(f"p = {text}") == expected


def test_the_paper_figure_7a_listing():
    text = """
    p0 = Diag(offset=0, size=2)
    p1 = Diag(offset=2, size=6)
    p2 = p1 * Dynamic(budget=2, score=attn_score().sum(dim=1), refresh=false)
    window_w_h2o_pattern = p0 + p2
    """
    defs = parse_sas(text)
    expected = Diag(0, 2) + Diag(2, 6) * Dynamic(2, ops.attn_score().sum(dim=1), False)
    assert load_sas(text) == expected == defs["window_w_h2o_pattern"]


# --- size literals ---------------------------------------------------------------------------

@pytest.mark.parametrize("literal, value", [
    ("0", 0), ("7", 7), ("1024", 1024), ("1_024", 1024), ("16K", 16 * 1024), ("16k", 16 * 1024),
    ("1K", 1024), ("1M", 1024 * 1024), ("2m", 2 * 1024 * 1024), ("128K", 128 * 1024),
    ("-1K", -1024), ("-3", -3), ("-0", 0), ("1G", 1024 ** 3), ("3g", 3 * 1024 ** 3),
])
def test_integer_literals(literal, value):
    assert one(f"p = Diag({literal}, 1)") == Diag(value, 1)


def test_a_byte_order_mark_is_not_text():
    """Text that starts with a byte-order mark (as a Windows editor saves it) parses as the text
    without it, with the same error positions."""
    assert one("\ufeffp = Diag(0, 1)") == Diag(0, 1)
    with pytest.raises(ParseError, match="line 1, column 9 is not closed"):
        load_sas("\ufeffp = Diag(0, 1")


def test_size_literals_inside_tuples():
    assert one("p = Rect(rows=(1K, 2K), size=None, cols=(None, 4k))") == \
        Rect(rows=(1024, 2048), cols=(None, 4096))
    assert one("p = Rect(size=(16K, 1M))") == Rect(size=(16384, 1048576))


# --- operators and precedence ----------------------------------------------------------------

def test_operators_build_the_nodes():
    a, b = Diag(0, 3), Rect(cols=(0, 2))
    u = Rect(size=(2, 2))
    names = "a = Diag(0, 3)\nb = Rect(cols=(0, 2))\nu = Rect(size=(2, 2))\n"
    assert load_sas(names + "p = a + b") == Or(a, b)
    assert load_sas(names + "p = a * b") == And(a, b)
    assert load_sas(names + "p = ~a") == Not(a)
    assert load_sas(names + "p = !a") == Not(a)
    assert load_sas(names + "p = u >> a") == Spread(u, a)


NAMES = {
    "a": Diag(0, 3), "b": Rect(cols=(0, 2)), "c": Rect(stride=2),
    "u": Rect(size=(2, 3)), "v": Rect(size=(3, 2)),
}
NAMES_TEXT = "\n".join([
    "a = Diag(0, 3)", "b = Rect(cols=(0, 2))", "c = Rect(stride=2)",
    "u = Rect(size=(2, 3))", "v = Rect(size=(3, 2))",
]) + "\n"

PRECEDENCE_CASES = [
    "a + b * c", "a * b + c", "(a + b) * c", "a * (b + c)", "a + b + c", "a * b * c",
    "~a * b", "~a + b", "~(a + b) * c", "~~a", "~a * ~b + ~c",
    "u >> a + b", "u >> a * b", "u >> ~a", "u * a >> b", "u * a + v * b >> c",
    "u >> v >> a", "u >> (v >> a)", "(u >> a) * b", "(u >> a) + (v >> b) * c",
    "u + v >> a", "a + u >> b",      # (a + u) is unbounded: Python and .sas both refuse it
    "u >> a >> b",                   # (u >> a) is unbounded: both refuse
    "v * (u >> Diag(0, 2)) >> a + b * ~c",
]


@pytest.mark.parametrize("expr", PRECEDENCE_CASES)
@pytest.mark.parametrize("not_spelling", ["~", "!"])
def test_precedence_matches_python(expr, not_spelling):
    text = NAMES_TEXT + "pattern = " + expr.replace("~", not_spelling)
    try:
        expected = python_eval(expr, **NAMES)
    except PatternError as e:
        with pytest.raises(ParseError) as info:
            load_sas(text)
        assert str(e) in str(info.value)
        return
    got = load_sas(text)
    assert got == expected
    assert np.array_equal(got.to_mask(24), expected.to_mask(24))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=patterns(max_depth=4), python=st.booleans())
def test_printed_random_patterns_parse_back(p, python):
    """A random tree printed with full parentheses and with minimal ones (relying on
    precedence) parses back to the same tree and mask, and Python reads the Python-style
    text as the same pattern."""
    for minimal in (False, True):
        text = render(p, minimal=minimal, python=python)
        got = load_sas(f"pattern = {text}")
        assert got == p, text
        assert np.array_equal(got.to_mask(20), p.to_mask(20)), text
        if python:
            assert python_eval(text) == p, text


def test_minimal_printer_really_drops_parentheses():
    a, b, c = Diag(0, 3), Rect(cols=(0, 2)), Rect(stride=2)
    u = Rect(size=(2, 2))
    assert render(u >> (a + b * ~c), minimal=True) == \
        "Rect(rows=(0, 2), cols=(0, 2)) >> Diag(0, 3) + Rect(cols=(0, 2)) * ~Rect(stride=(2, 2))"
    assert render((a + b) * c, minimal=True).startswith("(")


# --- errors ----------------------------------------------------------------------------------

def parse_error(text: str, line: int, column: int, *fragments: str) -> ParseError:
    """Parse `text`, expect a ParseError at (line, column) whose message has every fragment."""
    with pytest.raises(ParseError) as info:
        parse_sas(text, "demo.sas")
    err = info.value
    assert isinstance(err, SASError)
    assert (err.line, err.column) == (line, column), str(err)
    message = str(err)
    assert f"(line {line}, column {column})" in message
    assert "demo.sas" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert "Traceback" not in message and "lark" not in message.lower()
    return err


@pytest.mark.parametrize("text, line, column, fragments", [
    # syntax
    ("a = Diag(0, 1) | Rect()", 1, 16, ["unexpected character '|'", "'+' for OR", "expected"]),
    ("a = Diag(0, 1) & Rect()", 1, 16, ["'&'", "'*' for AND"]),
    ("a = Diag(0, 1) - Rect()", 1, 16, ["'-'"]),
    ("a = Rect() $", 1, 12, ["unexpected character '$'", "'*'", "'+'", "'>>'", "end of line"]),
    ("a = Rect() b = Rect()", 1, 12, ["unexpected name 'b'", "'+'", "end of line"]),
    ("a = Diag(0, 1) +\n  Rect()", 1, 17, ["unexpected end of line", "wrap it in parentheses"]),
    ("a =", 1, 4, ["unexpected end of input", "a name", "'('"]),
    ("x = Rect()\n\nDiag(0, 1)", 3, 5, ["unexpected '('", "expected '='", "name = pattern"]),
    ("a = (Diag(0, 1)\n + Rect()", 2, 10, ["unexpected end of input", "')'",
                                          "'(' at line 1, column 5 is not closed"]),
    ("a = Diag(0, 1))", 1, 15, ["unexpected ')'"]),
    ("a = Rect(rows=(1 2))", 1, 18, ["unexpected integer '2'", "expected ','"]),
    ("a = Dynamic(2, score=attn_score() x)", 1, 35, ["unexpected name 'x'", "'.'", "')'"]),
    ("a = Diag(0, 1)\n  b = = Rect()", 2, 7, ["unexpected '='"]),
    # names
    ("a = Diag(0, 1)\nb = a + c", 2, 9, ["unknown name 'c'", "defined names: a"]),
    ("a = window", 1, 5, ["unknown name 'window'", "none yet"]),
    ("a = b\nb = Causal()", 1, 5, ["'b' is defined later, at line 2"]),
    ("a = Diag(0, 1) + a", 1, 18, ["'a' is used in its own definition"]),
    ("a = Causal", 1, 5, ["'Causal' is a primitive", "Causal(...)"]),
    ("a = Diag(0, 1)\na = Rect()", 2, 1, ["'a' is already defined at line 1"]),
    ("Rect = Diag(0, 1)", 1, 1, ["cannot define 'Rect'", "primitive"]),
    ("true = Diag(0, 1)", 1, 1, ["cannot define 'true'"]),
    # primitives and keyword arguments
    ("a = Band(0, 1)", 1, 5, ["unknown primitive 'Band'", "Rect, Diag, Causal, Dynamic"]),
    ("a = Diag(0, 1)\nb = a()", 2, 5, ["'a' is a definition, not a primitive"]),
    ("a = attn_score()", 1, 5, ["score op chain", "Dynamic(score=...)"]),
    ("a = Rect(colz=(0, 2))", 1, 10, ["Rect() has no argument 'colz'",
                                      "rows, cols, size, stride, offset"]),
    ("a = Diag(ofset=1)", 1, 10, ["Diag() has no argument 'ofset'", "offset, size, stride"]),
    ("a = Causal(1)", 1, 12, ["Causal() takes no positional arguments"]),
    ("a = Causal(size=1)", 1, 12, ["Causal() has no argument 'size'", "none"]),
    ("a = Diag(0, 1, 2, 3)", 1, 19, ["at most 3 positional", "offset, size, stride"]),
    ("a = Rect((0, 1), (0, 1), 2)", 1, 26, ["at most 2 positional", "rows, cols"]),
    ("a = Diag(1, offset=2)", 1, 13, ["argument 'offset' is given twice"]),
    ("a = Diag(size=2, size=3)", 1, 18, ["argument 'size' is given twice"]),
    ("a = Diag(size=2, 3)", 1, 18, ["positional argument after keyword"]),
    ("a = Dynamic(refresh=true)", 1, 5, ["Dynamic() needs the argument 'budget'"]),
    ("a = Dynamic(2, score=attn_score().median())", 1, 35, ["unknown score op .median()",
                                                            ".sum()", ".pooling()", ".topk()"]),
    ("a = Dynamic(2, score=attn_scores())", 1, 22, ["unknown score source 'attn_scores'",
                                                    "attn_score()"]),
    ("a = Dynamic(2, score=torch.attn_score())", 1, 22, ["unknown score namespace 'torch'"]),
    ("a = Dynamic(2, score=attn_score().sum(dims=1))", 1, 39, ["sum() has no argument 'dims'",
                                                              "dim"]),
    ("a = Dynamic(2, score=attn_score(1))", 1, 33, ["attn_score() takes no positional"]),
    ("a = Diag(0, 1)\nb = Diag(a, 2)", 2, 10, ["must be literals", "'a' is a pattern"]),
    ("a = Diag(0, w)", 1, 13, ["must be literals", "'w' is a name"]),
    # argument values (PatternError messages with a position)
    ("a = Diag(0, 0)", 1, 5, ["Diag(size=...) must be >= 1, got 0"]),
    ("a = Diag(0, 'x')", 1, 5, ["Diag(size=...) must be an integer or None"]),
    ("a = Diag(None)", 1, 5, ["Diag(offset=...) must be an integer"]),
    ("\n\na = Rect(rows=(5, 2))", 3, 5, ["Rect(rows=...) = (5, 2) is empty"]),
    ("a = Rect(rows=(1, 2, 3))", 1, 5, ["Rect(rows=...) must be None or a pair"]),
    ("a = Rect(size=(3,))", 1, 5, ["Rect(size=...) must be an integer or a pair"]),
    ("a = Rect(size=(2, 2), rows=(0, 1))", 1, 5, ["either size=(h, w) or rows=/cols="]),
    ("a = Rect(stride=2, offset=2)", 1, 5, ["must be smaller than stride"]),
    ("a = Dynamic(0)", 1, 5, ["Dynamic(budget=...) must be >= 1"]),
    ("a = Dynamic(2, score=3)", 1, 5, ["Dynamic(score=...) must be an op chain"]),
    ("a = Dynamic(2, refresh=1)", 1, 5, ["Dynamic(refresh=...) must be True or False"]),
    ("a = Dynamic(2, score=attn_score().pooling(kernel_size=0))", 1, 35,
     ["pooling(kernel_size=...) must be a positive integer"]),
    ("a = Dynamic(2, score=attn_score().reduce(kind='median'))", 1, 35, ["reduce(kind=...)"]),
    ("a = Dynamic(2, score=attn_score().pooling(kernel_size=2, kind=true))", 1, 35,
     ["pooling(kind=...)"]),
    # operators
    ("a = Diag(0, 4)\nb = a >> Causal()", 2, 7, ["operator '>>'", "bounded unit"]),
    ("a = Rect(cols=(0, 4)) >> Causal()", 1, 23, ["operator '>>'", "unbounded in rows"]),
])
def test_errors_have_line_and_column(text, line, column, fragments):
    parse_error(text, line, column, *fragments)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "  ;  ; \n"])
def test_empty_file_is_an_error(text):
    parse_error(text, 1, 1, "no definitions", "name = pattern")


def test_errors_are_sas_errors_and_hide_lark():
    with pytest.raises(ParseError) as info:
        parse_sas("a = (((")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert issubclass(ParseError, SASError)


def test_non_string_input():
    with pytest.raises(ParseError, match="must be a str"):
        parse_sas(b"a = Causal()")  # type: ignore[arg-type]


def test_front_end_never_evaluates_python(tmp_path):
    marker = tmp_path / "evaluated"
    text = f"a = __import__('pathlib').Path({str(marker)!r}).touch()"
    with pytest.raises(ParseError):
        parse_sas(text)
    assert not marker.exists()


def test_sas_package_exports_load_pattern():
    from sas.lang.loader import load_pattern

    assert sas.load_pattern is load_pattern


def test_error_message_format():
    err = parse_error("a = Diag(0, 1)\nb = a + c", 2, 9)
    assert re.fullmatch(r"demo\.sas: unknown name 'c'; defined names: a \(line 2, column 9\)", str(err))
