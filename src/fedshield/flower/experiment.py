"""A Flower Message-API strategy that runs any fedshield experiment (DESIGN: "the Flower
strategy is the simulator's loop body split at the network").

The strategy owns an in-process :class:`~fedshield.sim.engine.Simulator` for everything
server side — cohort sampling S^t = sample(seed, t), the Byzantine subset A^t, the server
algorithm's state and broadcast (reference direction, control variates, look-ahead model),
the aggregator, root-data training (BR-DRAG, FLTrust), omniscient attacks, screening,
evaluation, metrics and checkpoints — and sends only the local training over the network:

* ``configure_train`` = :meth:`Simulator.begin_round` + one message per selected client;
* the ClientApp runs the same ``local_update`` (:mod:`fedshield.flower.client_app`);
* ``aggregate_train`` = :meth:`Simulator.end_round` on the decoded updates.

So every fedshield config runs on Flower with no per-method Flower code, and a Flower run
matches the simulator's run with the same seed (same cohorts, same attackers, same batches).

Node ids ↔ client ids: before round 1 the strategy asks every node for its
``partition-id`` (node config; set by the simulation engine, or ``--node-config`` on a
SuperNode) and maps fedshield client ``k`` to the node holding partition ``k``. The map is
a pure function of the node configs, never of the (random) node ids.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    MetricRecordValues,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedshield.core.context import ClientUpdate
from fedshield.errors import FedshieldError
from fedshield.flower import codec
from fedshield.flower.byzantine import local_update_attack, runs_on_client
from fedshield.flower.replies import match_replies
from fedshield.sim.engine import RoundPlan, Simulator

log = logging.getLogger("fedshield")

# Called after each round with its metrics; a callback with a ``wall_s`` parameter also
# gets the round's wall time (fedshield.progress.RoundProgress.on_round does).
RoundCallback = Callable[..., None]


def _takes_wall_time(fn: RoundCallback | None) -> bool:
    try:
        return fn is not None and "wall_s" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


class FlowerRunError(FedshieldError):
    """A node failed or the federation does not match the config."""


class _Diverged(Exception):
    """Ends Flower's round loop after a diverged round (``run.on_nonfinite = "stop"``)."""


class FedshieldStrategy(Strategy):
    """Wraps a fedshield server algorithm, aggregator and attack as a Flower strategy."""

    def __init__(self, sim: Simulator, on_round: RoundCallback | None = None) -> None:
        self.sim = sim
        self.on_round = on_round
        self._wall_time = _takes_wall_time(on_round)
        self.first_round = sim.state.round  # > 1 when resuming from a checkpoint
        self.node_of: dict[int, int] = {}
        self.client_of: dict[int, int] = {}
        self.local_attack = local_update_attack(sim.comp.attack)
        # Client state of this run lives under its own key on every node, so runs that
        # share a federation (a sweep in one simulation, a resumed run) never mix states.
        self.run_key = uuid.uuid4().hex[:16]
        self._plan: RoundPlan | None = None
        self._sent: list[Message] = []
        self._t0 = 0.0

    @property
    def num_rounds(self) -> int:
        """Rounds left to run (all of them unless resuming)."""
        return max(0, self.sim.cfg.rounds - self.first_round + 1)

    def round_of(self, server_round: int) -> int:
        return self.first_round + server_round - 1

    # -- node discovery ------------------------------------------------------------------
    def connect(self, grid: Grid, timeout: float = 600.0) -> dict[int, int]:
        """Wait for ``num_clients`` nodes, ask each for its partition id, build the map."""
        m = self.sim.cfg.data.num_clients
        deadline = time.monotonic() + timeout
        while len(node_ids := list(grid.get_node_ids())) < m:
            if time.monotonic() > deadline:
                raise FlowerRunError(
                    f"{len(node_ids)} SuperNodes connected after {timeout:.0f}s; the config "
                    f"needs data.num_clients={m} (one SuperNode per client)"
                )
            time.sleep(0.2)
        hello = ConfigRecord({"num-clients": m})
        msgs = [
            Message(RecordDict({codec.HELLO: hello}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in node_ids
        ]
        replies = list(grid.send_and_receive(msgs, timeout=timeout))
        node_of: dict[int, int] = {}
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                raise FlowerRunError(f"node {node} refused the federation: {msg.error.reason}")
            k = int(msg.content.config_records[codec.NODE]["partition-id"])  # type: ignore[arg-type]
            if k in node_of:
                raise FlowerRunError(f"nodes {node_of[k]} and {node} both hold partition-id={k}")
            node_of[k] = node
        missing = sorted(set(range(m)) - set(node_of))
        if missing:
            raise FlowerRunError(f"no SuperNode answered for partition-id(s) {missing[:10]}")
        self.node_of = node_of
        self.client_of = {n: k for k, n in node_of.items()}
        return node_of

    def run(self, grid: Grid, timeout: float = 3600.0) -> None:
        """Discover the nodes, then run the remaining rounds with Flower's ``start`` loop."""
        if not self.node_of:
            self.connect(grid, timeout)
        st = self.sim.state
        # run.on_nonfinite = "stop": the diverged round is recorded, then the loop ends here.
        with contextlib.suppress(_Diverged):
            self.start(
                grid,
                codec.global_model(st.params, st.buffers),
                num_rounds=self.num_rounds,
                timeout=timeout,
            )

    # -- the Strategy phases -----------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # ``arrays`` is Flower's copy of θ; the simulator's state is authoritative because
        # some servers broadcast something else (FedACG's look-ahead model, extras).
        self._t0 = time.perf_counter()
        rnd = self.round_of(server_round)
        plan = self.sim.begin_round(rnd)
        self._plan = plan
        payload = codec.encode_payload(plan.payload)
        byz = set(plan.ctx.byzantine)
        msgs = []
        for k in plan.ctx.cohort:
            task = codec.Task(
                round=rnd,
                client_id=k,
                byzantine=k in byz,
                train=plan.trains(k),
                local_attack=self.local_attack,
                config_toml=self.sim.config_text,
                run_key=self.run_key,
            )
            msgs.append(
                Message(
                    codec.train_content(payload, task),
                    dst_node_id=self.node_of[k],
                    message_type=MessageType.TRAIN,
                    group_id=str(rnd),
                )
            )
        self._sent = msgs  # each reply must answer one of these (Flower sets their ids)
        return msgs

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        plan = self._plan
        assert plan is not None and plan.ctx.round == self.round_of(server_round)
        updates, rejected = self._decode(plan, replies)
        m = self.sim.end_round(
            plan, updates, apply_update_attack=not self.local_attack, rejected_before=rejected
        )
        if len(updates) < len(plan.ctx.cohort):
            m["sys/dropped"] = len(plan.ctx.cohort) - len(updates)
        wall_s = time.perf_counter() - self._t0
        self.sim.record(m, wall_s)
        if self._wall_time:
            self.on_round(m, wall_s=wall_s)  # type: ignore[misc]
        elif self.on_round is not None:
            self.on_round(m)
        if self.sim.diverged(m):
            raise _Diverged(m["round"])
        st = self.sim.state
        numeric: dict[str, MetricRecordValues] = {
            k: v for k, v in m.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return codec.global_model(st.params, st.buffers), MetricRecord(numeric)

    def _decode(
        self, plan: RoundPlan, replies: Iterable[Message]
    ) -> tuple[list[ClientUpdate], Counter[str]]:
        """Replies → updates in cohort order, one per sampled node answering its own
        instruction (:func:`~fedshield.flower.replies.match_replies`); a reply that speaks
        for another client, or cannot be decoded, is rejected and counted. A failing
        ClientApp fails the run (as it would in the simulator); a node that never answers
        (timeout) is dropped and counted."""
        matched = match_replies(replies, self._sent)
        rejected = matched.rejected
        for msg in matched.failures:
            node = msg.metadata.src_node_id
            raise FlowerRunError(
                f"round {plan.ctx.round}: client {self.client_of.get(node, -1)} (node {node}) "
                f"failed: {msg.error.reason}"
            )
        by_client: dict[int, ClientUpdate] = {}
        for msg in matched.replies:
            node = msg.metadata.src_node_id
            k = self.client_of.get(node, -1)
            try:
                u = codec.decode_update(msg.content, self.sim.device)
            except Exception as err:  # any decoding failure of untrusted bytes is a rejection
                log.warning("rejected the reply of node %s (%s)", node, err)
                rejected["malformed"] += 1
                continue
            if u.client_id != k:
                log.warning("rejected node %s answering as client %s, not %s", node, u.client_id, k)
                rejected["wrong_client"] += 1
                continue
            by_client[k] = u
        missing = [k for k in plan.ctx.cohort if k not in by_client]
        if missing:
            log.warning("round %d: no valid reply from client(s) %s", plan.ctx.round, missing)
        return [by_client[k] for k in plan.ctx.cohort if k in by_client], rejected

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Evaluation is server side, inside end_round (central test set, and per-client
        # accuracy when eval.per_client), exactly as in the simulator.
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        cfg = self.sim.cfg
        log.info(
            "fedshield strategy: server=%s aggregator=%s client=%s attack=%s (%s), "
            "%d of %d clients per round, rounds %d..%d",
            cfg.server.algorithm,
            cfg.server.aggregator,
            cfg.client.algorithm,
            cfg.attack.name,
            "on SuperNodes" if runs_on_client(self.sim.comp.attack) else "in the strategy",
            cfg.server.clients_per_round,
            cfg.data.num_clients,
            self.first_round,
            cfg.rounds,
        )
