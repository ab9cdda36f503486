"""Student initialisation from a teacher's layers (DistilBERT)."""

import warnings

from bertzoo.compression.layer_maps import check_layer_index
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.bert_backbone import derived_head_dim
from bertzoo.models.task import Task
from bertzoo.saving.preset import Preset
from bertzoo.utils import quantization_mode
from bertzoo.utils.layers import assign_copy
from bertzoo.utils.private_api import deferred_initialization

_SHAPE_KEYS = ("vocabulary_size", "hidden_dim", "embedding_dim", "head_dim", "max_sequence_length", "num_segments")
_WIDTH_FIX = (
    "For a narrower student, distill a freshly initialized one (the Distiller learns a projection for hidden "
    "states of another width), or prune the teacher's heads and neurons (prune_heads_and_neurons)."
)
_SHAPE_FIXES = {
    "max_sequence_length": "Leave it out: the texts' length is the preprocessor's `sequence_length` (e.g. "
    "student.preprocessor = BertPreprocessor(tokenizer, sequence_length=64)), which may be shorter than the "
    "position table.",
    "num_segments": "Leave it out: a student of fewer segment types could not read the teacher's inputs.",
    "vocabulary_size": "Leave it out: the student shares the teacher's vocabulary (the Distiller needs one "
    "tokenization for both).",
}


def _per_layer(value, num_layers):
    return list(value) if isinstance(value, (list, tuple)) else [value] * num_layers


def _shared_groups(teacher_config, selected):
    """The student's `num_groups` that keeps the teacher's cross-layer
    sharing (ALBERT) for the teacher layers `selected` (from 1), or None
    (every student layer its own weights).

    Consecutive student layers copied from one teacher group share one
    block, as in the teacher: the student of a `num_groups=1` teacher is
    shared too, not a larger copy of one block per layer. Groups must be of
    equal size (how `BertBackbone` groups layers); when the chosen layers
    do not fall so, the student is unshared, with a warning."""
    t_layers = teacher_config["num_layers"]
    t_groups = teacher_config.get("num_groups") or t_layers
    if t_groups == t_layers:
        return None
    group_of = [(t - 1) // (t_layers // t_groups) for t in selected]
    runs = [1]
    for previous, current in zip(group_of, group_of[1:]):
        if current == previous:
            runs[-1] += 1
        else:
            runs.append(1)
    if len(set(runs)) == 1:
        return None if len(runs) == len(selected) else len(runs)
    warnings.warn(
        f"The teacher shares weights across layers (num_groups={t_groups}), but its layers {selected} do not "
        f"fall into groups of equal size ({runs} consecutive layers per group), so every student layer gets "
        "its own copy. Pass `num_groups` in `student`, or teacher `layers` that group evenly, to keep sharing.",
        stacklevel=4,
    )
    return None


def _student_config(teacher_config, student, teacher_layers_of):
    """The student backbone config: a preset's, or the teacher's with overrides."""
    if isinstance(student, dict):
        overrides = dict(student)
        num_layers = overrides.get("num_layers", teacher_config["num_layers"])
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be a positive integer, got {num_layers!r}.")
        selected = teacher_layers_of(num_layers)
        config = dict(teacher_config)
        config.pop("name", None)
        # Per-layer sizes (pruned teachers) follow the copied layers.
        for key in ("num_heads", "intermediate_dim"):
            if key not in overrides and isinstance(config[key], (list, tuple)):
                sizes = config[key]
                config[key] = [sizes[t - 1] for t in selected]
        if "num_groups" not in overrides:
            config["num_groups"] = _shared_groups(teacher_config, selected)
        config.update(overrides)
        return config, selected
    if isinstance(student, (str, Preset)) or hasattr(student, "__fspath__"):
        config = Preset.resolve(student).backbone_config
        return config, teacher_layers_of(config["num_layers"])
    raise ValueError(
        "`student` must be a dict of backbone settings (e.g. {'num_layers': 2}, applied to the "
        f"teacher's config) or a preset name/directory, got {type(student).__name__}."
    )


def init_student_from_teacher(teacher, student, layers="every_k"):
    """A shallower copy of `teacher`, initialised from its layers (DistilBERT).

    The student takes the teacher's embeddings, pooler and head, and for its
    layer `i` (from 1) the weights of teacher layer `layers[i-1]`.
    `layers="every_k"` takes every k-th layer, `k = L_teacher / L_student`
    (layers k, 2k, ..., L_teacher: the same pairs as the distiller's
    "uniform" layer map); pass a list of teacher layers (from 1) to choose.
    Weights can only be copied between equal shapes, so hidden size, head
    size and count, feed-forward size, vocabulary and position table must
    match; a `ValueError` names the first that does not. A teacher that
    shares weights across layers (ALBERT) gives a student that shares them
    the same way where the chosen layers allow it (`num_groups=1`: the
    student of a one-block teacher is one block too).

    Args:
        teacher: a bertzoo task on a `BertBackbone` (e.g. a `BertClassifier`:
            a task of the same class is returned, through `with_backbone`)
            or a `bertzoo.BertBackbone` (a `BertBackbone` is returned).
        student: a dict of backbone settings applied to the teacher's config
            (usually `{"num_layers": n}`), or a preset name/directory whose
            backbone config (not weights) is used.
        layers: "every_k" or a list of teacher layer numbers, one per
            student layer.

    Example:
    ```python
    teacher = bertzoo.BertClassifier.from_preset("runs/minilm_sentiment")  # 6 layers
    student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 3})  # layers 2, 4, 6
    ```
    """
    if isinstance(teacher, Task) and isinstance(teacher.backbone, BertBackbone):
        backbone = teacher.backbone
    elif isinstance(teacher, BertBackbone):
        backbone = teacher
    else:
        raise ValueError(
            f"`teacher` must be a bertzoo BertClassifier (or another task) or BertBackbone, got "
            f"{type(teacher).__name__}."
        )
    if quantization_mode(teacher):
        raise ValueError(
            f"The teacher is quantized ({quantization_mode(teacher)}): a student copied from it would be too, and "
            "could not train. Initialize the student from the float teacher."
        )
    t_layers = backbone.num_layers

    def teacher_layers_of(num_layers):
        if isinstance(layers, str):
            if layers != "every_k":
                raise ValueError(f"Unknown `layers` {layers!r}: use 'every_k' or a list of teacher layers.")
            if t_layers % num_layers:
                raise ValueError(
                    f"layers='every_k' needs the teacher's depth ({t_layers}) to be a multiple of the "
                    f"student's ({num_layers}). Pass the teacher layers to copy, e.g. "
                    f"layers={[-(-i * t_layers // num_layers) for i in range(1, num_layers + 1)]}."
                )
            k = t_layers // num_layers
            return [k * i for i in range(1, num_layers + 1)]
        chosen = list(layers)
        if len(chosen) != num_layers:
            raise ValueError(
                f"`layers` lists {len(chosen)} teacher layers but the student has {num_layers}: "
                "give one teacher layer per student layer."
            )
        return [check_layer_index("layers", t, t_layers, "teacher") for t in chosen]

    # The teacher's head size as built: `get_config` saves a derived one as
    # None, and a subset of a pruned teacher's layers (fewer heads) would
    # derive another.
    t_config = {**backbone.get_config(), "head_dim": backbone.head_dim}
    config, selected = _student_config(t_config, student, teacher_layers_of)
    config = {
        **config,
        "head_dim": config.get("head_dim") or derived_head_dim(config["hidden_dim"], config["num_heads"]),
    }
    for key in _SHAPE_KEYS:
        if config.get(key) != t_config.get(key):
            raise ValueError(
                f"Cannot copy teacher weights: the student's `{key}` is {config.get(key)!r} but the "
                f"teacher's is {t_config.get(key)!r}, and the copied tables must have the teacher's shapes. "
                + _SHAPE_FIXES.get(key, _WIDTH_FIX)
            )
    with deferred_initialization() as deferred:  # Its weights are copied: none is drawn at random first.
        student_backbone = BertBackbone(**config)
    s_heads = _per_layer(student_backbone.num_heads, student_backbone.num_layers)
    s_inter = _per_layer(student_backbone.intermediate_dim, student_backbone.num_layers)
    t_heads = _per_layer(backbone.num_heads, t_layers)
    t_inter = _per_layer(backbone.intermediate_dim, t_layers)
    for i, t in enumerate(selected):
        for key, s_sizes, t_sizes in (("num_heads", s_heads, t_heads), ("intermediate_dim", s_inter, t_inter)):
            if s_sizes[i] != t_sizes[t - 1]:
                raise ValueError(
                    f"Cannot copy teacher layer {t} into student layer {i + 1}: `{key}` is "
                    f"{s_sizes[i]} for the student and {t_sizes[t - 1]} for that teacher layer."
                )
    if config.get("activation") != t_config.get("activation"):
        warnings.warn(
            f"The student uses activation {config.get('activation')!r}, the teacher "
            f"{t_config.get('activation')!r}: copied layers will compute a different function.",
            stacklevel=2,
        )

    copies = [(student_backbone.embeddings, backbone.embeddings), (student_backbone.pooler, backbone.pooler)]
    assigned = {}
    for i, t in enumerate(selected):
        for s_block, t_block in zip(student_backbone.layer_blocks(i), backbone.layer_blocks(t - 1)):
            if id(s_block) in assigned and assigned[id(s_block)] is not t_block:
                raise ValueError(
                    f"Student layer {i + 1} shares its weights with an earlier layer (num_groups="
                    f"{student_backbone.num_groups}) but would copy a different teacher layer ({t}). "
                    "Use a student without cross-layer sharing (num_groups=None)."
                )
            if id(s_block) not in assigned:
                assigned[id(s_block)] = t_block
                copies.append((s_block, t_block))
    pairs = [pair for s_layer, t_layer in copies for pair in zip(s_layer.weights, t_layer.weights)]
    for s_var, t_var in pairs:
        if tuple(s_var.shape) != tuple(t_var.shape):  # Guarded above; a last line of defence.
            raise ValueError(f"Shape mismatch copying {t_var.path} {t_var.shape} into {s_var.path} {s_var.shape}.")
    deferred.fill(lambda: [assign_copy(s_var, t_var) for s_var, t_var in pairs], student_backbone)

    if isinstance(teacher, BertBackbone):
        return student_backbone
    return teacher.with_backbone(student_backbone)
