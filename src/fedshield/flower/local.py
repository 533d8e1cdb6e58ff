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
from flwr.common.constant import ErrorCode
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
        self._replies: dict[str, Message] = {}  # pushed, not yet pulled (instruction id →)

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
        return self.pull_messages(self.push_messages(messages))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Run each message's ClientApp now; the reply waits for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            # An id per instruction, as Flower's grids assign on push: a reply carries it as
            # reply_to_message_id, which the strategies check (fedshield.flower.replies).
            mid = f"local-{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            ids.append(mid)
            try:
                self._replies[mid] = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as err:  # a SuperNode answers a raising ClientApp with an error
                error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=repr(err))
                self._replies[mid] = Message(error, reply_to=msg)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    # The rest of Grid's interface is not needed in process.
    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        return None

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError("build Message objects directly")


def set_task_identity() -> None:
    """Messages stamp the sender's run/task identity, which Flower's runtimes set for the
    process; outside them we set a dummy one (as ``flwr.simulation.run_simulation`` does)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("task_id", 1), ("run_id", 0), ("node_id", 1)):  # 1: the SuperLink
        try:
            getattr(TaskIdentity, attr)
        except RuntimeError:
            setattr(TaskIdentity, attr, value)
