"""Shared output for benchmark scripts: a printed table and a JSON-lines log."""

import datetime
import json
import os
import platform
from pathlib import Path

RESULTS_FILE = Path(__file__).resolve().parent / "results.jsonl"


def machine():
    """A short description of this machine for result rows."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    described = f"{cpu}, {os.cpu_count()} cores"
    gpus = _nvidia_gpus()
    return f"{described}; {', '.join(gpus)}" if gpus else described


def _nvidia_gpus():
    """GPU names from `nvidia-smi -L` (no framework import), or []."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    # "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" -> "NVIDIA H100 80GB HBM3"
    return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in listing.splitlines() if line.startswith("GPU ")]


def append_results(benchmark, rows, command, path=RESULTS_FILE):
    """Appends one JSON line per row, stamped with date, machine, load and command."""
    stamp = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": benchmark,
        "machine": machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "command": command,
    }
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps({**stamp, **row}) + "\n")


def print_table(rows, columns):
    """Prints `rows` (dicts) as a Markdown table of `columns`."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |")
