"""Memory probe for the agentd daemon, loaded only by `python -m bench.memprobe`, which
puts this folder on the daemon's PYTHONPATH and sets AGENTD_MEMPROBE_DIR. Other processes
(workers, sandboxes) inherit the environment, so the hook checks that it is the daemon.

In the daemon it starts tracemalloc at once (startup allocations are traced too) and
installs a SIGUSR2 handler that writes <dir>/<n>.snap (a tracemalloc snapshot) and
<n>.json: RSS, glibc's mallinfo2, counts by type of the objects the collector tracks
and the summed sizes of every container attribute of agentd objects ("module.Class.attr":
items). The daemon freezes its startup objects (daemon/core/interpreter_tuning.py), which
gc.get_objects() does not list: the counts are of objects made while serving (where growth
is), and agentd objects are found by walking from the event loop's tasks' frames through
agentd objects' attributes and the containers they hold. The walk stays small on purpose:
everything it allocates is traced too, and a walk over every object took minutes.
"""

from __future__ import annotations

import os


def _is_daemon() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"daemon.commands.cli" in argv and b"start" in argv


if os.environ.get("AGENTD_MEMPROBE_DIR") and _is_daemon():
    import asyncio
    import collections
    import ctypes
    import gc
    import json
    import signal
    import time
    import tracemalloc
    from pathlib import Path
    from types import FrameType
    from typing import Any

    OURS = ("daemon", "scheduling", "db", "tools", "webui", "agentd")
    CONTAINERS = (dict, set, frozenset, list, collections.deque)
    tracemalloc.start(int(os.environ.get("AGENTD_MEMPROBE_FRAMES", "15")))
    _marks = [0]

    MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in MALLINFO2]

    def _mallinfo() -> dict[str, int]:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return {}
        return {n: int(getattr(info, n)) for n in MALLINFO2}

    def _rss_kib() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def _ours(obj: Any) -> bool:
        return (getattr(type(obj), "__module__", "") or "").startswith(OURS)

    def _task_locals() -> list[Any]:
        try:
            tasks = asyncio.all_tasks(asyncio.get_event_loop())
        except RuntimeError:
            return []
        found: list[Any] = []
        for task in tasks:
            coro: Any = task.get_coro()
            while coro is not None and getattr(coro, "cr_frame", None) is not None:
                found.extend(coro.cr_frame.f_locals.values())
                coro = coro.cr_await
        return found

    def _sizes(limit: int = 200_000) -> dict[str, int]:
        sizes: collections.Counter[str] = collections.Counter()
        stack = [o for o in _task_locals() if _ours(o)]
        seen: set[int] = set()
        while stack and len(seen) < limit:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            attrs = getattr(obj, "__dict__", None)
            if not isinstance(attrs, dict):
                continue
            kind = type(obj)
            for name, value in attrs.items():
                if isinstance(value, CONTAINERS):
                    sizes[f"{kind.__module__}.{kind.__qualname__}.{name}"] += len(value)
                    items = value.values() if isinstance(value, dict) else value
                    stack.extend(v for v in items if _ours(v))
                elif _ours(value):
                    stack.append(value)
        return dict(sizes)

    def _counts() -> dict[str, int]:
        counts = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}"
                                     for o in gc.get_objects())
        return dict(counts.most_common(500))

    def _dump(_signum: int, _frame: FrameType | None) -> None:
        _marks[0] += 1
        base = Path(os.environ["AGENTD_MEMPROBE_DIR"]) / str(_marks[0])
        t0 = time.time()
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        traced = tracemalloc.get_traced_memory()[0]
        snapshot.dump(str(base) + ".snap")
        info = {"t": t0, "traced_bytes": traced,
                "rss_kib": _rss_kib(), "mallinfo": _mallinfo(), "counts": _counts(),
                "sizes": _sizes(), "dump_s": time.time() - t0}
        base.with_suffix(".json").write_text(json.dumps(info))

    signal.signal(signal.SIGUSR2, _dump)
