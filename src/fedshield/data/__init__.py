"""Datasets, partitioners and the long-tail transform (docs/usage.md). Every module here registers
its datasets and partitioners on import (``hf`` gives ``data.dataset = "hf:..."``, and
``flwr_partitioners`` Flower Datasets' partitioners)."""

from fedshield._plugins import import_submodules
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

import_submodules(__name__)

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
