"""How long a new raw-text `tf.data` pipeline takes to build and to yield
its first batch, and each later epoch's first batch, in three settings:

- `tokenized_eagerly`: all the texts tokenized in one eager call, then
  batched (what bertzoo does for in-memory inputs of up to
  `EAGER_PREPROCESS_LIMIT` examples);
- `traced_once`: a `tf.data` map whose preprocessing is traced once per
  task and input signature (what bertzoo does for larger inputs and for
  datasets: `Task._graph_preprocess`, around
  `BertPreprocessor._graph_features`);
- `traced_per_pipeline`: the map traced again in every pipeline (what a
  plain `dataset.map(model.preprocess)` does).

    python -m benchmarks.text_pipeline [--task classifier] [--preset tiny] [--repeats 2] [--runs 5] [--texts 64]
                                       [--batch-size 32]

`--task question_answerer` times a question answerer's pipelines instead
(questions about the generated sentences, answer spans to token
positions: a longer preprocessing than a classifier's).

Every `fit` or `evaluate` on raw text, and each phase of a resumed
`ResumableTraining` run, builds such a pipeline (`Task._as_dataset`), and
Keras starts a new iterator on it every epoch. Each (setting, repeat) runs
in a fresh process, alternating the settings (the first pipeline of a
process pays one-time costs that a process run second would not): the
preset's classifier (random weights) builds a pipeline for the same texts,
shuffled, then `--runs` more, and starts `--runs` new iterators on the
last one. Medians; rows go to `benchmarks/results.jsonl`.
"""

import argparse
import hashlib
import json
import os
import statistics
import sys

from benchmarks.harness import alternating_workers
from benchmarks.harness import machine
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import worker_result

SETTINGS = ("tokenized_eagerly", "traced_once", "traced_per_pipeline")
TASKS = ("classifier", "question_answerer")


def worker(setting, preset, runs, texts, batch_size, task_name="classifier"):
    """One process: the first and later pipelines' times; prints one JSON line."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import bertzoo
    from bertzoo.datasets import synthetic_sentiment
    from bertzoo.models import task

    sentences, labels = synthetic_sentiment(texts, seed=0)
    keras.utils.set_random_seed(0)
    if task_name == "question_answerer":
        model = bertzoo.BertQuestionAnswerer.from_preset(preset, load_weights=False)
        # "Which word comes first?", answered by each sentence's first word (character offsets).
        sentences = (["which word comes first?"] * len(sentences), list(sentences))
        labels = np.array([[0, len(text.split()[0])] for text in sentences[1]], "int32")
    else:
        model = bertzoo.BertClassifier.from_preset(preset, num_classes=2, load_weights=False)
    preprocessor = model.preprocessor
    features = preprocessor._features
    traces = []

    def counted(segments):
        if not tf.executing_eagerly():  # Traced (in a map), not called on the texts themselves.
            traces.append(1)
        return features(segments)

    # Instance attributes: this process's preprocessor alone.
    preprocessor._features = counted
    if setting != "tokenized_eagerly":
        task.EAGER_PREPROCESS_LIMIT = 0  # Every input streams through a tf.data map.
    if setting == "traced_per_pipeline":
        preprocessor._graph_features = lambda: lambda *segments: preprocessor._features(segments)
        model._graph_preprocess = lambda trim: lambda *d: task._int_features(model.preprocess(*d), trim)

    def pipeline(shuffle=True):
        start = time.perf_counter()
        batch = next(iter(model._as_dataset(sentences, labels, batch_size=batch_size, shuffle=shuffle)))
        return time.perf_counter() - start, batch

    first_s, _ = pipeline()
    later_s = [pipeline()[0] for _ in range(runs)]
    _, (x, _) = pipeline(shuffle=False)
    digest = hashlib.sha256(b"".join(np.asarray(x[k], "int32").tobytes() for k in sorted(x))).hexdigest()
    dataset = model._as_dataset(sentences, labels, batch_size=batch_size, shuffle=True)
    epoch_s = []
    for _ in range(runs):  # What each epoch of a `fit` pays before its first step.
        start = time.perf_counter()
        next(iter(dataset))
        epoch_s.append(time.perf_counter() - start)
    result = {"first_s": first_s, "later_s": later_s, "epoch_s": epoch_s, "traces": len(traces)}
    print(json.dumps({**result, "features_sha256": digest}))


def run_worker(setting, args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    arguments = ["--worker", setting, "--task", args.task, "--preset", args.preset, "--runs", args.runs]
    arguments += ["--texts", args.texts]
    return worker_result("benchmarks.text_pipeline", [*arguments, "--batch-size", args.batch_size], env, setting)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="classifier", choices=TASKS, help="task whose pipelines are timed")
    parser.add_argument("--preset", default="tiny", help="bertzoo preset whose preprocessor is used (default tiny)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per setting")
    parser.add_argument("--runs", type=int, default=5, help="pipelines after the first, per process")
    parser.add_argument("--texts", type=int, default=64, help="generated sentences in the pipeline")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    parser.add_argument("--worker", default=None, choices=SETTINGS, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.preset, args.runs, args.texts, args.batch_size, args.task)
    if min(args.repeats, args.runs, args.texts, args.batch_size) < 1:
        raise SystemExit("--repeats, --runs, --texts and --batch-size must be positive.")
    print(f"{machine()}; {args.preset} {args.task}, {args.texts} texts in batches of {args.batch_size}", flush=True)
    results = alternating_workers(
        SETTINGS,
        args.repeats,
        lambda setting: run_worker(setting, args),
        lambda setting, result: f"{setting}: first pipeline {result['first_s']:.2f} s",
    )
    digests = {r["features_sha256"] for setting in SETTINGS for r in results[setting]}
    rows = []
    for setting in SETTINGS:
        done = results[setting]
        rows.append(
            {
                "setting": setting,
                "task": args.task,
                "preset": args.preset,
                "texts": args.texts,
                "batch_size": args.batch_size,
                "processes": len(done),
                "first_pipeline_s": round(statistics.median(r["first_s"] for r in done), 3),
                "process_first_pipeline_s": [round(r["first_s"], 3) for r in done],
                "later_pipeline_s": round(statistics.median(t for r in done for t in r["later_s"]), 3),
                "next_epoch_s": round(statistics.median(t for r in done for t in r["epoch_s"]), 3),
                "pipelines_per_process": args.runs + 3,  # The first, the later ones, the unshuffled one, the epochs'.
                "tokenization_traces_per_process": sorted({r["traces"] for r in done}),
                "same_features_in_all_settings": len(digests) == 1,
            }
        )
    peer = rows[SETTINGS.index("traced_per_pipeline")]
    for row in rows:
        for measure in ("first_pipeline", "later_pipeline", "next_epoch"):
            row[f"{measure}_vs_traced_per_pipeline"] = round(peer[f"{measure}_s"] / row[f"{measure}_s"], 2)
    columns = ["setting", "first_pipeline_s", "process_first_pipeline_s", "later_pipeline_s", "next_epoch_s"]
    ratios = ["later_pipeline_vs_traced_per_pipeline", "next_epoch_vs_traced_per_pipeline"]
    print_table(rows, columns + ["tokenization_traces_per_process"] + ratios)
    record("text_pipeline", rows, "benchmarks.text_pipeline", argv, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
