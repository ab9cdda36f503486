"""How long `from_preset` takes to load a saved preset, with the weights
about to be loaded left undrawn while the model is built (what bertzoo
does, `bertzoo.utils.private_api.deferred_initialization`) and drawn at
random first, then overwritten (what building a Keras model and calling
`load_weights` does).

    python -m benchmarks.preset_load [--preset base] [--task classifier] [--repeats 3]

A preset of the given shape with random weights is saved once to a
temporary directory. Each (setting, repeat) then runs in a fresh process,
alternating the settings: the first `from_preset` of the process (what a
serving process waits for at start-up), a second one, and the process's
peak resident memory. On the TensorFlow backend. Rows go to
`benchmarks/results.jsonl`.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from benchmarks.harness import alternating_workers
from benchmarks.harness import builtin_preset_file
from benchmarks.harness import machine
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import worker_result

SETTINGS = ("undrawn", "drawn_then_loaded")
TASKS = {"backbone": "BertBackbone", "classifier": "BertClassifier"}


def worker(directory, task, setting):
    """One process: two `from_preset` times and the peak memory; prints one JSON line."""
    import resource
    import time

    import bertzoo
    from bertzoo.models import backbone as backbone_module
    from bertzoo.models import task as task_module
    from bertzoo.utils import private_api

    if setting == "drawn_then_loaded":
        for module in (backbone_module, task_module):
            module.deferred_initialization = lambda enabled=True: private_api.deferred_initialization(False)
    model_class = getattr(bertzoo, TASKS[task])
    times = []
    for _ in range(2):
        start = time.perf_counter()
        model = model_class.from_preset(directory)
        times.append(time.perf_counter() - start)
    parameters = int(model.count_params())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux.
    print(json.dumps({"first_s": times[0], "second_s": times[1], "parameters": parameters, "peak_mb": peak_mb}))


def save_preset(preset, task, directory):
    import warnings

    import bertzoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # The built-in preset's "no pretrained weights" warning.
        if task == "backbone":
            model = bertzoo.BertBackbone.from_preset(preset, load_weights=False)
        else:
            model = bertzoo.BertClassifier.from_preset(preset, load_weights=False, num_classes=2)
    model.save_to_preset(directory)


def run_worker(setting, args, directory):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    arguments = ["--worker", setting, "--task", args.task, "--directory", directory]
    return worker_result("benchmarks.preset_load", arguments, env, setting)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", help="built-in preset giving the model shape")
    parser.add_argument("--task", default="classifier", choices=sorted(TASKS))
    parser.add_argument("--repeats", type=int, default=3, help="processes per setting")
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    parser.add_argument("--worker", default=None, choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--directory", default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.directory, args.task, args.worker)
    if args.repeats < 1:
        raise SystemExit("--repeats must be positive.")
    builtin_preset_file(args.preset)  # An unknown name: one line, not a traceback from the first worker.
    print(f"{machine()}; {args.preset} {args.task} preset, from_preset in fresh processes", flush=True)
    with tempfile.TemporaryDirectory() as parent:
        directory = os.path.join(parent, "preset")
        save_preset(args.preset, args.task, directory)
        results = alternating_workers(
            SETTINGS,
            args.repeats,
            lambda setting: run_worker(setting, args, directory),
            lambda setting, result: f"{setting}: first from_preset {result['first_s']:.2f} s",
        )
    first = {s: statistics.median(r["first_s"] for r in results[s]) for s in SETTINGS}
    rows = [
        {
            "setting": setting.replace("_", " "),
            "preset": args.preset,
            "task": args.task,
            "parameters": results[setting][0]["parameters"],
            "first_load_s": round(first[setting], 2),
            "process_first_load_s": [round(r["first_s"], 2) for r in results[setting]],
            "second_load_s": round(statistics.median(r["second_s"] for r in results[setting]), 2),
            "peak_mb": round(statistics.median(r["peak_mb"] for r in results[setting])),
            "speedup_vs_drawn_then_loaded": round(first["drawn_then_loaded"] / first[setting], 2),
        }
        for setting in SETTINGS
    ]
    columns = ["setting", "first_load_s", "process_first_load_s", "second_load_s", "peak_mb"]
    print_table(rows, [*columns, "speedup_vs_drawn_then_loaded"])
    record("preset_load", rows, "benchmarks.preset_load", argv, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
