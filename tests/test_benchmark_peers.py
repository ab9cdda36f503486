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
    # The suite pins the rule (conftest): the default is not measured; TensorFlow's pools are recorded.
    assert {r["default_source"] for r in rows} == {"rule"}
    assert set(rows[0]["tf_threads"]) == {"intra_op", "inter_op"}


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


def test_bertzoo_measures_its_default_for_the_timed_mode_only(monkeypatch, tmp_path):
    import bertzoo
    from bertzoo.utils import fast_path

    monkeypatch.setenv("BERTZOO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BERTZOO_JIT_COMPILE", raising=False)
    measured = []

    def no_xla_faster(name, fn):  # A clock instead of compiling and running.
        measured.append(name)
        return 0.01 if name.endswith("no_xla") else 0.02

    monkeypatch.setattr(fast_path, "wall_timer", no_xla_faster)
    fast_path.clear_memory_cache()
    try:
        config = {"vocabulary_size": 50, "num_layers": 1, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 32}
        library = peers.Bertzoo()
        assert library.default_xla(bertzoo.BertBackbone(**config), "inference") is False
        # Inference measures the inference candidates only: no training-step compile.
        assert measured and {name.split("/")[0] for name in measured} == {"predict"}
        assert library.default_source == "measured"
        again = peers.Bertzoo()
        assert again.default_xla(bertzoo.BertBackbone(**config), "inference") is False
        assert again.default_source == "cache"
    finally:
        fast_path.clear_memory_cache()


def test_the_worker_refuses_fewer_than_one_warmup_call():
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        next(peers.run_worker("bertzoo", "inference", "float32", "tiny", 2, 8, runs=1, warmup=0))
    with pytest.raises(SystemExit):
        peers.main(["--library", "bertzoo", "--preset", "tiny", "--warmup", "0"])
