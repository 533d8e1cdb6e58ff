"""FedAvg's local rule: U steps (or E epochs) of mini-batch SGD (SPEC §1)."""

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm
from fedshield.algorithms.client.functional import VectorForm


@CLIENT_ALGORITHMS.register("sgd", tags=["vectorizable"])
class LocalSGD(ClientAlgorithm):
    """Local mini-batch SGD (FedAvg, DRAG, BR-DRAG and the Byzantine defenses)."""

    def vector_form(self) -> VectorForm:
        return VectorForm(self)
