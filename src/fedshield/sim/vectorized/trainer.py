"""The batched cohort trainer: a round's clients trained as one computation (SPEC §1).

For a chunk of C clients the parameters, buffers and SGD momentum are stacked on a
leading client axis; every local step is one ``vmap(grad(loss))`` call over the clients
(the model runs with each client's parameters swapped in: :class:`.modules.Slots`, what
``torch.func.functional_call`` does) followed by the SGD update on the stacked tensors.
What makes it the sequential computation:

* mini-batches: each client's own ``batch_indices`` stream from its (seed, round, client)
  generator — the same index sequence; clients whose batches differ in size at a step
  (unequal data, the partial last batch of an epoch) run as separate groups of that
  size, so every loss sees exactly the client's batch (BatchNorm statistics, batch means);
* local epochs on unequal data: a client whose steps are done is left out of later steps;
* randomness: dropout masks and attack starts replay each client's global-RNG stream
  (:mod:`.rng`);
* SGD: ``torch.optim.SGD``'s single-tensor update (weight decay, then momentum with the
  buffer created at the first step, then θ ← θ − η d), on [G, ...] tensors;
* BatchNorm: per-client buffers are swapped in with the parameters; train-mode forwards
  update each client's running statistics in place, as the module does.

The algorithm-specific parts are the client algorithm's own pieces (:mod:`fedshield.
algorithms.client.base`: constants, examples, objective, adjust, finish_clients), the ones
its sequential loop calls. Results agree with the sequential path to float tolerance
(batched kernels sum in another order); ``tests/test_vectorized.py`` checks it for every
algorithm that batches.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.func import vmap

from fedshield.algorithms.client.base import ClientAlgorithm, batch_indices
from fedshield.algorithms.client.pieces import Batch, ClientRound, GradStep, Trained
from fedshield.core.context import ClientUpdate, Payload, derive_seed, make_generator
from fedshield.data.bundle import TensorData
from fedshield.sim.vectorized.modules import Slots, batched_forwards
from fedshield.sim.vectorized.rng import CohortStreams, GroupDraws

if TYPE_CHECKING:
    from fedshield.sim.state import CohortHost, RoundPlan

#: functorch's notice for an op it runs per sample inside vmap (no batching rule).
_NO_BATCH_RULE = r"There is a performance drop because we have not yet implemented"


@dataclass(frozen=True)
class Layout:
    """The model's parameter and buffer tensors in flat-vector order (``core.flat``)."""

    params: tuple[tuple[str, torch.Size], ...]
    buffers: tuple[tuple[str, torch.Size, bool], ...]  # (name, shape, is floating point)

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        return cls(
            tuple((n, p.shape) for n, p in model.named_parameters()),
            tuple((n, b.shape, b.is_floating_point()) for n, b in model.named_buffers()),
        )

    def split_params(self, flat: Tensor) -> list[Tensor]:
        """Per-parameter views of a flat vector ([d]) or of a row matrix ([C, d])."""
        return _split(flat, [shape for _, shape in self.params])

    def split_float_buffers(self, flat: Tensor) -> list[Tensor]:
        return _split(flat, [shape for _, shape, f in self.buffers if f])


def _split(flat: Tensor, shapes: Sequence[torch.Size]) -> list[Tensor]:
    lead = flat.shape[:-1]
    out, offset = [], 0
    for shape in shapes:
        n = shape.numel()
        out.append(flat[..., offset : offset + n].view(*lead, *shape))
        offset += n
    return out


def _stack(t: Tensor, c: int) -> Tensor:
    return t.detach().unsqueeze(0).expand(c, *t.shape).clone()


class VectorizedTrainer:
    """Trains a round's cohort in chunks of ``chunk`` clients (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        algo: ClientAlgorithm,
        device: torch.device,
        chunk: int,
        amp: bool = False,
    ) -> None:
        self.model = model
        self.algo = algo
        self.device = device
        self.chunk = chunk
        self.amp = amp
        self.layout = Layout.of(model)
        self.slots = Slots(model)
        #: the base class's examples (none): no call, no swap of the model's tensors
        self.examples = type(algo).examples is not ClientAlgorithm.examples
        self._draws: GroupDraws | None = None
        #: Parameters the loss never reaches (set by :meth:`find_unreached`): left as
        #: broadcast, as ``torch.optim.SGD`` skips a parameter whose ``grad`` is None.
        self.unreached: frozenset[int] = frozenset()

    def find_unreached(
        self, payload: Payload, x: Tensor, y: Tensor, consts: dict[str, Tensor]
    ) -> frozenset[int]:
        """Indices of the parameters one client's loss has no gradient path to (FedCART's
        h', the unused head of a plain loss on a dual-head model), by one autograd pass
        on ``x, y`` (one client's batch; ``consts`` one client's row). Empty when the
        algorithm gives every parameter a gradient (SCAFFOLD)."""
        if self.algo.fills_missing_grads:
            return frozenset()
        start = self.layout.split_params(payload.params)
        params = [p.detach().clone().requires_grad_(True) for p in start]
        bufs = self.stacked_state(payload, payload.params.expand(1, -1).clone())[2]
        bd = [t[0] for t in bufs]
        draws = GroupDraws(None, [0], self.device)
        self._draws = draws
        algo, model, slots = self.algo, self.model, self.slots
        with batched_forwards(model, self._current_draws), self._autocast():
            b = Batch(x, y, payload, consts)
            with slots.swapped([t.detach() for t in params], bd):
                x_adv = algo.examples(model, b, draws)
            with slots.swapped(params, bd):
                loss = algo.objective(model, b, x_adv)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return frozenset(j for j, g in enumerate(grads) if g is None)

    # -- one batched gradient ----------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def grads(
        self,
        params: Sequence[Tensor],
        buffers: Sequence[Tensor],
        x: Tensor,
        y: Tensor,
        consts: dict[str, Tensor],
        payload: Payload,
        draws: GroupDraws,
        shared: bool = False,
    ) -> tuple[list[Tensor], Tensor]:
        """∇ of every client's mini-batch loss ([G, ...] per parameter) and the losses [G].
        ``buffers`` are updated in place (BatchNorm running statistics). ``shared``: the
        parameters are one unstacked start point for all clients (the first local step).

        The losses are one ``vmap`` call (forward only) on [G, ...] parameter leaves, and
        their gradients one plain autograd pass of Σ_k L_k: client k's loss reaches only
        row k, so row k of ∂(Σ_j L_j)/∂θ is ∇L_k. The backward then runs the batched
        kernels the forward recorded, without ``grad``'s per-op transform layer (about a
        third less time per call than ``vmap(grad(loss))`` on one CPU core for ``mlp``)."""
        algo, model, slots, examples = self.algo, self.model, self.slots, self.examples

        def per_client(
            p: list[Tensor],
            bufs: list[Tensor],
            x: Tensor,
            y: Tensor,
            consts: dict[str, Tensor],
            cid: Tensor,
        ) -> Tensor:
            draws.bind(cid)
            b = Batch(x, y, payload, consts)
            x_adv = None
            if examples:  # computed before the gradient: no path from the loss into them
                with slots.swapped([t.detach() for t in p], bufs):
                    x_adv = algo.examples(model, b, draws)
            with slots.swapped(p, bufs):
                return algo.objective(model, b, x_adv)

        g = x.shape[0]
        # The shared start is broadcast to [G, ...] (a view): each client's row its own leaf.
        leaves = [
            (t.detach().expand(g, *t.shape) if shared else t.detach()).requires_grad_(True)
            for t in params
        ]
        cid = torch.arange(g, device=x.device)
        # "same": the routed draws are made per client on unbatched tensors (see .rng);
        # the support probe runs with "error" so an unrouted random op cannot slip through.
        randomness = "error" if draws.check else "same"
        self._draws = draws
        with torch.enable_grad():
            with batched_forwards(self.model, self._current_draws), self._autocast():
                fn = vmap(per_client, randomness=randomness)
                with warnings.catch_warnings():
                    # An op without a batching rule (kl_div in TRADES, bincount in TAET)
                    # runs per client inside vmap: same values, and users cannot act on
                    # functorch's "performance drop" notice.
                    warnings.filterwarnings("ignore", message=_NO_BATCH_RULE, category=UserWarning)
                    loss = fn(leaves, list(buffers), x, y, consts, cid)
            grads = torch.autograd.grad(loss.sum(), leaves, allow_unused=True)
        # A parameter the loss never reaches gets no gradient: a zero one, materialised
        # (adjust and the SGD step write gradients in place).
        return [
            gr.contiguous()
            if gr is not None
            else torch.zeros(p.shape, dtype=p.dtype, device=p.device)
            for gr, p in zip(grads, leaves)
        ], loss.detach()

    def _current_draws(self) -> GroupDraws:
        assert self._draws is not None
        return self._draws

    def stacked_state(
        self, payload: Payload, params_out: Tensor
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """The start point per parameter (views of the payload); for the C clients of
        ``params_out`` ([C, d]) the parameters as views of those rows (written by the first
        step) and the buffers stacked at the broadcast values; integer counters
        (``num_batches_tracked``) come from the model, as the sequential path sees."""
        c = params_out.shape[0]
        # Buffers are separate contiguous stacks: BatchNorm's in-place running-stat update
        # under vmap does not reach a strided view; copied to buffers_out at the end.
        float_bufs = iter(self.layout.split_float_buffers(payload.buffers))
        model_bufs = dict(self.model.named_buffers())
        bufs = [
            _stack(next(float_bufs) if is_float else model_bufs[name], c)
            for name, _, is_float in self.layout.buffers
        ]
        return self.layout.split_params(payload.params), self.layout.split_params(params_out), bufs

    # -- a round -------------------------------------------------------------------------
    def train(self, sim: CohortHost, plan: RoundPlan) -> list[ClientUpdate]:
        """Every selected client's upload in cohort order. The deltas are the rows of one
        [S, d] tensor and the trained clients' buffers rows of one [S, b] tensor; attackers
        that skip training upload a zero row and the broadcast buffers, as sequentially."""
        st = sim.state
        cohort = plan.ctx.cohort
        deltas = st.params.new_empty(len(cohort), st.params.numel())
        buffers = st.buffers.new_empty(len(cohort), st.buffers.numel())
        updates: list[ClientUpdate | None] = [None] * len(cohort)
        trained = [i for i, k in enumerate(cohort) if plan.trains(k)]
        for i, k in enumerate(cohort):
            if not plan.trains(k):
                deltas[i].zero_()
                updates[i] = sim.untrained_upload(k, deltas[i])
        # Clients of equal size step with equal batch sizes: chunks ordered by size keep
        # each step's groups few and contiguous (see Rows).
        byz = plan.ctx.byzantine
        size = {i: len(sim.client_data(cohort[i], cohort[i] in byz)) for i in trained}
        trained.sort(key=size.__getitem__)
        self.model.train()
        for begin in range(0, len(trained), self.chunk):
            rows = trained[begin : begin + self.chunk]
            # Trained rows in one run (the usual case) are trained in place in the output.
            span = slice(min(rows), min(rows) + len(rows))
            run = list(range(span.start, span.stop))
            direct = rows == run
            out_p = deltas[span] if direct else deltas.new_empty(len(rows), deltas.shape[1])
            out_b = buffers[span] if direct else buffers.new_empty(len(rows), buffers.shape[1])
            chunk = self.train_chunk(sim, plan, [cohort[i] for i in rows], out_p, out_b)
            if not direct and sorted(rows) == run:
                # the run's rows in another order (sorted by size): one gather into them,
                # about twice as fast on CPU as index_copy_'s scatter
                order = torch.tensor(rows, device=deltas.device).argsort()
                torch.index_select(out_p, 0, order, out=deltas[span])
                torch.index_select(out_b, 0, order, out=buffers[span])
            elif not direct:
                index = torch.tensor(rows, device=deltas.device)
                deltas.index_copy_(0, index, out_p)
                buffers.index_copy_(0, index, out_b)
            if direct:  # the chunk's rows already are these views
                for j, i in enumerate(rows):
                    updates[i] = chunk[j]
                continue
            # unbind: every row view in one call (indexing row by row costs µs each)
            delta_rows, buffer_rows = deltas.unbind(0), buffers.unbind(0)
            for j, i in enumerate(rows):
                u = chunk[j]
                u.delta, u.buffers = delta_rows[i], buffer_rows[i]
                updates[i] = u
        assert all(u is not None for u in updates)
        return updates  # type: ignore[return-value]

    def train_chunk(
        self,
        sim: CohortHost,
        plan: RoundPlan,
        ks: Sequence[int],
        params_out: Tensor,
        buffers_out: Tensor,
    ) -> list[ClientUpdate]:
        """Train clients ``ks``; on return ``params_out`` ([C, d]) holds their deltas and
        ``buffers_out`` ([C, b]) their final floating buffers."""
        from fedshield.core.seeds import BATCH as _BATCH
        from fedshield.core.seeds import TORCH as _TORCH

        cfg, st, algo = sim.cfg, sim.state, self.algo
        spec = algo.spec
        rnd, dev = plan.ctx.round, self.device
        payload = algo.round_payload(plan.payload, rnd)
        c = len(ks)
        data = [sim.client_data(k, k in plan.ctx.byzantine) for k in ks]
        d = st.params.numel()
        states = [st.client_states.setdefault(k, algo.init_state(d)) for k in ks]
        steps = [plan.local_steps(k, spec.num_steps(len(x))) for k, x in zip(ks, data)]
        # Every client's mini-batches up front, in its stream's order: the per-step loop
        # below then only groups them (per-client Python there is paid every step).
        picks = [
            list(
                batch_indices(len(x), spec.batch_size, s, make_generator(cfg.seed, rnd, k, _BATCH))
            )
            for x, s, k in zip(data, steps, ks)
        ]
        streams = CohortStreams(lambda r: derive_seed(cfg.seed, rnd, ks[r], _TORCH), dev)

        start, params, bufs = self.stacked_state(payload, params_out)
        model_bufs = dict(self.model.named_buffers())
        counters0 = [b.clone() for b, (_, _, f) in zip(bufs, self.layout.buffers) if not f]
        consts = self.constants(payload, data, states)
        feed = _Feed(data, dev)
        momentum: list[Tensor | None] = [None] * len(params)
        total = torch.zeros(c, device=dev)
        kept: dict[str, Tensor] = {}
        adjusts = type(algo).adjust is not ClientAlgorithm.adjust

        # A step's groups are usually the previous step's (every client's batch is as large
        # as at the step before), so their Rows are kept.
        known: dict[tuple[int, ...], Rows] = {}
        for t in range(max(steps, default=0)):
            groups: dict[int, list[int]] = {}
            for r in range(c):
                if t < steps[r]:
                    groups.setdefault(len(picks[r][t]), []).append(r)
            for members in groups.values():
                key = tuple(members)
                rows = known.get(key) or known.setdefault(key, Rows(members, dev))
                # Step 0 starts every client at the broadcast θ: no stacked copy needed.
                shared = t == 0
                p_g = list(start) if shared else [rows.take(p) for p in params]
                b_g = [rows.take(b) for b in bufs]
                c_g = {key: rows.take(v) for key, v in consts.items()}
                x, y = feed.batch([picks[r][t] for r in members], rows.positions)
                draws = GroupDraws(streams, members, dev)
                g, loss = self.grads(p_g, b_g, x, y, c_g, payload, draws, shared)
                if adjusts:
                    lead = (rows.size,)
                    step = GradStep(g, p_g, start, payload, c_g, t, lead, rows.index, c, kept)
                    algo.adjust(step)
                self._sgd_step(p_g, g, momentum, rows, t, params)
                for whole, part in zip(bufs, b_g):
                    rows.put(whole, part)
                total.index_add_(0, rows.index, loss.detach().float())

        for r in range(c):
            if steps[r] == 0:  # no data in epoch mode: never written by a step
                params_out[r].copy_(payload.params)
        delta = params_out.sub_(payload.params)  # θ_k − θ_start, in place
        float_rows = [b.reshape(c, -1) for b, (_, _, f) in zip(bufs, self.layout.buffers) if f]
        if float_rows:
            torch.cat(float_rows, dim=1, out=buffers_out)
        # BatchNorm's num_batches_tracked counts every client's steps on the shared model.
        ints = [b for b, (_, _, f) in zip(bufs, self.layout.buffers) if not f]
        int_names = [n for n, _, f in self.layout.buffers if not f]
        with torch.no_grad():
            for name, b, b0 in zip(int_names, ints, counters0):
                model_bufs[name].add_((b - b0).sum(0))
        losses = total.tolist()
        delta_rows, buffer_rows = delta.unbind(0), buffers_out.unbind(0)
        updates = [
            ClientUpdate(
                client_id=k,
                delta=delta_rows[i],
                num_examples=len(data[i]),
                buffers=buffer_rows[i],
                metrics={"train/loss": losses[i] / max(steps[i], 1)},
            )
            for i, k in enumerate(ks)
        ]
        trained = Trained(self.model, payload, data, states, steps, spec, dev, streams.draws, kept)
        algo.finish_clients(trained, updates)
        return updates

    def constants(
        self, payload: Payload, data: Sequence[TensorData], states: Sequence[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        """Every client's :meth:`ClientAlgorithm.constants`, stacked on a client axis."""
        if type(self.algo).constants is ClientAlgorithm.constants:  # none: no call per client
            return {}
        rows = [
            self.algo.constants(self.model, ClientRound(payload, d, s, self.device))
            for d, s in zip(data, states)
        ]
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]} if rows else {}

    def _sgd_step(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        momentum: list[Tensor | None],
        rows: Rows,
        step: int,
        targets: list[Tensor],
    ) -> None:
        """``torch.optim.SGD``'s single-tensor update (dampening 0, no Nesterov) on a
        group: d = ∇ + λθ; b = d at the first step, else b ← μb + d; θ ← θ − ηb.

        ``params`` are the group's values (``rows.take`` of ``targets``, the chunk's
        [C, ...] parameters, or at step 0 the shared start); the results land in
        ``targets``. Momentum buffers are [C, ...] over the chunk."""
        spec = self.algo.spec
        lr, mom, wd = spec.lr, spec.momentum, spec.weight_decay
        c = targets[0].shape[0]
        own: list[tuple[int, Tensor, Tensor]] = []
        with torch.no_grad():
            for j, (p, g) in enumerate(zip(params, grads)):
                if j in self.unreached:  # SGD skips it (grad None): θ stays the broadcast one
                    if p.dim() != targets[j].dim():  # step 0: the rows are not written yet
                        rows.put(targets[j], p.expand_as(rows.take(targets[j])))
                    continue
                d_p = g.add(p, alpha=wd) if wd != 0 else g
                if mom != 0:
                    if step == 0:  # every client takes its first step at t = 0
                        buf = d_p.detach().clone()
                        if rows.size == c:
                            momentum[j] = buf
                        else:
                            if momentum[j] is None:
                                momentum[j] = buf.new_zeros(c, *buf.shape[1:])
                            rows.put(momentum[j], buf)  # type: ignore[arg-type]
                    else:
                        whole = momentum[j]
                        assert whole is not None
                        buf = rows.take(whole)
                        buf.mul_(mom).add_(d_p)
                        rows.put(whole, buf)
                    d_p = buf
                if p.dim() == targets[j].dim():  # the group's own rows: stepped below
                    own.append((j, p, d_p))
                else:  # step 0: θ_start − η d, written into the rows
                    rows.write(targets[j], p, d_p, -lr)
            if own:  # θ ← θ − η d for all of them in one call (each d_p is final)
                torch._foreach_add_([p for _, p, _ in own], [d for _, _, d in own], alpha=-lr)
                for j, p, _ in own:
                    rows.put(targets[j], p)


class Rows:
    """The clients of a group as positions in the chunk. A contiguous run (the usual case:
    chunks are ordered by client size) is taken as a view, so updates write through."""

    def __init__(self, members: Sequence[int], device: torch.device) -> None:
        #: the positions, on the CPU (gathers from data kept there) and on ``device``
        self.positions = torch.tensor(list(members))
        self.index = self.positions.to(device)
        self.size = len(members)
        first = members[0]
        contiguous = list(members) == list(range(first, first + len(members)))
        self.span = slice(first, first + len(members)) if contiguous else None

    def take(self, t: Tensor) -> Tensor:
        return t[self.span] if self.span is not None else t.index_select(0, self.index)

    def put(self, t: Tensor, value: Tensor) -> None:
        """Store ``value`` (a group's rows) into ``t``; nothing to do for a view of ``t``."""
        if self.span is None:
            t.index_copy_(0, self.index, value)
        elif value.data_ptr() != t[self.span].data_ptr():
            t[self.span].copy_(value)

    def write(self, t: Tensor, base: Tensor, d: Tensor, alpha: float) -> None:
        """Rows of ``t`` ← ``base + alpha·d`` (``base`` broadcast over the group)."""
        if self.span is not None:
            torch.add(base, d, alpha=alpha, out=t[self.span])
        else:
            t.index_copy_(0, self.index, base.add(d, alpha=alpha))


class _Feed:
    """A chunk's data concatenated once, so a step's batch is one gather."""

    def __init__(self, data: Sequence[TensorData], device: torch.device) -> None:
        self.x = torch.cat([d.x for d in data])
        self.y = torch.cat([d.y for d in data])
        sizes = torch.tensor([0] + [len(d) for d in data])
        self.offsets = torch.cumsum(sizes, 0)[:-1]
        self.device = device

    def batch(self, picks: Sequence[Tensor], rows: Tensor) -> tuple[Tensor, Tensor]:
        """[G, b, ...] inputs and [G, b] labels, as ``TensorData.batch`` converts them;
        ``picks``: each group member's indices into its own data (one size), ``rows``:
        the members' positions in the chunk (a CPU tensor)."""
        g = len(picks)
        idx = (torch.stack(list(picks)) + self.offsets[rows].unsqueeze(1)).view(-1)
        # index_select: the rows x[idx] gives, without advanced indexing's general path
        x = self.x.index_select(0, idx.to(self.x.device)).to(self.device, non_blocking=True)
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        y = self.y.index_select(0, idx.to(self.y.device)).to(self.device, non_blocking=True)
        return x.view(g, -1, *x.shape[1:]), y.view(g, -1)


__all__ = ["Layout", "VectorizedTrainer"]
