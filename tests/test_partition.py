import numpy as np
import pytest
import torch

from fedshield.config import DataConfig
from fedshield.data import (
    long_tail_counts,
    long_tail_n_max,
    make_long_tail,
    partition,
    partitioner_params,
)
from fedshield.data.bundle import TensorData
from fedshield.data.split import carve
from fedshield.errors import ConfigError, DataError

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
    with pytest.raises(ConfigError, match="^data.partition: unknown partitioner 'shard' .did you"):
        partition(LABELS, 5, "shard", 0)
    with pytest.raises(KeyError, match="known: dirichlet, flwr_dirichlet, .*, iid, shards"):
        partition(LABELS, 5, "pathological", 0)


def test_partitioner_params_come_from_the_data_section():
    cfg = DataConfig(partition="dirichlet", beta=0.1, min_size=3, shards_per_client=5)
    assert partitioner_params("dirichlet", cfg).kwargs() == {"beta": 0.1, "min_size": 3}
    assert partitioner_params("shards", cfg).kwargs() == {"shards_per_client": 5}
    assert partitioner_params("iid", cfg).kwargs() == {}
    assert partitioner_params("dirichlet", {"beta": 2.0}).kwargs() == {"beta": 2.0, "min_size": 1}
    with pytest.raises(ConfigError, match=r"^data.beta: Input should be greater than 0"):
        partitioner_params("dirichlet", {"beta": 0.0})
    with pytest.raises(ConfigError, match=r"^data.shards_per_client: Input should be a valid int"):
        partition(LABELS, 5, "shards", 0, shards_per_client=2.5)
    with pytest.raises(ConfigError, match=r"^data.shards_per_client: unknown key"):
        partition(LABELS, 5, "dirichlet", 0, shards_per_client=2)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # 0/0 shares gave NaN cut points
def test_dirichlet_survives_underflowing_shares():
    # Dir(1e-3) puts (numerically) all mass on one client; once that client is full, every
    # remaining share can be exactly 0. The draw is then repeated instead of dividing by 0.
    labels = np.repeat(np.arange(10), 100)
    parts = partition(labels, 10, "dirichlet", 0, beta=1e-3, min_size=1)
    assert sorted(torch.cat(parts).tolist()) == list(range(1000)) and min(map(len, parts)) >= 1


def test_long_tail_cifar10_profile():
    counts = long_tail_counts(5000, 10, 50)
    assert counts == [5000, 3237, 2096, 1357, 878, 568, 368, 238, 154, 100]
    assert sum(counts) == 13996
    assert long_tail_counts(500, 100, 100)[-1] == 5  # CIFAR-100-LT, rho = 100


def _labels(counts):
    y = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))
    return TensorData(torch.zeros(len(y), 1, 1, 1), y[torch.randperm(len(y))])


def test_make_long_tail_applies_profile():
    lt = make_long_tail(_labels([200] * 10), 10, 10.0, seed=0)
    assert lt.class_counts(10).tolist() == long_tail_counts(200, 10, 10.0)


def test_make_long_tail_cifar10_rho50_worked_example():
    lt = make_long_tail(_labels([5000] * 10), 10, 50.0, seed=1)  # the exponential long-tail profile
    assert lt.class_counts(10).tolist() == [5000, 3237, 2096, 1357, 878, 568, 368, 238, 154, 100]


def test_long_tail_on_unbalanced_source_keeps_class_0_as_head():
    # Class 2 is the bottleneck: n_max = min(1000, 800·10^(1/3), 100·10^(2/3), 900·10) = 464.
    counts = [1000, 800, 100, 900]
    assert long_tail_n_max(counts, 10.0) == 464
    lt = make_long_tail(_labels(counts), 4, 10.0, seed=0)
    assert lt.class_counts(4).tolist() == [464, 215, 99, 46]  # ⌊464·10^(−c/3)⌋, 464/46 ≈ ρ


def test_svhn_lt_head_is_class_0():
    svhn = [4948, 13861, 10585, 8497, 7458, 6882, 5727, 5595, 5045, 4659]  # train, digit 0..9
    got = make_long_tail(_labels(svhn), 10, 50.0, seed=0).class_counts(10).tolist()
    assert got == long_tail_counts(4948, 10, 50.0) and got[0] == 4948 and got[-1] == 98
    assert all(a >= b for a, b in zip(got, got[1:]))  # monotone (was [4948, 8974, 5810, ...])
    assert all(n <= c for n, c in zip(got, svhn))


def test_long_tail_refuses_an_absent_class():
    with pytest.raises(DataError, match="class 2 has no training sample"):
        make_long_tail(_labels([10, 10, 0, 10]), 4, 5.0, seed=0)


def test_carve_is_disjoint_and_seeded():
    y = torch.arange(100)
    data = TensorData(y.float()[:, None, None, None], y)
    rest, held = carve(data, {"root": 10, "val": 5}, seed=3)
    ids = [set(t.y.tolist()) for t in (rest, held["root"], held["val"])]
    assert len(ids[1]) == 10 and len(ids[2]) == 5 and len(ids[0]) == 85
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    with pytest.raises(ConfigError, match="leaves no training data"):
        carve(data, {"root": 100}, seed=0)
