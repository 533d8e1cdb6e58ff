"""Differential privacy that composes with the defenses (SPEC §13).

* client-level central DP (DP-FedAvg): :mod:`~fedshield.privacy.clipping`,
  :mod:`~fedshield.privacy.sensitivity`, :mod:`~fedshield.privacy.central`;
* sample-level local DP-SGD through Opacus: :mod:`~fedshield.privacy.local`;
* accounting with Opacus' RDP accountant: :mod:`~fedshield.privacy.accountant`;
* ``[privacy]`` config → mechanisms, checks and the ε callback: :mod:`~fedshield.privacy.setup`.

Opacus (extra ``privacy``) is imported only when a mechanism is configured.
"""

from fedshield.privacy.accountant import epsilon, noise_multiplier_for
from fedshield.privacy.central import CentralDP
from fedshield.privacy.clipping import clip_rows
from fedshield.privacy.local import LocalDPSGD
from fedshield.privacy.sensitivity import Sensitivity, register_bound, sensitivity
from fedshield.privacy.setup import PrivacySetup, attach_privacy

__all__ = [
    "CentralDP",
    "LocalDPSGD",
    "PrivacySetup",
    "Sensitivity",
    "attach_privacy",
    "clip_rows",
    "epsilon",
    "noise_multiplier_for",
    "register_bound",
    "sensitivity",
]
