"""Bad input gives an error that lists what is wrong, and writes nothing."""

import json
import re

import pytest

import bertzoo
from bertzoo.convert import ConversionError


@pytest.fixture
def tiny(ref, rng):
    return ref.random_model(rng, num_layers=2)


def convert_fails(source, destination, match, error=ConversionError):
    with pytest.raises(error, match=match):
        bertzoo.convert_checkpoint(source, destination)
    # Nothing half-written: no destination, no temporary sibling left behind.
    assert not destination.exists()
    assert not [p for p in destination.parent.iterdir() if p.name.startswith(f".{destination.name}.")]


def test_a_directory_of_no_known_layout(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "weights.bin").write_bytes(b"\0")
    convert_fails(
        tmp_path / "src", tmp_path / "out", r"not a checkpoint bertzoo can convert.*weights\.bin(.|\n)*Hugging Face"
    )


def test_missing_paths_files_and_existing_presets(tmp_path, ref, tiny):
    convert_fails(tmp_path / "nowhere", tmp_path / "out", "does not exist", FileNotFoundError)
    (tmp_path / "file.txt").write_text("x")
    convert_fails(tmp_path / "file.txt", tmp_path / "out", "is a file")
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny, heads=False))
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    convert_fails(preset, tmp_path / "out", "already a bertzoo preset")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        bertzoo.convert_checkpoint(source, preset)
    assert bertzoo.convert_checkpoint(source, preset, overwrite=True).path == preset


def test_detect_format_names_a_missing_path_or_a_file(tmp_path):
    from bertzoo.convert import detect_format

    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist"):
        detect_format(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConversionError, match=r"file\.txt is a file(.|\n)*Hugging Face"):
        detect_format(tmp_path / "file.txt")


def test_config_that_disagrees_with_the_tensor_shapes(tmp_path, ref, tiny):
    source = ref.write_hf(
        tmp_path / "hf", ref.hf_config(tiny, intermediate_size=40), ref.hf_bert_arrays(tiny, heads=False)
    )
    convert_fails(
        source,
        tmp_path / "out",
        r"shape disagrees with the config \(6\)(.|\n)*"
        r"encoder\.layer\.0\.intermediate\.dense\.weight: shape \(32, 16\), the config implies \(40, 16\)",
    )


def test_missing_tensors_are_listed(tmp_path, ref, tiny):
    arrays = ref.hf_bert_arrays(tiny, heads=False)
    del arrays["encoder.layer.1.attention.self.key.weight"], arrays["pooler.dense.bias"]
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), arrays)
    convert_fails(
        source,
        tmp_path / "out",
        r"Missing tensors \(2\):\n  - encoder\.layer\.1\.attention\.self\.key\.weight\n  - pooler\.dense\.bias",
    )
    # Named as the checkpoint names the others (it showed "encoder..." beside "bert.encoder...qery.weight").
    arrays = ref.hf_bert_arrays(tiny, prefix="bert.", heads=False)
    arrays["bert.encoder.layer.1.attention.self.qery.weight"] = arrays.pop(
        "bert.encoder.layer.1.attention.self.query.weight"
    )
    source = ref.write_hf(tmp_path / "prefixed", ref.hf_config(tiny), arrays)
    convert_fails(
        source,
        tmp_path / "out",
        r"Missing tensors \(1\):\n  - bert\.encoder\.layer\.1\.attention\.self\.query\.weight\n(.|\n)*"
        r"bert\.encoder\.layer\.1\.attention\.self\.qery\.weight",
    )


def test_unexpected_tensors_are_listed(tmp_path, ref, tiny):
    arrays = ref.hf_bert_arrays(tiny, prefix="bert.", heads=False)
    # A third layer the config does not know, and a fine-tuned task head.
    arrays["bert.encoder.layer.2.attention.self.query.weight"] = arrays[
        "bert.encoder.layer.0.attention.self.query.weight"
    ]
    arrays["classifier.weight"] = arrays["bert.pooler.dense.weight"][:2]
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), arrays)
    convert_fails(
        source,
        tmp_path / "out",
        r"Unexpected tensors \(not part of this architecture\) \(2\):\n"
        r"  - bert\.encoder\.layer\.2\.attention\.self\.query\.weight \(16, 16\)\n  - classifier\.weight \(2, 16\)",
    )


def test_tf1_missing_and_unexpected_tensors(tmp_path, ref, tiny):
    arrays = ref.tf1_arrays(tiny, optimizer_slots=False)
    del arrays["bert/encoder/layer_1/output/LayerNorm/beta"]
    arrays["bert/encoder/layer_7/output/LayerNorm/beta"] = arrays["bert/encoder/layer_0/output/LayerNorm/beta"]
    source = ref.write_tf1(tmp_path / "tf1", ref.tf1_config(tiny), arrays)
    convert_fails(
        source,
        tmp_path / "out",
        r"Missing tensors \(1\):\n  - bert/encoder/layer_1/output/LayerNorm/beta(.|\n)*"
        r"Unexpected tensors.*\n  - bert/encoder/layer_7/output/LayerNorm/beta \(16,\)",
    )


def test_pretraining_head_with_a_wrong_shape(tmp_path, ref, tiny):
    arrays = ref.tf1_arrays(tiny, optimizer_slots=False)
    arrays["cls/predictions/output_bias"] = arrays["cls/predictions/output_bias"][:10]
    source = ref.write_tf1(tmp_path / "tf1", ref.tf1_config(tiny), arrays)
    convert_fails(
        source,
        tmp_path / "out",
        r"cls/predictions/output_bias \(pre-training head\): shape \(10,\), the config implies \(40,\)",
    )


@pytest.mark.parametrize(
    "change, match",
    [
        ({"model_type": "roberta"}, r"model_type 'roberta'; bertzoo converts \['bert', 'albert'\]"),
        ({"hidden_act": "mish"}, r"hidden_act 'mish' is not supported"),
        ({"position_embedding_type": "relative_key"}, r"position_embedding_type='relative_key'"),
        ({"num_attention_heads": 3}, r"not a valid BertBackbone config.*not divisible"),
        ({"vocab_size": None}, r"lacks the required entries \['vocab_size'\]"),
        # Hugging Face's BERT is then a decoder (causal mask) or has cross-attention layers.
        (
            {"is_decoder": True},
            r"config\.json: is_decoder=true is not supported.*causal mask(.|\n)*set is_decoder to false",
        ),
        ({"add_cross_attention": True}, r"add_cross_attention=true is not supported.*cross-attention layers"),
    ],
)
def test_bad_hugging_face_configs(tmp_path, ref, tiny, change, match):
    config = {k: v for k, v in {**ref.hf_config(tiny), **change}.items() if v is not None}
    source = ref.write_hf(tmp_path / "hf", config, ref.hf_bert_arrays(tiny, heads=False))
    convert_fails(source, tmp_path / "out", match)


def test_hugging_face_without_safetensors(tmp_path, ref, tiny):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(ref.hf_config(tiny)))
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"\0")
    convert_fails(tmp_path / "hf", tmp_path / "out", r"no model\.safetensors.*pytorch_model\.bin")


def test_vocabulary_longer_than_the_config_is_refused_and_a_padded_table_converts(tmp_path, ref, tiny):
    source = ref.write_hf(
        tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny), vocabulary=ref.tiny_vocabulary(50)
    )
    convert_fails(source, tmp_path / "out", r"vocabulary has 50 tokens but the embedding table only 40 rows")
    # 30 tokens in 40 rows: a table padded past its vocabulary (NVIDIA's checkpoints pad to a multiple of 8).
    padded = ref.write_hf(
        tmp_path / "padded", ref.hf_config(tiny), ref.hf_bert_arrays(tiny), vocabulary=ref.tiny_vocabulary(30)
    )
    result = bertzoo.convert_checkpoint(padded, tmp_path / "out")
    model = bertzoo.BertClassifier.from_preset(result.path, num_classes=2)
    assert model.preprocessor.tokenizer.vocabulary_size() == 30 and model.backbone.vocabulary_size == 40
    assert model.predict(["tok3 tok29"], verbose=0).shape == (1, 2)


def test_tf1_config_without_a_checkpoint(tmp_path, ref, tiny):
    (tmp_path / "tf1").mkdir()
    (tmp_path / "tf1" / "bert_config.json").write_text(json.dumps(ref.tf1_config(tiny)))
    convert_fails(tmp_path / "tf1", tmp_path / "out", r"bert_config\.json but no TF checkpoint")


def test_albert_inner_groups_that_bertzoo_cannot_express(tmp_path, ref, rng):
    model = ref.random_model(rng, num_layers=2, num_sets=2, embedding=8)
    config = ref.hf_config(model, "albert", num_hidden_layers=4, num_hidden_groups=1, inner_group_num=2)
    source = ref.write_hf(tmp_path / "hf", config, ref.hf_albert_arrays(model, inner_group_num=2))
    convert_fails(source, tmp_path / "out", r"inner_group_num=2 with layers shared across groups")


def test_keras_hub_objects_of_other_architectures():
    with pytest.raises(ConversionError, match="keras-hub BertBackbone and AlbertBackbone models, got object"):
        bertzoo.convert.read_checkpoint(object())


def test_decoder_options_do_not_matter_to_albert(ref, rng, tmp_path):
    # Hugging Face's ALBERT ignores is_decoder / add_cross_attention: always a bidirectional encoder.
    model = ref.random_model(rng, num_layers=1, embedding=8)
    config = ref.hf_config(model, "albert", is_decoder=True, add_cross_attention=True)
    source = ref.write_hf(tmp_path / "hf", config, ref.hf_albert_arrays(model))
    assert bertzoo.convert.read_checkpoint(source).config["embedding_dim"] == 8


@pytest.mark.parametrize(
    "change, match",
    [
        ({"vocab_size": "40"}, r'vocab_size is "40" \(a string\), expected an integer'),
        ({"num_hidden_layers": True}, r"num_hidden_layers is true \(a boolean\), expected an integer"),
        ({"hidden_size": 16.0}, r"hidden_size is 16.0 \(a number\), expected an integer"),
        ({"layer_norm_eps": None}, r"layer_norm_eps is null, expected a number"),
        ({"hidden_dropout_prob": None}, r"hidden_dropout_prob is null, expected a number"),
        ({"hidden_act": ["gelu"]}, r'hidden_act is \["gelu"\] \(a list\), expected a string'),
        ({"is_decoder": "false"}, r'is_decoder is "false" \(a string\), expected true or false'),
    ],
)
def test_hugging_face_config_values_of_the_wrong_type(tmp_path, ref, tiny, change, match):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny, **change), ref.hf_bert_arrays(tiny, heads=False))
    convert_fails(source, tmp_path / "out", r"hf/config\.json has entries of the wrong type \(1\):\n  - " + match)


def test_every_bad_config_value_is_listed_at_once(tmp_path, ref, tiny):
    config = ref.tf1_config(tiny, vocab_size="40", attention_probs_dropout_prob="0.1")
    del config["hidden_size"]
    source = ref.write_tf1(tmp_path / "tf1", config, ref.tf1_arrays(tiny, optimizer_slots=False))
    convert_fails(
        source,
        tmp_path / "out",
        r"tf1/bert_config\.json lacks the required entries \['hidden_size'\]\.\n"
        r".*tf1/bert_config\.json has entries of the wrong type \(2\):\n"
        r'  - vocab_size is "40" \(a string\), expected an integer\n'
        r'  - attention_probs_dropout_prob is "0.1" \(a string\), expected a number$',
    )


@pytest.mark.parametrize(
    "text, found", [("[1, 2]", r"\[1, 2\] \(a list\)"), ("null", "null"), ('"bert"', r'"bert" \(a string\)')]
)
def test_config_json_that_is_not_an_object(tmp_path, text, found):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(text)
    convert_fails(
        tmp_path / "src", tmp_path / "out", rf"src/config\.json holds {found}; expected a JSON object \(\{{...\}}\)"
    )


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "bert_config.json"])
def test_invalid_json_names_its_file(tmp_path, ref, tiny, name):
    if name == "bert_config.json":
        source = ref.write_tf1(tmp_path / "src", ref.tf1_config(tiny), ref.tf1_arrays(tiny, optimizer_slots=False))
    else:
        source = ref.write_hf(tmp_path / "src", ref.hf_config(tiny), ref.hf_bert_arrays(tiny), tokenizer_config={})
    (source / name).write_text("{not json")
    convert_fails(source, tmp_path / "out", rf"src/{name} is not valid JSON \(Expecting property name")


@pytest.mark.parametrize("size", [0, 100])
def test_truncated_safetensors_names_its_file(tmp_path, ref, tiny, size):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny))
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:size])
    convert_fails(
        source,
        tmp_path / "out",
        rf"hf/model\.safetensors \({size} bytes\) is not a readable safetensors file: .*truncated or damaged",
    )


def test_safetensors_index_without_a_weight_map(tmp_path, ref, tiny):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny))
    (source / "model.safetensors").rename(source / "model-00001-of-00001.safetensors")
    (source / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": ["model-00001-of-00001.safetensors"]})
    )
    convert_fails(
        source,
        tmp_path / "out",
        r'model\.safetensors\.index\.json: weight_map is \["model-00001-of-00001\.safetensors"\] \(a list\); '
        r"expected an object mapping each tensor name",
    )


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/x.safetensors", "sub/model.safetensors", "a.bin"])
def test_safetensors_index_naming_files_outside_the_checkpoint(tmp_path, ref, tiny, shard):
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(tiny), ref.hf_bert_arrays(tiny))
    (source / "model.safetensors").rename(source / "model-00001-of-00001.safetensors")
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"bert.pooler.dense.bias": shard}}))
    convert_fails(source, tmp_path / "out", r"weight_map names files that are not \.safetensors files beside it")


@pytest.mark.parametrize(
    "layout, removed",
    [
        ("tf1", "cls/predictions/output_bias"),
        ("tf1", "cls/seq_relationship/output_weights"),
        ("huggingface", "cls.predictions.transform.LayerNorm.weight"),
        ("huggingface", "cls.seq_relationship.bias"),
    ],
)
def test_a_pretraining_head_held_in_part_is_refused(tmp_path, ref, tiny, layout, removed):
    # A head is optional as a whole (as the pooler is), but one with some of its tensors is incomplete:
    # converting it would write a partial pretraining_heads.safetensors that BertPretrainer refuses later.
    if layout == "tf1":
        arrays = ref.tf1_arrays(tiny, optimizer_slots=False)
        del arrays[removed]
        source = ref.write_tf1(tmp_path / "src", ref.tf1_config(tiny), arrays)
    else:
        arrays = ref.hf_bert_arrays(tiny)
        del arrays[removed]
        source = ref.write_hf(tmp_path / "src", ref.hf_config(tiny), arrays)
    head = "'nsp'" if "seq_relationship" in removed else "'mlm'"
    convert_fails(
        source,
        tmp_path / "out",
        rf"Missing tensors \(1\):\n  - {re.escape(removed)} \(pre-training head {head}: the checkpoint holds",
    )


def test_a_pretraining_head_left_out_whole_is_not_converted(tmp_path, ref, tiny):
    arrays = ref.tf1_arrays(tiny, optimizer_slots=False)
    del arrays["cls/seq_relationship/output_weights"], arrays["cls/seq_relationship/output_bias"]
    source = ref.write_tf1(tmp_path / "src", ref.tf1_config(tiny), arrays)
    result = bertzoo.convert_checkpoint(source, tmp_path / "out")
    assert sorted(result.heads) == [
        "mlm/layer_norm/beta",
        "mlm/layer_norm/gamma",
        "mlm/output_bias",
        "mlm/transform/bias",
        "mlm/transform/kernel",
    ]
