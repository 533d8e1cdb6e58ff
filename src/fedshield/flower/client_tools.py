"""Client-side parts of fedshield's Flower-native strategies, for your own ClientApp.

Most strategies of :mod:`fedshield.flower.strategies` need nothing on the client: train,
return ``ArrayRecord(model.state_dict())`` and ``MetricRecord({"num-examples": n})``.
Two methods have a client part, and both reuse fedshield's own code for it:

* **SCAFFOLD** (DRAG paper, Sec. VI-A) — :class:`ScaffoldClient`: the strategy broadcasts the server
  control variate h as the ``ArrayRecord`` ``fs.h`` (keyed like the model's parameters);
  the helper adds h − h_m to every gradient before the optimizer step and, after training,
  refreshes the client's h_m (kept in ``context.state``) and returns Δh_m as the
  ``ArrayRecord`` ``fs.dh`` to add to the reply. The math is
  :class:`fedshield.algorithms.client.scaffold.ScaffoldClient`'s (variants ``seed`` and
  ``option2``)::

      model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
      scaffold = ScaffoldClient(model, msg, context)
      for x, y in batches:
          opt.zero_grad(); F.cross_entropy(model(x), y).backward()
          scaffold.correct()
          opt.step()
      content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                            "metrics": MetricRecord({"num-examples": n}),
                            **scaffold.reply()})

* **DRAG's local calibration** (DRAG paper, Sec. III: "let the Flower client optionally do it
  locally") — :func:`drag_calibrate_local`: with ``DRAG(client_calibration=True)`` the
  strategy broadcasts r^t (``fs.ref``) and c (config key ``fs.drag-c``) from round 2 on;
  after local training the helper replaces the model's parameters by θ^t + v_m, v_m of
  eq. 11 (:func:`fedshield.aggregators.drag_calibrate`), and the server only averages.

* **FedCART** (FedCART paper) — :class:`FedCARTTrainer`: fedshield's own FedCART client (L_CART
  training of (r, h) with PGD examples, then the per-class gradient prototypes of h' at the
  *received* model) on your data and your :class:`~fedshield.models.dual_head.DualHead`
  model; :meth:`FedCARTTrainer.train` returns the reply's records (the trained model, the
  metrics with ``num-examples``, and ``fs.prototypes`` / ``fs.counts`` / ``fs.head-shape``).
  With the same seed it draws the simulator's mini-batches and PGD starts, so the upload is
  the one ``fedshield run`` computes for that client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from torch import Tensor, nn

from fedshield.aggregators.drag import drag_calibrate
from fedshield.algorithms.client.base import (
    ClientAlgorithm,
    ClientContext,
    ClientRound,
    LocalSpec,
    hand_round,
)
from fedshield.algorithms.client.fedcart import (
    COUNTS,
    HEAD_SHAPE,
    PROTO_HEAD,
    PROTOTYPES,
    FedCARTClient,
    FedCARTParams,
)
from fedshield.algorithms.client.scaffold import ScaffoldClient as _FedshieldScaffold
from fedshield.algorithms.client.scaffold import ScaffoldParams
from fedshield.core.context import (
    ClientUpdate,
    Payload,
    derive_seed,
    make_generator,
    seed_global_rng,
)
from fedshield.core.flat import get_buffers, get_params, set_buffers, set_params
from fedshield.core.params import parse_params

# The purposes the simulator mixes into a client's seeds (fedshield.sim.engine), so the
# FedCART trainer draws the simulator's mini-batches and PGD starts for the same seed.
from fedshield.core.seeds import BATCH as _BATCH
from fedshield.core.seeds import TORCH as _TORCH
from fedshield.data.bundle import TensorData
from fedshield.flower.arrays import decode_tensor, encode_tensor
from fedshield.flower.keys import DRAG_C, EXTRA_PREFIX, record_key

# Record keys derived from the algorithms' own names, as the strategies derive them.
H = record_key("h")  #: SCAFFOLD's server control variate h (broadcast)
DH = record_key("dh")  #: SCAFFOLD's Δh_m (uploaded)
REF = record_key("ref")  #: DRAG's reference r^t (broadcast with client_calibration=True)
PROTO_HEAD_RECORD = record_key(PROTO_HEAD)  #: FedCART: which head the prototypes are of
PROTOTYPES_RECORD = record_key(PROTOTYPES)  #: FedCART's gradient prototypes [C, C·D + C]
COUNTS_RECORD = record_key(COUNTS)  #: FedCART's class counts [C] (uploaded)
HEAD_SHAPE_RECORD = record_key(HEAD_SHAPE)  #: FedCART's (C, D) (uploaded)
SCAFFOLD_STATE = "fs.scaffold-h"  #: the client's h_m in ``context.state``


def _param_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def flat_params(record: Mapping[str, Array], model: nn.Module) -> Tensor:
    """A record keyed like ``model``'s parameters as one flat vector in parameter order."""
    names = _param_names(model)
    missing = [n for n in names if n not in record]
    if missing:
        raise KeyError(f"the record lacks the model's parameters {missing[:3]}")
    like = next(model.parameters())
    parts = [torch.from_numpy(np.asarray(record[n].numpy())).reshape(-1) for n in names]
    return torch.cat(parts).to(like.device, like.dtype)


def param_record(vec: Tensor, model: nn.Module) -> ArrayRecord:
    """A flat parameter-shaped vector as a record keyed like ``model``'s parameters."""
    out, offset = {}, 0
    flat = vec.detach().cpu()
    for name, p in model.named_parameters():
        n = p.numel()
        out[name] = Array(flat[offset : offset + n].reshape(p.shape).numpy().copy())
        offset += n
    return ArrayRecord(out)


#: A spec for building an algorithm before its step size is known (only to ask it
#: :meth:`~fedshield.algorithms.client.base.ClientAlgorithm.reads_step_size`).
_ANY_SPEC = LocalSpec(lr=1.0, batch_size=1, steps=1)


def step_size(lr: float | None, algorithm: ClientAlgorithm, what: str) -> float:
    """The local step size η for ``algorithm``'s ``finish`` in a user's loop: ``lr`` as
    given (a finite number > 0), required when the algorithm reads it
    (:meth:`ClientAlgorithm.reads_step_size`: SCAFFOLD option II's Δθ/(Uη) would be 1/η
    off with a stand-in), else an unread stand-in of 1."""
    if lr is not None:
        ok = isinstance(lr, int | float) and not isinstance(lr, bool) and math.isfinite(lr)
        if not (ok and lr > 0):
            raise ValueError(f"lr={lr!r}: expected the optimizer's step size, a number > 0")
        return float(lr)
    if algorithm.reads_step_size():
        raise ValueError(
            f"{what} divides by the local step size: pass lr=<your optimizer's learning rate>"
        )
    return 1.0


class ScaffoldClient:
    """SCAFFOLD's client part in a user's training loop (see the module docstring).

    Build it after loading the received model into ``model`` (θ^t is read from it).
    ``variant="seed"`` (the DRAG paper's form, the default): h_m⁺ = the gradient of the first
    mini-batch at θ^t; ``"option2"`` (the original paper's option II, needs ``lr``):
    h_m⁺ = h_m − h + (θ^t − θ_m)/(U η), U = the number of :meth:`correct` calls.
    """

    def __init__(
        self,
        model: nn.Module,
        msg: Message,
        context: Context,
        *,
        variant: str = "seed",
        lr: float | None = None,
    ) -> None:
        if H not in msg.content.array_records:
            raise ValueError(
                f"the train message carries no {H!r} record: is the server strategy "
                "fedshield.flower.strategies.SCAFFOLD?"
            )
        self.model = model
        self.context = context
        self.params = ScaffoldParams.model_validate({"variant": variant})  # checks the variant
        self.lr = step_size(lr, _FedshieldScaffold(_ANY_SPEC, self.params), f"variant={variant!r}")
        self.start = get_params(model)
        h = flat_params(msg.content.array_records[H], model)
        self.payload = Payload(self.start, self.start.new_zeros(0), {"h": h})
        self.state: dict[str, Tensor] = {}
        saved = context.state.array_records.get(SCAFFOLD_STATE)
        if saved is not None:
            self.state["h"] = flat_params(saved, model)
        self.round = hand_round(self.payload, self.state)
        self.steps = 0

    def _algorithm(self) -> _FedshieldScaffold:
        spec = LocalSpec(lr=self.lr, batch_size=1, steps=max(self.steps, 1))
        return _FedshieldScaffold(spec, self.params)

    def correct(self) -> None:
        """g ← g + h − h_m on every parameter's gradient; call it between
        ``loss.backward()`` and ``optimizer.step()``."""
        self._algorithm().adjust_grads(self.model, self.round, [], self.steps)
        self.steps += 1

    def reply(self) -> dict[str, ArrayRecord]:
        """``{"fs.dh": Δh_m}`` for the reply's RecordDict; stores h_m⁺ in ``context.state``."""
        if self.steps == 0:
            raise RuntimeError("ScaffoldClient.correct() was never called")
        delta = get_params(self.model) - self.start
        update = ClientUpdate(0, delta, 0, delta.new_zeros(0))
        out = self._algorithm().finish(self.model, update, self.round)
        self.context.state[SCAFFOLD_STATE] = param_record(self.state["h"], self.model)
        return {DH: param_record(out.extras["dh"], self.model)}


class AlgorithmClient:
    """Any fedshield client algorithm's gradient correction and upload in a user's own
    training loop (FedDyn's, SCAFFOLD's, FedProx's ...): the algorithm's own pieces
    (:meth:`ClientAlgorithm.adjust_grads` / :meth:`ClientAlgorithm.finish`), not a copy.

    The payload is θ^t (read from ``model`` after the received arrays are loaded) and the
    broadcast extras the algorithm declares it reads (``payload_extras``), from the records
    ``fs.<name>`` (:func:`fedshield.flower.keys.record_key`): a record keyed like the
    model's parameters is a parameter-shaped extra, a one-array record a tensor. The
    client's state lives in ``context.state`` (lost when a SuperNode restarts; fedshield's
    own app keeps it in a file). ``lr``: your optimizer's step size, required by an
    algorithm whose upload divides by it (SCAFFOLD ``variant="option2"``:
    :meth:`ClientAlgorithm.reads_step_size`), refused if not a number > 0. ::

        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        part = AlgorithmClient("feddyn", model, msg, context)
        for x, y in batches:
            opt.zero_grad(); F.cross_entropy(model(x), y).backward()
            part.correct()
            opt.step()
        reply = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                            "metrics": MetricRecord({"num-examples": n}), **part.reply()})
    """

    def __init__(
        self,
        algorithm: str,
        model: nn.Module,
        msg: Message,
        context: Context,
        *,
        lr: float | None = None,
        **params: object,
    ) -> None:
        from fedshield.algorithms.client import CLIENT_ALGORITHMS

        entry = CLIENT_ALGORITHMS.entry(algorithm, "algorithm")
        self.algorithm = entry.obj(_ANY_SPEC, entry.parse(dict(params), "params"))
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        self.lr = step_size(lr, self.algorithm, f"client algorithm {algorithm!r}({shown})")
        self.model = model
        self.context = context
        self.start = get_params(model)
        names = set(_param_names(model))
        extras: dict[str, Tensor] = {}
        for name in type(self.algorithm).payload_extras:
            record = msg.content.array_records.get(record_key(name))
            if record is None:
                raise ValueError(
                    f"the train message carries no {record_key(name)!r} record, which "
                    f"client algorithm {algorithm!r} reads: is the strategy its server's?"
                )
            if set(record) == names:
                value = flat_params(record, model)
            else:
                value = torch.from_numpy(np.array(next(iter(record.values())).numpy()))
            extras[name] = value.to(self.start.device)
        self.payload = Payload(self.start, self.start.new_zeros(0), extras)
        self._state_key = f"{EXTRA_PREFIX}{algorithm}-state"
        self.state: dict[str, Tensor] = {}
        saved = context.state.array_records.get(self._state_key)
        if saved is not None:
            self.state = {k: torch.from_numpy(np.array(a.numpy())) for k, a in saved.items()}
        self.round = hand_round(self.payload, self.state)
        self.steps = 0

    def correct(self) -> None:
        """The algorithm's gradient correction on ``model``'s ``p.grad``; call it between
        ``loss.backward()`` and ``optimizer.step()``."""
        self.algorithm.adjust_grads(self.model, self.round, [], self.steps)
        self.steps += 1

    def reply(self) -> dict[str, ArrayRecord]:
        """The algorithm's extras for the reply (``fs.<name>``); its state kept in
        ``context.state``."""
        delta = get_params(self.model) - self.start
        update = ClientUpdate(0, delta, 0, delta.new_zeros(0))
        # finish() reads the number of steps taken from the spec (steps given: no data needed).
        self.algorithm.spec = LocalSpec(lr=self.lr, batch_size=1, steps=max(self.steps, 1))
        out = self.algorithm.finish(self.model, update, self.round)
        self.context.state[self._state_key] = ArrayRecord(
            {k: Array(v.detach().cpu().numpy()) for k, v in self.state.items()}
        )
        return {
            record_key(name): (
                param_record(v, self.model) if v.shape == self.start.shape else encode_tensor(v)
            )
            for name, v in out.extras.items()
        }


def drag_calibrate_local(
    model: nn.Module, msg: Message, arrays_key: str = "arrays"
) -> dict[str, float]:
    """DRAG's calibration on the client (DRAG paper, eqs. 10–11): when ``msg`` carries r^t,
    set ``model``'s parameters to θ^t + v_m with v_m = (1 − λ) g + λ (‖g‖/‖r‖) r,
    g = θ_m − θ^t, λ = c (1 − cos(g, r)). Returns ``{"drag/lambda", "drag/cos"}`` (empty
    in round 1, before the server has a reference, when the server calibrates itself).
    Call it after local training, before building the reply."""
    ref = msg.content.array_records.get(REF)
    if ref is None:
        return {}
    c = None
    for record in msg.content.config_records.values():
        if DRAG_C in record:
            c = float(record[DRAG_C])  # type: ignore[arg-type]
    if c is None:
        raise ValueError(f"the message carries {REF!r} but no {DRAG_C!r} in its config")
    start = flat_params(msg.content.array_records[arrays_key], model)
    r = flat_params(ref, model)
    g = get_params(model) - start
    v, lam, cos = drag_calibrate(g, r, c)
    set_params(model, start + v)
    return {"drag/lambda": float(lam), "drag/cos": float(cos)}


class FedCARTTrainer:
    """FedCART's client part in your ClientApp (see the module docstring)::

        trainer = FedCARTTrainer(lr=0.02, batch_size=32, local_steps=10, seed=0)

        @app.train()
        def train(msg, context):
            model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
            pid = int(context.node_config["partition-id"])
            return Message(trainer.train(model, msg, x, y, pid), reply_to=msg)

    ``local_steps`` or ``local_epochs``, ``momentum``, ``weight_decay``: the local SGD;
    every other keyword is a FedCART client parameter (``fedshield list client_algorithms``:
    ``eps``, ``steps``, ``tau``, ``at_loss``, ...), validated like a config. ``seed`` and the
    partition id fix the mini-batch order and the PGD starts, as the simulator's
    (seed, round, client) streams do."""

    def __init__(
        self,
        *,
        lr: float,
        batch_size: int,
        local_steps: int | None = 10,
        local_epochs: int | None = None,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        seed: int = 0,
        **params: object,
    ) -> None:
        steps = None if local_epochs is not None else local_steps
        spec = LocalSpec(lr, batch_size, steps, local_epochs, momentum, weight_decay)
        self.algo = FedCARTClient(spec, parse_params(FedCARTParams, dict(params), "fedcart"))
        self.seed = seed

    def train(
        self,
        model: nn.Module,
        msg: Message,
        x: Tensor,
        y: Tensor,
        partition_id: int,
        arrays_key: str = "arrays",
    ) -> RecordDict:
        """Train ``model`` (already holding the received θ^t) on (x, y) and return the
        reply's content; the model ends with the locally trained weights."""
        rnd = 1
        for record in msg.content.config_records.values():
            if "server-round" in record:
                rnd = int(record["server-round"])  # type: ignore[arg-type]
        device = next(model.parameters()).device
        extras: dict[str, Tensor] = {}
        flag = msg.content.array_records.get(PROTO_HEAD_RECORD)
        if flag is not None:
            extras[PROTO_HEAD] = decode_tensor(flag, (), "proto_head").to(device)
        payload = Payload(get_params(model), get_buffers(model), extras)
        seed_global_rng(derive_seed(self.seed, rnd, partition_id, _TORCH), device)
        ctx = ClientContext(
            partition_id, rnd, make_generator(self.seed, rnd, partition_id, _BATCH), device
        )
        data = TensorData(x, y.to(torch.int64))
        upd = self.algo.local_update(model, ClientRound(payload, data, {}, ctx))
        # finish() left the received model in place (prototypes are taken at θ^t)
        set_params(model, payload.params + upd.delta)
        set_buffers(model, upd.buffers)
        records: dict[str, object] = {
            arrays_key: ArrayRecord(model.state_dict()),
            "metrics": MetricRecord(
                {
                    "num-examples": int(upd.num_examples),
                    **{k: float(v) for k, v in upd.metrics.items()},
                }
            ),
        }
        for name, key in (
            (PROTOTYPES, PROTOTYPES_RECORD), (COUNTS, COUNTS_RECORD),
            (HEAD_SHAPE, HEAD_SHAPE_RECORD),
        ):  # fmt: skip
            if name in upd.extras:
                records[key] = encode_tensor(upd.extras[name])
        return RecordDict(records)  # type: ignore[arg-type]


__all__ = [
    "AlgorithmClient",
    "COUNTS_RECORD",
    "HEAD_SHAPE_RECORD",
    "PROTOTYPES_RECORD",
    "PROTO_HEAD_RECORD",
    "FedCARTTrainer",
    "DH",
    "DRAG_C",
    "EXTRA_PREFIX",
    "H",
    "REF",
    "SCAFFOLD_STATE",
    "ScaffoldClient",
    "drag_calibrate_local",
    "flat_params",
    "param_record",
]
