import numpy as np
import pytest
import torch

from fedshield.data import long_tail_counts, make_long_tail, partition
from fedshield.data.bundle import TensorData
from fedshield.data.split import carve
from fedshield.errors import ConfigError

LABELS = torch.from_numpy(np.random.default_rng(0).integers(0, 10, size=3000))


@pytest.mark.parametrize(
    "name,args",
    [("iid", {}), ("dirichlet", {"beta": 0.3}), ("shards", {"shards_per_client": 2})],
)
def test_every_sample_assigned_once_and_seeded(name, args):
    parts = partition(LABELS, 20, name, seed=1, **args)
    allidx = torch.cat(parts)
    assert len(parts) == 20
    assert sorted(allidx.tolist()) == list(range(len(LABELS)))
    again = partition(LABELS, 20, name, seed=1, **args)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    other = partition(LABELS, 20, name, seed=2, **args)
    assert not all(torch.equal(a, b) for a, b in zip(parts, other))


def _label_skew(parts):
    """Mean total-variation distance between client label distributions and the global one."""
    glob = torch.bincount(LABELS, minlength=10).float()
    glob /= glob.sum()
    tv = []
    for p in parts:
        h = torch.bincount(LABELS[p], minlength=10).float()
        tv.append(0.5 * (h / h.sum() - glob).abs().sum())
    return float(torch.stack(tv).mean())


def test_dirichlet_skew_grows_as_beta_falls():
    skews = [_label_skew(partition(LABELS, 20, "dirichlet", 0, beta=b)) for b in (10, 1, 0.1)]
    assert skews[0] < skews[1] < skews[2]
    assert _label_skew(partition(LABELS, 20, "iid", 0)) < skews[0]


def test_shards_give_few_classes_per_client():
    parts = partition(LABELS, 20, "shards", 0, shards_per_client=2)
    assert max(len(torch.unique(LABELS[p])) for p in parts) <= 4  # shards may straddle a class


def test_dirichlet_min_size_respected():
    parts = partition(LABELS, 30, "dirichlet", 0, beta=0.1, min_size=20)
    assert min(len(p) for p in parts) >= 20


def test_more_clients_than_samples_is_config_error():
    with pytest.raises(ConfigError, match="num_clients=4000 exceeds the 3000 training samples"):
        partition(LABELS, 4000, "iid", 0)


def test_unknown_partitioner_lists_known():
    with pytest.raises(KeyError, match="known: dirichlet, iid, shards"):
        partition(LABELS, 5, "pathological", 0)


def test_long_tail_cifar10_profile():
    counts = long_tail_counts(5000, 10, 50)
    assert counts == [5000, 3237, 2096, 1357, 878, 568, 368, 238, 154, 100]
    assert sum(counts) == 13996
    assert long_tail_counts(500, 100, 100)[-1] == 5  # CIFAR-100-LT, rho = 100


def test_make_long_tail_applies_profile():
    y = torch.arange(10).repeat_interleave(200)
    data = TensorData(torch.zeros(len(y), 1, 2, 2), y)
    lt = make_long_tail(data, 10, 10.0, seed=0)
    assert lt.class_counts(10).tolist() == long_tail_counts(200, 10, 10.0)


def test_carve_is_disjoint_and_seeded():
    y = torch.arange(100)
    data = TensorData(y.float()[:, None, None, None], y)
    rest, held = carve(data, {"root": 10, "val": 5}, seed=3)
    ids = [set(t.y.tolist()) for t in (rest, held["root"], held["val"])]
    assert len(ids[1]) == 10 and len(ids[2]) == 5 and len(ids[0]) == 85
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    with pytest.raises(ConfigError, match="leaves no training data"):
        carve(data, {"root": 100}, seed=0)
