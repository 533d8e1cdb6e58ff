"""The adapter: any fedshield server algorithm × any aggregator as a Flower strategy.

:class:`FedshieldRule` subclasses :class:`flwr.serverapp.strategy.FedAvg` (node sampling,
federated evaluation, metric aggregation and every keyword of its constructor are
Flower's); the named strategies built on it are in :mod:`fedshield.flower.catalogue`, and
both are imported from :mod:`fedshield.flower.strategies`. Only the training round differs:

1. ``configure_train`` reads θ^t from the arrays Flower hands it (so a wrapper's noise is
   kept), asks the server algorithm for its broadcast — the payload's extras as records
   ``fs.<name>`` (:func:`fedshield.flower.keys.record_key`), FedACG's look-ahead θ̂ as the
   arrays — and keeps the instructions it sends;
2. ``aggregate_train`` keeps one reply per sampled node answering its own instruction
   (:mod:`fedshield.flower.replies`), decodes each against the model's layout
   (:class:`~fedshield.flower.arrays.ModelLayout`: keys, shapes and dtypes checked before
   decoding) into g_m = θ_m − θ_start (DRAG paper, Sec. II-A), then runs the one server round step
   of every backend (:func:`fedshield.algorithms.server.step.server_round_step`: upload
   checks, capped weights, ``update``, ``post_step``, the finiteness guard) with the
   server state kept across rounds in ``strategy.state``.

What the clients upload besides θ is derived from the server algorithm's declaration: the
``upload_spec`` of the client algorithm it needs (tag ``needs_client``), sized from
``model_fn()`` or from the model record.

**Sample counts** (docs/security.md) are self-reported, so untrusted: ``weighting="uniform"``
ignores them (the default under a Byzantine defense), ``"samples"`` weights by them, capped at
``max_num_examples`` when set and, under a robust rule, at ``count_cap`` × the round's
median count.

**f belongs to the sampled cohort**: a robust rule outvotes the f of the nodes
*asked* this round — its own ``f``, else ``byzantine_f``, else its breakdown on the sampled
cohort — however many replies arrive. Missing, late or duplicated replies (a node that did
not answer, an id forged to censor it) never lower f; when too few replies are kept for
it, θ is not moved (``sys/skipped/too_few``). A reply's node id is not trusted here, so a
rejected reply does not lower f either.

**Root data** (BR-DRAG, FLTrust and any rule that needs a reference): either
``reference_fn(arrays) -> ArrayRecord`` — your own server-side training of the global
model (``arrays``) on your root data, returning the trained model; a ``server_round``
keyword is passed when the function takes one — or ``root_data=(x, y)`` with
``model_fn()`` building the model, trained by fedshield's local SGD (``root_train``:
``lr``, ``batch_size``, ``steps`` or ``epochs``, ``momentum``, ``weight_decay``) with the
mini-batches the simulator draws for the same ``seed``. r^t = θ_root − θ^t (DRAG paper, Sec. IV).

Not supported: client coverage masks (depth/width-limited clients) and update attacks
(simulated by fedshield's own app, ``fedshield run --backend flower``). See
docs/flower-strategies.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MetricRecord,
    MetricRecordValues,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from pydantic import Field
from torch import Tensor, nn

from fedshield.aggregators.base import AGGREGATORS
from fedshield.aggregators.fields import is_robust
from fedshield.algorithms.client import CLIENT_ALGORITHMS, LocalSpec
from fedshield.algorithms.client.base import root_round
from fedshield.algorithms.server import SERVER_ALGORITHMS, ServerAlgorithm, ServerRound
from fedshield.algorithms.server.step import COUNT_CAP, server_round_step
from fedshield.core.callables import accepts
from fedshield.core.context import (
    ClientUpdate,
    Payload,
    RoundContext,
)
from fedshield.core.flat import float_buffers
from fedshield.core.integrity import FieldSpec, UploadSpec
from fedshield.core.params import Params, parse_params
from fedshield.core.state_check import check_scale, check_table
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.flower.arrays import ModelLayout, RecordError, decode_tensor, encode_tensor
from fedshield.flower.keys import DRAG_C, EXTRA_PREFIX, record_key
from fedshield.flower.replies import match_replies

log = logging.getLogger("fedshield")

class RootTrainParams(Params):
    """Local SGD of the server on its root data (DRAG paper, Sec. IV: the workers' η and batch
    size)."""

    lr: float = Field(0.05, gt=0.0, description="SGD step size η")
    batch_size: int = Field(32, ge=1, description="mini-batch size")
    steps: int | None = Field(10, ge=1, description="U SGD steps (unless epochs is set)")
    epochs: int | None = Field(None, ge=1, description="E passes over the root data")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: float = Field(0.0, ge=0.0, description="SGD weight decay")


# -- the server's root-data reference ----------------------------------------------------
class _NoRoot:
    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        raise ConfigError("this rule needs a root-data reference: pass reference_fn or root_data")


class _FunctionReference:
    """r^t from the user's own server-side training: ``fn(arrays) -> ArrayRecord``."""

    def __init__(self, fn: Callable[..., ArrayRecord], owner: FedshieldRule) -> None:
        self.fn = fn
        self.owner = owner
        self.takes_round = accepts(fn, "server_round")

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
    """r^t = θ^{t,U} − θ^t from fedshield's local SGD on ``root_data`` (DRAG paper, eqs. 12–13),
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
        self.model = _quietly(model_fn).to(device)
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
        root = root_round(Payload(params, buffers), self.data, self.seed, ctx.round, self.device)
        return self.trainer.local_update(self.model, root)


def _tensor(a: Any, dtype: torch.dtype | None = None) -> Tensor:
    t = a if isinstance(a, Tensor) else torch.as_tensor(np.asarray(a))
    return t.to(dtype) if dtype is not None else t


def _quietly(model_fn: Callable[[], nn.Module]) -> nn.Module:
    """``model_fn()`` without consuming torch's global RNG: the user's next ``Net()`` is the
    one it would have been without the strategy."""
    with torch.random.fork_rng(devices=[]):
        return model_fn()


def _client_part(server: str, names: Collection[str]) -> Any:
    """The client algorithm a server algorithm declares it needs (tag ``needs_client``),
    built with its defaults, whose ``upload_spec`` says what its clients upload; None when
    the server reads only Δθ."""
    if not names:
        return None
    if len(names) > 1:
        raise ConfigError(f"server={server!r} declares several client parts {sorted(names)}")
    (name,) = names
    cls = CLIENT_ALGORITHMS.get(name)
    return cls(LocalSpec(lr=0.1, batch_size=1, steps=1), cls.params_schema())


class _StandIn(nn.Module):
    """Parameters of the record's shapes on the meta device (no memory): what a client
    part's ``upload_spec`` reads when no ``model_fn`` was given."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.params = nn.ParameterList(
            nn.Parameter(torch.empty(s, device="meta")) for s in shapes
        )


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
    ``root_train``, ``seed`` and ``byzantine_f`` (the f of the sampled nodes a robust rule
    without ``f`` outvotes; default its breakdown on them): see the module docstring.
    ``buffer_keys``: the floating arrays that are running statistics (default: the
    ``*running_mean`` / ``*running_var`` arrays, or the floating buffers of ``model_fn()``'s
    model). ``num_clients``: M for
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
        count_cap: float | None = COUNT_CAP,
        round_offset: int = 0,
        byzantine_f: int | None = None,
        **flower_kwargs: Any,
    ) -> None:
        from fedshield.flower.metric_records import robust_metricrecords

        # Client-reported metrics are untrusted: their median, not Flower's weighted mean.
        for key in ("train_metrics_aggr_fn", "evaluate_metrics_aggr_fn"):
            if flower_kwargs.get(key) is None:
                flower_kwargs[key] = robust_metricrecords
        super().__init__(**flower_kwargs)
        from fedshield.plugins import load_plugins

        load_plugins()  # the fedshield.plugins entry points: a plugin rule is named like ours
        entry = SERVER_ALGORITHMS.entry(server, "server")
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
        if byzantine_f is not None and (
            not isinstance(byzantine_f, int) or isinstance(byzantine_f, bool) or byzantine_f < 0
        ):
            raise ConfigError(f"byzantine_f={byzantine_f!r}: expected an integer >= 0")
        params = entry.parse(dict(server_args or {}), "server_args")
        self.server: ServerAlgorithm = entry.obj(
            rule, lr=float(server_lr), weighting=self.weighting, params=params
        )
        self.server.byzantine_f = byzantine_f
        self.server_name, self.aggregator_name = server, agg_name
        self.max_num_examples = max_num_examples
        self.num_clients = num_clients
        self.seed = seed
        self.device = torch.device(device)
        self.buffer_keys = None if buffer_keys is None else tuple(buffer_keys)

        self.count_cap = count_cap
        self.round_offset = round_offset
        self._model_fn = model_fn
        #: the client algorithm whose uploads the server algorithm reads (tag needs_client)
        self._client_algorithm = _client_part(server, entry.tag_values("needs_client"))
        #: extras the clients upload, with their shapes (from the client part's declaration)
        self.extra_fields: dict[str, FieldSpec] = {}
        if self._client_algorithm is not None and model_fn is not None:
            self.extra_fields = self._client_algorithm.upload_spec(_quietly(model_fn))
        elif self._client_algorithm is not None:
            self._check_needs_model(server)
        #: broadcast extras sent only to clients that use them (DRAG's r: local calibration)
        self.optional_broadcast = set(getattr(entry.obj, "optional_broadcast", ()))
        self.local_server: ServerAlgorithm | None = None
        if client_calibration:
            if server != "drag" or agg_name != "drag":
                raise ConfigError(
                    "client_calibration=True is DRAG's local calibration (server='drag' with "
                    f"aggregator='drag'), not server={server!r} with aggregator={agg_name!r}"
                )
            self.optional_broadcast.discard("ref")
            # Clients upload v_m (eq. 11) already calibrated towards r^t; the server then
            # only averages them and updates r: the drag rule with c = 0 is that mean.
            self.local_server = entry.obj(
                rule.replace(c=0.0), lr=float(server_lr), weighting=self.weighting, params=params
            )
            self.local_server.byzantine_f = byzantine_f

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

        #: set by :func:`fedshield.flower.privacy.central_dp`: ε(δ) after n rounds
        self.privacy_epsilon: Callable[[int], float] | None = None
        self.requires_no_buffers = False
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

    def _check_needs_model(self, server: str) -> None:
        """Refuse at construction a client part whose uploads cannot be sized without the
        clients' model (FedCART's prototypes: the DualHead's head shape)."""
        try:
            self._client_algorithm.upload_spec(_StandIn([(1,)]))
        except ConfigError as err:
            raise ConfigError(
                f"server={server!r} needs model_fn, a function building the clients' model: "
                f"its uploads are shaped by it ({err})"
            ) from None

    def _upload_fields(self, layout: ModelLayout) -> dict[str, FieldSpec]:
        """The extras clients upload, sized from ``model_fn()`` or from the record."""
        if self._client_algorithm is None:
            return {}
        if not self.extra_fields:
            stand_in = _StandIn([s.shape for s in layout.params])
            self.extra_fields = self._client_algorithm.upload_spec(stand_in)
        return self.extra_fields

    def _param_shaped(self, spec: FieldSpec) -> bool:
        layout = self.layout
        assert layout is not None
        return spec.shape == (layout.num_params,) and spec.dtype is None

    def _check_state(self, params: Tensor) -> None:
        """A state set by the caller (a resumed run) is checked like an upload, by the one
        state checker (:mod:`fedshield.core.state_check`): keys the server algorithm
        declares (:meth:`ServerAlgorithm.state_spec`, keys created after round 1
        included) with their shapes and dtypes, finite values, and θ-shaped state within
        ``MAX_SCALE`` × ‖θ‖ (a FedACG momentum of 1e30 stepped θ by 1.8e31)."""
        spec = self.server.state_spec(params)
        state = check_table("strategy.state", self.state, spec, error=ConfigError)
        for key, value in state.items():
            if tuple(value.shape) == tuple(params.shape):
                check_scale(f"strategy.state[{key!r}]", value, params, error=ConfigError)
        self.state = {k: v.to(self.device) for k, v in state.items()}

    # -- configure ----------------------------------------------------------------------
    def _start_round(self, server_round: int, arrays: ArrayRecord, num_nodes: int) -> _Round:
        layout = ModelLayout.of(arrays, self.buffer_keys)
        first = self.layout is None
        if first:
            if self._data_ref is not None:
                self._data_ref.check(layout)
            if self.requires_no_buffers and layout.num_buffers:
                raise ConfigError(
                    f"central_dp: the model has buffers {layout.buffer_keys[:3]} (BatchNorm "
                    "statistics) that the server would average without noise"
                )
            self.layout = layout
        elif layout != self.layout:
            raise ConfigError("the global model's arrays changed between rounds")
        try:
            params, buffers = layout.decode(arrays)
        except RecordError as err:
            raise ConfigError(f"the global model record is malformed ({err})") from None
        params, buffers = params.to(self.device), buffers.to(self.device)
        if first and not self.state:
            self.state = self.server.init_state(params)
        elif first:  # a state set by the caller (a resumed run) is kept, once checked
            self._check_state(params)
        m = self.num_clients or num_nodes
        # Flower counts rounds from 1 in every session: a resumed run continues its streams.
        rnd = server_round + self.round_offset
        ctx = RoundContext(rnd, (), (), self.seed, m, self.device)
        payload = self.server.broadcast(params, buffers, self.state, ctx)
        calibrated = self.local_server is not None and "ref" in payload.extras
        passed = layout.pass_through(arrays)
        return _Round(server_round, params, buffers, passed, payload, m, calibrated)

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
            record_key(name): (
                layout.encode_params(t) if t.shape == rnd.params.shape else encode_tensor(t)
            )
            for name, t in p.extras.items()
            if name not in self.optional_broadcast
        }
        for msg in messages:
            for key, record in extras.items():
                msg.content[key] = record
        # Kept to match each reply to its own instruction (Flower's grids set message ids
        # on these objects when they push them).
        self._sent = messages
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
        fields = self._upload_fields(layout)
        by_key = {record_key(name): name for name in fields}
        extras: dict[str, Tensor] = {}
        for key, record in records.items():
            if not key.startswith(EXTRA_PREFIX):
                continue
            name = by_key.get(key)
            if name is None:
                raise RecordError("extra_unexpected", f"record {key!r}")
            spec = fields[name]
            try:
                if self._param_shaped(spec):
                    value = layout.decode_params(record)
                else:
                    value = decode_tensor(record, spec.shape, f"extra_{name}")
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
            extras=self._upload_fields(layout),
            max_num_examples=self.max_num_examples,
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Match the replies to this round's instructions, decode them, then the one server
        round step (screen → weights → rule → server step → guard); θ^{t+1} and metrics."""
        rnd = self._round
        if rnd is None or rnd.server_round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without its configure_train")
        matched = match_replies(replies, self._sent)
        rejected = matched.rejected
        capped = 0
        updates: list[ClientUpdate] = []
        by_node: dict[int, Message] = {}
        for msg in matched.replies:
            try:
                u, was_capped = self._decode(msg, rnd)
            except RecordError as err:
                rejected[err.reason] += 1
                log.warning("rejected the reply of node %s (%s)", msg.metadata.src_node_id, err)
                continue
            capped += was_capped
            updates.append(u)
            by_node[u.client_id] = msg
        server = self.server if not rnd.calibrated else self.local_server
        assert server is not None
        asked = tuple(sorted(int(m.metadata.dst_node_id) for m in self._sent))
        ctx = RoundContext(
            server_round + self.round_offset, asked, (), self.seed, rnd.num_clients, self.device
        )
        start = ServerRound(rnd.params, rnd.buffers, self.state, updates, ctx, self.services)
        out = server_round_step(
            server,
            start,
            self._upload_spec(),
            count_cap=self.count_cap,
            uniform_counts=self.weighting == "uniform",
            rejected_before=rejected,
            trusted_ids=False,  # a forged node id must not lower f (module docstring)
        )
        metrics: dict[str, MetricRecordValues] = {
            **out.metrics,
            "sys/failures": float(len(matched.failures)),
        }
        if capped:
            metrics["sys/capped_num_examples"] = float(capped)
        metrics |= self._client_metrics(out.kept, by_node)
        if self.privacy_epsilon is not None:
            metrics["privacy/epsilon"] = self.privacy_epsilon(server_round + self.round_offset)
        if not out.applied:
            return None, MetricRecord(metrics)
        self.state = dict(out.state)
        assert self.layout is not None
        return self.layout.encode(out.params, out.buffers, rnd.passed), MetricRecord(metrics)

    def _client_metrics(
        self, kept: list[ClientUpdate], by_node: dict[int, Message]
    ) -> dict[str, float]:
        """The clients' own metrics (train loss, ...) through ``train_metrics_aggr_fn``
        (by default their median, :mod:`fedshield.flower.metric_records`), with the
        screened counts (1 each under uniform weighting); a non-finite result is dropped."""
        contents = []
        for u in kept:
            records = list(by_node[u.client_id].content.metric_records.values())
            if not records:
                continue
            values: dict[str, MetricRecordValues] = {
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
        return {
            k: float(v)
            for k, v in out.items()
            if isinstance(v, int | float) and math.isfinite(float(v))
        }
