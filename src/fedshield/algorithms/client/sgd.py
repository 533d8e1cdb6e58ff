"""FedAvg's local rule: U steps (or E epochs) of mini-batch SGD (FedAvg, McMahan et al. 2017)."""

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm


@CLIENT_ALGORITHMS.register("sgd", tags=["local_dp"])
class LocalSGD(ClientAlgorithm):
    """Local mini-batch SGD (FedAvg, DRAG, BR-DRAG and the Byzantine defenses)."""
