"""fedshield as a Flower app (the only package that imports ``flwr``).

* :mod:`~fedshield.flower.experiment` — :class:`FedshieldStrategy`, a Message-API strategy
  running any fedshield experiment (server algorithm, aggregator and attack);
* :mod:`~fedshield.flower.client_app` — ``app``, a ClientApp wrapping any client algorithm;
* :mod:`~fedshield.flower.server_app` — ``app``, the ServerApp run by ``flwr run``;
* :mod:`~fedshield.flower.simulation` — :func:`run_simulation`, a config through Flower's
  simulation engine with the simulator's outputs (``fedshield run --backend flower``);
* :mod:`~fedshield.flower.codec` — tensors and payloads ↔ Flower records (record keys in
  :mod:`~fedshield.flower.keys`);
* :mod:`~fedshield.flower.node_state` — client state files on a SuperNode (``state-dir``),
  which survive a SuperNode restart;
* :mod:`~fedshield.flower.local` — :class:`~fedshield.flower.local.LocalGrid`, the app in
  process without Ray (debugging, fast tests);
* :mod:`~fedshield.flower.byzantine` — which attacks run on SuperNodes, which in the strategy.

Flower-native strategies, for a Flower app of your own (docs/flower-strategies.md):

* :mod:`~fedshield.flower.strategies` — every fedshield server algorithm × aggregator as a
  subclass of Flower's ``FedAvg`` strategy: the adapter
  (:class:`~fedshield.flower.adapter.FedshieldRule`) and the catalogue of named strategies
  (:mod:`~fedshield.flower.catalogue`: ``BRDRAG``, ``DRAG``, ``FLTrust``, ``Krum``,
  ``Median``, ``CenteredClipping``, ...), also importable from here
  (``from fedshield.flower import BRDRAG``);
* :mod:`~fedshield.flower.privacy` — :func:`central_dp`, client-level DP for them at the
  rule's own sensitivity;
* :mod:`~fedshield.flower.replies` — one reply per sampled node, to its own instruction;
* :mod:`~fedshield.flower.client_tools` — the client parts some of them need
  (:class:`~fedshield.flower.client_tools.ScaffoldClient`,
  :func:`~fedshield.flower.client_tools.drag_calibrate_local`);
* :mod:`~fedshield.flower.arrays` — a model's ``ArrayRecord`` ↔ flat vectors, checked.

See docs/deployment.md for SuperLink + SuperNodes on several hosts.
"""

from __future__ import annotations

from typing import Any

from fedshield.errors import FedshieldError

try:
    import flwr  # noqa: F401
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise FedshieldError(
        "the Flower backend needs flwr with its simulation extra: pip install 'fedshield[flower]'"
    ) from _err


def run_simulation(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See :func:`fedshield.flower.simulation.run_simulation` (imported lazily: Ray is heavy)."""
    from fedshield.flower.simulation import run_simulation as run

    return run(*args, **kwargs)


#: the client parts re-exported lazily (the strategies come with all of
#: :data:`fedshield.flower.catalogue.__all__`, read on first use: no second list of them)
_CLIENT_TOOLS = ("AlgorithmClient", "FedCARTTrainer", "ScaffoldClient", "drag_calibrate_local")


def __getattr__(name: str) -> Any:
    """The Flower-native strategies and client parts, imported on first use."""
    import importlib
    import pkgutil

    missing = AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name.startswith("__") and name != "__all__":
        raise missing
    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        raise missing  # a submodule not imported yet: the import system loads it
    strategies = importlib.import_module("fedshield.flower.strategies")
    if name == "__all__":  # ``from fedshield.flower import *``
        return ["run_simulation", *strategies.__all__, *_CLIENT_TOOLS]
    if name in strategies.__all__:
        return getattr(strategies, name)
    if name in _CLIENT_TOOLS:
        return getattr(importlib.import_module("fedshield.flower.client_tools"), name)
    raise missing
