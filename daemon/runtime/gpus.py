"""The GPUs this daemon can see: the `GPU` capacity runs get when `runtime_gpus` is -1
(the default). Read once per daemon, off the event loop (`nvidia-smi` may take a while).

Counted from the NVIDIA device nodes (`/dev/nvidia0`, ...), else from `nvidia-smi -L`
where it is installed, then narrowed by CUDA_VISIBLE_DEVICES the way CUDA reads it:
the listed devices, up to the first one that is not valid. Logical, as the
reservations are: nothing here hands a device to an instance.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

SMI_TIMEOUT_S = 10.0


def visible_gpus(env: Mapping[str, str] = os.environ, dev: Path = Path("/dev"),
                 smi: str | None = None) -> int:
    """`smi`: the nvidia-smi to ask when no device node is there (default: on PATH)."""
    devices = sum(1 for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    if not devices:
        devices = _from_smi(smi or shutil.which("nvidia-smi"))
    return cuda_visible(devices, env.get("CUDA_VISIBLE_DEVICES"))


def _from_smi(smi: str | None) -> int:
    if smi is None:
        return 0
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([smi, "-L"], capture_output=True, text=True,
                             timeout=SMI_TIMEOUT_S, check=True).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return 0


def cuda_visible(devices: int, listed: str | None) -> int:
    """How many of `devices` CUDA_VISIBLE_DEVICES (`listed`) leaves visible."""
    if listed is None:
        return devices
    seen = 0
    for item in listed.split(","):
        item = item.strip()
        if item.isdigit():
            if int(item) >= devices:
                break
        elif not item.startswith(("GPU-", "MIG-")):
            break  # empty, negative or malformed: CUDA stops here
        seen += 1
    return min(seen, devices)
