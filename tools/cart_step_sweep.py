"""The CART-step sweep behind FedCART's server defaults (docs/results/cart_step.md).

A FedCART run is trained to a checkpoint after round R − 1; this tool replays round R's
client training once and then applies the server's CART step (gradient matching, eq. 9,
and h' re-training, eq. 10) with different caps, tolerances, optimisers and step sizes to
the same aggregated state, evaluating r + h' after each (natural accuracy on the whole
test set, PGD-20 on the seeded 500-sample subset the ``robust`` evaluator uses, and both
on the Minority classes). An oracle row re-trains h' on real features (``--real-per-class``
training images per class taken from the balanced training set before the long tail is
applied: data the federation does not have) as an upper bound.

    fedshield run --preset fedcart-fmnistlt-cpu --set rounds=9 --set checkpoint.every=1 \\
        --set eval.metrics=[] --set eval.params={} --quiet --out runs/cart-ckpt9
    python tools/cart_step_sweep.py measure runs/cart-ckpt9 --out docs/results/cart_step.json
    python tools/cart_step_sweep.py render docs/results/cart_step.json \\
        --runs old=runs/cart-e2e-old new=runs/cart-e2e-new > docs/results/cart_step.md

``measure`` writes one JSON record per variant (its server parameters, the logged
``cart/*`` losses and step counts, wall time and accuracies); ``render`` turns that file
(and the ``summary.json`` of end-to-end runs) into the Markdown page.
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from fedshield import config
from fedshield.adversarial import EVAL_ATTACKS, robust_correct
from fedshield.algorithms.server.fedcart import FedCARTServer, retrain_linear
from fedshield.core.flat import set_buffers, set_params
from fedshield.core.params import parse_params
from fedshield.eval.robust import class_groups, subset_indices
from fedshield.sim.builder import build
from fedshield.sim.checkpoint import load_checkpoint
from fedshield.sim.engine import RunState, Simulator

#: CReFF's counts and step sizes: the defaults before this sweep.
OLD = {
    "match_iters": 100,
    "match_optimizer": "sgd",
    "match_lr": 0.1,
    "match_window": 0,
    "match_tol": 0.0,
    "retrain_steps": 300,
    "retrain_lr": 0.01,
    "retrain_window": 0,
    "retrain_tol": 0.0,
}


def variants() -> list[tuple[str, str, dict[str, Any]]]:
    """(group, label, server.params overrides on top of OLD) of every measured CART step."""
    out: list[tuple[str, str, dict[str, Any]]] = [("baseline", "CReFF defaults", {})]
    # 1. Matching alone (re-training fixed at CReFF's T_R = 300, lr 0.01).
    for opt, lr in (("sgd", 0.1), ("sgd", 1.0), ("sgd", 10.0), ("adam", 0.01), ("adam", 0.1)):
        for cap in (100, 300, 1000, 3000):
            if (opt, lr, cap) == ("sgd", 0.1, 100):
                continue
            out.append(
                (
                    "match",
                    f"{opt} lr {lr:g}, T_V = {cap}",
                    {"match_optimizer": opt, "match_lr": lr, "match_iters": cap},
                )
            )
    # 2. Re-training after converged matching (Adam 0.1, 3000 steps).
    conv = {"match_optimizer": "adam", "match_lr": 0.1, "match_iters": 3000}
    for lr in (0.01, 0.1, 1.0):
        for cap in (300, 1000, 3000, 10000):
            out.append(
                (
                    "retrain",
                    f"lr {lr:g}, T_R = {cap}",
                    {**conv, "retrain_lr": lr, "retrain_steps": cap},
                )
            )
    # 3. Plateau rules (window, tolerance) with generous caps.
    for mw, mt in ((20, 1e-2), (50, 1e-2), (50, 1e-3), (100, 1e-3), (100, 1e-4)):
        out.append(
            (
                "match_rule",
                f"window {mw}, tol {mt:g}",
                {**conv, "match_window": mw, "match_tol": mt, "retrain_lr": 0.1,
                 "retrain_steps": 3000},
            )
        )  # fmt: skip
    for rw, rt in ((1, 1e-2), (2, 1e-2), (3, 1e-3), (5, 1e-3), (5, 1e-4)):
        out.append(
            (
                "retrain_rule",
                f"window {rw} passes, tol {rt:g}",
                {**conv, "retrain_lr": 0.1, "retrain_steps": 10000, "retrain_window": rw,
                 "retrain_tol": rt},
            )
        )  # fmt: skip
    return out


class Evaluator:
    """Accuracy of r + h' as the ``robust`` evaluator measures it: natural accuracy on the
    whole test set (``natural``, = test_acc) and, on its seeded 500-sample subset with its
    batch size (256, so the PGD random starts are the same), natural (``natural500``) and
    PGD-20 accuracy; both also on the Minority classes."""

    def __init__(self, sim: Simulator, pgd_samples: int = 500, batch_size: int = 256) -> None:
        cfg = sim.cfg
        self.sim = sim
        self.batch_size = batch_size
        test = sim.exp.bundle.test
        self.x, self.y = test.batch(torch.arange(len(test)), "cpu")
        idx = subset_indices(len(test), pgd_samples, cfg.seed)
        self.px, self.py = self.x[idx], self.y[idx]
        rob = cfg.eval.params.get("robust", {})
        counts = sim.exp.train.class_counts(sim.exp.bundle.num_classes).cpu()
        groups = class_groups(counts, rob.get("majority_min", 150), rob.get("minority_max", 45))
        self.minority = groups["minority"]
        self.eps = 0.1 if sim.exp.bundle.input_shape[0] == 1 else 8 / 255

    def _load(self, params: torch.Tensor, buffers: torch.Tensor) -> torch.nn.Module:
        model = self.sim.model
        set_params(model, params)
        set_buffers(model, buffers)
        return model.eval()

    def natural(self, params: torch.Tensor, buffers: torch.Tensor) -> float:
        model = self._load(params, buffers)
        return float(robust_correct(model, self.x, self.y, None, batch_size=1000).float().mean())

    def __call__(self, params: torch.Tensor, buffers: torch.Tensor) -> dict[str, float]:
        model = self._load(params, buffers)
        nat = robust_correct(model, self.x, self.y, None, batch_size=1000)
        nat500 = robust_correct(model, self.px, self.py, None, batch_size=self.batch_size)
        attack = EVAL_ATTACKS.build("pgd", eps=self.eps, steps=20, seed=self.sim.cfg.seed)
        rob = robust_correct(model, self.px, self.py, attack, batch_size=self.batch_size)
        m, pm = self.minority[self.y], self.minority[self.py]
        return {
            "natural": float(nat.float().mean()),
            "natural500": float(nat500.float().mean()),
            "pgd20": float(rob.float().mean()),
            "minority_natural": float(nat[m].float().mean()),
            "minority_pgd20": float(rob[pm].float().mean()),
        }


def replay_round(ckpt_dir: Path) -> tuple[Simulator, Any, Any]:
    """The simulator at the checkpoint and round R's (context, aggregated step) before the
    CART step: client training and aggregation run once, as the engine runs them."""
    ck = load_checkpoint(ckpt_dir / "checkpoint.pt")
    raw = tomllib.loads(ck["config"])
    rnd = int(ck["state"]["round"])
    raw["rounds"] = rnd
    sim = Simulator(build(config.validate(raw)))
    sim.state = RunState.from_dict(ck["state"], sim.device)
    plan = sim.begin_round(rnd)
    updates = sim.train_cohort(plan)
    server = sim.comp.server
    st = sim.state
    step = server.update(st.params, st.buffers, st.server_state, updates, plan.ctx, sim)
    return sim, plan.ctx, step


def real_feature_oracle(
    sim: Simulator, step: Any, per_class: int, lr: float, steps: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """h' re-trained on r's features of ``per_class`` real images per class."""
    model, bundle = sim.model, sim.exp.bundle
    set_params(model, step.params)
    set_buffers(model, step.buffers)
    model.eval()
    g = torch.Generator().manual_seed(sim.cfg.seed)
    idx = []
    for c in range(bundle.num_classes):
        rows = torch.nonzero(bundle.train.y == c).flatten()
        idx.append(rows[torch.randperm(len(rows), generator=g)[:per_class]])
    x, y = bundle.train.batch(torch.cat(idx), "cpu")
    with torch.no_grad():
        z = model.forward_features(x)
    c, d = (int(v) for v in step.state["head_shape"].tolist())
    p = c * d + c
    head = step.params[-p:]
    fit = retrain_linear(
        head[: c * d].view(c, d), head[c * d :], z, y, steps=steps, lr=lr, batch_size=32,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    params = step.params.clone()
    params[-p:] = torch.cat([fit.weight.flatten(), fit.bias])
    return params, {"retrain_loss": fit.loss, "retrain_steps": float(fit.steps)}


def measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    sim, ctx, step = replay_round(Path(args.ckpt))
    server = sim.comp.server
    ev = Evaluator(sim)
    records: list[dict[str, Any]] = []
    before = ev(step.params, step.buffers)  # h' as received: no CART step this round
    records.append({"group": "none", "label": "no CART step this round", **before})
    for group, label, over in variants():
        params = {**OLD, **over}
        srv = FedCARTServer(
            server.aggregator,
            lr=server.lr,
            weighting=server.weighting,
            params=parse_params(type(server.params), params, "server.params"),
        )
        t0 = time.perf_counter()
        out = srv.post_step(step, ctx, sim)
        wall = time.perf_counter() - t0
        m = {k.removeprefix("cart/"): v for k, v in out.metrics.items() if k.startswith("cart/")}
        acc = ev(out.params, out.buffers)
        records.append({"group": group, "label": label, "params": params, "wall_s": wall,
                        **m, **acc})  # fmt: skip
        print(f"{group:12s} {label:34s} match {m['match_start']:.1f}->{m['match_end']:.2f} "
              f"({m['match_steps']:.0f}) retrain {m['retrain_loss']:.3f} "
              f"({m['retrain_steps']:.0f}) nat {acc['natural']:.3f} pgd {acc['pgd20']:.3f} "
              f"[{wall:.2f}s]", flush=True)  # fmt: skip
    for lr, steps in ((0.01, 300), (0.1, 3000)):
        params, fit = real_feature_oracle(sim, step, args.real_per_class, lr, steps)
        acc = ev(params, step.buffers)
        label = f"real features, {args.real_per_class}/class, lr {lr:g}, {steps} steps"
        records.append({"group": "oracle", "label": label, **fit, **acc})
        print(f"oracle       {label:34s} nat {acc['natural']:.3f} pgd {acc['pgd20']:.3f}")
    meta = {
        "checkpoint": str(args.ckpt),
        "round": ctx.round,
        "preset": sim.cfg.name,
        "num_classes": sim.exp.bundle.num_classes,
        "train_counts": sim.exp.train.class_counts(sim.exp.bundle.num_classes).tolist(),
    }
    Path(args.out).write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


# -- whole-run replay ----------------------------------------------------------------------
#
# (r, h) never depend on the CART step: clients train them and leave h' untouched, and the
# prototypes' inputs — r's features of x and of x' (PGD against r + h) at the received
# model — do not involve h' either. So one FedCART run, recorded once (the aggregated
# parameters of every round and every client's prototype features), lets any CART-step
# variant be replayed over the whole run exactly, at the cost of the server step alone.


def record(args: argparse.Namespace) -> None:
    """Run a FedCART config once, keeping what a replay needs (see above)."""
    import fedshield.algorithms.client.fedcart as client_mod

    raw = config.apply_overrides(config.read_preset(args.preset), args.set or [])
    cfg = config.validate(raw)
    torch.set_num_threads(cfg.run.threads or 1)
    sim = Simulator(build(cfg))
    server, client = sim.comp.server, sim.comp.client
    rounds: list[dict[str, Any]] = []
    features: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    current: list[tuple[int, int]] = []

    real_sums = client_mod.class_gradient_sums
    real_finish = client.finish
    real_post = server.post_step

    def sums(z: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor, c: int):  # noqa: ANN202
        features.setdefault(current[-1], []).append((z.detach().cpu(), y.detach().cpu()))
        return real_sums(z, w, b, y, c)

    def finish(model, update, payload, data, ctx, state):  # noqa: ANN001, ANN202
        current.append((ctx.round, ctx.client_id))
        return real_finish(model, update, payload, data, ctx, state)

    def post_step(step, ctx, services):  # noqa: ANN001, ANN202
        rounds.append({"round": ctx.round, "params": step.params.cpu().clone(),
                       "buffers": step.buffers.cpu().clone()})  # fmt: skip
        return real_post(step, ctx, services)

    client_mod.class_gradient_sums = sums  # type: ignore[assignment]
    client.finish = finish  # type: ignore[method-assign]
    server.post_step = post_step  # type: ignore[method-assign]
    t0 = time.perf_counter()
    summary = sim.run()
    client_mod.class_gradient_sums = real_sums
    feats = {
        f"{r}/{k}": (torch.cat([z for z, _ in v]), torch.cat([y for _, y in v]))
        for (r, k), v in features.items()
    }
    torch.save(
        {"config": config.dump(cfg), "initial": sim.initial, "rounds": rounds, "features": feats,
         "summary": summary, "wall_s": time.perf_counter() - t0},
        args.out,
    )  # fmt: skip
    print(f"recorded {len(rounds)} rounds of {cfg.name} in {time.perf_counter() - t0:.0f} s")


def _prototypes(
    z: torch.Tensor, y: torch.Tensor, head: torch.Tensor, c: int, d: int, views: int, mean: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """What FedCARTClient.prototypes returns, from its recorded features."""
    from fedshield.losses import class_gradient_sums

    s, k = class_gradient_sums(z, head[: c * d].view(c, d), head[c * d :], y, c)
    counts = k / views  # every sample was seen once per view
    return s / (counts * (views if mean else 1)).clamp_min(1.0)[:, None], counts


def replay_run(
    traj: dict[str, Any], over: dict[str, Any], eval_rounds: tuple[int, ...], ev: Evaluator
) -> dict[str, Any]:
    """One CART-step variant over the recorded run; accuracies at ``eval_rounds`` and the
    robust metrics at the last round."""
    from fedshield.algorithms.client.fedcart import COUNTS, HEAD_SHAPE, PROTOTYPES
    from fedshield.core.context import ClientUpdate, RoundContext

    sim = ev.sim
    base = sim.comp.server
    params = {**OLD, **over}
    srv = FedCARTServer(
        base.aggregator, lr=base.lr, weighting=base.weighting,
        params=parse_params(type(base.params), params, "server.params"),
    )  # fmt: skip
    cp = sim.comp.client.params
    steps = cp.steps if cp.proto_steps is None else cp.proto_steps  # type: ignore[attr-defined]
    views, mean = (2 if steps > 0 else 1), cp.proto_views == "mean"  # type: ignore[attr-defined]
    theta, buffers = traj["initial"]
    state = srv.init_state(theta)
    c = sim.exp.bundle.num_classes
    d = sim.model.num_features  # type: ignore[attr-defined]
    p = c * d + c
    out: dict[str, Any] = {"curve": {}, "cart": []}
    seed, k_all = sim.cfg.seed, sim.cfg.data.num_clients
    t0 = time.perf_counter()
    for rec in traj["rounds"]:
        rnd = rec["round"]
        ctx = RoundContext(rnd, tuple(range(k_all)), (), seed, k_all, torch.device("cpu"))
        target = rec["params"].clone()
        target[-p:] = theta[-p:]  # clients never train h': the aggregate keeps the received h'
        ups = []
        for k in range(k_all):
            z, y = traj["features"][f"{rnd}/{k}"]
            protos, counts = _prototypes(z, y, theta[-p:], c, d, views, mean)
            u = ClientUpdate(k, target - theta, int(counts.sum()), rec["buffers"])
            u.extras = {PROTOTYPES: protos, COUNTS: counts,
                        HEAD_SHAPE: torch.tensor([float(c), float(d)])}  # fmt: skip
            ups.append(u)
        step = srv.update(theta, buffers, state, ups, ctx, sim)
        step = srv.post_step(step, ctx, sim)
        theta, buffers, state = step.params, step.buffers, step.state
        out["cart"].append({k.removeprefix("cart/"): v for k, v in step.metrics.items()
                            if k.startswith("cart/")})  # fmt: skip
        if rnd in eval_rounds:
            out["curve"][rnd] = ev.natural(theta, buffers)
    out["server_s"] = time.perf_counter() - t0
    out.update(ev(theta, buffers))
    return out


def run_variants() -> list[tuple[str, str, dict[str, Any]]]:
    """(group, label, server.params overrides on top of OLD) replayed over a whole run."""
    adam = {"match_optimizer": "adam", "match_lr": 0.1, "match_iters": 1000}
    rule = {"match_window": 50, "match_tol": 1e-3}
    out: list[tuple[str, str, dict[str, Any]]] = [("baseline", "CReFF defaults", {})]
    for label, m in (
        ("SGD lr 0.1, T_V 1000 + plateau", {"match_iters": 1000, **rule}),
        ("SGD lr 1, T_V 1000 + plateau", {"match_lr": 1.0, "match_iters": 1000, **rule}),
        ("Adam lr 0.01, T_V 1000 + plateau", {**adam, "match_lr": 0.01, **rule}),
        ("Adam lr 0.1, T_V 1000 + plateau", {**adam, **rule}),
        ("Adam lr 0.1, T_V 1000, no rule", adam),
        ("Adam lr 0.1, T_V 3000 + plateau", {**adam, "match_iters": 3000, **rule}),
    ):
        out.append(("run_match", label, m))
    conv = {**adam, **rule}
    for lr, cap, win, tol in (
        (0.01, 1000, 3, 1e-3), (0.1, 300, 0, 0.0), (0.1, 3000, 3, 1e-3), (1.0, 3000, 3, 1e-3),
    ):  # fmt: skip
        over = {**conv, "retrain_lr": lr, "retrain_steps": cap, "retrain_window": win,
                "retrain_tol": tol}  # fmt: skip
        label = f"lr {lr:g}, T_R {cap}" + (f", window {win}, tol {tol:g}" if win else "")
        out.append(("run_retrain", label, over))
    return out


def measure_run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    traj = torch.load(args.trajectory, weights_only=False)
    cfg = config.validate(tomllib.loads(traj["config"]))
    sim = Simulator(build(cfg))
    ev = Evaluator(sim)
    records = []
    eval_rounds = tuple(r for r in (5, 10, 15, 20, cfg.rounds) if r <= cfg.rounds)
    for group, label, over in run_variants():
        res = replay_run(traj, over, eval_rounds, ev)
        last = res["cart"][-1]
        records.append({"group": group, "label": label, "params": {**OLD, **over}, **res})
        print(f"{group:12s} {label:40s} nat {res['natural']:.3f} pgd {res['pgd20']:.3f} "
              f"min {res['minority_natural']:.3f}/{res['minority_pgd20']:.3f} "
              f"curve {[round(v, 3) for v in res['curve'].values()]} "
              f"last match {last['match_end']:.3f} ({last['match_steps']:.0f}) "
              f"retrain {last['retrain_loss']:.3f} ({last['retrain_steps']:.0f}) "
              f"[{res['server_s']:.0f}s]", flush=True)  # fmt: skip
    base = traj["summary"]["final"]
    meta = {"preset": cfg.name, "rounds": cfg.rounds, "seed": cfg.seed,
            "record_wall_s": traj["wall_s"],
            "recorded": {k: base[k] for k in ("robust/natural", "robust/pgd20", "test_acc")
                         if k in base}}  # fmt: skip
    Path(args.out).write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


# -- render --------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def _table(records: list[dict[str, Any]], extra: bool = True) -> str:
    head = "| variant | match loss (start → end) | match steps | re-train loss | re-train steps "
    head += "| natural | PGD-20 | Minority nat | Minority PGD |"
    if extra:
        head += " server s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        match = f"{r['match_start']:.1f} → {r['match_end']:.2f}" if "match_start" in r else "–"
        ms = f"{r['match_steps']:.0f}" if "match_steps" in r else "–"
        rl = f"{r['retrain_loss']:.3f}" if "retrain_loss" in r else "–"
        rs = f"{r['retrain_steps']:.0f}" if "retrain_steps" in r else "–"
        row = f"| {r['label']} | {match} | {ms} | {rl} | {rs} | {_pct(r['natural'])} | "
        row += f"{_pct(r['pgd20'])} | {_pct(r['minority_natural'])} | "
        row += f"{_pct(r['minority_pgd20'])} |"
        if extra:
            row += f" {r['wall_s']:.2f} |" if "wall_s" in r else " – |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _final(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    final = dict(summary["final"])
    final["wall_s"] = summary.get("wall_s_this_session", float("nan"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final["curve"] = [(r["round"], r["test_acc"]) for r in rows if "test_acc" in r]
    final["cart"] = [
        (r["round"], r.get("cart/match_start"), r.get("cart/match_end"), r.get("cart/match_steps"),
         r.get("cart/retrain_loss"), r.get("cart/retrain_steps"))
        for r in rows
    ]  # fmt: skip
    return final


def render(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.results).read_text())
    meta, records = data["meta"], data["records"]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_group.setdefault(r["group"], []).append(r)
    text = Path(args.template).read_text() if args.template else ""
    parts = {
        "META": f"round {meta['round']} of `{meta['preset']}` (checkpoint after round "
        f"{meta['round'] - 1}, replayed); training class counts {meta['train_counts']}",
        "TABLE_BASE": _table(by_group["none"] + by_group["baseline"] + by_group["oracle"]),
        "TABLE_MATCH": _table(by_group["baseline"] + by_group["match"]),
        "TABLE_RETRAIN": _table(by_group["retrain"]),
        "TABLE_MATCH_RULE": _table(by_group["match_rule"]),
        "TABLE_RETRAIN_RULE": _table(by_group["retrain_rule"]),
    }
    if args.runs:
        lines = [
            "| defaults | natural | FGSM | PGD-20 | CW∞ | Minority nat | Minority PGD | "
            "final match loss (start → end, steps) | final re-train loss (steps) | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        curves = ["| defaults | " + " | ".join(f"round {k}" for k in (5, 10, 15, 20)) + " |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for spec in args.runs:
            name, path = spec.split("=", 1)
            f = _final(Path(path))
            cart = f["cart"][-1]
            lines.append(
                f"| {name} | {_pct(f['robust/natural'])} | {_pct(f['robust/fgsm'])} | "
                f"{_pct(f['robust/pgd20'])} | {_pct(f['robust/cw'])} | "
                f"{_pct(f['groups/minority/natural'])} | {_pct(f['groups/minority/pgd20'])} | "
                f"{cart[1]:.1f} → {cart[2]:.2f} ({cart[3]:.0f}) | {cart[4]:.3f} ({cart[5]:.0f}) "
                f"| {f['wall_s']:.0f} |"
            )
            acc = dict(f["curve"])
            cells = [_pct(acc[k]) if k in acc else "–" for k in (5, 10, 15, 20)]
            curves.append(f"| {name} | " + " | ".join(cells) + " |")
        parts["TABLE_E2E"] = "\n".join(lines) + "\n"
        parts["TABLE_CURVE"] = "\n".join(curves) + "\n"
    for key, value in parts.items():
        text = text.replace(f"{{{{{key}}}}}", value)
    print(text, end="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("round", help="replay one round from a checkpoint, every CART variant")
    m.add_argument("ckpt", help="run directory holding checkpoint.pt (after round R - 1)")
    m.add_argument("--out", required=True, help="JSON result file")
    m.add_argument("--real-per-class", type=int, default=100)
    m.set_defaults(func=measure)
    rec = sub.add_parser("record", help="run a FedCART preset once and keep its trajectory")
    rec.add_argument("--preset", default="fedcart-fmnistlt-cpu")
    rec.add_argument("--set", action="append", help="config override KEY=VALUE")
    rec.add_argument("--out", required=True, help="trajectory file (.pt)")
    rec.set_defaults(func=record)
    rr = sub.add_parser("run", help="replay every CART variant over a recorded run")
    rr.add_argument("trajectory")
    rr.add_argument("--out", required=True, help="JSON result file")
    rr.set_defaults(func=measure_run)
    r = sub.add_parser("render", help="Markdown from a result file")
    r.add_argument("results")
    r.add_argument("--template", help="Markdown with {{TABLE_*}} / {{META}} placeholders")
    r.add_argument("--runs", nargs="*", help="name=run_dir pairs of end-to-end runs")
    r.set_defaults(func=render)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
