"""Serving under load: an exported classifier SavedModel, loaded with
`tf.saved_model.load`, answers `serving_default` from 8 threads for a few
seconds with a mix of valid, empty, huge (100k characters) and non-UTF-8
inputs: every call answers, each output equals the single-threaded call on
the same input, and the process's memory (VmRSS) does not grow after warm-up.
In-process, no network."""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary

THREADS = 8
WARM_UP_SECONDS = 1.5
LOAD_SECONDS = 4.0
MAX_RSS_GROWTH_MB = 64

INPUTS = [
    [b"a warm and sunny day"],
    [b"cold rain all morning", b"the film was fine", b"dull and far too long"],
    [b""],
    [b"", b" ", b"\t\n"],
    [("very " * 20000).encode()],  # 100k characters.
    [b"\xff\xfe caf\xc3 great", b"\x80"],  # Not UTF-8.
    [b"fine \xe2\x82", b"ok", ("x" * 100_000).encode()],
    [b"[CLS] [SEP] [PAD] [MASK]"],
]


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=1200, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=64
    )
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(1200)), sequence_length=48)
    model = bertzoo.BertClassifier(
        backbone, 2, preprocessor=preprocessor, dropout=0.0, class_names=["negative", "positive"]
    )
    path = tmp_path_factory.mktemp("serving") / "classifier" / "1"
    model.export(path)
    return tf.saved_model.load(str(path)).signatures["serving_default"]


def call(signature, texts):
    return {k: v.numpy() for k, v in signature(text=tf.constant(texts, tf.string)).items()}


def assert_same(result, reference, where):
    assert sorted(result) == sorted(reference), where
    for key, value in reference.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(result[key], value, rtol=0, atol=1e-6, err_msg=f"{where}: {key}")
        else:
            np.testing.assert_array_equal(result[key], value, err_msg=f"{where}: {key}")


def test_eight_threads_of_mixed_inputs_answer_like_one_thread_without_growing(serving):
    reference = [call(serving, texts) for texts in INPUTS]  # Single-threaded, one call per input.
    for texts, outputs in zip(INPUTS, reference):
        assert outputs["logits"].shape == (len(texts), 2)
    errors, calls, mismatches = [], [0] * THREADS, []
    phase = {"stop_at": time.monotonic() + WARM_UP_SECONDS}

    def worker(index):
        i = index
        while time.monotonic() < phase["stop_at"]:
            k = i % len(INPUTS)
            try:
                result = call(serving, INPUTS[k])
            except Exception as e:  # noqa: BLE001 - every call must answer
                errors.append(f"input {k}: {type(e).__name__}: {e}")
                continue
            try:
                assert_same(result, reference[k], f"input {k}")
            except AssertionError as e:
                mismatches.append(str(e))
            calls[index] += 1
            i += 1

    def run(seconds):
        phase["stop_at"] = time.monotonic() + seconds
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=seconds + 120)
        assert not any(thread.is_alive() for thread in threads), "a serving call hung"

    run(WARM_UP_SECONDS)
    warm_rss = rss_mb()
    warm_calls = sum(calls)
    run(LOAD_SECONDS)
    growth = rss_mb() - warm_rss
    total = sum(calls)
    print(
        f"\nserving load: {total} calls from {THREADS} threads ({total - warm_calls} after warm-up), "
        f"{len(errors)} errors, {len(mismatches)} mismatches, RSS growth after warm-up {growth:.1f} MB"
    )
    assert not errors, errors[:3]
    assert not mismatches, mismatches[:3]
    assert total - warm_calls >= THREADS * len(INPUTS) // 2  # The load did run.
    assert all(n > 0 for n in calls)
    assert growth < MAX_RSS_GROWTH_MB, f"RSS grew {growth:.1f} MB under load after warm-up"
