import os

import pytest
import torch

# Deterministic, fast CPU tests on the 2-core machines we run on.
torch.set_num_threads(int(os.environ.get("FEDSHIELD_TEST_THREADS", "2")))


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
