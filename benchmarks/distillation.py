"""Distillation figures on real sentiment data (issue: distillation trainer).

    python -m benchmarks.distillation [--train-size 0] [--teacher-epochs 2] [--epochs 4]

Teacher: ../shared/models/all-MiniLM-L6-v2 converted and fine-tuned on
../shared/data/sentiment/amazon.tsv (fixed seeded 80/20 split: 2888 training,
722 test sentences; --train-size subsamples the training set with the same
seed). Student: one layer of the teacher's width, initialised from the
teacher's last layer (every 6th layer, DistilBERT-style), embeddings, pooler
and head; 0.18 of the teacher's non-embedding parameters. The same student, from the same initialisation, is
trained twice for the same epochs and learning rate: distilled (soft targets,
hidden states, attention, embeddings) and on the hard labels alone. Prints the
table and appends one row per model to benchmarks/results.jsonl. Latencies are
CPU medians of several runs of one forward pass on tokenized inputs (batch 1
and 32, sequence length 64), the models' runs interleaved in the same process,
so the speedups are same-run ratios (`benchmarks.harness.time_interleaved`).
The teacher comes from `examples/distill_to_small.py` (its data split and
teacher fine-tuning).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import sentiment_path
from benchmarks.harness import time_interleaved
from examples import distill_to_small as example


def latencies(models, features, runs):
    """Median seconds of one forward pass of each model on `features`, the
    models interleaved (the harness's loop, for `distill_to_small.measure`)."""
    calls = {i: (lambda model=model: model.predict_on_batch(features)) for i, model in enumerate(models)}
    timings = time_interleaved(calls, runs, warmup=2)  # The first call traces and compiles.
    return [timings[i]["median_s"] for i in range(len(models))]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="default: ../shared/data/sentiment/amazon.tsv")
    parser.add_argument("--train-size", type=int, default=0, help="0: the whole training split")
    parser.add_argument("--test-size", type=int, default=0, help="0: the whole test split")
    parser.add_argument("--teacher-epochs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="student epochs (both students)")
    parser.add_argument("--student-layers", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="student peak learning rate")
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--latency-runs", type=int, default=9)
    parser.add_argument("--output", default=None, help="default: a temporary directory")
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    args = parser.parse_args(argv)

    from bertzoo import Distiller
    from bertzoo import init_student_from_teacher
    from bertzoo.models.task import bert_optimizer

    data = sentiment_path("amazon", data=args.data)
    minilm_path(purpose="the teacher is the fine-tuned MiniLM")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(args.output or tmp)
        ex_args = example.settings(
            data=str(data),
            train_size=args.train_size,
            test_size=args.test_size,
            sequence_length=args.sequence_length,
            teacher_epochs=args.teacher_epochs,
        )
        example.check_settings(ex_args)  # The example's own refusals, before any training.
        keras.utils.set_random_seed(0)
        train, test, source = example.load_data(ex_args)
        print(f"Data: {source}")
        teacher, teacher_source, _ = example.build_teacher(ex_args, train, output)

        def fresh_student():
            return init_student_from_teacher(teacher, {"num_layers": args.student_layers})

        students = {}
        keras.utils.set_random_seed(1)
        distilled = fresh_student()
        distiller = Distiller(teacher, distilled, temperature=2.0, alpha=0.5)
        distiller.compile(optimizer=bert_optimizer(args.learning_rate))
        print(f"Distilling: layer pairs {distiller.layer_pairs}")
        t0 = time.perf_counter()
        distiller.fit(*train, epochs=args.epochs, batch_size=32)
        students["student, distilled"] = (distilled, time.perf_counter() - t0)

        keras.utils.set_random_seed(1)
        hard = fresh_student()
        hard.compile(optimizer=bert_optimizer(args.learning_rate))
        print("Training the same student on the hard labels alone")
        t0 = time.perf_counter()
        hard.fit(*train, epochs=args.epochs, batch_size=32)
        students["student, hard labels only"] = (hard, time.perf_counter() - t0)

        models = [("teacher: " + teacher_source, teacher)] + [(k, v[0]) for k, v in students.items()]
        sizes = []
        for i, (_, model) in enumerate(models):
            directory = output / f"preset_{i}"
            model.compile(jit_compile="auto")  # Also drops the training optimizer's state from the preset.
            model.save_to_preset(directory)
            sizes.append(example.directory_bytes(directory))
        measured = example.measure(
            [m for _, m in models], test, teacher.preprocessor, 32, args.latency_runs, timer=latencies
        )
        rows = []
        for (name, model), size, figures in zip(models, sizes, measured):
            total, non_embedding = example.count_parameters(model)
            rows.append(
                {
                    "model": name,
                    "layers": model.backbone.num_layers,
                    "hidden": model.backbone.hidden_dim,
                    "parameters": total,
                    "non_embedding_parameters": non_embedding,
                    "preset_mb": round(size / 1e6, 2),
                    "accuracy": round(figures["accuracy"], 4),
                    "agreement_with_teacher": round(
                        float(np.mean(figures["predictions"] == measured[0]["predictions"])), 4
                    ),
                    "latency_b1_ms": round(figures["latency_b1_ms"], 2),
                    "latency_b32_ms": round(figures["latency_b32_ms"], 2),
                    "train_seconds": round(students[name][1], 1) if name in students else None,
                }
            )
    t = rows[0]
    for row in rows:
        row["accuracy_pct_of_teacher"] = round(100 * row["accuracy"] / t["accuracy"], 1)
        row["non_embedding_fraction"] = round(row["non_embedding_parameters"] / t["non_embedding_parameters"], 3)
        row["speedup_b1"] = round(t["latency_b1_ms"] / row["latency_b1_ms"], 2)
        row["speedup_b32"] = round(t["latency_b32_ms"] / row["latency_b32_ms"], 2)
        row.update(
            {
                "data": source,
                "train_examples": len(train[0]),
                "test_examples": len(test[0]),
                "teacher_epochs": args.teacher_epochs,
                "student_epochs": args.epochs,
                "student_learning_rate": args.learning_rate,
                "sequence_length": args.sequence_length,
                "latency_runs": args.latency_runs,
                "cpu_cores": os.cpu_count(),
            }
        )
    columns = [
        "model",
        "layers",
        "hidden",
        "parameters",
        "non_embedding_fraction",
        "preset_mb",
        "accuracy",
        "accuracy_pct_of_teacher",
        "agreement_with_teacher",
        "latency_b1_ms",
        "latency_b32_ms",
        "speedup_b1",
        "speedup_b32",
    ]
    print(f"\nData: {source}")
    print_table(rows, columns)
    print(
        f"Total {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    record("distillation", rows, "benchmarks.distillation", argv, args.results)
    return rows


if __name__ == "__main__":
    main()
