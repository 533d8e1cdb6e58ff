"""Name → component registries: the one construction path of fedshield.

One :class:`Registry` per kind (datasets, partitioners, models, aggregators, attacks, client
and server algorithms, evaluators, routing policies, evaluation attacks). An entry is filled
by the ``@REG.register("name", tags=...)`` decorator when its module is imported, as timm
does, and carries:

* ``schema``: the pydantic :class:`~fedshield.core.params.Params` of its parameters (the
  ``schema=`` argument, else the object's ``params_schema`` attribute). Configs, ``fedshield
  list``, validation and the conformance tests all read it, so a new entry needs no list to
  be edited anywhere.
* ``tags``: facts other components are checked against at build time, so compatibility is
  decided from the registry, never from hand-kept lists. A tag is a word (``robust``) or a
  ``key=value1|value2`` pair (``needs_model=dual_head|multi_exit``). See :data:`TAGS`.

User components register the same way, from a module named in the config's ``plugins``
list or exposed through the ``fedshield.plugins`` entry-point group
(:func:`fedshield.plugins.load_plugins`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from fedshield.core.params import NoParams, Params, parse_params, schema_from_signature
from fedshield.errors import ConfigError

T = TypeVar("T")
#: What ``register`` decorates: it returns the object with its own type (``Drag``, not the
#: registry's ``type[Aggregator]``), so a decorated class or factory keeps its signature.
_S = TypeVar("_S")

#: The tag vocabulary (documentation and the conformance tests check entries against it).
TAGS: dict[str, str] = {
    # aggregators
    "robust": "a Byzantine-robust rule: self-reported sample counts are not trusted and "
    "secondary fields (buffers, extras) are aggregated robustly",
    "needs_reference": "needs a reference direction r (root data or server momentum); on an "
    "attack: the attackers know the server's r^t (it is passed in its AttackContext)",
    "needs_center": "needs a centre kept in server state (Centered Clipping)",
    "reference_free": "can aggregate any [K, p] field without a reference or server state",
    "uses_weights": "honours per-client weights (sample counts)",
    "sample_weighted": "defined with sample-count weights n_m whatever server.weighting says "
    "(RFA); the server passes the counts it trusts",
    "min_clients": "has a minimum number of rows (validate(S) may refuse)",
    "selects": "its output is built from rows it selects: selects=one (Krum) or "
    "selects=subset (Multi-Krum); agr_tailored then searches for the largest γ whose "
    "rows are still selected (one of them, resp. all of them)",
    "dod_scale": "has a degree-of-divergence scale c that a server algorithm may set every "
    "round (BR-DRAG's rule, for brdrag_ct)",
    # models
    "family": "model family: family=classifier|dual_head|multi_exit|width",
    "batchnorm": "has BatchNorm running statistics (buffers)",
    "channels_last": "trains faster in torch.channels_last on these device types: "
    "channels_last=cpu (run.memory_format=auto reads it; fedshield.models.layout)",
    # client algorithms, evaluators
    "needs_model": "works only with these model families: needs_model=dual_head|multi_exit",
    "uploads": "extras it uploads: uploads=dh|prototypes|mask",
    "local_dp": "trains with ClientAlgorithm's loop, which [privacy.local]'s DP-SGD (Opacus) "
    "is wired into",
    "dp_uploads": "its extras are computed from the DP-SGD gradients and the delta only, so "
    "[privacy.local] covers them (SCAFFOLD's dh)",
    # server algorithms
    "needs_client": "needs one of these client algorithms: needs_client=fedcart|...",
    "needs_root": "trains on a server root dataset (data.root_size > 0)",
    "needs_aggregator": "needs an aggregator with this tag: needs_aggregator=needs_reference",
    "central_dp": "releases nothing computed from the uploads but the aggregate and its "
    "post-processing, so [privacy.central]'s noise covers it (θ += η·Δ̃, FedACG's momentum)",
    # round defenses
    "memory": "what the server keeps across rounds: memory=M*d (a row per client), k*d (the "
    "last k steps), M (a number per client)",
    "changes_rows": "changes which rows the rule sees (adds cached rows, drops suspended ones)",
    "caches_uploads": "hands the rule uploads kept from earlier rounds (delta, count, buffers, "
    "mask; not method extras)",
    "bounds_step": "bounds the step the server applies, after the rule",
    "adds_uninvited": "hands the rule rows of clients outside the round's cohort, so a short "
    "round is skipped rather than padded with zero rows",
    # attacks
    "kind": "what an attack rewrites: kind=update (the uploaded update rows) or kind=data "
    "(the client's local dataset, before training)",
    "omniscient": "reads the round's benign updates (mean, std, ...), as in the literature",
    "needs_rule": "crafts its rows through the server's configured rule (defense-aware: the "
    "rule object reaches it in an AttackContext)",
    # fault models
    "stage": "when a fault model acts: stage=availability (who can be sampled) or "
    "stage=response (after selection: dropout, deadline, partial work)",
    # datasets
    "bundled": "ships with the installed packages (works offline)",
    "files": "reads files under data.root",
    "input_range": "float inputs lie in LO..HI, not [0, 1]: input_range=-1:1 (checked on "
    "loading: fedshield.data.check)",
}


class RegistryError(ConfigError, KeyError):
    """An unknown name was requested; the message lists the known names (a ConfigError, so
    the CLI prints it as one line with exit status 2)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _first_sentence(doc: str) -> str:
    """The first paragraph of a docstring, joined into one line (never cut mid-sentence)."""
    para = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in para.splitlines()).strip()


def _parse_tags(tags: Iterable[str]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for tag in tags:
        key, _, values = tag.partition("=")
        out[key] = frozenset(v for v in values.split("|") if v) if values else frozenset()
    return out


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered component."""

    kind: str
    name: str
    obj: T
    schema: type[Params]
    tags: dict[str, frozenset[str]]
    help: str
    #: False when the schema was derived from the factory's signature (user plugins that
    #: declare none); every entry of the package declares one (a conformance test).
    declared: bool = True

    def has(self, tag: str) -> bool:
        return tag in self.tags

    @property
    def is_package(self) -> bool:
        """True for fedshield's own entries (plugin modules live outside ``fedshield.``)."""
        return (getattr(self.obj, "__module__", "") or "").startswith("fedshield.")

    def tag_values(self, key: str) -> frozenset[str]:
        """``{"a", "b"}`` for the tag ``key=a|b``; empty when absent or a bare word."""
        return self.tags.get(key, frozenset())

    def parse(self, raw: Any, where: str) -> Params:
        return parse_params(self.schema, raw, where)

    @property
    def tag_text(self) -> str:
        return ", ".join(
            k if not v else f"{k}={'|'.join(sorted(v))}" for k, v in sorted(self.tags.items())
        )


def _own_keyword_init(obj: Any, context: tuple[str, ...]) -> bool:
    """A class that declares no schema but its own ``__init__`` taking only options with
    defaults (a plugin rule ``MyRule(alpha=0.5)``): its signature is its schema, not the
    empty one inherited from the base class."""
    if not isinstance(obj, type) or "params_schema" in vars(obj) or "__init__" not in vars(obj):
        return False
    params = [
        p
        for p in inspect.signature(vars(obj)["__init__"]).parameters.values()
        if p.name != "self"
        and p.name not in context
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    return bool(params) and all(p.default is not p.empty for p in params)


class Registry(Generic[T]):
    """``context``: the factory arguments the caller supplies itself (a model's input shape,
    an evaluator's model), left out of a schema derived from the signature."""

    def __init__(self, kind: str, context: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.context = context
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self,
        name: str,
        help: str | None = None,
        *,
        schema: type[Params] | None = None,
        tags: Iterable[str] = (),
    ) -> Callable[[_S], _S]:
        def deco(obj: _S) -> _S:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            sch = schema or getattr(obj, "params_schema", None)
            declared = sch is not None
            if sch is NoParams and schema is None and _own_keyword_init(obj, self.context):
                sch = None  # the base class's empty default, not the plugin's own word
                declared = False
            if sch is None:
                sch = schema_from_signature(obj, self.context) if callable(obj) else NoParams
            if not (isinstance(sch, type) and issubclass(sch, Params)):
                raise TypeError(f"{self.kind} {name!r}: schema must be a Params subclass")
            doc = help or inspect.getdoc(obj) or ""
            parsed = _parse_tags(tags)
            # typing cannot bound _S by the registry's T; the kind is the caller's word
            entry: Entry[T] = Entry(
                self.kind, name, cast(T, obj), sch, parsed, _first_sentence(doc), declared
            )
            self._entries[name] = entry
            if isinstance(obj, type):  # let instances answer "which tags do I carry?"
                obj.registry_tags = parsed  # type: ignore[attr-defined]
                obj.registry_name = name  # type: ignore[attr-defined]
            return obj

        return deco

    def entry(self, name: str, where: str | None = None) -> Entry[T]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), self._entries, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            prefix = f"{where}: " if where else ""
            raise RegistryError(
                f"{prefix}unknown {self.kind} {name!r}{hint}; "
                f"known: {', '.join(sorted(self._entries))}"
            ) from None

    def get(self, name: str, where: str | None = None) -> T:
        return self.entry(name, where).obj

    def parse(self, name: str, raw: Any, where: str) -> Params:
        """The validated parameters of entry ``name`` (``where`` names the config key)."""
        return self.entry(name).parse(raw, where)

    def build(self, name: str, /, *args: Any, where: str | None = None, **params: Any) -> Any:
        """Validate ``params`` against the entry's schema, then call its factory with them
        as keyword arguments after ``args`` (the caller's context, e.g. input shape).
        ``None`` values are dropped first, so unset keys take the defaults (timm's habit)."""
        entry = self.entry(name, where)
        given = {k: v for k, v in params.items() if v is not None}
        p = entry.parse(given, where or f"{self.kind} {name!r}")
        return entry.obj(*args, **p.kwargs())  # type: ignore[operator]

    def build_listed(
        self, names: Sequence[str], args: dict[str, dict[str, Any]] | None, key: str, where: str
    ) -> list[Any]:
        """The entries ``names`` of the config list ``key`` (e.g. ``server.pre_aggregators``),
        in order, each built with its parameters from ``args[name]`` validated by its schema
        (errors name ``where.name.key``). An ``args`` entry for a name not listed is a
        :class:`ConfigError`. (The pre-aggregator chain and the round defenses.)"""
        args = args or {}
        unknown = sorted(set(args) - set(names))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: not in {key} {list(names)}")
        out = []
        for i, name in enumerate(names):
            entry = self.entry(name, f"{key}[{i}]")
            params = entry.parse(args.get(name, {}), f"{where}.{name}")
            out.append(entry.obj(**params.kwargs()))  # type: ignore[operator]
        return out

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def package_names(self) -> list[str]:
        """The names the package itself registers (plugins loaded into this process, from
        a config, an entry point or a test, are left out)."""
        return [e.name for e in self.entries() if e.is_package]

    def help(self, name: str) -> str:
        return self._entries[name].help if name in self._entries else ""

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def tags_of(obj: Any) -> dict[str, frozenset[str]]:
    """The registry tags of a component instance or class ({} for unregistered objects)."""
    return getattr(obj, "registry_tags", {})


__all__ = ["TAGS", "Entry", "Registry", "RegistryError", "tags_of"]
