"""Vectorised cohorts (run.vectorize): the batched trainer gives the sequential results.

Tolerance: every uploaded tensor (Δθ, buffers, Δh, prototypes), client state and train-loss
metric agrees with the sequential path on the same seed; dropout masks and attack starts are
the sequential ones (replayed per-client streams), so the only differences are float
summation orders, bounded by :func:`tolerance` from the round's passes. The comparisons run
in float64 (model and data): a sign-gradient attack step (PGD, TRADES) turns a last-bit
difference of ∇ₓ into a whole 2α step wherever a coordinate sits within rounding of 0, and
in float64 that window (~10⁻¹³ relative) is never hit, whichever CPU kernels (AVX-512, AVX2,
no SIMD; MKL's and oneDNN's code paths) compute each side. The production float32 path is
compared on the cases without sign steps (:func:`test_float32_rounds_match_without_sign_steps`).
``FEDSHIELD_TEST_DEVICE=cuda`` runs the same checks on a GPU (bench/gpu_check.sh).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshield import config
from fedshield.algorithms.client import CLIENT_ALGORITHMS
from fedshield.algorithms.client.base import batches
from fedshield.core.context import ClientUpdate
from fedshield.data import TensorData
from fedshield.errors import ConfigError
from fedshield.models.base import Classifier
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator
from fedshield.sim.vectorized import require_vectorizable
from fedshield.testing.algorithms import SMALL_MODELS, families, server_for

F32, F64 = torch.float32, torch.float64
DEVICE = os.environ.get("FEDSHIELD_TEST_DEVICE", "cpu")


class BNDropNet(Classifier):
    """conv → BatchNorm2d → ReLU → pool → Dropout → FC → BatchNorm1d → head (8×8 digits)."""

    def __init__(self, drop: float = 0.3) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(64, 16)
        self.num_features = 16
        self.head = nn.Linear(16, 10)

    def forward_features(self, x: Tensor) -> Tensor:
        return F.relu(self.fc(self.drop(self.trunk(x).flatten(1))))


class DropNet(Classifier):
    """An MLP with nn.Dropout and no BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 16)
        self.drop = nn.Dropout(0.3)
        self.num_features = 16
        self.head = nn.Linear(16, 10)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.drop(F.relu(self.fc(x.flatten(1))))


class FunctionalDropoutNet(Classifier):
    """Draws its dropout mask with F.dropout in forward: no nn.Dropout to route."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 16)
        self.num_features = 16
        self.head = nn.Linear(16, 10)

    def forward_features(self, x: Tensor) -> Tensor:
        return F.dropout(F.relu(self.fc(x.flatten(1))), 0.2, self.training)


def raw_cfg(**sections: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "vec",
        "seed": 3,
        "rounds": 2,
        # Dirichlet: unequal client sizes, so partial batches differ in size between clients.
        "data": {"dataset": "digits", "num_clients": 8, "partition": "dirichlet", "beta": 0.5},
        "model": {"name": "mlp", "params": {"hidden": 16}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 3},
        "server": {"clients_per_round": 5},
        "eval": {"every": 100},
        "run": {"progress": False, "device": DEVICE},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def simulator(
    raw: dict[str, Any],
    vectorize: Any,
    model: type[nn.Module] | None = None,
    dtype: torch.dtype = F64,
) -> Simulator:
    raw = copy.deepcopy(raw)
    raw["run"]["vectorize"] = vectorize
    exp = build(config.validate(raw))
    if model is not None:
        torch.manual_seed(0)
        exp.model = model().to(exp.device)
    if dtype != F32:
        in_dtype(exp, dtype)
    return Simulator(exp)


def in_dtype(exp: Any, dtype: torch.dtype) -> None:
    """The built run's model and data in ``dtype`` (uint8 images scaled as
    :meth:`TensorData.batch` does)."""

    def cast(d: TensorData | None) -> TensorData | None:
        if d is None:
            return None
        x = d.x.to(dtype) / 255.0 if d.x.dtype == torch.uint8 else d.x.to(dtype)
        return TensorData(x, d.y)

    exp.model = exp.model.to(dtype)
    exp.clients = [cast(c) for c in exp.clients]
    exp.train, exp.root, exp.val = cast(exp.train), cast(exp.root), cast(exp.val)
    bundle = exp.bundle
    exp.bundle = dataclasses.replace(bundle, train=cast(bundle.train), test=cast(bundle.test))


def last_round(sim: Simulator) -> list[ClientUpdate]:
    """Rounds 1..T−1 through the real loop, then round T's uploads."""
    for rnd in range(1, sim.cfg.rounds):
        sim.run_round(rnd)
    return sim.train_cohort(sim.begin_round(sim.cfg.rounds))


def assert_near(a: Tensor, b: Tensor, what: str, rel: float) -> None:
    assert a.dtype == b.dtype, f"{what}: {a.dtype} vs {b.dtype}"
    scale = float(a.abs().max()) if a.numel() else 0.0
    err = float((a - b).abs().max()) if a.numel() else 0.0
    # a tensor of zeros (unreached buffers) must stay zeros: the floor is the smallest normal
    tiny = torch.finfo(a.dtype).tiny
    assert err <= rel * scale + tiny, f"{what}: max |Δ| = {err:.3g} vs {rel:.3g} × {scale:.3g}"


def assert_same_updates(seq: list[ClientUpdate], vec: list[ClientUpdate], rel: float) -> None:
    assert [u.client_id for u in seq] == [u.client_id for u in vec]
    for u, v in zip(seq, vec):
        k = u.client_id
        assert u.num_examples == v.num_examples
        assert_near(u.delta, v.delta, f"client {k} delta", rel)
        assert_near(u.buffers, v.buffers, f"client {k} buffers", rel)
        assert set(u.extras) == set(v.extras), k
        for name in u.extras:
            assert_near(u.extras[name], v.extras[name], f"client {k} {name}", rel)
        assert set(u.metrics) == set(v.metrics)
        for name, value in u.metrics.items():
            assert v.metrics[name] == pytest.approx(value, rel=rel), (k, name)


def compare(
    raw: dict[str, Any], model: type[nn.Module] | None = None, dtype: torch.dtype = F64
) -> Simulator:
    """Every round's uploads and client states, batched vs sequential, to
    :func:`tolerance`. Each round starts both simulators from the same state (the
    sequential one's), so float differences of one round are not amplified by the next."""
    rel = tolerance(raw, dtype)
    seq_sim = simulator(raw, False, model, dtype)
    vec_sim = simulator(raw, True, model, dtype)
    for rnd in range(1, raw["rounds"] + 1):
        vec_sim.state = copy.deepcopy(seq_sim.state)
        seq_plan, vec_plan = seq_sim.begin_round(rnd), vec_sim.begin_round(rnd)
        seq, vec = seq_sim.train_cohort(seq_plan), vec_sim.train_cohort(vec_plan)
        assert_same_updates(seq, vec, rel)
        for k, state in seq_sim.state.client_states.items():
            for name, value in state.items():
                got = vec_sim.state.client_states[k][name]
                assert_near(value, got, f"state {k} {name}", rel)
        seq_sim.end_round(seq_plan, seq)
        vec_sim.end_round(vec_plan, vec)
    assert vec_sim._vectorized is not None and seq_sim._vectorized is None
    return vec_sim


AT = {"steps": 2}
CASES: dict[str, dict[str, Any]] = {
    "sgd-momentum-wd": {"client": {"momentum": 0.9, "weight_decay": 1e-3}},
    "sgd-epochs": {"client": {"local_steps": None, "local_epochs": 2, "batch_size": 32}},
    "fedprox": {"client": {"algorithm": "fedprox", "params": {"mu": 0.5}}},
    "sgd-mlp-batchnorm": {  # the bundled BatchNorm model: per-client running statistics
        "client": {"momentum": 0.9},
        "model": {"params": {"hidden": 16, "batchnorm": True}},
    },
    # dual_head under a plain loss: h gets no gradient, so SGD (and its weight decay) skips
    # it sequentially; SCAFFOLD gives it a zero gradient plus the correction instead.
    "sgd-unreached-head-wd": {
        "client": {"momentum": 0.9, "weight_decay": 0.01},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    },
    "scaffold-unreached-head-wd": {
        "client": {"algorithm": "scaffold", "weight_decay": 0.01},
        "server": {"algorithm": "scaffold"},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    },
    "fedacg": {
        "client": {"algorithm": "fedacg", "params": {"beta": 0.5}, "momentum": 0.5},
        "server": {"algorithm": "fedacg"},
    },
    "scaffold-seed": {"client": {"algorithm": "scaffold"}, "server": {"algorithm": "scaffold"}},
    "scaffold-option2": {
        "client": {"algorithm": "scaffold", "params": {"variant": "option2"}},
        "server": {"algorithm": "scaffold"},
    },
    "fedpgd": {"client": {"algorithm": "fedpgd", "params": AT}},
    "fedfat": {"client": {"algorithm": "fedfat", "params": AT}},
    "fedtrades": {"client": {"algorithm": "fedtrades", "params": AT}},
    "fedmart": {"client": {"algorithm": "fedmart", "params": AT}},
    "calfat": {"client": {"algorithm": "calfat", "params": AT}},
    "fedcart": {
        "client": {"algorithm": "fedcart", "params": AT, "weight_decay": 0.01},
        "server": {"algorithm": "fedcart"},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    },
    # TAET's stage follows the round (round_payload): natural CE in round 1, HARL in 2.
    "fedcart-taet-two-stages": {
        "client": {
            "algorithm": "fedcart",
            "params": {**AT, "at_loss": "taet", "stabilize_rounds": 1},
        },
        "server": {"algorithm": "fedcart"},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    },
    "fedcart-trades-proto-steps": {
        "client": {
            "algorithm": "fedcart",
            "params": {**AT, "at_loss": "trades", "proto_batch": 30},
        },
        "server": {"algorithm": "fedcart"},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_round_matches_sequential(case):
    compare(raw_cfg(**CASES[case]))


def sign_steps(raw: dict[str, Any]) -> int:
    """The attack steps K a client's local step runs (0 for algorithms without an attack)."""
    client = raw["client"]
    fields = CLIENT_ALGORITHMS.entry(client.get("algorithm", "sgd")).schema.model_fields
    if "steps" not in fields:
        return 0
    return int(client.get("params", {}).get("steps", fields["steps"].default))


@pytest.mark.parametrize("case", sorted(c for c in CASES if not sign_steps(raw_cfg(**CASES[c]))))
def test_float32_rounds_match_without_sign_steps(case):
    """The dtype runs use: without sign steps the float32 rounding bound holds as is."""
    compare(raw_cfg(**CASES[case]), dtype=F32)


# -- every client algorithm that batches × every model family it declares ---------------

#: the attack's steps K where a client algorithm has them (fewer than the default 10: the
#: check is per pass, and fewer passes keep the grid fast)
FAST_PARAMS = {"steps": 2}


def tolerance(raw: dict[str, Any], dtype: torch.dtype = F64) -> float:
    """The relative tolerance (of a tensor's largest entry) of a batched round against the
    sequential one. Batched and per-client kernels compute the same operations with
    reductions in other orders; a reduction of n terms differs by at most ~log₂(n)·ε
    relative with pairwise/blocked summation, n ≤ batch × one sample's largest activation
    = 16 × 2¹¹ (cnn_small's second convolution on 8×8) = 2¹⁵, so ≤ 16ε, once forward and
    once backward for each of the ≤ 4 layers with parameters — 128ε per pass — and the
    passes of the round add up.
    A pass is one forward and backward of the loss or of an attack step; a local step runs
    2 + K of them (TRADES' clean pass included), so: 128ε · U · (2 + K), U the local steps
    of the largest client (local epochs × its batches). The bound holds only where no sign
    step flips, so runs with K > 0 are compared in float64 (see the module docstring)."""
    client = raw["client"]
    k = sign_steps(raw)
    steps = client.get("local_steps", 3)
    if steps is None:  # epochs: every batch of the largest client (≤ the whole train set)
        steps = client["local_epochs"] * math.ceil(1797 / client.get("batch_size", 16))
    return 128 * torch.finfo(dtype).eps * steps * (2 + k)


def _batching_cases() -> list[Any]:
    out = []
    for entry in CLIENT_ALGORITHMS.entries():
        if entry.is_package and batches(entry.obj):
            for fam in families(entry):
                out.append(pytest.param(entry, fam, id=f"{entry.name}:{fam}"))
    return out


@pytest.mark.parametrize(("entry", "family"), _batching_cases())
def test_every_batching_algorithm_matches_sequential_on_its_families(entry, family):
    """Generated from the registry: an algorithm defined by its per-step pieces alone
    (:func:`fedshield.algorithms.client.base.batches`) runs batched, on every model family
    it declares, with the sequential uploads and client states."""
    fields = entry.schema.model_fields
    name, params = SMALL_MODELS[family]
    raw = raw_cfg(
        client={
            "algorithm": entry.name,
            "params": {k: v for k, v in FAST_PARAMS.items() if k in fields},
        },
        server={"algorithm": server_for(entry.name)},
        model={"name": name, "params": params},
    )
    compare(raw)


def test_fedcart_uploads_prototypes_batched():
    sim = simulator(raw_cfg(**CASES["fedcart"]), True)
    ups = last_round(sim)
    assert all(u.extras["fedcart/prototypes"].abs().sum() > 0 for u in ups)
    assert all(int(u.extras["fedcart/counts"].sum()) == u.num_examples for u in ups)


@pytest.mark.parametrize(
    "client", [{"momentum": 0.9}, {"algorithm": "fedpgd", "params": AT}], ids=["sgd", "fedpgd"]
)
def test_batchnorm_and_dropout(client):
    sim = compare(raw_cfg(client=client), BNDropNet)
    # The per-client running statistics were really updated (not the broadcast ones).
    ups = sim.train_cohort(sim.begin_round(2))
    assert all(not torch.equal(u.buffers, sim.state.buffers) for u in ups)


TRAIN_MODE_ATTACK = {"algorithm": "fedtrades", "params": {**AT, "attack_eval_mode": False}}


def test_train_mode_attack_draws_dropout_inside_every_pgd_step():
    compare(raw_cfg(client=TRAIN_MODE_ATTACK), DropNet)


def test_batchnorm_updated_inside_the_attack_falls_back(caplog):
    with caplog.at_level(logging.INFO, logger="fedshield"):
        sim = simulator(raw_cfg(client=TRAIN_MODE_ATTACK), "auto", BNDropNet)
        ups = last_round(sim)
    (line,) = [r.getMessage() for r in caplog.records if "one by one" in r.getMessage()]
    assert "attack_eval_mode=false" in line and sim._vectorized is None
    seq = last_round(simulator(raw_cfg(client=TRAIN_MODE_ATTACK), False, BNDropNet))
    assert all(torch.equal(u.delta, v.delta) for u, v in zip(seq, ups))


def test_dropout_masks_are_the_sequential_ones():
    """With dropout on and nothing else random, masks must match exactly, not in law:
    a different mask would move Δθ far beyond the tolerance."""
    raw = raw_cfg(client={"local_steps": 1})
    rel = tolerance(raw)
    seq = last_round(simulator(raw, False, BNDropNet))
    vec = last_round(simulator(raw, True, BNDropNet))
    other = last_round(simulator(dict(raw, seed=4), True, BNDropNet))
    assert_same_updates(seq, vec, rel)
    assert float((seq[0].delta - other[0].delta).abs().max()) > 1e3 * rel * float(
        seq[0].delta.abs().max()
    )


def test_chunks_give_the_same_round():
    raw = raw_cfg(client={"momentum": 0.9, "local_steps": None, "local_epochs": 1})
    whole = last_round(simulator(raw, True))
    raw["run"]["vectorize_chunk"] = 2
    assert_same_updates(whole, last_round(simulator(raw, True)), tolerance(raw))


def test_deltas_are_rows_of_one_matrix():
    ups = last_round(simulator(raw_cfg(), True))
    d = ups[0].delta.numel()
    base = ups[0].delta.data_ptr()
    itemsize = ups[0].delta.element_size()
    assert [u.delta.data_ptr() - base for u in ups] == [i * d * itemsize for i in range(len(ups))]


@pytest.mark.parametrize(
    "attack",
    [
        {"name": "sign_flip", "fraction": 0.25},  # needs the attackers' own updates
        {"name": "alie", "fraction": 0.4, "mode": "per_round"},  # attackers skip training
        {"name": "label_flip", "fraction": 0.25},  # attackers train on poisoned data
    ],
    ids=lambda a: a["name"],
)
def test_attacked_rounds_match_through_the_round_loop(attack):
    raw = raw_cfg(attack=attack, server={"aggregator": "median"}, eval={"every": 1})
    raw["rounds"] = 3
    seq, vec = simulator(raw, False), simulator(raw, True)
    seq.run(), vec.run()
    assert vec._vectorized is not None
    # A round's uploads differ by ≤ tolerance(raw); the median is 1-Lipschitz per
    # coordinate, and the next round's local SGD (3 steps, lr 0.1, curvature ≤ 10 here)
    # grows a difference by ≤ (1 + 0.1·10)³ = 8: over 3 rounds ≤ (1 + 8 + 64) · tolerance.
    rel = 73 * tolerance(raw)
    for a, b in zip(seq.records, vec.records):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=rel, abs=rel), (a["round"], key)
    torch.testing.assert_close(vec.state.params, seq.state.params, rtol=rel, atol=rel)


def test_skipped_attackers_upload_zero_rows():
    raw = raw_cfg(attack={"name": "alie", "fraction": 0.4, "mode": "per_round"})
    sim = simulator(raw, True)
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    skipped = [u for u in ups if not plan.trains(u.client_id)]
    assert skipped and all(float(u.delta.abs().sum()) == 0 for u in skipped)
    assert all(float(u.delta.abs().sum()) > 0 for u in ups if plan.trains(u.client_id))


def multi_exit_cfg() -> dict[str, Any]:
    """Depth-limited multi-exit cohorts: clients train different prefixes, no batched form."""
    eevit = {"patch_size": 4, "embed_dim": 16, "num_heads": 2, "depth": 2}
    return raw_cfg(
        model={"name": "eevit", "params": eevit},
        client={"algorithm": "multi_exit", "local_steps": 1, "params": {"depths": [1, 2]}},
    )


def test_untagged_algorithm_falls_back_with_one_log_line(caplog):
    sim = simulator(multi_exit_cfg(), "auto")
    with caplog.at_level(logging.INFO, logger="fedshield"):
        sim.run_round(1)
        sim.run_round(2)
    lines = [r.getMessage() for r in caplog.records if "one by one" in r.getMessage()]
    assert len(lines) == 1 and "client.algorithm='multi_exit'" in lines[0]
    assert sim._vectorized is None


def test_unroutable_randomness_falls_back_to_the_sequential_result(caplog):
    raw = raw_cfg()
    with caplog.at_level(logging.INFO, logger="fedshield"):
        auto = simulator(raw, "auto", FunctionalDropoutNet)
        ups = last_round(auto)
    assert auto._vectorized is None
    (line,) = [r.getMessage() for r in caplog.records if "one by one" in r.getMessage()]
    assert "outside nn.Dropout" in line and "model.name='mlp'" in line
    seq = last_round(simulator(raw, False, FunctionalDropoutNet))
    assert all(torch.equal(u.delta, v.delta) for u, v in zip(seq, ups))


def test_auto_keeps_large_cpu_steps_sequential(caplog):
    """On CPU, "auto" batches only small client steps (bench_vectorized: large ones gain
    nothing); the decision reads FLOP counts, so it is the same on every run."""
    raw = raw_cfg(model={"params": {"hidden": 40_000}})  # ≈ 5 MFLOP per sample × 16
    if DEVICE != "cpu":
        pytest.skip("the FLOP rule is CPU-only")
    with caplog.at_level(logging.INFO, logger="fedshield"):
        sim = simulator(raw, "auto")
        assert sim._batched_trainer(sim.begin_round(1)) is None
    (line,) = [r.getMessage() for r in caplog.records if "one by one" in r.getMessage()]
    assert "MFLOP" in line and "run.vectorize=true" in line
    forced = simulator(raw, True)
    assert forced._batched_trainer(forced.begin_round(1)) is not None


def test_dp_sgd_clients_train_one_by_one(caplog):
    raw = raw_cfg(privacy={"local": {"clip": 1.0, "noise_multiplier": 1.0}})
    with caplog.at_level(logging.INFO, logger="fedshield"):
        sim = simulator(raw, "auto")
        assert sim._batched_trainer(sim.begin_round(1)) is None
    (line,) = [r.getMessage() for r in caplog.records if "one by one" in r.getMessage()]
    assert "privacy.local" in line


def test_vectorize_true_is_a_config_error_when_impossible():
    raw = multi_exit_cfg()
    raw["run"]["vectorize"] = True
    with pytest.raises(ConfigError, match=r"run\.vectorize=true.*client\.algorithm='multi_exit'"):
        build(config.validate(raw))
    exp = build(config.validate(raw_cfg()))
    exp.model = FunctionalDropoutNet().to(exp.device)
    with pytest.raises(ConfigError, match=r"run\.vectorize=true.*model\.name='mlp'"):
        require_vectorizable(exp)


def test_vectorize_rejects_non_boolean_values():
    with pytest.raises(ConfigError, match="run.vectorize"):
        config.validate(raw_cfg(run={"vectorize": "yes"}))
    with pytest.raises(ConfigError, match="run.vectorize_chunk"):
        config.validate(raw_cfg(run={"vectorize_chunk": 0}))


def test_a_loss_op_without_a_batching_rule_runs_batched_without_a_notice():
    """TRADES' kl_div has no vmap batching rule: functorch runs it per client (same values)
    and would print its "performance drop" notice, which a user cannot act on."""
    import warnings

    raw = raw_cfg(client={"algorithm": "fedtrades"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulator(raw, True).run_round(1)
    assert not [w for w in caught if "performance drop" in str(w.message)]
