"""The ServerApp: Flower's training loop with fedshield's BR-DRAG strategy.

BR-DRAG (Byzantine-robust DRAG) rescales every client update to the norm of a trusted
reference r — the server's own SGD on a small root dataset — and pulls it towards r.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from brdrag_app.task import Net, evaluate, load_split, settings
from fedshield.flower.strategies import BRDRAG

app = ServerApp()


def make_strategy(cfg: dict[str, Any]) -> BRDRAG:
    """BR-DRAG with the root split as its root data, trained like the clients train."""
    hidden = int(cfg["hidden"])
    return BRDRAG(
        c=float(cfg["c"]),
        root_data=load_split("root", cfg),
        model_fn=lambda: Net(hidden),
        root_train={
            "lr": float(cfg["lr"]),
            "batch_size": int(cfg["batch-size"]),
            "steps": int(cfg["local-steps"]),
        },
        seed=int(cfg["seed"]),
        fraction_evaluate=0.0,  # evaluated centrally on the test split
        min_available_nodes=int(cfg["num-clients"]),
    )


def run(grid: Grid, cfg: dict[str, Any]) -> Result:
    """Train for ``num-server-rounds`` rounds; test accuracy after every round."""
    torch.manual_seed(int(cfg["seed"]))
    net = Net(int(cfg["hidden"]))
    x_test, y_test = load_split("test", cfg)

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net(int(cfg["hidden"]))
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(model, x_test, y_test)
        return MetricRecord({"test_loss": loss, "test_acc": acc})

    return make_strategy(cfg).start(
        grid,
        ArrayRecord(net.state_dict()),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=central_evaluate,
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = settings(context.run_config)
    result = run(grid, cfg)
    out = str(cfg.get("out", "") or "")
    if out:  # the final model and the per-round metrics
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), path / "model.pt")
        rounds = {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
        (path / "metrics.json").write_text(json.dumps(rounds, indent=1))
