"""One reply per sampled node, to its own instruction (SPEC §12: *who* sent an upload is
untrusted too).

A strategy keeps the instructions it returned from ``configure_train``; Flower's grids give
each one a ``message_id`` when they push it. :func:`match_replies` then keeps a reply only
when its ``src_node_id`` was sent an instruction this round, when it answers that node's own
instruction (``reply_to_message_id``; checked whenever the grid assigned ids), and when the
node answered once — a node that answered more than once has every reply dropped, so it
cannot choose which copy counts. Dropped replies are counted by reason (``unsampled``,
``wrong_instruction``, ``duplicate``) for ``sys/rejected/<reason>``. Whether a SuperLink
ever delivers such a set is beside the point: the strategy does not depend on it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flwr.app import Message

log = logging.getLogger("fedshield")


@dataclass
class Matched:
    """The admitted replies (sorted by node id), the error replies among them, and the
    dropped ones by reason."""

    replies: list[Message]
    failures: list[Message]
    rejected: Counter[str] = field(default_factory=Counter)


def match_replies(replies: Iterable[Message], sent: Sequence[Message]) -> Matched:
    """Admit the replies to ``sent`` (see the module docstring)."""
    instruction = {int(m.metadata.dst_node_id): m.metadata.message_id for m in sent}
    rejected: Counter[str] = Counter()
    candidates: list[Message] = []
    for msg in replies:
        node = int(msg.metadata.src_node_id)
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
    return Matched(
        [m for m in kept if not m.has_error()], [m for m in kept if m.has_error()], rejected
    )


__all__ = ["Matched", "match_replies"]
