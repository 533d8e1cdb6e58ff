"""Test helpers for the CLI's bad-input contract: one line, ``error: ...``, exit code 2."""

from __future__ import annotations

from typing import Any


def one_line_error(capsys: Any, argv: list[str], *expected: str) -> str:
    """Run ``fedshield argv`` and assert it failed with exit code 2 and exactly one stderr
    line starting ``error: `` that contains every ``expected`` text; returns the line.
    ``capsys`` is pytest's fixture."""
    from fedshield.cli import main

    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("error: "), err[0]
    for e in expected:
        assert e in err[0], err[0]
    return err[0]


__all__ = ["one_line_error"]
