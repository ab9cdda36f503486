"""benchmarks.preset_load: one tiny run records both settings; bad arguments are refused."""

import json

import pytest

from benchmarks import harness
from benchmarks import preset_load


def test_a_tiny_run_records_both_settings(tmp_path):
    results = tmp_path / "results.jsonl"
    arguments = ["--preset", "tiny", "--task", "backbone", "--repeats", "1", "--results", results]
    done = harness.run_module("benchmarks.preset_load", arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [row["setting"] for row in rows] == ["undrawn", "drawn then loaded"]
    assert all(row["benchmark"] == "preset_load" and row["first_load_s"] > 0 and row["peak_mb"] > 0 for row in rows)
    # The same model either way, and each ratio is against the drawn-then-loaded setting.
    assert rows[0]["parameters"] == rows[1]["parameters"] > 10_000
    assert rows[1]["speedup_vs_drawn_then_loaded"] == 1
    ratio = rows[1]["first_load_s"] / rows[0]["first_load_s"]
    assert rows[0]["speedup_vs_drawn_then_loaded"] == pytest.approx(ratio, rel=0.1)  # Of the unrounded medians.
    assert "| undrawn |" in done.stdout


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="must be positive"):
        preset_load.main(["--repeats", "0"])
    # An unknown name: one line naming the choices (a PresetError traceback from the first worker before).
    with pytest.raises(SystemExit, match=r"Unknown preset 'bogus': choose one of \[.*'tiny'\]"):
        preset_load.main(["--preset", "bogus", "--repeats", "1"])
