"""sas under transformers' tensor parallelism (sas.integrations.parallel, docs/integration.md).

The ranks run for real: torchrun starts 2 CPU processes that talk over gloo (on a machine
with GPUs: 2 GPUs over NCCL, which transformers picks there), transformers
shards a tiny random Llama (8 query / 4 KV heads) by heads with tp_plan="auto", and each
rank runs sas on its own heads. The results are compared with one process holding every
head: the same greedy tokens for dense attention, a static pattern (torch executor) and a
Dynamic H2O pattern (Triton kernels, on the interpreter here), each rank's cache half the
bytes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sas.cli.main import cli
from sas.errors import IntegrationError
from sas.integrations.parallel import check_head_split, valid_tp_sizes
from sas.models import ModelError, load_model
from tests.helpers.examples import EXAMPLES
from tests.helpers.tp_worker import DEVICE, run_checks
from tests.model_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# transformers shards onto CUDA wherever there is a GPU; there the ranks need a GPU each
needs_ranks = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                                 reason="tensor parallelism on this machine shards onto its CUDA GPU, and 2 ranks "
                                        "need 2 GPUs (CI runs the ranks on the CPU over gloo)")


@pytest.fixture(scope="module")
def tiny84(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny84"))


@pytest.fixture(scope="module")
def tiny93(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's head layout (9 query / 3 KV heads) in a tiny model."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny93"), heads=9, kv_heads=3)


def _torchrun(n: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                           *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


# --- the head split ------------------------------------------------------------------------
@pytest.mark.parametrize("q, kv, sizes", [(9, 3, [1, 3]), (32, 8, [1, 2, 4, 8]), (8, 4, [1, 2, 4]),
                                          (4, 4, [1, 2, 4]), (12, 6, [1, 2, 3, 6]), (7, 1, [1])])
def test_valid_tp_sizes(q: int, kv: int, sizes: list[int]) -> None:
    assert valid_tp_sizes(q, kv) == sizes


@given(kv=st.integers(1, 16), group=st.integers(1, 8), size=st.integers(1, 20))
def test_check_head_split_accepts_exactly_whole_groups(kv: int, group: int, size: int) -> None:
    q = kv * group
    if kv % size == 0:
        check_head_split(q, kv, size, "here")
    else:
        with pytest.raises(IntegrationError, match=r"valid sizes for this model are"):
            check_head_split(q, kv, size, "here")


def test_check_head_split_messages() -> None:
    with pytest.raises(IntegrationError, match=r"1\.5 KV heads and 4\.5 query heads.*valid sizes for this model are "
                                               r"1, 3"):
        check_head_split(9, 3, 2, "model SmolLM2")
    with pytest.raises(IntegrationError, match="positive integer, got 0"):
        check_head_split(9, 3, 0, "x")
    with pytest.raises(IntegrationError, match="not a whole number of query heads per KV head"):
        check_head_split(10, 4, 2, "x")


# --- load_model(tp=...) and `sas generate --tp` refuse before any weights are read ----------
def test_load_model_tp_refuses_uneven_heads(tiny93: Path) -> None:
    with pytest.raises(ModelError, match=r"over 2 ranks.*9 query / 3 KV heads.*valid sizes for this model are 1, 3"):
        load_model(tiny93, tp=2)


def test_load_model_tp_needs_torchrun(tiny93: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ModelError, match=r"launched by torchrun \(torchrun --nproc-per-node 3"):
        load_model(tiny93, tp=3)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ModelError, match="tp .* must be a positive integer"):
            load_model(tiny93, tp=bad)


def test_cli_generate_tp_refuses_uneven_heads(tiny93: Path) -> None:
    res = CliRunner().invoke(cli, ["generate", "dense", "w3 w4", "--model", str(tiny93), "--tp", "2", "--raw"])
    assert res.exit_code == 2, res.output
    assert "valid sizes for this model are 1, 3" in res.output
    res = CliRunner().invoke(cli, ["generate", "dense", "w3 w4", "--model", str(tiny93), "--tp", "0"])
    assert res.exit_code == 2 and "--tp must be a positive integer" in res.output


# --- real ranks ----------------------------------------------------------------------------
@needs_ranks
def test_two_ranks_match_one_process(tiny84: Path, tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    res = _torchrun(2, "tests/helpers/tp_worker.py", str(tiny84), str(out))
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = json.loads(out.read_text())
    one = run_checks(str(tiny84), 1)
    for name in ("dense", "static", "h2o"):
        assert ranks[name]["tokens"] == one[name]["tokens"], name
    for name in ("static", "h2o"):
        assert one[name]["tp"] is None and ranks[name]["tp"] == [2, 0, 4, 2]
        assert (one[name]["kv_heads"], ranks[name]["kv_heads"]) == (4, 2)
        assert ranks[name]["kv_bytes"] * 2 == one[name]["kv_bytes"] > 0
    # a score pooled over every KV head needs all of them: refused under tensor parallelism only
    assert one["pooled"] == "accepted"
    assert "pooled over all KV heads" in ranks["pooled"] and "all-reduce" in ranks["pooled"]


@needs_ranks
def test_cli_generate_tp2_streams_the_same_text(tiny84: Path) -> None:
    args = ["generate", str(EXAMPLES / "streaming_llm.sas"), "w3 w17 w101 w42 w7", "--model", str(tiny84),
            "--raw", "--backend", "torch", "--max-new-tokens", "6", "--device", DEVICE]
    one = CliRunner().invoke(cli, args)
    assert one.exit_code == 0, one.output
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    two = subprocess.run([sys.executable, "-m", "sas.cli", *args, "--tp", "2"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert two.returncode == 0, two.stderr[-4000:]
    text_one = one.stdout.strip().splitlines()[0]
    assert text_one and two.stdout.strip().splitlines()[0] == text_one
    sizes_one = re.search(r"KV cache at (\d+) tokens: ([\d.]+) KiB", one.stderr)
    sizes_two = re.search(r"KV cache at (\d+) tokens per rank of 2: ([\d.]+) KiB", two.stderr)
    assert sizes_one and sizes_two, (one.stderr, two.stderr[-2000:])
    assert sizes_two.group(1) == sizes_one.group(1)
    assert float(sizes_two.group(2)) * 2 == float(sizes_one.group(2))
