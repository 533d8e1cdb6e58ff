"""One reply per sampled node, to its own instruction (docs/security.md: *who* sent an upload is
untrusted too), and one reason for every sampled node whose row did not arrive.

A strategy keeps the instructions it returned from ``configure_train``; Flower's grids give
each one a ``message_id`` when they push it. :func:`match_replies` then keeps a reply only
when its ``src_node_id`` was sent an instruction this round, when it answers that node's own
instruction (``reply_to_message_id``; checked whenever the grid assigned ids), and when the
node answered once — a node that answered more than once has every reply dropped, so it
cannot choose which copy counts. Dropped replies are counted by reason (``unsampled``,
``wrong_instruction``, ``duplicate``) for ``sys/rejected/<reason>``. Whether a SuperLink
ever delivers such a set is beside the point: the strategy does not depend on it.

Flower answers for a node that cannot: when a SuperNode missed its heartbeats (``Node
Unavailable``) or an instruction or reply expired (its TTL), the SuperLink itself replies
with an error whose ``src_node_id`` is the SuperLink's own id (1) and whose
``reply_to_message_id`` is the lost instruction's. Such an error is the missing row of the
instruction's node, not a reply from a stranger; it only explains a silence, so a reply of
the node itself wins over it. (The SuperLink refuses node replies that claim its id.)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

log = logging.getLogger("fedshield")

# Flower's error codes as the reason a row is missing (fedshield's names, for logs and the
# summary); an instruction with no reply at all is "no_reply".
MISSING_REASONS = {
    ErrorCode.NODE_UNAVAILABLE: "node_unavailable",  # heartbeat expired: node dead or cut off
    ErrorCode.CLIENT_APP_CRASHED: "clientapp_crashed",  # process killed (OOM, SIGKILL)
    ErrorCode.CLIENT_APP_RAISED_EXCEPTION: "clientapp_error",
    ErrorCode.LOAD_CLIENT_APP_EXCEPTION: "clientapp_error",
    ErrorCode.MESSAGE_UNAVAILABLE: "expired",  # an instruction or reply outlived its TTL
    ErrorCode.REPLY_MESSAGE_UNAVAILABLE: "expired",
}
NO_REPLY = "no_reply"


def missing_reason(error: Error | None) -> str:
    """fedshield's name for why a row is missing (``error`` None: no reply came)."""
    if error is None:
        return NO_REPLY
    return MISSING_REASONS.get(int(error.code), "error")


@dataclass
class Matched:
    """The admitted replies (sorted by node id); the errors standing for sampled nodes'
    rows (node id → Flower's error: the node's own, or the SuperLink's for it); the
    sampled nodes whose row did not arrive, each once, with the reason
    (:func:`missing_reason`; a node whose replies were rejected is counted there, not
    here); and the dropped replies by reason."""

    replies: list[Message]
    failures: dict[int, Error]
    missing: dict[int, str] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)


def match_replies(replies: Iterable[Message], sent: Sequence[Message]) -> Matched:
    """Admit the replies to ``sent`` (see the module docstring)."""
    instruction = {int(m.metadata.dst_node_id): m.metadata.message_id for m in sent}
    node_of = {mid: node for node, mid in instruction.items() if mid}
    rejected: Counter[str] = Counter()
    candidates: list[Message] = []
    flower_errors: dict[int, Error] = {}  # the SuperLink's word for a silent node
    for msg in replies:
        node = int(msg.metadata.src_node_id)
        lost = node_of.get(msg.metadata.reply_to_message_id)
        if node == SUPERLINK_NODE_ID and msg.has_error() and lost is not None:
            flower_errors[lost] = msg.error
            continue
        if node not in instruction:
            rejected["unsampled"] += 1
            continue
        want = instruction[node]
        if want and msg.metadata.reply_to_message_id != want:
            rejected["wrong_instruction"] += 1
            continue
        candidates.append(msg)
    per_node = Counter(int(m.metadata.src_node_id) for m in candidates)
    kept = []
    for msg in candidates:
        if per_node[int(msg.metadata.src_node_id)] > 1:
            rejected["duplicate"] += 1
        else:
            kept.append(msg)
    for reason, n in sorted(rejected.items()):
        log.warning("dropped %d reply(ies): %s", n, reason)
    kept.sort(key=lambda m: int(m.metadata.src_node_id))
    failures = {int(m.metadata.src_node_id): m.error for m in kept if m.has_error()}
    for node, error in flower_errors.items():
        if per_node[node] == 0:  # the node's own reply, even a rejected one, speaks for it
            failures[node] = error
    missing = {
        node: missing_reason(failures.get(node))
        for node in sorted(instruction)
        if node in failures or per_node[node] == 0
    }
    admitted = [m for m in kept if not m.has_error()]
    return Matched(admitted, dict(sorted(failures.items())), missing, rejected)


class MissingRows:
    """The run's missing rows — a dead node, a crashed ClientApp, a late reply: one event,
    counted once per sampled client and round — for the log and summary.json."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.by_client: Counter[int] = Counter()
        self.by_reason: Counter[str] = Counter()
        self.rounds = 0

    def record(self, rnd: int, sampled: int, missing: dict[int, tuple[int, str]]) -> None:
        """Round ``rnd`` of ``sampled`` clients lost ``missing`` (client → (node, reason))."""
        if not missing:
            return
        self.rounds += 1
        self.by_client.update(missing.keys())
        self.by_reason.update(reason for _, reason in missing.values())
        names = ", ".join(
            f"client {k} (node {node}): {self._why(reason)}"
            for k, (node, reason) in sorted(missing.items())
        )
        log.warning(
            "round %d: %d of %d sampled clients sent no row, the round goes on without them: %s",
            rnd, len(missing), sampled, names,
        )  # fmt: skip

    def _why(self, reason: str) -> str:
        if reason == NO_REPLY:
            return f"no reply within round-timeout ({self.timeout:g} s)"
        return reason

    def summary(self) -> dict[str, object]:
        """``dropped`` of summary.json: the total, the rounds that lost a row, and the
        counts by client and by reason."""
        return {
            "total": sum(self.by_client.values()),
            "rounds": self.rounds,
            "by_client": {str(k): n for k, n in sorted(self.by_client.items())},
            "by_reason": dict(sorted(self.by_reason.items())),
        }


__all__ = [
    "MISSING_REASONS",
    "NO_REPLY",
    "Matched",
    "MissingRows",
    "match_replies",
    "missing_reason",
]
