"""Lottery tickets: iterative magnitude pruning with rewinding.

Frankle & Carbin (2019) find sparse subnetworks ("winning tickets") that
train as well as the dense network: train, prune the smallest surviving
weights, rewind the survivors to their earlier values, and repeat. Chen et
al. (2020) rewind BERT to its pre-trained weights; that is the default here
(the weights the model has when `lottery_ticket` is called).

Choices:

- Rewinding: every weight is rewound, the pruned ones' survivors and the
  weights that are not pruned (embeddings, LayerNorm, pooler, the task
  head) alike, as in both papers. Pass `rewind_weights` to rewind to another
  point (e.g. weights saved after a few hundred fine-tuning steps, Frankle
  et al. 2020's "late rewinding").
- Optimizer state: each round trains a fresh copy of the model, compiled
  anew (a bertzoo task with its fine-tuning defaults), so no optimizer
  state (Adam moments, learning-rate schedule position) carries over from
  one round to the next. `train_fn` may compile the copy itself.
- Masks: fixed while a round trains (a `Pruner` with `schedule=None`); a
  weight pruned in one round stays pruned in every later one.
"""

import collections
import numbers

import keras
import numpy as np
from keras import ops

from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import model_weights
from bertzoo.compression.model_copy import pruning_state
from bertzoo.compression.model_copy import weight_values
from bertzoo.compression.pruner import SCOPES
from bertzoo.compression.pruner import Pruner

LotteryTicket = collections.namedtuple("LotteryTicket", ["model", "sparsity", "sparsities"])
LotteryTicket.__doc__ = """What `lottery_ticket` returns.

`model`: the trained ticket, an ordinary model (no masks or constraints,
zeros baked in); `sparsity`: its fraction of zeros across the pruned
weights; `sparsities`: the target sparsity of each round, in order.
"""


def round_sparsities(final_sparsity, rounds):
    """The sparsity after each round: each removes the same fraction of the
    surviving weights, `1 - (1 - final_sparsity) ** (r / rounds)`.

    Example:
    ```python
    round_sparsities(0.875, 3)  # [0.5, 0.75, 0.875]
    ```
    """
    return [1.0 - (1.0 - final_sparsity) ** (r / rounds) for r in range(1, rounds + 1)]


def _rewind_values(model, rewind_weights):
    """The rewind point as a list of arrays in `model_weights(model)` order."""
    variables = model_weights(model)
    if rewind_weights is None:
        return weight_values(model)  # LoRA updates merged, as the round copies hold them.
    given = rewind_weights
    if isinstance(rewind_weights, keras.Model):
        rewind_weights = weight_values(rewind_weights)
    values = list(rewind_weights) if isinstance(rewind_weights, (list, tuple)) else None
    if values is None or len(values) != len(variables):
        what = (
            f"{type(given).__name__} '{given.name}' with {len(values)} weights"
            if isinstance(given, keras.Model)
            else f"{type(given).__name__}" + ("" if values is None else f" with {len(values)} entries")
        )
        raise ValueError(
            f"`rewind_weights` must be a model of the same architecture or a list of {len(variables)} arrays "
            f"(`model.get_weights()`), got {what}."
        )
    for variable, value in zip(variables, values):
        if tuple(np.shape(value)) != tuple(variable.shape):
            raise ValueError(
                f"`rewind_weights` does not fit the model: {variable.path} has shape "
                f"{tuple(variable.shape)}, the rewind value {tuple(np.shape(value))}."
            )
    return [np.array(ops.convert_to_numpy(v)) for v in values]


def _prune_survivors(values, masks, sparsity, scope):
    """New masks pruning the smallest surviving `|values|` so that each
    weight (`scope="layer"`) or all together (`"global"`) reach `sparsity`
    (round(sparsity * size) zeros, at most size - 1 per weight in layer
    scope); pruned weights stay pruned."""
    # Pruned weights score -1, below every survivor: they are cut first.
    scores = [np.where(m != 0, np.abs(v.astype("float32")), -1.0) for v, m in zip(values, masks)]
    groups = [[i] for i in range(len(values))] if scope == "layer" else [list(range(len(values)))]
    new_masks = [None] * len(values)
    for group in groups:
        flat = np.concatenate([scores[i].reshape(-1) for i in group])
        keep = np.ones(flat.size, bool)
        keep[np.argsort(flat, kind="stable")[: min(int(round(sparsity * flat.size)), flat.size - 1)]] = False
        start = 0
        for i in group:
            size = scores[i].size
            new_masks[i] = keep[start : start + size].reshape(scores[i].shape).astype(masks[i].dtype)
            start += size
    return new_masks


def lottery_ticket(
    model,
    train_fn,
    final_sparsity,
    rounds=3,
    rewind_weights=None,
    layers="encoder",
    include_embeddings=False,
    scope="layer",
):
    """Finds a lottery ticket by iterative magnitude pruning with rewinding.

    Round `r` (1 to `rounds`): a copy of the model with the rewind weights
    and the masks found so far trains (`train_fn(copy)`, masks fixed), then
    the smallest surviving weights of the trained copy are pruned so that the
    sparsity becomes `1 - (1 - final_sparsity) ** (r / rounds)` (each round
    removes the same fraction of the survivors; `round_sparsities`). After
    the last round, the ticket (rewind weights, final masks) trains once
    more, and is returned stripped. `train_fn` runs `rounds + 1` times.

    `model` itself is not changed: it is the default rewind point (Chen et
    al. 2020 rewind BERT to its pre-trained weights). All weights are
    rewound, the ones that are not pruned (embeddings, LayerNorm, the head)
    too; each round trains a fresh copy, compiled anew, so optimizer state
    does not carry over between rounds (see the module docstring).

    Args:
        model: a built bertzoo task (or Keras model, with `layers` given as
            paths or a callable), without a `Pruner` attached.
        train_fn: `fn(model)` that trains the given copy in place (its
            return value is ignored). A bertzoo task's copy comes compiled
            with its fine-tuning defaults; compile it inside `train_fn` for
            other settings (a plain Keras model's copy must be compiled there).
            On JAX the copy's own `fit` prunes; a trainer around it (a
            `Distiller`) needs `pruner.prepare_trainer`, which `train_fn`
            cannot reach, so there it raises.
        final_sparsity: the sparsity in [0, 1) of the pruned weights after
            the last round.
        rounds: the number of prune-and-rewind rounds (>= 1).
        rewind_weights: None (the weights `model` has now), a model of the
            same architecture, or a list of arrays as `model.get_weights()`.
        layers, include_embeddings: which weights to prune, as for `Pruner`.
        scope: `"layer"` (each weight reaches the sparsity) or `"global"`
            (one magnitude ranking across all pruned weights).

    Returns:
        A `LotteryTicket(model, sparsity, sparsities)`: the trained, stripped
        ticket, its sparsity, and the sparsity of each round.

    Example:
    ```python
    model = bertzoo.BertClassifier.from_preset("base", num_classes=2)
    ticket = bertzoo.lottery_ticket(model, lambda m: m.fit(x, y, epochs=1), final_sparsity=0.9, rounds=3)
    ticket.model.save_to_preset("runs/ticket")
    print(ticket.sparsity, bertzoo.sparsity_report(ticket.model))
    ```
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a Keras model, got {type(model).__name__}.")
    if pruning_state(model) is not None:
        raise ValueError(
            f"{type(model).__name__} '{model.name}' has a Pruner attached: find the ticket of `pruner.strip()` "
            "(a plain copy) instead."
        )
    if not callable(train_fn):
        raise ValueError(f"`train_fn` must be a function fn(model) that trains the model, got {train_fn!r}.")
    if isinstance(final_sparsity, bool) or not isinstance(final_sparsity, numbers.Real):
        raise ValueError(f"`final_sparsity` must be a number in [0, 1), got {final_sparsity!r}.")
    if not 0.0 <= final_sparsity < 1.0:
        raise ValueError(
            f"`final_sparsity` must be in [0, 1) (the fraction of weights set to zero), got {final_sparsity}."
        )
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 1:
        raise ValueError(f"`rounds` must be an integer >= 1, got {rounds!r}.")
    final_sparsity, rounds = float(final_sparsity), int(rounds)  # NumPy numbers too.
    if scope not in SCOPES:
        raise ValueError(f"Unknown `scope`={scope!r}. Expected 'layer' or 'global'.")
    rewind = _rewind_values(model, rewind_weights)

    def round_model(masks):
        """A copy at the rewind point, its masks fixed to `masks`."""
        copy = copy_model(model, transform=lambda variable, value: rewind[index_of[id(variable)]])
        pruner = Pruner(copy, None, layers=layers, include_embeddings=include_embeddings, scope=scope)
        if masks is not None:
            pruner.set_masks(masks)
        pruner.prepare_trainer(copy)  # `train_fn` fits the copy itself.
        return copy, pruner

    index_of = {id(v): i for i, v in enumerate(model_weights(model))}
    sparsities = round_sparsities(float(final_sparsity), rounds)
    masks = None
    for sparsity in sparsities:
        copy, pruner = round_model(masks)
        train_fn(copy)
        if masks is None:
            masks = [ops.convert_to_numpy(m) for m in pruner.state.masks]
        values = [ops.convert_to_numpy(t.variable) for t in pruner.targets]
        masks = _prune_survivors(values, masks, sparsity, scope)
    copy, pruner = round_model(masks)
    train_fn(copy)
    return LotteryTicket(pruner.strip(), pruner.sparsity(), sparsities)
