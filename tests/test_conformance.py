"""Conformance over the component registries (timm's habit): every package entry of the
attack, model, dataset, partitioner, evaluation-attack, aggregator, pre-aggregator, client-
and server-algorithm, evaluator and routing-policy registries is checked here, so a new entry
gets these tests for free (aggregator maths: tests/test_aggregators.py).

* every entry declares a schema whose fields are described, tags from the vocabulary and a
  one-sentence description; its defaults validate; a misspelt key or name is a ConfigError
  with a did-you-mean naming the config key;
* every model builds for a grayscale and a colour input, deterministically under a seed,
  with finite outputs, the ``forward_features``/``head`` split and truthful tags;
* every bundled dataset loads with its registered shape and classes;
* every partitioner returns a partition (disjoint, covering, no empty client);
* every update attack leaves benign rows untouched and returns finite rows; every data
  attack keeps shapes; every evaluation attack stays inside its ε-ball and [0, 1];
* ``fedshield list`` shows every entry with its parameters and tags;
* every client algorithm × every model family it declares runs a local update that is
  finite, seeded-deterministic and accepted by the server's upload checks (its extras and
  the coverage mask the server predicts).
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedshield import attacks
from fedshield.adversarial import EVAL_ATTACKS
from fedshield.aggregators import AGGREGATORS
from fedshield.algorithms.client import CLIENT_ALGORITHMS
from fedshield.algorithms.server import SERVER_ALGORITHMS
from fedshield.attacks import ATTACKS
from fedshield.cli import LIST_KINDS, main
from fedshield.crossround import ROUND_DEFENSES
from fedshield.data import (
    DATASETS,
    PARTITIONERS,
    dataset_info,
    load_dataset,
    parse_dataset_params,
    partition,
    partitioner_params,
)
from fedshield.errors import ConfigError, DataError
from fedshield.eval.base import EVALUATORS
from fedshield.faults import FAULT_MODELS
from fedshield.models import MODELS, build_model, model_tags, parse_model_params
from fedshield.preaggregators import PRE_AGGREGATORS
from fedshield.registry import TAGS, Registry, tags_of
from fedshield.routing import POLICIES
from fedshield.testing.algorithms import SMALL_MODELS, families, server_for

#: The tag vocabulary (fedshield.registry.TAGS).
VOCAB = TAGS

#: (registry, the config key of an entry's parameters, the config key of its name)
REGISTRIES: dict[str, tuple[Registry[Any], str, str]] = {
    "attack": (ATTACKS, "attack.params", "attack.name"),
    "model": (MODELS, "model.params", "model.name"),
    "dataset": (DATASETS, "data.params", "data.dataset"),
    "partitioner": (PARTITIONERS, "data", "data.partition"),
    "eval_attack": (EVAL_ATTACKS, "eval.params", "eval attack"),
    "aggregator": (AGGREGATORS, "server.aggregator_args", "server.aggregator"),
    "pre_aggregator": (PRE_AGGREGATORS, "server.pre_aggregator_args", "server.pre_aggregators"),
    "round_defense": (ROUND_DEFENSES, "server.round_defense_args", "server.round_defenses"),
    "client_algorithm": (CLIENT_ALGORITHMS, "client.params", "client.algorithm"),
    "server_algorithm": (SERVER_ALGORITHMS, "server.params", "server.algorithm"),
    "evaluator": (EVALUATORS, "eval.params", "eval.metrics"),
    "routing_policy": (POLICIES, "policies", "policy"),
    "fault": (FAULT_MODELS, "faults.params", "faults.models"),
}


def _entries(*kinds: str) -> list[Any]:
    """One pytest param per package entry (test-local plugins registered by other test
    modules, e.g. a NaN attack, are not the package's and are left out)."""
    out = []
    for kind in kinds:
        reg = REGISTRIES[kind][0]
        for entry in reg.entries():
            if entry.is_package:
                out.append(pytest.param(kind, entry, id=f"{kind}:{entry.name}"))
    return out


ALL = _entries(*REGISTRIES)


# --- schema, tags and description of every entry ----------------------------------------


@pytest.mark.parametrize(("kind", "entry"), ALL)
def test_declares_a_described_schema_and_vocabulary_tags(kind, entry):
    assert entry.declared, "no declared params schema (derived from the signature)"
    undescribed = [k for k, f in entry.schema.model_fields.items() if not f.description]
    assert not undescribed, f"fields without a description: {undescribed}"
    assert set(entry.tags) <= set(VOCAB), f"tags outside the vocabulary: {entry.tag_text}"
    if kind == "model":
        assert entry.tag_values("family"), "a model declares its family=..."
    if kind == "attack":
        assert entry.tag_values("kind") == {entry.obj.kind}
    if kind == "dataset":
        assert entry.has("bundled") != entry.has("files"), "exactly one of bundled / files"


_SENTENCE = re.compile(r"^[A-Z0-9].*\.$")


@pytest.mark.parametrize(("kind", "entry"), ALL)
def test_description_is_one_complete_sentence(kind, entry):
    text = entry.help
    assert text and "\n" not in text, repr(text)
    assert _SENTENCE.match(text), f"not a capitalised sentence with a full stop: {text!r}"
    assert len(text) <= 200, f"{len(text)} characters: move details to the 2nd paragraph"
    for a, b in ("()", "[]", "{}"):
        assert text.count(a) == text.count(b), f"unbalanced {a}{b}: {text!r}"
    assert text.count("``") % 2 == 0, f"unbalanced ``: {text!r}"


@pytest.mark.parametrize(("kind", "entry"), ALL)
def test_defaults_validate_and_misspelt_keys_get_a_did_you_mean(kind, entry):
    reg, where, _ = REGISTRIES[kind]
    defaults = reg.parse(entry.name, {}, where)
    assert defaults.kwargs().keys() >= entry.schema.model_fields.keys()
    fields = list(entry.schema.model_fields)
    if fields:
        bad = fields[0] + "x"
        hint = difflib.get_close_matches(bad, fields, n=1)[0]
        expected = rf"^{re.escape(where)}\.{bad}: unknown key \(did you mean '{hint}'\?"
    else:
        bad, expected = "foo", rf"^{re.escape(where)}\.foo: unknown key \(allowed: none\)"
    with pytest.raises(ConfigError, match=expected):
        reg.parse(entry.name, {bad: 1}, where)


@pytest.mark.parametrize(("kind", "entry"), _entries("model", "dataset", "partitioner"))
def test_factory_takes_exactly_the_schema_fields(kind, entry):
    """A key the schema accepts but the factory does not would be a TypeError at build time
    (the bug this registry replaces); a factory default that differs from the schema's is
    a second source of truth that has drifted."""
    reg = REGISTRIES[kind][0]
    params = inspect.signature(entry.obj).parameters
    forwards = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if n not in reg.context and p.kind is not p.VAR_KEYWORD}
    fields = set(entry.schema.model_fields)
    assert fields <= named or forwards, f"schema keys the factory lacks: {fields - named}"
    assert named <= fields, f"factory parameters outside the schema: {named - fields}"
    drifted = {
        n: (params[n].default, entry.schema.model_fields[n].default)
        for n in named
        if params[n].default is not inspect.Parameter.empty
        and params[n].default != entry.schema.model_fields[n].default
    }
    assert not drifted, f"factory defaults differ from the schema's: {drifted}"


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_unknown_names_get_a_did_you_mean_naming_the_key(kind):
    reg, _, key = REGISTRIES[kind]
    name = reg.names()[-1]
    typo = name[:-1] + ("x" if name[-1] != "x" else "y")
    with pytest.raises(ConfigError, match=rf"unknown .*'{re.escape(typo)}' \(did you mean"):
        reg.parse(typo, {}, "where")
    entry_points = {  # the calls the builder makes before any data is loaded
        "attack": lambda: attacks.parse(typo, {}),
        "model": lambda: parse_model_params(typo, {}),
        "dataset": lambda: parse_dataset_params(typo, {}),
        "partitioner": lambda: partitioner_params(typo, {}),
        "eval_attack": lambda: EVAL_ATTACKS.build(typo, where=key),
    }
    if kind not in entry_points:  # the config schema checks these names (test_config.py)
        return
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: unknown .*did you mean"):
        entry_points[kind]()


# --- models --------------------------------------------------------------------------


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)], ids=["gray", "colour"])
@pytest.mark.parametrize(("kind", "entry"), _entries("model"))
def test_model_builds_deterministic_finite_and_split(kind, entry, shape):
    torch.manual_seed(0)
    model = build_model(entry.name, shape, 5).eval()
    x = torch.rand(2, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
        assert out.shape == (2, 5) and torch.isfinite(out).all()
        assert torch.equal(model(x), out), "forward is not deterministic"
        if shape[0] == 1:  # a second build under the same seed is the same network
            torch.manual_seed(0)
            assert torch.equal(build_model(entry.name, shape, 5).eval()(x), out)
        family = entry.tag_values("family")
        if family & {"classifier", "dual_head"}:
            z = model.forward_features(x)
            assert z.shape == (2, model.num_features)
            torch.testing.assert_close(model.forward_head(z), out)
            assert isinstance(model.head, nn.Linear)
    if "dual_head" in family:
        assert callable(getattr(model, "forward_main", None))
    assert tags_of(model) == model_tags(entry.name)
    assert ("batchnorm" in tags_of(model)) == _has_batchnorm(model), "batchnorm tag is wrong"


# --- datasets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "entry"), [p for p in _entries("dataset") if p.values[1].has("bundled")]
)
def test_bundled_dataset_loads_with_its_registered_shape_and_classes(kind, entry):
    info = dataset_info(entry.name)
    bundle = load_dataset(entry.name, "", False, {})
    assert bundle.input_shape == info.input_shape and bundle.num_classes == info.num_classes
    for split in (bundle.train, bundle.test):
        x, y = split.batch(torch.arange(min(64, len(split))))
        assert tuple(x.shape[1:]) == info.input_shape and x.min() >= 0 and x.max() <= 1
    assert set(bundle.train.y.unique().tolist()) == set(range(bundle.num_classes))
    assert len(bundle.class_names) == bundle.num_classes


@pytest.mark.parametrize(
    ("kind", "entry"), [p for p in _entries("dataset") if p.values[1].has("files")]
)
def test_file_dataset_without_files_is_a_data_error(kind, entry, tmp_path):
    with pytest.raises(DataError, match=re.escape(str(tmp_path))):
        load_dataset(entry.name, str(tmp_path), False, {})


# --- partitioners --------------------------------------------------------------------

# Deliberately unbalanced: 5 classes of 120, 60, 30, 15 and 8 samples, shuffled.
_LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(5), [120, 60, 30, 15, 8]))


@pytest.mark.parametrize(("kind", "entry"), _entries("partitioner"))
def test_partitioner_returns_a_partition(kind, entry):
    parts = partition(_LABELS, 7, entry.name, seed=3)
    flat = torch.cat(parts)
    assert len(parts) == 7 and min(len(p) for p in parts) > 0
    assert sorted(flat.tolist()) == list(range(len(_LABELS))), "not disjoint and covering"
    again = partition(_LABELS, 7, entry.name, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(parts, again)), "not a function of the seed"


# --- Byzantine attacks ---------------------------------------------------------------


def _cohort(s: int = 8, d: int = 21, f: int = 3, dtype=torch.float64, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    updates = torch.randn(s, d, generator=g, dtype=dtype) + 0.5
    mask = torch.zeros(s, dtype=torch.bool)
    mask[torch.randperm(s, generator=g)[:f]] = True
    return updates, mask


_UPDATE = [p for p in _entries("attack") if "update" in p.values[1].tag_values("kind")]
_DATA = [p for p in _entries("attack") if "data" in p.values[1].tag_values("kind")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("kind", "entry"), _UPDATE)
def test_update_attack_rewrites_only_byzantine_rows(kind, entry, dtype):
    u, m = _cohort(dtype=dtype)
    before = u.clone()
    a = attacks.build(entry.name)
    out = a(u, m, generator=torch.Generator().manual_seed(1))
    assert out.shape == u.shape and out.dtype == dtype and out.device == u.device
    assert torch.equal(u, before), "input modified"
    assert out.data_ptr() != u.data_ptr()
    assert torch.equal(out[~m], u[~m]), "benign rows changed"
    assert not torch.equal(out[m], u[m]), "attack did nothing"
    assert torch.isfinite(out).all()
    again = a(u, m, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again), "not deterministic under the same generator"


@pytest.mark.parametrize(("kind", "entry"), _UPDATE)
def test_update_attack_omniscient_tag_and_own_update_flag_are_true(kind, entry):
    """``omniscient`` ⟺ the Byzantine rows depend on the benign ones; ``needs_own_update``
    False ⟹ they do not depend on the attackers' own honest rows."""
    u, m = _cohort(s=8, d=10, f=3)
    a = attacks.build(entry.name)

    def byz(updates):
        return a(updates, m, generator=torch.Generator().manual_seed(2))[m]

    other_benign = u.clone()
    other_benign[~m] = other_benign[~m] * 3 - 1
    assert entry.has("omniscient") == (not torch.equal(byz(u), byz(other_benign)))
    if not entry.obj.needs_own_update:
        garbage = u.clone()
        garbage[m] = 1e6  # whatever the engine leaves in skipped rows must not matter
        assert torch.equal(byz(u), byz(garbage))


@pytest.mark.parametrize(("kind", "entry"), _UPDATE)
def test_update_attack_edge_cohorts(kind, entry):
    a = attacks.build(entry.name)
    u, _ = _cohort(s=5, d=6)
    out = a(u, torch.zeros(5, dtype=torch.bool), generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, u) and out.data_ptr() != u.data_ptr()
    # All Byzantine (omniscient attacks fall back to all rows) and a single benign row.
    for mask in (torch.ones(5, dtype=torch.bool), torch.tensor([True, True, True, True, False])):
        assert torch.isfinite(a(u, mask, generator=torch.Generator().manual_seed(0))).all()
    with pytest.raises(ValueError, match="byzantine"):
        a(u, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="updates"):
        a(u[0], torch.zeros(6, dtype=torch.bool))


@pytest.mark.parametrize(("kind", "entry"), _DATA)
def test_data_attack_keeps_shapes_and_label_range(kind, entry):
    x = torch.rand(12, 1, 4, 4)
    y = torch.arange(12) % 4
    x0, y0 = x.clone(), y.clone()
    px, py = attacks.build(entry.name).poison(x, y, 4)
    assert px.shape == x.shape and px.dtype == x.dtype
    assert py.shape == y.shape and py.dtype == y.dtype
    assert int(py.min()) >= 0 and int(py.max()) < 4
    assert torch.equal(x, x0) and torch.equal(y, y0), "the caller's tensors were modified"


# --- evaluation attacks --------------------------------------------------------------


@pytest.mark.parametrize(("kind", "entry"), _entries("eval_attack"))
def test_eval_attack_stays_in_its_ball_and_the_unit_box(kind, entry):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 10)).eval()  # AutoAttack needs C >= 4
    x = torch.rand(4, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    x[0].zero_()  # both edges of [0, 1] exercise the range clamp
    x[1].fill_(1.0)
    with torch.no_grad():
        y = model(x).argmax(1)  # correctly classified: every sample is attacked
    attack = EVAL_ATTACKS.build(entry.name)
    adv = attack(model, x, y)
    assert adv.shape == x.shape and torch.isfinite(adv).all()
    assert adv.min() >= 0 and adv.max() <= 1
    delta = (adv - x).flatten(1)
    radius = delta.norm(dim=1) if getattr(attack, "norm", "Linf") == "L2" else delta.abs().amax(1)
    assert float(radius.max()) <= attack.eps + 1e-6
    assert float(radius.max()) > 0, "the attack never moved"
    assert model.training is False


# --- fedshield list -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", [k for k in LIST_KINDS if k not in ("presets", "grids", "benches")]
)
def test_list_shows_every_entry_with_params_and_tags(kind, capsys, monkeypatch):
    from rich.cells import cell_len

    from fedshield import cli

    monkeypatch.setenv("COLUMNS", "100")  # the CLI's console reads the width per command
    assert main(["list", kind]) == 0
    out = capsys.readouterr().out
    assert max(cell_len(line) for line in out.splitlines()) <= 100
    reg = cli._registries()[kind]
    for entry in reg.entries():
        assert re.search(rf"^│ {re.escape(entry.name)}\s+│", out, re.M), entry.name
    with_params = [e for e in reg.entries() if e.schema.model_fields]
    assert out.count("params: ") == len(with_params)
    assert out.count("tags: ") == sum(1 for e in reg.entries() if e.tags)


# --- client algorithms × the model families they declare ----------------------------------

#: model options a baseline requires (its builder says so with a ConfigError otherwise)
_MODEL_OPTIONS = {"depthfl": {"exit_bottleneck": "depthfl"}, "reefl": {"exit_mode": "recurrent"}}


def _client_cases() -> list[Any]:
    out = []
    for entry in CLIENT_ALGORITHMS.entries():
        if not entry.is_package:
            continue
        for fam in families(entry):
            out.append(pytest.param(entry, fam, id=f"{entry.name}:{fam}"))
    return out


def _local_update(entry, family: str, client_id: int):
    from fedshield.algorithms.client import LocalSpec
    from fedshield.algorithms.client.base import ClientContext, ClientRound
    from fedshield.core.context import RoundContext, make_generator, seed_global_rng
    from fedshield.core.flat import get_buffers, get_params
    from fedshield.data.bundle import TensorData

    name, params = SMALL_MODELS[family]
    if family == "multi_exit":
        params = params | _MODEL_OPTIONS.get(entry.name, {})
    torch.manual_seed(0)
    model = build_model(name, (1, 8, 8), 10, **params)
    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.rand(48, 1, 8, 8, generator=g), torch.arange(48) % 10)
    algo = entry.obj(
        LocalSpec(lr=0.05, batch_size=16, steps=3),
        CLIENT_ALGORITHMS.parse(entry.name, {}, "client.params"),
    )
    server_entry = SERVER_ALGORITHMS.entry(server_for(entry.name))
    server = server_entry.obj(
        AGGREGATORS.entry("mean").obj(), lr=1.0, weighting="samples",
        params=server_entry.parse({}, "server.params"),
    )  # fmt: skip
    theta, bufs = get_params(model), get_buffers(model)
    rctx = RoundContext(1, (client_id,), (), 0, 4, torch.device("cpu"))
    payload = server.broadcast(theta, bufs, server.init_state(theta), rctx)
    seed_global_rng(7, torch.device("cpu"))
    ctx = ClientContext(client_id, 1, make_generator(0, 1, client_id), torch.device("cpu"))
    update = algo.local_update(model, ClientRound(payload, data, {}, ctx))
    return algo, model, data, theta, bufs, update


@pytest.mark.parametrize(("entry", "family"), _client_cases())
def test_client_update_is_finite_deterministic_and_passes_the_servers_checks(entry, family):
    """Every client algorithm, on every model family it declares, returns a finite,
    seeded-deterministic update that the server's upload checks accept as it is (its
    declared extras, and the coverage mask the server predicts for the client's tier)."""
    from fedshield.core.flat import buffer_lower_bounds
    from fedshield.core.integrity import UploadSpec, check_upload

    torch.set_num_threads(1)
    for client_id in (0, 1):  # two tiers for depth/width-limited clients
        algo, model, data, theta, bufs, u = _local_update(entry, family, client_id)
        again = _local_update(entry, family, client_id)[-1]
        assert u.delta.shape == theta.shape and u.buffers.shape == bufs.shape
        assert bool(torch.isfinite(u.delta).all()) and bool(torch.isfinite(u.buffers).all())
        assert torch.equal(u.delta, again.delta) and torch.equal(u.buffers, again.buffers)
        assert set(u.extras) == set(again.extras)
        for k in u.extras:
            assert torch.equal(u.extras[k], again.extras[k]), k
        assert float(u.delta.abs().max()) > 0, "the update did not move θ"
        counts = data.class_counts(10)
        spec = UploadSpec(
            num_params=theta.numel(), dtype=theta.dtype, num_buffers=bufs.numel(),
            buffer_min=buffer_lower_bounds(model), extras=algo.upload_spec(model),
            masks={client_id: algo.expected_mask(client_id, model, counts)},
        )  # fmt: skip
        assert check_upload(u, spec) is None, check_upload(u, spec)
