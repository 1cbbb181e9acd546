"""The one AST walker (sas.codegen.printers) prints Triton byte-identically to the lowering
that sas shipped before the C++ printer was added: the generated prefill and decode modules
of the Table-1 patterns and of 53 hypothesis-drawn causal compositions hash as recorded in
tests/data/triton_lowering_golden.json (captured from the pre-refactor lower_triton.py; the prefill
hashes re-captured on 2026-11-26 after the prefill template changed (TMA loads, folded scale),
with the printers unchanged: every decode hash still matched; the decode hashes re-captured the
same day after the decode template's host code changed (direct launches), once every decode
hash of the previous template had been checked to match again; and again on 2026-11-26 (late)
after the decode template gained programmatic dependent launch and a blocks-per-split constant
(DecodeOptions.pdl and .blocks_per_split, which also enter every decode kernel's name), with
every prefill hash and the old decode hashes matching first; once more the same night after
the decode module's PDL check was cached per device, again after the old hashes matched; and on
2026-11-27 for six spreads of non-square units analysed per token, whose last uses now fit a
closed-form ring instead of a table: only their decode hashes changed, every other hash matched;
and the prefill hashes again on 2026-11-27 (late) after the prefill template gained the Gluon
kernel, once every prefill and decode hash had matched with the previous template; and once more
on 2026-11-27 (night) after the Gluon kernel's gate learned SAS_GLUON=0, every decode hash
matching; and the decode hashes later that night after the decode module's split rule gained
the query groups' one-wave rule (GROUP_ONE_WAVE_FROM), every hash of the previous template
matching first and every prefill hash unchanged; and on 2026-11-28 after the decode kernel took
the new token's slot out of its slot loop (one online-softmax column after the loop) and the
query groups' split rule gained one split for a single wave, once every hash of the previous
template had matched, every prefill hash unchanged; and again the same night after the module's
`decode` capped fp32 at FP32_MAX_STAGES by default, the previous hashes matching first; and on
2026-11-28 (afternoon) for three sink-only patterns (`Rect(rows=(5, None), cols=(None, m))`),
whose boundary keys now take one ring instead of fixed prefix slots (`KeySet.unrank` past the last
member): only their decode hashes changed, every other hash matched)."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest

import sas
from sas.analysis import analyze
from sas.codegen.printers import ExprWalker, lower_expr, printer_for
from sas.codegen.triton_backend import DecodeOptions, render_decode, render_prefill
from sas.errors import KernelError, SASError

GOLDEN = json.loads((Path(__file__).parent / "data" / "triton_lowering_golden.json").read_text())


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("pattern_repr", sorted(GOLDEN))
def test_triton_output_unchanged(pattern_repr):
    pattern = eval(pattern_repr, vars(sas))   # the canonical repr round-trips
    want = GOLDEN[pattern_repr]
    try:
        got_prefill = _hash(render_prefill(pattern))
    except SASError:
        got_prefill = "error"
    assert got_prefill == want["prefill"]
    try:
        got_decode = _hash(render_decode(analyze(pattern, 96), DecodeOptions(skip_mode="none")))
    except SASError:
        got_decode = "error"
    assert got_decode == want["decode"]


def test_golden_covers_decodable_patterns():
    assert len(GOLDEN) >= 60 and sum(v["decode"] != "error" for v in GOLDEN.values()) >= 40


def test_printers_differ_only_in_spelling():
    node = ast.parse("(i - j) % 4 == 0 and not (j < 3 or i // 2 > 7)", mode="eval").body
    names = {"i": "qi", "j": "kj"}
    assert lower_expr(node, names, boolean=True) == "((((qi - kj) % 4) == 0) & (((kj < 3) | ((qi // 2) > 7)) == 0))"
    assert lower_expr(node, names, boolean=True, dialect="cpp") == \
        "((((qi - kj) % 4) == 0) & (!((kj < 3) | ((qi / 2) > 7))))"
    assert lower_expr(ast.parse("x if x > 3 else 5000000000", mode="eval").body, {"x": "x"}, dialect="cpp") == \
        "((x > 3) ? x : 5000000000LL)"


def test_unknown_dialect_and_cpp_keywords():
    with pytest.raises(KernelError, match="dialect 'metal'"):
        printer_for("metal")
    with pytest.raises(KernelError, match="C\\+\\+ keyword"):
        ExprWalker({"i": "int"}, printer="cpp")
    assert ExprWalker({"i": "int"}, printer="triton").value(ast.Name("i", ast.Load())) == "int"
