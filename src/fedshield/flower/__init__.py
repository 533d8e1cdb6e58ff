"""fedshield as a Flower app (the only package that imports ``flwr``).

* :mod:`~fedshield.flower.strategy` — :class:`FedshieldStrategy`, a Message-API strategy
  wrapping any fedshield server algorithm, aggregator and attack;
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


__all__ = ["run_simulation"]
