"""Exporting models for serving.

`export_saved_model` writes a TensorFlow SavedModel whose signatures take raw
strings (the tokenizer is in the graph) or token ids and return predictions;
`export_portable` writes the tokenized model as ONNX or LiteRT. A model's `export`
(and `bertzoo export PRESET_DIR OUT_DIR`) picks between them by `format`.

The package is generic: it writes the signatures a model declares
(`serving_signatures`, see `bertzoo.models.serving`) and names no model class.
"""

from bertzoo.export.portable import PORTABLE_FORMATS
from bertzoo.export.portable import export_portable
from bertzoo.export.saved_model import custom_ops
from bertzoo.export.saved_model import describe_export
from bertzoo.export.saved_model import export_saved_model
from bertzoo.export.saved_model import read_export_metadata
from bertzoo.models.serving import TextServing
from bertzoo.models.serving import classification_outputs
from bertzoo.models.serving import register_exporter

FORMATS = ("tf_saved_model",) + tuple(PORTABLE_FORMATS)


def export_model(model, path, format="tf_saved_model", overwrite=False, sequence_length=None, verbose=False, **kwargs):
    """Exports `model` in `format` (`"tf_saved_model"`, `"onnx"` or `"litert"`).

    `"tf_saved_model"`: `export_saved_model` (raw-text and tokenized
    signatures; `kwargs`: `pairs`, `preprocessor`, `int8_kernels`,
    `jit_compile` and the model's serving options, e.g. a question
    answerer's `stride`). `"onnx"` / `"litert"`:
    `export_portable` (tokenized inputs of any length; `kwargs` go to
    Keras's exporter).

    Example:

    ```python
    export_model(model, "serving/sentiment/1")
    export_model(model, "sentiment.onnx", format="onnx")
    ```
    """
    if format == "tf_saved_model":
        return export_saved_model(
            model, path, overwrite=overwrite, sequence_length=sequence_length, verbose=verbose, **kwargs
        )
    if format in PORTABLE_FORMATS:
        return export_portable(
            model, path, format, overwrite=overwrite, sequence_length=sequence_length, verbose=verbose, **kwargs
        )
    raise ValueError(
        f"Unknown export format {format!r}; bertzoo exports {', '.join(repr(f) for f in FORMATS)}. "
        "For Keras's other formats call keras.Model.export(model, path, format=..., input_signature=...)."
    )


register_exporter(export_model)
