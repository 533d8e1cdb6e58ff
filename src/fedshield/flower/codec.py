"""fedshield values ↔ Flower records (the wire format of the Flower app).

Tensors travel as :class:`flwr.app.Array` (NumPy ``.npy`` bytes, exact for every dtype), so
a payload decoded on a SuperNode is bit-identical to the one the simulator hands a client.
Names inside an :class:`~flwr.app.ArrayRecord` are flat strings; method extras (reference
direction, control variates, prototypes) are namespaced ``extra/<name>``.

Message layout (keys of the :class:`~flwr.app.RecordDict`):

* train instruction: ``fs.payload`` (ArrayRecord: ``params``, ``buffers``, ``extra/*``) and
  ``fs.task`` (ConfigRecord: round, client id, role flags, the resolved config TOML);
* train reply: ``fs.update`` (ArrayRecord: ``delta``, ``buffers``, ``mask``, ``extra/*``),
  ``fs.metrics`` (MetricRecord: ``num-examples`` and the client's metrics) and ``fs.info``
  (ConfigRecord: ``client-id``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from fedshield.core.context import ClientUpdate, Payload
from fedshield.flower.keys import (
    CLIENT_STATE,
    HELLO,
    INFO,
    METRICS,
    NODE,
    NUM_EXAMPLES,
    PAYLOAD,
    TASK,
    UPDATE,
)

_EXTRA = "extra/"


def to_array(t: Tensor) -> Array:
    # np.require, not np.ascontiguousarray: the latter turns a 0-d tensor (FedCART's
    # prototype request) into shape (1,).
    return Array.from_numpy_ndarray(np.require(t.detach().cpu().numpy(), requirements="C"))


def from_array(a: Array, device: torch.device | str = "cpu") -> Tensor:
    # np.load returns a fresh writable array, so from_numpy shares nothing with the record.
    return torch.from_numpy(a.numpy()).to(device)


def tensors_to_record(tensors: dict[str, Tensor]) -> ArrayRecord:
    """A dict of tensors as an ArrayRecord (insertion order kept)."""
    record = ArrayRecord()
    for name, t in tensors.items():
        record[name] = to_array(t)
    return record


def record_to_tensors(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    return {name: from_array(a, device) for name, a in record.items()}


def _split_extras(tensors: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    core = {k: v for k, v in tensors.items() if not k.startswith(_EXTRA)}
    extras = {k[len(_EXTRA) :]: v for k, v in tensors.items() if k.startswith(_EXTRA)}
    return core, extras


# -- server → client ------------------------------------------------------------------


def encode_payload(payload: Payload) -> ArrayRecord:
    tensors = {"params": payload.params, "buffers": payload.buffers}
    tensors.update({_EXTRA + k: v for k, v in payload.extras.items()})
    return tensors_to_record(tensors)


def decode_payload(record: ArrayRecord, device: torch.device | str = "cpu") -> Payload:
    core, extras = _split_extras(record_to_tensors(record, device))
    return Payload(core["params"], core["buffers"], extras)


@dataclass(frozen=True)
class Task:
    """What a SuperNode must do this round, beyond the payload."""

    round: int
    client_id: int
    byzantine: bool  # this node is a selected attacker this round (A^t)
    train: bool  # False: an attacker whose row the strategy overwrites; send zeros
    local_attack: bool  # apply the configured row-local update attack to the own update
    config_toml: str  # the fully resolved experiment config (single source of truth)
    run_key: str  # names this run's client state in the node's Context.state

    @property
    def state_key(self) -> str:
        return f"{CLIENT_STATE}.{self.run_key}"

    def to_record(self) -> ConfigRecord:
        return ConfigRecord(
            {
                "round": self.round,
                "client-id": self.client_id,
                "byzantine": self.byzantine,
                "train": self.train,
                "local-attack": self.local_attack,
                "config": self.config_toml,
                "run-key": self.run_key,
            }
        )

    @classmethod
    def from_record(cls, rec: ConfigRecord) -> Task:
        return cls(
            round=int(rec["round"]),  # type: ignore[arg-type]  # a record value: int
            client_id=int(rec["client-id"]),  # type: ignore[arg-type]
            byzantine=bool(rec["byzantine"]),
            train=bool(rec["train"]),
            local_attack=bool(rec["local-attack"]),
            config_toml=str(rec["config"]),
            run_key=str(rec["run-key"]),
        )


def train_content(payload: ArrayRecord, task: Task) -> RecordDict:
    return RecordDict({PAYLOAD: payload, TASK: task.to_record()})


# -- client → server ------------------------------------------------------------------


def encode_update(update: ClientUpdate) -> RecordDict:
    tensors = {"delta": update.delta, "buffers": update.buffers}
    if update.mask is not None:
        tensors["mask"] = update.mask
    tensors.update({_EXTRA + k: v for k, v in update.extras.items()})
    metrics = MetricRecord({NUM_EXAMPLES: int(update.num_examples)})
    for name, value in update.metrics.items():
        metrics[name] = float(value)
    return RecordDict(
        {
            UPDATE: tensors_to_record(tensors),
            METRICS: metrics,
            INFO: ConfigRecord({"client-id": int(update.client_id)}),
        }
    )


def decode_update(content: RecordDict, device: torch.device | str = "cpu") -> ClientUpdate:
    core, extras = _split_extras(record_to_tensors(content.array_records[UPDATE], device))
    metrics = dict(content.metric_records[METRICS])
    n = int(metrics.pop(NUM_EXAMPLES))  # type: ignore[arg-type]  # a record value: int
    return ClientUpdate(
        client_id=int(content.config_records[INFO]["client-id"]),  # type: ignore[arg-type]
        delta=core["delta"],
        num_examples=n,
        buffers=core["buffers"],
        mask=core.get("mask"),
        extras=extras,
        metrics={k: float(v) for k, v in metrics.items()},  # type: ignore[arg-type]
    )


def global_model(params: Tensor, buffers: Tensor) -> ArrayRecord:
    """θ as Flower's ``Result.arrays`` holds it (two flat vectors, fedshield's layout)."""
    return tensors_to_record({"params": params, "buffers": buffers})


__all__ = [
    "CLIENT_STATE",
    "HELLO",
    "INFO",
    "METRICS",
    "NODE",
    "NUM_EXAMPLES",
    "PAYLOAD",
    "TASK",
    "UPDATE",
    "Task",
    "decode_payload",
    "decode_update",
    "encode_payload",
    "encode_update",
    "global_model",
    "record_to_tensors",
    "tensors_to_record",
    "train_content",
]
