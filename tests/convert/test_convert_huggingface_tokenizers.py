"""Hugging Face tokenizer layouts: `tokenizer.json` alone (what transformers 5
saves), added tokens, tokenizers bertzoo does not reproduce; and other
layouts the readers met in the wild (ALBERT groups, float8 tensors, a
damaged keras-hub preset, a session's dtype policy)."""

import json
import re
import struct

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.convert import ConversionError
from bertzoo.saving.preset import Preset

WORDS = ["the", "cat", "sat", "on", "mat", "##s", "東", ",", "Cat"]


@pytest.fixture
def tiny(ref, rng):
    return ref.random_model(rng, num_layers=1, vocabulary_size=16)


def vocabulary():
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS


def wordpiece_json(tokens, lowercase=True, chinese=True, added=()):
    """A `tokenizer.json` as the tokenizers library writes a BERT tokenizer."""
    specials = [{"id": tokens.index(t), "content": t, "special": True} for t in tokens if t.startswith("[")]
    return {
        "version": "1.0",
        "added_tokens": specials + [{"id": i, "content": t, "special": False} for t, i in added],
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": chinese,
            "strip_accents": None,
            "lowercase": lowercase,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {t: i for i, t in enumerate(tokens)},
        },
    }


def convert(ref, model, path, tmp_path, vocab=None, tokenizer_config=None, files=None):
    source = ref.write_hf(
        path, ref.hf_config(model), ref.hf_bert_arrays(model), vocabulary=vocab, tokenizer_config=tokenizer_config
    )
    for name, content in (files or {}).items():
        (source / name).write_text(json.dumps(content))
    return bertzoo.convert_checkpoint(source, tmp_path / f"{path.name}_preset")


def token_ids(result, text):
    preprocessor = Preset.resolve(result.path).build_preprocessor(sequence_length=16)
    features = preprocessor([text])
    ids = np.asarray(features["token_ids"])[0]
    return ids[np.asarray(features["padding_mask"])[0].astype(bool)].tolist()


def test_tokenizer_json_alone_gives_the_vocabulary_and_its_normalizer_settings(ref, tiny, tmp_path):
    tokens = vocabulary()
    fast = wordpiece_json(tokens, lowercase=False, chinese=False)
    result = convert(ref, tiny, tmp_path / "v5", tmp_path, files={"tokenizer.json": fast})
    assert result.has_vocabulary and not result.notes
    assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens
    # Cased (lowercase false), and CJK characters not split off: "東京" is one word, not in the vocabulary.
    ids = {t: i for i, t in enumerate(tokens)}
    assert token_ids(result, "Cat cats 東京") == [2, ids["Cat"], ids["cat"], ids["##s"], 1, 3]
    # tokenizer_config.json wins over the normalizer, as in transformers.
    lowered = convert(
        ref,
        tiny,
        tmp_path / "lowered",
        tmp_path,
        tokenizer_config={"do_lower_case": True},
        files={"tokenizer.json": fast},
    )
    assert token_ids(lowered, "Cat") == [2, ids["cat"], 3]
    default = convert(ref, tiny, tmp_path / "default", tmp_path, files={"tokenizer.json": wordpiece_json(tokens)})
    assert token_ids(default, "Cat 東京") == [2, ids["cat"], ids["東"], 1, 3]


def test_tokenizer_json_of_another_model_converts_the_weights_with_a_note(ref, tiny, tmp_path):
    unigram = {"model": {"type": "Unigram", "unk_id": 1, "vocab": [["<pad>", 0.0], ["<unk>", 0.0]]}}
    result = convert(ref, tiny, tmp_path / "unigram", tmp_path, files={"tokenizer.json": unigram})
    assert not result.has_vocabulary
    assert "tokenizer.json holds a Unigram tokenizer model" in result.notes[0]
    assert "spiece.model" in result.notes[0] and "no vocabulary" in str(result)
    gaps = wordpiece_json(vocabulary())
    gaps["model"]["vocab"]["cat"] = 40
    assert (
        "not 0, 1, ..., n-1" in convert(ref, tiny, tmp_path / "gaps", tmp_path, files={"tokenizer.json": gaps}).notes[0]
    )


@pytest.mark.parametrize(
    "tokenizer_config, match",
    [
        ({"tokenizer_class": "BertJapaneseTokenizer"}, r"tokenizer_class 'BertJapaneseTokenizer', which splits"),
        ({"do_basic_tokenize": False}, r"do_basic_tokenize false"),
    ],
)
def test_a_tokenizer_bertzoo_would_not_reproduce_leaves_the_vocabulary_out(
    ref, tiny, tmp_path, tokenizer_config, match
):
    result = convert(ref, tiny, tmp_path / "other", tmp_path, vocab=vocabulary(), tokenizer_config=tokenizer_config)
    assert not result.has_vocabulary and not (result.path / "vocabulary.txt").exists()
    assert len(result.notes) == 1
    assert re.search(match, result.notes[0]) and "weights are converted" in result.notes[0]
    # The same checkpoint with BERT's own tokenizer class converts its vocabulary.
    plain = convert(
        ref,
        tiny,
        tmp_path / "plain",
        tmp_path,
        vocab=vocabulary(),
        tokenizer_config={"tokenizer_class": "BertTokenizerFast"},
    )
    assert plain.has_vocabulary and not plain.notes
    # A generic class converts when its tokenizer.json is BERT's.
    generic = {"tokenizer_class": "PreTrainedTokenizerFast"}
    fast = {"tokenizer.json": wordpiece_json(vocabulary())}
    assert convert(ref, tiny, tmp_path / "generic", tmp_path, tokenizer_config=generic, files=fast).has_vocabulary
    fast["tokenizer.json"]["pre_tokenizer"] = {"type": "Whitespace"}
    assert not convert(ref, tiny, tmp_path / "split", tmp_path, tokenizer_config=generic, files=fast).has_vocabulary


@pytest.mark.parametrize("layout", ["added_tokens.json", "tokenizer.json"])
def test_added_tokens_that_continue_the_vocabulary_are_appended(ref, tiny, tmp_path, layout):
    tokens = vocabulary()  # 14 tokens; the table has 16 rows.
    added = [("covid19", 14), ("mrna", 15)]
    if layout == "added_tokens.json":
        files = {"added_tokens.json": dict(added)}
    else:
        files = {"tokenizer.json": wordpiece_json(tokens, added=added)}
    result = convert(ref, tiny, tmp_path / "added", tmp_path, vocab=tokens, files=files)
    assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens + ["covid19", "mrna"]
    assert token_ids(result, "the Covid19 cat mrna") == [2, 5, 14, 6, 15, 3]
    assert "take ids 14-15" in result.notes[0]


def test_added_tokens_with_other_ids_are_not_converted(ref, tiny, tmp_path):
    tokens = vocabulary()
    result = convert(ref, tiny, tmp_path / "gap", tmp_path, vocab=tokens, files={"added_tokens.json": {"covid19": 15}})
    assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens
    assert "do not take the ids after" in result.notes[0] and "(13)" in result.notes[0]
    assert token_ids(result, "covid19") == [2, 1, 3]


def test_other_special_token_names_convert_the_weights_and_say_how_to_keep_the_vocabulary(ref, tiny, tmp_path):
    tokens = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"] + WORDS
    specials = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>"}
    result = convert(ref, tiny, tmp_path / "specials", tmp_path, vocab=tokens, tokenizer_config=specials)
    assert not result.has_vocabulary
    assert "specials/vocab.txt lacks [PAD], [UNK], [CLS], [SEP], [MASK]" in result.notes[0]
    assert "rename" in result.notes[0] and "in place" in result.notes[0]
    assert bertzoo.BertBackbone.from_preset(result.path).count_params() > 0


def test_hugging_face_albert_groups_follow_its_even_split(ref, rng, make_bert_inputs, tmp_path):
    # Hugging Face runs layer i through group int(i / (L / G)), i.e. i // (L // G): with L = G = 22 layer 15
    # is group 15 (Google's int(i / L * G) gives 14, refused for TF1 checkpoints only).
    model = ref.random_model(rng, num_layers=22, num_sets=22, embedding=4, hidden=8, intermediate=8)
    config = ref.hf_config(model, "albert", num_hidden_groups=22)
    source = ref.write_hf(tmp_path / "hf", config, ref.hf_albert_arrays(model, heads=False))
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    assert backbone.num_groups == 22
    inputs = make_bert_inputs(batch=2, length=8, vocabulary_size=40)
    assert ref.max_difference(backbone, model, inputs, "gelu_tanh") < 1e-4


def safetensors_bytes(name, dtype, shape, data):
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


def test_a_tensor_type_numpy_cannot_read_is_named(ref, tiny, tmp_path):
    source = tmp_path / "fp8"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(ref.hf_config(tiny)))
    (source / "model.safetensors").write_bytes(safetensors_bytes("w", "F8_E4M3", [2], b"\x01\x02"))
    with pytest.raises(ConversionError, match=r"model\.safetensors holds tensors of a type NumPy cannot read.*float32"):
        bertzoo.convert_checkpoint(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_tf1_checkpoint_beside_a_hugging_face_config_is_converted(ref, tiny, tmp_path):
    source = ref.write_tf1(
        tmp_path / "both", ref.tf1_config(tiny), ref.tf1_arrays(tiny), vocabulary=ref.tiny_vocabulary(16)
    )
    (source / "config.json").write_text(json.dumps(ref.hf_config(tiny)))
    (source / "pytorch_model.bin").write_bytes(b"\0")
    assert bertzoo.convert.detect_format(source) == "tf1"
    assert bertzoo.convert_checkpoint(source, tmp_path / "preset").format == "tf1"
    with pytest.raises(FileNotFoundError, match=r"It is a TF checkpoint prefix: pass its directory, .*both\."):
        bertzoo.convert_checkpoint(source / "bert_model.ckpt", tmp_path / "other")


def test_a_damaged_keras_hub_preset_names_itself(tmp_path):
    import keras_hub

    preset = tmp_path / "kh"
    keras_hub.models.BertBackbone(
        vocabulary_size=12, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8, max_sequence_length=8
    ).save_to_preset(str(preset))
    config = json.loads((preset / "config.json").read_text())
    del config["config"]
    (preset / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"kh is not a loadable keras-hub preset: reading config\.json.*KeyError"):
        bertzoo.convert_checkpoint(preset, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_conversion_keeps_float32_under_a_bfloat16_session_policy(ref, tiny, tmp_path):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("bfloat16")
    try:
        result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    finally:
        keras.config.set_dtype_policy(previous)
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    assert backbone.dtype_policy.name == "float32"
    np.testing.assert_array_equal(backbone.named_weights()["embeddings/token"].numpy(), tiny["word"])
