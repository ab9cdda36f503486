"""bertzoo against its peers: BERT inference and training-step throughput.

Times BERT-base (the `base` preset's shape, seeded random weights) on a
full-length batch (default 8 x 128) for bertzoo (also on Keras's JAX and
torch backends, when installed), keras-hub's `BertBackbone` and, when
installed, Hugging Face transformers' PyTorch `BertModel`, in
float32, bfloat16 and int8 (inference only; bertzoo also with static int8
input ranges, `int8_static`, which no peer here has; asked for by name,
weight-only int8 over float32 or bfloat16 arithmetic, `int8_weights` and
`int8_weights_bfloat16`, for the Keras libraries), with and without XLA
for the Keras libraries. Every configuration runs in its own worker process
(`benchmarks.peers`); its figure is the median of `--runs` timed calls after
warm-up, next to the process's CPU seconds per call (less sensitive to other
processes on a shared machine). The workers share a fast-path cache folder
of the run's own (temporary, unless `BERTZOO_CACHE_DIR` is set), so bertzoo's
default setting is measured in the run, not read from an older run's entry;
the (mode, dtype) configurations take turns at running the libraries in
reverse order. bertzoo is compared with peers on the same device only. The
same run measures a TensorFlow matmul peak per dtype (at its start and end,
keeping the better), so each configuration's achieved GFLOP/s (analytic
BERT FLOPs, training = 3x forward) is also given as a share of what this
machine's matmuls reach; on a busy machine that share can exceed 100% when
the peak landed in a busier moment.

Usage:
    python -m benchmarks.run                       # everything (long: many minutes on a CPU)
    python -m benchmarks.run --models bertzoo,keras_hub --dtypes bfloat16 --modes inference
    python -m benchmarks.run --preset tiny --runs 3  # a quick smoke run
    python -m benchmarks.run --models bertzoo,keras_hub --dtypes float32 --modes inference  # forward pass vs keras-hub

Prints a Markdown table of every configuration, appends one JSON line per
configuration as soon as it is timed (so a run cut short keeps what it
measured) plus a summary line at the end to benchmarks/results.jsonl (date,
machine, load average, command), draws a PNG chart (`--chart`), and with
`--readme README.md` rewrites the README's results table (between the
`<!-- benchmarks.run:start -->` and `<!-- benchmarks.run:end -->` markers;
on a machine with a GPU, the GPU table between the `benchmarks.run:gpu`
markers instead, with a device column when some libraries ran on the CPU):

    python -m benchmarks.run --wait-for-load 1 --readme README.md
Libraries that are not installed are skipped with a note. Optional peer:
`pip install torch transformers` (measurement only, not a bertzoo
dependency).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import OUT
from benchmarks.harness import RESULTS_FILE
from benchmarks.harness import append_results
from benchmarks.harness import chart_or_none
from benchmarks.harness import check_markers
from benchmarks.harness import check_results_file
from benchmarks.harness import comma_choices
from benchmarks.harness import command_line
from benchmarks.harness import cpu_features
from benchmarks.harness import fast_path_constant
from benchmarks.harness import machine
from benchmarks.harness import print_table
from benchmarks.harness import run_module
from benchmarks.harness import wait_for_load
from benchmarks.harness import write_between_markers
from benchmarks.peers import DEFAULT_DTYPES
from benchmarks.peers import DTYPES
from benchmarks.peers import INT8_DTYPES
from benchmarks.peers import LIBRARIES
from benchmarks.peers import MIN_WARMUP
from benchmarks.peers import MODES
from benchmarks.peers import OURS
from benchmarks.peers import PEAK_DTYPE
from benchmarks.peers import backbone_config
from benchmarks.peers import missing
from benchmarks.peers import runs_dtype
from benchmarks.peers import warmup_calls

# The variable naming bertzoo's fast-path cache folder (`BERTZOO_CACHE_DIR`).
CACHE_DIR_ENV = fast_path_constant("CACHE_DIR_ENV")

DEFAULT_CHART = OUT / "peers.png"
LABELS = {
    "bertzoo": "bertzoo",
    "bertzoo_jax": "bertzoo (JAX backend)",
    "bertzoo_torch": "bertzoo (torch backend)",
    "keras_hub": "keras-hub",
    "keras_hub_jax": "keras-hub (JAX backend)",
    "transformers": "HF transformers (PyTorch)",
}
COLUMNS = [
    "mode",
    "dtype",
    "library",
    "setting",
    "median ms",
    "seq/s",
    "GFLOP/s",
    "% of peak",
    "vs best peer",
    "CPU s/call",
    "error vs fp32",
]


def encoder_flops(config, batch, length, mode):
    """Multiply-add FLOPs (x2) of one BERT forward, or of a training step
    (forward + backward, taken as 3x the forward, the usual estimate).

    Per layer: Q, K, V and output projections, the two attention products
    (scores and context) and the two feed-forward matmuls; plus the pooler.
    Embedding lookups, softmax, LayerNorm and GELU are not counted.
    """
    hidden, inner, layers = config["hidden_dim"], config["intermediate_dim"], config["num_layers"]
    heads = config["num_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    width = heads * head_dim
    tokens = batch * length
    per_layer = (
        2 * tokens * 4 * hidden * width  # Q, K, V, output.
        + 2 * 2 * batch * heads * length * length * head_dim  # QK^T and PV.
        + 2 * 2 * tokens * hidden * inner  # Feed-forward.
    )
    forward = layers * per_layer + 2 * batch * hidden * hidden
    return forward * (3 if mode == "training" else 1)


def bench_rows(stdout):
    """The rows of a worker's `BENCH {json}` lines (`stdout`: text, bytes, or
    None, as `subprocess.TimeoutExpired` may hold it)."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode(errors="replace")
    rows = []
    for line in (stdout or "").splitlines():
        if line.startswith("BENCH "):
            try:
                rows.append(json.loads(line[6:]))
            except json.JSONDecodeError:  # The line a timeout cut off half-printed.
                continue
    return rows


def worker_environment(args):
    """The environment of a `benchmarks.peers` worker: this one's, quieter,
    and with the run's own fast-path cache (`args.fast_path_cache_dir`, when
    set) unless the user chose one with `BERTZOO_CACHE_DIR`, so that a
    row's default setting is measured in this run, not read from an entry
    an older run (or bertzoo version) left in `~/.cache/bertzoo`."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
    own_cache = getattr(args, "fast_path_cache_dir", None)
    if own_cache and not os.environ.get(CACHE_DIR_ENV):
        env[CACHE_DIR_ENV] = str(own_cache)
    return env


def run_worker(args, **worker_args):
    """Runs one `benchmarks.peers` worker; returns (rows, error or None)."""
    arguments = []
    for key, value in worker_args.items():
        arguments += [f"--{key.replace('_', '-')}", value]
    try:
        done = run_module("benchmarks.peers", arguments, env=worker_environment(args), timeout=args.worker_timeout)
    except subprocess.TimeoutExpired as timeout:
        # The variants timed before the cut (a slow compile comes last) still count.
        return bench_rows(timeout.stdout), f"timed out after {args.worker_timeout} s"
    rows = bench_rows(done.stdout)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        # The exception line, not a framework's closing remark after it.
        tail = [line for line in lines if "Error" in line or "Exit" in line][-1:] or lines[-1:] or ["?"]
        return rows, f"worker failed (exit {done.returncode}): {tail[0][:300]}"
    return rows, None


def row_figures(row, config, args, peaks):
    """Throughput, GFLOP/s and share of the matmul peak of one row (in place)."""
    row["seq_per_s"] = args.batch_size / row["median_s"]
    row["gflops"] = encoder_flops(config, args.batch_size, args.sequence_length, row["mode"]) / row["median_s"] / 1e9
    peak = peaks.get(PEAK_DTYPE.get(row["dtype"], row["dtype"]), {}).get("gflops")
    row["peak_gflops"] = peak
    row["utilization"] = row["gflops"] / peak if peak else None


def device_of(row):
    """The device a row ran on: "CPU" or the GPU's name (older rows: "CPU")."""
    return row.get("device", "CPU")


def devices_of(rows):
    """The devices `rows` ran on, in the order first seen."""
    return list(dict.fromkeys(device_of(r) for r in rows))


def add_figures(rows, config, args, peaks):
    """`row_figures` for every row, and each bertzoo row's ratio to the best
    peer of its mode and dtype on the same device (None without one: a
    bertzoo row on the CPU is never divided by a peer's on a GPU)."""
    for row in rows:
        row_figures(row, config, args, peaks)
    for row in rows:
        peers = [
            r["seq_per_s"]
            for r in rows
            if r["library"] not in OURS
            and (r["mode"], r["dtype"], device_of(r)) == (row["mode"], row["dtype"], device_of(row))
        ]
        row["vs_best_peer"] = row["seq_per_s"] / max(peers) if peers and row["library"] in OURS else None


def summarize(rows):
    """Per mode and device: bertzoo's best configuration against the best
    peer's on that device."""
    summary = []
    for mode in MODES:
        for device in devices_of(rows):
            same = [r for r in rows if r["mode"] == mode and device_of(r) == device]
            ours = [r for r in same if r["library"] in OURS]
            theirs = [r for r in same if r["library"] not in OURS]
            if ours and theirs:
                summary.append(_compare_best(mode, device, ours, theirs))
    return summary


def _compare_best(mode, device, ours, theirs):
    """One `summarize` entry: the fastest of `ours` against the fastest of `theirs`."""
    best = max(ours, key=lambda r: r["seq_per_s"])
    peer = max(theirs, key=lambda r: r["seq_per_s"])
    return {
        "mode": mode,
        "device": device,
        "bertzoo_best": _describe(best),
        "bertzoo_seq_per_s": round(best["seq_per_s"], 2),
        "peer_best": _describe(peer),
        "peer_seq_per_s": round(peer["seq_per_s"], 2),
        "ratio": round(best["seq_per_s"] / peer["seq_per_s"], 2),
    }


def _setting(row):
    """The configuration column: XLA for Keras, threads for PyTorch."""
    if "threads" in row:
        text = f"- ({_setting_name(row)})"
    elif row["library"] == "bertzoo_torch":
        text = _setting_name(row)
    else:
        text = "yes" if row["xla"] else "no"
    return text + (" (default)" if row["default"] else "")


def _setting_name(row):
    """ "XLA" / "no XLA" for the Keras libraries ("torch.compile" / "eager"
    on Keras's torch backend), "2 threads" for PyTorch."""
    if "threads" in row:
        threads = f"{row['threads']} thread{'s' if row['threads'] > 1 else ''}"
        return threads + (", TF32" if row.get("tf32") else "") + (", torch.compile" if row.get("xla") else "")
    if row["library"] == "bertzoo_torch":
        return "torch.compile" if row["xla"] else "eager"
    return "XLA" if row["xla"] else "no XLA"


def _describe(row):
    return f"{LABELS[row['library']]} {row['dtype']}, {_setting_name(row)}"


README_START = "<!-- benchmarks.run:start -->"
README_END = "<!-- benchmarks.run:end -->"
# A run on a machine with a GPU fills its own table: CPU and GPU figures
# answer different questions and neither should overwrite the other.
GPU_README_START = "<!-- benchmarks.run:gpu:start -->"
GPU_README_END = "<!-- benchmarks.run:gpu:end -->"


def readme_section(rows, summary, header, notes=()):
    """The README's results: per (mode, dtype) the best configuration of each
    library, bertzoo's ratio to the best peer, the overall winners, and
    the run's `notes` (libraries skipped, workers that failed or were cut
    short): a peer left out makes "best peer" easier to beat, so the table
    says so.

    A run whose libraries ran on different devices (PyTorch on a GPU,
    TensorFlow on the CPU only) gets a device column, a line per device, and
    its winners named per device: nothing is compared across devices.
    """
    libraries = [name for name in LIBRARIES if any(r["library"] == name for r in rows)]
    devices = devices_of(rows)
    mixed = len(devices) > 1
    lines = [
        header,
        "",
        "| mode | dtype | "
        + ("device | " if mixed else "")
        + " | ".join(f"{LABELS[n]} seq/s" for n in libraries)
        + " | bertzoo vs best peer |",
        "|---|---|" + ("---|" if mixed else "") + "--:|" * (len(libraries) + 1),
    ]
    for mode in MODES:
        for dtype in DTYPES:
            for device in devices:
                found = [r for r in rows if (r["mode"], r["dtype"], device_of(r)) == (mode, dtype, device)]
                if not found:
                    continue
                cells = []
                for name in libraries:
                    mine = [r for r in found if r["library"] == name]
                    best = max(mine, key=lambda r: r["seq_per_s"]) if mine else None
                    cells.append(f"{best['seq_per_s']:.2f} ({_setting_name(best)})" if best else "-")
                ours = [r["vs_best_peer"] for r in found if r["library"] in OURS and r["vs_best_peer"]]
                ratio = f"{max(ours):.2f}x" if ours else "-"
                where = f"{device} | " if mixed else ""
                lines.append(f"| {mode} | {dtype} | {where}" + " | ".join(cells) + f" | {ratio} |")
    lines.append("")
    for s in summary:
        verdict = "faster than" if s["ratio"] > 1 else "not faster than"
        where = f" on {s['device']}" if mixed else ""
        lines.append(
            f"- {s['mode']}{where}: bertzoo's best, {s['bertzoo_best']} ({s['bertzoo_seq_per_s']} seq/s), is "
            f"{s['ratio']}x the best peer, {s['peer_best']} ({s['peer_seq_per_s']} seq/s): {verdict} every peer"
            f"{' there' if mixed else ''}."
        )
    lines.extend(f"- Note: {note}" for note in notes)
    return "\n".join(lines)


def write_readme(path, section, gpu=False):
    """Replaces the text between the README markers (the GPU table's with
    `gpu`) with `section`."""
    start, end = (GPU_README_START, GPU_README_END) if gpu else (README_START, README_END)
    write_between_markers(path, section, start, end)


def table_rows(rows):
    table = []
    for r in rows:
        check = r.get("check_vs_float32") or {}
        table.append(
            {
                "mode": r["mode"],
                "dtype": r["dtype"],
                "library": LABELS[r["library"]],
                "setting": _setting(r),
                "median ms": round(r["median_s"] * 1000, 1),
                "seq/s": round(r["seq_per_s"], 2),
                "GFLOP/s": round(r["gflops"], 1),
                "% of peak": f"{100 * r['utilization']:.0f}%" if r["utilization"] else "",
                "vs best peer": f"{r['vs_best_peer']:.2f}x" if r["vs_best_peer"] else "",
                "CPU s/call": round(r["cpu_median_s"], 2),
                "error vs fp32": f"{check['relative_error']:.1e}" if check else "",
            }
        )
    return table


def _library_versions(rows):
    versions = {}
    for row in rows:
        versions.update({k: v for k, v in row.get("versions", {}).items() if k != "torch_threads"})
    return dict(sorted(versions.items()))


def draw_chart(rows, path, title):
    """Grouped bars: best sequences/s of each library per (mode, dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    libraries = [name for name in LIBRARIES if any(r["library"] == name for r in rows)]
    colors = {
        "bertzoo": "#1f77b4",
        "bertzoo_jax": "#9467bd",
        "bertzoo_torch": "#8c564b",
        "keras_hub": "#ff7f0e",
        "keras_hub_jax": "#e377c2",
        "transformers": "#2ca02c",
    }
    for ax, mode in zip(axes[0], modes):
        dtypes = [d for d in DTYPES if any(r["mode"] == mode and r["dtype"] == d for r in rows)]
        width = 0.8 / max(len(libraries), 1)
        for i, name in enumerate(libraries):
            values, labels = [], []
            for dtype in dtypes:
                found = [r for r in rows if (r["mode"], r["dtype"], r["library"]) == (mode, dtype, name)]
                best = max(found, key=lambda r: r["seq_per_s"]) if found else None
                values.append(best["seq_per_s"] if best else 0.0)
                labels.append("" if best is None else _setting_name(best))
            xs = [j + (i - (len(libraries) - 1) / 2) * width for j in range(len(dtypes))]
            bars = ax.bar(xs, values, width, label=LABELS[name], color=colors[name])
            for bar, value, label in zip(bars, values, labels):
                if value:
                    text = f"{value:.1f}" + (f"\n{label}" if label else "")
                    ax.annotate(text, (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(dtypes)), dtypes)
        ax.set_ylabel("sequences / s (higher is better)")
        ax.set_title(f"{mode}")
        ax.margins(y=0.2)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _setup(args, features, start_load):
    """What every line of one run records about its setting (`fast_path_cache`:
    the user's `BERTZOO_CACHE_DIR`, or None for the run's own, empty at its
    start)."""
    return {
        "preset": args.preset,
        "batch": args.batch_size,
        "length": args.sequence_length,
        "runs": args.runs,
        "warmup": args.warmup,
        "cpu_flags": features,
        "load_start": round(start_load[0], 2),
        "fast_path_cache": os.environ.get(CACHE_DIR_ENV) or None,
    }


def in_turn(libraries, turn):
    """`libraries` in their order on even turns, reversed on odd ones: each
    (mode, dtype) is a turn, so no library's worker always runs first (next
    to the matmul peak, on a machine that drifts during a long run)."""
    return list(libraries) if turn % 2 == 0 else list(libraries)[::-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(LIBRARIES), help=f"comma list of {', '.join(LIBRARIES)}")
    parser.add_argument(
        "--dtypes", default=",".join(DEFAULT_DTYPES), help=f"comma list of {', '.join(DTYPES)} (float16: GPUs)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of inference, training")
    parser.add_argument("--runs", type=int, default=5, help="timed calls per configuration; the median is reported")
    parser.add_argument(
        "--warmup",
        type=warmup_calls,
        default=2,
        help=f"untimed calls first, at least {MIN_WARMUP} (the first traces and compiles)",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--preset", default="base", help="bertzoo preset giving the model shape (default base)")
    parser.add_argument("--chart", default=str(DEFAULT_CHART), help="PNG to draw ('' for none)")
    parser.add_argument("--results", type=Path, default=RESULTS_FILE, help="JSON lines file to append to")
    parser.add_argument(
        "--wait-for-load",
        type=float,
        default=None,
        metavar="LOAD",
        help="first wait until the 1-min load average is below LOAD",
    )
    parser.add_argument("--max-wait", type=float, default=900, help="seconds to wait for the load at most")
    parser.add_argument("--worker-timeout", type=int, default=1800)
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        metavar="README",
        help="rewrite the results table between the markers in this file",
    )
    args = parser.parse_args(argv)
    models = comma_choices(args.models, list(LIBRARIES), "--models")
    dtypes = comma_choices(args.dtypes, list(DTYPES), "--dtypes")
    modes = comma_choices(args.modes, list(MODES), "--modes")
    if args.runs < 1 or args.batch_size < 1 or args.sequence_length < 1:
        raise SystemExit("--runs, --batch-size and --sequence-length must be positive.")
    if args.worker_timeout < 1 or not 0 <= args.max_wait < float("inf"):
        raise SystemExit("--worker-timeout must be positive (seconds) and --max-wait a number of seconds >= 0.")
    check_results_file(args.results)
    if args.readme:  # Either table may be the one rewritten: both sets of markers, checked before measuring.
        check_markers(args.readme, README_START, README_END)
        check_markers(args.readme, GPU_README_START, GPU_README_END)
    args.chart = chart_or_none(args.chart)
    config = backbone_config(args.preset)
    if args.sequence_length > config["max_sequence_length"]:
        raise SystemExit(
            f"--sequence-length exceeds the preset's max_sequence_length ({config['max_sequence_length']})."
        )
    command = command_line("benchmarks.run", sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="bertzoo-peers-") as cache_dir:
        args.fast_path_cache_dir = cache_dir  # Used unless BERTZOO_CACHE_DIR is set (`worker_environment`).
        return measure_and_report(args, models, dtypes, modes, config, command)


def measure_and_report(args, models, dtypes, modes, config, command):
    """`main` after the arguments are checked: times every configuration,
    prints and records the results, rewrites the README table and draws the
    chart; returns the exit status."""
    if args.wait_for_load is not None:
        wait_for_load(args.wait_for_load, args.max_wait)
    start_load = os.getloadavg()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    features = cpu_features()
    print(
        f"{machine()} ({' '.join(features) or 'flags unknown'}); {date}; load average {start_load[0]:.2f}; preset {args.preset}, "
        f"batch {args.batch_size} x length {args.sequence_length}, median of {args.runs}",
        flush=True,
    )

    notes = []
    peak_rows, error = run_worker(args, library="matmul")
    peaks = peak_rows[0]["peaks"] if peak_rows else {}
    if error:
        notes.append(f"matmul peak: {error}")
    print(
        "TensorFlow 2048^3 matmul peak: " + ", ".join(f"{d} {p['gflops']} G(FL)OP/s" for d, p in peaks.items()),
        flush=True,
    )

    available = {}
    for name in models:
        reason = missing(name)
        if reason:
            notes.append(f"{LABELS[name]} skipped: {reason}")
        else:
            available[name] = True
    rows = []
    turn = 0
    for mode in modes:
        for dtype in dtypes:
            if mode == "training" and dtype in INT8_DTYPES:
                notes.append(
                    "int8 training skipped: the int8 paths here (Keras quantize, PyTorch dynamic quantization) are inference-only"
                )
                continue
            libraries = in_turn([name for name in available if runs_dtype(name, dtype)], turn)
            turn += 1
            for name in libraries:
                print(f"... {mode} {dtype} {LABELS[name]}", flush=True)
                found, error = run_worker(
                    args,
                    library=name,
                    mode=mode,
                    dtype=dtype,
                    preset=args.preset,
                    batch_size=args.batch_size,
                    sequence_length=args.sequence_length,
                    runs=args.runs,
                    warmup=args.warmup,
                )
                rows.extend(found)
                if found:  # Recorded as measured: a run cut short keeps what it timed.
                    for row in found:
                        row_figures(row, config, args, peaks)
                    setup = {**_setup(args, features, start_load), "peaks": peaks}
                    append_results(
                        "peers", [{**setup, "kind": "configuration", **r} for r in found], command, path=args.results
                    )
                for row in found:
                    print(
                        f"    {_setting(row)}: median {row['median_s'] * 1000:.0f} ms, "
                        f"{row['cpu_median_s']:.2f} CPU-s, load {row['load_after']}",
                        flush=True,
                    )
                if error:
                    notes.append(f"{LABELS[name]} {mode} {dtype}: {error}")
    # The peak again at the end, keeping the better one: on a shared machine
    # one measurement can land in a busy moment.
    again, _ = run_worker(args, library="matmul")
    for dtype, peak in (again[0]["peaks"] if again else {}).items():
        if peak["gflops"] > peaks.get(dtype, {}).get("gflops", 0):
            peaks[dtype] = peak
    notes = list(dict.fromkeys(notes))
    if not rows:
        raise SystemExit("Nothing was timed: " + "; ".join(notes))
    add_figures(rows, config, args, peaks)
    summary = summarize(rows)
    end_load = os.getloadavg()

    print()
    print_table(table_rows(rows), COLUMNS)
    print()
    for s in summary:
        print(
            f"{s['mode']} on {s['device']}: best bertzoo {s['bertzoo_seq_per_s']} seq/s ({s['bertzoo_best']}) vs best peer "
            f"{s['peer_seq_per_s']} seq/s ({s['peer_best']}): {s['ratio']}x"
        )
    for note in notes:
        print(f"note: {note}")
    print(f"load average: {start_load[0]:.2f} at start, {end_load[0]:.2f} at end")

    setup = {**_setup(args, features, start_load), "peaks": peaks, "load_end": round(end_load[0], 2)}
    # Each configuration's line was appended when it was timed; the summary
    # (with the final peaks, the ratios and the notes) closes the run.
    ratios = [
        {k: r[k] for k in ("library", "mode", "dtype", "device", "xla", "threads", "tf32", "vs_best_peer") if k in r}
        for r in rows
        if r["vs_best_peer"] is not None
    ]
    summary_line = {**setup, "kind": "summary", "summary": summary, "vs_best_peer": ratios, "notes": notes}
    append_results("peers", [summary_line], command, path=args.results)
    print(f"appended {len(rows) + 1} lines to {args.results}")
    if args.readme:
        command_text = f"`{command.strip()}`"
        header = (
            f"Measured {date} on {machine()} ({' '.join(features) or 'flags unknown'}), "
            f"{', '.join(f'{k} {v}' for k, v in _library_versions(rows).items())}; "
            f"load average {start_load[0]:.2f} at start, {end_load[0]:.2f} at end; BERT {args.preset}, "
            f"batch {args.batch_size} x length {args.sequence_length}, median of {args.runs} runs, best "
            f"setting per library in brackets (XLA on/off; torch.compile or eager on the torch backend; PyTorch threads, and torch.compile where timed). Command: {command_text}."
        )
        write_readme(
            args.readme,
            readme_section(rows, summary, header, notes),
            gpu=any(r.get("device", "CPU") != "CPU" for r in rows),
        )
        print(f"rewrote the results table in {args.readme}")
    if args.chart:
        title = (
            f"BERT {args.preset} ({args.batch_size}x{args.sequence_length}) on {machine()}, {date}, "
            f"load {start_load[0]:.1f}-{end_load[0]:.1f}; median of {args.runs}"
        )
        draw_chart(rows, Path(args.chart), title)
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
