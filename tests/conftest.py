"""Shared test fixtures. Keep this small: module-specific helpers belong in
the test module that uses them."""

import os

import numpy as np
import pytest

# `jit_compile="auto"` measures each model (seconds, timing-dependent): the
# suite uses the rule instead, also in its subprocesses. tests/test_fast_path.py
# unsets this to test the measurement.
os.environ["BERTZOO_JIT_COMPILE"] = "rule"


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
