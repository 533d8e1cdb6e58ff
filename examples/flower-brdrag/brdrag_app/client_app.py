"""The ClientApp: ordinary Flower — load the model, train, return the state dict."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from brdrag_app.task import Net, batch_generator, load_partition, settings, train

app = ClientApp()


@app.train()
def local_train(msg: Message, context: Context) -> Message:
    cfg = settings(context.run_config)
    pid = int(context.node_config["partition-id"])
    x, y = load_partition(pid, int(context.node_config["num-partitions"]), cfg)
    net = Net(int(cfg["hidden"]))
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    server_round = int(msg.content["config"]["server-round"])
    loss = train(
        net,
        x,
        y,
        lr=float(cfg["lr"]),
        batch_size=int(cfg["batch-size"]),
        steps=int(cfg["local-steps"]),
        generator=batch_generator(int(cfg["seed"]), server_round, pid),
    )
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)
