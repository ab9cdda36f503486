"""benchmarks.frozen_weights: TensorFlow's frozen-weights switch, timed and checked for stale outputs."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import frozen_weights
from bertzoo.utils.onednn import onednn_int8_available


def _args():
    return argparse.Namespace(preset="tiny", runs=1, batch_size=2, length=8)


def _has_amx():
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and "amx_bf16" in cpuinfo.read_text().split()


def test_a_process_without_the_switch_sees_weight_changes():
    result = frozen_weights.run_worker("bfloat16", "unset", _args())
    assert result["median_ms"] > 0
    assert result["stale"] is False


@pytest.mark.skipif(
    not (onednn_int8_available() and _has_amx()),
    reason="measured on AMX CPUs only: elsewhere oneDNN may keep the plain layout, and then nothing is cached",
)
def test_the_switch_keeps_the_first_weights_which_the_readme_warns_about():
    # README, Performance (and docs/performance.md): with the switch a process that changes its weights
    # computes with the old ones. If a TensorFlow release stops caching the
    # reordered kernel, this fails and the README's warning must change.
    assert frozen_weights.run_worker("bfloat16", "1", _args())["stale"] is True


def test_an_unknown_dtype_policy_is_refused_before_any_worker_starts(monkeypatch):
    monkeypatch.setattr(frozen_weights, "run_worker", lambda *args: pytest.fail("a worker started"))
    with pytest.raises(SystemExit, match=r"--dtypes: 'bfloat61' is not a Keras dtype policy"):
        frozen_weights.main(["--dtypes", "float32,bfloat61"])
    with pytest.raises(SystemExit, match=r"--dtypes: no dtype policy in ' , '"):
        frozen_weights.main(["--dtypes", " , "])
    assert frozen_weights.dtype_policies("float32, mixed_bfloat16") == ["float32", "mixed_bfloat16"]


def test_results_go_to_the_file_named(monkeypatch, tmp_path):
    # It appended to the repository's benchmarks/results.jsonl whatever was asked (no --results).
    monkeypatch.setattr(frozen_weights, "run_worker", lambda *args: {"median_ms": 10.0, "stale": False})
    results = tmp_path / "mine.jsonl"
    frozen_weights.main(["--dtypes", "float32", "--repeats", "1", "--runs", "1", "--results", str(results)])
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [row["setting"] for row in rows] == [f"{frozen_weights.SWITCH}={s}" for s in frozen_weights.SETTINGS]
