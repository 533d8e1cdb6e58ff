"""fedshield.adversarial: invariants, parity with torchattacks, side-effect freedom (FedCART
paper)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from fedshield.adversarial import (
    EVAL_ATTACKS,
    MissingDependencyError,
    cw_linf,
    cw_margin,
    fgsm,
    pgd,
    robust_accuracy,
    robust_correct,
    trades_pgd,
)
from fedshield.errors import ConfigError

torchattacks = pytest.importorskip("torchattacks")

EPS = 8 / 255


def small_cnn(seed: int = 0) -> nn.Module:
    """Conv + BatchNorm + Dropout, so train/eval mode actually changes the output."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(8 * 4 * 4, 10),
    )  # fmt: skip


def batch(seed: int = 0, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 8, 8, generator=g)
    x[0].zero_()  # pixels on both edges of [0, 1] exercise the range clamp
    x[1].fill_(1.0)
    return x, torch.randint(0, 10, (n,), generator=g)


ATTACKS = {
    "fgsm": lambda m, x, y, eps, g: fgsm(m, x, y, eps),
    "pgd": lambda m, x, y, eps, g: pgd(m, x, y, eps, eps / 4, 5, generator=g),
    "pgd_large_step": lambda m, x, y, eps, g: pgd(m, x, y, eps, 3 * eps, 3, generator=g),
    "cw": lambda m, x, y, eps, g: cw_linf(m, x, y, eps, steps=5, generator=g),
    "trades": lambda m, x, y, eps, g: trades_pgd(m, x, eps, eps / 4, 5, generator=g),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.0, 1e-4, EPS, 0.3])
def test_stays_in_eps_ball_and_range(name: str, seed: int, eps: float) -> None:
    model = small_cnn(seed).eval()
    x, y = batch(seed)
    adv = ATTACKS[name](model, x, y, eps, torch.Generator().manual_seed(seed))
    assert adv.shape == x.shape and not adv.requires_grad
    assert (adv - x).abs().max() <= eps + 1e-6
    assert adv.min() >= 0.0 and adv.max() <= 1.0


def test_fgsm_equals_torchattacks() -> None:
    model = small_cnn().eval()
    x, y = batch()
    ours = fgsm(model, x, y, EPS)
    theirs = torchattacks.FGSM(model, eps=EPS)(x, y)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("eps,alpha,steps", [(EPS, 2 / 255, 10), (0.03, 0.01, 3)])
def test_pgd_without_random_start_equals_torchattacks(eps: float, alpha: float, steps: int) -> None:
    model = small_cnn().eval()
    x, y = batch()
    ours = pgd(model, x, y, eps, alpha, steps, random_start=False)
    theirs = torchattacks.PGD(model, eps=eps, alpha=alpha, steps=steps, random_start=False)(x, y)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, x)  # the attack did move


def test_pgd_attack_lowers_accuracy_more_than_fgsm_on_trained_model() -> None:
    # A linear model fitted to separable data is correct on clean inputs; the attacks must
    # break it, and the iterative one at least as much as the single step.
    torch.manual_seed(0)
    x = torch.rand(256, 3, 8, 8)
    w_true = torch.randn(10, 3 * 8 * 8)
    y = (x.flatten(1) @ w_true.T).argmax(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    clean = robust_accuracy(model, x, y, None)
    acc_fgsm = robust_accuracy(model, x, y, EVAL_ATTACKS.build("fgsm", eps=0.05))
    acc_pgd = robust_accuracy(model, x, y, EVAL_ATTACKS.build("pgd", eps=0.05, steps=10))
    assert clean > 0.9
    assert acc_pgd <= acc_fgsm < clean


def test_cw_loss_reduces_margin() -> None:
    model = small_cnn().eval()
    x, y = batch(n=32)
    with torch.no_grad():
        clean = cw_margin(model(x), y)
    adv = pgd(model, x, y, EPS, EPS / 4, 10, loss="cw", generator=torch.Generator())
    with torch.no_grad():
        attacked = cw_margin(model(adv), y)
    assert attacked.mean() < clean.mean()
    assert (attacked < clean).float().mean() >= 0.9


def test_callable_loss_is_maximised() -> None:
    model = small_cnn().eval()
    x, y = batch()

    def logit_of_class_3(logits: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
        return logits[:, 3]  # per-sample values are summed

    adv = pgd(model, x, y, EPS, EPS / 4, 5, loss=logit_of_class_3, random_start=False)
    with torch.no_grad():
        assert (model(adv)[:, 3] > model(x)[:, 3]).all()


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("train", [True, False])
def test_no_side_effects_on_model(name: str, train: bool) -> None:
    model = small_cnn().train(train)
    x, y = batch()
    ATTACKS[name](model, x, y, EPS, torch.Generator().manual_seed(0))
    assert all(p.grad is None for p in model.parameters())
    assert all(m.training == train for m in model.modules())


def test_existing_parameter_grads_untouched() -> None:
    # Inside a training step the optimiser's accumulated gradients must survive the attack.
    model = small_cnn().train()
    x, y = batch()
    F.cross_entropy(model(x), y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    pgd(model, x, y, EPS, EPS / 4, 3, generator=torch.Generator())
    trades_pgd(model, x, EPS, EPS / 4, 3, generator=torch.Generator())
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))


def test_works_under_no_grad() -> None:
    model = small_cnn().eval()
    x, y = batch()
    with torch.no_grad():
        adv = pgd(model, x, y, EPS, EPS / 4, 2, random_start=False)
    assert not torch.equal(adv, x)


@pytest.mark.parametrize("name", ["pgd", "cw", "trades"])
def test_generator_determinism(name: str) -> None:
    model = small_cnn().eval()
    x, y = batch()
    run = ATTACKS[name]
    state = torch.get_rng_state()
    a = run(model, x, y, EPS, torch.Generator().manual_seed(7))
    b = run(model, x, y, EPS, torch.Generator().manual_seed(7))
    c = run(model, x, y, EPS, torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG was not consumed


def test_trades_increases_kl() -> None:
    model = small_cnn().eval()
    x, _ = batch()
    adv = trades_pgd(model, x, EPS, EPS / 4, 10, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = F.softmax(model(x), dim=1)
        kl = F.kl_div(F.log_softmax(model(adv), dim=1), p, reduction="sum")
    assert kl > 1e-3


def test_robust_accuracy_batches_and_natural() -> None:
    model = small_cnn().eval()
    x, y = batch(n=37)
    with torch.no_grad():
        natural = (model(x).argmax(1) == y).float().mean().item()
    assert robust_accuracy(model, x, y, None, batch_size=5) == pytest.approx(natural)
    fgsm_attack = EVAL_ATTACKS.build("fgsm", eps=EPS)
    one = robust_correct(model, x, y, fgsm_attack, batch_size=64)
    many = robust_correct(model, x, y, fgsm_attack, batch_size=5)
    assert one.dtype == torch.bool and one.shape == (37,)
    assert torch.equal(one, many)
    assert robust_accuracy(model, x, y, EVAL_ATTACKS.build("fgsm", eps=0.0)) == pytest.approx(
        natural
    )


def test_eval_attack_registry() -> None:
    assert {"fgsm", "pgd", "cw", "autoattack"} <= set(EVAL_ATTACKS.names())
    pgd20 = EVAL_ATTACKS.build("pgd", eps=EPS)
    assert (pgd20.steps, pgd20.random_start) == (20, True)  # FedCART paper PGD-20
    cw = EVAL_ATTACKS.build("cw", eps=EPS)
    assert (cw.steps, cw.kappa) == (30, 50.0)  # FedCART paper CW∞
    model = small_cnn().eval()
    x, y = batch()
    # Same seed, same adversarial batch: evaluation is reproducible.
    a = EVAL_ATTACKS.build("pgd", eps=EPS, steps=2, seed=3)(model, x, y)
    b = EVAL_ATTACKS.build("pgd", eps=EPS, steps=2, seed=3)(model, x, y)
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="eps"):
        EVAL_ATTACKS.build("pgd", eps=-1.0)
    with pytest.raises(ConfigError, match="loss"):
        pgd(model, x, y, EPS, EPS, 1, loss="hinge")


def test_autoattack_adapter_runs_and_keeps_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)).train()
    x, y = torch.rand(6, 3, 8, 8), torch.randint(0, 4, (6,))
    attack = EVAL_ATTACKS.build("autoattack", eps=1 / 255)
    adv = attack(model, x, y)
    assert (adv - x).abs().max() <= 1 / 255 + 1e-6
    assert model.training
    # torchattacks calls loss.backward(); the adapter must keep that off the parameters.
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


def test_autoattack_apgd_version_is_torchattacks_apgd_ce_then_apgd_t() -> None:
    """version 'apgd' = torchattacks' APGD-CE, then APGD-T on the points it left correct,
    with the given steps: the same adversarial batch as building them by hand."""
    import torchattacks

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5)).eval()
    x, y = torch.rand(8, 3, 8, 8), torch.randint(0, 5, (8,))
    eps = 8 / 255
    ours = EVAL_ATTACKS.build("autoattack", eps=eps, version="apgd", steps=5, seed=2)(model, x, y)
    ref = torchattacks.MultiAttack([
        torchattacks.APGD(model, eps=eps, steps=5, seed=2, loss="ce", n_restarts=1),
        torchattacks.APGDT(model, eps=eps, steps=5, seed=2, n_classes=5, n_restarts=1),
    ])(x, y)  # fmt: skip
    torch.testing.assert_close(ours, ref)
    assert (ours - x).abs().max() <= eps + 1e-6
    assert (model(ours).argmax(1) == y).sum() <= (model(x).argmax(1) == y).sum()


def test_autoattack_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchattacks", None)  # makes `import` raise ImportError
    with pytest.raises(MissingDependencyError, match="pip install torchattacks"):
        EVAL_ATTACKS.build("autoattack")


def test_cw_eval_attack_equals_cw_linf() -> None:
    model = small_cnn().eval()
    x, y = batch()
    built = EVAL_ATTACKS.build("cw", eps=EPS, steps=4, seed=5)(model, x, y)
    direct = cw_linf(model, x, y, EPS, steps=4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(built, direct)


def test_autoattack_needs_four_classes() -> None:
    # torchattacks' APGD-T reads the 4th largest logit: fewer classes used to end in an
    # IndexError at the last round's evaluation.
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
    x = torch.rand(2, 3, 2, 2)
    with pytest.raises(ConfigError, match="'autoattack' needs >= 4 classes.*the model has 3"):
        EVAL_ATTACKS.build("autoattack")(model, x, model(x).argmax(1))
    with pytest.raises(ConfigError, match=r"^eval.params.n_classes: Input should be greater than"):
        EVAL_ATTACKS.parse("autoattack", {"n_classes": 3}, "eval.params")


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("pgd", {"stpes": 3}, r"^e.pgd.stpes: unknown key \(did you mean 'steps'\?"),
        ("pgd", {"eps": 2.0}, r"^e.pgd.eps: Input should be less than or equal to 1"),
        ("pgd", {"steps": 2.0}, r"^e.pgd.steps: Input should be a valid integer"),
        ("cw", {"kappa": -1.0}, r"^e.cw.kappa: Input should be greater than or equal to 0"),
        ("fgsm", {"clamp": [1.0, 0.0]}, r"^e.fgsm.clamp: low must be < high"),
        ("autoattack", {"eps": 2.0}, r"^e.autoattack.eps: must be <= 1 for norm = 'Linf'"),
        ("autoattack", {"version": "std"}, r"^e.autoattack.version: Input should be 'standard'"),
    ],
)
def test_eval_attack_params_are_validated(name: str, params: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EVAL_ATTACKS.build(name, where=f"e.{name}", **params)
    with pytest.raises(ValidationError):  # direct construction is checked as strictly
        EVAL_ATTACKS.get(name)(**params)


def test_eval_attack_accepts_a_toml_array_clamp_and_an_l2_budget() -> None:
    assert EVAL_ATTACKS.build("fgsm", clamp=[-1, 1]).clamp == (-1.0, 1.0)
    assert EVAL_ATTACKS.build("autoattack", norm="L2", eps=1.5).eps == 1.5
