"""Differential privacy that composes with the defenses (docs/privacy.md).

* client-level central DP (DP-FedAvg): :mod:`~fedshield.privacy.clipping`,
  :mod:`~fedshield.privacy.sensitivity`, :mod:`~fedshield.privacy.central`;
* sample-level local DP-SGD through Opacus: :mod:`~fedshield.privacy.local`;
* accounting with Opacus' RDP accountant: :mod:`~fedshield.privacy.accountant`;
* ``[privacy]`` config → mechanisms, checks and the ε callback: :mod:`fedshield.sim.privacy`
  (the simulator's glue: this package imports nothing of the round loop above it).

Opacus (extra ``privacy``) is imported only when a mechanism is configured.
"""

from fedshield.privacy.accountant import epsilon, noise_multiplier_for
from fedshield.privacy.central import CentralDP
from fedshield.privacy.clipping import clip_rows
from fedshield.privacy.local import LocalDPSGD
from fedshield.privacy.sensitivity import Sensitivity, register_bound, sensitivity

__all__ = [
    "CentralDP",
    "LocalDPSGD",
    "Sensitivity",
    "clip_rows",
    "epsilon",
    "noise_multiplier_for",
    "register_bound",
    "sensitivity",
]
