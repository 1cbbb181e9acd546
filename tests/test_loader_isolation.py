"""Pattern scripts load in isolation: the modules beside a script are its own, never another
script's, and neither they nor the script's sys.path changes outlive the load."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from sas import Diag, Rect
from sas.errors import SASError
from sas.lang.loader import load_pattern

SCRIPT = "from sas import Diag\nfrom common import W\npattern = Diag(0, W)\n"


def project(root: Path, name: str, w: int, script: str = SCRIPT) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "common.py").write_text(f"W = {w}\n")
    (folder / "p.py").write_text(script)
    return folder / "p.py"


def test_same_named_siblings_in_two_folders(tmp_path):
    a, b = project(tmp_path, "a", 3), project(tmp_path, "b", 5)
    path_before = list(sys.path)
    assert load_pattern(a) == Diag(0, 3)
    assert load_pattern(b) == Diag(0, 5)      # was Diag(0, 3): b got a's `common`
    assert load_pattern(a) == Diag(0, 3)
    assert "common" not in sys.modules
    assert sys.path == path_before


def test_an_edited_sibling_is_read_again(tmp_path):
    p = project(tmp_path, "a", 3)
    assert load_pattern(p) == Diag(0, 3)
    (p.parent / "common.py").write_text("W = 7  # edited\n")
    assert load_pattern(p) == Diag(0, 7)


def test_a_module_of_the_same_name_loaded_elsewhere_is_hidden_then_restored(tmp_path, monkeypatch):
    other = types.ModuleType("common")
    other.W = 99
    monkeypatch.setitem(sys.modules, "common", other)
    assert load_pattern(project(tmp_path, "a", 4)) == Diag(0, 4)
    assert sys.modules["common"] is other


def test_sibling_packages_regular_and_namespace_do_not_leak(tmp_path):
    # a package name nothing else in the test process imports (tests/helpers is 'helpers')
    for name, w, init in (("one", 2, True), ("two", 6, False)):
        folder = tmp_path / name
        (folder / "sibling_pkg").mkdir(parents=True)
        if init:
            (folder / "sibling_pkg" / "__init__.py").write_text("")
        (folder / "sibling_pkg" / "sizes.py").write_text(f"W = {w}\n")
        (folder / "p.py").write_text("from sas import Diag\nfrom sibling_pkg.sizes import W\npattern = Diag(0, W)\n")
    assert load_pattern(tmp_path / "one" / "p.py") == Diag(0, 2)
    assert not [m for m in sys.modules if m.split(".")[0] == "sibling_pkg"]
    assert load_pattern(tmp_path / "two" / "p.py") == Diag(0, 6)
    assert not [m for m in sys.modules if m.split(".")[0] == "sibling_pkg"]


def test_sys_path_changes_are_undone(tmp_path):
    path_before = list(sys.path)
    p = tmp_path / "p.py"
    p.write_text("import sys\nsys.path.append('/nowhere')\nsys.path.insert(0, '/elsewhere')\n"
                 "from sas import Rect\npattern = Rect()\n")
    assert load_pattern(p) == Rect()
    assert sys.path == path_before


def test_modules_from_elsewhere_stay_imported(tmp_path, monkeypatch):
    """Only the script's own modules are dropped: a library it imports for the first time
    (torch, say) must stay, since some libraries cannot be imported twice."""
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    p = tmp_path / "p.py"
    p.write_text("import colorsys\nfrom sas import Diag\npattern = Diag(0, 2)\n")
    assert load_pattern(p) == Diag(0, 2)
    assert "colorsys" in sys.modules


def test_isolation_holds_when_the_script_fails(tmp_path):
    path_before = list(sys.path)
    p = project(tmp_path, "a", 3, "import sys\nsys.path.append('/x')\nfrom common import W\nraise RuntimeError('no')\n")
    with pytest.raises(SASError, match="line 4: RuntimeError: no"):
        load_pattern(p)
    assert "common" not in sys.modules and sys.path == path_before
    assert load_pattern(project(tmp_path, "b", 5)) == Diag(0, 5)


def test_a_sas_folder_beside_the_script_does_not_replace_sas(tmp_path):
    """A script next to a checkout of sas builds its pattern from the sas the loader checks
    against (it is never shadowed), so `pattern` is still recognised."""
    (tmp_path / "sas").mkdir()
    (tmp_path / "sas" / "__init__.py").write_text("raise ImportError('the shadow copy was imported')\n")
    p = tmp_path / "p.py"
    p.write_text("from sas import Diag\npattern = Diag(0, 2)\n")
    assert load_pattern(p) == Diag(0, 2)
