"""The `sas` command line (click's CliRunner) and the KV-cache trace behind `sas plot`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from sas import Causal, Diag, Rect, analyze
from sas.analysis.events import ACTIVE, EMPTY, INACTIVE, simulate
from sas.cli.main import cli, parse_length
from sas.cli.plotting import kv_trace, last_use, trace_from_events, trace_from_functions, window_slots

from helpers.examples import EXAMPLES, ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def script(tmp_path: Path, body: str, name: str = "p.py") -> Path:
    path = tmp_path / name
    path.write_text("from sas import Causal, Diag, Dynamic, Rect\n" + body + "\n")
    return path


def assert_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in result.stderr, (f, result.stderr)


# --- inspect ---------------------------------------------------------------------------------

def test_inspect_text_streaming_llm():
    r = run("inspect", EXAMPLES / "streaming_llm.py", "--max-len", "16K")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "max_len:      16384" in out
    assert "1056 slots (dense: 16384; 15.5x smaller" in out
    assert "slot scheme:  prefix+ring (closed form)" in out
    assert "periodic" in out and "groups (" in out and "group 0 (boundary)" in out
    assert "cache events (" in out and "store" in out and "evict" in out
    for fn in ("def cache_id_func(token_id)", "def slot_key_func(cache_id, token_id)",
               "def mask_func(cache_id, token_id)"):
        assert fn in out


def test_inspect_json_matches_analysis():
    r = run("inspect", EXAMPLES / "sliding_window.py", "--max-len", "4K", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["max_len"] == 4096 and rep["cache_size"] == 1024 and rep["dense_cache_size"] == 4096
    assert rep["closed_form"] is True and rep["scheme"] == "ring"
    assert "def mask_func" in rep["source"] and rep["events"] and rep["groups"]


def _expand(ints) -> list[int]:
    return list(range(*ints["range"])) if isinstance(ints, dict) else list(ints)


def _attended_from_records(records: list[dict], n: int) -> np.ndarray:
    """The [n, n] mask the JSON's event records describe (a script's reading of the documented
    fields: keys by boundary list and residue classes, rows by anchored bounds, `repeat`,
    `every`)."""
    mask = np.zeros((n, n), dtype=bool)
    i = np.arange(n)
    for ev in records:
        if ev["kind"] != "active":
            continue
        T, P = ev["T"], ev["P"]
        classes, boundary = set(_expand(ev["classes"])), set(_expand(ev["boundary_keys"]))
        for j in range(n):
            if not (j in boundary or (j >= T and (j - T) % P in classes)):
                continue
            at = lambda b: j + b["value"] if b["anchor"] == "key" or j < T else j - (j - T) % P + b["value"]  # noqa: E731
            lo, hi = at(ev["lo"]), at(ev["hi"])
            rows = (i >= lo) & (((i - lo) % ev["repeat"] < hi - lo) if ev["repeat"] else (i < hi))
            if ev["every"]:
                p, w = ev["every"]
                rows &= (i - lo) % p < w
            mask[:, j] |= rows
    return mask


@pytest.mark.parametrize("pattern", [
    (Diag(0, 64) + Rect(cols=(0, 4))) * Causal(), Diag(0, 64, stride=4), (Rect(size=(16, 16)) >> Diag(0, 3)) * Causal(),
    ((Rect(size=(32, 32)) >> Diag(0, 1)) + ((Rect(size=(32, 32)) * Rect(cols=(28, None))) >> Rect())) * Causal(),
    (Rect(size=(64, 64)) >> Diag(0, 1)) * Rect(stride=4) * Causal()])
def test_json_event_records_describe_the_mask(pattern) -> None:
    """`group_records` / `event_records` carry the groups and cache events as fields (a new user
    found only prose to parse); the active events, read as documented, are exactly the mask."""
    n = 256
    rep = analyze(pattern, n).report()
    assert [g["text"] for g in rep["group_records"]] == rep["groups"]
    assert [e["text"] for e in rep["event_records"]] == rep["events"]
    assert all(isinstance(g["key_start"], int) and g["kind"] in ("boundary", "periodic", "tail")
               for g in rep["group_records"])
    assert np.array_equal(_attended_from_records(rep["event_records"], n), pattern.to_mask(n))
    json.dumps(rep)


def test_inspect_sas_text_file():
    path = EXAMPLES / "streaming_llm.sas"
    r = run("inspect", path, "--max-len", "16384", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["cache_size"] == 1056


def test_inspect_script_in_tmp_path(tmp_path):
    path = script(tmp_path, "pattern = (Diag(0, 6) + Rect(cols=(0, 2))) * Causal()")
    r = run("inspect", path, "--max-len", "64")
    assert r.exit_code == 0, r.output
    assert "8 slots (dense: 64" in r.stdout


def test_inspect_table_fallback_abbreviates_tables(tmp_path):
    path = script(tmp_path, "pattern = ((Rect(size=(3, 2)) >> Diag(0, 2)) + Rect(cols=(0, 1))) * Causal()")
    r = run("inspect", path, "--max-len", "1000")
    assert r.exit_code == 0, r.output
    assert "no closed form" in r.stdout and "entries; `sas inspect --json` prints them all" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) < 400


# --- inspect: patterns with a Dynamic component ---------------------------------------------

WINDOW_H2O = ("from sas import ops\n"
              "pattern = Diag(0, 64) + Diag(64, None) * Dynamic(budget=32, score=ops.attn_score().sum(dim=1))")


def test_inspect_dynamic_window_h2o_text(tmp_path):
    r = run("inspect", script(tmp_path, WINDOW_H2O), "--max-len", "1K")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "KV cache:     96 slots = 64 static + 32 dynamic (dense: 1024; 10.7x smaller" in out
    assert "region bound: 1024 slots" in out          # the Dynamic analysed as its whole region
    # what SASAttnKernel allocates: the pool also holds the key entering during a decode step
    assert "kernel cache: 97 slots = 64 static + 33 pool" in out and "score: fused kernel" in out
    assert "static:     Diag(offset=0, size=64)" in out
    assert "budget:     32" in out and "refresh:    False (H2O)" in out
    assert "capacity:   unbounded" in out
    # the traced torch.fx graph and its code
    assert "score graph (torch.fx" in out and "graph():" in out
    assert "%sum_1 : [num_users=1] = call_function[target=torch.sum]" in out
    assert "%attn_score" in out and "def forward(self, attn_probs, q, k):" in out
    # the fusion plan
    assert "inter-kernel memoization: yes" in out and "row max m" in out
    assert "kernels: 1" in out and "#0 (score source): attn_score [source] -> sum_1 [reduce]" in out
    assert "elementwise chains fused: none" in out
    # the static part's own analysis and functions
    assert "static part analysis (sas.analyze(Diag(offset=0, size=64)))" in out
    assert "64 static slots" in out and "slot scheme:  ring (closed form)" in out
    assert "return token_id % 64" in out and "def mask_func(cache_id, token_id)" in out


def test_inspect_dynamic_window_h2o_json(tmp_path):
    from sas.dynamic import plan_dynamic

    path = script(tmp_path, WINDOW_H2O)
    r = run("inspect", path, "--max-len", "1024", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["dynamic"] is True and rep["max_len"] == 1024 and rep["dense_cache_size"] == 1024
    assert (rep["static_cache_size"], rep["dynamic_cache_size"], rep["cache_size"]) == (64, 32, 96)
    assert rep["region_bound_cache_size"] == 1024 and rep["loaded_per_step"] == 96
    kc = rep["kernel_cache"]
    assert (kc["static_slots"], kc["pool_slots"], kc["cache_size"], kc["max_entering_per_step"]) == (64, 33, 97, 1)
    # the same numbers as the library computes them
    from sas.lang.loader import load_pattern

    p = load_pattern(path)
    plan = plan_dynamic(p, max_len=1024)
    assert analyze(plan.static, max_len=1024).cache_size == rep["static_analysis"]["cache_size"] == 64
    assert analyze(p, max_len=1024).cache_size == rep["region_bound_analysis"]["cache_size"] == 1024
    split = rep["split"]
    assert split["static"] == "Diag(offset=0, size=64)" and split["budget"] == 32
    assert split["refresh"] is False and split["policy"] == "h2o" and split["capacity"] is None
    g = rep["score_graph"]
    assert "torch.sum" in g["graph"] and "def forward" in g["code"]
    nodes = {n["name"]: n for n in g["nodes"]}
    assert nodes["sum_1"]["kind"] == "reduce" and nodes["sum_1"]["chain_op"] == "reduce(dim=1, kind='sum')"
    assert nodes["attn_score"]["kind"] == "source"
    f = rep["fusion"]
    assert f["memoize_softmax"] is True and f["starts_with_attn_score"] is True
    assert [k["nodes"] for k in f["kernels"]] == [["attn_score", "sum_1"]]
    assert f["elementwise_chains"] == [] and "kernels: 1" in f["summary"]


def test_inspect_dynamic_pooling_chain_has_two_kernels(tmp_path):
    path = script(tmp_path, "from sas import ops\n"
                            "pattern = Diag(0, 8) + Diag(8, None) * Dynamic(budget=4, "
                            "score=(ops.attn_score().sum(dim=1) * 2.0).pooling(kernel_size=3) + 1.0)")
    r = run("inspect", path, "--max-len", "256")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "12 slots = 8 static + 4 dynamic" in out
    assert "kernels: 2" in out and "%pool_keys" in out
    assert ("#1 (pooling needs neighbouring keys' scores across key blocks): "
            "pool_keys [pool] -> add [elementwise]") in out
    assert "mul: epilogue of sum_1 (kernel #0)" in out and "add: epilogue of pool_keys (kernel #1)" in out
    rep = json.loads(run("inspect", path, "--max-len", "256", "--json").stdout)
    assert len(rep["fusion"]["kernels"]) == 2 and rep["fusion"]["memoize_softmax"] is True
    assert [c["nodes"] for c in rep["fusion"]["elementwise_chains"]] == [["mul"], ["add"]]


def test_inspect_dynamic_empty_static_part():
    # Causal() * Dynamic(budget=2): nothing is static, the whole causal triangle is the region
    r = run("inspect", EXAMPLES / "fig3c_dynamic.py", "--max-len", "1K")
    assert r.exit_code == 0, r.output
    assert "KV cache:     2 slots = 0 static + 2 dynamic (dense: 1024" in r.stdout
    assert "static:     (empty)" in r.stdout and "region bound: 1024 slots" in r.stdout
    assert "static part: empty: 0 static slots" in r.stdout
    rep = json.loads(run("inspect", EXAMPLES / "fig3c_dynamic.py", "--max-len", "1K", "--json").stdout)
    assert (rep["static_cache_size"], rep["dynamic_cache_size"], rep["cache_size"]) == (0, 2, 2)
    assert rep["static_analysis"] is None and rep["region_bound_cache_size"] == 1024


def test_inspect_dynamic_static_part_empty_but_not_folded(tmp_path):
    # analyze() refuses the (empty) static part; inspect reports 0 static slots
    path = script(tmp_path, "from sas import ops\n"
                            "pattern = Diag(0, 2) * Diag(5, 1) + Causal() * Dynamic(budget=4, "
                            "score=ops.attn_score().sum(dim=1))")
    r = run("inspect", path, "--max-len", "256", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["static_cache_size"] == 0 and rep["cache_size"] == 4 and rep["static_analysis"] is None


def test_inspect_dynamic_sas_file_bounded_region():
    r = run("inspect", EXAMPLES / "window_h2o.sas", "--max-len", "64")
    assert r.exit_code == 0, r.output
    assert "4 slots = 2 static + 2 dynamic (dense: 64" in r.stdout
    assert "region bound: 8 slots" in r.stdout and "capacity:   6 candidate keys at most at once" in r.stdout


def test_inspect_dynamic_refresh_keeps_every_candidate(tmp_path):
    path = script(tmp_path, "from sas import ops\n"
                            "pattern = Diag(0, 16) + Rect(cols=(0, 4)) * Causal() + Diag(16, None) * Dynamic("
                            "budget=8, score=ops.attn_score().sum(dim=1), refresh=True)")
    r = run("inspect", path, "--max-len", "512", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["static_cache_size"] == 20 and rep["region_bound_cache_size"] == 512
    assert rep["cache_size"] == 512 and rep["dynamic_cache_size"] == 492 and rep["loaded_per_step"] == 28
    assert rep["split"]["policy"] == "refresh"
    out = run("inspect", path, "--max-len", "512").stdout
    assert "loaded:       28 keys per decode query = 20 static + 8 selected (budget)" in out


def test_inspect_dynamic_custom_registered_op(tmp_path):
    path = tmp_path / "custom.py"
    path.write_text(
        "import torch\n"
        "import sas\n"
        "from sas import Diag, Dynamic\n\n"
        "@sas.ops.register\n"
        "def cli_proj_score():\n"
        "    q = sas.sym.active_Q\n"
        "    w = sas.sym.custom_weight(name='wgt', shape=('D', 'Lk'))\n"
        "    return torch.matmul(q, w).relu()\n\n"
        "pattern = Diag(0, 16) + Diag(16, None) * Dynamic(budget=8, score=sas.ops.cli_proj_score().sum(dim=1))\n")
    r = run("inspect", path, "--max-len", "256")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "24 slots = 16 static + 8 dynamic" in out
    assert "score=cli_proj_score().reduce(dim=1, kind='sum')" in out
    assert "%w_wgt : [num_users=1] = placeholder[target=w_wgt]" in out
    assert "call_function[target=torch.matmul](args = (%q, %w_wgt)" in out
    assert "call_method[target=relu]" in out and "score_ops.fold_heads" in out
    assert "def forward(self, attn_probs, q, k, w_wgt):" in out
    assert "custom weight 'wgt' ['D', 'Lk']" in out
    assert "inter-kernel memoization: no" in out
    assert "#0 (custom operation with no fusion rule): matmul [opaque] -> relu [elementwise]" in out
    rep = json.loads(run("inspect", path, "--max-len", "256", "--json").stdout)
    assert rep["fusion"]["memoize_softmax"] is False
    assert {n["chain_op"] for n in rep["score_graph"]["nodes"] if n["name"] in ("matmul", "relu")} == \
        {"cli_proj_score()"}


def test_inspect_static_json_says_not_dynamic():
    rep = json.loads(run("inspect", EXAMPLES / "sliding_window.py", "--max-len", "4K", "--json").stdout)
    assert rep["dynamic"] is False and rep["cache_size"] == 1024


@pytest.mark.parametrize("body,fragments", [
    ("pattern = Diag(0, 2) + Diag(2, 6) * Dynamic(budget=7, score=ops.attn_score().sum(dim=1))",
     ("budget=7", "<= 6")),
    ("pattern = Diag(0, 2) + Diag(2, 6) * Dynamic(budget=2, score=ops.attn_score())",
     ("one score per key", "reduce the query axis")),
    ("pattern = Causal() * ~Dynamic(budget=2, score=ops.attn_score().sum(dim=1))", ("'~'",)),
    ("pattern = Diag(-2, 5) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1))", ("not causal",)),
    ("pattern = Causal() * Dynamic(budget=2, score=ops.attn_score().sum(dim=1)) "
     "+ Causal() * Dynamic(budget=3, score=ops.attn_score().sum(dim=1))", ("2 different Dynamic",)),
])
def test_inspect_dynamic_errors(tmp_path, body, fragments):
    path = script(tmp_path, "from sas import ops\n" + body)
    for extra in ((), ("--json",)):
        assert_error(run("inspect", path, "--max-len", "256", *extra), *fragments)


@pytest.mark.parametrize("text,value", [("16384", 16384), ("16K", 16384), ("16k", 16384), ("1M", 1 << 20),
                                        (" 2K ", 2048), (7, 7)])
def test_parse_length(text, value):
    assert parse_length(text) == value


# --- errors ----------------------------------------------------------------------------------

def test_missing_file():
    for cmd in ("inspect", "plot"):
        args = [cmd, "no/such/pattern.py"] + (["-o", "x.png"] if cmd == "plot" else [])
        assert_error(run(*args), "pattern file not found", "no/such/pattern.py")


def test_folder_instead_of_file():
    assert_error(run("inspect", EXAMPLES), "is a folder")


@pytest.mark.parametrize("bad", ["0", "-5", "abc", "1.5K", "K", ""])
def test_bad_max_len(bad):
    assert_error(run("inspect", EXAMPLES / "sliding_window.py", "--max-len", bad),
                 "--max-len must be a positive integer", repr(bad))


def test_non_causal_pattern_inspect(tmp_path):
    path = script(tmp_path, "pattern = Diag(-2, 5)")
    assert_error(run("inspect", path), "not causal", "Causal()")


def test_script_without_pattern(tmp_path):
    path = tmp_path / "nothing.py"
    path.write_text("x = 1\n")
    assert_error(run("inspect", path), "pattern")


def test_script_that_raises(tmp_path):
    path = script(tmp_path, "pattern = Diag(0, -3)")
    r = run("inspect", path)
    assert_error(r)


def test_bad_window(tmp_path):
    for w in ("0", "-1", "100000"):
        assert_error(run("plot", EXAMPLES / "sliding_window.py", "-o", tmp_path / "x.png", "--window", w),
                     "--window")
    assert not list(tmp_path.iterdir())


def test_output_is_a_folder(tmp_path):
    assert_error(run("plot", EXAMPLES / "sliding_window.py", "-o", str(tmp_path) + "/"), "folder")


def test_unknown_backend(tmp_path):
    r = run("compile", EXAMPLES / "sliding_window.py", "--backend", "metal", "-o", tmp_path / "build")
    assert_error(r, "unknown backend 'metal'", "triton")
    assert not (tmp_path / "build").exists()


def test_compile_with_a_broken_backend_install_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sas.codegen.compile", None)   # import now fails
    r = run("compile", EXAMPLES / "sliding_window.py", "-o", tmp_path / "build")
    assert_error(r, "triton backend cannot be loaded", "sas[kernels]")
    assert not (tmp_path / "build").exists()


def test_compile_writes_kernels(tmp_path):
    out = tmp_path / "build"
    r = run("compile", EXAMPLES / "sliding_window.py", "--backend", "triton", "-o", out,
            "--max-len", "1K", "--head-dim", "64", "--dtype", "float16")
    assert r.exit_code == 0, r.output
    assert (out / "prefill.py").is_file() and (out / "report.json").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["max_len"] == 1024 and report["head_dim"] == 64


def test_compile_dynamic_pattern(tmp_path):
    out = tmp_path / "h2o"
    r = run("compile", EXAMPLES / "fig7a_window_h2o.py", "-o", out, "--max-len", "4K")
    assert r.exit_code == 0, r.output
    assert "KV cache: 5 slots = 2 static + 3 pool (dense: 4096)" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["__init__.py", "checks.py", "dynamic_decode.py", "dynamic_host.py",
                                                     "graph_params.py", "plan.pt", "prefill.py", "report.json",
                                                     "report.md", "standalone.py", "static_decode.py"]
    report = json.loads((out / "report.json").read_text())
    assert report["dynamic"] is True and report["budget"] == 2 and report["score_path"] == "fused kernel"
    # a chain that only runs as a torch graph is refused by name, and nothing is written
    bad = script(tmp_path, "from sas import ops\n"
                           "pattern = Diag(0, 4) + Diag(4, None) * Dynamic(budget=2, "
                           "score=ops.attn_score().sum(dim=1).topk(2))")
    r = run("compile", bad, "-o", tmp_path / "bad", "--max-len", "64")
    assert r.exit_code == 2 and "not fused" in r.stderr
    assert not (tmp_path / "bad").exists()


def test_help_texts():
    r = run("--help")
    assert r.exit_code == 0 and all(c in r.output for c in ("inspect", "plot", "compile", "16K"))
    for cmd in ("inspect", "plot", "compile"):
        r = run(cmd, "--help")
        assert r.exit_code == 0 and "--max-len" in r.output


def test_module_entry_points():
    """`python -m sas` (a new user tried it first: it had no __main__), `-m sas.cli` and
    `-m sas.cli.main` run the command line."""
    for mod in ("sas", "sas.cli.main", "sas.cli"):
        p = subprocess.run([sys.executable, "-m", mod, "inspect", str(EXAMPLES / "no_such.py")],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert p.returncode == 2 and p.stderr.startswith("error: pattern file not found"), p.stderr
        assert "Warning" not in p.stderr


# --- plot ------------------------------------------------------------------------------------

def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


def test_plot_writes_png(tmp_path):
    out = tmp_path / "figs" / "strided_block_local.png"
    r = run("plot", EXAMPLES / "strided_block_local.py", "-o", out)
    assert r.exit_code == 0, r.output
    assert "from the cache events" in r.stdout and "warning" not in r.output
    assert_png(out)


def test_plot_file_takes_the_umask_permissions(tmp_path):
    """The image is written through a temporary file (0600 as made) but gets the permissions a
    new file gets under the umask, as `sas compile`'s files do."""
    mask = os.umask(0o022)
    try:
        out = tmp_path / "block_local.png"
        r = run("plot", EXAMPLES / "block_local.py", "-o", out, "--max-len", "128")
    finally:
        os.umask(mask)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def inspect_text(tmp_path, text: str, max_len: int) -> str:
    """`sas inspect` of a .sas file holding `text` at `max_len`: its output (exit code 0)."""
    f = tmp_path / "p.sas"
    f.write_text(text + "\n")
    r = run("inspect", f, "--max-len", str(max_len))
    assert r.exit_code == 0, r.output
    return r.stdout


def test_inspect_names_a_peak_at_query_0(tmp_path):
    assert "peak at:      query 0" in inspect_text(tmp_path, "pattern = Rect(cols=(0, 1)) * Causal()", 16)


def test_plot_window_and_many_slots(tmp_path):
    out = tmp_path / "openai_fixed.png"
    r = run("plot", EXAMPLES / "openai_fixed.py", "-o", out, "--max-len", "4K", "--window", "300")
    assert r.exit_code == 0, r.output
    assert "trace of 256 slot(s)" in r.stdout   # capped at 256 drawn slots
    assert_png(out)


def test_plot_table_pattern_uses_functions(tmp_path):
    path = script(tmp_path, "pattern = ((Rect(size=(3, 2)) >> Diag(0, 2)) + Rect(cols=(0, 1))) * Causal()")
    out = tmp_path / "table.png"
    r = run("plot", path, "-o", out, "--max-len", "512", "-w", "32")
    assert r.exit_code == 0, r.output
    assert "from the synthesized functions" in r.stdout
    assert_png(out)


def test_plot_non_causal_draws_mask_only(tmp_path):
    path = script(tmp_path, "pattern = Rect(size=(2, 2)) >> Diag(0, 1)")
    out = tmp_path / "mask.png"
    r = run("plot", path, "-o", out, "-w", "16")
    assert r.exit_code == 0, r.output
    assert "mask only" in r.stdout and "not causal" in r.stderr
    assert_png(out)


def test_plot_replaces_existing_file(tmp_path):
    out = tmp_path / "p.png"
    out.write_bytes(b"old")
    r = run("plot", EXAMPLES / "sliding_window.py", "-o", out, "--max-len", "128", "-w", "16")
    assert r.exit_code == 0, r.output
    assert_png(out)


# --- the trace behind `sas plot`: event simulation against the synthesized functions ---------

SMALL = {
    "sliding_window_8": Diag(0, 8),
    "streaming_sink2_window6": (Diag(0, 6) + Rect(cols=(0, 2))) * Causal(),
    "block_local_8x3": (Rect(size=(8, 8)) >> Diag(0, 3)) * Causal(),
    "strided_block_local_16_4": (Rect(size=(16, 16)) >> Diag(0, 1)) * Rect(stride=4) * Causal(),
    "openai_fixed_16_4": ((Rect(size=(16, 16)) >> Diag(0, 1))
                          + ((Rect(size=(16, 16)) * Rect(cols=(12, None))) >> Rect())) * Causal(),
    "openai_strided_8": Diag(0, 8) + Diag(0, None, stride=8),
}


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("n", [64, 50])
def test_simulated_trace_equals_mask_func(name, n):
    p = SMALL[name]
    a = analyze(p, n)
    assert a.events
    mask = p.to_mask(n)
    ev = simulate(a.events, a.cache_ids(n), a.max_len, 0, n, a.cache_size)
    fn = trace_from_functions(a, n)
    assert ev.shape == fn.shape == (a.cache_size, n)
    for i in range(n):
        keys = set()
        for s in range(a.cache_size):
            active = bool(a.mask_func(s, i))
            assert (ev[s, i] == ACTIVE) == active, (s, i, int(ev[s, i]), active)
            if a.slot_key_func(s, i) < 0:
                assert ev[s, i] == EMPTY, (s, i)
            if active:
                keys.add(a.slot_key_func(s, i))
        assert keys == set(np.flatnonzero(mask[i]).tolist()), i   # the trace decodes the mask
    # Cached-but-masked vs empty: the two traces agree except where the events keep a key whose
    # next active range the end of the sequence cuts off (its slot is not reused before the end).
    last = last_use(a, n)
    for s, i in np.argwhere(ev != fn):
        k = a.slot_key_func(int(s), int(i))
        assert ev[s, i] == INACTIVE and fn[s, i] == EMPTY and 0 <= k and last[k] < i, (s, i)
    assert (ev[:, : n // 2] == fn[:, : n // 2]).all()   # no difference far from the end


@pytest.mark.parametrize("name", sorted(SMALL))
def test_plot_trace_uses_events_and_window_slots(name):
    a = analyze(SMALL[name], 64)
    w = 40
    slots = window_slots(a, w)
    full = simulate(a.events, a.cache_ids(64), 64, 0, w, a.cache_size)
    assert (trace_from_events(a, w, slots) == full[slots]).all()
    assert not full[np.setdiff1d(np.arange(a.cache_size), slots)].any()   # other slots stay empty
    state, rows, source, warnings = kv_trace(a, w)
    assert source == "the cache events" and not warnings
    assert (rows == slots).all() and (state == full[slots]).all()


def test_inspect_dynamic_pattern_the_kernels_cannot_run_says_why(tmp_path):
    # the region starts 3 queries after the static part lets its keys go: analysable, but the
    # run-time handoff from the static cache to the pool has nothing to copy from
    r = run("inspect", script(tmp_path, "pattern = Diag(0, 2) + Diag(5, None) * Dynamic(budget=2)"),
            "--max-len", "64")
    assert r.exit_code == 0, r.output
    assert "kernel cache: none: SASAttnKernel cannot run this pattern" in r.stdout
    assert "becomes a dynamic candidate at query" in r.stdout


def test_compile_help_names_every_backend():
    """The help text lists backends without importing torch; it must not drift from the real list."""
    from sas.cli.main import FALLBACK_BACKENDS
    from sas.codegen.compile import BACKENDS

    assert FALLBACK_BACKENDS == BACKENDS


def test_inspect_says_a_budget_is_clamped_to_max_len(tmp_path):
    text = "pattern = Diag(0, 2) + Diag(2, None) * Dynamic(budget=1000)"
    assert "budget:     30 (Dynamic(budget=1000) clamped: within max_len=32" in inspect_text(tmp_path, text, 32)
    assert "budget:     1000\n" in inspect_text(tmp_path, text, 4096)


def test_inspect_a_fraction_budget():
    """`sas inspect` of a Kascade anchor (a run-time budget, ops.fraction) prints and writes JSON:
    the keys a decode query loads are the fraction's count over the region's largest set."""
    r = run("inspect", EXAMPLES / "kascade_anchor.py", "--max-len", "4K")
    assert r.exit_code == 0, r.output
    assert "loaded:       409 keys per decode query" in r.output        # int(0.1 * 4096), above min=128
    r = run("inspect", EXAMPLES / "kascade_anchor.py", "--max-len", "1K", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["loaded_per_step"] == 128                           # the minimum: 0.1 * 1024 < 128
    assert report["split"]["budget"] == "fraction(0.1, min=128)"



def test_group_text_says_where_its_rows_are_cut() -> None:
    """A group attended up to the last row the analysis draws says so (a new user read key 0 of
    Causal() * ~Diag(0, 8) as attended by rows 8-10 only, where every row from 8 attends it); the
    tail group, which ends at max_len, does not."""
    groups = analyze(Causal() * ~Diag(0, 8), 4096).groups
    first, tail = groups[0], groups[-1]
    assert "(the rows drawn, [0, 11), end there: its keys may be attended past them)" in first.describe()
    assert tail.kind == "tail" and "past them" not in tail.describe()
    mask = (Causal() * ~Diag(0, 8)).to_mask(64)
    assert mask[8:, 0].all()                           # key 0: every row from 8 on


def test_sas_file_without_pattern_names_the_definition_taken(tmp_path):
    """A .sas file of several definitions and no `pattern` takes its last one (documented); the
    command line says which, on stderr (a new user's `w = ...; sink = ...` was analysed as the sink
    alone, and only the pattern's repr in an error hinted at it). One definition, or a `pattern`,
    prints no note."""
    f = tmp_path / "two.sas"
    f.write_text("w = Diag(0, 8)\nsink = Rect(cols=(0, 4)) * Causal()\n")
    r = CliRunner().invoke(cli, ["inspect", str(f), "--max-len", "64"])
    assert r.exit_code == 0, r.output
    assert "note: " in r.stderr and "defines w, sink and no `pattern`: using `sink`" in r.stderr
    for text in ("pattern = Diag(0, 8)\nother = Causal()\n", "only = Diag(0, 8)\n"):
        f.write_text(text)
        r = CliRunner().invoke(cli, ["inspect", str(f), "--max-len", "64"])
        assert r.exit_code == 0 and "note:" not in r.stderr, r.stderr
