"""The `.sas` text front-end: parse pattern definitions written in the small text language.

The grammar lives in `grammar/sas.lark` at the top of the repository (inside the package,
`sas/grammar/`, once installed from a wheel; see `sas.resources`). A `.sas` file is a
list of definitions `name = expression` (one per line or `;`-separated, `#` comments) over
the same primitives and operators as a Python pattern script, with Python's operator
precedence, so the same expression text means the same pattern in both front-ends:

    window  = Diag(0, 1K)                                  # 0 <= i - j < 1024
    sink    = Rect(cols=(0, 32))
    h2o     = Diag(1K, None) * Dynamic(budget=512, score=attn_score().sum(dim=1))
    pattern = (window + sink + h2o) * Causal()

The text is parsed and built into `Pattern` nodes directly; no Python is ever evaluated.
Every failure is a `sas.errors.ParseError` carrying the line and column.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from sas.errors import ParseError, PatternError, SASError
from sas.lang import ops
from sas.lang.ops import OpChain
from sas.lang.pattern import And, Or, Pattern
from sas.lang.primitives import Causal, Diag, Dynamic, Rect
from sas.resources import data_folder

__all__ = ["choose_pattern", "parse_sas", "load_sas", "GRAMMAR_PATH"]

#: The grammar file: `grammar/sas.lark` beside the package, or inside it in a wheel install.
GRAMMAR_PATH = data_folder("grammar") / "sas.lark"

#: The primitives a `.sas` expression may call, by name.
PRIMITIVES: dict[str, Callable[..., Pattern]] = {
    "Rect": Rect, "Diag": Diag, "Causal": Causal, "Dynamic": Dynamic,
}
#: Sources a score chain may start with, and the transforms it may apply: the chain
#: builders of `sas.lang.ops` (those of this list that the installed module provides).
#: Custom ops registered from Python and score arithmetic are not part of the text language.
SCORE_SOURCES: dict[str, Callable[..., OpChain]] = {
    name: getattr(ops, name) for name in ("attn_score", "external", "partition", "reuse")
    if callable(getattr(ops, name, None))
}
SCORE_METHODS: tuple[str, ...] = tuple(
    name for name in ("sum", "mean", "max", "reduce", "pooling", "topk", "sample")
    if callable(getattr(OpChain, name, None))
)
_RESERVED = frozenset(PRIMITIVES) | {"None", "true", "false", "True", "False"}

_SIZE_SUFFIX = {"k": 1024, "m": 1024 * 1024, "g": 1024 ** 3}

# How terminals are named in syntax-error messages (string terminals show their text).
_TERMINAL_NAMES = {
    "NAME": "a name", "INT": "an integer", "STRING": "a string", "NOT": "'~' or '!'",
    "_NL": "end of line", "$END": "end of input",
}
_TOKEN_NOUNS = {"NAME": "name", "INT": "integer", "STRING": "string"}
_CHAR_HINTS = {
    "|": "use '+' for OR (a + b)",
    "&": "use '*' for AND (a * b)",
    "-": "'-' is only allowed as the sign of an integer (e.g. Diag(-2, 5))",
}


# --- parser ----------------------------------------------------------------------------------

class _ParenNewlines:
    """Lark post-lexer: drop newlines inside parentheses, so that a parenthesized expression
    may span lines (as in Python) while a newline elsewhere ends a definition."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        for tok in stream:
            if tok.type == "LPAR":
                depth += 1
            elif tok.type == "RPAR":
                depth = max(0, depth - 1)
            elif tok.type == "_NL" and depth > 0:
                continue
            yield tok


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    if not GRAMMAR_PATH.is_file():
        raise SASError(f"the .sas grammar is missing: expected it at {GRAMMAR_PATH}")
    return Lark(GRAMMAR_PATH.read_text(encoding="utf-8"), parser="lalr", postlex=_ParenNewlines(),
                propagate_positions=True, maybe_placeholders=False)


# --- public API ------------------------------------------------------------------------------

def parse_sas(text: str, filename: str = "<sas>") -> dict[str, Pattern]:
    """Parse `.sas` text and return every definition, in order, as `{name: Pattern}`.

    Raises `ParseError` (with line and column) on any syntax or semantic error.
    """
    if not isinstance(text, str):
        raise ParseError(f"{filename}: .sas text must be a str, got {type(text).__name__}")
    text = text.removeprefix("\ufeff")     # a byte-order mark, as a file read with utf-8-sig drops it
    try:
        # The trailing newline ends the last definition; positions in `text` are unchanged.
        tree = _parser().parse(text + "\n")
    except UnexpectedInput as e:
        raise _syntax_error(e, text, filename) from None
    except LarkError as e:  # anything else lark might raise: still no lark traceback
        raise ParseError(f"{filename}: {e}", 1, 1) from None
    try:
        return _Builder(filename).build(tree)
    except RecursionError:
        raise ParseError(f"{filename}: expression nested too deeply", 1, 1) from None


def choose_pattern(defs: dict[str, Pattern], filename: str = "<sas>") -> tuple[Pattern, str | None]:
    """The pattern of parsed definitions (`parse_sas`): the one named `pattern` if there is one,
    else the last; with a note naming the one taken where there are several and none is named
    `pattern` (so that a forgotten `pattern = ...` line is seen), else None."""
    if "pattern" in defs:
        return defs["pattern"], None
    names = list(defs)
    note = (f"{filename} defines {', '.join(names)} and no `pattern`: using `{names[-1]}`, the last definition "
            f"(name the one to use `pattern = ...`)" if len(names) > 1 else None)
    return defs[names[-1]], note


def load_sas(text: str, filename: str = "<sas>") -> Pattern:
    """Parse `.sas` text and return its pattern: the definition named `pattern` if there is
    one, else the last definition."""
    return choose_pattern(parse_sas(text, filename), filename)[0]


# --- syntax errors ---------------------------------------------------------------------------

def _terminal_name(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for term in _parser().terminals:
        if term.name == name and term.pattern.type == "str":
            return repr(term.pattern.value)
    return name


def _open_parens(text: str, upto: int) -> list[Token]:
    """The '(' tokens still open at offset `upto` of `text` (empty if it does not lex)."""
    stack: list[Token] = []
    try:
        for tok in _parser().lex(text[:upto]):
            if tok.type == "LPAR":
                stack.append(tok)
            elif tok.type == "RPAR" and stack:
                stack.pop()
    except LarkError:
        return []
    return stack


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just after the last non-blank character of `text`."""
    body = text.rstrip()
    lines = body.split("\n")
    return len(lines), len(lines[-1]) + 1


def _expected_at(text: str, offset: int) -> set[str]:
    """The terminals the parser accepts just before offset `offset` of `text`.

    The state lark reports with an error may already have been reduced on the bad token
    (LALR merges the states of `(expr)` and of a top-level expression), so the parse is
    replayed up to the error and asked what it accepts there.
    """
    ip = _parser().parse_interactive(text + "\n")
    try:
        for tok in ip.iter_parse():
            if tok.start_pos is not None and tok.start_pos >= offset:
                break
    except UnexpectedInput:  # the lexer stops at the bad character: state is just before it
        pass
    return set(ip.accepts())


def _syntax_error(e: UnexpectedInput, text: str, filename: str) -> ParseError:
    """Translate a lark parse failure into a readable ParseError."""
    offset = getattr(e, "pos_in_stream", None)
    if offset is None or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        offset = len(text)  # lark places $END on the last token
    at_end = offset >= len(text)  # $END, or the newline parse_sas appended
    if at_end or getattr(e, "line", -1) in (None, -1):
        line, column = _end_position(text)
    else:
        line, column = e.line, e.column
    hint = ""
    if at_end:
        what = "unexpected end of input"
    elif isinstance(e, UnexpectedCharacters):
        char = text[offset]
        what = f"unexpected character {char!r}"
        hint = _CHAR_HINTS.get(char, "")
    elif isinstance(e, UnexpectedToken) and e.token.type == "_NL":
        what = "unexpected end of line"
        if text[:offset].rstrip().endswith((">>", "+", "*", "~", "!")):
            hint = "to continue an expression on the next line, wrap it in parentheses"
    elif isinstance(e, UnexpectedToken):
        tok = e.token
        noun = _TOKEN_NOUNS.get(tok.type)
        what = f"unexpected {noun} {tok.value!r}" if noun else f"unexpected {_terminal_name(tok.type)}"
    else:
        what = "syntax error"

    try:
        expected = _expected_at(text, min(offset, len(text)))
    except LarkError:
        expected = set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())
    if expected == {"EQUAL"}:
        hint = "each line is a definition of the form `name = pattern`"
    open_parens = _open_parens(text, min(offset, len(text)))
    if at_end and open_parens:
        p = open_parens[-1]
        hint = f"'(' at line {p.line}, column {p.column} is not closed"

    message = f"{filename}: {what}"
    if expected:
        message += "; expected " + ", ".join(sorted(_terminal_name(t) for t in expected))
    if hint:
        message += f" ({hint})"
    return ParseError(message, line, column)


# --- building patterns -----------------------------------------------------------------------

def _pos(node: Tree | Token) -> tuple[int | None, int | None]:
    if isinstance(node, Token):
        return node.line, node.column
    if not node.meta.empty:
        return node.meta.line, node.meta.column
    for child in node.children:
        line, column = _pos(child)
        if line is not None:
            return line, column
    return None, None


#: Integer literals must lie in the int64 range (a length, offset or size beyond it is never
#: needed: write None for unbounded).
INT_RANGE = (-(1 << 63), (1 << 63) - 1)

#: How each operator of the tree builds its pattern from its operands (sums and products are
#: n-ary: a chain `a + b + c` is built at once).
_OPERATORS: dict[str, Callable[[list[Pattern]], Pattern]] = {
    "or_": lambda xs: Or(*xs),
    "and_": lambda xs: And(*xs),
    "spread": lambda xs: xs[0] >> xs[1],
    "not_": lambda xs: ~xs[0],
}


def _chain(node: Tree) -> tuple[list[Tree], Token]:
    """Operands of a left-deep chain `a + b + c` of one operator (`(a + b) + c` in the tree),
    gathered without recursion, and the chain's first operator token."""
    kind = node.data
    right: list[Tree] = []
    op = node.children[1]
    while isinstance(node, Tree) and node.data == kind:
        node, op, operand = node.children
        right.append(operand)
    return [node] + right[::-1], op


def _int_literal(tok: Token) -> int | None:
    """The literal's value, or None when it is outside INT_RANGE."""
    s = tok.value.replace("_", "")
    scale = _SIZE_SUFFIX.get(s[-1].lower(), 1)
    if scale != 1:
        s = s[:-1]
    if len(s.lstrip("-").lstrip("0")) > 20:     # never convert thousands of digits
        return None
    value = int(s) * scale
    return value if INT_RANGE[0] <= value <= INT_RANGE[1] else None


class _Builder:
    """Turns the lark tree into Pattern objects, definition by definition."""

    def __init__(self, filename: str):
        self.filename = filename
        self.defs: dict[str, Pattern] = {}
        self.where: dict[str, Token] = {}      # name -> the NAME token of its definition
        self.all_names: dict[str, Token] = {}  # every definition in the file (first one)
        self.current: Token | None = None      # the definition being built

    def error(self, message: str, node: Tree | Token) -> ParseError:
        line, column = _pos(node)
        return ParseError(f"{self.filename}: {message}", line, column)

    # definitions ---------------------------------------------------------------------------
    def build(self, tree: Tree) -> dict[str, Pattern]:
        definitions = list(tree.children)
        if not definitions:
            raise ParseError(f"{self.filename}: no definitions; a .sas file needs at least one "
                             f"line of the form `name = pattern`", 1, 1)
        for d in definitions:
            self.all_names.setdefault(d.children[0].value, d.children[0])
        for d in definitions:
            name_tok, expr = d.children
            name = name_tok.value
            if name in _RESERVED:
                kind = "a primitive" if name in PRIMITIVES else "a literal"
                raise self.error(f"cannot define {name!r}: it is {kind}; choose another name", name_tok)
            if name in self.defs:
                first = self.where[name]
                raise self.error(f"{name!r} is already defined at line {first.line}; each name "
                                 f"may be defined once", name_tok)
            self.current = name_tok
            self.defs[name] = self.expr(expr)
            self.where[name] = name_tok
        return dict(self.defs)

    # pattern expressions -------------------------------------------------------------------
    def expr(self, root: Tree) -> Pattern:
        """Build the pattern of an expression tree without recursion (a sum of thousands of
        terms is one flat `Or`; nesting deeper than `MAX_DEPTH` is refused at its operator)."""
        # Post-order walk on an explicit stack. A task is ("visit", node) or ("build", node,
        # operator token, operand count); built patterns wait on `done` in operand order.
        tasks: list[tuple] = [("visit", root)]
        done: list[Pattern] = []
        while tasks:
            task = tasks.pop()
            if task[0] == "build":
                _, kind, op, count = task
                operands = done[len(done) - count:]
                del done[len(done) - count:]
                done.append(self.apply(_OPERATORS[kind], operands, op))
                continue
            node = task[1]
            kind = node.data
            if kind == "ref":
                done.append(self.ref(node.children[0]))
            elif kind == "primitive":
                done.append(self.primitive(node))
            elif kind == "not_":
                op, operand = node.children
                tasks += [("build", kind, op, 1), ("visit", operand)]
            elif kind in ("or_", "and_", "spread"):
                operands, op = _chain(node) if kind != "spread" else ([node.children[0], node.children[2]],
                                                                      node.children[1])
                tasks.append(("build", kind, op, len(operands)))
                tasks += [("visit", c) for c in reversed(operands)]
            else:
                raise self.error(f"unexpected construct {kind!r}", node)  # grammar and builder disagree
        return done[0]

    def apply(self, fn: Callable[[list[Pattern]], Pattern], operands: list[Pattern], op: Token) -> Pattern:
        """Run an operator, reporting a PatternError at the operator token."""
        try:
            return fn(operands)
        except PatternError as e:
            raise self.error(f"operator {op.value!r}: {e}", op) from None

    def ref(self, tok: Token) -> Pattern:
        name = tok.value
        if name in self.defs:
            return self.defs[name]
        if self.current is not None and name == self.current.value:
            raise self.error(f"{name!r} is used in its own definition", tok)
        if name in self.all_names:
            later = self.all_names[name]
            raise self.error(f"{name!r} is defined later, at line {later.line}; a definition may "
                             f"only use names defined above it", tok)
        if name in PRIMITIVES:
            raise self.error(f"{name!r} is a primitive: call it, e.g. {name}(...)", tok)
        defined = ", ".join(self.defs) if self.defs else "none yet"
        raise self.error(f"unknown name {name!r}; defined names: {defined}", tok)

    def primitive(self, node: Tree) -> Pattern:
        name_tok = node.children[0]
        name = name_tok.value
        if name not in PRIMITIVES:
            if name in self.defs or name in self.all_names:
                raise self.error(f"{name!r} is a definition, not a primitive: use it without "
                                 f"parentheses", name_tok)
            if name in SCORE_SOURCES:
                raise self.error(f"{name}() is a score op chain, only valid as "
                                 f"Dynamic(score=...)", name_tok)
            raise self.error(f"unknown primitive {name!r}; valid primitives: "
                             f"{', '.join(PRIMITIVES)}", name_tok)
        fn = PRIMITIVES[name]
        args, kwargs = self.arguments(name, fn, node)
        try:
            return fn(*args, **kwargs)
        except (PatternError, TypeError, ValueError) as e:
            raise self.error(str(e), name_tok) from None

    # arguments -----------------------------------------------------------------------------
    def arguments(self, what: str, fn: Callable[..., Any], call: Tree) -> tuple[list[Any], dict[str, Any]]:
        """Bind the call's arguments to `fn`'s signature, with `.sas`-level error messages."""
        params = inspect.signature(fn).parameters
        positional_names = [p.name for p in params.values()
                            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword_names = [p.name for p in params.values() if p.kind != p.POSITIONAL_ONLY]
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        name_tok = call.children[0]
        for arg in call.children[1:]:
            if isinstance(arg, Tree) and arg.data == "kwarg":
                key_tok, value = arg.children
                key = key_tok.value
                if key not in keyword_names:
                    valid = ", ".join(keyword_names) if keyword_names else "none"
                    raise self.error(f"{what}() has no argument {key!r}; valid arguments: {valid}", key_tok)
                if key in kwargs or key in positional_names[:len(args)]:
                    raise self.error(f"{what}(): argument {key!r} is given twice", key_tok)
                kwargs[key] = self.value(value)
            else:
                if kwargs:
                    raise self.error(f"{what}(): positional argument after keyword arguments", arg)
                if len(args) >= len(positional_names):
                    if not positional_names:
                        raise self.error(f"{what}() takes no positional arguments", arg)
                    raise self.error(f"{what}() takes at most {len(positional_names)} positional "
                                     f"argument(s) ({', '.join(positional_names)})", arg)
                args.append(self.value(arg))
        given = set(positional_names[:len(args)]) | set(kwargs)
        for p in params.values():
            if p.default is p.empty and p.name not in given:
                raise self.error(f"{what}() needs the argument {p.name!r}", name_tok)
        return args, kwargs

    def value(self, node: Tree) -> Any:
        kind = node.data
        if kind == "integer":
            tok = node.children[0]
            value = _int_literal(tok)
            if value is None:
                shown = tok.value if len(tok.value) <= 30 else f"{tok.value[:12]}...({len(tok.value)} characters)"
                raise self.error(f"integer literal {shown} is out of range: integers must lie in "
                                 f"[-2**63, 2**63 - 1] (write None for unbounded)", tok)
            return value
        if kind == "string":
            return node.children[0].value[1:-1]
        if kind == "none":
            return None
        if kind in ("true", "false"):
            return kind == "true"
        if kind == "tuple":
            return tuple(self.value(c) for c in node.children)
        if kind == "chain":
            return self.chain(node)
        if kind == "name_value":
            tok = node.children[0]
            what = "a pattern" if tok.value in self.all_names else "a name"
            raise self.error(f"argument values must be literals (integers, None, true/false, "
                             f"strings, (a, b) pairs) or a score chain such as "
                             f"attn_score().sum(dim=1); {tok.value!r} is {what}", tok)
        raise self.error(f"unexpected argument construct {kind!r}", node)

    def chain(self, node: Tree) -> OpChain:
        children = list(node.children)
        if isinstance(children[0], Token):
            prefix = children.pop(0)
            if prefix.value != "ops":
                raise self.error(f"unknown score namespace {prefix.value!r}; write "
                                 f"attn_score()... or ops.attn_score()...", prefix)
        source, *methods = children
        src_tok = source.children[0]
        if src_tok.value not in SCORE_SOURCES:
            raise self.error(f"unknown score source {src_tok.value!r}; a score chain starts with "
                             f"one of {', '.join(s + '()' for s in SCORE_SOURCES)}", src_tok)
        fn = SCORE_SOURCES[src_tok.value]
        args, kwargs = self.arguments(src_tok.value, fn, source)
        try:
            result = fn(*args, **kwargs)
        except (PatternError, TypeError, ValueError) as e:
            raise self.error(str(e), src_tok) from None
        for call in methods:
            tok = call.children[0]
            if tok.value not in SCORE_METHODS:
                raise self.error(f"unknown score op .{tok.value}(); valid ops: "
                                 f"{', '.join('.' + m + '()' for m in SCORE_METHODS)}", tok)
            method = getattr(result, tok.value)
            args, kwargs = self.arguments(tok.value, method, call)
            try:
                result = method(*args, **kwargs)
            except (PatternError, TypeError, ValueError) as e:
                raise self.error(str(e), tok) from None
        return result
