"""The run store: one record per finished run, one gzip-compressed JSON-lines file each.

A record (:func:`make_record`) holds what a results page reads of a run and what made it:
the resolved config (TOML) and its hash, the seed, the per-round metrics, the summary, the
commit, and the SHA-256 of every ``fedshield`` module the run's process had loaded when it
finished (:func:`module_hashes`), with the torch / numpy versions and the CPU kernel
signature (:func:`fedshield.provenance.kernel_signature`). Its file is named
``<cell key>-s<seed>-<record hash>.jsonl.gz`` (:func:`record_name`): the same record always
gets the same name and bytes (gzip without a timestamp), two different ones never, so
stores made on several machines merge by copying files. Which records still count at the
current code: :mod:`fedshield.results.validity`. See docs/results-store.md.

**Module manifests.** The module hashes are most of a record (~200 modules: 20 kB of hex, which
gzip cannot shrink) and are the same for every run of one code, so a record's file holds a
reference ``{"@manifest": sha}`` to ``manifests/<sha>.json.gz`` beside it, written once per
distinct set (:func:`put_manifest`), and :func:`read` gives the record back whole: its name,
hash and fields are those of the whole record. Merging stores copies ``manifests/`` too; a
record whose manifest is missing is refused by name, never read without its modules.

The cell key (:func:`cell_key`) is the hash of the resolved config without its ``run``
table (threads, device, progress: how a run executes, as a sweep's resume ignores them,
:data:`fedshield.sim.rundir.RESUMABLE`): a run made with ``-j 2``'s capped threads is the
same cell as one made with one process.

A process writes records to the store named by ``$FEDSHIELD_STORE`` (:func:`default_store`;
``fedshield run/sweep --store DIR`` set it), so a sweep's spawned processes write theirs
as each run finishes.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import platform
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

FORMAT = 1
STORE_ENV = "FEDSHIELD_STORE"
SUFFIX = ".jsonl.gz"
#: The folder of module manifests inside a store, and a record's reference to one.
MANIFESTS = "manifests"
MANIFEST_KEY = "@manifest"
#: Where a repository's records are published (``make results ... OUT=.``).
REPO_STORE = Path("docs") / "results" / "store"


def default_store() -> Path | None:
    """The store this process writes records to: ``$FEDSHIELD_STORE``, or None (none)."""
    where = os.environ.get(STORE_ENV, "").strip()
    return Path(where) if where else None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_ours(name: str) -> bool:
    return name == "fedshield" or name.startswith("fedshield.")


def module_hashes() -> dict[str, str]:
    """``{module: SHA-256 of its file}`` for every ``fedshield`` module loaded in this
    process (imported helpers included: what benchopt's per-file keys miss)."""
    out = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if _is_ours(name) and f and Path(f).is_file():
            out[name] = _sha(Path(f).read_bytes())
    return dict(sorted(out.items()))


def current_hashes(names: Iterable[str]) -> dict[str, str | None]:
    """The SHA-256 of each module's file as the code is now (None: no such module any
    more), found without importing it where it is not loaded yet."""
    out: dict[str, str | None] = {}
    for name in names:
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None) if mod is not None else None
        if f is None:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            f = spec.origin if spec is not None and spec.has_location else None
        out[name] = _sha(Path(f).read_bytes()) if f and Path(f).is_file() else None
    return out


def cell_key(config_text: str) -> str:
    """The (config, seed) cell of a resolved config: its hash without the ``run`` table."""
    cfg = tomllib.loads(config_text)
    cfg.pop("run", None)
    return _sha(_canonical(cfg))


def _scalars(record: dict[str, Any]) -> dict[str, Any]:
    """A round's record without its nested tables (per-client lists)."""
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool)}  # fmt: skip


def make_record(
    config_text: str,
    history: Iterable[dict[str, Any]],
    summary: dict[str, Any],
    made_by: str,
) -> dict[str, Any]:
    """The record of a run that just finished in this process (its modules are this
    process's: call it at the end of the run)."""
    import numpy
    import torch

    from fedshield import __version__
    from fedshield.provenance import kernel_signature, sha256_text, source_commit

    cfg = tomllib.loads(config_text)
    src = source_commit()
    return {
        "format": FORMAT,
        "name": cfg.get("name"),
        "seed": cfg.get("seed"),
        "cell": cell_key(config_text),
        "config_sha256": sha256_text(config_text),
        "config": config_text,
        "rounds": [_scalars(r) for r in history],
        "summary": {k: v for k, v in summary.items() if k != "out"},
        "commit": src.get("commit"),
        "dirty": src.get("dirty"),
        "fedshield": __version__,
        "made_by": made_by,
        "modules": module_hashes(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
        },
        "kernels": kernel_signature(),
    }


def record_hash(rec: dict[str, Any]) -> str:
    return _sha(_canonical(rec))


def record_name(rec: dict[str, Any]) -> str:
    """``<cell key 16>-s<seed>-<record hash 12>.jsonl.gz``: same record, same name."""
    return f"{rec['cell'][:16]}-s{rec['seed']}-{record_hash(rec)[:12]}{SUFFIX}"


def _gz(line: bytes) -> bytes:
    return gzip.compress(line + b"\n", mtime=0)  # no timestamp: same record, same bytes


def _atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file: a stopped write leaves nothing half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _manifest_path(store: Path, sha: str) -> Path:
    return store / MANIFESTS / f"{sha}.json.gz"


def put_manifest(store: Path, modules: dict[str, Any]) -> dict[str, str]:
    """``modules`` into ``store``'s manifests (once per distinct content); its reference."""
    data = _canonical(modules)
    sha = _sha(data)
    path = _manifest_path(store, sha)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path, gzip.compress(data, mtime=0))
    return {MANIFEST_KEY: sha}


def get_manifest(store: Path, ref: dict[str, Any], owner: Path) -> dict[str, Any]:
    """The modules a reference names; ValueError naming ``owner`` when the manifest is
    missing or its content does not hash to its name."""
    sha = str(ref[MANIFEST_KEY])
    path = _manifest_path(store, sha)
    if not path.is_file():
        raise ValueError(
            f"{owner}: its module manifest {path} is missing (copy the store's {MANIFESTS}/ "
            "folder with its records)"
        )
    data = gzip.decompress(path.read_bytes())
    if _sha(data) != sha:
        raise ValueError(f"{owner}: its module manifest {path} does not match its hash")
    out: dict[str, Any] = json.loads(data)
    return out


def is_reference(modules: Any) -> bool:
    return isinstance(modules, dict) and set(modules) == {MANIFEST_KEY}


def write(rec: dict[str, Any], store: Path) -> Path:
    """``rec`` into ``store`` (created), atomically: a part stopped mid-write leaves no
    half record; its modules go to a shared manifest (module docstring). Returns its path
    (an existing one is the same record: kept)."""
    store.mkdir(parents=True, exist_ok=True)
    path = store / record_name(rec)
    if not path.exists():
        _atomic(path, _gz(_packed(rec, store)))
    return path


def _packed(rec: dict[str, Any], store: Path) -> bytes:
    mods = rec.get("modules")
    if isinstance(mods, dict) and mods and not is_reference(mods):
        rec = {**rec, "modules": put_manifest(store, mods)}
    return json.dumps(rec, sort_keys=True, default=str).encode()


def _raw(path: Path) -> dict[str, Any]:
    """The record line of ``path`` as written (modules possibly a manifest reference)."""
    with gzip.open(path, "rt") as fh:
        rec: dict[str, Any] = json.loads(fh.readline())
    return rec


def read(path: Path) -> dict[str, Any]:
    """The record in ``path`` (its first line), with its modules read back from their
    manifest."""
    rec = _raw(path)
    if is_reference(rec.get("modules")):
        rec["modules"] = get_manifest(path.parent, rec["modules"], path)
    return rec


def compact(store: Path) -> int:
    """Rewrite the records of ``store`` that hold their modules inline with a manifest
    reference (the same names: a record's name is its whole content's hash); how many."""
    done = 0
    for path in files(store):
        raw = _raw(path)
        if is_reference(raw.get("modules")) or not raw.get("modules"):
            continue
        if record_name(raw) != path.name:
            raise ValueError(f"{path}: its content does not hash to its name; left as it is")
        _atomic(path, _gz(_packed(raw, store)))
        done += 1
    return done


def files(*stores: Path) -> list[Path]:
    """The record files of ``stores`` (one store's copy of a file shared by several, once)."""
    seen: dict[str, Path] = {}
    for s in stores:
        for f in sorted(s.glob(f"*{SUFFIX}")) if s.is_dir() else []:
            seen.setdefault(f.name, f)
    return list(seen.values())


def records(*stores: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for f in files(*stores):
        yield f, read(f)


def store_run(
    config_text: str,
    history: Iterable[dict[str, Any]],
    summary: dict[str, Any],
    made_by: str,
    store: Path | None = None,
) -> Path | None:
    """Write the record of a run that just finished to ``store`` (default
    :func:`default_store`); None when there is no store."""
    store = store if store is not None else default_store()
    if store is None:
        return None
    return write(make_record(config_text, history, summary, made_by), store)


def load_frame(*stores: Path) -> Any:
    """Every record of ``stores`` (default: the repository's) as a pandas DataFrame, one row
    per record: its scalars and the summary's (``summary.final_test_acc``...); needs pandas
    (not a dependency of fedshield). One file alone: ``pd.read_json(f, lines=True)``."""
    import pandas as pd  # type: ignore[import-untyped]

    stores = stores or (REPO_STORE,)
    rows = []
    for f, rec in records(*stores):
        row = {k: v for k, v in rec.items() if k not in ("rounds", "modules", "config")}
        row["file"] = f.name
        rows.append(row)
    return pd.json_normalize(rows, max_level=1)


__all__ = [
    "MANIFESTS",
    "REPO_STORE",
    "STORE_ENV",
    "cell_key",
    "compact",
    "current_hashes",
    "default_store",
    "files",
    "get_manifest",
    "is_reference",
    "load_frame",
    "make_record",
    "module_hashes",
    "put_manifest",
    "read",
    "record_name",
    "records",
    "store_run",
    "write",
]
