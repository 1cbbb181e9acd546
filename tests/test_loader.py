"""sas.lang.loader.load_pattern: `.py` scripts and `.sas` files, their errors, and the
`.sas` examples checked against the reference masks of reference-figures.md."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.errors import ParseError, PatternError, SASError
from sas.lang.loader import load_pattern

from helpers.examples import EXAMPLES


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_path_that_is_not_a_path_is_named():
    with pytest.raises(SASError, match="load_pattern: path must be a str or os.PathLike.*got int"):
        load_pattern(123)


# --- .py scripts -----------------------------------------------------------------------------

def test_python_script(tmp_path):
    path = write(tmp_path, "p.py", "from sas import Diag, Rect, Causal\n"
                                   "window = Diag(0, 8)\n"
                                   "pattern = (window + Rect(cols=(0, 2))) * Causal()\n")
    assert load_pattern(path) == (Diag(0, 8) + Rect(cols=(0, 2))) * Causal()
    assert load_pattern(str(path)) == load_pattern(path)


def test_python_script_main_block_does_not_run(tmp_path):
    path = write(tmp_path, "p.py", "from sas import Causal\npattern = Causal()\n"
                                   "if __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    assert load_pattern(path) == Causal()


def test_python_script_runs_in_a_fresh_namespace(tmp_path):
    first = write(tmp_path, "first.py", "from sas import Causal\npattern = Causal()\n")
    second = write(tmp_path, "second.py", "assert 'pattern' not in globals()\nx = 1\n")
    load_pattern(first)
    with pytest.raises(SASError, match="no module-level variable 'pattern'"):
        load_pattern(second)


def test_python_script_may_import_its_neighbours(tmp_path):
    write(tmp_path, "shapes_for_loader_test.py", "from sas import Diag\nWINDOW = Diag(0, 5)\n")
    path = write(tmp_path, "p.py", "from shapes_for_loader_test import WINDOW\npattern = WINDOW\n")
    assert load_pattern(path) == Diag(0, 5)


def test_python_script_without_pattern(tmp_path):
    path = write(tmp_path, "p.py", "from sas import Causal\nwindow = Causal()\n")
    with pytest.raises(SASError, match="no module-level variable 'pattern'"):
        load_pattern(path)


def test_python_script_pattern_of_the_wrong_type(tmp_path):
    path = write(tmp_path, "p.py", "pattern = 'Diag(0, 4)'\n")
    with pytest.raises(SASError, match="'pattern' must be a sas pattern.*got str"):
        load_pattern(path)


def test_sas_errors_from_the_script_keep_their_type_and_name_the_line(tmp_path):
    path = write(tmp_path, "p.py", "from sas import Diag\n\npattern = Diag(0, 0)\n")
    with pytest.raises(PatternError) as info:
        load_pattern(path)
    with pytest.raises(PatternError) as direct:
        Diag(0, 0)
    assert type(info.value) is PatternError
    assert str(info.value) == f"{path}, line 3: {direct.value}"
    assert type(info.value.__cause__) is PatternError


def test_other_script_errors_become_sas_errors_with_the_line(tmp_path):
    path = write(tmp_path, "p.py", "x = 1\n\ny = undefined_name + 1\n")
    with pytest.raises(SASError, match=r"failed at line 3: NameError: name 'undefined_name'") as info:
        load_pattern(path)
    assert isinstance(info.value.__cause__, NameError)


def test_script_syntax_error(tmp_path):
    path = write(tmp_path, "p.py", "pattern = (\n")
    with pytest.raises(SASError, match="syntax error in pattern script at line 1"):
        load_pattern(path)


def test_script_calling_exit(tmp_path):
    path = write(tmp_path, "p.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(SASError, match="SystemExit"):
        load_pattern(path)


# --- .sas files ------------------------------------------------------------------------------

def test_sas_file(tmp_path):
    path = write(tmp_path, "p.sas", "# demo\nwindow = Diag(0, 1K)\npattern = window * Causal()\n")
    assert load_pattern(path) == Diag(0, 1024) * Causal()


def test_sas_file_without_pattern_takes_the_last_definition(tmp_path):
    path = write(tmp_path, "p.sas", "a = Diag(0, 4)\nb = a + Rect(cols=(0, 1))\n")
    assert load_pattern(path) == Diag(0, 4) + Rect(cols=(0, 1))


def test_sas_file_errors_name_the_file(tmp_path):
    path = write(tmp_path, "bad.sas", "a = Diag(0, 4)\nb = a + c\n")
    with pytest.raises(ParseError) as info:
        load_pattern(path)
    assert (info.value.line, info.value.column) == (2, 9)
    assert str(path) in str(info.value)


def test_sas_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "p.sas"
    path.write_bytes(b"a = Diag(0, 4) # \xff\xfe\n")
    with pytest.raises(SASError, match="UTF-8"):
        load_pattern(path)


# --- path errors -----------------------------------------------------------------------------

def test_missing_file(tmp_path):
    for name in ("missing.py", "missing.sas"):
        with pytest.raises(SASError, match="no such file"):
            load_pattern(tmp_path / name)


def test_unknown_extension(tmp_path):
    path = write(tmp_path, "p.txt", "pattern = Causal()\n")
    with pytest.raises(SASError, match=r"unknown pattern file type '\.txt'.*\.py, \.sas"):
        load_pattern(path)
    with pytest.raises(SASError, match="no extension"):
        load_pattern(tmp_path / "pattern")


def test_directory(tmp_path):
    (tmp_path / "d.sas").mkdir()
    with pytest.raises(SASError, match="not a file"):
        load_pattern(tmp_path / "d.sas")


# --- the .sas examples -----------------------------------------------------------------------

def _reference(name: str, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The reference masks of reference-figures.md (q = query, k = key)."""
    return {
        "streaming_llm": (q >= k) & ((q - k < 1024) | (k < 32)),
        "block_local": (q >= k) & (q // 128 - k // 128 < 3),
        "sliding_window": (q >= k) & (q - k < 1024),
        "openai_strided": (q >= k) & ((q - k < 512) | ((q - k) % 512 == 0)),
        "openai_fixed": (q >= k) & ((q // 256 == k // 256) | (k % 256 >= 224)),
        "strided_block_local": (q >= k) & (q // 256 == k // 256) & (q % 4 == 0) & (k % 4 == 0),
        # Figure 7a: the Dynamic covers its whole region as a mask, so the window is 0..7.
        "window_h2o": (q >= k) & (q - k < 8),
    }[name]


EXAMPLE_NAMES = ["streaming_llm", "block_local", "sliding_window", "openai_strided",
                 "openai_fixed", "strided_block_local", "window_h2o"]


@pytest.mark.parametrize("n", [1024, 2000])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_sas_examples_match_the_reference_masks(name, n):
    pattern = load_pattern(EXAMPLES / f"{name}.sas")
    idx = np.arange(n, dtype=np.int64)
    assert np.array_equal(pattern.to_mask(n), _reference(name, idx[:, None], idx[None, :]))


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_sas_examples_equal_their_python_twins(name):
    py = EXAMPLES / ("fig7a_window_h2o.py" if name == "window_h2o" else f"{name}.py")
    assert load_pattern(EXAMPLES / f"{name}.sas") == load_pattern(py)


def test_window_h2o_example_keeps_its_dynamic_component():
    pattern = load_pattern(EXAMPLES / "window_h2o.sas")
    assert pattern == Diag(0, 2) + Diag(2, 6) * Dynamic(2, ops.attn_score().sum(dim=1), refresh=False)
    (dyn,) = pattern.dynamics()
    assert dyn.budget == 2 and dyn.refresh is False


def test_a_sas_file_with_a_byte_order_mark(tmp_path):
    """A UTF-8 .sas file saved with a byte-order mark loads like one without (as a .py script
    does); found by a fuzzing helper."""
    path = tmp_path / "bom.sas"
    path.write_bytes(b"\xef\xbb\xbf" + b"pattern = Diag(0, 4) * Causal()\n")
    assert load_pattern(path) == load_pattern(write(tmp_path, "plain.sas", "pattern = Diag(0, 4) * Causal()\n"))


def test_a_script_cannot_change_the_callers_recursion_limit(tmp_path):
    limit = sys.getrecursionlimit()
    path = write(tmp_path, "p.py", f"import sys\nsys.setrecursionlimit({limit + 321})\nfrom sas import Diag\n"
                                   f"pattern = Diag(0, 4)\n")
    load_pattern(path)
    assert sys.getrecursionlimit() == limit
