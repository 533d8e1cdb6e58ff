"""Re-record a published grid's config hashes where the only change is the explicit opt-out
``server.round_defenses = []``: the data was made when an unset key meant no round defense,
which is what ``[]`` says now (docs/cross-round.md, "Default"); any other difference is refused.

    PYTHONPATH=src python tools/respell_opt_out.py demo
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedshield import config
from fedshield.provenance import sha256_text
from fedshield.sim.builder import build_components
from fedshield.sweep import expand, read_grid

DATA = Path(__file__).resolve().parents[1] / "docs" / "results" / "data"


def _hash(raw: dict) -> str:
    cfg = config.validate(raw)
    build_components(cfg)  # as a run resolves it before writing config.toml
    return sha256_text(config.dump(cfg))


def main(grid: str) -> None:
    """Every provenance record of ``grid``'s runs (the table's, the kernel spread's, ...)."""
    spec, where = read_grid(grid=grid)
    runs = expand(spec, where)[1]
    for path in sorted(DATA.glob("*.provenance.json")):
        prov = json.loads(path.read_text())
        if prov.get("grid") != grid or not prov.get("runs"):
            continue
        for run in runs:
            now = _hash(run.raw)
            if prov["runs"].get(run.name) == now:
                continue
            if run.raw.get("server", {}).get("round_defenses") != []:
                sys.exit(f"{path.name} {run.name}: changed, and not by the opt-out alone")
            before = json.loads(json.dumps(run.raw))
            del before["server"]["round_defenses"]
            if _hash(before) != prov["runs"].get(run.name):
                sys.exit(f"{path.name} {run.name}: changed beyond server.round_defenses = []")
            prov["runs"][run.name] = now
            print(f"{path.name} {run.name}: {now} (server.round_defenses = [] spelled out)")
        path.write_text(json.dumps(prov, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
