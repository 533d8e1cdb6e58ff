import os

import pytest
import torch

# Deterministic, fast CPU tests on the 2-core machines we run on: one torch thread per
# pytest-xdist worker (`make test` runs two), two for a plain `pytest`.
_DEFAULT_THREADS = "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2"
torch.set_num_threads(int(os.environ.get("FEDSHIELD_TEST_THREADS", _DEFAULT_THREADS)))
# ...and runs that a test starts (a preset's run.threads = 2, a CLI subprocess) stay within
# it: two threads beside the other worker oversubscribe the two cores (fedshield.threads).
os.environ.setdefault("FEDSHIELD_MAX_THREADS", str(torch.get_num_threads()))

# Tests whose assertions depend on which float kernels run (references computed by another
# library or code path, batched vs sequential, exact ties): `make test` runs them again
# under other kernel paths of the same machine (MKL_CBWR, ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA), so a kernel-dependent assertion fails here before it lands.
_NUMERIC_FILES = {
    "test_aggregators.py", "test_aggregators_reference.py", "test_aggregators_byzfl_attacks.py",
    "test_attacks_reference.py", "test_vectorized.py", "test_privacy.py", "test_losses.py",
    "test_flower.py", "test_flower_strategies.py", "test_adversarial.py", "test_fedcart.py",
    "test_gray_conv.py",
}  # fmt: skip


def _kernels() -> str:
    """The float-kernel path this process runs (tools/kernel_variants.sh sets the variables)."""
    env = ", ".join(
        f"{k}={os.environ.get(k, 'auto')}" for k in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
    )
    return f"torch {torch.backends.cpu.get_cpu_capability()}, {env}"


def pytest_report_header(config):
    return f"CPU kernels: {_kernels()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A numerics failure names the kernels it ran under: the same test can pass on another
    # CPU's (or another variant's) kernels.
    report = (yield).get_result()
    if report.failed and item.get_closest_marker("numerics"):
        report.sections.append(("CPU kernels", _kernels()))


def pytest_collection_modifyitems(config, items):
    # (xdist_group marks are set in the modules: xdist reads them before this hook runs)
    for item in items:
        if item.path.name in _NUMERIC_FILES:
            item.add_marker(pytest.mark.numerics)


@pytest.fixture
def small_cfg():
    """A raw config dict for a seconds-long run on bundled data."""
    return {
        "name": "t",
        "seed": 0,
        "rounds": 4,
        "data": {"dataset": "digits", "num_clients": 6, "partition": "iid"},
        "model": {"name": "mlp", "params": {"hidden": 32}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 3},
        "server": {"clients_per_round": 3},
        "eval": {"every": 1},
        "checkpoint": {"every": 1},
        "run": {"progress": False},
    }


@pytest.fixture
def one_thread():
    """Torch on one thread for tests of tiny tensors (two threads spin against each other on
    a loaded machine: a 2 s test took 8 minutes)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
