"""Why FedCART's seeds disagree: the measurements of docs/results/fedcart.md
("Why the seeds disagree").

    # per-client class counts of the long-tailed split of each seed (no training)
    python tools/fedcart_diag.py splits 0,1,7,8
    # one instrumented run of fedcart-fmnistlt-cpu: natural accuracy every round plus the
    # quantities below in its metrics.jsonl (eval.metrics off: no robust evaluation)
    python tools/fedcart_diag.py run 1 runs/diag/s1 [override ...]
    python tools/fedcart_diag.py run 1 runs/diag/c1 'client.algorithm="calfat"' \\
        'server.algorithm="fedavg"'
    python tools/fedcart_diag.py summary runs/diag/s7 runs/diag/s1
    # per seed: split purity against FedCART − CalFAT (points), Spearman's rank correlation
    python tools/fedcart_diag.py purity robust/worst docs/results/data/fedcart-methods-cpu.csv \
        docs/results/data/fedcart-methods-cpu-heldout.csv

Logged per round (``d/`` keys) on the whole test split: accuracy of the main path r + h and
of the inference path r + h' per class group; the nearest-class-mean accuracy of the
features r(x) (``d/ncm_acc``: how separable r makes the classes, whatever the head); the
mean feature norm and the share of dead feature dimensions; the prototypes' norms; the
virtual features' norm relative to the real features' (``d/zv_vs_feat``) and the accuracy
of the nearest virtual-feature class mean on real features (``d/zv_ncm_acc``). The CART
step's own ``cart/*`` metrics and the clients' ``train/loss`` are logged by the library.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedshield import config as cfgmod
from fedshield.core.flat import set_buffers, set_params
from fedshield.data import load_dataset, make_long_tail, partition, partitioner_params
from fedshield.sim import engine

PRESET = "fedcart-fmnistlt-cpu"
GROUPS = {"maj": [0, 1, 2], "med": [3, 4, 5], "min": [6, 7, 8, 9]}


def _config(seed: int, sets: Sequence[str]) -> Any:
    raw = cfgmod.read_preset(PRESET)
    raw["eval"].pop("params", None)  # no robust evaluator: its parameters go too
    base = [f"seed={seed}", "eval.metrics=[]", "eval.every=1", "checkpoint.every=100"]
    return cfgmod.validate(cfgmod.apply_overrides(raw, [*base, *sets]))


def client_class_counts(seed: int, sets: Sequence[str] = ()) -> torch.Tensor:
    """[K, C]: each client's class counts in the long-tailed split of ``seed``."""
    cfg = _config(seed, sets)
    d = cfg.data
    bundle = load_dataset(d.dataset, d.root, d.download, d.params)
    train = make_long_tail(bundle.train, bundle.num_classes, d.long_tail.rho, cfg.seed)
    parts = partition(
        train.y, d.num_clients, d.partition, cfg.seed, min_size=d.min_size,
        parsed=partitioner_params(d.partition, d),
    )  # fmt: skip
    return torch.stack([torch.bincount(train.y[p], minlength=bundle.num_classes) for p in parts])


def purity(counts: torch.Tensor) -> float:
    """The largest share one class has of one client's data (1.0: a one-class client)."""
    sizes = counts.sum(1).clamp_min(1)
    return float((counts.max(1).values / sizes).max())


def _diag_metrics(sim: Any, res: dict[str, float]) -> dict[str, float]:
    m = sim.model
    set_params(m, sim.state.params)
    set_buffers(m, sim.state.buffers)
    x, y = sim.exp.bundle.test.batch(None, sim.device)
    m.eval()
    with torch.no_grad():
        z = m.forward_features(x)
        pm, pa = m.main_head(z).argmax(1), m.head(z).argmax(1)
    for name, cls in GROUPS.items():
        sel = torch.isin(y, torch.tensor(cls, device=y.device))
        res[f"d/main_{name}"] = float((pm[sel] == y[sel]).float().mean())
        res[f"d/aux_{name}"] = float((pa[sel] == y[sel]).float().mean())
    res["d/main_acc"] = float((pm == y).float().mean())
    norm = z.norm(dim=1).mean()
    res["d/feat_norm"] = float(norm)
    res["d/feat_dead"] = float((z.abs().max(0).values < 1e-6).float().mean())
    mu = torch.stack([z[y == c].mean(0) for c in range(int(y.max()) + 1)])
    res["d/ncm_acc"] = float((torch.cdist(z, mu).argmin(1) == y).float().mean())
    st = sim.state.server_state
    if "proto" in st:
        pn = st["proto"].norm(dim=1)
        res["d/proto_norm_maj"], res["d/proto_norm_min"] = (
            float(pn[:3].mean()),
            float(pn[6:].mean()),
        )
    if "zv" in st:
        res["d/zv_vs_feat"] = float(st["zv"].norm(dim=2).mean() / norm)
        zmu = st["zv"].mean(1)
        res["d/zv_ncm_acc"] = float((torch.cdist(z, zmu).argmin(1) == y).float().mean())
    return res


def run(seed: int, out: Path, sets: Sequence[str]) -> None:
    from fedshield.runner import run as run_config

    plain = engine.Simulator.evaluate

    def evaluate(self: Any) -> dict[str, float]:
        return _diag_metrics(self, plain(self))

    engine.Simulator.evaluate = evaluate  # type: ignore[method-assign]
    try:
        run_config(_config(seed, sets), out, quiet=True)
    finally:
        engine.Simulator.evaluate = plain  # type: ignore[method-assign]


def summary(run_dir: Path) -> str:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    by = {r["round"]: r for r in recs}
    last = max(by)
    late = [by[r] for r in range(max(1, last - 9), last + 1) if r in by]
    acc = [r["test_acc"] for r in late]
    swing = max(abs(a - b) for a, b in zip(acc[1:], acc[:-1]))
    fn = [r["d/feat_norm"] for r in late]
    end = by[last]
    return (
        f"{run_dir.name}: round {last} natural {end['test_acc']:.3f} (last 10 rounds "
        f"[{min(acc):.3f}, {max(acc):.3f}], largest round-to-round change {swing:.3f}); "
        f"train/loss {end['train/loss']:.3f}; NCM {end['d/ncm_acc']:.3f}; feature norm "
        f"[{min(fn):.2f}, {max(fn):.2f}]; Minority {end['d/aux_min']:.3f}; "
        f"re-training CE {end.get('cart/retrain_loss', float('nan')):.3f}"
    )


def _cap(run_dir: Path) -> int:
    """The matching step cap the run used (its server.params.match_iters, else the default)."""
    import tomllib

    from fedshield.algorithms.server.fedcart import MATCH_ITERS

    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    return int(cfg.get("server", {}).get("params", {}).get("match_iters", MATCH_ITERS))


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def table(runs: Sequence[tuple[str, Path]]) -> str:
    """The page's per-seed table (docs/results/fedcart.md, "Why the seeds disagree") from
    instrumented runs (``run``): round-20 values, ranges over rounds 11–20. A run without
    the CART step (CalFAT) has "–" in the CART rows."""
    cols: list[list[str]] = []
    for _, d in runs:
        by = {r["round"]: r for r in map(json.loads, (d / "metrics.jsonl").open())}
        last = max(by)
        late = [by[r] for r in range(max(1, last - 9), last + 1) if r in by]
        end = by[last]
        acc = [r["test_acc"] for r in late]
        swing = max(abs(a - b) for a, b in zip(acc[1:], acc[:-1]))
        early = min(by[r]["d/feat_norm"] for r in range(1, min(5, last) + 1) if r in by)
        cart = "d/zv_vs_feat" in end

        def rng(key: str, late: list[dict[str, Any]] = late, digits: int = 1) -> str:
            v = [r[key] for r in late if key in r]
            return f"{min(v):.{digits}f}–{max(v):.{digits}f}" if v else "–"

        cap = _cap(d)
        steps = [r for r in by.values() if "cart/match_steps" in r]
        col = [
            f"{end['test_acc']:.3f}",
            ", ".join(f"{r['test_acc']:.2f}" for r in late[-5:]),
            f"{100 * swing:.1f} pts",
            f"{end['train/loss']:.2f}",
            f"{end['d/ncm_acc']:.3f}",
            f"{rng('d/feat_norm')} ({early:.2f})" if cart else rng("d/feat_norm"),
            rng("d/zv_vs_feat") if cart else "–",
            f"{100 * _median([r['d/feat_dead'] for r in late]):.1f} %" if cart else "–",
            (f"{_median([r['d/proto_norm_maj'] for r in late]):.1f} / "
             f"{_median([r['d/proto_norm_min'] for r in late]):.1f}") if cart else "–",
            (f"{sum(r['cart/match_steps'] >= cap for r in steps)}; "
             f"{_median([r['cart/match_end'] for r in steps]):.2f} / "
             f"{max(r['cart/match_end'] for r in steps):.2g}") if steps else "–",
            f"{end['cart/retrain_loss']:.3f}" if "cart/retrain_loss" in end else "–",
            f"{end['d/aux_min']:.3f}",
        ]  # fmt: skip
        cols.append(col)
    rows = [
        "natural accuracy, round 20",
        "natural, rounds 16–20",
        "largest change between consecutive rounds (11–20)",
        "clients' training loss (L_CART; CalFAT: its loss)",
        "nearest-class-mean accuracy of the features r(x)",
        "mean feature norm ‖r(x)‖, rounds 11–20 (lowest in rounds 1–5)",
        "virtual / real feature norm, rounds 11–20",
        "dead feature dimensions (median, rounds 11–20)",
        "prototype norm, Majority / Minority (median, rounds 11–20)",
        "matching, all rounds: rounds at the step cap; final MSE median / largest",
        "re-training CE of h′ on Z_v, round 20 (`cart/retrain_loss`)",
        "Minority natural",
    ]
    lines = ["| | " + " | ".join(label for label, _ in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(c[i] for c in cols) + " |" for i, name in enumerate(rows)]
    return "\n".join(lines) + "\n"


def write_table(out: Path, runs: Sequence[tuple[str, Path]]) -> None:
    """:func:`table` into ``out`` with ``<stem>.provenance.json`` beside it: the runs'
    commits and config hashes (their summary.json) and the file's SHA-256."""
    import hashlib

    out.write_text(table(runs))
    sums = {label: json.loads((d / "summary.json").read_text()) for label, d in runs}
    commits = sorted({str(s["provenance"]["commit"]) for s in sums.values()})
    runs_sha = {label: s["provenance"]["config_sha256"] for label, s in sums.items()}
    prov = {
        "command": ["python", "tools/fedcart_diag.py", "table", str(out),
                    *(f"{a}={b}" for a, b in runs)],
        "commits": commits,
        "config_sha256": hashlib.sha256(json.dumps(runs_sha, sort_keys=True).encode()).hexdigest(),
        "runs": runs_sha,
        "files": {out.name: hashlib.sha256(out.read_bytes()).hexdigest()},
        "grid": out.stem,  # no grid: the record is named after its file
    }  # fmt: skip
    side = out.with_name(out.stem + ".provenance.json")
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


def purity_table(metric: str, sources: Sequence[str]) -> str:
    """Per seed of the comparison files: the split's purity and FedCART − CalFAT on
    ``metric`` in points, then Spearman's ρ between the two (scipy)."""
    import csv

    from scipy import stats

    vals: dict[int, dict[str, float]] = {}
    for src in sources:
        with Path(src).open() as fh:
            for r in csv.DictReader(fh):
                if r.get(metric):
                    vals.setdefault(int(r["seed"]), {})[r["variant"]] = float(r[metric])
    seeds = sorted(s for s, v in vals.items() if {"fedcart", "calfat"} <= set(v))
    pur = [purity(client_class_counts(s)) for s in seeds]
    gap = [100 * (vals[s]["fedcart"] - vals[s]["calfat"]) for s in seeds]
    lines = [
        f"seed {s}: purity {p:.3f}  fedcart - calfat {g:+.1f}" for s, p, g in zip(seeds, pur, gap)
    ]
    res = stats.spearmanr(pur, gap)
    lines.append(f"Spearman rho {res.statistic:.2f} (p = {res.pvalue:.3f}, {len(seeds)} seeds)")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in {"splits", "run", "summary", "purity", "table"}:
        print(__doc__)
        return 2
    cmd, *rest = argv
    if cmd == "splits":
        for s in (int(v) for v in rest[0].split(",")):
            counts = client_class_counts(s, rest[1:])
            print(f"seed {s}: purity {purity(counts):.3f} sizes {counts.sum(1).tolist()}")
            for row in counts.tolist():
                print("   ", row)
    elif cmd == "purity":
        print(purity_table(rest[0], rest[1:]))
    elif cmd == "run":
        run(int(rest[0]), Path(rest[1]), rest[2:])
    elif cmd == "table":  # table OUT.md LABEL=DIR ...: the page's table, with provenance
        pairs = [x.partition("=") for x in rest[1:]]
        write_table(Path(rest[0]), [(a, Path(b)) for a, _, b in pairs])
    else:
        for d in rest:
            print(summary(Path(d)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
