"""The one rule for the program and session ids a client names.

An id is 1-128 characters of `A-Z a-z 0-9 . _ : @ -`, and not `.` or `..` alone. It
travels in URL paths (`/v1/programs/{id}/release`), in response headers (Latin-1 only)
and in log lines: an id with `/`, a dot segment, a space or a non-ASCII character could
be accepted, then never be released or killed over REST, or have its reply lost when
the header is written. The ids agentd makes itself (`prog-…`, `<program>.<Agent>.<n>`,
`<program>.agentd_0`) fit.
"""

from __future__ import annotations

import re

MAX_ID_CHARS = 128
ID_ALPHABET = "A-Z a-z 0-9 . _ : @ -"
_ID = re.compile(rf"[A-Za-z0-9._:@-]{{1,{MAX_ID_CHARS}}}")


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid id, or None when it is one."""
    if _ID.fullmatch(value) is None:
        return f"must be 1-{MAX_ID_CHARS} characters of {ID_ALPHABET}"
    if value in (".", ".."):
        return "must not be '.' or '..' (a URL path would read it as a directory)"
    return None
