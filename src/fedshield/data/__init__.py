"""Datasets, partitioners and the long-tail transform (SPEC §9)."""

from fedshield.data import datasets as _datasets  # noqa: F401  (fills the registry)
from fedshield.data import flwr_partitioners as _flwr  # noqa: F401  (Flower Datasets')
from fedshield.data import hf as _hf  # noqa: F401  (data.dataset = "hf:...")
from fedshield.data import partition as _partition  # noqa: F401
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.data.datasets import (
    DATASETS,
    DatasetInfo,
    dataset_info,
    load_dataset,
    parse_dataset_params,
)
from fedshield.data.longtail import long_tail_counts, long_tail_n_max, make_long_tail
from fedshield.data.partition import PARTITIONERS, check_sizes, partition, partitioner_params
from fedshield.data.split import carve, check_carve

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "DataBundle",
    "DatasetInfo",
    "TensorData",
    "carve",
    "check_carve",
    "check_sizes",
    "dataset_info",
    "load_dataset",
    "long_tail_counts",
    "long_tail_n_max",
    "make_long_tail",
    "parse_dataset_params",
    "partition",
    "partitioner_params",
]
