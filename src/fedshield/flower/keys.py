"""Record keys of the fedshield Flower app's messages (see :mod:`fedshield.flower.codec`).

A module of its own, free of torch, so that a ClientApp process answering the discovery
query (a fresh process per message on a SuperNode) starts in about a second.
"""

PAYLOAD, TASK = "fs.payload", "fs.task"
UPDATE, METRICS, INFO = "fs.update", "fs.metrics", "fs.info"
CLIENT_STATE = "fs.client-state"
HELLO, NODE = "fs.hello", "fs.node"  # discovery query / reply (partition id of a node)
NUM_EXAMPLES = "num-examples"  # Flower's conventional weight key, kept for its tooling

#: a DRAG client that calibrates locally receives the DoD scale c under this train-config key
DRAG_C = "fs.drag-c"

#: Prefix of every fedshield record in a Flower-native strategy's messages.
EXTRA_PREFIX = "fs."


def record_key(name: str) -> str:
    """The record key of a server broadcast or client upload extra ``name``: ``fs.`` + its
    last path part with ``_`` → ``-`` (``"h"`` → ``fs.h``, ``"fedcart/proto_head"`` →
    ``fs.proto-head``), so the strategies derive their records from the algorithms' own
    declarations instead of a table."""
    return EXTRA_PREFIX + name.rsplit("/", 1)[-1].replace("_", "-")
