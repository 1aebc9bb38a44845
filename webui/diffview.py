"""The API's unified diff (GET /v1/policies/{name}/diff) as side-by-side rows.

Within a hunk, a run of removed lines and the run of added lines after it are paired
row by row (a changed line shows on both sides); the longer run's extra lines face a
blank. Pure text in, rows out; the template escapes and draws them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$")


@dataclass(frozen=True, slots=True)
class Row:
    kind: str  # hunk | same | change | del | add
    left_no: int | None
    left: str
    right_no: int | None
    right: str


def side_by_side(diff: str) -> list[Row]:
    rows: list[Row] = []
    removed: list[tuple[int, str]] = []
    added: list[tuple[int, str]] = []
    left = right = 0

    def flush() -> None:
        for i in range(max(len(removed), len(added))):
            a = removed[i] if i < len(removed) else None
            b = added[i] if i < len(added) else None
            kind = "change" if a and b else ("del" if a else "add")
            rows.append(Row(kind, a[0] if a else None, a[1] if a else "",
                            b[0] if b else None, b[1] if b else ""))
        removed.clear()
        added.clear()

    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")) and not rows and not removed and not added:
            continue  # the file header
        m = _HUNK.match(line)
        if m:
            flush()
            left, right = int(m.group(1)), int(m.group(2))
            rows.append(Row("hunk", None, line, None, line))
        elif line.startswith("-"):
            removed.append((left, line[1:]))
            left += 1
        elif line.startswith("+"):
            added.append((right, line[1:]))
            right += 1
        elif line.startswith(" ") or line == "":
            flush()
            rows.append(Row("same", left, line[1:], right, line[1:]))
            left += 1
            right += 1
        # "\ No newline at end of file" carries no line of its own
    flush()
    return rows
