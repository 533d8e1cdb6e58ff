"""Whether a stored run still counts at the current code, by evidence (docs/results-store.md).

A record (:mod:`fedshield.results.store`) is

* ``valid`` when every fedshield module its run loaded hashes the same now: the code that
  made it is the code here;
* ``replayed`` when some changed, but a replay of its first rounds at the current code
  (:func:`replay`: the record's resolved config and seed, :data:`ROUNDS` rounds) gave its
  logged per-round metrics back within :func:`tolerance`; the replay leaves a stamp file
  beside the record (:func:`write_stamp`) naming the module hashes it held for, so the
  record counts for that code from then on, on every machine the stamp is copied to;
* ``unchecked`` when some changed and no replay at this code was made yet; and
* ``stale`` when a replay at this code did not reproduce it.

Only ``valid`` and ``replayed`` records count: the others are named, and left out of every
number. A replay checks what the record logged, so a change that moves the numbers is
caught even where it lies in a module no hash-by-file scheme would tie to the run
(benchopt keys on each component's own file, DVC on declared dependencies). What it cannot
see: a change that acts only after the replayed rounds (raise ``rounds``), and code
outside fedshield (torch; its version is recorded).
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshield.provenance import combined_sha256, sha256_text
from fedshield.results.store import (
    SUFFIX,
    current_hashes,
    get_manifest,
    is_reference,
    put_manifest,
)

#: Rounds a replay runs (the first of the record's).
ROUNDS = 2
#: The per-round metrics a replay compares (those a record logged).
METRICS = ("test_acc", "test_loss", "train/loss")
#: Twice the spread of the demo's median cell's final accuracy over the CPU kernel
#: variants (docs/results/data/demo-kernels.csv: 0.012, tools/demo_kernels.py), as
#: tools/results.py's sampled cells allow; used when the repository's data is absent.
KERNEL_TOL = 0.024
DEMO_KERNELS = Path(__file__).resolve().parents[3] / "docs/results/data/demo-kernels.csv"


def tolerance(path: Path = DEMO_KERNELS) -> float:
    """How far a replay may differ: twice the measured kernel spread (:data:`KERNEL_TOL`),
    as an absolute difference of an accuracy and a relative one of a loss (the spread is
    measured on accuracy, whose scale is 1; no loss spread is measured). After 20 rounds,
    the measured one; a replay's first rounds have had fewer to drift apart in."""
    if not path.exists():
        return KERNEL_TOL
    rows = {r["label"]: r for r in csv.DictReader(path.open())}
    return 2 * float(rows["median"]["final_test_acc_spread"])


@dataclass
class Status:
    path: Path
    record: dict[str, Any]
    state: str  # valid | replayed | unchecked | stale
    changed: list[str] = field(default_factory=list)  # modules whose hash differs now
    why: str = ""

    @property
    def counts(self) -> bool:
        return self.state in ("valid", "replayed")

    def line(self) -> str:
        r = self.record
        head = f"{self.state:9} {self.path.name}  {r.get('name')} seed {r.get('seed')}"
        head += f"  @ {str(r.get('commit') or 'unknown')[:7]}"
        if not self.changed:
            return head
        mods = ", ".join(self.changed[:4]) + (f" and {len(self.changed) - 4} more"
                                              if len(self.changed) > 4 else "")  # fmt: skip
        return f"{head}  changed: {mods}" + (f"; {self.why}" if self.why else "")


def stem(path: Path) -> str:
    return path.name.removesuffix(SUFFIX)


def code_hash(hashes: dict[str, str | None]) -> str:
    return combined_sha256({k: v or "absent" for k, v in hashes.items()})


def stamps(path: Path) -> list[dict[str, Any]]:
    """The replay stamps beside the record ``path`` (their modules read back from their
    manifest)."""
    out = []
    for f in sorted(path.parent.glob(f"{stem(path)}.replay-*.json")):
        stamp = json.loads(f.read_text())
        if is_reference(stamp.get("modules")):
            stamp["modules"] = get_manifest(path.parent, stamp["modules"], f)
        out.append(stamp)
    return out


def status(path: Path, rec: dict[str, Any]) -> Status:
    """What ``rec`` (stored at ``path``) is at the current code (see the module doc)."""
    made: dict[str, str] = rec.get("modules") or {}
    now = current_hashes(made)
    changed = sorted(m for m, h in made.items() if now[m] != h)
    if not changed:
        return Status(path, rec, "valid")
    here = code_hash(now)
    mine = [s for s in stamps(path) if s.get("code") == here]
    if any(s.get("ok") for s in mine):
        return Status(path, rec, "replayed", changed)
    if mine:
        return Status(path, rec, "stale", changed, mine[0].get("why", "its replay differs"))
    return Status(path, rec, "unchecked", changed, "not replayed at this code yet")


@dataclass
class Replay:
    ok: bool
    rounds: int
    tol: float
    worst: float  # the largest difference found (in units of its tolerance)
    why: str


def replay_rounds(config_text: str, rounds: int) -> tuple[list[dict[str, Any]], bool]:
    """The first ``rounds`` round records of the run of ``config_text`` at the current code,
    in memory (the config untouched: the record's first rounds, not a shorter run), and
    whether it diverged (it stops at that round, as the run did)."""
    import tomllib

    from fedshield import config, threads
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    cfg = config.validate(tomllib.loads(config_text))
    threads.set_threads(cfg.run.threads)
    sim = Simulator(build(cfg), None)
    sim.start()
    out = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        rec = sim.run_round(rnd)
        out.append(sim.record(rec, time.perf_counter() - t0))
        if sim.diverged(rec):
            return out, True
    return out, False


def compare(
    logged: list[dict[str, Any]], got: list[dict[str, Any]], tol: float
) -> tuple[float, str]:
    """The worst difference of :data:`METRICS` over the rounds (in units of ``tol``: above
    1 fails) and where it lies; a metric non-finite on one side only, or missing from the
    replay where the record logged it, is infinitely far."""
    worst, why = 0.0, ""
    for a, b in zip(logged, got):
        for m in METRICS:
            if m not in a:
                continue
            x, y = a[m], b.get(m)
            if y is None or math.isfinite(x) != math.isfinite(y):
                d = math.inf
            elif not math.isfinite(x):
                d = 0.0
            else:
                scale = 1.0 if m.endswith("acc") else max(abs(x), 1e-12)
                d = abs(x - y) / scale / tol
            if d > worst:
                worst, why = d, f"round {a.get('round')} {m}: logged {x:.6g}, replay {y}"
    return worst, why


def replay(rec: dict[str, Any], rounds: int = ROUNDS, tol: float | None = None) -> Replay:
    """Replay ``rec``'s first ``rounds`` rounds here and compare (:func:`compare`)."""
    tol = tolerance() if tol is None else tol
    logged = rec.get("rounds") or []
    n = min(rounds, len(logged))
    if n == 0:
        return Replay(False, 0, tol, math.inf, "the record logged no rounds")
    got = replay_rounds(rec["config"], n)[0]
    worst, why = compare(logged[:n], got, tol)
    if len(got) < n:
        worst, why = math.inf, f"the replay diverged at round {len(got)}"
    ok = worst <= 1.0
    return Replay(ok, n, tol, worst, why if not ok else f"largest difference {why}")


def write_stamp(path: Path, rec: dict[str, Any], result: Replay) -> Path:
    """The replay's verdict beside the record, for the module hashes as they are now."""
    from fedshield.provenance import kernel_signature, source_commit

    now = current_hashes(rec.get("modules") or {})
    stamp = {
        "record": path.name,
        "code": code_hash(now),
        "modules": put_manifest(path.parent, now),  # shared by every stamp of this code
        "ok": result.ok,
        "rounds": result.rounds,
        "tol": result.tol,
        "worst": result.worst if math.isfinite(result.worst) else "inf",
        "why": result.why,
        "commit": source_commit().get("commit"),
        "kernels": kernel_signature(),
    }
    return _save_stamp(path.parent, stamp)


def _save_stamp(folder: Path, stamp: dict[str, Any]) -> Path:
    """``stamp`` into ``folder`` as ``<record stem>.replay-<code>-<text hash>.json``."""
    text = json.dumps(stamp, indent=1, sort_keys=True) + "\n"
    code = str(stamp["code"])[:12]
    name = str(stamp["record"]).removesuffix(SUFFIX)
    out = folder / f"{name}.replay-{code}-{sha256_text(text)[:8]}.json"
    out.write_text(text)
    return out


def compact(store_dir: Path) -> tuple[int, int]:
    """The records (:func:`fedshield.results.store.compact`) and replay stamps of
    ``store_dir`` that hold their module hashes inline, rewritten with a manifest
    reference (a stamp under the name of its new text); how many of each."""
    from fedshield.results import store

    records = store.compact(store_dir)
    done = 0
    for f in sorted(store_dir.glob("*.replay-*.json")):
        stamp = json.loads(f.read_text())
        mods = stamp.get("modules")
        if not isinstance(mods, dict) or is_reference(mods):
            continue
        stamp["modules"] = put_manifest(store_dir, mods)
        if _save_stamp(store_dir, stamp) != f:
            f.unlink()
        done += 1
    return records, done


def check(path: Path, rec: dict[str, Any], rounds: int = ROUNDS) -> Status:
    """``rec``'s status, replaying it first when it is unchecked at this code."""
    st = status(path, rec)
    if st.state == "unchecked":
        write_stamp(path, rec, replay(rec, rounds))
        st = status(path, rec)
    return st


def one_thread() -> None:
    """A parallel replay worker's set-up (``fedshield results replay -j N``): one thread."""
    import torch

    torch.set_num_threads(1)


def check_file(path: Path, rounds: int = ROUNDS) -> tuple[str, str]:
    """:func:`check` of the record at ``path``: its state and status line (a parallel
    replay worker's task)."""
    from fedshield.results.store import read

    st = check(path, read(path), rounds)
    return st.state, st.line()


__all__ = [
    "KERNEL_TOL",
    "METRICS",
    "ROUNDS",
    "Replay",
    "Status",
    "check",
    "check_file",
    "compare",
    "one_thread",
    "replay",
    "replay_rounds",
    "status",
    "tolerance",
    "write_stamp",
]
