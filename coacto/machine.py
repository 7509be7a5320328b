"""What this machine is, as the runtime's choices and the measurements record it: the processor's
name and the caches one CPU sees (no native code: the loader and the tuner both read it)."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (x86 and ARM spellings)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes(cpu: int = 0) -> dict[str, int]:
    """The data and unified caches one CPU sees, in bytes ({"L1d": ..., "L2": ..., "L3": ...};
    empty where sysfs does not say): what kernel and tile blocking must fit."""
    out: dict[str, int] = {}
    base = Path(f"/sys/devices/system/cpu/cpu{int(cpu)}/cache")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in sorted(base.glob("index[0-9]*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or not size:
            continue
        n = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        out[f"L{level}d" if kind == "Data" else f"L{level}"] = n
    return out


def format_caches(caches: dict[str, int]) -> str:
    """'L1d 48 KiB, L2 1 MiB, L3 32 MiB' (or 'unknown')."""
    def size(n: int) -> str:
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if n >= 1 << shift and n % (1 << shift) == 0:
                return f"{n >> shift} {unit}"
        return f"{n} B"
    return ", ".join(f"{k} {size(v)}" for k, v in caches.items()) or "unknown"
