"""FedCART through the simulator, the AT baselines, robust evaluators and presets
(FedCART paper; presets and outputs: docs/usage.md)."""

from __future__ import annotations

import json

import pytest
import torch

from fedshield import config
from fedshield.adversarial import MissingDependencyError
from fedshield.core.context import derive_seed
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.errors import ConfigError
from fedshield.eval import EVALUATORS, EvalInputs
from fedshield.eval.robust import class_groups, subset_indices
from fedshield.models import build_model
from fedshield.sim.builder import build, build_components
from fedshield.sim.engine import Simulator


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fedcart_cfg(**over) -> dict:
    """Seconds-long FedCART run: long-tailed digits, 3 clients, an MLP backbone."""
    raw = {
        "name": "fedcart-tiny",
        "seed": 0,
        "rounds": 2,
        "data": {
            "dataset": "digits",
            "num_clients": 3,
            "partition": "dirichlet",
            "beta": 0.5,
            "long_tail": {"rho": 10},
        },
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
        "client": {
            "algorithm": "fedcart",
            "lr": 0.1,
            "batch_size": 32,
            "local_steps": 3,
            "params": {"steps": 2},
        },
        "server": {
            "algorithm": "fedcart",
            "clients_per_round": 3,
            "params": {"match_iters": 10, "retrain_steps": 20, "num_virtual": 10},
        },
        "eval": {
            "every": 1,
            "metrics": ["robust"],
            "params": {
                "robust": {
                    "autoattack": False,
                    "max_samples": 40,
                    "cw_steps": 5,
                    "groups": True,
                    "majority_min": 60,
                    "minority_max": 20,
                }
            },
        },
        "checkpoint": {"every": 1},
        "run": {"progress": False},
    }
    for key, value in over.items():
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def run(raw: dict, out=None, resume: bool = False) -> dict:
    return Simulator(build(config.validate(raw)), out, resume=resume).run()


def test_fedcart_end_to_end_writes_robust_metrics(tmp_path):
    run(fedcart_cfg(), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    final = summary["final"]
    for key in (
        "robust/natural", "robust/fgsm", "robust/pgd20", "robust/cw", "robust/avg",
        "groups/majority/natural", "groups/minority/pgd20", "cart/match_end",
    ):  # fmt: skip
        assert key in final, key
    assert final["robust/aa_skipped"] == 1.0 and final["robust/n"] == 40
    avg = (final["robust/fgsm"] + final["robust/pgd20"] + final["robust/cw"]) / 3
    assert final["robust/avg"] == pytest.approx(avg)
    assert final["robust/pgd20"] <= final["robust/natural"] + 1e-9
    # The inference model (r + h') is what test_acc measures, on the whole test set.
    assert 0.0 <= final["test_acc"] <= 1.0


def test_fedcart_resume_replays_exactly(tmp_path):
    """Z_v and the prototypes live in the checkpointed server state."""
    cfg = fedcart_cfg(rounds=3, **{"eval.metrics": [], "eval.params": {}})
    run(cfg, tmp_path / "full")
    run(dict(cfg, rounds=2), tmp_path / "part")
    run(cfg, tmp_path / "part", resume=True)
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert full == (tmp_path / "part" / "metrics.jsonl").read_text()


def test_runs_with_the_robust_and_groups_evaluators_are_byte_identical(tmp_path):
    # Wall times go to timing.jsonl, so metrics.jsonl is a pure function of (config, seed).
    cfg = fedcart_cfg(rounds=1)
    run(cfg, tmp_path / "a")
    run(cfg, tmp_path / "b")
    a = (tmp_path / "a" / "metrics.jsonl").read_bytes()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert b"robust/pgd20" in a and b"groups/minority/natural" in a and b"wall" not in a


def test_fedcart_composes_with_a_byzantine_aggregator():
    summary = run(
        fedcart_cfg(
            rounds=1,
            **{"server.aggregator": "median", "eval.metrics": [], "eval.params": {}},
        )
    )
    assert "cart/match_end" in summary["final"]


@pytest.mark.parametrize(
    "algorithm", ["fedpgd", "fedfat", "fedtrades", "fedmart", "calfat", "fedtaet"]
)
def test_at_baselines_run_and_learn_something(algorithm):
    params = {"steps": 2} | ({"stabilize_rounds": 1} if algorithm == "fedtaet" else {})
    raw = fedcart_cfg(
        rounds=2,
        **{
            "client.algorithm": algorithm,
            # lr 0.05: CalFAT's logits are scaled by s = 10, and at 0.1 its tiny MLP
            # collapses to one class on this data.
            "client.lr": 0.05,
            "client.params": params,  # FedTAET: HARL in round 2
            "server.algorithm": "fedavg",
            "server.params": {},
            "eval.metrics": [],
            "eval.params": {},
        },
    )
    summary = run(raw)
    assert summary["final"]["train/loss"] > 0 and summary["final_test_acc"] > 0.1


def test_mart_plus_fedcart_runs():
    run(fedcart_cfg(rounds=1, **{"client.params": {"steps": 1, "at_loss": "mart"}}))


def test_taet_plus_fedcart_runs_both_stages():
    params = {"steps": 1, "at_loss": "taet", "stabilize_rounds": 1}
    over = {"client.params": params, "eval.metrics": [], "eval.params": {}}
    summary = run(fedcart_cfg(rounds=2, **over))
    assert summary["final"]["train/loss"] > 0 and "cart/match_steps" in summary["final"]


# -- evaluators ----------------------------------------------------------------------------


def test_class_groups_thresholds():
    counts = torch.tensor([400, 151, 150, 45, 44, 8])
    g = class_groups(counts, majority_min=150, minority_max=45)
    assert g["majority"].tolist() == [True, True, False, False, False, False]
    assert g["medium"].tolist() == [False, False, True, True, False, False]
    assert g["minority"].tolist() == [False, False, False, False, True, True]


def _inputs(num_classes: int = 3) -> tuple[torch.nn.Module, EvalInputs]:
    torch.manual_seed(0)
    shape = (1, 4, 4)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, *shape, generator=g)
    y = torch.arange(30) % num_classes
    train = TensorData(x, torch.tensor([0] * 20 + [1] * 8 + [2] * 2))
    names = tuple("abcd"[:num_classes])
    bundle = DataBundle("t", train, TensorData(x, y), num_classes, shape, names)
    model = build_model("mlp", shape, num_classes, hidden=8).eval()
    inputs = EvalInputs(bundle, [train], train, torch.device("cpu"), 16, 0, 1)
    return model, inputs


def test_groups_evaluator_matches_per_class_accuracy():
    model, inputs = _inputs()
    out = EVALUATORS.get("groups")(model, inputs, majority_min=10, minority_max=5)
    pred = model(inputs.bundle.test.x).argmax(1)
    y = inputs.bundle.test.y
    for name, cls in (("majority", 0), ("medium", 1), ("minority", 2)):
        assert out[f"groups/{name}/classes"] == 1.0
        expected = (pred[y == cls] == cls).float().mean().item()
        assert out[f"groups/{name}/natural"] == pytest.approx(expected)
        assert out[f"groups/{name}/pgd20"] <= out[f"groups/{name}/natural"] + 1e-9


def test_robust_evaluator_skips_autoattack_when_torchattacks_is_missing(monkeypatch):
    from fedshield.adversarial import EVAL_ATTACKS

    real = EVAL_ATTACKS.build

    def build_without_aa(name, /, **kw):
        if name == "autoattack":
            raise MissingDependencyError("needs the 'torchattacks' package")
        return real(name, **kw)

    monkeypatch.setattr(EVAL_ATTACKS, "build", build_without_aa)
    model, inputs = _inputs()
    out = EVALUATORS.get("robust")(model, inputs, cw_steps=3, pgd_steps=3)
    assert out["robust/aa_skipped"] == 1.0 and "robust/aa" not in out
    assert "robust/pgd3" in out and out["robust/eps"] == pytest.approx(0.1)


def test_robust_worst_case_is_per_sample_over_every_attack():
    """robust/worst counts a sample only if natural and every attack leave it correct: at
    most the smallest single accuracy, and equal to the AND of the per-sample results."""
    from fedshield.eval.robust import worst_case

    res = {
        "natural": torch.tensor([True, True, True, False]),
        "pgd": torch.tensor([True, False, True, False]),
        "cw": torch.tensor([True, True, False, False]),
        "aa": torch.tensor([True, True]),  # run on samples 0 and 2 only
    }
    no_aa = {k: v for k, v in res.items() if k != "aa"}
    assert worst_case(no_aa, torch.arange(4)).tolist() == [True, False, False, False]
    assert worst_case(res, torch.tensor([0, 2])).tolist() == [True, False]
    model, inputs = _inputs()
    out = EVALUATORS.get("robust")(
        model, inputs, cw_steps=3, pgd_steps=3, autoattack=False, groups=True,
        majority_min=10, minority_max=5,
    )  # fmt: skip
    single = min(out[f"robust/{k}"] for k in ("natural", "fgsm", "pgd3", "cw"))
    assert out["robust/worst"] <= single and out["robust/worst_n"] == 30
    assert "groups/minority/worst" in out


def test_robust_evaluator_runs_autoattack_at_the_last_round_only():
    """With eval.metrics_every the evaluator runs every k rounds; AutoAttack (the costly
    part) runs when the inputs say the round is the run's last (or 'every' asks for it)."""
    import dataclasses

    model, inputs = _inputs(num_classes=4)
    kw = {"cw_steps": 2, "pgd_steps": 2, "autoattack_version": "apgd", "autoattack_steps": 2}
    early = dataclasses.replace(inputs, round=5, rounds=20)
    assert not early.final and dataclasses.replace(inputs, round=20, rounds=20).final
    out = EVALUATORS.get("robust")(model, early, **kw)
    assert out["robust/aa_skipped"] == 1.0 and "robust/aa" not in out
    every = EVALUATORS.get("robust")(model, early, autoattack_rounds="every", **kw)
    last = EVALUATORS.get("robust")(model, dataclasses.replace(early, round=20), **kw)
    assert "robust/aa" in every and "robust/aa" in last
    assert last["robust/worst"] <= last["robust/aa"]


def test_robust_evaluator_bad_param_names_the_key():
    model, inputs = _inputs()
    with pytest.raises(ConfigError, match=r"eval\.params\.robust\.pgd_stpes: unknown key"):
        EVALUATORS.get("robust")(model, inputs, pgd_stpes=3)


@pytest.mark.parametrize("name", ["robust", "groups"])
def test_evaluator_schemas_refuse_typos_at_build_time_and_agree_with_the_call(name):
    """The declared schema refuses ``pgd_stpes`` before any training, with a did-you-mean;
    the evaluator parses its keyword arguments with that same schema."""
    from fedshield.eval.robust import GroupParams, RobustParams

    entry = EVALUATORS.entry(name)
    assert entry.declared and entry.schema is {"robust": RobustParams, "groups": GroupParams}[name]
    where = f"eval.params.{name}"
    with pytest.raises(
        ConfigError, match=rf"{where}\.pgd_stpes: unknown key \(did you mean 'pgd_steps'"
    ):
        EVALUATORS.parse(name, {"pgd_stpes": 3}, where)
    with pytest.raises(ConfigError, match="pgd_steps"):
        EVALUATORS.parse(name, {"pgd_steps": "3"}, where)  # strict: no str → int
    raw = {"pgd_steps": 3, "max_samples": 12}
    if name == "robust":
        raw |= {"autoattack": False, "cw_steps": 2}
    parsed = EVALUATORS.parse(name, raw, where)
    model, inputs = _inputs()
    out = entry.obj(model, inputs, **parsed.kwargs())  # what Registry.build would call
    out.pop("robust/wall_s", None)
    again = entry.obj(model, inputs, **raw)
    again.pop("robust/wall_s", None)
    assert out == again
    for field, info in entry.schema.model_fields.items():
        assert info.description and info.description.endswith("."), field


# -- presets -------------------------------------------------------------------------------

FULL = ["fedcart-cifar10lt", "fedcart-cifar100lt", "fedcart-svhnlt", "fedcart-fmnistlt"]


@pytest.mark.parametrize("name", FULL)
def test_paper_presets_follow_seed_003(name):
    cfg = config.load(preset=name)
    assert (cfg.rounds, cfg.data.num_clients, cfg.server.clients_per_round) == (150, 5, 5)
    assert (cfg.data.long_tail.rho, cfg.data.beta, cfg.client.local_epochs) == (50, 0.5, 1)
    assert cfg.client.params["steps"] == 10 and cfg.model.name == "dual_head"
    backbone = cfg.model.params["backbone"]
    assert backbone == ("resnet18" if "cifar" in name else backbone)
    twin = config.load(preset=f"{name}-cpu")
    assert twin.data.dataset in ("mnist5k", "digits", "synthetic") and twin.rounds <= 60


@pytest.mark.parametrize("name", FULL)
def test_baselines_and_ablations_are_overrides_of_the_preset(name):
    for overrides in (
        ["client.algorithm=calfat", "server.algorithm=fedavg"],
        ["client.params.align=false", "server.params.cart=false"],
        ["server.params.aux_head=false", "server.aggregator=krum"],
    ):
        build_components(config.load(preset=name, overrides=overrides))


GRIDS = {
    "fedcart-methods-cpu": {"fedcart", "calfat"},
    "fedcart-plugins-cpu": {"trades_fedcart", "mart_fedcart", "taet_fedcart"},
    "fedcart-baselines-cpu": {"fedpgd", "fedtrades", "fedmart", "fedfat", "fedtaet"},
    "fedcart-ablations-cpu": {"no_at", "no_nat", "no_align", "no_cart", "no_aux"},
    # FedCART paper, Fig. 5: the endpoints (rho = 50 is the methods grid)
    "fedcart-rho-cpu": {f"{m}_rho={r}" for m in ("fedcart", "calfat") for r in (5, 100)},
}


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_fedcart_grids_expand_to_valid_runs(grid):
    from fedshield.sweep import expand, read_grid

    spec, where = read_grid(grid=grid)
    _, runs = expand(spec, where)
    for r in runs:
        build_components(config.validate(r.raw))
    assert {r.name for r in runs} == GRIDS[grid]
    for r in runs:  # robust accuracy on the whole test split, AutoAttack's APGD included
        robust = config.validate(r.raw).eval.params["robust"]
        assert "max_samples" not in robust and robust["autoattack"] is True


def test_autoattack_subset_and_robust_avg(monkeypatch):
    """AutoAttack may run on a random k of the evaluated samples; Robust AVG averages FGSM, CW,
    PGD and AA, each on its own samples. (A stand-in attack keeps this test fast: the real
    adapter is tested in test_adversarial.py.)"""
    from fedshield.adversarial import EVAL_ATTACKS

    real = EVAL_ATTACKS.build

    def identity_aa(name, /, **kw):
        return (lambda model, x, y: x) if name == "autoattack" else real(name, **kw)

    monkeypatch.setattr(EVAL_ATTACKS, "build", identity_aa)
    model, inputs = _inputs()
    out = EVALUATORS.get("robust")(model, inputs, autoattack_max_samples=7, cw_steps=3)
    assert out["robust/aa_n"] == 7 and "robust/aa_skipped" not in out
    idx = subset_indices(30, 7, derive_seed(0, 0xAA))
    assert not torch.equal(idx, torch.arange(7))  # a random subset, not the first rows
    x, y = inputs.bundle.test.x[idx], inputs.bundle.test.y[idx]
    assert out["robust/aa"] == pytest.approx((model(x).argmax(1) == y).float().mean())
    keys = ("robust/fgsm", "robust/cw", "robust/pgd20", "robust/aa")
    assert out["robust/avg"] == pytest.approx(sum(out[k] for k in keys) / 4)
