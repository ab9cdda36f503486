"""Compression through the public model methods, on every task head:
`BertBackbone.named_weights`, `Task.with_backbone`, `Task.compute_features`,
`bertzoo.utils.quantization_mode`; distillation, magnitude pruning and
structured pruning of a classifier, a tagger, a question answerer and a
multiple-choice model (tiny models, a few steps, tokenized inputs)."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.compression.losses import soft_target_loss
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.utils import quantization_mode

VOCABULARY_SIZE = 32
LENGTH = 8
N = 32
HEADS = ("classifier", "tagger", "question_answerer", "multiple_choice")


def backbone(num_layers=2, hidden_dim=16, num_heads=2, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    return bertzoo.BertBackbone(
        vocabulary_size=VOCABULARY_SIZE,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=16,
        dropout=0.0,
        **kwargs,
    )


def task(head, encoder):
    if head == "classifier":
        return bertzoo.BertClassifier(encoder, num_classes=3, dropout=0.0)
    if head == "tagger":
        return bertzoo.BertTokenClassifier(encoder, num_classes=3, dropout=0.0)
    if head == "question_answerer":
        return bertzoo.BertQuestionAnswerer(encoder)
    return bertzoo.BertMultipleChoice(encoder, num_choices=2, dropout=0.0)


def data(head, n=N, seed=0):
    """Tokenized inputs and labels for `head`; sequences padded to random lengths."""
    rng = np.random.default_rng(seed)
    shape = (n, 2, LENGTH) if head == "multiple_choice" else (n, LENGTH)
    lengths = rng.integers(5, LENGTH + 1, shape[:-1])
    mask = (np.arange(LENGTH) < lengths[..., None]).astype("int32")
    segments = np.broadcast_to((np.arange(LENGTH) >= 3).astype("int32"), shape) * mask  # Context from 3.
    x = {
        "token_ids": (rng.integers(5, VOCABULARY_SIZE, shape) * mask).astype("int32"),
        "segment_ids": np.ascontiguousarray(segments, "int32"),
        "padding_mask": mask,
    }
    if head == "classifier":
        y = rng.integers(0, 3, n)
    elif head == "tagger":
        y = np.where(mask == 1, rng.integers(0, 3, shape), -100)
    elif head == "question_answerer":
        start = np.minimum(rng.integers(3, 5, n), lengths - 2)
        y = np.stack([start, start], axis=1)  # Inside every context (positions 3..lengths-2).
    else:
        y = rng.integers(0, 2, n)
    return x, y.astype("int32")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


# --- Model methods ------------------------------------------------------------------------------
def test_named_weights_name_every_backbone_weight_once_in_order():
    encoder = backbone(embedding_dim=8)
    named = encoder.named_weights()
    assert len(named) == len(encoder.weights) and len({id(v) for v in named.values()}) == len(named)
    assert list(named)[:4] == [
        "embeddings/token",
        "embeddings/position",
        "embeddings/segment",
        "embeddings/layer_norm/gamma",
    ]
    assert tuple(named["embeddings/projection/kernel"].shape) == (8, 16)
    assert tuple(named["attention_1/query/kernel"].shape) == (16, 16)
    assert tuple(named["feedforward_0/intermediate/kernel"].shape) == (16, 32)
    assert list(named)[-2:] == ["pooler/kernel", "pooler/bias"]
    shared = backbone(num_layers=4, num_groups=1).named_weights()
    assert "attention_0/query/kernel" in shared and "attention_1/query/kernel" not in shared
    with pytest.raises(ValueError, match=r"is quantized \(int8\)"):
        bertzoo.quantize(encoder, "int8").named_weights()


def test_quantization_mode_of_models_layers_and_policies():
    model = task("classifier", backbone())
    assert quantization_mode(model) is None
    assert quantization_mode(bertzoo.quantize(model, "int8")) == "int8"
    assert quantization_mode(bertzoo.quantize(model, "int4", include_embeddings=False)) == "int4"
    assert quantization_mode("mixed_bfloat16") is None
    assert quantization_mode("int8_from_float32") == "int8"
    with pytest.raises(TypeError, match="takes a Keras model or layer"):
        quantization_mode(3)


@pytest.mark.parametrize("head", HEADS)
def test_compute_features_gives_the_models_outputs(head):
    model = task(head, backbone())
    x, _ = data(head, n=4)
    features = model.compute_features(x, return_attention_scores=True)
    np.testing.assert_allclose(numpy(features["logits"]), numpy(model(x)), rtol=1e-5, atol=1e-5)
    rows = 8 if head == "multiple_choice" else 4  # One encoded sequence per choice.
    assert tuple(features["padding_mask"].shape) == (rows, LENGTH)
    assert len(features["hidden_states"]) == 3 and tuple(features["attention_scores"][0].shape) == (rows, 2, 8, 8)
    assert ("logits_mask" in features) == (head == "tagger")


@pytest.mark.parametrize("head", HEADS)
def test_with_backbone_keeps_class_head_config_and_head_weights(head):
    model = task(head, backbone())
    same_width = model.with_backbone(backbone(num_layers=1, seed=1))
    assert type(same_width) is type(model) and same_width.backbone.num_layers == 1
    assert same_width.get_config().keys() == model.get_config().keys()
    head_weights = [v for v in model.weights if all(v is not w for w in model.backbone.weights)]
    new_head = [v for v in same_width.weights if all(v is not w for w in same_width.backbone.weights)]
    assert len(head_weights) == len(new_head) > 0
    for old, new in zip(head_weights, new_head):
        np.testing.assert_array_equal(numpy(old), numpy(new))
        assert old is not new
    # Another hidden size: the head cannot be copied and stays freshly initialized.
    narrow = model.with_backbone(backbone(hidden_dim=8, num_heads=2, seed=2))
    assert narrow.output_shape == model.output_shape
    x, _ = data(head, n=2)
    assert narrow(x).shape == model(x).shape


def test_with_backbone_copies_the_preprocessor():
    tokenizer = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"])
    model = bertzoo.BertClassifier(backbone(), num_classes=2, preprocessor=BertPreprocessor(tokenizer, 8))
    again = model.with_backbone(backbone(num_layers=1))
    assert again.preprocessor is not model.preprocessor
    np.testing.assert_array_equal(
        numpy(again.preprocessor(["good bad"])["token_ids"]), numpy(model.preprocessor(["good bad"])["token_ids"])
    )


# --- Distillation ---------------------------------------------------------------------------------
def test_token_soft_targets_leave_padding_out():
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(2, 5, 3)).astype("float32")
    student = rng.normal(size=(2, 5, 3)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], "int32")
    loss = soft_target_loss(2.0)
    masked = float(numpy(loss.compute_loss(teacher, student, mask=mask)))
    real = mask.astype(bool)
    expected = float(numpy(loss.compute_loss(teacher[real][None], student[real][None])))
    assert masked == pytest.approx(expected, rel=1e-5)
    garbage = student.copy()
    garbage[~real] = 100.0  # Padding rows do not count.
    assert float(numpy(loss.compute_loss(teacher, garbage, mask=mask))) == pytest.approx(masked, rel=1e-5)


@pytest.mark.parametrize("head", HEADS)
def test_distiller_trains_a_narrower_student_of_every_head(head):
    teacher = task(head, backbone(num_layers=2, hidden_dim=16))
    rng = np.random.default_rng(0)
    for v in teacher.weights:  # A head with confident outputs: soft targets far from uniform.
        if all(v is not w for w in teacher.backbone.weights):
            v.assign(rng.normal(0.0, 1.0, v.shape).astype("float32"))
    student = task(head, backbone(num_layers=1, hidden_dim=8, seed=1))
    x, y = data(head)
    distiller = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)
    before = distiller.loss_terms(x, y)
    assert set(before) == {"hard", "soft", "hidden", "attention", "embedding", "agreement"}
    distiller.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    history = distiller.fit(x, y, epochs=6, batch_size=16, verbose=0).history
    after = distiller.loss_terms(x, y)
    assert history["loss"][-1] < history["loss"][0]
    distillation_terms = ("soft", "hidden", "attention", "embedding")
    assert sum(after[k] for k in distillation_terms) < sum(before[k] for k in distillation_terms)
    assert distiller.predict(x, verbose=0).shape == teacher.predict(x, verbose=0).shape


def test_distiller_refuses_students_of_another_head():
    teacher = task("classifier", backbone())
    with pytest.raises(ValueError, match="the student a BertTokenClassifier"):
        bertzoo.Distiller(teacher, task("tagger", backbone(num_layers=1)))
    choices = task("multiple_choice", backbone())
    other = bertzoo.BertMultipleChoice(backbone(num_layers=1), num_choices=3)
    with pytest.raises(ValueError, match="outputs have shape \\(None, 2\\) but the student's \\(None, 3\\)"):
        bertzoo.Distiller(choices, other)


def test_tagger_distills_from_raw_words():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "anna", "lives", "in", "oslo", "olaf", "left"]
    preprocessor = BertPreprocessor(BertTokenizer(words), sequence_length=8)

    def tagger(layers):
        encoder = bertzoo.BertBackbone(
            vocabulary_size=len(words),
            num_layers=layers,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
            max_sequence_length=16,
        )
        return bertzoo.BertTokenClassifier(encoder, num_classes=2, preprocessor=preprocessor)

    distiller = bertzoo.Distiller(tagger(2), tagger(1))
    terms = distiller.loss_terms([["anna", "lives", "in", "oslo"], ["olaf", "left"]], [[1, 0, 0, 1], [1, 0]])
    assert terms["hard"] > 0 and terms["soft"] >= 0 and 0 <= terms["agreement"] <= 1


def test_init_student_from_a_tagger_keeps_its_head():
    teacher = task("tagger", backbone(num_layers=2))
    student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 1})
    assert isinstance(student, bertzoo.BertTokenClassifier) and student.backbone.num_layers == 1
    np.testing.assert_array_equal(numpy(student.output_dense.kernel), numpy(teacher.output_dense.kernel))


# --- Pruning --------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", HEADS)
def test_pruner_reaches_its_sparsity_on_every_head(head):
    model = task(head, backbone())
    x, y = data(head)
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    pruner.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    pruner.fit(x, y, epochs=1, batch_size=16, verbose=0)
    assert pruner.sparsity() == pytest.approx(0.5, abs=0.01)
    stripped = pruner.strip()
    assert type(stripped) is type(model)
    report = {row["path"]: row["sparsity"] for row in bertzoo.sparsity_report(stripped).layers}
    assert len(pruner.targets) == 12  # Every encoder kernel of both layers.
    for target in pruner.targets:
        assert report[target.path] == pytest.approx(0.5, abs=0.01)
    np.testing.assert_allclose(numpy(stripped(x)), numpy(model(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", HEADS)
def test_structured_pruning_shrinks_every_head(head):
    model = task(head, backbone())
    model.compile(jit_compile=False)
    x, y = data(head)
    small = bertzoo.prune_heads_and_neurons(model, heads_to_keep=1, ffn_keep_ratio=0.5, data=(x, y))
    assert type(small) is type(model)
    assert small.backbone.num_heads == 1 and small.backbone.intermediate_dim == 16
    assert small(x).shape == model(x).shape
    kept = [v for v in small.weights if all(v is not w for w in small.backbone.weights)]
    for new in kept:  # The head's weights are the original's.
        old = next(v for v in model.weights if v.path == new.path)
        np.testing.assert_array_equal(numpy(new), numpy(old))
