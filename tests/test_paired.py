"""fedshield.results.paired: the paired per-seed comparison rendered into the results pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshield.results import paired, render


def _rows(a: list[str], b: list[str]) -> list[dict[str, str]]:
    rows = [{"variant": "A", "seed": str(s), "m": v} for s, v in enumerate(a)]
    return rows + [{"variant": "B", "seed": str(s), "m": v} for s, v in enumerate(b)]


def test_worked_example() -> None:
    """d = (1, 2, 3): mean 2, sd 1, t_{0.975,2} = 4.3027 → h = 2.484; signs 3/0 → p = 2/8."""
    p = paired.paired(_rows(["1", "2", "3"], ["0", "0", "0"]), "A", "B", "m")
    assert p.diffs == [1.0, 2.0, 3.0]
    assert p.mean == pytest.approx(2.0)
    assert p.half == pytest.approx(4.302653 / 3**0.5, rel=1e-5)
    assert (p.wins_a, p.wins_b) == (3, 0)
    assert p.sign_p == pytest.approx(0.25)
    assert p.verdict == "undecided"  # 2 − 2.484 < 0: the interval covers zero


def test_verdicts_ties_and_diverged_runs() -> None:
    # B ahead by 5 ± small on seeds 0-3; seed 4's A run diverged (empty) and is not paired
    rows = _rows(["0.10", "0.11", "0.09", "0.10", ""], ["0.15", "0.16", "0.14", "0.15", "0.1"])
    p = paired.paired(rows, "A", "B", "m", scale=100)
    assert p.seeds == ["0", "1", "2", "3"]
    assert p.mean == pytest.approx(-5.0)
    assert p.verdict == "B ahead"
    # a tie is dropped from the sign test; one seed gives no interval → undecided
    q = paired.paired(_rows(["1", "2"], ["1", "1"]), "A", "B", "m")
    assert (q.wins_a, q.wins_b, q.sign_p) == (1, 0, 1.0)
    assert paired.paired(_rows(["1"], ["0"]), "A", "B", "m").verdict == "undecided"
    with pytest.raises(ValueError, match="two runs"):
        paired.paired(_rows(["1", "2"], ["0", "0"]) + _rows(["1"], []), "A", "B", "m")


def test_pairs_within_a_grid_key() -> None:
    rows = [
        {"variant": v, "seed": "0", "rho": rho, "m": m}
        for v, rho, m in [("A", "5", "1"), ("B", "5", "0"), ("A", "100", "0"), ("B", "100", "2")]
    ]
    p = paired.paired(rows, "A", "B", "m", by=["rho"])
    assert dict(zip(p.seeds, p.diffs)) == {"0/5": 1.0, "0/100": -2.0}


def test_render_block(tmp_path: Path) -> None:
    src = tmp_path / "cmp.csv"
    src.write_text("label,variant,seed,m\nx,A,0,0.5\ny,B,0,0.4\nz,A,1,0.6\nw,B,1,0.4\n")
    text = render.render(
        {"source": "cmp.csv", "paired": "A,B", "value": "m", "digits": "1"}, tmp_path
    )
    row = "| m | 2 (0, 1) | +15.0 ± 63.5 | 0: +10.0, 1: +20.0 | 2 / 0 | 0.500 | undecided |"
    assert row in text
    assert "sign test" in text


def test_pooled_sources_refuse_a_seed_twice(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("variant,seed,m\nA,0,0.5\nB,0,0.4\n")
    (tmp_path / "b.csv").write_text("variant,seed,m\nA,1,0.6\nB,1,0.4\n")
    text = paired.render_paired({"source": "a.csv,b.csv", "paired": "A,B", "value": "m"}, tmp_path)
    assert "| m | 2 (0, 1) |" in text
    with pytest.raises(ValueError, match="two runs"):
        paired.render_paired({"source": "a.csv,a.csv", "paired": "A,B", "value": "m"}, tmp_path)


def test_block_tests_each_grid_value_on_its_own(tmp_path: Path) -> None:
    rows = ["variant,seed,rho,m"] + [
        f"{v},{s},{rho},{m}"
        for v, rho, vals in [
            ("A", 5, (1, 2)),
            ("B", 5, (0, 0)),
            ("A", 100, (0, 0)),
            ("B", 100, (3, 5)),
        ]
        for s, m in enumerate(vals)
    ]
    (tmp_path / "c.csv").write_text("\n".join(rows) + "\n")
    text = paired.render_paired(
        {"source": "c.csv", "paired": "A,B", "value": "m", "by": "rho", "scale": "1"}, tmp_path
    )
    lines = [line for line in text.splitlines() if line.startswith("| m @")]
    assert [line.split(" | ")[0] for line in lines] == ["| m @ rho=5", "| m @ rho=100"]
    assert "| +1.5 ± 6.4 |" in lines[0] and "| -4.0 ± 12.7 |" in lines[1]


def test_variant_column_and_where_filter(tmp_path: Path) -> None:
    """A bench's runs.csv: ``variant=defense`` pairs two defenses, ``where=`` keeps one
    attack; without ``variant=`` the block still reads the ``variant`` column (none here)."""
    (tmp_path / "runs.csv").write_text(
        "defense,attack,share,seed,test_acc\n"
        "brdrag,adaptive_root,0.2,0,0.80\nfltrust,adaptive_root,0.2,0,0.70\n"
        "brdrag,adaptive_root,0.2,1,0.82\nfltrust,adaptive_root,0.2,1,0.70\n"
        "brdrag,ipm,0.2,0,0.10\nfltrust,ipm,0.2,0,0.90\n"
        "brdrag,ipm,0.2,1,0.10\nfltrust,ipm,0.2,1,0.90\n"
    )
    opts = {"source": "runs.csv", "paired": "brdrag,fltrust", "value": "test_acc"}
    text = render.render(
        {**opts, "variant": "defense", "where": "attack:adaptive_root", "by": "share"}, tmp_path
    )
    # d = (+10, +12) points: mean +11, sd √2, t_{0.975,1} = 12.706 → h = 12.7
    row = (
        "| test_acc @ share=0.2 | 2 (0, 1) | +11.0 ± 12.7 | 0: +10.0, 1: +12.0 | 2 / 0 "
        "| 0.500 | undecided |"
    )
    assert row in text
    assert "-80.0" not in text  # the ipm rows were filtered out
    # the default column is still ``variant``: nothing pairs in this file
    assert "| test_acc | 0 | - |" in render.render(opts, tmp_path)
    p = paired.paired(
        [{"defense": "A", "seed": "0", "m": "1"}, {"defense": "B", "seed": "0", "m": "0"}],
        "A", "B", "m", column="defense",
    )  # fmt: skip
    assert p.diffs == [1.0]


def test_two_equal_differences_are_undecided() -> None:
    """Two seeds +1.5, +1.5: the t interval has zero width, the sign test p = 0.5 — no
    evidence, so no verdict; three equal differences decide."""
    two = paired.paired(_rows(["2.5", "3.5"], ["1", "2"]), "A", "B", "m")
    assert (two.half, two.sign_p, two.verdict) == (0.0, 0.5, "undecided")
    three = paired.paired(_rows(["2.5", "3.5", "4.5"], ["1", "2", "3"]), "A", "B", "m")
    assert three.verdict == "A ahead"


def test_two_differences_equal_up_to_float32_rounding_are_undecided() -> None:
    """The FedCART T = 150 case: Minority accuracies logged as float32 (0.4575 read as
    0.45750001072883606) make two "equal" −1.5-point differences differ by ~6e-8, which gave
    a zero-looking interval and a verdict from two seeds."""
    a = ["0.8199999928474426", "0.7674999833106995"]
    b = ["0.8349999785423279", "0.7825000286102295"]
    for scale in (1.0, 100.0):  # as the page renders it: in points
        two = paired.paired(_rows(a, b), "A", "B", "m", scale=scale)
        assert 0 < two.half < 1e-4 * scale and two.verdict == "undecided"


def test_two_metrics_of_the_same_runs_pair_by_seed() -> None:
    """variant=@metric: A and B fill the metric's {} (robust vs fixed routing of one run)."""
    rows = [
        {"seed": "0", "route/robust/acc": "0.80", "route/fixed/acc": "0.78"},
        {"seed": "1", "route/robust/acc": "0.70", "route/fixed/acc": "0.71"},
        {"seed": "2", "route/robust/acc": "0.90", "route/fixed/acc": "0.86"},
    ]
    p = paired.paired(rows, "robust", "fixed", "route/{}/acc", scale=100, column="@metric")
    assert p.seeds == ["0", "1", "2"]
    assert p.diffs == pytest.approx([2.0, -1.0, 4.0])
    assert (p.wins_a, p.wins_b) == (2, 1)
    with pytest.raises(ValueError, match="no \\{\\}"):
        paired.paired(rows, "robust", "fixed", "route/robust/acc", column="@metric")


def test_a_difference_within_float32_rounding_is_a_tie_not_a_win() -> None:
    """0.025000000000000022 − 0.025 (one run's worst client logged through float32 on one
    side) is no win: the sign test drops it like an exact tie."""
    p = paired.paired(
        _rows(["0.025000000000000022", "0.5", "0.4"], ["0.025", "0.3", "0.6"]), "A", "B", "m"
    )
    assert (p.wins_a, p.wins_b) == (1, 1)
    assert p.sign_p == pytest.approx(1.0)


def test_lower_is_better_counts_negative_differences_as_a_wins() -> None:
    """Rounds to a target: A 2 and 4 rounds sooner than B on every seed is A ahead."""
    rows = _rows(["10", "12", "14"], ["14", "14", "18"])
    p = paired.paired(rows, "A", "B", "m", better=-1)
    assert p.diffs == [-4.0, -2.0, -4.0]
    assert (p.wins_a, p.wins_b) == (3, 0)
    assert p.verdict == "A ahead"
    higher = paired.paired(rows, "A", "B", "m")
    assert (higher.wins_a, higher.wins_b, higher.verdict) == (0, 3, "B ahead")


def test_worst_case_over_attacks_per_seed() -> None:
    """``worst=attack``: each side's value per seed is its minimum over the attacks, and a
    seed where either side lacks an attack's value (a diverged run) is not paired."""
    rows = [
        {"variant": v, "seed": s, "attack": a, "m": m}
        for v, s, a, m in [
            ("A", "0", "ipm", "0.8"), ("A", "0", "alie", "0.6"),
            ("B", "0", "ipm", "0.3"), ("B", "0", "alie", "0.9"),
            ("A", "1", "ipm", "0.7"), ("A", "1", "alie", "0.9"),
            ("B", "1", "ipm", "0.5"), ("B", "1", "alie", "0.6"),
            ("A", "2", "ipm", "0.9"), ("A", "2", "alie", ""),
            ("B", "2", "ipm", "0.1"), ("B", "2", "alie", "0.1"),
        ]
    ]  # fmt: skip
    p = paired.paired(rows, "A", "B", "m", scale=100, worst="attack")
    # seed 0: min(0.8, 0.6) − min(0.3, 0.9) = +30; seed 1: 0.7 − 0.5 = +20; seed 2 left out
    assert p.seeds == ["0", "1"]
    assert p.diffs == pytest.approx([30.0, 20.0])
    # lower is better: the worst is the maximum
    q = paired.paired(rows[:8], "A", "B", "m", scale=100, worst="attack", better=-1)
    assert q.diffs == pytest.approx([80 - 90, 90 - 60])
    with pytest.raises(ValueError, match="two runs"):
        paired.paired(rows + rows[:1], "A", "B", "m", worst="attack")


def test_labelled_sources_are_tested_apart(tmp_path: Path) -> None:
    """``labels=``: the same seeds in several sources (one sweep per Byzantine share) are
    each paired on their own, tagged with their label."""
    (tmp_path / "s20.csv").write_text("variant,seed,attack,m\nA,0,x,0.5\nB,0,x,0.4\n")
    (tmp_path / "s40.csv").write_text("variant,seed,attack,m\nA,0,x,0.2\nB,0,x,0.6\n")
    opts = {"source": "s20.csv,s40.csv", "labels": "20%,40%", "paired": "A,B", "value": "m"}
    text = paired.render_paired({**opts, "worst": "attack"}, tmp_path)
    lines = [line for line in text.splitlines() if line.startswith("| worst m")]
    assert [line.split(" | ")[:3] for line in lines] == [
        ["| worst m over attack @ 20%", "1 (0)", "+10.0"],
        ["| worst m over attack @ 40%", "1 (0)", "-40.0"],
    ]
    with pytest.raises(SystemExit, match="one label per source"):
        paired.render_paired({**opts, "labels": "20%"}, tmp_path)
