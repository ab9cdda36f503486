"""`kill -9` during a real `save_to_preset` over an existing preset (in
subprocesses, at several points of the save): the preset always loads and
predicts like the saved model, and the next save leaves no hidden leftovers.

Kill points: after `config.json` is written (inside the hidden temporary
directory), between the two weights files, while computing the checksums,
just before the swap, just after it (the previous version is still in the
hidden directory), and from outside after a random delay during a loop of
saves. The children run in parallel (each pays TensorFlow's start-up once).
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np

import bertzoo
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary

TEXTS = ["a warm and sunny day", "cold rain all morning"]

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import keras
    import bertzoo
    from bertzoo.saving import atomic, preset
    from bertzoo.text import BertPreprocessor, BertTokenizer
    from bertzoo.text.vocabulary import builtin_vocabulary

    target, point = sys.argv[1], sys.argv[2]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone(vocabulary_size=1200, num_layers=1, hidden_dim=16, num_heads=2,
                                    intermediate_dim=32, max_sequence_length=32)
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(1200)), sequence_length=16)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor, dropout=0.0)
    model.save_to_preset(target, metadata={"version": 0})  # The preset that must survive.

    save_weights, exchange, checksum = preset.save_weights_only, atomic._exchange, preset.sha256_of
    calls = []

    def second_weights_file(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            die()
        return save_weights(*args, **kwargs)

    def after_exchange(*args):
        result = exchange(*args)
        die()
        return result

    if point == "after-config":
        preset.save_weights_only = die
    elif point == "between-weights":
        preset.save_weights_only = second_weights_file
    elif point == "checksums":
        preset.sha256_of = die
    elif point == "before-swap":
        atomic._exchange = die
    elif point == "after-swap":
        atomic._exchange = after_exchange
    print("ready", flush=True)
    for version in range(1, 1000):
        model.save_to_preset(target, metadata={"version": version})
    """
)
POINTS = ("after-config", "between-weights", "checksums", "before-swap", "after-swap", "timed", "timed")


def tiny_classifier():
    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=1200, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=32
    )
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(1200)), sequence_length=16)
    return bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor, dropout=0.0)


def hidden_siblings(target):
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def test_kill_during_save_to_preset_never_loses_the_preset_nor_leaks(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    children = []
    for i, point in enumerate(POINTS):
        target = tmp_path / f"run{i}" / "preset"
        target.parent.mkdir()
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(target), point],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        children.append((point, target, process))
    rng = random.Random(0)
    try:
        for point, _target, process in children:
            if point == "timed":
                assert process.stdout.readline().strip() == "ready"
                time.sleep(rng.uniform(0.2, 1.5))  # Somewhere in a loop of saves.
                process.send_signal(signal.SIGKILL)
            assert process.wait(timeout=300) == -signal.SIGKILL, point
    finally:
        for _, _, process in children:
            if process.poll() is None:
                process.kill()
                process.wait()

    model = tiny_classifier()
    expected = model.predict(TEXTS, verbose=0)
    counts = {"kills": 0, "leaks": 0, "leftovers_after_kill": 0}
    for point, target, _ in children:
        counts["kills"] += 1
        counts["leftovers_after_kill"] += len(hidden_siblings(target))
        loaded = bertzoo.BertClassifier.from_preset(target)  # Always a complete, verified version.
        np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), expected, err_msg=point)
        version = bertzoo.Preset.resolve(target).metadata["version"]
        if point in ("after-config", "between-weights", "checksums", "before-swap"):
            assert version == 0, point  # The new version never got in.
        elif point == "after-swap":
            assert version == 1, point  # Swapped in; the old one waits in the hidden directory.
        model.save_to_preset(target, metadata={"version": "next"})
        counts["leaks"] += len(hidden_siblings(target))
        assert bertzoo.Preset.resolve(target).metadata["version"] == "next"
    print(f"\nkill-during-save: {counts}")
    assert counts["leaks"] == 0
    assert counts["leftovers_after_kill"] >= 5  # The kills did interrupt saves.
