"""`python -m benchmarks.run --readme`: the README's results table is rewritten in place."""

import pytest

from benchmarks.run import README_END
from benchmarks.run import README_START
from benchmarks.run import readme_section
from benchmarks.run import summarize
from benchmarks.run import write_readme


def row(library, mode, dtype, seq_per_s, xla=False, **extra):
    return {"library": library, "mode": mode, "dtype": dtype, "seq_per_s": seq_per_s, "xla": xla, **extra}


def test_section_lists_each_library_best_setting_and_the_ratio_to_the_best_peer():
    rows = [
        row("bertzoo", "inference", "bfloat16", 28.0, vs_best_peer=28.0 / 24.0),
        row("bertzoo", "inference", "bfloat16", 15.0, xla=True, vs_best_peer=15.0 / 24.0),
        row("keras_hub", "inference", "bfloat16", 23.0),
        row("transformers", "inference", "bfloat16", 24.0, threads=2),
        row("transformers", "inference", "int8", 30.0, threads=2),
        row("bertzoo", "inference", "int8", 23.0, xla=True, vs_best_peer=23.0 / 30.0),
    ]
    text = readme_section(rows, summarize(rows), "Measured somewhere.")
    lines = text.splitlines()
    assert lines[0] == "Measured somewhere."
    assert "| inference | bfloat16 | 28.00 (no XLA) | 23.00 (no XLA) | 24.00 (2 threads) | 1.17x |" in lines
    assert "| inference | int8 | 23.00 (XLA) | - | 30.00 (2 threads) | 0.77x |" in lines
    # The best bertzoo row overall (28) against the best peer row overall (30).
    assert any("0.93x the best peer" in line and "not faster than every peer" in line for line in lines)
    # What a run left out is said under the table: a missing peer flatters the ratios.
    noted = readme_section(rows, summarize(rows), "Measured.", notes=["HF transformers inference float32: timed out"])
    assert noted.splitlines()[-1] == "- Note: HF transformers inference float32: timed out"
    assert "- Note:" not in text


def test_only_the_text_between_the_markers_changes(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n{README_START}\nold table\n{README_END}\n\nafter\n")
    write_readme(readme, "new table")
    assert readme.read_text() == f"# Title\n\nintro\n{README_START}\nnew table\n{README_END}\n\nafter\n"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # No temporary file left behind.


def test_missing_markers_are_an_error_and_leave_the_file_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\nno markers here\n")
    with pytest.raises(SystemExit, match="needs exactly one"):
        write_readme(readme, "table")
    assert readme.read_text() == "# Title\nno markers here\n"


def test_the_other_backends_rows_are_bertzoos_own_not_a_peer():
    rows = [
        row("bertzoo", "inference", "float32", 10.0, vs_best_peer=10.0 / 12.0),
        row("bertzoo_jax", "inference", "float32", 13.0, xla=True, vs_best_peer=13.0 / 12.0),
        row("bertzoo_torch", "inference", "float32", 11.0, xla=True, vs_best_peer=11.0 / 12.0),
        row("bertzoo_torch", "inference", "float32", 9.0, vs_best_peer=9.0 / 12.0),
        row("keras_hub", "inference", "float32", 12.0),
    ]
    (summary,) = summarize(rows)
    assert summary["bertzoo_best"] == "bertzoo (JAX backend) float32, XLA" and summary["ratio"] == pytest.approx(1.08)
    assert summary["peer_best"] == "keras-hub float32, no XLA"
    lines = readme_section(rows, [summary], "Measured.").splitlines()
    # On the torch backend `jit_compile=True` is Keras's torch.compile.
    assert (
        "| inference | float32 | 10.00 (no XLA) | 13.00 (XLA) | 11.00 (torch.compile) | 12.00 (no XLA) | 1.08x |"
        in lines
    )


def test_a_gpu_run_fills_the_gpu_table_and_leaves_the_cpu_table_alone(tmp_path):
    from benchmarks.run import GPU_README_END
    from benchmarks.run import GPU_README_START

    readme = tmp_path / "README.md"
    text = f"{README_START}\ncpu table\n{README_END}\n\n{GPU_README_START}\nold gpu\n{GPU_README_END}\n"
    readme.write_text(text)
    write_readme(readme, "new gpu", gpu=True)
    assert readme.read_text() == text.replace("old gpu", "new gpu")


def test_the_pytorch_tf32_setting_is_named():
    from benchmarks.run import _setting_name

    assert _setting_name(row("transformers", "inference", "float32", 1.0, threads=16, tf32=True)) == "16 threads, TF32"
    assert _setting_name(row("transformers", "inference", "float32", 1.0, threads=1)) == "1 thread"
    assert (
        _setting_name(row("transformers", "training", "bfloat16", 1.0, threads=2, xla=True))
        == "2 threads, torch.compile"
    )


def test_each_configuration_is_recorded_as_soon_as_it_is_timed(tmp_path, monkeypatch):
    # A run stopped after its first configuration (killed by a time limit,
    # say) keeps that configuration's line in the results file.
    import json

    from benchmarks import run

    results = tmp_path / "results.jsonl"
    timed = {
        "median_s": 0.01,
        "min_s": 0.01,
        "cpu_median_s": 0.01,
        "times_s": [0.01],
        "device": "CPU",
        "load_after": 0.1,
    }

    def worker(args, library, **kwargs):
        if library == "matmul":
            return [], "no TensorFlow"
        if library == "keras_hub_jax":
            raise KeyboardInterrupt  # The run is stopped here.
        return [
            {
                "library": library,
                "mode": kwargs["mode"],
                "dtype": kwargs["dtype"],
                "xla": True,
                "default": True,
                **timed,
            }
        ], None

    monkeypatch.setattr(run, "run_worker", worker)
    monkeypatch.setattr(run, "missing", lambda name: None)
    with pytest.raises(KeyboardInterrupt):
        run.main(
            [
                "--models",
                "bertzoo_jax,keras_hub_jax",
                "--modes",
                "inference",
                "--dtypes",
                "float32",
                "--preset",
                "tiny",
                "--chart=",
                f"--results={results}",
            ]
        )
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["kind"], r["library"], r["device"]) for r in lines] == [("configuration", "bertzoo_jax", "CPU")]
    assert lines[0]["benchmark"] == "peers" and lines[0]["batch"] == 8 and lines[0]["median_s"] == 0.01
    assert lines[0]["seq_per_s"] == pytest.approx(8 / 0.01) and lines[0]["gflops"] > 0
