"""Layer maps: which student layer learns from which teacher layer."""

import numbers

LAYER_MAPS = ("uniform", "last")


def check_layer_index(name, value, num_layers, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}`: {what} layer {value!r} is not an integer.")
    value = int(value)  # numpy integers too (np.arange), as plain ints for configs.
    if not 1 <= value <= num_layers:
        raise ValueError(
            f"`{name}`: {what} layer {value} is out of range: the {what} has layers "
            f"1..{num_layers} (layer 0, the embedding output, is distilled by `embedding_weight`)."
        )
    return value


def layer_map_pairs(layer_map, student_layers, teacher_layers):
    """The `(student_layer, teacher_layer)` pairs a layer map stands for.

    Layers are numbered from 1 (the first transformer layer) to `L`; layer 0,
    the embedding output, is handled by the embedding loss.

    - `"uniform"`: student layer `i` learns from teacher layer
      `ceil(i * L_teacher / L_student)` (TinyBERT's `g(m) = m * N / M`; the last
      layers are always paired).
    - `"last"`: only the last layers (MiniLM).
    - an explicit list of `(student_layer, teacher_layer)` pairs.

    Example:
    ```python
    layer_map_pairs("uniform", student_layers=2, teacher_layers=6)  # [(1, 3), (2, 6)]
    ```
    """
    if isinstance(layer_map, str):
        if layer_map == "uniform":
            return [(i, -(-i * teacher_layers // student_layers)) for i in range(1, student_layers + 1)]
        if layer_map == "last":
            return [(student_layers, teacher_layers)]
        raise ValueError(
            f"Unknown `layer_map` {layer_map!r}. Use 'uniform', 'last', or a list of "
            "(student_layer, teacher_layer) pairs such as [(1, 2), (2, 4)]."
        )
    try:
        pairs = [tuple(pair) for pair in layer_map]
    except TypeError:
        raise ValueError(
            f"`layer_map` must be 'uniform', 'last' or a list of (student_layer, "
            f"teacher_layer) pairs, got {layer_map!r}."
        ) from None
    if not pairs:
        raise ValueError(
            "`layer_map` is empty. Give at least one (student_layer, teacher_layer) pair, "
            "or set hidden_state_weight=0 and attention_weight=0 to distill outputs only."
        )
    checked = []
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"`layer_map` entry {pair!r} is not a (student_layer, teacher_layer) pair.")
        checked.append(
            (
                check_layer_index("layer_map", pair[0], student_layers, "student"),
                check_layer_index("layer_map", pair[1], teacher_layers, "teacher"),
            )
        )
    return checked
