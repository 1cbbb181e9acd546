"""Bad input to the `sas` command line: every refusal is one `error: ...` line on stderr with
exit code 2 and no traceback, raised before anything is written; `compile -o` never replaces
a folder it did not write (unless --force) nor a symlink; `plot` writes the format its
extension names; `--json` stays JSON when the pattern script prints; `inspect` warns about
queries that attend no key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import sas.cli.main as main
from sas.cli.main import MAX_LEN, cli

ROOT = Path(__file__).resolve().parents[1]


def _subprocess_env() -> dict[str, str]:
    """This repository first on the child's path, then whatever the caller's PYTHONPATH holds
    (dependencies installed beside the interpreter's own site-packages)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


EXAMPLES = ROOT / "examples"
OK = "from sas import Causal, Diag, Rect\npattern = (Diag(0, 4) + Rect(cols=(0, 1))) * Causal()\n"
MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".jpg": b"\xff\xd8\xff", ".jpeg": b"\xff\xd8\xff", ".pdf": b"%PDF-"}


def run(*args: object, cwd: Path | None = None):
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(cli, [str(a) for a in args], prog_name="sas")
    finally:
        os.chdir(old)


def assert_one_error_line(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and result.stdout == ""
    for f in fragments:
        assert f in result.stderr, (f, result.stderr)


# --- a table of bad inputs: (files to create, arguments, words the error must name) -----------

BINARY = bytes(range(256)) * 2

CASES = {
    "missing file": ({}, ["inspect", "nope.py"], ["pattern file not found", "nope.py"]),
    "folder as pattern": ({"d.py/x": ""}, ["inspect", "d.py"], ["d.py is a folder"]),
    "unknown extension": ({"p.txt": OK}, ["inspect", "p.txt"], ["unknown pattern file type '.txt'", ".py, .sas"]),
    "binary .py": ({"b.py": BINARY}, ["inspect", "b.py"], ["b.py", "syntax error", "null bytes"]),
    "binary .sas": ({"b.sas": BINARY}, ["inspect", "b.sas"], ["b.sas", "UTF-8"]),
    "empty .py": ({"e.py": ""}, ["inspect", "e.py"], ["e.py", "no module-level variable 'pattern'"]),
    "empty .sas": ({"e.sas": ""}, ["inspect", "e.sas"], ["e.sas", "no definitions"]),
    "script raises": ({"r.py": "x = 1\nraise ValueError('boom\\nsecond line')\n"}, ["inspect", "r.py"],
                      ["r.py", "line 2", "ValueError: boom second line"]),
    "script exits": ({"x.py": "import sys\nsys.exit(3)\n"}, ["inspect", "x.py"], ["SystemExit: 3"]),
    "script recurses": ({"rec.py": "def f():\n    return f()\nf()\n"}, ["inspect", "rec.py"], ["RecursionError"]),
    "syntax error": ({"s.py": "pattern = (\n"}, ["inspect", "s.py"], ["s.py", "syntax error", "line 1"]),
    "no pattern": ({"n.py": "from sas import Diag\nwindow = Diag(0, 4)\n"}, ["inspect", "n.py"],
                   ["no module-level variable 'pattern'"]),
    "not a Pattern": ({"i.py": "pattern = 'Diag(0, 4)'\n"}, ["inspect", "i.py"], ["must be a sas pattern", "got str"]),
    "bad primitive": ({"bp.py": "from sas import Diag\npattern = Diag(0, -3)\n"}, ["inspect", "bp.py"], ["Diag"]),
    ".sas syntax": ({"q.sas": "pattern = Diag(0, 4) | Rect()\n"}, ["inspect", "q.sas"], ["line 1, column 22", "'+'"]),
    "non-causal": ({"nc.py": "from sas import Diag\npattern = Diag(-2, 5)\n"}, ["inspect", "nc.py"],
                   ["not causal", "Causal()"]),
    "max-len 0": ({"p.py": OK}, ["inspect", "p.py", "--max-len", "0"], ["--max-len", "'0'"]),
    "max-len huge": ({"p.py": OK}, ["inspect", "p.py", "--max-len", "99999999999999999999G"],
                     ["--max-len", "2**40", str(MAX_LEN), "99999999999999999999G"]),
    "max-len 2**40 + 1": ({"p.py": OK}, ["inspect", "p.py", "--max-len", str(MAX_LEN + 1)], ["2**40"]),
    "max-len 5000 digits": ({"p.py": OK}, ["inspect", "p.py", "--max-len", "9" * 5000], ["--max-len", "..."]),
    "max-len float": ({"p.py": OK}, ["inspect", "p.py", "--max-len", "1e6"], ["--max-len", "'1e6'"]),
    "window 0": ({"p.py": OK}, ["plot", "p.py", "-o", "f.png", "-w", "0"], ["--window", "at most 4096"]),
    "window text": ({"p.py": OK}, ["plot", "p.py", "-o", "f.png", "-w", "wide"], ["'--window'", "'wide'"]),
    "plot extension": ({"p.py": OK}, ["plot", "p.py", "-o", "f.gif"], ["'.gif'", ".png, .jpg, .jpeg, .svg, .pdf"]),
    "plot no extension": ({"p.py": OK}, ["plot", "p.py", "-o", "figure"], ["no extension", ".png"]),
    "plot into a folder": ({"p.py": OK, "out/x": ""}, ["plot", "p.py", "-o", "out/"], ["folder"]),
    "plot missing -o": ({"p.py": OK}, ["plot", "p.py"], ["missing option", "--output", "sas plot --help"]),
    "bad backend": ({"p.py": OK}, ["compile", "p.py", "-o", "k", "--backend", "metal"],
                    ["unknown backend 'metal'", "triton"]),
    "head dim 96": ({"p.py": OK}, ["compile", "p.py", "-o", "k", "--head-dim", "96"], ["head_dim 96", "16, 32, 64, 128"]),
    "head dim -1": ({"p.py": OK}, ["compile", "p.py", "-o", "k", "--head-dim", "-1"], ["head_dim -1"]),
    "head dim text": ({"p.py": OK}, ["compile", "p.py", "-o", "k", "--head-dim", "big"], ["'--head-dim'", "'big'"]),
    "dtype": ({"p.py": OK}, ["compile", "p.py", "-o", "k", "--dtype", "int8"], ["dtype 'int8'", "float16"]),
    "compile over a file": ({"p.py": OK, "k": "a file"}, ["compile", "p.py", "-o", "k"], ["k", "not a folder"]),
    "compile under a file": ({"p.py": OK, "f": "a file"}, ["compile", "p.py", "-o", "f/k"], ["f/k"]),
    "unknown option": ({"p.py": OK}, ["inspect", "p.py", "--fast"], ["no such option '--fast'"]),
    "unknown command": ({}, ["explain", "p.py"], ["no such command 'explain'", "sas --help"]),
    "missing argument": ({}, ["inspect"], ["missing argument", "PATTERN"]),
}


def make_files(root: Path, files: dict[str, str | bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, case):
    files, args, fragments = CASES[case]
    make_files(tmp_path, files)
    before = tree(tmp_path)
    assert_one_error_line(run(*args, cwd=tmp_path), *fragments)
    assert tree(tmp_path) == before


def test_errors_in_a_real_process_are_one_line(tmp_path):
    """Outside CliRunner: the console entry point prints one line, exit 2, no traceback."""
    (tmp_path / "r.py").write_text("raise KeyError('k')\n")
    for args in (["inspect", "r.py"], ["inspect", "r.py", "--max-len", "1" + "0" * 30],
                 ["compile", str(EXAMPLES / "sliding_window.py"), "-o", "k", "--head-dim", "x"]):
        p = subprocess.run([sys.executable, "-m", "sas.cli.main", *args], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120, env=_subprocess_env())
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout, p.stderr)
        assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("error: "), p.stderr


# --- compile -o: never replace what sas did not write -----------------------------------------

def compile_into(out: str, *extra: str, cwd: Path):
    return run("compile", EXAMPLES / "sliding_window.sas", "-o", out, "--max-len", "64", "--head-dim", "16",
               *extra, cwd=cwd)


def test_compile_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    assert_one_error_line(compile_into("proj", cwd=tmp_path), "proj is not empty", "notes.txt", "--force")
    assert tree(tmp_path) == before


def test_compile_force_replaces_it(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("mine")
    r = compile_into("proj", "--force", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path / "proj")) == ["__init__.py", "checks.py", "decode.py", "plan.pt", "prefill.py",
                                                  "report.json", "report.md", "standalone.py"]
    assert os.listdir(tmp_path) == ["proj"]


def test_compile_replaces_its_own_output_and_an_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert compile_into("empty", cwd=tmp_path).exit_code == 0
    assert compile_into("empty", cwd=tmp_path).exit_code == 0     # now sas's own output
    report = json.loads((tmp_path / "empty" / "report.json").read_text())
    assert report["max_len"] == 64 and sorted(os.listdir(tmp_path)) == ["empty"]


def test_a_report_json_that_sas_did_not_write_is_no_pass(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "report.json").write_text('{"files": ["report.json"]}')
    assert_one_error_line(compile_into("k", cwd=tmp_path), "not empty", "report.json")
    (tmp_path / "k" / "report.json").write_bytes(BINARY)
    assert_one_error_line(compile_into("k", cwd=tmp_path), "not empty")


def test_compile_writes_through_a_symlink_and_keeps_it(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    r = compile_into("link", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "a symlink: wrote its target" in r.stdout and str(tmp_path / "real") in r.stdout
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "real"
    assert (tmp_path / "real" / "report.json").is_file()
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
    # a symlink to a folder sas did not write is refused like the folder itself
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep").write_text("x")
    (tmp_path / "link2").symlink_to("other")
    assert_one_error_line(compile_into("link2", cwd=tmp_path), "link2 is not empty", "keep")
    assert os.listdir(tmp_path / "other") == ["keep"]


def test_compile_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "link").symlink_to("nowhere")
    assert_one_error_line(compile_into("link", cwd=tmp_path), "symlink", "nowhere", "does not exist")
    assert os.listdir(tmp_path) == ["link"] and (tmp_path / "link").is_symlink()


@pytest.mark.parametrize("out", [".", ".."])
def test_compile_never_replaces_the_current_folder_even_forced(tmp_path, out):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("x")
    assert_one_error_line(compile_into(out, "--force", cwd=work), "refusing to replace", "current folder")
    assert os.listdir(work) == ["a.txt"]


# --- plot formats ------------------------------------------------------------------------------

@pytest.mark.parametrize("ext", [".png", ".jpg", ".jpeg", ".svg", ".pdf", ".PNG"])
def test_plot_writes_the_format_of_the_extension(tmp_path, ext):
    out = tmp_path / f"fig{ext}"
    r = run("plot", EXAMPLES / "sliding_window.py", "-o", out, "--max-len", "64", "-w", "16")
    assert r.exit_code == 0, r.output
    data = out.read_bytes()
    if ext.lower() == ".svg":
        assert b"<svg" in data[:2000]
    else:
        assert data.startswith(MAGIC[ext.lower()]), data[:16]
    assert os.listdir(tmp_path) == [out.name]


# --- a pattern script that prints --------------------------------------------------------------

PRINTS = ("import os\nprint('python-level print')\nos.write(1, b'fd-level write\\n')\n"
          "from sas import Diag\npattern = Diag(0, 4)\n")


def test_json_stays_json_when_the_script_prints(tmp_path):
    (tmp_path / "p.py").write_text(PRINTS)
    p = subprocess.run([sys.executable, "-m", "sas.cli.main", "inspect", "p.py", "--json", "--max-len", "64"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=_subprocess_env())
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["cache_size"] == 4
    assert "python-level print" in p.stderr and "fd-level write" in p.stderr


def test_script_output_goes_to_stderr_under_clirunner(tmp_path):
    (tmp_path / "p.py").write_text("print('hello from the script')\nfrom sas import Diag\npattern = Diag(0, 4)\n")
    r = run("inspect", tmp_path / "p.py", "--json", "--max-len", "64")
    assert r.exit_code == 0 and json.loads(r.stdout)["cache_size"] == 4
    assert "hello from the script" in r.stderr


# --- queries without keys -------------------------------------------------------------------------

def test_inspect_warns_about_queries_without_keys():
    r = run("inspect", EXAMPLES / "strided_block_local.py", "--max-len", "16K")
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [
        "warning: the pattern leaves 12288 of the first 16384 queries without any key (their attention "
        "output is 0), e.g. query 1; 3 in every 4 queries"]
    rep = json.loads(run("inspect", EXAMPLES / "strided_block_local.sas", "--json").stdout)
    assert rep["queries_without_keys"] == {"count": 12288, "checked_queries": 16384, "exact": True, "first": 1,
                                           "period": 4, "per_period": 3, "steady_from": 0}


def test_no_warning_when_every_query_has_a_key():
    r = run("inspect", EXAMPLES / "streaming_llm.py", "--max-len", "1M")
    assert r.exit_code == 0 and r.stderr == ""
    rep = json.loads(run("inspect", EXAMPLES / "streaming_llm.sas", "--json").stdout)
    assert rep["queries_without_keys"]["count"] == 0 and rep["queries_without_keys"]["exact"]


def test_dynamic_pattern_counts_its_region_as_keys(tmp_path):
    """A query whose only keys lie in the Dynamic region still attends `budget` of them."""
    (tmp_path / "p.py").write_text(
        "from sas import Causal, Diag, Dynamic, Rect, ops\n"
        "pattern = Diag(0, 1) * Rect(stride=2) + Diag(1, None) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1))\n")
    r = run("inspect", tmp_path / "p.py", "--max-len", "256")
    assert r.exit_code == 0, r.output
    assert "warning" not in r.stderr
    (tmp_path / "q.py").write_text(
        "from sas import Causal, Diag, Dynamic, Rect, ops\n"
        "pattern = (Diag(0, 2) + Diag(2, None) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1))) * Rect(stride=(3, 1))\n")
    r = run("inspect", tmp_path / "q.py", "--max-len", "300", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["queries_without_keys"]["count"] == 200
    assert "200 of the first 300" in r.stderr and "2 in every 3" in r.stderr


def test_bare_sas_still_shows_the_help():
    r = run()
    assert "Usage: sas [OPTIONS] COMMAND" in r.output and "error:" not in r.output


def test_an_internal_error_is_not_dressed_up_as_a_user_error(monkeypatch):
    """Only user errors become `error:` lines; an exception of another type is a bug and
    must surface as itself (a traceback outside CliRunner)."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(main, "analyze", broken)
    r = run("inspect", EXAMPLES / "sliding_window.py")
    assert isinstance(r.exception, ZeroDivisionError) and "error:" not in r.stderr


@pytest.mark.parametrize("command, module, extras", [
    (["generate", EXAMPLES / "streaming_llm.py", "hi"], "transformers", "kernels,models"),
    (["train", EXAMPLES / "saap.py", "-o", "state.safetensors"], "torch", "kernels,models"),
])
def test_missing_extra_is_one_line(command, module, extras, monkeypatch, tmp_path):
    """A command whose optional dependency is not installed says which extra installs it, in one
    `error:` line with exit code 2, not an ImportError traceback."""
    monkeypatch.setitem(sys.modules, module, None)   # `import module` raises ModuleNotFoundError
    r = run(*command, cwd=tmp_path)
    assert r.exit_code == 2, r.output
    assert f"needs the Python package '{module}'" in r.stderr and f"pip install 'sas[{extras}]'" in r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1


def test_missing_unknown_module_keeps_its_traceback():
    """Only the optional dependencies of pyproject's extras become a user error; any other
    missing module is a bug."""
    assert main._missing_extra(ModuleNotFoundError("x", name="no_such_module"), "inspect") is None
    error = main._missing_extra(ModuleNotFoundError("x", name="triton.language"), "compile")
    assert error is not None and "pip install 'sas[kernels]'" in error.format_message()
