"""fedshield's server algorithms and aggregators as plain Flower Message-API strategies.

For a Flower app of your own, whose ClientApp returns its model's ``state_dict`` as an
``ArrayRecord`` and a ``MetricRecord`` with ``num-examples`` (Flower's convention)::

    from fedshield.flower.strategies import BRDRAG, Krum, FedshieldRule

    strategy = BRDRAG(root_data=(x_root, y_root), model_fn=Net, c=0.5)
    strategy = Krum(f=1)
    strategy = FedshieldRule(aggregator="trimmed_mean", aggregator_args={"f": 1}, server="fedacg")
    result = strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=10)

Each strategy subclasses :class:`flwr.serverapp.strategy.FedAvg` (node sampling,
federated evaluation, metric aggregation and every keyword of its constructor are
Flower's), so Flower's wrappers compose with it — e.g.
``DifferentialPrivacyServerSideFixedClipping(Krum(f=1), noise_multiplier, clipping_norm,
num_sampled_clients)``. Only the training round differs:

1. ``configure_train`` reads θ^t from the arrays Flower hands it (so a wrapper's noise is
   kept), asks the server algorithm for its broadcast (FedACG's look-ahead model θ̂,
   SCAFFOLD's control variate h as the ``ArrayRecord`` ``fs.h``, DRAG's reference r as
   ``fs.ref`` when clients calibrate) and sends it to the sampled nodes;
2. ``aggregate_train`` decodes every reply against the model's layout
   (:class:`~fedshield.flower.arrays.ModelLayout`: keys, shapes and dtypes of every array,
   checked before decoding), forms the pseudo-gradients g_m = θ_m − θ_start (SPEC §1),
   runs the upload checks (:func:`fedshield.core.integrity.screen`: finiteness, buffer
   ranges, extras, the sample count), then the fedshield server algorithm's own
   ``update`` and ``post_step`` — the code the simulator runs — with its state (DRAG's
   reference, Centered Clipping's centre, FedACG's momentum, SCAFFOLD's h) kept across
   rounds. A step that is not finite keeps θ^t; rejected replies are counted as
   ``sys/rejected/<reason>`` in the returned ``MetricRecord``.

**Sample counts** (SPEC §12) are self-reported, so they are untrusted: ``weighting``
``"uniform"`` ignores them (the default when the rule is a Byzantine defense; every rule
then sees count 1, so RFA is the uniform geometric median), ``"samples"`` weights by them
(the default otherwise), capped at ``max_num_examples`` when set (``sys/capped_num_examples``
counts the replies that claimed more).

**Root data** (BR-DRAG, FLTrust and any rule that needs a reference): either
``reference_fn(arrays) -> ArrayRecord`` — your own server-side training of the global
model (``arrays``) on your root data, returning the trained model; a ``server_round``
keyword is passed when the function takes one — or ``root_data=(x, y)`` with
``model_fn()`` building the model, trained by fedshield's local SGD (``root_train``:
``lr``, ``batch_size``, ``steps`` or ``epochs``, ``momentum``, ``weight_decay``) with the
mini-batches the simulator draws for the same ``seed``. r^t = θ_root − θ^t (SPEC §3).

FedCART (:class:`FedCART`) broadcasts which head its prototypes are of (``fs.proto-head``)
and receives ``fs.prototypes`` / ``fs.counts`` / ``fs.head-shape`` (one-array records,
checked against the shapes of ``model_fn()``'s DualHead before decoding) from clients that
use :class:`fedshield.flower.client_tools.FedCARTTrainer`.

Not supported: client coverage masks (depth/width-limited clients) and update attacks
(simulated by fedshield's own app, ``fedshield run --backend flower``). See
docs/flower-strategies.md.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from pydantic import Field
from torch import Tensor, nn

from fedshield.aggregators.base import AGGREGATORS
from fedshield.aggregators.fields import is_robust
from fedshield.algorithms.client import LocalSpec
from fedshield.algorithms.client.base import ClientContext
from fedshield.algorithms.client.fedcart import (
    COUNTS,
    HEAD_SHAPE,
    PROTO_HEAD,
    PROTOTYPES,
    upload_fields,
)
from fedshield.algorithms.server import SERVER_ALGORITHMS, ServerAlgorithm
from fedshield.core.context import (
    ClientUpdate,
    Payload,
    RoundContext,
    derive_seed,
    make_generator,
    seed_global_rng,
)
from fedshield.core.flat import float_buffers
from fedshield.core.integrity import FieldSpec, UploadSpec, screen
from fedshield.core.params import Params, parse_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.flower.arrays import ModelLayout, RecordError, decode_tensor, encode_tensor
from fedshield.flower.client_tools import (
    COUNTS_RECORD,
    DH,
    DRAG_C,
    EXTRA_PREFIX,
    HEAD_SHAPE_RECORD,
    PROTO_HEAD_RECORD,
    PROTOTYPES_RECORD,
    REF,
    H,
)

# The purposes the simulator mixes into the root-data seeds (fedshield.sim.engine), so a
# Flower run with root_data= draws the same mini-batches as `fedshield run` with that seed.
from fedshield.sim.engine import _ROOT, _TORCH

log = logging.getLogger("fedshield")

#: extras each server algorithm must broadcast for its client part
_BROADCAST = {"scaffold": ("h",), "fedcart": (PROTO_HEAD,)}
#: extras each server algorithm's client part uploads (checked by the upload screen)
_UPLOADS = {"scaffold": ("dh",), "fedcart": (PROTOTYPES, COUNTS, HEAD_SHAPE)}
_RECORD_OF = {
    "h": H, "ref": REF, "dh": DH, PROTO_HEAD: PROTO_HEAD_RECORD,
    PROTOTYPES: PROTOTYPES_RECORD, COUNTS: COUNTS_RECORD, HEAD_SHAPE: HEAD_SHAPE_RECORD,
}  # fmt: skip
_NAME_OF = {record: name for name, record in _RECORD_OF.items()}
#: extras keyed like the model's parameters (the others are one-array tensor records)
_PARAM_SHAPED = {"h", "ref", "dh"}


class RootTrainParams(Params):
    """Local SGD of the server on its root data (SPEC §3: the workers' η and batch size)."""

    lr: float = Field(0.05, gt=0.0, description="SGD step size η")
    batch_size: int = Field(32, ge=1, description="mini-batch size")
    steps: int | None = Field(10, ge=1, description="U SGD steps (unless epochs is set)")
    epochs: int | None = Field(None, ge=1, description="E passes over the root data")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: float = Field(0.0, ge=0.0, description="SGD weight decay")


def _given(**kwargs: Any) -> dict[str, Any]:
    """The keyword arguments that were set (None: the registry's default)."""
    return {k: v for k, v in kwargs.items() if v is not None}


# -- the server's root-data reference ----------------------------------------------------
class _NoRoot:
    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        raise ConfigError("this rule needs a root-data reference: pass reference_fn or root_data")


class _FunctionReference:
    """r^t from the user's own server-side training: ``fn(arrays) -> ArrayRecord``."""

    def __init__(self, fn: Callable[..., ArrayRecord], owner: FedshieldRule) -> None:
        self.fn = fn
        self.owner = owner
        try:
            self.takes_round = "server_round" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            self.takes_round = False

    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        layout, rnd = self.owner.layout, self.owner._round
        assert layout is not None and rnd is not None
        arrays = layout.encode(params, buffers, rnd.passed)
        out = self.fn(arrays, server_round=ctx.round) if self.takes_round else self.fn(arrays)
        if not isinstance(out, ArrayRecord):
            raise TypeError(f"reference_fn must return an ArrayRecord, got {type(out).__name__}")
        try:
            p, b = layout.decode(out)
        except RecordError as err:
            raise ValueError(f"reference_fn returned a record unlike the model's ({err})") from None
        p, b = p.to(params.device), b.to(params.device)
        return ClientUpdate(-1, p - params, 0, b)


class _DataReference:
    """r^t = θ^{t,U} − θ^t from fedshield's local SGD on ``root_data`` (SPEC §3, eqs. 12–13),
    seeded by (seed, round) exactly as the simulator's ``Simulator.root_update``."""

    def __init__(
        self,
        data: TensorData,
        model_fn: Callable[[], nn.Module],
        spec: LocalSpec,
        seed: int,
        device: torch.device,
    ) -> None:
        from fedshield.algorithms.client.sgd import LocalSGD

        self.data = data.to(device)
        self.model = model_fn().to(device)
        self.trainer = LocalSGD(spec)
        self.seed = seed
        self.device = device

    def check(self, layout: ModelLayout) -> None:
        """The model's parameters and floating buffers are the record's, in its order."""
        names = [n for n, _ in self.model.named_parameters()]
        if names != layout.param_keys:
            raise ConfigError(
                f"model_fn's parameters {names[:4]}... are not the model record's "
                f"{layout.param_keys[:4]}... (pass ArrayRecord(model.state_dict()))"
            )
        bufs = [n for n, b in self.model.named_buffers() if b.is_floating_point()]
        if bufs != layout.buffer_keys or len(float_buffers(self.model)) != len(bufs):
            raise ConfigError(
                f"model_fn's floating buffers {bufs[:4]} are not the record's buffers "
                f"{layout.buffer_keys[:4]} (set buffer_keys)"
            )

    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        g = ClientContext(-1, ctx.round, make_generator(self.seed, ctx.round, _ROOT), self.device)
        seed_global_rng(derive_seed(self.seed, ctx.round, _ROOT, _TORCH), self.device)
        return self.trainer.local_update(self.model, Payload(params, buffers), self.data, g, {})


def _tensor(a: Any, dtype: torch.dtype | None = None) -> Tensor:
    t = a if isinstance(a, Tensor) else torch.as_tensor(np.asarray(a))
    return t.to(dtype) if dtype is not None else t


# -- one round's context, between configure_train and aggregate_train --------------------
@dataclass
class _Round:
    server_round: int
    params: Tensor  # θ^t
    buffers: Tensor
    passed: dict[str, np.ndarray]  # non-floating arrays of θ^t, returned as they were
    payload: Payload  # what was broadcast (the start point of local training)
    num_clients: int  # M, for SCAFFOLD's h ← h + (1/M) Σ Δh
    calibrated: bool  # the clients received r and calibrated locally (DRAG)


class FedshieldRule(FlowerFedAvg):
    """Any fedshield server algorithm with any aggregator, as a Flower strategy.

    ``aggregator`` / ``aggregator_args``: a rule of ``fedshield list aggregators`` (default:
    the server algorithm's own, e.g. ``brdrag`` for ``server="brdrag"``, else ``mean``);
    ``server`` / ``server_args``: a server algorithm (``fedavg``, ``drag``, ``brdrag``,
    ``fltrust``, ``fedexp``, ``fedacg``, ``scaffold``), both validated through the registry
    (a :class:`~fedshield.errors.ConfigError` names the bad key). ``server_lr``: η_g.
    ``weighting``, ``max_num_examples``, ``reference_fn``, ``root_data``, ``model_fn``,
    ``root_train`` and ``seed``: see the module docstring. ``buffer_keys``: the floating
    arrays that are running statistics (default: the ``*running_mean`` / ``*running_var``
    arrays, or the floating buffers of ``model_fn()``'s model). ``num_clients``: M for
    SCAFFOLD (default: the nodes connected). ``client_calibration`` (DRAG only): broadcast r
    and the DoD scale c so clients calibrate locally
    (:func:`fedshield.flower.client_tools.drag_calibrate_local`); the server then only
    averages. Every other keyword goes to :class:`flwr.serverapp.strategy.FedAvg`.
    """

    def __init__(
        self,
        aggregator: str | None = None,
        aggregator_args: Mapping[str, Any] | None = None,
        server: str = "fedavg",
        server_args: Mapping[str, Any] | None = None,
        *,
        server_lr: float = 1.0,
        weighting: str | None = None,
        max_num_examples: int | None = None,
        reference_fn: Callable[..., ArrayRecord] | None = None,
        root_data: tuple[Any, Any] | None = None,
        model_fn: Callable[[], nn.Module] | None = None,
        root_train: Mapping[str, Any] | None = None,
        seed: int = 0,
        buffer_keys: Collection[str] | None = None,
        num_clients: int | None = None,
        client_calibration: bool = False,
        device: str | torch.device = "cpu",
        **flower_kwargs: Any,
    ) -> None:
        super().__init__(**flower_kwargs)
        entry = SERVER_ALGORITHMS.entry(server, "server")
        if entry.tag_values("needs_client") - set(_UPLOADS):
            raise ConfigError(
                f"server={server!r} needs fedshield's own client algorithm "
                f"({', '.join(sorted(entry.tag_values('needs_client')))}); it is not offered as "
                "a Flower-native strategy: run it with fedshield's Flower app "
                "(fedshield run --backend flower, docs/deployment.md)"
            )
        agg_name = aggregator if aggregator is not None else entry.obj.default_aggregator
        agg_entry = AGGREGATORS.entry(agg_name, "aggregator")
        agg_params = agg_entry.parse(dict(aggregator_args or {}), "aggregator_args")
        rule = agg_entry.obj(**agg_params.kwargs())
        for tag in entry.tag_values("needs_aggregator"):
            if not (agg_entry.has(tag) or getattr(agg_entry.obj, tag, False) is True):
                raise ConfigError(
                    f"server={server!r} needs an aggregator tagged {tag!r} (e.g. drag, brdrag, "
                    f"fltrust), got aggregator={agg_name!r}"
                )
        if weighting not in (None, "samples", "uniform"):
            raise ConfigError(f"weighting={weighting!r}: expected 'samples' or 'uniform'")
        self.weighting = weighting or ("uniform" if is_robust(rule) else "samples")
        if not (isinstance(server_lr, int | float) and math.isfinite(server_lr) and server_lr > 0):
            raise ConfigError(f"server_lr={server_lr!r}: expected a finite number > 0")
        if max_num_examples is not None and (
            isinstance(max_num_examples, bool)
            or not isinstance(max_num_examples, int)
            or max_num_examples < 0
        ):
            raise ConfigError(f"max_num_examples={max_num_examples!r}: expected an integer >= 0")
        if num_clients is not None and (not isinstance(num_clients, int) or num_clients < 1):
            raise ConfigError(f"num_clients={num_clients!r}: expected an integer >= 1")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seed={seed!r}: expected an integer")
        params = entry.parse(dict(server_args or {}), "server_args")
        self.server: ServerAlgorithm = entry.obj(
            rule, lr=float(server_lr), weighting=self.weighting, params=params
        )
        self.server_name, self.aggregator_name = server, agg_name
        self.max_num_examples = max_num_examples
        self.num_clients = num_clients
        self.seed = seed
        self.device = torch.device(device)
        self.buffer_keys = None if buffer_keys is None else tuple(buffer_keys)

        self.broadcast_extras = _BROADCAST.get(server, ())
        self.upload_extras = _UPLOADS.get(server, ())
        #: shapes of the uploaded extras that are not parameter-shaped (FedCART's)
        self.extra_fields: dict[str, FieldSpec] = {}
        if server == "fedcart":
            if model_fn is None:
                raise ConfigError(
                    "server='fedcart' needs model_fn, a function building the clients' "
                    "DualHead model (its head shape fixes the prototypes' shape)"
                )
            self.extra_fields = dict(upload_fields(model_fn()))
        self.local_server: ServerAlgorithm | None = None
        if client_calibration:
            if server != "drag" or agg_name != "drag":
                raise ConfigError(
                    "client_calibration=True is DRAG's local calibration (server='drag' with "
                    f"aggregator='drag'), not server={server!r} with aggregator={agg_name!r}"
                )
            self.broadcast_extras += ("ref",)
            # Clients upload v_m (eq. 11) already calibrated towards r^t; the server then
            # only averages them and updates r: the drag rule with c = 0 is that mean.
            self.local_server = entry.obj(
                rule.replace(c=0.0), lr=float(server_lr), weighting=self.weighting, params=params
            )

        self.services: Any = _NoRoot()
        self._data_ref: _DataReference | None = None
        if reference_fn is not None and root_data is not None:
            raise ConfigError("pass either reference_fn or root_data, not both")
        if root_data is not None:
            if model_fn is None:
                raise ConfigError("root_data needs model_fn, a function building the model")
            x, y = root_data
            data = TensorData(_tensor(x), _tensor(y, torch.int64))
            p = parse_params(RootTrainParams, dict(root_train or {}), "root_train")
            spec = LocalSpec(**p.kwargs())
            self._data_ref = _DataReference(data, model_fn, spec, seed, self.device)
            self.services = self._data_ref
            if self.buffer_keys is None:
                model = self._data_ref.model
                self.buffer_keys = tuple(
                    n for n, b in model.named_buffers() if b.is_floating_point()
                )
        elif root_train is not None:
            raise ConfigError("root_train configures root_data's training; root_data is unset")
        elif reference_fn is not None:
            self.services = _FunctionReference(reference_fn, self)
        if self.server.needs_root and isinstance(self.services, _NoRoot):
            raise ConfigError(
                f"server={server!r} with aggregator={agg_name!r} needs the server's root-data "
                "reference r^t: pass reference_fn=<your server-side training> or "
                "root_data=(x, y) with model_fn=<model factory>"
            )

        self.layout: ModelLayout | None = None
        #: the server algorithm's state (checkpoint it to resume a run)
        self.state: dict[str, Tensor] = {}
        self._round: _Round | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(server={self.server_name!r}, aggregator="
            f"{self.server.aggregator!r}, weighting={self.weighting!r})"
        )

    def summary(self) -> None:
        log.info(
            "fedshield strategy: server=%s aggregator=%r weighting=%s max_num_examples=%s",
            self.server_name,
            self.server.aggregator,
            self.weighting,
            self.max_num_examples,
        )
        super().summary()

    # -- configure ----------------------------------------------------------------------
    def _start_round(self, server_round: int, arrays: ArrayRecord, num_nodes: int) -> _Round:
        layout = ModelLayout.of(arrays, self.buffer_keys)
        first = self.layout is None
        if first:
            if self._data_ref is not None:
                self._data_ref.check(layout)
            self.layout = layout
        elif layout != self.layout:
            raise ConfigError("the global model's arrays changed between rounds")
        try:
            params, buffers = layout.decode(arrays)
        except RecordError as err:
            raise ConfigError(f"the global model record is malformed ({err})") from None
        params, buffers = params.to(self.device), buffers.to(self.device)
        if first and not self.state:  # a state set by the caller (a resumed run) is kept
            self.state = self.server.init_state(params)
        m = self.num_clients or num_nodes
        ctx = RoundContext(server_round, (), (), self.seed, m, self.device)
        payload = self.server.broadcast(params, buffers, self.state, ctx)
        calibrated = self.local_server is not None and "ref" in payload.extras
        return _Round(
            server_round, params, buffers, layout.pass_through(arrays), payload, m, calibrated
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes (Flower's FedAvg) and send them the server algorithm's broadcast."""
        rnd = self._start_round(server_round, arrays, len(list(grid.get_node_ids())))
        self._round = rnd
        layout = self.layout
        assert layout is not None
        p = rnd.payload
        send = arrays
        if not (torch.equal(p.params, rnd.params) and torch.equal(p.buffers, rnd.buffers)):
            send = layout.encode(p.params, p.buffers, rnd.passed)  # FedACG's look-ahead θ̂
        if rnd.calibrated:
            config[DRAG_C] = float(self.server.aggregator.c)  # type: ignore[attr-defined]
        messages = list(super().configure_train(server_round, send, config, grid))
        extras = {
            _RECORD_OF[name]: (
                layout.encode_params(p.extras[name])
                if name in _PARAM_SHAPED
                else encode_tensor(p.extras[name])
            )
            for name in self.broadcast_extras
            if name in p.extras
        }
        for msg in messages:
            for key, record in extras.items():
                msg.content[key] = record
        return messages

    # -- aggregate ----------------------------------------------------------------------
    def _count(self, content: RecordDict) -> Any:
        for record in content.metric_records.values():
            if self.weighted_by_key in record:
                return record[self.weighted_by_key]
        return None

    def _decode(self, msg: Message, rnd: _Round) -> tuple[ClientUpdate, bool]:
        """The reply as a ClientUpdate (g relative to the broadcast start) and whether its
        count was capped; raises RecordError with the rejection reason."""
        layout = self.layout
        assert layout is not None
        content = msg.content
        records = content.array_records
        model = records.get(self.arrayrecord_key)
        if model is None:
            others = [r for k, r in records.items() if not k.startswith(EXTRA_PREFIX)]
            if len(others) != 1:
                raise RecordError("malformed", "no model ArrayRecord in the reply")
            model = others[0]
        params, buffers = layout.decode(model)
        params, buffers = params.to(self.device), buffers.to(self.device)
        extras: dict[str, Tensor] = {}
        for key, record in records.items():
            if not key.startswith(EXTRA_PREFIX):
                continue
            name = _NAME_OF.get(key, key[len(EXTRA_PREFIX) :])
            if name not in self.upload_extras:
                raise RecordError("extra_unexpected", f"record {key!r}")
            try:
                if name in _PARAM_SHAPED:
                    value = layout.decode_params(record)
                else:
                    value = decode_tensor(record, self.extra_fields[name].shape, f"extra_{name}")
                extras[name] = value.to(self.device)
            except RecordError as err:
                raise RecordError(f"extra_{name}", str(err)) from None
        n = self._count(content)
        capped = False
        if n is None:
            if self.weighting != "uniform":
                raise RecordError("num_examples", f"no {self.weighted_by_key!r} in the reply")
            n = 1
        cap = self.max_num_examples
        if (
            cap is not None
            and isinstance(n, int | float)
            and not isinstance(n, bool)
            and math.isfinite(n)
            and n > cap
        ):
            n, capped = cap, True
        delta = params - rnd.payload.params
        node = int(msg.metadata.src_node_id)
        return ClientUpdate(node, delta, n, buffers, extras=extras), capped

    def _upload_spec(self) -> UploadSpec:
        layout = self.layout
        assert layout is not None
        return UploadSpec(
            num_params=layout.num_params,
            dtype=layout.dtype,
            num_buffers=layout.num_buffers,
            buffer_min=layout.buffer_lower_bounds(),
            extras={
                name: self.extra_fields.get(name) or FieldSpec((layout.num_params,))
                for name in self.upload_extras
            },
            max_num_examples=self.max_num_examples,
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, run the server algorithm's step, return θ^{t+1} and metrics."""
        rnd = self._round
        if rnd is None or rnd.server_round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without its configure_train")
        layout = self.layout
        assert layout is not None
        replies = sorted(replies, key=lambda m: m.metadata.src_node_id)
        failures, capped = 0, 0
        rejected: Counter[str] = Counter()
        updates: list[ClientUpdate] = []
        by_node: dict[int, Message] = {}
        for msg in replies:
            if msg.has_error():
                failures += 1
                continue
            try:
                u, was_capped = self._decode(msg, rnd)
            except RecordError as err:
                rejected[err.reason] += 1
                log.warning("rejected the reply of node %s (%s)", msg.metadata.src_node_id, err)
                continue
            capped += was_capped
            updates.append(u)
            by_node[u.client_id] = msg
        screened = screen(updates, self._upload_spec())
        rejected.update(screened.rejected)
        kept = screened.kept
        if self.weighting == "uniform":  # self-reported counts are not used at all
            kept = [replace(u, num_examples=1) for u in kept]
        metrics: dict[str, float] = {"sys/rejected": float(sum(rejected.values()))}
        metrics |= {f"sys/rejected/{k}": float(v) for k, v in sorted(rejected.items())}
        metrics |= {"sys/kept": float(len(kept)), "sys/failures": float(failures)}
        if capped:
            metrics["sys/capped_num_examples"] = float(capped)
        metrics |= self._client_metrics(kept, by_node)
        if not kept:
            log.warning("round %d: no valid reply; θ unchanged", server_round)
            metrics["sys/skipped"] = 1.0
            return None, MetricRecord(metrics)

        server = self.server if not rnd.calibrated else self.local_server
        assert server is not None
        cohort = tuple(u.client_id for u in kept)
        ctx = RoundContext(server_round, cohort, (), self.seed, rnd.num_clients, self.device)
        step = server.update(rnd.params, rnd.buffers, self.state, kept, ctx, self.services)
        step = server.post_step(step, ctx, self.services)
        metrics |= {k: float(v) for k, v in step.metrics.items()}
        bad = [n for n, t in (("params", step.params), ("buffers", step.buffers)) if _bad(t)]
        bad += [f"state.{k}" for k, v in step.state.items() if _bad(v)]
        if bad:
            # Never release a non-finite model: keep θ^t and the server state.
            log.warning("round %d: non-finite %s after the step; θ unchanged", server_round, bad)
            metrics["sys/nonfinite_step"] = 1.0
            return None, MetricRecord(metrics)
        self.state = dict(step.state)
        return layout.encode(step.params, step.buffers, rnd.passed), MetricRecord(metrics)

    def _client_metrics(
        self, kept: list[ClientUpdate], by_node: dict[int, Message]
    ) -> dict[str, float]:
        """The clients' own metrics (train loss, ...) through ``train_metrics_aggr_fn``,
        weighted by the screened counts (1 each under uniform weighting)."""
        contents = []
        for u in kept:
            records = list(by_node[u.client_id].content.metric_records.values())
            if not records:
                continue
            values = {
                k: v
                for k, v in records[0].items()
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            }
            values[self.weighted_by_key] = int(u.num_examples)
            contents.append(RecordDict({"metrics": MetricRecord(values)}))
        if not contents:
            return {}
        try:
            out = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        except Exception as err:  # clients disagree on their metric keys: report none
            log.warning("client metrics not aggregated (%s)", err)
            return {}
        return {k: float(v) for k, v in out.items() if isinstance(v, int | float)}


def _bad(t: Tensor) -> bool:
    return isinstance(t, Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())


# -- named strategies ----------------------------------------------------------------------
# Each fixes the server algorithm or the aggregator (and takes the other from **kwargs);
# a hyper-parameter left None takes the registry's default.


class DRAG(FedshieldRule):
    """DRAG (SPEC §2): calibrate every g_m towards the momentum reference r^t (eqs. 8–11)."""

    def __init__(
        self,
        alpha: float | None = None,
        c: float | None = None,
        *,
        client_calibration: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            aggregator=kwargs.pop("aggregator", "drag"),
            aggregator_args=_given(c=c) | dict(kwargs.pop("aggregator_args", {})),
            server="drag",
            server_args=_given(alpha=alpha),
            client_calibration=client_calibration,
            **kwargs,
        )


class BRDRAG(FedshieldRule):
    """BR-DRAG (SPEC §3): root-data reference r^t, updates rescaled to ‖r‖ and pulled
    towards r (eq. 15). Needs ``reference_fn`` or ``root_data`` + ``model_fn``."""

    def __init__(self, c: float | None = None, **kwargs: Any) -> None:
        super().__init__(
            aggregator="brdrag", aggregator_args=_given(c=c), server="brdrag", **kwargs
        )


class FLTrust(FedshieldRule):
    """FLTrust (SPEC §5): ReLU-cosine trust scores against the root-data reference.
    Needs ``reference_fn`` or ``root_data`` + ``model_fn``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(aggregator="fltrust", server="fltrust", **kwargs)


class FedExP(FedshieldRule):
    """FedExP (SPEC §4): extrapolated server step η_g = max{1, Σ‖g‖²/(2S(‖Δ‖² + ε))}."""

    def __init__(self, eps: float | None = None, **kwargs: Any) -> None:
        super().__init__(server="fedexp", server_args=_given(eps=eps), **kwargs)


class FedACG(FedshieldRule):
    """FedACG (SPEC §4): broadcast the look-ahead θ̂ = θ + λm; m ← λm + Δ. Clients train
    from the arrays they receive (θ̂); add β/2‖θ − θ̂‖² to their loss for the full method."""

    def __init__(self, lam: float | None = None, **kwargs: Any) -> None:
        super().__init__(server="fedacg", server_args=_given(lam=lam), **kwargs)


class SCAFFOLD(FedshieldRule):
    """SCAFFOLD (SPEC §4): broadcasts h (``fs.h``); clients correct their gradients with
    :class:`fedshield.flower.client_tools.ScaffoldClient` and upload Δh (``fs.dh``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(server="scaffold", **kwargs)


class FedCART(FedshieldRule):
    """FedCART's server (SPEC §7): the configured rule on Δθ and, class by class, on the
    clients' gradient prototypes, then the CART step (virtual features matched to the
    prototypes, h' re-trained on them). ``model_fn`` builds the clients' ``DualHead``
    model; clients train with :class:`fedshield.flower.client_tools.FedCARTTrainer`.
    ``server_args``: the FedCART server parameters (``match_iters``, ``retrain_steps``,
    ``num_virtual``, ``cart``, ``aux_head``, ...)."""

    def __init__(self, model_fn: Callable[[], nn.Module], **kwargs: Any) -> None:
        super().__init__(server="fedcart", model_fn=model_fn, **kwargs)


class Krum(FedshieldRule):
    """Krum (Blanchard et al. 2017): the update closest to its S − f − 2 neighbours."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="krum", aggregator_args=_given(f=f), **kwargs)


class MultiKrum(FedshieldRule):
    """Multi-Krum: the mean of the m updates with the best Krum scores."""

    def __init__(self, f: int | None = None, m: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="multikrum", aggregator_args=_given(f=f, m=m), **kwargs)


class Median(FedshieldRule):
    """Coordinate-wise median (Yin et al. 2018)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(aggregator="median", **kwargs)


class TrimmedMean(FedshieldRule):
    """Coordinate-wise trimmed mean (Yin et al. 2018): drop the f largest and f smallest."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="trimmed_mean", aggregator_args=_given(f=f), **kwargs)


class Bulyan(FedshieldRule):
    """Bulyan with Krum (El Mhamdi et al. 2018), S ≥ 4f + 3."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="bulyan", aggregator_args=_given(f=f), **kwargs)


class _GeoMedFamily(FedshieldRule):
    _rule = "geomed"

    def __init__(
        self,
        nu: float | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        init: str | None = None,
        **kwargs: Any,
    ) -> None:
        args = _given(nu=nu, max_iter=max_iter, tol=tol, init=init)
        super().__init__(aggregator=self._rule, aggregator_args=args, **kwargs)


class GeoMed(_GeoMedFamily):
    """Geometric median by smoothed Weiszfeld (SPEC §5), weighted as ``weighting`` says."""


class RFA(_GeoMedFamily):
    """RFA (Pillutla et al. 2022): the geometric median weighted by the sample counts
    (uniform under ``weighting="uniform"``, the default for a robust rule)."""

    _rule = "rfa"


class RAGA(_GeoMedFamily):
    """RAGA: the uniform geometric median (SPEC §5)."""

    _rule = "raga"


class CenteredClipping(FedshieldRule):
    """Centered Clipping (Karimireddy et al. 2021): clip around the previous aggregate,
    kept in the strategy's state across rounds."""

    def __init__(self, tau: float | None = None, iters: int | None = None, **kwargs: Any) -> None:
        args = _given(tau=tau, iters=iters)
        super().__init__(aggregator="centered_clipping", aggregator_args=args, **kwargs)


class NormClip(FedshieldRule):
    """Norm clipping: clip every update to norm τ, then the mean."""

    def __init__(self, tau: float | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="norm_clip", aggregator_args=_given(tau=tau), **kwargs)


__all__ = [
    "BRDRAG",
    "DRAG",
    "RAGA",
    "RFA",
    "SCAFFOLD",
    "Bulyan",
    "CenteredClipping",
    "FLTrust",
    "FedACG",
    "FedCART",
    "FedExP",
    "FedshieldRule",
    "GeoMed",
    "Krum",
    "Median",
    "MultiKrum",
    "NormClip",
    "RootTrainParams",
    "TrimmedMean",
]
