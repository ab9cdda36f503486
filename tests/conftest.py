"""Shared test fixtures. Keep this small: module-specific helpers belong in
the test module that uses them."""

import os
from pathlib import Path

import numpy as np
import pytest

# `jit_compile="auto"` measures each model (seconds, timing-dependent): the
# suite uses the rule instead, also in its subprocesses. tests/test_fast_path.py
# unsets this to test the measurement.
os.environ["BERTZOO_JIT_COMPILE"] = "rule"
# Subprocesses import this checkout's bertzoo, not whichever one pip installed
# (an editable install can point at another clone, or be missing).
REPO = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))


@pytest.fixture
def rng():
    """A seeded NumPy generator, so every test sees the same random data."""
    return np.random.default_rng(1234)


@pytest.fixture
def make_bert_inputs(rng):
    """Factory for backbone input dicts with optional right padding.

    `lengths[i]` real tokens in row `i`; the rest is padding (mask 0) filled
    with random ids, so tests notice if padding leaks into real positions.
    """

    def make(batch=2, length=6, vocabulary_size=50, num_segments=2, lengths=None):
        lengths = [length] * batch if lengths is None else list(lengths)
        token_ids = rng.integers(0, vocabulary_size, (batch, length)).astype("int32")
        segment_ids = rng.integers(0, num_segments, (batch, length)).astype("int32")
        positions = np.arange(length)[None, :]
        padding_mask = (positions < np.asarray(lengths)[:, None]).astype("int32")
        return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}

    return make


@pytest.fixture(scope="session")
def word_classifier():
    """Factory for a small `BertClassifier` whose vocabulary is the special
    tokens plus `words` (a built-in preset's 30522-token vocabulary would
    make every training step slower). Backbone keyword arguments override
    the defaults: 2 layers, 32 wide, 2 heads, FFN 64, positions up to
    `sequence_length`; `dropout` is the backbone's and the head's."""

    def build(words, sequence_length=16, num_classes=2, dropout=0.1, **backbone_kwargs):
        import bertzoo
        from bertzoo.text import BertPreprocessor
        from bertzoo.text import BertTokenizer

        vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(words)
        config = dict(num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64)
        config.update(max_sequence_length=sequence_length, dropout=dropout)
        config.update(backbone_kwargs)
        backbone = bertzoo.BertBackbone(vocabulary_size=len(vocabulary), **config)
        preprocessor = BertPreprocessor(BertTokenizer(vocabulary), sequence_length=sequence_length)
        return bertzoo.BertClassifier(backbone, num_classes, preprocessor=preprocessor, dropout=dropout)

    return build


@pytest.fixture(scope="session")
def random_classifier():
    """Factory for the quantization tests' model: a 2-layer, 32-unit
    `BertClassifier` (3 classes, vocabulary of 1200, length 16) whose
    weights are all drawn from N(0, 0.2), seeded; `dtype` is the
    backbone's dtype policy."""

    def build(dtype=None, **classifier_kwargs):
        import keras

        import bertzoo
        from bertzoo.text.preprocessor import BertPreprocessor
        from bertzoo.text.tokenizer import BertTokenizer
        from bertzoo.text.vocabulary import builtin_vocabulary

        keras.utils.set_random_seed(0)
        preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(1200)), sequence_length=16)
        backbone = bertzoo.BertBackbone(
            vocabulary_size=1200,
            num_layers=2,
            hidden_dim=32,
            num_heads=2,
            intermediate_dim=64,
            max_sequence_length=16,
            dropout=0.0,
            dtype=dtype,
        )
        model = bertzoo.BertClassifier(backbone, num_classes=3, preprocessor=preprocessor, **classifier_kwargs)
        weights = np.random.default_rng(0)
        for v in model.weights:
            v.assign(weights.normal(0.0, 0.2, v.shape).astype("float32"))
        return model

    return build


@pytest.fixture(scope="session")
def outlier_classifier(random_classifier):
    """Factory: `random_classifier()` whose hidden states have two channels
    (3 and 17) 40 times larger than the rest, as BERT's do: the case int8
    input smoothing is for."""

    def build():
        model = random_classifier()
        outliers = np.ones(32, "float32")
        outliers[[3, 17]] = 40.0
        backbone = model.backbone
        for norm in [backbone.embeddings.layer_norm] + [b.layer_norm for b in backbone.feedforward_blocks]:
            norm.gamma.assign(outliers)
        return model

    return build
