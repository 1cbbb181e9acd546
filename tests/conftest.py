"""Test-suite setup shared by every test file: the Triton interpreter on machines without a GPU,
the hypothesis profiles, and a private kernel cache per test module.

Shared helpers that are not fixtures live in tests/helpers/ (attention inputs and reference,
example paths, scaled Table-1 patterns, the plain H2O reference), tests/strategies.py
(hypothesis strategies) and tests/analysis_checks.py (brute-force analyzer references).

Hypothesis profiles (pick one with HYPOTHESIS_PROFILE=ci|dev|explore; the default is "ci" when
the CI environment variable is set, else "dev"):

- ci:      derandomized (the examples are a function of the test's code, so a run never
           depends on luck and a green commit stays green; derandomize implies no example
           database), no deadline, no shrinking: a failure is reported at once with the example
           as drawn and its `@reproduce_failure` blob (shrinking a slow kernel test once took
           10 minutes).
- dev:     the same examples as ci, but a failure is shrunk to a minimal example (hypothesis
           bounds that itself: at most 500 shrinks or 5 minutes per test).
- explore: fresh random examples on every run, shrinking, the example database in
           .hypothesis/: hunting for new failures on purpose; a failure it finds becomes an
           @example or a fixed strategy, never a flaky test.

Health checks: only `too_slow` is suppressed in every profile. It measures how long *drawing*
the examples takes, which on a shared 2-core CI machine depends on the load of other
processes, i.e. on luck; the example counts are bounded per test instead. Tests that need
more (filter_too_much, data_too_large) say so in their own @settings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

if not torch.cuda.is_available():  # the kernels run on the CPU; must precede any import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

# --- hypothesis profiles ------------------------------------------------------------------------

_NO_LUCK = dict(derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

# Shrinking re-runs a failing test hundreds of times; with Triton kernels under the interpreter
# that took 10 minutes once. CI reports the failing example as drawn instead (explicit, reuse
# and generate phases only; reuse is a no-op without a database).
settings.register_profile("ci", max_examples=50, phases=(Phase.explicit, Phase.reuse, Phase.generate),
                          **_NO_LUCK)
settings.register_profile("dev", max_examples=100, **_NO_LUCK)
settings.register_profile("explore", max_examples=100, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])

# --- CPU threads ----------------------------------------------------------------------------------
# Under pytest-xdist every worker is a process of its own: torch's default of one OpenMP thread
# per core then puts (workers x cores) spinning threads on the cores, and the model tests ran
# 30% slower (CPU time) than with the cores shared out. Each worker gets cores // workers.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 0:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
    # the per-token analysis's threads (sas.limits.analysis_threads) likewise
    os.environ.setdefault("SAS_ANALYSIS_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests of every module that loads the real SmolLM2 (`model_fixtures.smollm2`) form one
    xdist group (run with `--dist loadgroup`, as `make test` does): one worker converts and
    loads the model while the others run kernel tests, instead of each worker loading it and
    waiting on the conversion lock. First among the hooks: xdist's own reads the group marker to
    suffix the node ids (`...@smollm2`), so the marker must be on before it runs (without
    `tryfirst` both workers loaded the model, 2 x 30 s)."""
    import sys

    model_fixtures = sys.modules.get("model_fixtures")      # imported by the modules that use it, if any
    if model_fixtures is None or not config.pluginmanager.hasplugin("xdist"):
        return
    loader = model_fixtures.smollm2
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and any(v is loader for v in vars(module).values()):
            item.add_marker(pytest.mark.xdist_group("smollm2"))


def pytest_report_header(config: pytest.Config) -> str:
    where = "Triton interpreter (CPU)" if os.environ.get("TRITON_INTERPRET") == "1" else "GPU"
    return f"hypothesis profile: {PROFILE}; kernels: {where}"


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(autouse=True, scope="session")
def sas_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The dequantized-model cache (sas.model_cache) of this test run, unless SAS_MODEL_CACHE is
    set: one folder shared by the run's xdist workers (their base temp folders' parent), so the
    GGUF file is converted once per run and never into the user's ~/.cache."""
    if os.environ.get("SAS_MODEL_CACHE"):
        yield
        return
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["SAS_MODEL_CACHE"] = str(shared / "sas-models")
    yield
    os.environ.pop("SAS_MODEL_CACHE", None)


@pytest.fixture(autouse=True, scope="module")
def sas_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Each test module compiles its kernels into its own fresh SAS_CACHE_DIR (restored after),
    so that no test reads a kernel another run or module left behind, nor writes to ~/.cache."""
    old = os.environ.get("SAS_CACHE_DIR")
    path = str(tmp_path_factory.mktemp("sas_cache"))
    os.environ["SAS_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("SAS_CACHE_DIR", None)
    else:
        os.environ["SAS_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one CPU thread for a module (restored after): the model-integration tests run
    many small ops, which are far faster so than on OpenMP threads contending for 2 cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
