"""`jit_compile="auto"` decided by measuring, where the model runs.

The timer is injected (`timer(candidate_name, fn) -> seconds`), so which
candidate is faster is decided by the test, not by the machine's load; one
test runs the real candidates with the wall clock, and one checks that
another process reuses the disk cache.
"""

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.utils import device as device_module
from bertzoo.utils import fast_path
from bertzoo.utils.device import default_jit_compile
from bertzoo.utils.device import resolve_jit_compile

CPU = {
    "kind": "cpu",
    "cpu": "Test CPU",
    "cpu_flags": ["avx2", "avx512f"],
    "cores": 2,
    "accelerators": [],
    "threads": [0, 0],
}
GPU = {**CPU, "kind": "gpu", "accelerators": ["NVIDIA H100 80GB HBM3"]}
VERSIONS = {"backend": "tensorflow", "tensorflow": "2.21.0", "keras": "3.15.0", "bertzoo": "0.1.0"}

# Within `CLEAR_GAIN` of each other: every mode runs all its rounds.
XLA_FASTER_FOR_PREDICT = {"predict/no_xla": 0.0045, "predict/xla": 0.004, "train/no_xla": 0.020, "train/xla": 0.023}


class FakeTimer:
    """Says each candidate takes `costs[name]` seconds (the first call, the
    compile, `compile_s`), without running it."""

    def __init__(self, costs, compile_s=1.5):
        self.costs, self.compile_s, self.calls = dict(costs), compile_s, []

    def __call__(self, name, fn):
        first = name not in self.calls
        self.calls.append(name)
        return self.compile_s if first else self.costs[name]


def refuse(name, fn):
    raise AssertionError(f"measured {name}: expected the cached choice")


def tiny_classifier(hidden_dim=16):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=50, num_layers=1, hidden_dim=hidden_dim, num_heads=2, intermediate_dim=32
    )
    return bertzoo.BertClassifier(backbone, 2)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh disk cache and in-memory state, measuring (no pin)."""
    monkeypatch.setenv("BERTZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTZOO_JIT_COMPILE", raising=False)
    fast_path.clear_memory_cache()
    yield tmp_path / "cache"
    fast_path.clear_memory_cache()


@pytest.fixture(scope="module")
def model():
    return tiny_classifier()


def choose(model, timer, **options):
    options = {"device": CPU, "versions": VERSIONS, **options}
    return fast_path.choose_jit_compile(model, timer=timer, **options)


def test_the_faster_candidate_is_chosen_per_mode(cache_dir, model):
    timer = FakeTimer(XLA_FASTER_FOR_PREDICT)
    report = choose(model, timer)
    assert report.source == "measured"
    assert (report.predict, report.train) is not None
    assert report.predict is True and report.train is False
    assert report.jit_compile is False  # The value for compile(): the training step's.
    # Warm-up (compile) once per candidate, excluded from the medians, then interleaved rounds.
    assert timer.calls[:4] == ["predict/no_xla", "predict/xla", "train/no_xla", "train/xla"]
    assert timer.calls[4:8] == ["predict/no_xla", "predict/xla", "train/no_xla", "train/xla"]
    assert timer.calls[8:12] == ["train/xla", "train/no_xla", "predict/xla", "predict/no_xla"]
    assert len(timer.calls) == 4 * (1 + fast_path.DEFAULT_RUNS)
    medians = {c.name: c.median_s for c in report.candidates}
    assert medians == XLA_FASTER_FOR_PREDICT
    assert all(c.compile_s == 1.5 and len(c.runs_s) == fast_path.DEFAULT_RUNS for c in report.candidates)
    assert report.cost_s is not None and report.cost_s >= 0

    flipped = {"predict/no_xla": 0.004, "predict/xla": 0.010, "train/no_xla": 0.050, "train/xla": 0.020}
    report = choose(model, FakeTimer(flipped), refresh=True)
    assert report.predict is False and report.train is True


def test_xla_needs_a_real_gain_and_one_mode_can_be_measured_alone(cache_dir, model):
    close = {"predict/no_xla": 0.0100, "predict/xla": 0.0099}  # 1% faster: noise, no XLA.
    report = choose(model, FakeTimer(close), modes=("predict",))
    assert report.predict is False and report.train is None
    assert {c.mode for c in report.candidates} == {"predict"}


def test_one_mode_may_be_named_alone_and_bad_settings_are_refused_by_name(cache_dir, model):
    report = choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT), modes="predict")  # Not its letters.
    assert report.predict is True and report.train is None
    for options, message in (
        ({"batch_size": 0}, r"`batch_size` must be a positive integer, got 0"),
        ({"batch_size": -3}, r"`batch_size` must be a positive integer, got -3"),
        ({"sequence_length": 2.5}, r"`sequence_length` must be a positive integer, got 2.5"),
        ({"runs": 0}, r"`runs` must be a positive integer, got 0"),
        ({"sequence_length": 1000}, r"`sequence_length`=1000 is longer than the model's max_sequence_length=512"),
        ({"modes": "fit"}, r"modes must be among \('predict', 'train'\), got \['fit'\]"),
    ):
        with pytest.raises(ValueError, match=message):
            choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT), refresh=True, **options)
    with pytest.raises(ValueError, match=r"jit_compile must be True, False or 'auto', got 1"):
        fast_path.explain_fast_path(model, jit_compile=1)  # `compile()` refuses 1 too.


def test_a_model_compiled_to_run_eagerly_is_not_measured(cache_dir):
    eager = tiny_classifier()
    eager.compile(run_eagerly=True)
    timer = FakeTimer(XLA_FASTER_FOR_PREDICT)
    report = choose(eager, timer)
    assert timer.calls == [] and (report.source, report.predict, report.train) == ("rule", False, False)
    assert "run_eagerly=True" in report.reason
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_a_clear_difference_is_decided_after_two_rounds(cache_dir, model):
    # predict: XLA 2.5x faster, decided after two timed runs each; train:
    # 15% apart, all rounds.
    costs = {**XLA_FASTER_FOR_PREDICT, "predict/no_xla": 0.010}
    timer = FakeTimer(costs)
    report = choose(model, timer)
    assert report.predict is True and report.train is False
    runs = {c.name: len(c.runs_s) for c in report.candidates}
    assert runs == {"predict/no_xla": 2, "predict/xla": 2, "train/no_xla": 3, "train/xla": 3}
    assert timer.calls[8:] == [
        "train/xla",
        "train/no_xla",
        "predict/xla",
        "predict/no_xla",
        "train/no_xla",
        "train/xla",
    ]
    # Run by run: one slow run of the faster candidate keeps the mode open,
    # and so does a single run each, however far apart.
    noisy = [
        fast_path.Candidate("predict", True, runs_s=[0.004, 0.009]),
        fast_path.Candidate("predict", False, runs_s=[0.010, 0.011]),
    ]
    assert not fast_path._clearly_decided(noisy, "predict")
    clear = [fast_path.Candidate("predict", True, runs_s=[0.004, 0.005]), noisy[1]]
    assert fast_path._clearly_decided(clear, "predict")
    single = [fast_path.Candidate("predict", True, runs_s=[0.004]), fast_path.Candidate("predict", False, runs_s=[0.1])]
    assert not fast_path._clearly_decided(single, "predict")


def test_each_step_measures_only_its_own_mode(cache_dir, monkeypatch):
    model = tiny_classifier()
    timer = FakeTimer(XLA_FASTER_FOR_PREDICT)
    monkeypatch.setattr(fast_path, "wall_timer", timer)
    x = {
        "token_ids": np.ones((4, 8), "int32"),
        "segment_ids": np.zeros((4, 8), "int32"),
        "padding_mask": np.ones((4, 8), "int32"),
    }
    model.predict(x, verbose=0)  # compile() left "auto": predict decides now.
    assert {name.split("/")[0] for name in timer.calls} == {"predict"}
    assert model.jit_compile is True
    # Later calls reuse the predict function: nothing is decided (or logged) again.
    from bertzoo.models import compile_defaults

    decided = []
    resolve = compile_defaults.resolve_jit_compile
    monkeypatch.setattr(
        compile_defaults, "resolve_jit_compile", lambda *a, **k: decided.append(k.get("mode")) or resolve(*a, **k)
    )
    model.predict(x, verbose=0)
    assert decided == []
    assert fast_path.explain_fast_path(model).train is None  # Not measured: nothing trained.
    predict_cost = fast_path.explain_fast_path(model).cost_s

    calls = len(timer.calls)
    model.fit(x, np.array([0, 1, 0, 1]), verbose=0)
    assert {name.split("/")[0] for name in timer.calls[calls:]} == {"train"}
    assert decided == ["train"]
    assert model.jit_compile is False
    report = fast_path.explain_fast_path(model)
    assert (report.predict, report.train) == (True, False)
    assert [c.name for c in report.candidates] == ["predict/no_xla", "predict/xla", "train/no_xla", "train/xla"]
    assert report.cost_s >= predict_cost  # Both measurements' cost.
    # The disk cache holds both modes: another process measures nothing.
    fast_path.clear_memory_cache()
    assert default_jit_compile(model) is False
    assert len(timer.calls) == calls + 2 * (1 + fast_path.DEFAULT_RUNS)  # train: compiles and rounds.


def test_a_backbone_decides_auto_by_measuring_compiled_or_not(cache_dir, monkeypatch):
    # Keras's own "auto" never uses XLA on a CPU: an uncompiled backbone's
    # `predict` takes the measured choice instead, as a task's does.
    timer = FakeTimer(XLA_FASTER_FOR_PREDICT)
    monkeypatch.setattr(fast_path, "wall_timer", timer)
    backbone = tiny_classifier().backbone
    x = {
        "token_ids": np.ones((4, 8), "int32"),
        "segment_ids": np.zeros((4, 8), "int32"),
        "padding_mask": np.ones((4, 8), "int32"),
    }
    assert not backbone.compiled
    backbone.predict(x, verbose=0)
    assert {name.split("/")[0] for name in timer.calls} == {"predict"}
    assert backbone.jit_compile is True
    report = fast_path.explain_fast_path(backbone)
    assert report.source == "measured" and report.predict is True
    # A pin holds, and `compile()` (with "auto") hands the choice back.
    backbone.compile(jit_compile=False)
    backbone.predict(x, verbose=0)
    assert backbone.jit_compile is False and backbone.compile_pin() is False
    assert fast_path.explain_fast_path(backbone).source == "pinned"
    calls = len(timer.calls)
    backbone.compile()
    backbone.predict(x, verbose=0)
    assert backbone.jit_compile is True and backbone.compile_pin() is None
    assert len(timer.calls) == calls  # The cached choice.


def test_the_budget_stops_the_timed_rounds(cache_dir, model):
    slow = {name: 4.0 for name in XLA_FASTER_FOR_PREDICT}
    timer = FakeTimer(slow)
    report = choose(model, timer, runs=5, budget_s=10.0)
    # One round (16 s) is over the 10 s budget: every candidate has one run.
    assert all(len(c.runs_s) == 1 for c in report.candidates)


def test_the_second_call_hits_the_cache(cache_dir, model):
    timer = FakeTimer(XLA_FASTER_FOR_PREDICT)
    first = choose(model, timer)
    calls = len(timer.calls)
    second = choose(model, timer)
    assert len(timer.calls) == calls  # Not measured again.
    assert second.source == "cache"
    assert (second.predict, second.train) == (first.predict, first.train)
    assert second.key == first.key


def test_a_fresh_process_state_reads_the_disk_cache(cache_dir, model):
    first = choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT))
    path = cache_dir / "fast_path.json"
    assert first.cache_file == str(path)
    stored = json.loads(path.read_text())
    assert stored["format"] == fast_path.CACHE_FORMAT
    assert stored["entries"][first.key]["modes"]["predict"]["chosen"] is True
    fast_path.clear_memory_cache()  # As a new process starts.
    second = choose(model, refuse)
    assert second.source == "cache"
    assert (second.predict, second.train) == (True, False)
    assert [c.median_s for c in second.candidates] == [c.median_s for c in first.candidates]
    # No temporary files left next to it (written atomically).
    # No temporary file left; the writers' lock file stays (removing it would race).
    assert sorted(p.name for p in cache_dir.iterdir()) == ["fast_path.json", "fast_path.json.lock"]


def test_a_partial_entry_in_memory_reads_the_complete_one_on_disk(cache_dir, model):
    predict_only = choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT), modes=("predict",))
    in_memory = fast_path._memory[predict_only.key]
    # Another process (a fresh memory) measures train and writes both modes.
    fast_path.clear_memory_cache()
    choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT), modes=("train",))
    stored = json.loads((cache_dir / "fast_path.json").read_text())["entries"][predict_only.key]
    assert set(stored["modes"]) == {"predict", "train"}
    fast_path._memory[predict_only.key] = in_memory  # This process still holds predict alone.
    report = choose(model, refuse)  # Train from the disk, not measured again.
    assert report.source == "cache" and (report.predict, report.train) == (True, False)
    assert choose(model, refuse, cache=False).source == "cache"  # The merged entry is kept in memory.


def test_another_process_reuses_the_cache(cache_dir):
    # The same tiny model, built in both processes; the child's timer refuses
    # to measure, so its choice can only come from the parent's file.
    keras.utils.set_random_seed(0)
    model = tiny_classifier()
    xla_faster = {name: 0.001 if name.endswith("/xla") else 0.5 for name in XLA_FASTER_FOR_PREDICT}
    report = fast_path.choose_jit_compile(model, timer=FakeTimer(xla_faster))
    assert report.source == "measured" and (report.predict, report.train) == (True, True)
    script = textwrap.dedent(
        """
        import json, sys
        import keras
        import bertzoo
        from bertzoo.utils import fast_path

        def refuse(name, fn):
            raise AssertionError("measured " + name)

        keras.utils.set_random_seed(0)
        backbone = bertzoo.BertBackbone(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
        report = fast_path.choose_jit_compile(bertzoo.BertClassifier(backbone, 2), timer=refuse)
        print(json.dumps([report.source, report.predict, report.train, report.key]))
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    source, predict, train, key = json.loads(done.stdout.strip().splitlines()[-1])
    assert (source, predict, train, key) == ("cache", True, True, report.key)


def test_the_key_changes_with_versions_device_and_model(model):
    signature = fast_path.model_signature(model)
    key = fast_path.cache_key(CPU, VERSIONS, signature)
    assert key == fast_path.cache_key(dict(CPU), dict(VERSIONS), fast_path.model_signature(model))
    for versions in (
        {**VERSIONS, "tensorflow": "2.22.0"},
        {**VERSIONS, "keras": "3.16.0"},
        {**VERSIONS, "bertzoo": "0.2.0"},
    ):
        assert fast_path.cache_key(CPU, versions, signature) != key
    for device in (
        {**CPU, "cpu": "Other CPU"},
        {**CPU, "cpu_flags": ["avx2", "avx512f", "amx_bf16"]},
        {**CPU, "cores": 16},
        GPU,
    ):
        assert fast_path.cache_key(device, VERSIONS, signature) != key
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(model, sequence_length=64)) != key
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(model, batch_size=32)) != key
    # The same architecture built again has the same key (layer names differ).
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(tiny_classifier())) == key
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(tiny_classifier(hidden_dim=32))) != key
    # A frozen backbone trains another step (only the head's gradient).
    frozen = tiny_classifier()
    frozen.backbone.trainable = False
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(frozen)) != key


def test_a_change_to_bertzoos_own_code_changes_the_key(cache_dir, model, tmp_path, monkeypatch):
    # An editable checkout keeps its version number across commits: its code keys the cache too.
    package = tmp_path / "package"
    (package / "layers").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "layers" / "dense.py").write_text("FUSED_INT8 = True\n")
    (package / "notes.txt").write_text("not code")
    original = fast_path.source_hash(package)
    assert fast_path.source_hash(package) == original
    (package / "notes.txt").write_text("still not code")
    assert fast_path.source_hash(package) == original
    (package / "layers" / "dense.py").write_text("FUSED_INT8 = False\n")
    edited = fast_path.source_hash(package)
    assert edited != original
    (package / "layers" / "dense.py").rename(package / "layers" / "fused.py")
    assert fast_path.source_hash(package) != edited  # The same code under another name.

    versions = fast_path.library_versions()
    assert versions["bertzoo_source"] == fast_path._bertzoo_source_hash()
    assert len(versions["bertzoo_source"]) == 16
    first = fast_path.choose_jit_compile(model, timer=FakeTimer(XLA_FASTER_FOR_PREDICT), device=CPU)
    assert first.source == "measured" and first.versions == versions
    assert fast_path.choose_jit_compile(model, timer=refuse, device=CPU).source == "cache"
    monkeypatch.setattr(fast_path, "_bertzoo_source_hash", lambda: edited)  # As after an edit.
    again = fast_path.choose_jit_compile(model, timer=FakeTimer(XLA_FASTER_FOR_PREDICT), device=CPU)
    assert again.source == "measured" and again.key != first.key


def test_the_key_reads_the_layers_quantization_and_dtype_policy():
    # quantize() changes the layers' policies, not the model's: the signature
    # reads the layers.
    plain = tiny_classifier()
    quantized = tiny_classifier()
    quantized.quantize("int4")
    assert quantized.dtype_policy.name == "float32"
    assert fast_path.model_signature(plain)["quantization_mode"] is None
    assert fast_path.model_signature(quantized)["quantization_mode"] == "int4"
    assert fast_path.cache_key(CPU, VERSIONS, fast_path.model_signature(quantized)) != fast_path.cache_key(
        CPU, VERSIONS, fast_path.model_signature(plain)
    )
    backbone = bertzoo.BertBackbone(
        vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, dtype="mixed_bfloat16"
    )
    mixed = fast_path.model_signature(bertzoo.BertClassifier(backbone, 2))
    assert "mixed_bfloat16" in mixed["layer_dtype_policies"]
    assert "onednn_int8" in mixed


def test_the_measured_shapes_follow_the_preprocessor_or_the_backbone(model):
    shapes = fast_path.input_shapes(model)
    assert shapes == {name: ((8, 128), "int32") for name in ("padding_mask", "segment_ids", "token_ids")}
    backbone = bertzoo.BertBackbone(
        vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=32
    )
    assert fast_path.measurement_sequence_length(bertzoo.BertClassifier(backbone, 2)) == 32

    class Preprocessor:
        sequence_length = 48

    class WithPreprocessor:
        preprocessor = Preprocessor()

    assert fast_path.measurement_sequence_length(WithPreprocessor()) == 48
    # A pre-trainer's masked positions: the slots its preprocessing fills (20 of 128), not 128.
    pretrainer = bertzoo.BertPretrainer.from_preset("tiny", load_weights=False, sequence_length=128)
    pretrainer_shapes = fast_path.input_shapes(pretrainer)
    assert pretrainer_shapes["mask_positions"] == ((8, 20), "int32")
    assert pretrainer_shapes["token_ids"] == ((8, 128), "int32")
    x = fast_path.example_inputs(shapes)
    assert x["padding_mask"].min() == 1 and x["token_ids"].max() == 0


def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(cache_dir, model, caplog):
    cache_dir.mkdir(parents=True)
    path = cache_dir / "fast_path.json"
    path.write_text('{"format": 1, "entries": {"abc": ')
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        report = choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT))
    assert report.source == "measured"
    assert any("unreadable fast-path cache" in r.getMessage() for r in caplog.records)
    assert report.key in json.loads(path.read_text())["entries"]
    assert path.stat().st_mode & 0o777 == 0o644  # Readable by the other users of a shared cache directory.
    # A readable file of the wrong shape is treated the same way.
    path.write_text("[1, 2, 3]")
    fast_path.clear_memory_cache()
    assert choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT)).source == "measured"
    fast_path.clear_memory_cache()
    assert choose(model, refuse).source == "cache"
    # Bytes that are not UTF-8, and an entry of the wrong layout under the
    # model's key: measured again and rewritten, not a failure.
    key = choose(model, refuse).key
    for damaged in (b'{"format": 1, "entries": {\xff', None):
        if damaged is None:
            entries = {key: {"modes": {"predict": "x", "train": {"chosen": True, "candidates": []}}}}
            damaged = json.dumps({"format": 1, "entries": entries}).encode()
        path.write_bytes(damaged)
        fast_path.clear_memory_cache()
        assert choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT)).source == "measured"
        assert json.loads(path.read_text())["entries"][key]["modes"]["predict"]["chosen"] is True


def test_the_environment_variable_pins(cache_dir, model, monkeypatch):
    for value, expected in (("1", True), ("0", False), ("true", True), ("off", False)):
        monkeypatch.setenv("BERTZOO_JIT_COMPILE", value)
        report = choose(model, refuse)
        assert report.source == "pinned" and report.predict is expected and report.train is expected
        assert "BERTZOO_JIT_COMPILE" in report.reason
        assert default_jit_compile(model) is expected
        assert default_jit_compile("int4_from_float32") is expected  # Policies too.
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "rule")  # The rule, nothing measured.
    monkeypatch.setattr(fast_path, "wall_timer", refuse)
    assert default_jit_compile(model) is False  # float32 on CPU.
    assert fast_path.explain_fast_path(model).source == "rule"
    unrecorded = tiny_classifier()  # Explaining a model compile() never saw measures nothing either.
    report = fast_path.explain_fast_path(unrecorded)
    assert report.source == "rule" and "BERTZOO_JIT_COMPILE=rule" in report.reason
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "sometimes")
    with pytest.raises(ValueError, match="use 0, 1, auto or rule"):
        choose(model, refuse)


def test_explicit_values_pin(cache_dir, model):
    report = fast_path.choose_jit_compile(model, jit_compile=True, timer=refuse)
    assert report.source == "pinned" and report.predict is True and report.train is True
    assert resolve_jit_compile(False, model) is False
    assert fast_path.jit_compile_for(model, "predict") is False
    assert fast_path.explain_fast_path(model).source == "pinned"


def test_compiling_with_auto_after_a_pin_forgets_the_pin(cache_dir, monkeypatch):
    monkeypatch.setattr(fast_path, "wall_timer", FakeTimer(XLA_FASTER_FOR_PREDICT))
    model = tiny_classifier()
    model.compile(jit_compile=True)
    assert fast_path.explain_fast_path(model).source == "pinned"
    model.compile()  # Back to "auto".
    assert model.compile_pin() is None
    report = fast_path.explain_fast_path(model)
    assert report.source == "measured" and (report.predict, report.train) == (True, False)
    # A choice "auto" made is what "auto" makes again: a later compile() keeps it.
    model.compile()
    assert fast_path.explain_fast_path(model) is report


def test_explaining_with_options_leaves_what_the_model_runs(cache_dir):
    model = tiny_classifier()
    model.compile(jit_compile=True)
    measured = fast_path.explain_fast_path(
        model, refresh=True, timer=FakeTimer(XLA_FASTER_FOR_PREDICT), device=CPU, versions=VERSIONS
    )
    assert measured.source == "measured" and (measured.predict, measured.train) == (True, False)
    note = "not what the model runs: its pinned choice, predict jit_compile=True, train jit_compile=True"
    assert note in measured.reason and note in str(measured)
    assert model.jit_compile is True
    recorded = fast_path.explain_fast_path(model)
    assert recorded.source == "pinned" and (recorded.predict, recorded.train) == (True, True)
    assert fast_path.jit_compile_for(model, "train") is True
    # Asking about another pin does not pin it either.
    assert fast_path.explain_fast_path(model, jit_compile=False).predict is False
    assert fast_path.jit_compile_for(model, "predict") is True


def test_resolve_auto_measures_and_exposes_the_per_mode_choice(cache_dir, monkeypatch, caplog):
    model = tiny_classifier()
    monkeypatch.setattr(fast_path, "wall_timer", FakeTimer(XLA_FASTER_FOR_PREDICT))
    with caplog.at_level(logging.INFO, logger="bertzoo"):
        assert resolve_jit_compile("auto", model) is False
        model.compile()
    assert model.jit_compile is False  # compile() gets the training step's choice.
    assert fast_path.jit_compile_for(model, "train") is False
    assert fast_path.jit_compile_for(model, "predict") is True
    assert fast_path.jit_compile_for(model, "test") is True
    assert fast_path.jit_compile_for(tiny_classifier(), "predict", default="unset") == "unset"
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("measured" in line and "predict jit_compile=True, train jit_compile=False" in line for line in logged)
    assert any("cache" in line for line in logged)  # compile() found the choice resolve made.


def test_explain_names_what_was_measured_and_chosen(cache_dir, model):
    fast_path.choose_jit_compile(model, timer=FakeTimer(XLA_FASTER_FOR_PREDICT), device=CPU, versions=VERSIONS)
    report = fast_path.explain_fast_path(model)
    text = str(report)
    assert "source: measured" in text
    assert "chosen: predict jit_compile=True, train jit_compile=False" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("predict", "train"))]
    assert [row[:2] for row in rows] == [
        ["predict", "False"],
        ["predict", "True"],
        ["train", "False"],
        ["train", "True"],
    ]
    assert [row[-1] == "*" for row in rows] == [False, True, True, False]
    assert "4.00 ms" in text and "1.50 s" in text  # A median and a compile time.
    assert report.key in text and str(cache_dir / "fast_path.json") in text
    assert "Test CPU (avx2 avx512f), 2 cores" in text
    assert "tensorflow 2.21.0" in text
    fast_path.clear_memory_cache()
    cached = fast_path.explain_fast_path(model, device=CPU, versions=VERSIONS, timer=refuse)
    assert "source: cache" in str(cached)


def test_a_mode_no_candidate_can_run_falls_back_to_the_rule(cache_dir, model, monkeypatch):
    def train_fails(name, fn):
        if name.startswith("train"):
            raise RuntimeError("no gradient here\nsecond line")
        return 0.01

    monkeypatch.setattr(fast_path, "wall_timer", train_fails)
    report = fast_path.auto_jit_compile(model, rule=True)
    assert report.predict is False and report.train is True  # The rule, for train only.
    assert "train" in report.reason
    failed = [c for c in report.candidates if c.error]
    assert [c.mode for c in failed] == ["train", "train"]
    assert failed[0].error == "RuntimeError: no gradient here"
    assert "failed: RuntimeError: no gradient here" in str(report)
    assert "train/xla failed (RuntimeError: no gradient here)" in report.summary()  # The logged line says why too.


def test_the_rules_choice_for_a_mode_no_candidate_can_run_is_what_explain_reports(cache_dir, monkeypatch):
    def train_fails(name, fn):
        if name.startswith("train"):
            raise RuntimeError("no gradient here")
        return 0.01

    monkeypatch.setattr(fast_path, "wall_timer", train_fails)
    model = tiny_classifier()
    x = {
        "token_ids": np.ones((4, 8), "int32"),
        "segment_ids": np.zeros((4, 8), "int32"),
        "padding_mask": np.ones((4, 8), "int32"),
    }
    model.fit(x, np.array([0, 1, 0, 1]), verbose=0)
    assert model.jit_compile is False  # The rule on a CPU, float32.
    report = fast_path.explain_fast_path(model)
    assert report.train is False and report.reason == "the rule for train: no candidate ran"
    assert "the rule for train: no candidate ran" in str(report) and "the rule for train" in report.summary()
    # Deciding predict later keeps telling what the training step runs.
    model.predict(x, verbose=0)
    report = fast_path.explain_fast_path(model)
    assert (report.predict, report.train) == (False, False) and "the rule for train" in report.reason


def test_models_that_cannot_be_measured_and_policies_use_the_rule(cache_dir, monkeypatch):
    monkeypatch.setattr(fast_path, "wall_timer", refuse)
    assert not fast_path.measurable("float32")
    assert not fast_path.measurable(keras.layers.Dense(3))  # Not built, no symbolic inputs.
    assert default_jit_compile("float32") is False
    assert default_jit_compile("int4_from_float32") is True
    report = fast_path.explain_fast_path(keras.layers.Dense(3))
    assert report.source == "rule" and report.predict is None


def test_gpu_device_is_measured_and_keyed_apart(cache_dir, model, monkeypatch):
    # The GPU path without a GPU: a faked device description.
    on_cpu = choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT))
    timer = FakeTimer({name: 0.001 if name.endswith("/xla") else 0.002 for name in XLA_FASTER_FOR_PREDICT})
    on_gpu = choose(model, timer, device=GPU)
    assert on_gpu.source == "measured" and on_gpu.key != on_cpu.key
    assert on_gpu.predict is True and on_gpu.train is True
    assert "NVIDIA H100 80GB HBM3" in str(on_gpu)
    # A TPU is not measured: XLA always.
    tpu = choose(model, refuse, device={**CPU, "kind": "tpu", "accelerators": ["TPU:0"]})
    assert tpu.source == "rule" and tpu.predict is True and tpu.train is True
    # The rule, where nothing is measured, on a GPU: XLA.
    monkeypatch.setattr(device_module, "accelerator", lambda: "gpu")
    assert default_jit_compile("float32") is True
    assert default_jit_compile("mixed_bfloat16") is True


def test_device_description_reads_the_cpu_flags(monkeypatch):
    fast_path._host_description.cache_clear()
    cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f amx_tile amx_bf16 amx_int8 avx512_bf16\n"
    monkeypatch.setattr(fast_path, "_read_cpuinfo", lambda: cpuinfo)
    try:
        described = fast_path.device_description()
    finally:
        fast_path._host_description.cache_clear()
    assert described["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert described["cpu_flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    assert described["kind"] == "cpu" and described["cores"] >= 1
    assert set(fast_path.library_versions()) == {"backend", "tensorflow", "keras", "bertzoo", "bertzoo_source"}


def test_backend_rules_are_unchanged():
    assert fast_path.backend_jit_compile("jax") is True  # Its only compiled path.
    assert fast_path.backend_jit_compile("torch") is False  # Keras's default there.
    assert fast_path.backend_jit_compile("tensorflow") is None  # Measured.


def test_the_real_candidates_run_and_leave_no_trace(cache_dir):
    # The wall clock, a tiny model at a short length: every candidate runs,
    # compile times are reported apart, and the dropout seed states are
    # restored (measuring does not shift later training's randomness).
    model = tiny_classifier()
    before = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
    report = fast_path.choose_jit_compile(model, batch_size=2, sequence_length=8, runs=2)
    assert report.source == "measured"
    assert [c.error for c in report.candidates] == [None] * 4
    # Two rounds, or one where the two paths are far apart.
    assert all(c.compile_s > 0 and 1 <= len(c.runs_s) <= 2 and c.median_s > 0 for c in report.candidates)
    assert report.predict in (True, False) and report.train in (True, False)
    assert report.cost_s >= sum(c.compile_s for c in report.candidates)
    after = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_measuring_several_models_logs_no_retracing_warning(cache_dir):
    # Each candidate traces once, on purpose; TensorFlow counts traces by the
    # Python code traced, across functions, and warned of "excessive
    # retracing" from the third model a process measured (`bertzoo compress`).
    import tensorflow as tf

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = tf.get_logger()
    logger.addHandler(handler)
    try:
        for hidden_dim in (8, 16, 24, 32):
            report = fast_path.choose_jit_compile(tiny_classifier(hidden_dim), batch_size=2, sequence_length=8, runs=1)
            assert report.source == "measured"
    finally:
        logger.removeHandler(handler)
    assert not [r.getMessage() for r in records if "retracing" in r.getMessage()]
    # Outside the measurement TensorFlow's warning is left as it was.
    retraced = tf.function(lambda x: x + 1)
    logger.addHandler(handler)
    try:
        for length in range(1, 8):
            retraced(tf.zeros([length]))
    finally:
        logger.removeHandler(handler)
    assert [r for r in records if "triggered tf.function retracing" in r.getMessage()]


def test_a_failing_measurement_falls_back_to_the_rule_with_a_warning(cache_dir, model, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(fast_path, "device_description", broken)
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        report = fast_path.auto_jit_compile(model, rule=True)
    assert report.source == "rule" and report.predict is True and report.train is True
    assert "measuring failed: OSError" in report.reason
    assert any("Could not measure the fast path of BertClassifier" in r.getMessage() for r in caplog.records)


def test_explain_is_exported_at_the_top_level():
    assert bertzoo.explain_fast_path is fast_path.explain_fast_path


def _write_entries(path, prefix, count):
    for index in range(count):
        entry = {"modes": {"predict": {"chosen": True, "candidates": []}}, "measured_at": f"{prefix}{index}"}
        fast_path._write_cache(path, f"{prefix}-{index}", entry)


def test_concurrent_writers_keep_every_entry(tmp_path):
    # Processes measuring different models at once (e.g. pytest-xdist
    # workers, or a serving fleet starting up) each add their entry: none is
    # lost to another's read-modify-write.
    path = tmp_path / "fast_path.json"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_entries, args=(path, f"p{i}", 40)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        if writer.exitcode is None:
            writer.kill()
        assert writer.exitcode == 0
    assert len(fast_path._read_cache(path)) == 160
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fast_path.json", "fast_path.json.lock"]


def test_a_held_lock_delays_the_update_then_it_goes_ahead(tmp_path, monkeypatch, caplog):
    fcntl = pytest.importorskip("fcntl")
    path = tmp_path / "fast_path.json"
    monkeypatch.setattr(fast_path, "LOCK_WAIT_S", 0.2)
    previous = os.umask(0o077)
    try:
        _write_entries(path, "first", 1)
    finally:
        os.umask(previous)
    lock = tmp_path / "fast_path.json.lock"
    assert lock.stat().st_mode & 0o777 == 0o644  # Not the umask's 0600: a shared directory's users all lock.
    with open(lock) as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # Another process (or a stuck one) holds it.
        with caplog.at_level(logging.WARNING, logger="bertzoo"):
            _write_entries(path, "second", 1)
    assert sorted(fast_path._read_cache(path)) == ["first-0", "second-0"]
    assert any("held the fast-path cache lock" in r.getMessage() for r in caplog.records)


def test_two_modes_of_one_model_written_apart_are_both_kept(tmp_path):
    # Two processes measuring one model, one its training step, the other inference.
    path = tmp_path / "fast_path.json"
    for mode, chosen in (("predict", True), ("train", False)):
        entry = {"modes": {mode: {"chosen": chosen, "candidates": []}}, "measured_at": mode}
        fast_path._write_cache(path, "model", entry)
    modes = fast_path._read_cache(path)["model"]["modes"]
    assert {mode: decided["chosen"] for mode, decided in modes.items()} == {"predict": True, "train": False}


def test_entries_with_values_of_the_wrong_type_are_measured_again_and_kept_for_others(tmp_path):
    path = tmp_path / "fast_path.json"
    good = {"modes": {"predict": {"chosen": True, "candidates": []}}, "measured_at": "2026-11-28T00:00:00+00:00"}
    candidate = {"mode": "predict", "jit_compile": True, "median_s": 0.01, "runs_s": [0.01], "compile_s": 1.0}
    damaged = {
        "median": {**good, "modes": {"predict": {"chosen": True, "candidates": [{**candidate, "median_s": "fast"}]}}},
        "runs": {**good, "modes": {"predict": {"chosen": True, "candidates": [{**candidate, "runs_s": 3}]}}},
        "cost": {**good, "cost_s": "x"},
        "device": {**good, "device": {"cpu_flags": 3}},
        "inputs": {**good, "inputs": [1, 2]},
        "when": {**good, "measured_at": None},
        "newer": {**good, "modes": {"predict": {"chosen": True, "candidates": [{**candidate, "gpu_util": 0.5}]}}},
        "huge": {**good, "modes": {"predict": {"chosen": True, "candidates": [{**candidate, "median_s": 10**400}]}}},
    }
    path.write_text(json.dumps({"format": 1, "entries": {"good": good, **damaged}}))
    assert sorted(fast_path._read_cache(path)) == ["good"]  # Each damaged one would crash explain or eviction.
    for key in damaged:
        with pytest.raises((TypeError, ValueError, KeyError, AttributeError, OverflowError)):
            report = fast_path._from_entry(damaged[key], "m", key, path)
            str(report), report.summary(), sorted([damaged[key]["measured_at"], ""])
    # A writer keeps what it cannot read (another bertzoo version's entries), and its eviction copes.
    fast_path._write_cache(path, "mine", good)
    assert sorted(json.loads(path.read_text())["entries"]) == sorted(["good", "mine", *damaged])
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(fast_path, "MAX_CACHE_ENTRIES", 3)
    try:
        fast_path._write_cache(path, "latest", {**good, "measured_at": "2026-11-29T00:00:00+00:00"})
    finally:
        monkeypatch.undo()
    assert "latest" in json.loads(path.read_text())["entries"]
    assert len(json.loads(path.read_text())["entries"]) == 3


def test_json_nested_too_deep_is_an_unreadable_cache(tmp_path, caplog):
    path = tmp_path / "fast_path.json"
    path.write_text("[" * 100_000)
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        assert fast_path._read_cache(path) == {}
    assert "unreadable fast-path cache" in caplog.text


def test_the_cache_directory_variable_expands_the_home_directory(monkeypatch):
    monkeypatch.setenv("BERTZOO_CACHE_DIR", "~/bertzoo-cache")
    assert fast_path.cache_file() == Path.home() / "bertzoo-cache" / "fast_path.json"


@pytest.mark.parametrize("value", ["false", "auto ", "xla", 0, 1, None])
def test_a_jit_compile_that_is_not_true_false_or_auto_is_refused(value):
    model = tiny_classifier()
    with pytest.raises(ValueError, match=r"jit_compile must be True, False or 'auto'"):
        model.compile(jit_compile=value)  # Keras would run XLA for "false".


def test_pins_run_eagerly_and_a_trainers_pin(cache_dir, monkeypatch):
    monkeypatch.setattr(fast_path, "wall_timer", refuse)
    model = tiny_classifier()
    assert model.compile_pin() is None  # Constructed with "auto".
    model.compile(run_eagerly=True)  # Eager steps compile nothing: nothing is measured.
    model.predict(
        {
            "token_ids": np.ones((2, 8), "int32"),
            "segment_ids": np.zeros((2, 8), "int32"),
            "padding_mask": np.ones((2, 8), "int32"),
        },
        verbose=0,
    )
    model.compile(jit_compile=False)
    assert model.compile_pin() is False
    # A Distiller's pin is its own training step's: the student's recorded choice is untouched.
    student = tiny_classifier()
    student.compile(jit_compile=True)
    bertzoo.Distiller(tiny_classifier(), student).compile(jit_compile=False)
    assert fast_path.jit_compile_for(student, "predict") is True


def test_a_candidate_that_ran_out_of_memory_is_not_cached_for_good(cache_dir, model):
    import tensorflow as tf

    costs = FakeTimer(XLA_FASTER_FOR_PREDICT)

    def out_of_memory_once(name, fn):
        if name == "predict/xla":
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
        return costs(name, fn)

    report = choose(model, out_of_memory_once)
    assert report.predict is False and "ResourceExhaustedError" in str(report)
    assert not (cache_dir / "fast_path.json").exists()  # Another process (or a later one) measures again.
    fast_path.clear_memory_cache()
    assert choose(model, FakeTimer(XLA_FASTER_FOR_PREDICT)).predict is True


def test_kernel_environment_variables_are_part_of_the_key(monkeypatch):
    for name in fast_path.KERNEL_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    plain = fast_path.device_description()
    assert "environment" not in plain  # Unset: the keys written before this setting existed still match.
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    monkeypatch.setenv("ONEDNN_DEFAULT_FPMATH_MODE", "BF16")
    described = fast_path.device_description()
    assert described["environment"] == {"TF_NUM_INTRAOP_THREADS": "1", "ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}
    assert fast_path.cache_key(described, VERSIONS, {}) != fast_path.cache_key(plain, VERSIONS, {})


def test_a_candidate_failing_in_a_timed_run_is_reported_and_not_chosen(cache_dir, model):
    costs = FakeTimer(XLA_FASTER_FOR_PREDICT)

    def fails_after_compiling(name, fn):
        seconds = costs(name, fn)
        if name == "predict/xla" and costs.calls.count(name) == 2:
            raise RuntimeError("buffers of both paths did not fit")
        return seconds

    report = choose(model, fails_after_compiling)
    assert report.predict is False and report.train is False
    failed = next(c for c in report.candidates if c.name == "predict/xla")
    assert failed.error.startswith("RuntimeError: buffers") and failed.median_s is None
    assert "RuntimeError" in str(report)


@pytest.mark.parametrize("chosen", [1, 0, 1.0])
def test_cache_entries_with_a_number_for_the_choice_are_dropped(tmp_path, chosen):
    path = tmp_path / "fast_path.json"
    entry = {"modes": {"predict": {"chosen": chosen, "candidates": []}}, "measured_at": "2026-11-28T00:00:00+00:00"}
    path.write_text(json.dumps({"format": 1, "entries": {"numeric": entry}}))
    assert fast_path._read_cache(path) == {}


def test_a_distiller_is_measured_on_its_own_step_and_recorded_as_itself(cache_dir, monkeypatch):
    teacher, student = tiny_classifier(hidden_dim=32), tiny_classifier()
    student.compile(jit_compile=True)  # The student's own pin, for its own predict.
    distiller = bertzoo.Distiller(teacher, student)
    teacher_calls = []
    real_features = teacher.compute_features

    def counted(*args, **kwargs):
        teacher_calls.append(kwargs.get("training"))
        return real_features(*args, **kwargs)

    monkeypatch.setattr(teacher, "compute_features", counted)
    timed = []

    def run_each(name, fn):  # Really runs the candidates (traced on the first call).
        timed.append(name)
        fn()
        return {"predict/no_xla": 0.004, "predict/xla": 0.010, "train/no_xla": 0.050, "train/xla": 0.020}[name]

    report = fast_path.choose_jit_compile(distiller, timer=run_each, device=CPU, versions=VERSIONS, runs=1)
    assert report.model == "Distiller" and report.source == "measured"
    assert report.predict is False and report.train is True
    assert teacher_calls and set(teacher_calls) == {False}  # The train candidate ran the teacher, in inference.
    assert fast_path.explain_fast_path(distiller) is report
    assert fast_path.jit_compile_for(student, "predict") is True  # The student's pin is untouched.
    # Keyed by both models and the loss settings: another teacher is another step.
    signature = fast_path.model_signature(distiller)
    assert set(signature["parts"]) == {"teacher", "student"}
    other = bertzoo.Distiller(tiny_classifier(), student)
    assert fast_path.model_signature(other) != signature
    assert fast_path.model_signature(bertzoo.Distiller(teacher, student, attention_weight=0.0)) != signature
