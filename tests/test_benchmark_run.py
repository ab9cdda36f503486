"""benchmarks.run: ratios per device, the run's own fast-path cache, the
warm-up minimum and the order the libraries' workers run in."""

from pathlib import Path

import pytest

from benchmarks import run


def timed_row(library, device, median_s, mode="inference", dtype="float32", **extra):
    """A worker's row as `benchmarks.peers` prints it (what `add_figures` reads)."""
    return {
        "library": library,
        "mode": mode,
        "dtype": dtype,
        "xla": library != "transformers",
        "default": True,
        "median_s": median_s,
        "device": device,
        **extra,
    }


def with_figures(rows):
    args = run.argparse.Namespace(batch_size=8, sequence_length=128)
    run.add_figures(rows, run.backbone_config("tiny"), args, peaks={})
    return rows


def test_bertzoo_on_the_cpu_is_not_divided_by_a_peer_on_a_gpu():
    # Torch sees the GPU, JAX the CPU only: no peer ran where bertzoo did.
    ours, theirs = with_figures(
        [timed_row("bertzoo_jax", "CPU", 0.5), timed_row("transformers", "NVIDIA H200", 0.01, threads=16)]
    )
    assert ours["vs_best_peer"] is None and theirs["vs_best_peer"] is None
    assert run.summarize([ours, theirs]) == []


def two_device_rows():
    """bertzoo and a peer on the CPU (JAX), and on a GPU (torch)."""
    return with_figures(
        [
            timed_row("bertzoo_jax", "CPU", 0.5),
            timed_row("keras_hub_jax", "CPU", 1.0),
            timed_row("bertzoo_torch", "NVIDIA H200", 0.02),
            timed_row("transformers", "NVIDIA H200", 0.01, threads=16),
        ]
    )


def test_each_bertzoo_row_is_compared_with_the_best_peer_on_its_own_device():
    rows = two_device_rows()
    assert [r["vs_best_peer"] for r in rows] == [pytest.approx(2.0), None, pytest.approx(0.5), None]
    summary = run.summarize(rows)
    assert [(s["device"], s["ratio"]) for s in summary] == [("CPU", 2.0), ("NVIDIA H200", 0.5)]
    assert summary[0]["peer_best"] == "keras-hub (JAX backend) float32, XLA"
    assert summary[1]["peer_best"] == "HF transformers (PyTorch) float32, 16 threads"


def test_a_mixed_device_run_labels_the_device_in_the_readme_table():
    rows = two_device_rows()
    lines = run.readme_section(rows, run.summarize(rows), "Measured.").splitlines()
    assert lines[2].startswith("| mode | dtype | device | bertzoo (JAX backend) seq/s |")
    assert lines[3] == "|---|---|---|" + "--:|" * 5
    assert "| inference | float32 | CPU | 16.00 (XLA) | - | 8.00 (XLA) | - | 2.00x |" in lines
    assert (
        "| inference | float32 | NVIDIA H200 | - | 400.00 (torch.compile) | - | 800.00 (16 threads) | 0.50x |" in lines
    )
    assert any(line.startswith("- inference on CPU: ") and "2.0x" in line for line in lines)
    assert any(line.startswith("- inference on NVIDIA H200: ") and "0.5x" in line for line in lines)


def test_a_run_on_one_device_keeps_the_table_without_a_device_column():
    rows = with_figures([timed_row("bertzoo", "CPU", 0.5), timed_row("keras_hub", "CPU", 1.0)])
    lines = run.readme_section(rows, run.summarize(rows), "Measured.").splitlines()
    assert lines[2] == "| mode | dtype | bertzoo seq/s | keras-hub seq/s | bertzoo vs best peer |"
    assert "| inference | float32 | 16.00 (XLA) | 8.00 (XLA) | 2.00x |" in lines
    assert any(line.startswith("- inference: ") for line in lines)


def test_workers_use_the_runs_own_fast_path_cache_unless_the_user_chose_one(monkeypatch, tmp_path):
    args = run.argparse.Namespace(fast_path_cache_dir=str(tmp_path))
    monkeypatch.delenv("BERTZOO_CACHE_DIR", raising=False)
    assert run.worker_environment(args)["BERTZOO_CACHE_DIR"] == str(tmp_path)
    monkeypatch.setenv("BERTZOO_CACHE_DIR", "/somewhere/chosen")
    assert run.worker_environment(args)["BERTZOO_CACHE_DIR"] == "/somewhere/chosen"


def test_a_run_hands_its_workers_an_empty_cache_folder_and_removes_it(monkeypatch):
    # Not ~/.cache/bertzoo: a row's `default` would otherwise come from an older run's entry.
    monkeypatch.delenv("BERTZOO_CACHE_DIR", raising=False)
    seen = []

    def worker_process(module, arguments, env=None, timeout=None):
        folder = Path(env.get("BERTZOO_CACHE_DIR", Path.home() / ".cache" / "bertzoo"))
        seen.append((folder, folder.is_dir() and not any(folder.iterdir())))
        return run.subprocess.CompletedProcess(arguments, 0, stdout="", stderr="")

    monkeypatch.setattr(run, "run_module", worker_process)
    monkeypatch.setattr(run, "missing", lambda name: None)
    with pytest.raises(SystemExit, match="Nothing was timed"):
        run.main(["--models", "bertzoo,keras_hub", "--dtypes", "float32", "--modes", "inference", "--chart", ""])
    assert len(seen) == 4  # The matmul peak twice, and each library.
    folders = {folder for folder, _ in seen}
    assert folders != {Path.home() / ".cache" / "bertzoo"} and len(folders) == 1
    assert all(empty for _, empty in seen)
    (folder,) = folders
    assert not folder.exists()  # Removed at the end of the run.


def test_fewer_than_one_warmup_call_is_refused(monkeypatch, capsys):
    # The worker always warms up once (the first call compiles): 0 would be recorded but not run.
    monkeypatch.setattr(run, "run_worker", lambda args, **worker_args: ([], None))
    monkeypatch.setattr(run, "missing", lambda name: None)
    with pytest.raises(SystemExit) as exited:
        run.main(["--models", "bertzoo", "--dtypes", "float32", "--warmup", "0", "--chart", ""])
    assert exited.value.code == 2  # argparse's usage error, before anything runs.
    assert "--warmup: 0 is below 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--help"])
    assert "at least 1" in " ".join(capsys.readouterr().out.split())


def test_a_readme_without_its_tables_is_refused_before_anything_runs(monkeypatch, tmp_path):
    # It was read after the measurements (an hour, at the defaults), then failed with a traceback.
    monkeypatch.setattr(run, "run_worker", lambda args, **worker_args: pytest.fail("measured"))
    monkeypatch.setattr(run, "missing", lambda name: None)
    arguments = ["--models", "bertzoo", "--dtypes", "float32", "--chart", "", "--readme"]
    with pytest.raises(SystemExit, match=r"READMEE.md does not exist"):
        run.main(arguments + [str(tmp_path / "READMEE.md")])
    (tmp_path / "README.md").write_text(f"{run.README_START}\n{run.README_END}\n")  # No GPU table.
    with pytest.raises(SystemExit, match=r"exactly one <!-- benchmarks.run:gpu:start -->"):
        run.main(arguments + [str(tmp_path / "README.md")])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dtypes", "float32,float32"], r"--dtypes: float32 given twice"),  # Timed the same configuration twice.
        (["--worker-timeout", "-5"], r"--worker-timeout must be positive"),  # "timed out after -5 s", after the wait.
        (["--max-wait", "-1"], r"--max-wait a number of seconds >= 0"),
        (["--results", "NODIR/r.jsonl"], r"the folder .*missing does not exist"),  # After the first measurement.
    ],
)
def test_bad_settings_are_refused_before_anything_is_measured(monkeypatch, tmp_path, arguments, message):
    monkeypatch.setattr(run, "run_worker", lambda args, **worker_args: pytest.fail("measured"))
    monkeypatch.setattr(run, "missing", lambda name: None)
    arguments = [a.replace("NODIR", str(tmp_path / "missing")) for a in arguments]
    with pytest.raises(SystemExit, match=message):
        run.main(["--models", "bertzoo", "--preset", "tiny", "--chart", ""] + arguments)


def test_the_libraries_take_turns_at_running_first(monkeypatch):
    asked = []

    def worker(args, **worker_args):
        if worker_args["library"] != "matmul":
            asked.append((worker_args["mode"], worker_args["dtype"], worker_args["library"]))
        return [], None

    monkeypatch.setattr(run, "run_worker", worker)
    monkeypatch.setattr(run, "missing", lambda name: None)
    with pytest.raises(SystemExit, match="Nothing was timed"):
        run.main(["--models", "bertzoo,keras_hub,transformers", "--dtypes", "float32,bfloat16", "--chart", ""])
    firsts = [asked[i][2] for i in range(0, len(asked), 3)]
    assert firsts == ["bertzoo", "transformers", "bertzoo", "transformers"]
    assert asked[3:6] == [("inference", "bfloat16", name) for name in ("transformers", "keras_hub", "bertzoo")]
