"""The in-process simulator: the round loop of the DRAG paper, Sec. II-A.

for round t = 1..T:
    cohort S^t (seeded by (seed, t)), Byzantine subset A^t
    payload = server.broadcast(θ, state)
    updates = [client.local_update(model, payload, data_k) for k in S^t]  (data attacks here)
    updates = attack(updates, A^t)                                          (update attacks)
    drop non-finite / wrong-shaped updates (logged, counted)
    step = server.update(ServerRound(θ, state, updates, …)); server.post_step(step, …)
    evaluate every k rounds; metrics.jsonl; checkpoint every k rounds (atomic)

All randomness is derived from (seed, round, client), so a resumed run replays exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedshield import config as config_mod
from fedshield.algorithms.client import ClientContext, ClientRound
from fedshield.algorithms.client.base import root_round
from fedshield.algorithms.server.base import ServerRound
from fedshield.algorithms.server.step import server_round_step
from fedshield.attacks.base import AttackContext, DataAttack, UpdateAttack, published_state
from fedshield.core.client_metrics import robust_metric
from fedshield.core.context import (
    ClientUpdate,
    RoundContext,
    derive_seed,
    make_generator,
    seed_global_rng,
)
from fedshield.core.flat import (
    buffer_lower_bounds,
    get_buffers,
    get_params,
    set_buffers,
    set_params,
    stack_rows,
)
from fedshield.core.integrity import UploadSpec, finite_metric, is_dense
from fedshield.core.seeds import ATTACK, BATCH, BYZ, TORCH, sample_cohort
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.eval import evaluate
from fedshield.registry import tags_of
from fedshield.sim.builder import Experiment
from fedshield.sim.callbacks import Callback, OnRound, default_callbacks
from fedshield.sim.checkpoint import JsonlLog, atomic_write_text, load_checkpoint, save_checkpoint
from fedshield.sim.faults import (
    build_faults,
    capped_steps,
    fault_summary,
    round_metrics,
    training_plan,
)
from fedshield.sim.outputs import (
    nonfinite_keys,
    plot_curves,
    rounds_to,
    summarize,
    write_report,
)
from fedshield.sim.privacy import attach_privacy
from fedshield.sim.resume import check_resumed, checkpoint_norms, state_norm, theta_norm
from fedshield.sim.rundir import check_run_dir
from fedshield.sim.state import RoundPlan, RunState
from fedshield.sim.tracking import logger_callbacks

log = logging.getLogger("fedshield")


class Simulator:
    """Runs an :class:`Experiment`, writing outputs to ``out`` (when given)."""

    def __init__(self, exp: Experiment, out: Path | None = None, resume: bool = False) -> None:
        self.exp = exp
        self.cfg = exp.cfg
        self.out = out
        self.comp = exp.components
        self.device = exp.device
        self.model = exp.model
        self._poisoned: dict[int, TensorData] = {}
        self.config_text = config_mod.dump(self.cfg)
        self.metrics = JsonlLog(out / "metrics.jsonl") if out else None
        self.timing = JsonlLog(out / "timing.jsonl") if out else None
        self.records: list[dict[str, Any]] = []
        # [privacy] mechanisms go to the client/server algorithms; their ε enters each record
        # before MetricsFiles writes it. [run] loggers read the finished record (server side).
        self.privacy = attach_privacy(exp)
        self.callbacks: list[Callback] = [*self.privacy.callbacks, *default_callbacks()]
        if out is not None:
            self.callbacks += logger_callbacks(self.cfg)
        self.state = self._initial_state()
        st = self.state
        self._spec = UploadSpec(
            num_params=st.params.numel(),
            dtype=st.params.dtype,
            num_buffers=st.buffers.numel(),
            buffer_min=buffer_lower_bounds(self.model),
            extras=self.comp.client.upload_spec(self.model),
            max_num_examples=self.cfg.server.max_num_examples,
        )
        self.trust_counts = trusts_counts(self.cfg, self.comp)
        # [faults]: availability, dropout, deadlines; stateless (drawn from the seed), so a
        # checkpoint needs nothing more to replay them.
        self.faults = build_faults(exp)
        # θ^0 is rebuilt identically from the config on resume (seeded model init).
        self.initial = (self.state.params.clone(), self.state.buffers.clone())
        if out is not None:
            self._prepare_out(out, resume)

    # -- set-up / resume -------------------------------------------------------------
    def _initial_state(self) -> RunState:
        params = get_params(self.model)
        return RunState(
            round=1,
            params=params,
            buffers=get_buffers(self.model),
            server_state=self.comp.server.init_state(params),
        )

    def _prepare_out(self, out: Path, resume: bool) -> None:
        assert self.metrics is not None and self.timing is not None  # opened for ``out``
        out.mkdir(parents=True, exist_ok=True)
        ckpt = out / "checkpoint.pt"
        has_run = (out / "metrics.jsonl").exists() or ckpt.exists()
        check_run_dir(out, resume, self.config_text)
        if resume:
            # Temporary files of a write that a crash interrupted (atomic_write_bytes).
            for tmp in out.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
        if resume and ckpt.exists():
            saved = load_checkpoint(ckpt)
            state = RunState.from_dict(saved["state"], self.device)
            last = state.round - 1
            known = [r for r in self.metrics.read() if r.get("round") == last]
            check_resumed(
                ckpt,
                state,
                self.state,
                self._spec.buffer_min,
                self.comp.client.state_spec(self.state.params),
                known[-1] if known else None,
                self.comp.server.state_spec(self.state.params),
                saved.get("norms"),
            )
            self.state = state
            if self.comp.attack is not None:  # Mimic's warm-up target, ...
                self.comp.attack.load_state_dict(saved.get("attack", {}))
            self.records = self.metrics.truncate_after(last)
            self.timing.truncate_after(last)
            log.info("resuming %s from round %d", out, self.state.round)
        elif resume and has_run:
            # Killed before the first checkpoint: nothing to keep, start over cleanly.
            self.metrics.truncate_after(0)
            self.timing.truncate_after(0)
        atomic_write_text(out / "config.toml", self.config_text)

    # -- helpers ------------------------------------------------------------------------
    def _byzantine(self, rnd: int, cohort: tuple[int, ...]) -> tuple[int, ...]:
        a = self.cfg.attack
        if self.comp.attack is None:
            return ()
        if a.mode == "fixed":
            chosen = set(self.exp.byzantine)
            return tuple(k for k in cohort if k in chosen)
        count = int(np.floor(a.fraction * len(cohort)))
        rng = np.random.default_rng([self.cfg.seed, rnd, BYZ])
        return tuple(sorted(int(k) for k in rng.choice(cohort, count, replace=False)))

    def client_data(self, k: int, byzantine: bool) -> TensorData:
        data = self.exp.clients[k]
        attack = self.comp.attack
        if not (byzantine and isinstance(attack, DataAttack)):
            return data
        if k not in self._poisoned:
            x, y = attack.poison(data.x, data.y, self.exp.bundle.num_classes)
            self._poisoned[k] = TensorData(x, y)
        return self._poisoned[k]

    def _train(
        self, data: TensorData, payload: Any, client_id: int, rnd: int, state: dict[str, Tensor]
    ) -> ClientUpdate:
        seed = self.cfg.seed
        seed_global_rng(derive_seed(seed, rnd, client_id, TORCH), self.device)  # dropout
        ctx = ClientContext(
            client_id=client_id,
            round=rnd,
            generator=make_generator(seed, rnd, client_id, BATCH),
            device=self.device,
            amp=self.cfg.run.amp,
        )
        return self.comp.client.local_update(self.model, ClientRound(payload, data, state, ctx))

    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        """Server-side U SGD steps on the root dataset (DRAG paper, eqs. 12–13)."""
        if self.exp.root is None:
            raise ConfigError("this server algorithm needs data.root_size > 0")
        from fedshield.algorithms.client.sgd import LocalSGD
        from fedshield.core.context import Payload

        payload = Payload(params, buffers)
        root = root_round(payload, self.exp.root, self.cfg.seed, ctx.round, self.device)
        return LocalSGD(self.comp.client.spec).local_update(self.model, root)

    # -- one round -----------------------------------------------------------------------
    # A round is split in three phases so the Flower strategy can run the same body with the
    # network in the middle: begin_round (configure_train), client_update (ClientApp),
    # end_round (aggregate_train). run_round chains them in process.
    def begin_round(self, rnd: int) -> RoundPlan:
        """Cohort S^t, Byzantine subset A^t and the broadcast payload of round ``rnd``."""
        cfg = self.cfg
        budget = self.comp.budget  # S' invited (server.over_select), else S
        s = budget.asked if budget is not None else cfg.server.clients_per_round
        if self.faults is None:
            m = cfg.data.num_clients
            cohort, online = sample_cohort(cfg.seed, rnd, m, s), m
        else:  # sampled from the clients online this round
            cohort, online = self.faults.cohort(rnd, s)
        byz = self._byzantine(rnd, cohort)
        ctx = RoundContext(rnd, cohort, byz, cfg.seed, cfg.data.num_clients, self.device)
        st = self.state
        payload = self.comp.server.broadcast(st.params, st.buffers, st.server_state, ctx)
        attack = self.comp.attack
        # Attacks that ignore their own update need no training, unless no benign row exists
        # for the omniscient ones to read.
        skip_training = (
            isinstance(attack, UpdateAttack)
            and not attack.needs_own_update
            and len(byz) < len(cohort)
        )
        if self.faults is None:
            return RoundPlan(ctx, payload, skip_training)
        # Dropouts and deadlines after selection; ctx.cohort stays the sampled cohort.
        faults = self.faults.outcome(rnd, cohort, byz, online)
        return RoundPlan(ctx, payload, skip_training, faults)

    def client_update(self, plan: RoundPlan, k: int) -> ClientUpdate:
        """Client ``k``'s upload for ``plan`` (before update attacks), state kept in process."""
        st = self.state
        if not plan.trains(k):  # the attack overwrites this row; no need to train
            return self.untrained_upload(k, torch.zeros_like(st.params))
        state = st.client_states.setdefault(k, self.comp.client.init_state(st.params.numel()))
        steps = None if plan.faults is None else plan.faults.steps.get(k)  # a late client
        byzantine = k in plan.ctx.byzantine
        with capped_steps(self.comp.client, steps):
            return self.train_client(k, plan.payload, plan.ctx.round, byzantine, state)

    def untrained_upload(self, k: int, delta: Tensor) -> ClientUpdate:
        """The upload of an attacker whose row the update attack overwrites: ``delta`` and
        every other field as its client would send them (its coverage mask too), so the
        attack is screened like an honest upload instead of being rejected for a field
        it never tried to forge."""
        client = self.comp.client
        mask = None
        if "mask" in tags_of(client).get("uploads", ()):
            mask = client.expected_mask(k, self.model, self.class_counts(k))
        st = self.state
        return ClientUpdate(k, delta, len(self.exp.clients[k]), st.buffers, mask=mask)

    def train_client(
        self, k: int, payload: Any, rnd: int, byzantine: bool, state: dict[str, Tensor]
    ) -> ClientUpdate:
        """Local training of client ``k`` on its (possibly poisoned) data, seeded by
        (seed, round, client); the Flower ClientApp calls this with its own state."""
        return self._train(self.client_data(k, byzantine), payload, k, rnd, state)

    def train_cohort(self, plan: RoundPlan) -> list[ClientUpdate]:
        """Every selected client's upload (before update attacks), in cohort order.

        With ``run.vectorize`` ("auto" by default) and a vectorisable client algorithm and
        model, the cohort trains as one batched computation (:mod:`fedshield.sim.vectorized`)
        and the deltas are row views of one [S, d] tensor; otherwise client by client.
        Under ``[faults]`` only the clients that answer train (:func:`training_plan`)."""
        plan = training_plan(plan)
        if not plan.ctx.cohort:  # every sampled client dropped: no upload this round
            return []
        trainer = self._batched_trainer(plan)
        if trainer is not None:
            return trainer.train(self, plan)
        return [self.client_update(plan, k) for k in plan.ctx.cohort]

    def _batched_trainer(self, plan: RoundPlan) -> Any:
        """The batched trainer, decided once per run (the reason for not batching is logged
        once); None: train client by client."""
        if not hasattr(self, "_vectorized"):
            from fedshield.sim.vectorized import trainer_for

            self._vectorized = trainer_for(self, plan)
        return self._vectorized

    def run_round(self, rnd: int) -> dict[str, Any]:
        plan = self.begin_round(rnd)
        return self.end_round(plan, self.train_cohort(plan))

    def class_counts(self, k: int) -> Tensor:
        """Client ``k``'s label counts, which the server knows like the partition itself."""
        return self.exp.clients[k].class_counts(self.exp.bundle.num_classes)

    def upload_spec(self, plan: RoundPlan) -> UploadSpec:
        """What a valid upload of this round looks like (docs/security.md §1, core.integrity)."""
        client = self.comp.client
        masks = None
        if "mask" in tags_of(client).get("uploads", ()):
            masks = {
                k: client.expected_mask(k, self.model, self.class_counts(k))
                for k in plan.ctx.cohort
            }
        trusted = known = None
        if not self.trust_counts:  # the simulator knows every partition's size and labels
            trusted = {k: len(self.exp.clients[k]) for k in plan.ctx.cohort}
            if self._spec.extras:  # only algorithms that upload extras can declare known ones
                known = {k: client.known_extras(self.class_counts(k)) for k in plan.ctx.cohort}
        return replace(self._spec, masks=masks, trusted_counts=trusted, trusted_extras=known)

    def end_round(
        self,
        plan: RoundPlan,
        updates: list[ClientUpdate],
        apply_update_attack: bool = True,
        rejected_before: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """Update attack, then the one server round step (admit, upload checks, weights,
        rule, guard: :func:`~fedshield.algorithms.server.step.server_round_step`); returns the
        round's metrics. ``updates`` are in cohort order; ``apply_update_attack=False`` when
        the attackers already rewrote their own rows (row-local attacks on Flower
        SuperNodes); ``rejected_before``: replies the transport dropped, by reason."""
        st = self.state
        rnd, ctx, byz = plan.ctx.round, plan.ctx, plan.ctx.byzantine
        server, attack = self.comp.server, self.comp.attack
        metrics: dict[str, Any] = {"round": rnd, "byz/count": len(byz)}
        benign = [u for u in updates if u.client_id not in byz]
        # Reported, so untrusted: the median over the reporters, NaN only when at least
        # half of them diverged (fedshield.core.client_metrics), never a minority's inf.
        loss = robust_metric(_reported(u, "train/loss") for u in benign)
        if loss is not None:
            metrics["train/loss"] = loss
        if byz and isinstance(attack, UpdateAttack) and apply_update_attack:
            self._apply_update_attack(plan, updates)
        n_bytes = (st.params.numel() + st.buffers.numel()) * st.params.element_size()
        # One-way bytes per client: the active prefix a subnet client reports (early-exit ViT
        # paper).
        sent = sum(_comm_bytes(u, n_bytes) for u in updates)
        # The one server round step of every backend (admit, screen, weights, rule, guard).
        start = ServerRound(st.params, st.buffers, st.server_state, updates, ctx, self)
        out = server_round_step(
            server,
            start,
            self.upload_spec(plan),
            count_cap=self.cfg.server.count_cap,
            rejected_before=rejected_before,
        )
        metrics.update(out.metrics)
        metrics.update(round_metrics(plan, out.kept, attack is not None))
        # The scale a resume checks its checkpoint against (fedshield.sim.resume).
        metrics["sys/theta_norm"] = theta_norm(out.params)
        metrics["sys/state_norm"] = state_norm(out.state)
        new_state = RunState(rnd + 1, out.params, out.buffers, out.state, st.client_states)
        metrics["comm/up_bytes"] = metrics["comm/down_bytes"] = sent
        prev = self.records[-1].get("comm/cum_gib", 0.0) if self.records else 0.0
        metrics["comm/cum_gib"] = prev + 2 * sent / 2**30  # both directions (eq. 16)
        self.state = new_state
        return metrics

    def _apply_update_attack(self, plan: RoundPlan, updates: list[ClientUpdate]) -> None:
        """Rewrite the attackers' rows of the stacked ``[S, d]`` matrix; every update's
        delta becomes a row view of it (servers stack it again without a copy)."""
        byz = set(plan.ctx.byzantine)
        d = self.state.params.numel()
        # A malformed row cannot be stacked; it is rejected by the upload checks anyway.
        ok = [i for i, u in enumerate(updates) if is_dense(u.delta) and u.delta.shape == (d,)]
        if not ok:
            return
        matrix = stack_rows([updates[i].delta for i in ok])
        mask = torch.tensor([updates[i].client_id in byz for i in ok], device=matrix.device)
        gen = make_generator(self.cfg.seed, plan.ctx.round, ATTACK, device=self.device)
        attack = self.comp.attack
        assert isinstance(attack, UpdateAttack)  # end_round's condition for calling this
        kw = {}
        if getattr(attack, "needs_rule", False):  # defense-aware: the rule reaches the attack
            kw["context"] = self._attack_context(plan, [updates[i] for i in ok], matrix)
        forged = attack(matrix, mask, generator=gen, **kw)
        for j, i in enumerate(ok):
            updates[i].delta = forged[j]

    def _attack_context(
        self, plan: RoundPlan, rows: list[ClientUpdate], matrix: Tensor
    ) -> AttackContext:
        """The configured rule and its weights, what the server publishes about its defenses
        (docs/security.md §6b, quiet attackers); the server's reference r^t only for an attack of
        the threat model that knows it (``needs_reference``)."""
        st, server = self.state, self.comp.server
        ref = None
        if getattr(self.comp.attack, "needs_reference", False):
            reference = getattr(server, "reference", None)
            if reference is not None:
                ref = reference(
                    ServerRound(st.params, st.buffers, st.server_state, rows, plan.ctx, self)
                )
            if ref is None:
                ref = st.server_state.get("center")  # Centered Clipping's reference
        defenses = getattr(server, "round_defenses", None)
        chain = defenses.defenses if defenses is not None else ()
        return AttackContext(
            self.comp.aggregator,
            server.weights(rows, matrix),
            ref,
            defenses=chain,
            published=published_state(chain, st.server_state),
            lr=float(server.lr),
            cohort=len(plan.ctx.cohort),
            byzantine_f=getattr(server, "byzantine_f", None),
        )

    def evaluate(self) -> dict[str, float]:
        set_params(self.model, self.state.params)
        set_buffers(self.model, self.state.buffers)
        res = evaluate(self.model, self.exp.bundle.test, self.cfg.eval.batch_size, self.device)
        out = {"test_acc": res["acc"], "test_loss": res["loss"]}
        if self.cfg.eval.per_client:
            accs = [
                evaluate(self.model, c, self.cfg.eval.batch_size, self.device)["acc"]
                for c in self.exp.clients
            ]
            out.update({"client/mean_acc": float(np.mean(accs)), "client/worst_acc": min(accs)})
        return out

    def evaluate_extra(self, rnd: int) -> dict[str, float]:
        """The registered evaluators of ``eval.metrics`` on the global model."""
        from fedshield.eval.base import EvalInputs, run_evaluators

        set_params(self.model, self.state.params)
        set_buffers(self.model, self.state.buffers)
        inputs = EvalInputs(
            bundle=self.exp.bundle,
            clients=self.exp.clients,
            train=self.exp.train,
            device=self.device,
            batch_size=self.cfg.eval.batch_size,
            seed=self.cfg.seed,
            round=rnd,
            initial=self.initial,
            rounds=self.cfg.rounds,
        )
        return run_evaluators(self.model, inputs, self.cfg.eval.metrics, self.cfg.eval.params)

    # -- the loop ------------------------------------------------------------------------
    def run(
        self,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        callbacks: list[Callback] | None = None,
    ) -> dict[str, Any]:
        """Run the remaining rounds; ``on_round(record)`` after each (a progress bar),
        ``callbacks`` after the built-in ones (see :mod:`fedshield.sim.callbacks`)."""
        cfg = self.cfg
        if on_round is not None:
            self.callbacks.append(OnRound(on_round))
        self.callbacks.extend(callbacks or [])
        self.start()
        t_start = time.perf_counter()
        for rnd in range(self.state.round, cfg.rounds + 1):
            t0 = time.perf_counter()
            m = self.run_round(rnd)
            self.record(m, time.perf_counter() - t0)
            if self.diverged(m):
                break
        return self.finish(time.perf_counter() - t_start)

    def diverged(self, record: dict[str, Any]) -> bool:
        """True when the run must stop after ``record``: a loss or accuracy turned non-finite
        and ``run.on_nonfinite = "stop"``. The round is checkpointed first, so the files
        agree (metrics.jsonl ends at the checkpoint's round)."""
        bad = nonfinite_keys(record)
        if not bad:
            return False
        stop = self.cfg.run.on_nonfinite == "stop"
        if not stop and getattr(self, "_nonfinite_logged", False):
            return False
        self._nonfinite_logged = True
        log.warning(
            "round %s: %s non-finite; %s",
            record["round"],
            ", ".join(bad),
            "stopping (run.on_nonfinite = 'stop')" if stop else "continuing",
        )
        if stop and self.out is not None and record["round"] % self.cfg.checkpoint.every:
            self.save()
        return stop

    def start(self) -> None:
        """Tell the callbacks the session starts (the Flower strategy's server calls it)."""
        for cb in self.callbacks:
            cb.on_run_start(self)

    def record(self, m: dict[str, Any], wall_s: float) -> dict[str, Any]:
        """Complete a round: run the callbacks (evaluation, metrics/timing files,
        checkpoint, progress, ...) on its record, in place, and keep it. The Flower
        strategy calls this too, so both backends write the same files."""
        timing: dict[str, Any] = {"round": m["round"], "wall_s": wall_s}
        for cb in self.callbacks:
            cb.after_round(self, m, timing)
        self.records.append(m)
        return m

    def save(self) -> None:
        assert self.out is not None
        payload = {"version": 1, "config": self.config_text, "state": self.state.to_dict()}
        payload["norms"] = checkpoint_norms(self.state)  # checked on resume (sim.resume)
        if self.comp.attack is not None and self.comp.attack.state_dict():
            payload["attack"] = self.comp.attack.state_dict()
        save_checkpoint(self.out / "checkpoint.pt", payload)

    def finish(self, wall_s: float, more: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the summary, plots and report; ``more``: a backend's own summary entries
        (the Flower strategy's missing rows)."""
        from fedshield.models.layout import layout_of
        from fedshield.provenance import run_provenance

        extra: dict[str, Any] = {"wall_s_this_session": wall_s, **(more or {})}
        # commit, config hash, and on CPU the kernels (a re-run on the same ones is exact)
        extra["provenance"] = run_provenance(self.config_text, self.device.type)
        # the layout run.memory_format resolved to: results agree across layouts only to
        # float tolerance (another summation order), like across kernels
        extra["provenance"]["memory_format"] = layout_of(self.model)
        if self.comp.budget is not None:  # f under sampling, groups a minority may own
            extra["byzantine"] = self.comp.budget.as_dict()
        if self.comp.attack is not None:
            extra["attack"] = self.cfg.attack.name
        if self.cfg.eval.target_acc is not None:
            extra["rounds_to_target"] = rounds_to(self.records, self.cfg.eval.target_acc)
            extra["target_acc"] = self.cfg.eval.target_acc
        if self.faults is not None:
            extra["faults"] = fault_summary(self.records)
        summary = summarize(self.cfg.name, self.records, extra)
        if self.out is not None:
            plot_curves(self.records, self.out, self.cfg.name)
            write_report(self.out, summary, self.config_text)
        for cb in self.callbacks:
            cb.on_run_end(self, summary)
        return summary


def _reported(u: ClientUpdate, key: str) -> Any:
    """What ``u`` reports for ``key`` (None: nothing, or metrics that are no mapping)."""
    return u.metrics.get(key) if isinstance(u.metrics, Mapping) else None


def _comm_bytes(u: ClientUpdate, default: int) -> int:
    """The bytes a client reports for its active prefix (early-exit ViT paper, eq. 16), within [0,
    default]."""
    value = finite_metric(u, "comm/bytes")
    return default if value is None else int(min(max(value, 0.0), default))


def trusts_counts(cfg: Any, comp: Any) -> bool:
    """Whether self-reported sample counts are believed (docs/security.md): ``server.trust_counts``
    when set, else only when no attack and no Byzantine-robust rule is configured."""
    if cfg.server.trust_counts is not None:
        return bool(cfg.server.trust_counts)
    return comp.attack is None and "robust" not in tags_of(comp.aggregator)
