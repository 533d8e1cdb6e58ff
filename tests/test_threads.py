"""The one thread rule (fedshield.threads) that the CLI, sweeps, benches and the Flower apps
share: run.threads, else a default (1, or the runtime's own count for a Flower app), never
above $FEDSHIELD_MAX_THREADS."""

from __future__ import annotations

import pytest
import torch

from fedshield.errors import ConfigError
from fedshield.threads import set_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_flower_app_keeps_the_runtime_count_under_the_cap(monkeypatch, restore_threads):
    torch.set_num_threads(2)  # a SuperNode's ClientApp process: every core
    monkeypatch.delenv("FEDSHIELD_MAX_THREADS", raising=False)
    assert set_threads(None, default=None) == 2 and torch.get_num_threads() == 2
    monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "1")  # beside other processes
    assert set_threads(None, default=None) == 1 and torch.get_num_threads() == 1
    assert set_threads(4, default=None) == 1  # run.threads is capped too


def test_run_threads_and_the_default(monkeypatch, restore_threads):
    monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "3")
    assert set_threads(None) == 1
    assert set_threads(2) == 2 and torch.get_num_threads() == 2
    assert set_threads(8) == 3
    monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "0")  # at least one thread
    assert set_threads(2) == 1
    monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "2.5")
    with pytest.raises(ConfigError, match=r"FEDSHIELD_MAX_THREADS='2.5': expected a whole"):
        set_threads(2)
