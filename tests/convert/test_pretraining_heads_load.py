"""Converted pre-training heads load into BertPretrainer and reproduce a
NumPy masked-LM / NSP forward pass computed from the checkpoint's arrays."""

import math

import numpy as np
import pytest

import bertzoo


GELU = {
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_exact": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
}


def numpy_heads(ref, model, inputs, positions, activation, decoder=None):
    sequence, pooled = ref.forward(model, inputs, activation)
    h = {k: tuple(np.asarray(a, "float64") for a in v) if isinstance(v, tuple) else np.asarray(v, "float64")
         for k, v in model["heads"].items()}
    x = np.take_along_axis(sequence, positions[..., None], axis=1)
    x = GELU[activation](x @ h["transform"][0] + h["transform"][1])  # The head uses the encoder's activation.
    mean = x.mean(-1, keepdims=True)
    x = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-12)
    x = x * h["transform_norm"][0] + h["transform_norm"][1]
    table = np.asarray(model["word"], "float64").T if decoder is None else decoder
    mlm = x @ table + h["output_bias"]
    nsp = pooled @ h["nsp"][0] + h["nsp"][1]
    return mlm, nsp


@pytest.mark.parametrize("albert", [False, True], ids=["bert", "albert"])
def test_tf1_heads_reproduce_numpy(albert, ref, rng, make_bert_inputs, tmp_path):
    model = ref.random_model(rng, num_layers=2, num_sets=1 if albert else None, embedding=8 if albert else None)
    source = ref.write_tf1(
        tmp_path / "ckpt",
        ref.tf1_config(model, albert=albert),
        ref.tf1_arrays(model, albert=albert),
        vocabulary=ref.tiny_vocabulary(40),
        config_name="albert_config.json" if albert else "bert_config.json",
    )
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    objective = "sop" if albert else "nsp"
    pretrainer = bertzoo.BertPretrainer.from_preset(preset, sentence_objective=objective)
    inputs = make_bert_inputs(batch=2, length=9, vocabulary_size=40, lengths=[9, 6])
    positions = np.array([[1, 4, 8], [0, 2, 5]], "int32")
    out = pretrainer(dict(inputs, mask_positions=positions))
    mlm, nsp = numpy_heads(ref, model, inputs, positions, "gelu_tanh")
    np.testing.assert_allclose(out["mlm"], mlm, atol=1e-4)
    np.testing.assert_allclose(out["sentence"], nsp, atol=1e-5)


def test_untied_decoder_needs_tie_weights_false(ref, rng, make_bert_inputs, tmp_path):
    model = ref.random_model(rng)
    arrays = ref.hf_bert_arrays(model, prefix="bert.")
    decoder = rng.normal(0, 0.5, model["word"].shape).astype("float32")
    arrays["cls.predictions.decoder.weight"] = decoder  # [V, E], not the token embedding.
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(model), arrays, vocabulary=ref.tiny_vocabulary(40))
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    with pytest.raises(ValueError, match="tie_weights=False"):
        bertzoo.BertPretrainer.from_preset(preset)
    pretrainer = bertzoo.BertPretrainer.from_preset(preset, tie_weights=False)
    inputs = make_bert_inputs(batch=2, length=7, vocabulary_size=40)
    positions = np.array([[1, 3], [2, 6]], "int32")
    out = pretrainer(dict(inputs, mask_positions=positions))
    mlm, nsp = numpy_heads(ref, model, inputs, positions, "gelu_exact", decoder=decoder.T.astype("float64"))
    np.testing.assert_allclose(out["mlm"], mlm, atol=1e-4)
    np.testing.assert_allclose(out["sentence"], nsp, atol=1e-5)
