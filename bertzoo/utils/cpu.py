"""What the CPU this process runs on can do, from `/proc/cpuinfo` (Linux)."""

from pathlib import Path


def read_cpuinfo():
    """The text of `/proc/cpuinfo`, or "" where there is none (macOS, Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo=None):
    """The first CPU's feature flags (e.g. `{"avx2", "avx512_vnni"}`), or
    None when they cannot be read.

    Example:
    ```python
    flags = cpu_flags()
    has_vnni = flags is not None and "avx512_vnni" in flags
    ```
    """
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return set(value.split())
    return None
