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
    return f"{cpu}, {os.cpu_count()} cores"


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
