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
    h = {
        k: tuple(np.asarray(a, "float64") for a in v) if isinstance(v, tuple) else np.asarray(v, "float64")
        for k, v in model["heads"].items()
    }
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
    # BERT's "gelu" is the exact GELU its released checkpoints were trained with; ALBERT's is the tanh form.
    mlm, nsp = numpy_heads(ref, model, inputs, positions, "gelu_tanh" if albert else "gelu_exact")
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


def test_predict_masked_matches_numpy_heads(ref, rng, tmp_path):
    model = ref.random_model(rng, num_layers=2)
    vocabulary = ref.tiny_vocabulary(40)
    source = ref.write_hf(
        tmp_path / "hf", ref.hf_config(model), ref.hf_bert_arrays(model, prefix="bert."), vocabulary=vocabulary
    )
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    pretrainer = bertzoo.BertPretrainer.from_preset(preset, sentence_objective=None)
    assert pretrainer.preprocessor.tokenizer.special_tokens_in_strings is False  # Still reads [MASK] here.
    texts = ["tok7 [MASK] tok9 tok10", "[MASK] tok3 [MASK]"]
    results = pretrainer.predict_masked(texts, top_k=3)

    # The same inputs, built by hand: [CLS] ids [SEP], token ids of "tokN" are N + 5.
    rows = [[2, 12, 4, 14, 15, 3], [2, 4, 8, 4, 3, 0]]
    inputs = {
        "token_ids": np.array(rows, "int32"),
        "segment_ids": np.zeros((2, 6), "int32"),
        "padding_mask": np.array([[1] * 6, [1] * 5 + [0]], "int32"),
    }
    positions = np.array([[2, 0], [1, 3]], "int32")
    mlm, _ = numpy_heads(ref, model, inputs, positions, "gelu_exact")
    probabilities = np.exp(mlm - mlm.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    assert [len(r) for r in results] == [1, 2]
    for i, slots in enumerate([1, 2]):
        for slot in range(slots):
            best = np.argsort(-probabilities[i, slot])[:3]
            assert [token for token, _ in results[i][slot]] == [vocabulary[j] for j in best]
            np.testing.assert_allclose([p for _, p in results[i][slot]], probabilities[i, slot, best], atol=1e-5)


def test_predict_masked_refuses_bad_input(ref, rng, tmp_path):
    model = ref.random_model(rng)
    source = ref.write_hf(
        tmp_path / "hf",
        ref.hf_config(model),
        ref.hf_bert_arrays(model, prefix="bert."),
        vocabulary=ref.tiny_vocabulary(40),
    )
    pretrainer = bertzoo.BertPretrainer.from_preset(
        bertzoo.convert_checkpoint(source, tmp_path / "preset").path, sentence_objective=None, sequence_length=8
    )
    with pytest.raises(ValueError, match="`top_k` must be a positive integer, got 0"):
        pretrainer.predict_masked("tok1 [MASK]", top_k=0)
    with pytest.raises(ValueError, match=r"Text 1 \('tok1 tok2'\) has no \[MASK\] token"):
        pretrainer.predict_masked(["[MASK]", "tok1 tok2"])
    with pytest.raises(ValueError, match="left after truncation.*first 8 tokens"):
        pretrainer.predict_masked("tok1 tok2 tok3 tok4 tok5 tok6 tok7 [MASK]")
    assert len(pretrainer.predict_masked("tok1 [MASK]", top_k=1000)[0][0]) == 40  # Capped at the vocabulary.
    pretrainer.preprocessor.sequence_length = 4  # Changed after construction: fill-mask packs at the new length.
    with pytest.raises(ValueError, match="left after truncation.*first 4 tokens"):
        pretrainer.predict_masked("tok1 tok2 tok3 [MASK]")


def test_a_checkpoint_with_only_the_next_sentence_head_loads_it(ref, rng, make_bert_inputs, tmp_path, caplog):
    # Hugging Face's `BertForNextSentencePrediction` saves `cls.seq_relationship` and no masked-LM head.
    model = ref.random_model(rng)
    arrays = {
        name: array
        for name, array in ref.hf_bert_arrays(model, prefix="bert.").items()
        if not name.startswith("cls.predictions")
    }
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(model), arrays, vocabulary=ref.tiny_vocabulary(40))
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    with caplog.at_level("WARNING", logger="bertzoo"):
        pretrainer = bertzoo.BertPretrainer.from_preset(preset, sentence_objective="nsp")
    assert "sentence head only" in caplog.text
    inputs = make_bert_inputs(batch=2, length=7, vocabulary_size=40)
    out = pretrainer(dict(inputs, mask_positions=np.array([[1], [2]], "int32")))
    _, nsp = numpy_heads(ref, model, inputs, np.array([[1], [2]], "int32"), "gelu_exact")
    np.testing.assert_allclose(out["sentence"], nsp, atol=1e-5)
