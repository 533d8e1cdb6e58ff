"""fedshield's server algorithms and aggregators as plain Flower Message-API strategies.

For a Flower app of your own, whose ClientApp returns its model's ``state_dict`` as an
``ArrayRecord`` and a ``MetricRecord`` with ``num-examples`` (Flower's convention)::

    from fedshield.flower.strategies import BRDRAG, Krum, FedshieldRule

    strategy = BRDRAG(root_data=(x_root, y_root), model_fn=Net, c=0.5)
    strategy = Krum(f=1)
    strategy = FedshieldRule(aggregator="trimmed_mean", aggregator_args={"f": 1}, server="fedacg")
    result = strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=10)

The adapter (:class:`~fedshield.flower.adapter.FedshieldRule`: any server algorithm × any
aggregator) lives in :mod:`fedshield.flower.adapter`, the named strategies in
:mod:`fedshield.flower.catalogue`; this module is the documented import path of both.
"""

from fedshield.flower import catalogue
from fedshield.flower.catalogue import *  # noqa: F403  (the names are the catalogue's __all__)

__all__ = list(catalogue.__all__)
