"""A console table that fits the width it is printed at, never cutting a header or a value.

rich shrinks the columns of a table wider than the terminal until each header and cell is
folded into a letter or two (45 routing metrics at 120 columns). :class:`FitTable` instead
picks, when rich renders it (``options.max_width``: the terminal, ``Console(width=...)``, or
80 in a pipe), the first layout whose every column is as wide as its widest text:

1. the table as given (rows × columns);
2. transposed (a few runs with many metrics);
3. its columns split into several tables, each repeating the first (key) column;
4. long form: one line per cell (key, column, value), the key once per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Cell = str | Text


@dataclass
class FitTable:
    """``columns[0]`` labels the rows (``rows[i][0]``); the other columns are values.
    ``long_headers``: the column headers of the long form (what a column and a value are)."""

    title: str
    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""
    long_headers: tuple[str, str] = ("", "value")
    show_header: bool = True

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Title and caption on lines of their own: as a rich Table's title they would be
        # wrapped at the width of a narrow table.
        tables = self.layout(console, options)
        for i, table in enumerate(tables):
            if self.title:
                part = f" ({i + 1}/{len(tables)})" if len(tables) > 1 else ""
                yield Text(self.title + part, style="bold")
            yield table
        if self.caption:
            yield Text(self.caption, style="dim")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)

    def layout(self, console: Console, options: ConsoleOptions) -> list[Table]:
        """The tables of the first layout that fits ``options.max_width``."""
        width = options.max_width
        wide = self._table(self.columns, self.rows)
        if _natural_width(console, options, wide) <= width:
            return [wide]
        if len(self.columns) > 2 and self.show_header:
            flipped = self._table(*self._transposed())
            if _natural_width(console, options, flipped) <= width:
                return [flipped]
        if len(self.columns) == 2:  # a key and a value: the long form would add nothing
            return [self._table(self.columns, self.rows, fold=True)]
        chunks = self._chunks(console, options, width)
        # A split into tables of one value column each is no easier to read than the
        # long form and takes more lines (a header per table).
        if chunks and (len(self.columns) - 1) / len(chunks) >= 2:
            return [
                self._table(
                    [self.columns[0], *[self.columns[j] for j in part]],
                    [[r[0], *[r[j] for j in part]] for r in self.rows],
                )
                for part in chunks
            ]
        return [self._long()]

    # -- layouts ---------------------------------------------------------------------------
    def _table(
        self, columns: Sequence[str], rows: Sequence[Sequence[Cell]], fold: bool = False
    ) -> Table:
        """``fold``: the last column's text wraps, at a space or else anywhere (a value
        wider than the console alone; never cut short)."""
        table = self._empty()
        for i, col in enumerate(columns):
            # numbers right-aligned under their header; a key/value list reads left to right
            side: Literal["left", "right"] = "right" if i and self.show_header else "left"
            last = fold and i == len(columns) - 1
            table.add_column(col, justify=side, no_wrap=not last, overflow="fold")
        for row in rows:
            table.add_row(*row)
        return table

    def _empty(self) -> Table:
        heavy = box.HEAVY_HEAD if self.show_header else None  # no header: a key/value list
        return Table(show_header=self.show_header, box=heavy)

    def _transposed(self) -> tuple[list[str], list[list[Cell]]]:
        what = self.long_headers[0]  # "metric \\ run": what the rows and columns now are
        corner = f"{what} \\ {self.columns[0]}" if what and self.columns[0] else what
        columns = [corner, *[_plain(r[0]) for r in self.rows]]
        rows = [[col, *[r[j] for r in self.rows]] for j, col in enumerate(self.columns) if j]
        return columns, rows

    def _chunks(
        self, console: Console, options: ConsoleOptions, width: int
    ) -> list[list[int]] | None:
        """The value columns packed greedily into tables that fit (None: one column alone
        beside the key column does not)."""
        parts: list[list[int]] = []
        for j in range(1, len(self.columns)):
            trial = [*parts[-1], j] if parts else [j]
            if parts and self._fits(console, options, trial, width):
                parts[-1] = trial
            elif self._fits(console, options, [j], width):
                parts.append([j])
            else:
                return None
        return parts

    def _fits(
        self, console: Console, options: ConsoleOptions, cols: list[int], width: int
    ) -> bool:
        table = self._table(
            [self.columns[0], *[self.columns[j] for j in cols]],
            [[r[0], *[r[j] for j in cols]] for r in self.rows],
        )
        return _natural_width(console, options, table) <= width

    def _long(self) -> Table:
        """One line per cell; a value wider than the console alone wraps (never cut)."""
        table = self._empty()
        table.add_column(self.columns[0], no_wrap=True)
        table.add_column(self.long_headers[0], no_wrap=True)
        table.add_column(self.long_headers[1], justify="right", overflow="fold")
        for i, row in enumerate(self.rows):
            for j, (col, cell) in enumerate(zip(self.columns[1:], row[1:])):
                table.add_row(row[0] if j == 0 else "", col, cell)
            if i < len(self.rows) - 1:
                table.add_section()
        return table


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _natural_width(console: Console, options: ConsoleOptions, table: Table) -> int:
    """The width ``table`` takes with no column wrapped (its widest header or cell)."""
    unbounded = options.update_width(10**6)
    return Measurement.get(console, unbounded, table).maximum


__all__ = ["Cell", "FitTable"]
