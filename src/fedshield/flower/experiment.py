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
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    MetricRecordValues,
    RecordDict,
)
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedshield.core.callables import accepts
from fedshield.core.context import ClientUpdate
from fedshield.errors import FedshieldError
from fedshield.flower import codec
from fedshield.flower.byzantine import local_update_attack, runs_on_client
from fedshield.flower.replies import MissingRows, match_replies, missing_reason
from fedshield.sim.engine import RoundPlan, Simulator

log = logging.getLogger("fedshield")

# Called after each round with its metrics; a callback with a ``wall_s`` parameter also
# gets the round's wall time (fedshield.progress.RoundProgress.on_round does).
RoundCallback = Callable[..., None]


def _takes_wall_time(fn: RoundCallback | None) -> bool:
    return accepts(fn, "wall_s")


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
        self.timeout = 3600.0  # the round timeout (seconds), set by run()
        self.missing = MissingRows(self.timeout)
        self._rows_seen = False  # whether any ClientApp has delivered a row in this session

    @property
    def num_rounds(self) -> int:
        """Rounds left to run (all of them unless resuming)."""
        return max(0, self.sim.cfg.rounds - self.first_round + 1)

    def round_of(self, server_round: int) -> int:
        return self.first_round + server_round - 1

    # -- node discovery ------------------------------------------------------------------
    def connect(self, grid: Grid, timeout: float = 600.0) -> dict[int, int]:
        """Ask every listed node for its partition id and build the map, within ``timeout``.

        Nodes are asked as they connect; the map is done when every partition 0..M-1 has a
        node and every query is answered. A node Flower answers for (its heartbeat expired:
        a SuperNode killed less than two heartbeats ago is still listed) is left out and
        named in the log and asked again if it comes back; a node's own refusal (a wrong
        node config) stops the run."""
        m = self.sim.cfg.data.num_clients
        deadline = time.monotonic() + timeout
        asked: dict[str, int] = {}  # query message id -> node
        pending: set[str] = set()
        node_of: dict[int, int] = {}
        gone: dict[int, str] = {}  # node -> why Flower answered for it
        while True:
            listed = [int(n) for n in grid.get_node_ids()]
            # Ask each node without an answer or a query in flight (a node Flower answered
            # for is asked again when it is listed again: a restarted SuperNode keeps its id
            # under node authentication).
            waiting = {asked[mid] for mid in pending} | set(node_of.values())
            fresh = [n for n in listed if n not in waiting]
            if fresh and len(listed) >= m:  # all at once: one ClientApp start per node
                ids = grid.push_messages([self._hello(n, m, timeout) for n in fresh])
                for mid, n in zip(ids, fresh, strict=False):  # None: not pushed
                    if mid:
                        asked[mid] = n
                        pending.add(mid)
            if pending:
                for msg in grid.pull_messages(sorted(pending)):
                    mid = msg.metadata.reply_to_message_id
                    if mid in pending:
                        pending.discard(mid)
                        self._hello_reply(asked[mid], msg, node_of, gone)
            if len(node_of) == m and not pending:
                break
            if time.monotonic() > deadline:
                raise FlowerRunError(self._not_connected(m, timeout, listed, node_of, gone))
            time.sleep(0.2)
        self.node_of = node_of
        self.client_of = {n: k for k, n in node_of.items()}
        return node_of

    @staticmethod
    def _hello(node: int, m: int, ttl: float) -> Message:
        hello = RecordDict({codec.HELLO: ConfigRecord({"num-clients": m})})
        return Message(hello, dst_node_id=node, message_type=MessageType.QUERY, ttl=ttl)

    @staticmethod
    def _hello_reply(
        node: int, msg: Message, node_of: dict[int, int], gone: dict[int, str]
    ) -> None:
        """Record ``node``'s answer to the discovery query (``msg``: its reply, or
        Flower's error for it)."""
        if msg.has_error():
            if int(msg.metadata.src_node_id) != SUPERLINK_NODE_ID:  # the node's own refusal
                raise FlowerRunError(f"node {node} refused the federation: {msg.error.reason}")
            if node not in gone:  # once per node, however often it is asked again
                log.warning(
                    "SuperNode %s was listed but is unavailable (%s: %s); left out",
                    node, missing_reason(msg.error), msg.error.reason,
                )  # fmt: skip
            gone[node] = missing_reason(msg.error)
            return
        gone.pop(node, None)
        if int(msg.metadata.src_node_id) != node:
            return  # an answer from another node than the one asked: ignored
        k = int(msg.content.config_records[codec.NODE]["partition-id"])  # type: ignore[arg-type]
        if k in node_of:
            raise FlowerRunError(f"nodes {node_of[k]} and {node} both hold partition-id={k}")
        node_of[k] = node

    @staticmethod
    def _not_connected(
        m: int, timeout: float, listed: list[int], node_of: dict[int, int], gone: dict[int, str]
    ) -> str:
        alive = [n for n in listed if n not in gone]
        if len(listed) < m:
            text = (
                f"{len(listed)} SuperNodes connected after {timeout:.0f}s; the config needs "
                f"data.num_clients={m} (one SuperNode per client)"
            )
        else:
            missing = sorted(set(range(m)) - set(node_of))
            waiting = sorted(set(alive) - set(node_of.values()))
            text = f"no SuperNode answered for partition-id(s) {missing[:10]} after {timeout:.0f}s"
            if waiting:
                text += f"; node(s) {waiting[:10]} did not answer the discovery query"
        if gone:
            text += (
                f"; node(s) {sorted(gone)[:10]} are listed but unavailable (a SuperNode killed "
                f"less than two heartbeats, 60 s, ago stays listed and refuses a restart)"
            )
        return text

    def run(self, grid: Grid, timeout: float = 3600.0) -> None:
        """Discover the nodes, then run the remaining rounds with Flower's ``start`` loop;
        ``timeout`` bounds the discovery and each round's wait for replies, and is the TTL
        of every instruction (a node that comes back later does not train a past round)."""
        self.timeout = self.missing.timeout = timeout
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
                    ttl=self.timeout,
                )
            )
        self._sent = msgs  # each reply must answer one of these (Flower sets their ids)
        return msgs

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        plan = self._plan
        assert plan is not None and plan.ctx.round == self.round_of(server_round)
        updates, rejected, dropped = self._decode(plan, replies)
        m = self.sim.end_round(
            plan, updates, apply_update_attack=not self.local_attack, rejected_before=rejected
        )
        if dropped:  # rows that never arrived; rows that arrived and failed are sys/rejected
            m["sys/dropped"] = dropped
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
    ) -> tuple[list[ClientUpdate], Counter[str], int]:
        """Replies → updates in cohort order, one per sampled node answering its own
        instruction (:func:`~fedshield.flower.replies.match_replies`); a reply that speaks
        for another client, or cannot be decoded, is rejected and counted. A sampled client
        whose row never arrives — no reply within the round timeout, its ClientApp crashed or
        raised, its SuperNode unavailable — is a missing row: logged, counted once (the
        returned count, ``sys/dropped``) and the round goes on without it, its f still the
        sampled cohort's. Only a round in which every sampled ClientApp raised before any
        row ever arrived stops the run: a broken app or setup, not a fault."""
        matched = match_replies(replies, self._sent)
        rejected = matched.rejected
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
        missing = {self.client_of[n]: (n, why) for n, why in matched.missing.items()}
        self._stop_if_broken(plan, matched.failures, missing)
        self._rows_seen |= bool(by_client)
        self.missing.record(plan.ctx.round, len(plan.ctx.cohort), missing)
        updates = [by_client[k] for k in plan.ctx.cohort if k in by_client]
        return updates, rejected, len(missing)

    def _stop_if_broken(
        self, plan: RoundPlan, failures: dict[int, Error], missing: dict[int, tuple[int, str]]
    ) -> None:
        raised = [k for k, (_, why) in missing.items() if why == "clientapp_error"]
        if self._rows_seen or not raised or len(raised) < len(plan.ctx.cohort):
            return
        k = min(raised)
        node = missing[k][0]
        raise FlowerRunError(
            f"round {plan.ctx.round}: client {k} (node {node}) failed: {failures[node].reason} "
            f"(every sampled ClientApp raised and no row has arrived yet: a broken app or "
            f"setup, not a fault)"
        )

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
