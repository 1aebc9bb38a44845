"""A DataTable whose rows are keyed by an id and synced in place from each poll.

Only changed cells are redrawn and the cursor stays on the same id, so a live
table does not jump under the operator's hands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.text import Text
from textual.widgets import DataTable

Cell = str | Text
Row = tuple[str, Mapping[str, Cell]]


class KeyedTable(DataTable[Cell]):
    COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def sync(self, rows: Sequence[Row]) -> None:
        """Make the table show `rows`, in their order."""
        keep = self.selected_id
        wanted = dict(rows)
        for stale in [k for k in self.rows if k.value not in wanted]:
            self.remove_row(stale)
        for key, cells in wanted.items():
            if key not in self.rows:
                self.add_row(*cells.values(), key=key)
                continue
            for column, value in cells.items():
                if self.get_cell(key, column) != value:
                    self.update_cell(key, column, value)
        self._order(rows)
        if keep in wanted and self.selected_id != keep:
            self.move_cursor(row=self.get_row_index(keep), animate=False, scroll=False)

    def _order(self, rows: Sequence[Row]) -> None:
        if [r.key.value for r in self.ordered_rows] == [key for key, _ in rows]:
            return
        # DataTable.sort hands the key function cell values, not row keys: rank by values
        # (rows that look the same may swap, which nobody can see)
        rank = {_plain(cells.values()): i for i, (_, cells) in enumerate(rows)}
        self.sort(key=lambda values: rank.get(_plain(values), len(rank)))

    @property
    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return key.value


def _plain(values: object) -> tuple[str, ...]:
    return tuple(str(v) for v in values)  # type: ignore[attr-defined]
