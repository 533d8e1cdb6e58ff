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
    """Natural and PGD-20 accuracy of r + h' (whole test set / the robust evaluator's
    seeded 500-sample subset), overall and on the Minority classes."""

    def __init__(self, sim: Simulator, pgd_samples: int = 500) -> None:
        cfg = sim.cfg
        self.sim = sim
        test = sim.exp.bundle.test
        self.x, self.y = test.batch(torch.arange(len(test)), "cpu")
        idx = subset_indices(len(test), pgd_samples, cfg.seed)
        self.px, self.py = self.x[idx], self.y[idx]
        rob = cfg.eval.params.get("robust", {})
        counts = sim.exp.train.class_counts(sim.exp.bundle.num_classes).cpu()
        groups = class_groups(counts, rob.get("majority_min", 150), rob.get("minority_max", 45))
        self.minority = groups["minority"]
        self.eps = 0.1 if sim.exp.bundle.input_shape[0] == 1 else 8 / 255

    def __call__(self, params: torch.Tensor, buffers: torch.Tensor) -> dict[str, float]:
        model = self.sim.model
        set_params(model, params)
        set_buffers(model, buffers)
        model.eval()
        nat = robust_correct(model, self.x, self.y, None, batch_size=500)
        attack = EVAL_ATTACKS.build("pgd", eps=self.eps, steps=20, seed=self.sim.cfg.seed)
        rob = robust_correct(model, self.px, self.py, attack, batch_size=500)
        m, pm = self.minority[self.y], self.minority[self.py]
        return {
            "natural": float(nat.float().mean()),
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
    m = sub.add_parser("measure", help="replay a round and apply every CART-step variant")
    m.add_argument("ckpt", help="run directory holding checkpoint.pt (after round R - 1)")
    m.add_argument("--out", required=True, help="JSON result file")
    m.add_argument("--real-per-class", type=int, default=100)
    m.set_defaults(func=measure)
    r = sub.add_parser("render", help="Markdown from a result file")
    r.add_argument("results")
    r.add_argument("--template", help="Markdown with {{TABLE_*}} / {{META}} placeholders")
    r.add_argument("--runs", nargs="*", help="name=run_dir pairs of end-to-end runs")
    r.set_defaults(func=render)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
