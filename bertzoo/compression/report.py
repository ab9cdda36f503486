"""Sparsity reports: per-layer zeros, and weight sizes raw and gzip-compressed."""

import gzip
import os
import tempfile

import keras
import numpy as np
from keras import ops

from bertzoo.compression.masks import prunable_weights
from bertzoo.compression.model_copy import saved_weights
from bertzoo.utils.layers import quantization_mode


class SparsityReport:
    """Per-layer and total sparsity of a model, and its weights' size on disk
    raw and gzip-compressed (zeros compress away; the rest does not).

    Attributes:
        layers: list of dicts `{"path", "shape", "parameters", "zeros", "sparsity"}`
            for every weight matrix (Dense kernels, embedding tables).
        total_sparsity: zeros / parameters over those matrices.
        overall_sparsity: zeros / parameters over all weights (biases, norms too).
        dense_bytes: size of the model's weights in an HDF5 file (as
            `save_weights` writes them, less any optimizer state or masks).
        compressed_bytes: its size after gzip (level 6).
    """

    def __init__(self, layers, total_params, total_zeros, dense_bytes, compressed_bytes):
        self.layers = layers
        matrix_params = sum(row["parameters"] for row in layers)
        matrix_zeros = sum(row["zeros"] for row in layers)
        self.total_sparsity = matrix_zeros / matrix_params if matrix_params else 0.0
        self.overall_sparsity = total_zeros / total_params if total_params else 0.0
        self.parameters = total_params
        self.dense_bytes = dense_bytes
        self.compressed_bytes = compressed_bytes

    @property
    def compression_ratio(self):
        """compressed_bytes / dense_bytes."""
        return self.compressed_bytes / self.dense_bytes

    def to_dict(self):
        return {
            "layers": self.layers,
            "total_sparsity": self.total_sparsity,
            "overall_sparsity": self.overall_sparsity,
            "parameters": self.parameters,
            "dense_bytes": self.dense_bytes,
            "compressed_bytes": self.compressed_bytes,
        }

    def __str__(self):
        width = max([len("layer")] + [len(r["path"]) for r in self.layers])
        lines = [f"{'layer':<{width}}  {'shape':>14}  {'params':>11}  {'sparsity':>8}"]
        for r in self.layers:
            shape = "x".join(str(d) for d in r["shape"])
            lines.append(f"{r['path']:<{width}}  {shape:>14}  {r['parameters']:>11,}  {r['sparsity']:>8.1%}")
        lines.append(f"{'total (weight matrices)':<{width}}  {'':>14}  {'':>11}  {self.total_sparsity:>8.1%}")
        lines.append(
            f"all weights: {self.parameters:,} parameters, {self.overall_sparsity:.1%} zero; "
            f"weights file {self.dense_bytes / 1e6:.2f} MB, gzip {self.compressed_bytes / 1e6:.2f} MB "
            f"({self.compression_ratio:.1%})"
        )
        return "\n".join(lines)

    def __repr__(self):
        return (
            f"SparsityReport(total_sparsity={self.total_sparsity:.4f}, dense_bytes={self.dense_bytes}, "
            f"compressed_bytes={self.compressed_bytes})"
        )


def gzip_size(path, level=6, recursive=True):
    """Bytes of `path` (a file, or every file of a directory; with
    `recursive=False` only those directly in it, e.g. a preset's own) after
    gzip."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: nothing to measure.")
    if os.path.isfile(path):
        files = [path]
    elif recursive:
        files = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    else:
        files = sorted(entry.path for entry in os.scandir(path) if entry.is_file())
    total = 0
    for name in files:
        with open(name, "rb") as f:
            total += len(gzip.compress(f.read(), compresslevel=level, mtime=0))
    return total


def sparsity_report(model):
    """Per-layer and total sparsity, and dense vs gzip-compressed weight size.

    Sizes count the model's weights only: not the optimizer state of a
    compiled model, nor the masks of a model with a `Pruner` attached. A
    float LoRA layer counts as saved: its kernel with the update merged in.

    Example:
    ```python
    report = bertzoo.sparsity_report(pruner.strip())
    print(report)  # a table; report.to_dict() for the figures
    report.total_sparsity  # zeros over every weight matrix, embedding tables included
    ```
    """
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"`sparsity_report` needs a built Keras model, got {model!r}.")
    if "int4" in (quantization_mode(model) or "").split("+"):
        # Its kernels are stored two weights to a byte: counting zero bytes would not count zero weights.
        raise ValueError(
            f"{type(model).__name__} '{model.name}' has int4 layers, which store two weights in each byte: "
            "report the sparsity of the model before quantizing it (int4 keeps its zeros), or of an int8 copy."
        )
    rows = []
    weights, arrays = saved_weights(model)
    values = {id(v): a for v, a in zip(weights, arrays)}
    order = {id(v): i for i, v in enumerate(model.weights)}
    candidates = sorted(prunable_weights(model).items(), key=lambda kv: order.get(id(kv[1][1]), len(order)))
    for path, (_layer, variable, _) in candidates:
        value = values[id(variable)] if id(variable) in values else ops.convert_to_numpy(variable)
        zeros = int(np.sum(value == 0))
        rows.append(
            {
                "path": path,
                "shape": list(value.shape),
                "parameters": int(value.size),
                "zeros": zeros,
                "sparsity": zeros / value.size,
            }
        )
    import h5py

    total_params = sum(a.size for a in arrays)
    total_zeros = sum(int(np.sum(a == 0)) for a in arrays)
    # The model's own weights, one HDF5 dataset each as in a Keras weights
    # file, but without what `save_weights` adds for a compiled or pruning
    # model (optimizer slots, masks): those are not the model's size.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.weights.h5")
        with h5py.File(path, "w") as f:
            for index, (variable, array) in enumerate(zip(weights, arrays)):
                f.create_dataset(f"{index}/{variable.path}", data=array)
        dense_bytes = os.path.getsize(path)
        compressed_bytes = gzip_size(path)
    return SparsityReport(rows, total_params, total_zeros, dense_bytes, compressed_bytes)
