"""Packaging: the sdist and the wheel carry the kernel templates and the `.sas` grammar, an
unpacked wheel finds them inside its package (not in this checkout), and SAS_TEMPLATE_DIR
still overrides the templates. (`.ci/wheel-smoke` does the full install into a fresh venv.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from setuptools import build_meta

import sas
from sas.codegen import triton_backend
from sas.codegen.triton_backend import _environment, _render, template_dir
from sas.errors import KernelError
from sas.lang.text import GRAMMAR_PATH
from sas.resources import data_folder

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted(p.name for p in (ROOT / "templates" / "triton").glob("*.jinja"))


def source_files() -> list[str]:
    """The files git would hand to a fresh clone, plus untracked ones that are not ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout.decode()
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """sdist from a copy of the tree, then the wheel from that sdist (as `python -m build`)."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    for f in source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    dist = tmp / "dist"
    dist.mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(src)
        sdist = dist / build_meta.build_sdist(str(dist))
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
        os.chdir(tmp / sdist.name.removesuffix(".tar.gz"))
        wheel = dist / build_meta.build_wheel(str(dist))
    finally:
        os.chdir(cwd)
    return {"sdist": sdist, "wheel": wheel, "tmp": tmp}


def test_sdist_carries_templates_grammar_and_examples(built):
    with tarfile.open(built["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {f"templates/triton/{t}" for t in TEMPLATES} <= names
    assert {"grammar/sas.lark", "setup.py", "pyproject.toml", "README.md", "MANIFEST.in",
            "examples/streaming_llm.sas"} <= names
    assert not [n for n in names if "__pycache__" in n]


def test_wheel_ships_templates_and_grammar_inside_the_package(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    assert {f"sas/templates/triton/{t}" for t in TEMPLATES} <= names
    assert {"sas/templates/cuda/kernels.cu.jinja", "sas/templates/cuda/loader.py.jinja",
            "sas/templates/cuda/santa_prop.cu.jinja", "sas/templates/cuda/common.cuh.jinja"} <= names
    assert "sas/grammar/sas.lark" in names
    # every package of the source tree is in the wheel, and nothing from outside sas
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "sas").rglob("__init__.py")}
    assert {f"{p}/__init__.py" for p in packages} <= names
    assert {n.split("/")[0] for n in names} == {"sas", built["wheel"].name.split("-py3")[0] + ".dist-info"}
    assert (ROOT / "grammar" / "sas.lark").read_bytes() == zipfile.ZipFile(built["wheel"]).read("sas/grammar/sas.lark")


SMOKE = """
import sys, json
import sas
from sas.lang.text import GRAMMAR_PATH
from sas.codegen.triton_backend import template_dir, render_prefill, PrefillOptions
from sas.resources import data_folder
p = sas.load_pattern(sys.argv[1])
src = render_prefill(p, PrefillOptions(64, 32, 4, 1))
print(json.dumps({"sas": sas.__file__, "grammar": str(GRAMMAR_PATH), "templates": str(template_dir()),
                  "pattern": repr(p), "rendered": len(src)}))
"""


def test_unpacked_wheel_reads_its_own_data(built, tmp_path):
    """A pure-Python wheel unpacked on sys.path is what pip installs: the grammar and the
    templates must come from inside it, from a folder outside the checkout."""
    site = tmp_path / "site"
    zipfile.ZipFile(built["wheel"]).extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SAS_TEMPLATE_DIR")}
    # the unpacked wheel first; entries the caller had (where dependencies may live) after it
    env["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SMOKE, str(ROOT / "examples" / "streaming_llm.sas")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    pkg = site / "sas"
    assert Path(got["sas"]).parent == pkg
    assert Path(got["grammar"]) == pkg / "grammar" / "sas.lark"
    assert Path(got["templates"]) == pkg / "templates" / "triton"
    assert got["pattern"] == repr(sas.load_pattern(ROOT / "examples" / "streaming_llm.sas"))
    assert got["rendered"] > 1000


def test_checkout_reads_the_top_level_folders():
    if Path(sas.__file__).resolve().parent != ROOT / "sas":
        pytest.skip("sas is not imported from this checkout")
    assert Path(str(data_folder("grammar"))) == ROOT / "grammar"
    assert Path(str(GRAMMAR_PATH)) == ROOT / "grammar" / "sas.lark"
    if "SAS_TEMPLATE_DIR" not in os.environ:
        assert Path(str(template_dir())) == ROOT / "templates" / "triton"


def test_template_dir_override(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    marker = "# rendered from the SAS_TEMPLATE_DIR copy\n"
    t = tmp_path / "templates" / "triton" / "prefill.py.jinja"
    t.write_text(marker + t.read_text())
    monkeypatch.setenv("SAS_TEMPLATE_DIR", str(tmp_path / "templates"))
    assert template_dir() == tmp_path / "templates" / "triton"
    ctx = _prefill_context()
    assert _render("prefill.py.jinja", **ctx).startswith(marker)
    monkeypatch.setenv("SAS_TEMPLATE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(KernelError, match="SAS_TEMPLATE_DIR"):      # _render itself refuses (a review finding)
        _render("prefill.py.jinja", **ctx)


def test_templates_read_through_a_zip(tmp_path):
    """A zipped install has no real folder: the jinja2 loader reads through importlib.resources."""
    archive = tmp_path / "t.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in TEMPLATES:
            z.write(ROOT / "templates" / "triton" / name, f"triton/{name}")
    root = zipfile.Path(archive, "triton/")
    from_zip = _environment(root).get_template("prefill.py.jinja").render(**_prefill_context())
    from_disk = _environment(ROOT / "templates" / "triton").get_template("prefill.py.jinja").render(
        **_prefill_context())
    assert from_zip == from_disk


def _prefill_context() -> dict:
    """The context `render_prefill` passes to the prefill template, captured from a real call."""
    seen: dict = {}
    real = triton_backend._render

    def spy(template, **context):
        seen.update(context)
        return real(template, **context)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_backend, "_render", spy)
        triton_backend.render_prefill(sas.Diag(0, 8), triton_backend.PrefillOptions(64, 32, 4, 1))
    return seen
