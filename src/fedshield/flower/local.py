"""An in-process Flower :class:`~flwr.serverapp.Grid`: the fedshield ClientApp without Ray.

:class:`LocalGrid` hands each message straight to a ClientApp with a per-node
:class:`~flwr.app.Context` (node config ``partition-id``/``num-partitions``, a ``state``
that persists across rounds), as Flower's simulation engine does, and turns a raising
ClientApp into an error reply, as a SuperNode does. Node ids are random, as Flower's are.
It is for debugging a strategy step by step and for fast tests of the app's logic; use
:func:`fedshield.flower.simulation.run_simulation` for real (parallel) simulation.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid


class LocalGrid(Grid):
    """``num_nodes`` virtual SuperNodes served sequentially by ``app`` in this process."""

    def __init__(
        self,
        num_nodes: int,
        app: ClientApp | None = None,
        seed: int = 0,
        node_config: dict[str, Any] | None = None,
    ) -> None:
        if app is None:
            from fedshield.flower.client_app import app as default_app

            app = default_app
        self.app = app
        set_task_identity()
        rng = random.Random(seed)
        self.contexts: dict[int, Context] = {}
        for i in range(num_nodes):
            node_id = rng.getrandbits(63)
            cfg = {"partition-id": i, "num-partitions": num_nodes, **(node_config or {})}
            self.contexts[node_id] = Context(0, node_id, cfg, RecordDict(), {})
        self.sent: list[Message] = []  # every instruction, for inspection

    def restart(self, node_id: int | None = None) -> None:
        """A SuperNode restart (all nodes when ``node_id`` is None): the node's Context,
        so its ``Context.state``, is lost; its node id and node config are kept (as a real
        SuperNode's are under node authentication)."""
        for nid in [node_id] if node_id is not None else list(self.contexts):
            old = self.contexts[nid]
            self.contexts[nid] = Context(old.run_id, nid, dict(old.node_config), RecordDict(), {})

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            # An id per instruction, as Flower's grids assign on push: a reply carries it as
            # reply_to_message_id, which the strategies check (fedshield.flower.replies).
            msg.metadata.__dict__["_message_id"] = f"local-{len(self.sent)}"
            self.sent.append(msg)
            try:
                replies.append(self.app(msg, self.contexts[msg.metadata.dst_node_id]))
            except Exception as err:  # a SuperNode answers a raising ClientApp with an error
                replies.append(Message(Error(code=0, reason=repr(err)), reply_to=msg))
        return replies

    # The rest of Grid's interface is not needed in process.
    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        return None

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError("build Message objects directly")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("use send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("use send_and_receive")


def set_task_identity() -> None:
    """Messages stamp the sender's run/task identity, which Flower's runtimes set for the
    process; outside them we set a dummy one (as ``flwr.simulation.run_simulation`` does)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("task_id", 1), ("run_id", 0), ("node_id", 1)):  # 1: the SuperLink
        try:
            getattr(TaskIdentity, attr)
        except RuntimeError:
            setattr(TaskIdentity, attr, value)
