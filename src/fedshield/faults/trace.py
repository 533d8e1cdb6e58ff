"""Availability from a trace file: client × round 0/1 (FedScale's device availability
traces, Lai et al. ICML 2022; FLGo's trace-driven availability, Wang et al. 2023).

The file is CSV (one line per client, comma-separated 0/1 per round; blank lines and
lines starting with ``#`` are skipped) or JSON (a list of one list per client of 0/1 or
true/false). It has exactly M rows of the same length R ≥ 1; round t reads column
(t − 1) mod R, so a one-day trace repeats. Checked when the run is built: any problem is
one error line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel

KEY = "faults.params.trace.path"


class TraceParams(Params):
    path: str | None = Field(
        None,
        description="CSV or JSON file of client × round 0/1 (relative to the working directory)",
    )


def _rows_csv(text: str) -> list[list[str]]:
    lines = [ln.strip() for ln in text.splitlines()]
    return [[c.strip() for c in ln.split(",")] for ln in lines if ln and not ln.startswith("#")]


def _rows_json(text: str) -> list[Any]:
    data = json.loads(text)
    if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise ValueError("expected a JSON list of one list per client")
    return data


def _cell(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1, "0", "1") and not isinstance(value, float):
        return value in (1, "1")
    raise ValueError(f"{value!r} is not 0 or 1")


def read_trace(path: str | Path, num_clients: int) -> np.ndarray:
    """The boolean [M, R] trace of ``path``; ConfigError naming the file otherwise."""
    p = Path(path).expanduser()
    where = f"{KEY}: {p}"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read the trace file ({why})") from None
    try:
        rows = _rows_json(text) if p.suffix.lower() == ".json" else _rows_csv(text)
        if len(rows) != num_clients:
            raise ValueError(f"{len(rows)} client rows, expected data.num_clients={num_clients}")
        width = len(rows[0])
        for i, row in enumerate(rows):
            if len(row) != width or width == 0:
                raise ValueError(f"client row {i} has {len(row)} rounds, row 0 has {width}")
        cells = [[_cell(v) for v in row] for row in rows]
    except (ValueError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: {err}") from None
    return np.asarray(cells, dtype=bool)


@FAULT_MODELS.register("trace", tags=["stage=availability"])
class Trace(FaultModel):
    """Client k is online in round t exactly when the trace file says so.

    Rows are clients, columns rounds; round t reads column (t − 1) mod R."""

    params_schema = TraceParams
    path: str | None

    def prepare(self, env: FaultEnv) -> None:
        if self.path is None:
            raise ConfigError(f"{KEY}: required (a CSV or JSON file of client × round 0/1)")
        self._trace = read_trace(self.path, env.num_clients)

    def available(self, rnd: int, env: FaultEnv) -> np.ndarray:
        return self._trace[:, (rnd - 1) % self._trace.shape[1]].copy()

    def rate(self, env: FaultEnv) -> float | None:
        """The share of ones in the trace (online client-rounds over all)."""
        return float(self._trace.mean())
