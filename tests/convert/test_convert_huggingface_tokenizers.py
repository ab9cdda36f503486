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


def test_tokenizer_json_alone_gives_the_vocabulary_with_the_settings_transformers_uses(ref, tiny, tmp_path):
    tokens = vocabulary()
    ids = {t: i for i, t in enumerate(tokens)}
    cased = {"tokenizer.json": wordpiece_json(tokens, lowercase=False, chinese=False)}
    result = convert(ref, tiny, tmp_path / "v5", tmp_path, files=cased)
    assert result.has_vocabulary and not result.notes
    assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens
    # BERT's tokenizer class rebuilds its normalizer from tokenizer_config.json (lowercase and CJK split by
    # default), whatever tokenizer.json's says: "Cat" is lowercased, "東京" split into "東" and an unknown "京".
    assert token_ids(result, "Cat cats 東京") == [2, ids["cat"], ids["cat"], ids["##s"], ids["東"], 1, 3]
    settings = {"tokenizer_class": "BertTokenizer", "do_lower_case": False, "tokenize_chinese_chars": False}
    configured = convert(ref, tiny, tmp_path / "configured", tmp_path, tokenizer_config=settings, files=cased)
    # Cased, and "東京" one word, not in the vocabulary.
    assert token_ids(configured, "Cat 東京") == [2, ids["Cat"], 1, 3]
    # A generic class runs tokenizer.json as written, tokenizer_config.json's settings aside.
    generic = {"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": True}
    as_written = convert(ref, tiny, tmp_path / "generic", tmp_path, tokenizer_config=generic, files=cased)
    assert as_written.has_vocabulary and token_ids(as_written, "Cat 東京") == [2, ids["Cat"], 1, 3]
    cased["tokenizer.json"]["pre_tokenizer"] = {"type": "Whitespace"}  # No longer BERT's tokenizer.
    assert not convert(ref, tiny, tmp_path / "other", tmp_path, tokenizer_config=generic, files=cased).has_vocabulary


def test_tokenizer_json_of_another_model_converts_the_weights_with_a_note(ref, tiny, tmp_path):
    unigram = {"model": {"type": "Unigram", "unk_id": 1, "vocab": [["<pad>", 0.0], ["<unk>", 0.0]]}}
    result = convert(ref, tiny, tmp_path / "unigram", tmp_path, files={"tokenizer.json": unigram})
    assert not result.has_vocabulary
    assert "tokenizer.json holds a Unigram tokenizer model" in result.notes[0]
    assert "spiece.model" in result.notes[0] and "no vocabulary" in str(result)
    for broken in ("gap", None):
        odd = wordpiece_json(vocabulary())
        odd["model"]["vocab"]["cat"] = 40 if broken else None
        notes = convert(ref, tiny, tmp_path / f"ids_{broken}", tmp_path, files={"tokenizer.json": odd}).notes
        assert "not 0, 1, ..., n-1" in notes[0]


def test_an_unreadable_tokenizer_json_beside_vocab_txt_is_passed_over(ref, tiny, tmp_path):
    source = tmp_path / "lfs"
    ref.write_hf(source, ref.hf_config(tiny), ref.hf_bert_arrays(tiny), vocabulary=vocabulary())
    (source / "tokenizer.json").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\n")
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    assert result.has_vocabulary and "tokenizer.json is not valid JSON" in result.notes[0]


@pytest.mark.parametrize("where", ["tokenizer_config.json", "config.json"])
def test_a_tokenizer_class_bertzoo_would_not_reproduce_leaves_the_vocabulary_out(ref, tiny, tmp_path, where):
    japanese = {"tokenizer_class": "BertJapaneseTokenizer"}
    tokenizer_config = japanese if where == "tokenizer_config.json" else {"word_tokenizer_type": "mecab"}
    source = ref.write_hf(
        tmp_path / "ja",
        {**ref.hf_config(tiny), **(japanese if where == "config.json" else {})},
        ref.hf_bert_arrays(tiny),
        vocabulary=vocabulary(),
        tokenizer_config=tokenizer_config,
    )
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    assert not result.has_vocabulary and not (result.path / "vocabulary.txt").exists()
    assert len(result.notes) == 1
    assert f"ja/{where} names tokenizer_class 'BertJapaneseTokenizer', which splits" in result.notes[0]
    # BERT's own classes (ALBERT checkpoints with a WordPiece vocabulary use them too) keep it.
    for name in ("BertTokenizerFast", "DistilBertTokenizer"):
        kept = convert(
            ref, tiny, tmp_path / name, tmp_path, vocab=vocabulary(), tokenizer_config={"tokenizer_class": name}
        )
        assert kept.has_vocabulary and not kept.notes
    # transformers ignores do_basic_tokenize in its fast (and v5) tokenizers: nothing changes.
    basic = {"do_basic_tokenize": False}
    assert convert(ref, tiny, tmp_path / "basic", tmp_path, vocab=vocabulary(), tokenizer_config=basic).has_vocabulary


@pytest.mark.parametrize("layout", ["added_tokens.json", "tokenizer.json"])
def test_added_tokens_that_continue_the_vocabulary_are_appended(ref, tiny, tmp_path, layout):
    tokens = vocabulary()[:-1]  # 13 tokens ("Cat" left out); the table has 16 rows.
    added = [("covid19", 13), ("Mixed", 14), ("[E1]", 15)]
    if layout == "added_tokens.json":
        files = {"added_tokens.json": dict(added)}
    else:
        files = {"tokenizer.json": wordpiece_json(tokens, added=added)}
    result = convert(ref, tiny, tmp_path / "added", tmp_path, vocab=tokens, files=files)
    # Stored as the uncased tokenizer normalises text, so that "Mixed" can match.
    assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens + ["covid19", "mixed", "[e1]"]
    assert token_ids(result, "the Covid19 cat mixed MIXED") == [2, 5, 13, 6, 14, 14, 3]
    assert "take ids 13-15" in result.notes[0]
    assert "bertzoo never produces '[E1]' (it splits text at punctuation" in result.notes[0]


def test_added_tokens_with_other_ids_or_outside_the_table_are_not_converted(ref, tiny, tmp_path):
    tokens = vocabulary()
    for name, added, reason in (
        ("gap", {"covid19": 15}, r"their ids are not the ones after vocab\.txt's last \(13\)"),
        ("text_id", {"covid19": "14"}, r"their ids are not the ones after"),
        ("outside", {"a": 14, "b": 15, "c": 16}, r"ids 14-16 lie outside the embedding table's 16 rows"),
        ("again", {"cat": 14}, r"'cat' is in vocab\.txt already \(id 6\) but added as id 14"),
    ):
        result = convert(ref, tiny, tmp_path / name, tmp_path, vocab=tokens, files={"added_tokens.json": added})
        assert (result.path / "vocabulary.txt").read_text().splitlines() == tokens
        assert re.search(reason, result.notes[0]), result.notes
    assert token_ids(result, "covid19") == [2, 1, 3]


def test_other_special_token_names_convert_the_weights_and_say_how_to_keep_the_vocabulary(ref, tiny, tmp_path):
    tokens = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"] + WORDS
    result = convert(ref, tiny, tmp_path / "specials", tmp_path, vocab=tokens)
    assert not result.has_vocabulary
    assert "specials/vocab.txt: it lacks [PAD], [UNK], [CLS], [SEP], [MASK]" in result.notes[0]
    assert "without changing their ids" in result.notes[0]
    assert bertzoo.BertBackbone.from_preset(result.path).count_params() > 0
    # A vocabulary holding bertzoo's names, whose tokenizer_config.json uses others for the same roles.
    renamed = {"cls_token": "<s>", "sep_token": {"content": "</s>", "special": True}}
    other = convert(
        ref, tiny, tmp_path / "roles", tmp_path, vocab=vocabulary()[:-2] + ["<s>", "</s>"], tokenizer_config=renamed
    )
    assert not other.has_vocabulary
    assert "cls_token '<s>' (bertzoo uses [CLS]), sep_token '</s>' (bertzoo uses [SEP])" in other.notes[0]


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


def test_a_config_without_model_type_says_what_to_add(ref, tiny, tmp_path):
    config = ref.hf_config(tiny)
    del config["model_type"]
    source = ref.write_hf(tmp_path / "hf", config, ref.hf_bert_arrays(tiny))
    with pytest.raises(
        ConversionError, match=r"hf/config\.json looks like a Hugging Face config but has no model_type"
    ):
        bertzoo.convert_checkpoint(source, tmp_path / "out")


def test_gelu_python_is_the_exact_gelu(ref, tiny, make_bert_inputs, tmp_path):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny, hidden_act="gelu_python"), ref.hf_bert_arrays(tiny))
    backbone = bertzoo.BertBackbone.from_preset(bertzoo.convert_checkpoint(source, tmp_path / "preset").path)
    inputs = make_bert_inputs(batch=2, length=8, vocabulary_size=16)
    assert backbone.activation == "gelu_exact" and ref.max_difference(backbone, tiny, inputs, "gelu_exact") < 1e-4
