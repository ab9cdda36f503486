"""What every benchmark shares: the timing loop, input batches, data paths,
the results log and the printed table.

- `time_interleaved(candidates, runs, warmup)`: the one timing loop. Each
  candidate (a no-argument callable) is warmed up (the first call traces and
  compiles, and is reported apart), then timed for `runs` rounds; a round
  calls every candidate once, starting one candidate later each round, so
  load changes on a shared machine hit all candidates alike and none always
  runs first. Returns per candidate the wall-clock and process CPU seconds
  of each call and their medians.
- `token_batch(batch, length, vocabulary_size)`: a full-length batch of
  random token ids (two segments, no padding).
- `shared_path(...)`, `minilm_path()`, `sentiment_path()`: the `../shared`
  material (real sentiment data, all-MiniLM-L6-v2 weights), found through
  `BERTZOO_SHARED` or next to the checkout; absent material is either None
  or a `SystemExit` naming what is missing and how to point at it.
- `append_results(benchmark, rows, command)`: one JSON line per row in
  `benchmarks/results.jsonl` (append-only), stamped with the date, the
  machine (CPU model and flags, usable cores, the thread and kernel
  environment variables that are set, GPUs), library versions, the
  checkout's commit, load average, the command and a run id; `unrecorded(benchmark, rows)`: the rows not
  recorded there yet with the same figures.
- `run_module(module, arguments)` / `worker_result(...)`: a benchmark's
  worker in a fresh process, and the JSON line it printed.
- `print_table(rows, columns)` / `markdown_table`: a Markdown table.
- `write_between_markers(path, section, start, end)`: rewrites a README
  section between two marker lines (`benchmarks.run`, `benchmarks.compression`).

The examples (`examples/`) are imported as ordinary modules
(`from examples import distill_to_small`): the repository root is on
`sys.path` whenever `benchmarks` itself is importable.

Nothing here imports TensorFlow or bertzoo at import time, so the PyTorch
worker of `benchmarks.peers` can use it too.
"""

import ast
import datetime
import fcntl
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_FILE = ROOT / "benchmarks" / "results.jsonl"
OUT = ROOT / "benchmarks" / "out"
SHARED_ENV = "BERTZOO_SHARED"
MINILM = Path("models") / "all-MiniLM-L6-v2"
VERSIONED = ("bertzoo", "keras", "tensorflow", "keras-hub", "numpy", "torch", "transformers")


# --- Worker processes -----------------------------------------------------------


def run_module(module, arguments, env=None, timeout=None):
    """Runs `python -m module arguments...` from the repository root in a
    fresh process (a benchmark's worker: its own TensorFlow state and
    environment); returns the `subprocess.CompletedProcess` (text output
    captured; `env` replaces the environment when given).

    Example:
    ```python
    done = run_module("benchmarks.peers", ["--library", "bertzoo"], timeout=600)
    ```
    """
    command = [sys.executable, "-m", module, *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False)


def worker_result(module, arguments, env, name):
    """Runs a benchmark's worker (`run_module`) and returns the JSON object
    of the last stdout line that starts with "{"; a worker that fails or
    prints none ends the benchmark with its `name` and the end of its stderr.

    Example:
    ```python
    result = worker_result("benchmarks.first_fit", ["--worker", "inside_the_step"], env, "inside_the_step")
    ```
    """
    done = run_module(module, arguments, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"worker {name} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def alternating_workers(settings, repeats, run, describe):
    """`{setting: [result, ...]}`: `run(setting)` (a worker process each)
    `repeats` times per setting, the order of the settings reversed every
    other repeat so that a drift of the machine lands on all of them;
    prints `describe(setting, result)` after each.

    Example:
    ```python
    results = alternating_workers(SETTINGS, 2, lambda s: run_worker(s, args), lambda s, r: f"{s}: {r['first_s']:.2f} s")
    ```
    """
    results = {setting: [] for setting in settings}
    for repeat in range(repeats):
        for setting in settings if repeat % 2 == 0 else settings[::-1]:
            result = run(setting)
            print(f"  {describe(setting, result)}", flush=True)
            results[setting].append(result)
    return results


# --- Timing -------------------------------------------------------------------


def time_interleaved(candidates, runs=5, warmup=2, on_warm=None):
    """Times no-argument callables against each other.

    Args:
        candidates: `{name: callable}`; each call should finish its work
            (e.g. return NumPy values), or the time measures a dispatch only.
        runs: timed rounds; every round calls each candidate once, the first
            candidate of round `r` being candidate `r % len(candidates)`.
        warmup: untimed calls of each candidate first (one candidate after
            the other); the first one's time is reported as `first_call_s`
            (tracing and compilation).
        on_warm: optional `on_warm(name, seconds)` called after a
            candidate's warm-up calls (e.g. to print compile times).

    Returns:
        `{name: {"times_s": [...], "cpu_times_s": [...], "median_s",
        "min_s", "cpu_median_s", "first_call_s"}}` in the candidates' order;
        `first_call_s` is None without warm-up. Process CPU seconds are less
        sensitive to other processes than wall time (but count threads
        spinning while they wait).
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}.")
    names = list(candidates)
    first = {}
    for name in names:
        start = time.perf_counter()
        for i in range(warmup):
            candidates[name]()
            if i == 0:
                first[name] = time.perf_counter() - start
        if on_warm is not None:
            on_warm(name, time.perf_counter() - start)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(runs):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            start, start_cpu = time.perf_counter(), time.process_time()
            candidates[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {
        name: {
            "times_s": wall[name],
            "cpu_times_s": cpu[name],
            "median_s": statistics.median(wall[name]),
            "min_s": min(wall[name]),
            "cpu_median_s": statistics.median(cpu[name]),
            "first_call_s": first.get(name),
        }
        for name in names
    }


def library_measure_rows(timings, runs, **fields):
    """Rows for `time_interleaved` results named "library measure": each
    row's library and measure, then `fields`, the median and fastest call in
    ms and the number of timed runs.

    Example:
    ```python
    rows = library_measure_rows({"bertzoo forward": {"median_s": 0.01, "min_s": 0.009}}, runs=5, batch=8)
    # [{"library": "bertzoo", "measure": "forward", "batch": 8, "median_ms": 10.0, "min_ms": 9.0, "runs": 5}]
    ```
    """
    rows = []
    for name, timing in timings.items():
        library, measure = name.split(" ")
        rows.append(
            {
                "library": library,
                "measure": measure,
                **fields,
                "median_ms": round(1000 * timing["median_s"], 2),
                "min_ms": round(1000 * timing["min_s"], 2),
                "runs": runs,
            }
        )
    return rows


def median_ms(timings):
    """`{name: median milliseconds}` of `time_interleaved`'s result."""
    return {name: 1000.0 * t["median_s"] for name, t in timings.items()}


def wait_for_load(threshold, max_wait):
    """Sleeps until the 1-minute load average is below `threshold` (at most
    `max_wait` seconds); returns the load average then."""
    deadline = time.monotonic() + max_wait
    load = os.getloadavg()[0]
    while load >= threshold and time.monotonic() < deadline:
        print(f"load average {load:.2f} >= {threshold}: waiting...", flush=True)
        time.sleep(30)
        load = os.getloadavg()[0]
    return load


# --- Inputs -------------------------------------------------------------------


def token_batch(batch, length, vocabulary_size, seed=0):
    """A full-length batch as NumPy int32 arrays: random ids (never 0, the
    padding id), the first half of each row segment 0 and the rest segment 1,
    no padding."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, vocabulary_size, (batch, length)).astype("int32"),
        "segment_ids": (np.arange(length)[None, :] >= length // 2).repeat(batch, 0).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }


# --- Data paths ---------------------------------------------------------------


def shared_dirs():
    """Where `../shared` may be: `$BERTZOO_SHARED` alone when it is set (a
    `SystemExit` when it is not a folder), else next to the current
    directory, then next to this checkout: the rule of
    `bertzoo.datasets.shared_folders` (not imported: the harness reads
    without importing bertzoo), with this checkout's `ROOT`."""
    root = os.environ.get(SHARED_ENV)
    if root:
        if not Path(root).expanduser().is_dir():
            raise SystemExit(f"${SHARED_ENV}={root} is not a folder: point it at the shared folder, or unset it.")
        return [Path(root).expanduser()]
    return [Path.cwd().parent / "shared", ROOT.parent / "shared"]


def shared_path(relative, required=True, purpose=None):
    """The first existing `<shared>/relative`, else None or (`required`) a
    `SystemExit` naming what is missing and how to provide it."""
    for base in shared_dirs():
        path = base / relative
        if path.exists():
            return path
    if not required:
        return None
    tried = ", ".join(str(base) for base in dict.fromkeys(shared_dirs()))
    raise SystemExit(
        f"{relative} not found in the shared folder (tried {tried}){': ' + purpose if purpose else ''}. "
        f"Put ../shared next to the checkout or set {SHARED_ENV}=/path/to/shared."
    )


def minilm_path(required=True, purpose=None):
    """The all-MiniLM-L6-v2 checkpoint (Hugging Face layout) in `../shared`."""
    return shared_path(MINILM, required, purpose)


SENTIMENT_FILES = ("amazon", "tweets", "nyt")  # ../shared/data/sentiment/NAME.tsv


def sentiment_path(name="amazon", data=None, required=True):
    """`data` when given (it must exist), else `../shared/data/sentiment/NAME.tsv`."""
    if data:
        if not Path(data).is_file():
            raise SystemExit(f"No data file at {data}.")
        return Path(data)
    return shared_path(Path("data") / "sentiment" / f"{name}.tsv", required, "the sentiment data")


# --- Results ------------------------------------------------------------------


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Where the fast-path measurement (`bertzoo.utils.fast_path`) lists what
# decides the kernels: the rows describe the machine by the same lists.
FAST_PATH_SOURCE = ROOT / "bertzoo" / "utils" / "fast_path.py"


@functools.cache
def fast_path_constant(name):
    """A constant of `bertzoo.utils.fast_path` (`CPU_FLAGS`,
    `KERNEL_ENVIRONMENT`, `CACHE_DIR_ENV`), read from its source.

    Read, not imported: importing it imports Keras and TensorFlow (seconds,
    the Keras backend fixed for this process, and an ImportError on the
    machines with JAX and PyTorch only), where a benchmark's parent process
    needs neither.
    """
    tree = ast.parse(FAST_PATH_SOURCE.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{FAST_PATH_SOURCE} defines no {name}.")


def cpu_features():
    """The CPU flags that decide the fast paths (bfloat16, int8, AMX): those
    of `bertzoo.utils.fast_path.CPU_FLAGS` this CPU has."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [flag for flag in fast_path_constant("CPU_FLAGS") if flag in flags]


def usable_cores():
    """The cores this process may run on (its CPU affinity: a container or
    `taskset` can allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # No affinity on this platform (macOS).
        return os.cpu_count()


def kernel_environment():
    """The variables of `bertzoo.utils.fast_path.KERNEL_ENVIRONMENT` that are
    set (thread counts, oneDNN options, XLA flags): `{name: value}`."""
    return {name: os.environ[name] for name in fast_path_constant("KERNEL_ENVIRONMENT") if name in os.environ}


def nvidia_gpus():
    """GPU names from `nvidia-smi -L` (no framework import), or []."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    # "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" -> "NVIDIA H100 80GB HBM3"
    return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in listing.splitlines() if line.startswith("GPU ")]


def machine():
    """A short description of this machine for tables and result rows."""
    cores, total = usable_cores(), os.cpu_count()
    described = f"{cpu_model()}, {cores} cores" + (f" (of {total})" if total and cores != total else "")
    gpus = nvidia_gpus()
    return f"{described}; {', '.join(gpus)}" if gpus else described


def machine_label(row):
    """A result row's machine for a report: its description with the CPU
    flags that decide the fast paths, where the row recorded them (two CPUs
    of one name can differ in AMX)."""
    info = row.get("machine_info")
    flags = info.get("cpu_flags") if isinstance(info, dict) else None
    name = row.get("machine", "?")
    return f"{name} ({', '.join(flags)})" if flags else name


def library_versions(names=VERSIONED):
    """`{distribution: version}` of the installed ones among `names` (read
    from the package metadata: nothing is imported)."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    if "bertzoo" in names and "bertzoo" not in found:  # A checkout on PYTHONPATH, not installed.
        text = (ROOT / "bertzoo" / "version.py").read_text()
        found["bertzoo"] = text.split("__version__", 1)[1].split("=", 1)[1].split("\n")[0].strip().strip("\"'")
    return found


# Which code produced the checkout's figures: the tracked paths whose changes can move them (git
# pathspecs; the results log and the logs are what runs write, not code).
CODE_PATHS = (
    "bertzoo",
    "benchmarks",
    "examples",
    "presets",
    "pyproject.toml",
    ":(exclude)benchmarks/results.jsonl",
    ":(exclude)benchmarks/logs",
    ":(exclude)benchmarks/out",
)


@functools.cache
def code_version():
    """The checkout's commit (`{"commit": 40 hex digits, "modified": bool}`,
    `modified` when the tracked files under `CODE_PATHS` differ from it), or
    None outside a git checkout: a row then says which code made it, which
    the version number (the same for every commit) does not."""
    git = shutil.which("git")
    if git is None:
        return None

    def output(*arguments):
        try:
            done = subprocess.run([git, "-C", str(ROOT), *arguments], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):  # A bookkeeping field: never worth a run's results.
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = output("rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    changes = output("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    return {"commit": commit, "modified": bool(changes)}


@functools.cache
def run_id():
    """One id per benchmark process (UTC start time and process id): the rows
    a run appends, over one or several calls of `append_results`, share it.
    First called when this module is imported, as the benchmark starts."""
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{started}-{os.getpid()}"


# Read when a benchmark starts (it imports this module), not when it writes its rows an hour later: a
# commit made or a file edited meanwhile is not the code that ran.
run_id()
code_version()


def machine_info():
    """The machine and software a result was measured with: `cores` is what
    this process may use (`usable_cores`), `cpu_count` what the machine has,
    `environment` the kernel-choosing variables that are set
    (`kernel_environment`), `code` the checkout's commit (`code_version`)."""
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_features(),
        "cores": usable_cores(),
        "cpu_count": os.cpu_count(),
        "environment": kernel_environment(),
        "gpus": nvidia_gpus(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "code": code_version(),
    }


def command_line(module, argv):
    """The command that reproduces a run, e.g. `python -m benchmarks.run --runs 3`.

    Paths inside the checkout are written relative to it (`benchmarks/out/x.png`,
    not `/home/me/bertzoo/benchmarks/out/x.png`): the command runs from the
    repository root on any machine.
    """
    # Shell-quoted: an empty value (`--chart ""`) or a path with spaces runs as recorded.
    return " ".join(["python -m " + module, *(shlex.quote(_relative_to_root(str(a))) for a in argv)]).strip()


def _relative_to_root(argument):
    prefix, sep, value = argument.rpartition("=") if argument.startswith("--") else ("", "", argument)
    path = Path(value)
    if path.is_absolute():
        try:
            value = str(path.resolve().relative_to(ROOT))
        except ValueError:
            pass  # Outside the checkout (a cache in /tmp): kept as given.
    return prefix + sep + value


# What `append_results` stamps on every line: not part of a result.
STAMP_KEYS = ("date", "benchmark", "machine", "machine_info", "load_average_1m", "command", "run_id")


def append_results(benchmark, rows, command, path=RESULTS_FILE):
    """Appends one JSON line per row to `path`, each stamped with the date,
    benchmark, machine (a string, as in older rows), machine details
    (`machine_info`, the commit among them), load average, command and the
    process's `run_id`. The file is append-only:
    older rows keep their own shape."""
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    values = (date, benchmark, machine(), machine_info(), round(os.getloadavg()[0], 2), command, run_id())
    stamp = dict(zip(STAMP_KEYS, values))
    payload = "".join(json.dumps({**stamp, **row}) + "\n" for row in rows).encode()
    if not payload:
        return
    # One write() on an O_APPEND descriptor, under a lock: lines of two
    # benchmarks appending at once never interleave, and a line cut short
    # by a kill is ended before the next payload, so it spoils only itself.
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        while payload:
            payload = payload[os.write(fd, payload) :]
    finally:
        os.close(fd)


def record(benchmark, rows, module, argv, path=None):
    """`append_results` for a benchmark module's run (`python -m module
    *argv`), to `path` (default `RESULTS_FILE`), and says so."""
    path = path or RESULTS_FILE
    append_results(benchmark, rows, command_line(module, argv), path=path)
    print("appended", len(rows), "lines to", path)


def unrecorded(benchmark, rows, path=RESULTS_FILE):
    """The `rows` that `path` does not hold yet for `benchmark`: a line with
    the same figures (everything but the stamp: date, machine, load,
    command) is the same result, recorded before."""

    def figures(row):
        return json.dumps({k: v for k, v in row.items() if k not in STAMP_KEYS}, sort_keys=True)

    seen = {figures(row) for row in read_results(path, benchmark)} if Path(path).exists() else set()
    # A JSON round trip first, so tuples and lists compare alike.
    return [row for row in rows if figures(json.loads(json.dumps(row))) not in seen]


def read_results(path=RESULTS_FILE, benchmark=None):
    """The rows of a results file (optionally of one benchmark), oldest first."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            # A line cut short by a killed run: skipped, not fatal, so a
            # damaged file never stops the next run after hours of training.
            print(f"warning: {path}:{number} is not a complete JSON line (skipped)", file=sys.stderr)
    return [r for r in rows if benchmark is None or r.get("benchmark") == benchmark]


# --- Tables -------------------------------------------------------------------


def markdown_table(rows, columns):
    """`rows` (dicts) as the lines of a Markdown table of `columns`."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |")
    return lines


def print_table(rows, columns):
    """Prints `rows` (dicts) as a Markdown table of `columns`."""
    print("\n".join(markdown_table(rows, columns)))


# --- README sections ----------------------------------------------------------


def require(packages, purpose):
    """Raises `SystemExit` naming the `pip install` when one of `packages`
    (import names) is not installed: before a benchmark builds anything."""
    absent = [name for name in packages if importlib.util.find_spec(name) is None]
    if absent:
        pip_names = {"jax": "jax jaxlib"}
        install = " ".join(pip_names.get(name, name) for name in absent)
        raise SystemExit(f"{purpose} needs {', '.join(absent)}, which is not installed: pip install {install}.")


def check_markers(path, start, end):
    """Raises `SystemExit` unless `path` is a file holding exactly one
    `start` and one `end` marker line: checked before a benchmark measures,
    not when it writes its table an hour later."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: --readme takes the README whose table to rewrite.")
    text = path.read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"{path} needs exactly one {start} and one {end} line around the table.")


def builtin_preset_file(name):
    """The JSON file of the built-in preset `name`; SystemExit listing the
    names otherwise. Read without `bertzoo`, which would import TensorFlow
    (the PyTorch and JAX workers must not)."""
    folder = ROOT / "presets"
    names = sorted(p.stem for p in folder.glob("*.json"))
    if name not in names:
        raise SystemExit(f"Unknown preset {name!r}: choose one of {names}.")
    return folder / f"{name}.json"


def comma_choices(value, allowed, flag):
    """The items of a comma list `value` (a command-line flag), each one of
    `allowed` and each once; SystemExit naming the problem otherwise (an
    item twice would be measured, or counted, twice)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise SystemExit(f"{flag}: unknown {unknown or value!r}; choose from {', '.join(allowed)}.")
    twice = sorted({v for v in items if items.count(v) > 1})
    if twice:
        raise SystemExit(f"{flag}: {', '.join(twice)} given twice; name each once.")
    return items


def check_results_file(path, reading=False):
    """SystemExit, before anything is measured, unless the results file
    `path` can be appended to (its folder exists) or, `reading`, exists."""
    path = Path(path)
    if reading and not path.is_file():
        raise SystemExit(f"--results {path} does not exist: nothing to read (the default is {RESULTS_FILE}).")
    if not path.parent.is_dir():
        raise SystemExit(f"--results {path}: the folder {path.parent} does not exist; create it first.")


def chart_or_none(path):
    """`path` to draw a chart to, or None (said) where matplotlib is not
    installed, so the benchmark still measures, records and rewrites its
    table; None for an empty `path` too."""
    if not path:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        print(f"matplotlib is not installed: no chart {path} (pip install matplotlib, or -e '.[bench]').", flush=True)
        return None
    return path


def write_between_markers(path, section, start, end):
    """Replaces the text between the `start` and `end` marker lines of `path`
    with `section` (written to a temporary file, then renamed over `path`);
    a file without exactly one of each marker is a `SystemExit`, unchanged."""
    check_markers(path, start, end)
    path = Path(path)
    text = path.read_text()
    before, rest = text.split(start)
    _, after = rest.split(end)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{before}{start}\n{section}\n{end}{after}")
    os.replace(tmp, path)
