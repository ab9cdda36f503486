"""benchmarks.first_fit: one tiny run records both settings; bad arguments are refused."""

import json

import pytest

from benchmarks import first_fit
from benchmarks import harness


def test_a_tiny_run_records_both_settings(tmp_path):
    results = tmp_path / "results.jsonl"
    arguments = ["--preset", "tiny", "--repeats", "1", "--batch-size", "2", "--sequence-length", "8"]
    done = harness.run_module("benchmarks.first_fit", [*arguments, "--results", results], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [row["setting"] for row in rows] == [
        "optimizer variables created before the step",
        "optimizer variables created inside the step",
    ]
    assert all(row["benchmark"] == "first_fit" and row["first_fit_s"] > row["second_fit_s"] > 0 for row in rows)
    # The same optimizer state either way: Adam's two moments per weight, and its counters.
    assert rows[0]["optimizer_variables"] == rows[1]["optimizer_variables"] > 2 * 30
    # The optimizer had its variables when the first fit began in one setting only.
    assert [row["built_when_first_fit_began"] for row in rows] == [True, False]


@pytest.mark.parametrize("arguments", [["--repeats", "0"], ["--sequence-length", "1"]])
def test_bad_arguments_are_refused(arguments):
    with pytest.raises(SystemExit, match="must be positive"):
        first_fit.main(arguments)
