"""benchmarks.peers / benchmarks.run: the bertzoo-only static int8 configuration."""

import keras
import pytest

from benchmarks import peers
from benchmarks import run


def test_int8_static_worker_times_a_calibrated_static_model(monkeypatch):
    built = []
    prepare = peers.Bertzoo.prepare

    def recording(self, *args, **kwargs):
        reference, model = prepare(self, *args, **kwargs)
        built.append(model)
        return reference, model

    monkeypatch.setattr(peers.Bertzoo, "prepare", recording)
    rows = list(peers.run_worker("bertzoo", "inference", "int8_static", "tiny", 2, 8, runs=1, warmup=1))
    assert [(r["dtype"], r["xla"]) for r in rows] == [("int8_static", False), ("int8_static", True)]
    dense = built[0].attention_blocks[0].query_dense
    assert dense.quantization_mode == "int8" and dense.input_range is not None
    assert float(keras.ops.convert_to_numpy(dense.input_range)) not in (0.0, 1.0)  # 1: the unset initial value.
    # Calibrated on another batch of the same kind: close to the float32 model.
    assert 0 < rows[0]["check_vs_float32"]["relative_error"] < 0.1


def test_run_times_int8_static_for_bertzoo_only(monkeypatch):
    asked = []

    def fake_worker(args, **worker_args):
        asked.append((worker_args["library"], worker_args.get("dtype")))
        return [], None

    monkeypatch.setattr(run, "run_worker", fake_worker)
    monkeypatch.setattr(run, "missing", lambda name: None)
    with pytest.raises(SystemExit, match="Nothing was timed"):
        run.main(["--models", "bertzoo,keras_hub,transformers", "--dtypes", "int8,int8_static", "--chart", ""])
    timed = [pair for pair in asked if pair[0] != "matmul"]
    assert timed == [
        ("bertzoo", "int8"),
        ("keras_hub", "int8"),
        ("transformers", "int8"),
        ("bertzoo", "int8_static"),
    ]


def test_matmul_peaks_cover_the_tensor_dtypes_and_int8_static_reads_int8s():
    peaks = peers.matmul_peak(size=64, runs=1)
    assert set(peaks) == {"float32", "bfloat16", "int8"} and all(p["gflops"] > 0 for p in peaks.values())
    row = {"dtype": "int8_static", "mode": "inference", "median_s": 0.5}
    args = run.argparse.Namespace(batch_size=8, sequence_length=128)
    run.row_figures(row, peers.backbone_config("tiny"), args, {"int8": {"gflops": 1000.0}})
    assert row["peak_gflops"] == 1000.0 and row["utilization"] == row["gflops"] / 1000.0


def test_a_worker_cut_off_by_its_timeout_keeps_the_variants_it_timed(monkeypatch):
    printed = 'warming up\nBENCH {"library": "transformers", "median_s": 0.5}\nBENCH {"library": "transformers"'

    def cut_off(module, arguments, env=None, timeout=None):
        raise run.subprocess.TimeoutExpired(["python"], timeout, output=printed.encode())

    monkeypatch.setattr(run, "run_module", cut_off)
    rows, error = run.run_worker(type("Args", (), {"worker_timeout": 7})(), library="transformers")
    assert rows == [{"library": "transformers", "median_s": 0.5}]  # The half-printed line is not a row.
    assert error == "timed out after 7 s"
    assert run.bench_rows(None) == [] and run.bench_rows(printed.split("\n", 1)[1].split("\n")[0]) == rows
