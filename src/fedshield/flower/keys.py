"""Record keys of the fedshield Flower app's messages (see :mod:`fedshield.flower.codec`).

A module of its own, free of torch, so that a ClientApp process answering the discovery
query (a fresh process per message on a SuperNode) starts in about a second.
"""

PAYLOAD, TASK = "fs.payload", "fs.task"
UPDATE, METRICS, INFO = "fs.update", "fs.metrics", "fs.info"
CLIENT_STATE = "fs.client-state"
HELLO, NODE = "fs.hello", "fs.node"  # discovery query / reply (partition id of a node)
NUM_EXAMPLES = "num-examples"  # Flower's conventional weight key, kept for its tooling
