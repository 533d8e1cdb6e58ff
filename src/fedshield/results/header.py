"""A results page's header, the block ``<!-- fedshield:table page=NAME -->``: where the
page's numbers come from and how to make it again — its jobs (docs/results/pages.toml),
the commit each one's data was made at (its provenance record), how many runs came from
the run store and which stored runs were left out (docs/results-store.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedshield.results.pages import DATA_REL, PAGES, PAGES_REL, ROOT, BadInput, Page, load_pages


def _short(commits: Any) -> list[str]:
    if isinstance(commits, str):
        commits = [commits]
    return [str(c)[:7] for c in commits or []]


def data_commits(page: Page, root: Path = ROOT) -> dict[str, list[str]]:
    """Per grid / bench job, the commits its published data was made at (its provenance)."""
    out: dict[str, list[str]] = {}
    for side in page.data_names():
        f = root / DATA_REL / side
        prov = json.loads(f.read_text()) if f.exists() else {}
        out[side.removesuffix(".provenance.json")] = _short(prov.get("commits"))
    return out


def store_lines(page: Page, root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """Per grid job, what of its runs came from the run store (its provenance's ``store``:
    records valid at the code that made the page, replayed valid there); and the stored
    records that were left out (stale, or not replayed), named."""
    per_job: dict[str, str] = {}
    left: list[str] = []
    for side in page.data_names():
        f = root / DATA_REL / side
        used = (json.loads(f.read_text()) if f.exists() else {}).get("store")
        if not used:
            continue
        valid, replayed = len(used.get("valid", [])), len(used.get("replayed", []))
        if valid or replayed:
            per_job[side.removesuffix(".provenance.json")] = (
                f" — {valid + replayed} runs from the run store"
                + (f", {replayed} of them replayed valid at the page's code" if replayed else "")
            )
        left += [line for lines in used.get("left_out", {}).values() for line in lines]
    return per_job, left


def render_header(name: str, root: Path = ROOT) -> str:
    """The ``page=NAME`` block: where the page's numbers come from and how to regenerate it
    (the pages of ``root``'s pages.toml when it has one). A job whose data has no record is
    "not yet measured", and then the page claims no single commit."""
    pages = load_pages(root / PAGES_REL if (root / PAGES_REL).exists() else PAGES)
    if name not in pages:
        raise BadInput(f"page={name}: not a page of pages.toml (pages: {', '.join(pages)})")
    page = pages[name]
    commits = data_commits(page, root)
    from_store, left_out = store_lines(page, root)
    lines = [
        f"**Regenerate**: `make results PAGE={name}` (into `runs/results/`; `OUT=.` "
        f"publishes here). Its jobs, and the commit each one's data was made at:",
        "",
    ]
    for j in page.jobs:
        cs = list(dict.fromkeys(c for k in j.records() for c in commits.get(k, [])))
        # Outputs published before run_page recorded their commit: said as such.
        unstamped = {Path(w).stem for w in j.stamped() if not commits.get(Path(w).stem)}
        at = " — its output records no commit" if unstamped else ""
        if cs:
            at = " — commit " + ", ".join(f"`{c}`" for c in cs)
            at += " (mixed: runs from several commits)" if len(cs) > 1 else ""
        if any(not commits.get(k) for k in j.records() if k not in unstamped):
            at += " — not yet measured"
        at += "".join(from_store.get(k, "") for k in j.records())
        lines.append(f"- `{j.shown()}`{at}")
    if left_out:
        lines += ["", f"Left out of every number ({len(left_out)} stored runs that do not "
                  "count at the page's code; docs/results-store.md):", "",
                  *(f"- `{x}`" for x in left_out)]  # fmt: skip
    all_commits = {c for cs in commits.values() for c in cs}
    stamped = {Path(w).stem for j in page.jobs for w in j.stamped()}
    unmeasured = [k for k, cs in commits.items() if not cs and k not in stamped]
    lines.append("")
    if unmeasured:
        lines.append(f"Not yet measured: {', '.join(unmeasured)}; this page is incomplete.")
    elif len(all_commits) == 1:
        lines.append(f"All of this page's data was made at commit `{next(iter(all_commits))}`.")
    elif all_commits:
        lines.append(
            "The data comes from several commits (above); tests/test_results_pages.py "
            "re-runs a sampled cell at the current commit and fails if it left the "
            "published seeds' range."
        )
    return "\n".join(lines) + "\n"
