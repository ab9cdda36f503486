"""Pruning masks: what can be pruned, and how weights are scored and cut.

Patterns: unstructured (each weight by its magnitude), blocks `"RxC"`
(scored by mean magnitude) and `"N:M"` (N of every M consecutive inputs
kept). Everything here runs inside the compiled train step (XLA included).
Scores may be signed (movement pruning ranks by accumulated movement).
"""

import re

import keras
import numpy as np
from keras import ops

from bertzoo.layers.embeddings import PositionEmbedding
from bertzoo.utils import private_api
from bertzoo.utils.layers import leaf_layers

# The bits below a float32's sign bit.
_LOW_BITS = 0x7FFFFFFF


def prunable_weights(model):
    """`{layer path: (layer, variable, input_axis)}` for every weight matrix
    of `model` that can be pruned: Dense kernels and embedding tables."""
    found = {}
    for layer in leaf_layers(model):
        if isinstance(layer, keras.layers.Dense):
            found[layer.path] = (layer, private_api.dense_kernel_variable(layer), 0)
        elif isinstance(layer, keras.layers.Embedding):
            found[layer.path] = (layer, private_api.embeddings_variable(layer), 1)
        elif isinstance(layer, PositionEmbedding):
            found[layer.path] = (layer, layer.embeddings, 1)
    return found


def parse_pattern(pattern):
    """Returns `None`, `("block", rows, cols)` or `("n:m", n, m)`."""
    if pattern is None:
        return None
    text = str(pattern).strip().lower()
    block = re.fullmatch(r"(\d+)x(\d+)", text)
    if block:
        rows, cols = int(block.group(1)), int(block.group(2))
        if rows >= 1 and cols >= 1 and rows * cols > 1:
            return ("block", rows, cols)
    nm = re.fullmatch(r"(\d+):(\d+)", text)
    if nm:
        n, m = int(nm.group(1)), int(nm.group(2))
        if 1 <= n < m:
            return ("n:m", n, m)
    raise ValueError(
        f"Unknown pruning `pattern`={pattern!r}. Use None (unstructured), a block "
        "shape 'RxC' such as '1x4' or '4x1' (R rows of the input dimension by C columns "
        "of the output dimension), or 'N:M' such as '2:4' (N of every M consecutive "
        "weights along the input dimension are kept)."
    )


def block_scores(scores, rows, cols):
    """Mean score of each `rows x cols` block; a block cut short by the
    matrix's edge averages the scores it holds (as TF-MOT's average pooling
    with "SAME" padding does), so it is not pruned first for its padding."""
    height, width = scores.shape
    pad_h, pad_w = -height % rows, -width % cols
    shape = ((height + pad_h) // rows, rows, (width + pad_w) // cols, cols)
    sums = ops.sum(ops.reshape(ops.pad(scores, [[0, pad_h], [0, pad_w]]), shape), axis=(1, 3))
    counts = np.pad(np.ones((height, width), "float32"), [[0, pad_h], [0, pad_w]]).reshape(shape).sum(axis=(1, 3))
    return sums / ops.convert_to_tensor(counts, sums.dtype)


def expand_blocks(block_mask, shape, rows, cols):
    expanded = ops.repeat(ops.repeat(block_mask, rows, axis=0), cols, axis=1)
    return expanded[: shape[0], : shape[1]]


def _flat_and_count(scores, sparsity):
    """`scores` as one float32 row, and k = round(sparsity * n), how many of
    them pruning to `sparsity` cuts; below sparsity 1 at most n - 1 (as
    TF-MOT: with per-layer thresholds a weight matrix keeps at least one
    weight; a global threshold keeps one of the whole set)."""
    flat = ops.reshape(ops.cast(scores, "float32"), (-1,))
    sparsity = ops.cast(sparsity, "float32")
    count = ops.round(sparsity * flat.shape[0])
    count = ops.where(sparsity < 1.0, ops.minimum(count, max(flat.shape[0] - 1, 0)), count)
    return flat, ops.cast(count, "int32")


def score_threshold(scores, sparsity):
    """The k-th smallest of `scores` (any sign), k = round(sparsity * n):
    pruning every score below it, and as many equal to it as make k
    (`keep_mask`), prunes k of them. -inf (below every score) when k is 0.

    Found by bisection on order-preserving integer keys of the float32 bit
    patterns (non-negative floats order like their bits; negative ones have
    their other bits flipped): 32 counting passes, exact. Sorting would do,
    but XLA's CPU sort inside a train step is slow (seconds per kernel).
    The keys stay int32 (JAX has no int64 by default): no score's key is
    int32's minimum (only a NaN's would be), and midpoints are taken
    without overflow.
    """
    flat, count = _flat_and_count(scores, sparsity)
    bits = ops.view(flat, "int32")
    keys = ops.where(bits < 0, ops.bitwise_xor(bits, _LOW_BITS), bits)

    def halve(_, bounds):
        low, high = bounds
        # floor((low + high) / 2), which int32 cannot hold as a sum.
        middle = ops.right_shift(low, 1) + ops.right_shift(high, 1) + ops.bitwise_and(ops.bitwise_and(low, high), 1)
        enough = ops.sum(ops.cast(keys <= middle, "int32")) >= count
        return ops.where(enough, low, middle), ops.where(enough, middle, high)

    low = ops.convert_to_tensor(-(2**31), "int32")  # count(keys <= low) = 0 < k
    high = ops.max(keys)  # count(keys <= high) = n >= k
    # A loop, not 32 unrolled passes: a train step that prunes many kernels
    # traces and compiles one small loop per kernel.
    _, key = ops.fori_loop(0, 32, halve, (low, high))
    threshold = ops.view(ops.where(key < 0, ops.bitwise_xor(key, _LOW_BITS), key), "float32")
    return ops.where(count > 0, threshold, ops.convert_to_tensor(-np.inf, "float32"))


def threshold_keeping_ties(scores, threshold, sparsity):
    """`threshold` (`score_threshold(scores, sparsity)`) for one cut across
    several weights, where `scores > threshold` is kept: unchanged when
    pruning every score up to it prunes k = round(sparsity * n); else (ties
    at it) the float just below it, so the ties are kept and fewer than k
    pruned, never more.

    Example:
    ```python
    threshold_keeping_ties(np.zeros(4), 0.0, 0.5)  # just below 0.0: nothing pruned
    ```
    """
    flat, count = _flat_and_count(scores, sparsity)
    threshold = ops.cast(threshold, "float32")
    too_many = ops.sum(ops.cast(flat <= threshold, "int32")) > count
    bits = ops.view(threshold, "int32")
    key = ops.where(bits < 0, ops.bitwise_xor(bits, _LOW_BITS), bits) - 1  # The next float down.
    below = ops.view(ops.where(key < 0, ops.bitwise_xor(key, _LOW_BITS), key), "float32")
    # Below 0 that is -0, which compares equal, then denormals, which CPUs
    # may flush to 0: the smallest normal float instead.
    below = ops.where(ops.equal(threshold, 0.0), -np.finfo("float32").tiny, below)
    return ops.where(too_many, below, threshold)


def keep_mask(scores, threshold, sparsity):
    """Which `scores` survive pruning k = round(sparsity * n) of them at
    `threshold` (`score_threshold(scores, sparsity)`): every score above it,
    and of the scores equal to it all but the first (k - count below it) in
    flat order, so exactly k are pruned however many tie (e.g. movement
    scores before any weight has moved, or weights on a coarse grid).

    Example:
    ```python
    keep_mask(np.zeros((2, 2)), 0.0, 0.5)  # [[False, False], [True, True]]
    ```
    """
    flat, count = _flat_and_count(scores, sparsity)
    threshold = ops.cast(threshold, "float32")
    ties = ops.equal(flat, threshold)
    quota = count - ops.sum(ops.cast(flat < threshold, "int32"))  # How many of the ties to prune.

    def split_ties():
        pruned_ties = ops.logical_and(ties, ops.cumsum(ops.cast(ties, "int32")) <= quota)
        return ops.logical_or(flat > threshold, ops.logical_and(ties, ops.logical_not(pruned_ties)))

    # Usually the threshold is one score, the k-th: no running count needed.
    keep = ops.cond(ops.sum(ops.cast(ties, "int32")) > quota, split_ties, lambda: flat > threshold)
    return ops.reshape(keep, ops.shape(scores))


def n_of_m_mask(scores, n, m, axis):
    """Keeps the `n` largest of every `m` consecutive `scores` along `axis`."""
    moved = ops.moveaxis(scores, axis, -1)
    lead, length = tuple(moved.shape[:-1]), moved.shape[-1]
    groups = ops.reshape(moved, lead + (length // m, m))
    # Rank within the group (0 = largest; ties go to the earlier entry), by
    # pairwise comparison: m is small, and it avoids a sort under XLA.
    a, b = groups[..., :, None], groups[..., None, :]
    earlier = np.tril(np.ones((m, m), bool), k=-1)[None, :]  # [i, j]: j < i
    beats = ops.logical_or(b > a, ops.logical_and(ops.equal(b, a), earlier))
    ranks = ops.sum(ops.cast(beats, "int32"), axis=-1)
    keep = ops.reshape(ranks < n, lead + (length,))
    return ops.moveaxis(keep, -1, axis)
