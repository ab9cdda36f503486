"""Loads a bertzoo SavedModel the way a server would, in a fresh process.

Run by tests/test_export_saved_model.py as
`python export_fresh_server.py EXPORT_DIR INPUTS_JSON RESULTS_JSON`.

Part 1 makes keras, keras_hub, bertzoo and tf_keras unimportable (as if not
installed), imports only TensorFlow, checks that loading fails until TF Text's
op kernels are registered, registers them from the op libraries that the
tensorflow-text wheel ships (without importing its Python package, which
imports Keras), then serves good and bad inputs. Part 2 re-allows those
modules and uses the documented path, `import tensorflow_text`.
Every call's outputs (or its exception) go to RESULTS_JSON.
"""

import importlib.util
import json
import os
import sys

BLOCKED = ("keras", "keras_hub", "bertzoo", "tf_keras")
for name in BLOCKED:
    sys.modules[name] = None  # `import keras` now raises ImportError.

import tensorflow as tf  # noqa: E402

# The op libraries holding the TF Text ops our exports use.
TF_TEXT_LIBRARIES = ("_fast_wordpiece_tokenizer.so", "_normalize_ops.so", "_regex_split_ops.so", "_trimmer_ops.so")


def to_json(value):
    value = value.numpy()
    if value.dtype == object:
        return [v.decode("utf-8") for v in value.reshape(-1)]
    return value.tolist()


def call(signature, **inputs):
    """`{"outputs": {name: values}, "shapes": {name: shape}}`, or the error raised."""
    try:
        outputs = signature(**inputs)
    except Exception as e:  # noqa: BLE001 - the point is that the process survives.
        return {"error": type(e).__name__, "message": str(e)[:3000]}
    return {
        "outputs": {k: to_json(v) for k, v in outputs.items()},
        "shapes": {k: v.shape.as_list() for k, v in outputs.items()},
    }


def main(export_dir, inputs_path, results_path):
    inputs = json.loads(open(inputs_path).read())
    results = {}
    try:
        tf.saved_model.load(export_dir)
        results["load_without_tf_text"] = "loaded"
    except Exception as e:  # noqa: BLE001
        results["load_without_tf_text"] = f"{type(e).__name__}: {e}"[:3000]

    ops_dir = os.path.join(importlib.util.find_spec("tensorflow_text").submodule_search_locations[0], "python", "ops")
    for library in TF_TEXT_LIBRARIES:
        tf.load_op_library(os.path.join(ops_dir, library))
    served = tf.saved_model.load(export_dir)
    results["signatures"] = {
        name: {"inputs": sorted(f.structured_input_signature[1]), "outputs": sorted(f.structured_outputs)}
        for name, f in served.signatures.items()
    }
    text = served.signatures["serving_default"]
    pairs = served.signatures["serving_pairs"]
    tokenized = served.signatures["serving_tokenized"]
    sentences = inputs["sentences"]
    results["sentences"] = call(text, text=tf.constant(sentences))
    results["empty_strings"] = call(text, text=tf.constant(inputs["blank"]))
    results["long_text"] = call(text, text=tf.constant([inputs["long_text"]]))
    results["non_utf8"] = call(text, text=tf.constant([bytes.fromhex(h) for h in inputs["non_utf8_hex"]]))
    results["empty_batch"] = call(text, text=tf.constant([], tf.string))
    results["scalar"] = call(text, text=tf.constant(inputs["scalar"]))
    results["numbers"] = call(text, text=tf.constant([1, 2]))
    results["pairs"] = call(pairs, text=tf.constant(inputs["pairs"][0]), text_pair=tf.constant(inputs["pairs"][1]))
    results["pairs_mismatch"] = call(pairs, text=tf.constant(["a", "b", "c"]), text_pair=tf.constant(["a", "b"]))
    ids = {k: tf.constant(v, tf.int32) for k, v in inputs["tokenized"].items()}
    results["tokenized"] = call(tokenized, **ids)
    too_long = inputs["max_sequence_length"] + 1
    ones = tf.ones([1, too_long], tf.int32)
    results["too_long"] = call(tokenized, token_ids=ones, segment_ids=0 * ones, padding_mask=ones)
    bad = dict(ids, token_ids=ids["token_ids"] + inputs["vocabulary_size"])
    results["bad_token_ids"] = call(tokenized, **bad)
    results["bad_segment_ids"] = call(tokenized, **dict(ids, segment_ids=ids["segment_ids"] + 5))
    empty = tf.zeros([2, 0], tf.int32)
    results["zero_length"] = call(tokenized, token_ids=empty, segment_ids=empty, padding_mask=empty)
    results["shape_mismatch"] = call(tokenized, **dict(ids, segment_ids=ids["segment_ids"][:, :-1]))
    results["wrong_rank"] = call(tokenized, **{k: v[0] for k, v in ids.items()})
    results["after_errors"] = call(text, text=tf.constant(sentences[:2]))
    results["imported_in_part_1"] = sorted(
        m for m in sys.modules if m.split(".")[0] in BLOCKED + ("tensorflow_text",) and sys.modules[m] is not None
    )

    # Part 2: the documented server setup.
    for name in BLOCKED:
        del sys.modules[name]
    import tensorflow_text  # noqa: F401  (registers TF Text's ops)

    again = tf.saved_model.load(export_dir)
    results["documented_path"] = call(again.signatures["serving_default"], text=tf.constant(sentences[:2]))
    results["imported_in_part_2"] = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in BLOCKED})
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
