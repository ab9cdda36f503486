"""benchmarks.harness: the one timing loop, the input batches, data paths and the results log."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import harness


def test_timing_loop_reports_medians_per_candidate():
    calls = {"a": 0, "b": 0}

    def candidate(name):
        def call():
            calls[name] += 1

        return call

    timings = harness.time_interleaved({"a": candidate("a"), "b": candidate("b")}, runs=5, warmup=2)
    assert list(timings) == ["a", "b"]
    assert calls == {"a": 7, "b": 7}  # 2 warm-up + 5 timed calls each.
    for t in timings.values():
        assert len(t["times_s"]) == len(t["cpu_times_s"]) == 5
        assert t["median_s"] == sorted(t["times_s"])[2]
        assert t["min_s"] == min(t["times_s"]) <= t["median_s"]
        assert t["cpu_median_s"] >= 0.0 and t["first_call_s"] >= 0.0
    assert harness.median_ms(timings)["a"] == pytest.approx(1000 * timings["a"]["median_s"])


def test_timing_rounds_interleave_and_rotate_the_candidates():
    order, warmed = [], []
    candidates = {name: (lambda name=name: order.append(name)) for name in "abc"}
    harness.time_interleaved(candidates, runs=3, warmup=1, on_warm=lambda name, s: warmed.append(name))
    assert order[:3] == ["a", "b", "c"]  # Warm-up, one candidate after the other.
    assert warmed == ["a", "b", "c"]
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_no_warmup_has_no_first_call_time_and_runs_must_be_positive():
    assert harness.time_interleaved({"f": lambda: None}, runs=1, warmup=0)["f"]["first_call_s"] is None
    with pytest.raises(ValueError, match="runs"):
        harness.time_interleaved({"f": lambda: None}, runs=0)


def test_library_measure_rows_split_the_names_and_round_to_milliseconds():
    timings = {
        "bertzoo forward": {"median_s": 0.0123456, "min_s": 0.01},
        "keras_hub forward": {"median_s": 0.02, "min_s": 0.015},
    }
    rows = harness.library_measure_rows(timings, 7, batch=8, dtype="bfloat16")
    assert rows == [
        {
            "library": "bertzoo",
            "measure": "forward",
            "batch": 8,
            "dtype": "bfloat16",
            "median_ms": 12.35,
            "min_ms": 10.0,
            "runs": 7,
        },
        {
            "library": "keras_hub",
            "measure": "forward",
            "batch": 8,
            "dtype": "bfloat16",
            "median_ms": 20.0,
            "min_ms": 15.0,
            "runs": 7,
        },
    ]


def test_token_batch_is_full_length_with_two_segments():
    batch = harness.token_batch(3, 8, 50)
    assert {k: v.shape for k, v in batch.items()} == {k: (3, 8) for k in ("token_ids", "segment_ids", "padding_mask")}
    assert batch["token_ids"].min() >= 1 and batch["token_ids"].max() < 50
    assert batch["segment_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["padding_mask"].all()


def test_results_writer_appends_rows_with_machine_info(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"benchmark": "old", "machine": "somewhere"}) + "\n")
    harness.append_results("demo", [{"x": 1}, {"x": 2}], "python -m benchmarks.demo --runs 1", path=path)
    rows = harness.read_results(path)
    assert [r["benchmark"] for r in rows] == ["old", "demo", "demo"]  # Appended, the old row kept.
    assert harness.read_results(path, benchmark="demo")[1]["x"] == 2
    new = rows[1]
    assert new["command"] == "python -m benchmarks.demo --runs 1"
    assert isinstance(new["machine"], str) and new["date"]
    info = new["machine_info"]
    assert info["cpu"] and info["cores"] >= 1 and isinstance(info["cpu_flags"], list)
    assert {"bertzoo", "keras"} <= set(info["versions"])
    # Which run and which code: the rows of one process share a run id, and the commit is the checkout's.
    harness.append_results("demo", [{"x": 3}], "python -m benchmarks.demo --runs 1", path=path)
    ids = {r["run_id"] for r in harness.read_results(path, benchmark="demo")}
    assert len(ids) == 1 and str(os.getpid()) in ids.pop()
    head = subprocess.run(["git", "-C", str(harness.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # A git checkout (not an unpacked archive).
        assert info["code"]["commit"] == head.stdout.strip() and isinstance(info["code"]["modified"], bool)
    # The stamp is not a figure: the same result under another run id is recorded already.
    assert harness.unrecorded("demo", [{"x": 3}, {"x": 4}], path=path) == [{"x": 4}]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_code_version_says_modified_for_code_not_for_recorded_results(tmp_path, monkeypatch):
    def git(*arguments):
        subprocess.run(["git", "-C", str(tmp_path), *arguments], check=True, capture_output=True)

    for name in ("bertzoo/model.py", "benchmarks/results.jsonl", "tests/test_model.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    monkeypatch.setattr(harness, "ROOT", tmp_path)

    def version():
        harness.code_version.cache_clear()
        return harness.code_version()

    try:
        assert version()["modified"] is False
        # A benchmark appending its rows (or a test edited) leaves the code as committed.
        (tmp_path / "benchmarks/results.jsonl").write_text("1\n2\n")
        (tmp_path / "tests/test_model.py").write_text("2\n")
        assert version()["modified"] is False
        (tmp_path / "bertzoo/model.py").write_text("2\n")
        assert version()["modified"] is True
    finally:
        harness.code_version.cache_clear()


def test_the_code_version_is_none_outside_a_git_checkout_or_when_git_fails(tmp_path, monkeypatch):
    # Read as the benchmark starts (importing the harness), not when its rows are written.
    read = "from benchmarks import harness as h; print(h.code_version.cache_info().currsize, h.run_id.cache_info().currsize)"
    done = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, cwd=harness.ROOT, check=True)
    assert done.stdout.split() == ["1", "1"]
    monkeypatch.setattr(harness, "ROOT", tmp_path)
    harness.code_version.cache_clear()
    try:
        assert harness.code_version() is None
        monkeypatch.setattr(harness, "ROOT", harness.Path(__file__).resolve().parents[1])
        harness.code_version.cache_clear()

        def hung(*args, **kwargs):
            raise subprocess.TimeoutExpired("git", 60)

        monkeypatch.setattr(subprocess, "run", hung)
        assert harness.code_version() is None  # A finished run's rows are still written.
    finally:
        harness.code_version.cache_clear()


def test_recorded_commands_name_checkout_paths_relative_to_it(tmp_path):
    inside = harness.ROOT / "benchmarks" / "out" / "peers.png"
    command = harness.command_line(
        "benchmarks.run", ["--chart", str(inside), f"--results={harness.RESULTS_FILE}", "--cache", str(tmp_path)]
    )
    assert command == (
        "python -m benchmarks.run --chart benchmarks/out/peers.png "
        f"--results=benchmarks/results.jsonl --cache {tmp_path}"
    )
    # Quoted for the shell: an empty value and a path with a space run as recorded (a bare `--chart` did not).
    quoted = harness.command_line("benchmarks.run", ["--chart", "", "--readme", "/tmp/my readme.md"])
    assert quoted == "python -m benchmarks.run --chart '' --readme '/tmp/my readme.md'"


def test_the_checked_in_results_stay_readable():
    rows = harness.read_results()
    assert rows and all("benchmark" in r for r in rows)


def test_missing_shared_material_names_the_way_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setenv(harness.SHARED_ENV, str(tmp_path))
    monkeypatch.setattr(harness, "ROOT", tmp_path / "checkout")
    monkeypatch.chdir(tmp_path)
    assert harness.minilm_path(required=False) is None
    with pytest.raises(SystemExit, match="BERTZOO_SHARED"):
        harness.minilm_path(purpose="needed here")
    with pytest.raises(SystemExit, match="No data file"):
        harness.sentiment_path(data=tmp_path / "absent.tsv")
    (tmp_path / "data" / "sentiment").mkdir(parents=True)
    (tmp_path / "data" / "sentiment" / "amazon.tsv").write_text("1\t1\tgood\n")
    assert harness.sentiment_path() == tmp_path / "data" / "sentiment" / "amazon.tsv"


def test_benchmarks_import_the_examples_as_modules():
    from benchmarks import distillation
    from benchmarks import finetune
    from examples import distill_to_small
    from examples import finetune_classifier

    assert distillation.example is distill_to_small
    assert finetune.finetune_classifier is finetune_classifier
    assert callable(distill_to_small.run) and callable(finetune_classifier.run)
    assert distill_to_small.settings(train_size=0).train_size == 0
    with pytest.raises(TypeError, match="Unknown setting"):
        finetune_classifier.settings(no_such_flag=1)


def test_worker_result_is_the_last_json_line_or_a_named_failure(tmp_path):
    module = tmp_path / "fake_worker.py"
    module.write_text(
        'import sys\nprint("{\\"a\\": 1}")\nprint("noise")\nprint("{\\"a\\": 2}")\nsys.exit(int(sys.argv[1]))\n'
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    assert harness.worker_result("fake_worker", ["0"], env, "ok") == {"a": 2}
    with pytest.raises(SystemExit, match=r"worker float32 setting=1 failed"):
        harness.worker_result("fake_worker", ["3"], env, "float32 setting=1")


def test_a_line_cut_short_spoils_only_itself(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"benchmark": "old", "x": 0}) + "\n" + '{"benchmark": "old", "x"')  # Killed mid-line.
    harness.append_results("demo", [{"x": 1}, {"x": 2}], "python -m benchmarks.demo", path=path)
    assert [r["x"] for r in harness.read_results(path)] == [0, 1, 2]
    assert "results.jsonl:2 is not a complete JSON line" in capsys.readouterr().err
    assert harness.unrecorded("demo", [{"x": 1}, {"x": 3}], path=path) == [{"x": 3}]


def test_a_report_names_the_cpu_flags_of_each_machine():
    row = {"machine": "Xeon, 2 cores", "machine_info": {"cpu_flags": ["avx512f", "amx_tile"]}}
    assert harness.machine_label(row) == "Xeon, 2 cores (avx512f, amx_tile)"
    assert harness.machine_label({"machine": "Xeon, 2 cores"}) == "Xeon, 2 cores"  # Older rows.


def test_rows_describe_the_cpu_by_the_fast_paths_own_flags_and_environment():
    from bertzoo.utils import fast_path

    # The flags the fast-path cache key holds for this CPU (fma, avx_vnni, ... too).
    assert harness.cpu_features() == fast_path.device_description()["cpu_flags"]
    assert harness.fast_path_constant("CPU_FLAGS") == fast_path.CPU_FLAGS
    assert harness.fast_path_constant("KERNEL_ENVIRONMENT") == fast_path.KERNEL_ENVIRONMENT
    assert harness.fast_path_constant("CACHE_DIR_ENV") == fast_path.CACHE_DIR_ENV


def test_machine_info_counts_the_usable_cores_and_records_the_thread_environment(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "2")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    info = harness.machine_info()
    assert info["cores"] == 1 and info["cpu_count"] == 8
    assert info["environment"]["OMP_NUM_THREADS"] == "3" and info["environment"]["TF_NUM_INTRAOP_THREADS"] == "2"
    assert "ONEDNN_MAX_CPU_ISA" not in info["environment"]  # Only the variables that are set.
    assert ", 1 cores (of 8)" in harness.machine()


def test_without_matplotlib_a_benchmark_draws_no_chart_and_says_so(monkeypatch, capsys):
    find_spec = harness.importlib.util.find_spec
    monkeypatch.setattr(
        harness.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else find_spec(name)
    )
    assert harness.chart_or_none("benchmarks/out/peers.png") is None
    assert "matplotlib is not installed: no chart benchmarks/out/peers.png" in capsys.readouterr().out
    assert harness.chart_or_none("") is None


def test_benchmarks_that_need_jax_or_torch_say_so_before_building_anything(monkeypatch):
    from benchmarks import call_overhead
    from benchmarks import training_gap

    find_spec = harness.importlib.util.find_spec
    hidden = {"jax", "torch"}
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: None if name in hidden else find_spec(name))
    with pytest.raises(SystemExit, match=r"training_gap .* needs jax, which is not installed: pip install jax jaxlib"):
        training_gap.main(["--preset", "tiny"])
    with pytest.raises(SystemExit, match=r"call_overhead .* needs jax"):
        call_overhead.main(["--preset", "tiny"])
    hidden = {"torch"}
    with pytest.raises(SystemExit, match=r"--libraries transformers needs torch.*pip install torch"):
        call_overhead.main(["--preset", "tiny", "--libraries", "transformers"])
