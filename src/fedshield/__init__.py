"""fedshield: secure federated learning under heterogeneity.

DRAG / BR-DRAG aggregation, security-adaptive early-exit ViTs and FedCART, with their
baselines, attacks and evaluations, on an in-process simulator and on Flower.
"""

__version__ = "0.1.0"
