"""Every use of a private Keras or TensorFlow symbol in bertzoo, in one place.

Each function here wraps one private symbol and says what happens when a
release moves or removes it: a public fallback where one exists, otherwise a
`False`/`None` answer that callers treat as "this fast path is unavailable".
`tests/test_private_api.py` exercises each one against the installed
versions, so an upgrade that breaks one fails a named test instead of a user's
model.

Nothing outside this module imports `keras.src`, `tensorflow.python` or
`tensorflow.core`, or touches an underscore attribute of a Keras or
TensorFlow object.
"""

import collections
import contextlib
import gc
import logging
import re
import threading
import warnings

import keras

logger = logging.getLogger("bertzoo")


# --- Keras: layers and weights ---------------------------------------------


def flatten_layers(layer, include_self=True, recursive=True):
    """Every layer tracked by `layer` (depth first, each once).

    Private: `Layer._flatten_layers`. Fallback: `_walk_layers`, a walk over
    `layer.layers` (public on models) and over attributes that hold layers.
    """
    method = getattr(layer, "_flatten_layers", None)
    if method is None:
        return _walk_layers(layer, include_self, recursive)
    return list(method(include_self=include_self, recursive=recursive))


def _walk_layers(layer, include_self, recursive):
    found, seen = [], set()

    def children(current):
        values = list(getattr(current, "layers", None) or [])
        for value in vars(current).values():
            if isinstance(value, keras.layers.Layer):
                values.append(value)
            elif isinstance(value, (list, tuple)):
                values.extend(v for v in value if isinstance(v, keras.layers.Layer))
        return values

    def visit(current, depth):
        if id(current) in seen:
            return
        seen.add(id(current))
        if depth or include_self:
            found.append(current)
        if depth == 0 or recursive:
            for child in children(current):
                visit(child, depth + 1)

    visit(layer, 0)
    return found


def accept_raw_inputs(layer):
    """Lets `layer` be called on strings, Python lists and ragged tensors:
    Keras then neither converts its inputs to backend tensors nor refuses
    non-tensor positional arguments (text layers need both).

    Private: `Layer._convert_input_args`, `Layer._allow_non_tensor_positional_args`.
    Fallback: none needed (setting unknown attributes is harmless; a Keras
    that drops them converts inputs, and the layer's own checks then name
    the problem).
    """
    layer._convert_input_args = False
    layer._allow_non_tensor_positional_args = True


def quantize_filter_matches(layer, filters):
    """Whether Keras's `Model.quantize(filters=...)` quantizes `layer`: a
    regex (or list of them) searched in its name, or a callable.

    Private: `keras.src.quantizers.utils.should_quantize_layer`. Fallback:
    the same rules, as Keras 3.15 documents them.
    """
    try:
        from keras.src.quantizers.utils import should_quantize_layer
    except ImportError:
        should_quantize_layer = None
    if should_quantize_layer is not None:
        return should_quantize_layer(layer, filters)
    if filters is None:
        return True
    if isinstance(filters, str):
        return bool(re.search(filters, layer.name))
    if isinstance(filters, (list, tuple)):
        return any(re.search(pattern, layer.name) for pattern in filters)
    return bool(filters(layer)) if callable(filters) else True


def dense_kernel_variable(layer):
    """The variable a Dense/EinsumDense layer stores its kernel in (int8
    values once quantized), not the LoRA-merged tensor `layer.kernel` returns.

    Private: `Dense._kernel`. Fallback: `layer.kernel`, which is the same
    variable whenever LoRA is off.
    """
    variable = getattr(layer, "_kernel", None)
    return variable if variable is not None else layer.kernel


def settle_dtype_policy(layer):
    """Gives a built `layer` that holds a `DTypePolicyMap` its own entry of
    that map as its policy (what `Model.quantize` leaves a layer with).

    Needed because Keras (3.15) reads `layer.dtype_policy.quantization_mode`,
    i.e. the map's default, when it saves a quantized `Dense` or `Embedding`
    (`_get_kernel_with_merged_lora`), and writes no scales: a model built
    from a quantized config could not be saved again.

    Private: `Layer._dtype_policy`. Fallback: the layer keeps the map (when
    the attribute is gone, Keras resolves maps by itself).
    """
    policy = getattr(layer, "_dtype_policy", None)
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        layer._dtype_policy = policy[layer.path]


def embeddings_variable(layer):
    """The variable a `keras.layers.Embedding` stores its table in (int8
    values once quantized), not the LoRA-merged tensor `layer.embeddings`
    returns.

    Private: `Embedding._embeddings`. Fallback: `layer.embeddings`, which is
    the same variable whenever LoRA is off.
    """
    variable = getattr(layer, "_embeddings", None)
    return variable if variable is not None else layer.embeddings


def save_weights_only(model, path, objects_to_skip=None):
    """Writes `model`'s weights to a `.weights.h5` file, leaving out
    `objects_to_skip` (e.g. the optimizer, or a task's backbone).

    Private: `keras.src.saving.saving_lib.save_weights_only(objects_to_skip=)`.
    Fallback: `model.save_weights`, which writes everything (a larger file
    that still loads); skipping a sub-model is then impossible and raises.
    """
    try:
        from keras.src.saving import saving_lib
    except ImportError:
        saving_lib = None
    if saving_lib is not None and hasattr(saving_lib, "save_weights_only"):
        saving_lib.save_weights_only(model, str(path), objects_to_skip=objects_to_skip or None)
        return
    optimizer = getattr(model, "optimizer", None)
    if any(obj is not optimizer for obj in objects_to_skip or []):
        raise RuntimeError(
            "This Keras release has no keras.src.saving.saving_lib.save_weights_only: saving part of "
            "a model is unavailable. Install a Keras 3 release from 3.4 on."
        )
    model.save_weights(str(path))


def load_weights_only(model, path, objects_to_skip=None):
    """Reads a `.weights.h5` file written by `save_weights_only` with the same
    `objects_to_skip`.

    Private: `keras.src.saving.saving_lib.load_weights_only(objects_to_skip=)`.
    Fallback, as `save_weights_only`'s: `model.load_weights` when nothing but
    the model's own optimizer is skipped (the optimizer's state is put back
    as it was, so it is skipped in effect); skipping a sub-model is then
    impossible and raises.
    """
    try:
        from keras.src.saving import saving_lib
    except ImportError:
        saving_lib = None
    if saving_lib is not None and hasattr(saving_lib, "load_weights_only"):
        saving_lib.load_weights_only(model, str(path), skip_mismatch=False, objects_to_skip=objects_to_skip or None)
        return
    optimizer = getattr(model, "optimizer", None)
    if any(obj is not optimizer for obj in objects_to_skip or []):
        raise RuntimeError(
            "This Keras release has no keras.src.saving.saving_lib.load_weights_only: loading part of "
            "a model is unavailable. Install a Keras 3 release from 3.4 on."
        )
    kept = [(v, keras.ops.convert_to_numpy(v)) for v in optimizer.variables] if optimizer is not None else []
    with warnings.catch_warnings():
        # Keras warns when the file's optimizer state (none, if saved without it) does not fit the model's.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        model.load_weights(str(path))
    for variable, value in kept:
        variable.assign(value)


_int8_hooks_reported = {"missing": False}


def keras_int8_hooks_available():
    """Whether `keras.layers.Dense` still has the int8 hooks bertzoo's
    `Dense` overrides: `_int8_build` (adds the smoothing and static-range
    weights) and `_int8_call` (routes inference to the fused oneDNN, the
    static-range and the PyTorch int8 kernels). Where a Keras release has
    renamed either, Keras no longer calls bertzoo's override, and those
    paths would be bypassed without a word: callers check this first. The
    first negative answer is logged (a warning).

    Private: `Dense._int8_build`, `Dense._int8_call`. Fallback: False, and
    callers use Keras's own int8 path (or refuse what needs the hooks).
    """
    missing = [hook for hook in ("_int8_build", "_int8_call") if not _dense_defines(hook)]
    if missing and not _int8_hooks_reported["missing"]:
        _int8_hooks_reported["missing"] = True
        logger.warning(
            "Keras %s's Dense has no %s: bertzoo's fused oneDNN, static-range and PyTorch int8 kernels are off, "
            "and int8 Dense layers run Keras's own int8 path.",
            keras.__version__,
            " or ".join(missing),
        )
    return not missing


def _dense_defines(name):
    """Whether `keras.layers.Dense` (or a class between it and `Layer`)
    defines method `name`: `Layer` has stubs of the quantization hooks that
    only raise, which a Dense without its own would inherit."""
    for cls in keras.layers.Dense.__mro__:
        if cls is keras.layers.Layer:
            return False
        if name in vars(cls):
            return callable(vars(cls)[name])
    return False


@contextlib.contextmanager
def fresh_layer_names():
    """Auto-names layers as in a fresh process (`dropout`, not `dropout_37`)
    inside the block, and restores the process's counters afterwards.

    Private: `keras.src.backend.common.global_state`'s `object_name_uids`.
    Fallback: names continue the process's numbering (arrays are unchanged).
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        yield
        return
    saved = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", saved)


# Nested and concurrent uses (two threads quantizing) share one patch; the
# last to leave restores `gc.collect`.
_gc_lock = threading.Lock()
_gc_patch = {"depth": 0}


@contextlib.contextmanager
def one_garbage_collection():
    """Runs one `gc.collect()` at the end of the block instead of one per
    call inside it.

    Keras's `Layer.__delattr__` runs a full `gc.collect()` each time a layer
    drops a variable, which `Layer.quantize` does for every float kernel:
    about 0.6 s each in a TensorFlow process, half a minute for a 6-layer
    BERT. This patches the process-wide `gc.collect` for the duration (the
    patch is counted, so nested and concurrent uses restore it once).
    """
    with _gc_lock:
        _gc_patch["depth"] += 1
        if _gc_patch["depth"] == 1:
            _gc_patch["collect"] = gc.collect
            gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        with _gc_lock:
            _gc_patch["depth"] -= 1
            if _gc_patch["depth"] == 0:
                gc.collect = _gc_patch.pop("collect")
                gc.collect()


class DeferredVariables:
    """The variables a `deferred_initialization` block created without a
    value, and `fill`, which gives them one.

    Example:
    ```python
    with private_api.deferred_initialization() as deferred:
        backbone = bertzoo.BertBackbone.from_config(config)
    deferred.fill(lambda: backbone.load_weights(path), backbone)
    ```
    """

    def __init__(self):
        self.variables = []

    def fill(self, load, model, expected=None):
        """Runs `load()`, in which assigning one of these variables gives it
        the assigned value (a copy) as its first; then every one `load` left
        takes its initializer's value (e.g. dropout seeds, which no weights
        file holds). `expected` (default:
        `model.weights`) are the weights `load` must write: should one be
        left empty (a Keras release writing it some other way than
        `assign`), it is initialized and `load()` runs once more, the
        ordinary way. On the torch backend `model`'s layers then register
        the new values with PyTorch (`retrack_variables`). On an error in
        `load` every variable still gets a value before it is raised: no
        model is left half-made.
        """
        pending = [v for v in self.variables if v._value is None]
        for variable in pending:
            variable.assign = _first_assignment(variable)
        try:
            load()
        finally:
            for variable in pending:
                del variable.assign
            unfilled = [v for v in pending if v._value is None]
            for variable in unfilled:
                with _creation_scope(variable):
                    variable._deferred_initialize()
        must = {id(v) for v in (model.weights if expected is None else expected)}
        if any(id(v) in must for v in unfilled):
            logger.debug("%d weights were loaded without `assign`; loading them again.", len(unfilled))
            load()
        if pending:
            retrack_variables(model)


def _first_assignment(variable):
    """`variable.assign` for a variable that has no value yet: a copy of the
    value becomes its first (Keras's `assign` copies into an existing one;
    the copy keeps the two from sharing memory, as a torch tensor or a
    TensorFlow variable given as the value otherwise would)."""
    original = type(variable).assign

    def assign(value):
        if variable._value is not None or in_stateless_scope():
            return original(variable, value)
        if isinstance(value, keras.Variable):
            value = value.value
        value = variable._convert_to_tensor(value, dtype=variable._dtype)
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"Cannot assign a value of shape {tuple(value.shape)} to the variable {variable.path} of shape "
                f"{tuple(variable.shape)}."
            )
        with _creation_scope(variable):
            variable._initialize(keras.ops.copy(value))
        variable._initializer = None
        return value

    return assign


def _creation_scope(variable):
    """Where TensorFlow would have created `variable` in its layer's build:
    eagerly (`init_scope`, even when a load runs inside a traced function)
    and under its layer's name scope, so that the `tf.Variable`'s name is
    the Keras path (`attention_0/key/bias:0`, as a SavedModel lists it, not
    `bias:0`). Nothing on the other backends."""
    stack = contextlib.ExitStack()
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        stack.enter_context(tf.init_scope())
        parent = variable.path.rpartition("/")[0]
        if parent:
            stack.enter_context(tf.name_scope(parent + "/"))
    return stack


@contextlib.contextmanager
def deferred_initialization(enabled=True):
    """Builds the layers and models created inside the block without
    computing their variables' initial values, for a model whose weights a
    file is about to overwrite: drawing BERT-base's 110M random weights
    takes about 2.5 s on 2 CPU cores. Yields a `DeferredVariables`; call its
    `fill` with the loading function after the block. Variables created
    outside (a new task head) initialize as usual.

    Public: `keras.StatelessScope(initialize_variables=False)`, in which
    Keras registers a variable and its initializer without a value. Private:
    the registry (`global_state`'s "uninitialized_variables", taken back
    from Keras so nothing else initializes these), `KerasVariable._value`,
    `_initialize` and `_deferred_initialize`. Fallback: where any of these
    is missing, variables initialize as usual and `fill` just loads. With
    `enabled=False` the block changes nothing either, nor on the torch
    backend: there a layer built outside the block (a task around a
    deferred backbone) registers its variables with PyTorch when built, and
    a deferred variable has no value yet: Keras would register a throwaway
    placeholder (and refuse an integer one, a dropout seed's, as a
    parameter that "requires gradients").
    """
    try:
        from keras.src.backend.common import global_state
        from keras.src.backend.common.variables import Variable
    except ImportError:
        global_state = Variable = None
    deferred = DeferredVariables()
    usable = global_state is not None and all(
        hasattr(Variable, name) for name in ("_initialize", "_deferred_initialize", "_convert_to_tensor")
    )
    nnx = getattr(keras.config, "is_nnx_enabled", lambda: False)()  # Flax's variables keep attributes apart.
    if not (enabled and usable) or nnx or in_stateless_scope() or keras.backend.backend() == "torch":
        yield deferred
        return
    before = list(global_state.get_global_attribute("uninitialized_variables") or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield deferred
    finally:
        registered = global_state.get_global_attribute("uninitialized_variables") or []
        known = {id(v) for v in before}
        deferred.variables = [v for v in registered if id(v) not in known]
        global_state.set_global_attribute("uninitialized_variables", before)


def retrack_variables(model):
    """After layers were quantized one by one (not by `Model.quantize`),
    what `Model.quantize` does at its end: on the torch backend, each layer
    re-registers its variables with PyTorch (`Layer._track_variables`), so
    the dropped float kernels leave `model.parameters()`. A no-op elsewhere,
    and where Keras no longer has the method.
    """
    if keras.backend.backend() != "torch":
        return
    for layer in flatten_layers(model):
        track = getattr(layer, "_track_variables", None)
        if track is not None:
            track()


# --- Keras: optimizers and compiled state ----------------------------------


def learning_rate_schedule(optimizer):
    """The `LearningRateSchedule` an optimizer was built with, or None.

    Private: `Optimizer._learning_rate` (the public `learning_rate` property
    evaluates the schedule at the current step). A `LossScaleOptimizer`'s
    is its inner optimizer's.
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return schedule
    return None


def adam_moments(optimizer, variable):
    """`(first moment, second moment)` slot variables Adam keeps for
    `variable`, or None when this Keras release stores them otherwise.

    Private: `Adam._momentums`, `Adam._velocities`, `Optimizer._get_variable_index`.
    """
    try:
        index = optimizer._get_variable_index(variable)
        return optimizer._momentums[index], optimizer._velocities[index]
    except (AttributeError, IndexError, KeyError):
        return None


def _override_optimizer_method(hook, routed, fallback_log):
    """A class decorator replacing Keras optimizer method `hook` with
    `routed(optimizer, keras_method, *args)` (`keras_method`: Keras's own,
    bound), or, where this Keras has no such method, leaving the class as it
    is and calling `fallback_log(hook, class_name)` once."""

    def decorate(optimizer_class):
        if not callable(getattr(keras.optimizers.Optimizer, hook, None)):
            fallback_log(hook, optimizer_class.__name__)
            return optimizer_class

        def method(self, *args):
            return routed(self, getattr(super(optimizer_class, self), hook), *args)

        setattr(optimizer_class, hook, method)
        return optimizer_class

    return decorate


def route_gradient_application(apply_step):
    """A class decorator for Keras optimizers: each step's clipping, weight
    decay and update go through `apply_step(optimizer, grads, variables)`,
    which returns False to hand the step back to Keras's own code.

    Private: `BaseOptimizer._backend_apply_gradients`, the per-step hook
    Keras's `apply` calls after unscaling the gradients and before counting
    the iteration. Fallback: with a Keras that has no such hook the class is
    left unchanged (Keras's own clipping, decay and update), logged once.

    Example:
    ```python
    @route_gradient_application(my_step)
    class MyAdamW(keras.optimizers.AdamW): ...
    ```
    """

    def routed(optimizer, keras_step, grads, variables):
        if not apply_step(optimizer, grads, variables):
            keras_step(grads, variables)

    return _override_optimizer_method(
        "_backend_apply_gradients",
        routed,
        lambda hook, name: logger.info("Keras has no Optimizer.%s: %s keeps Keras's own step.", hook, name),
    )


def route_gradient_clipping(clip):
    """A class decorator for Keras optimizers: each step's gradient clipping
    goes through `clip(optimizer, grads)`, which returns the clipped
    gradients, or None to hand the clipping back to Keras's own code.

    Private: `BaseOptimizer._clip_gradients`, which Keras's step calls on the
    gradients (per replica, under a `tf.distribute` strategy) before the
    weight decay and the update. Fallback: with a Keras that has no such
    method the class is left unchanged (Keras's own clipping, per replica
    under a strategy: a warning, since results then differ there).

    Example:
    ```python
    @route_gradient_clipping(my_clip)
    class MyAdamW(keras.optimizers.AdamW): ...
    ```
    """

    def routed(optimizer, keras_clip, grads):
        clipped = clip(optimizer, grads)
        return keras_clip(grads) if clipped is None else clipped

    return _override_optimizer_method(
        "_clip_gradients",
        routed,
        lambda hook, name: logger.warning(
            "Keras has no Optimizer.%s: %s keeps Keras's own clipping (per replica under a tf.distribute strategy).",
            hook,
            name,
        ),
    )


def in_stateless_scope():
    """Whether Keras is inside a `keras.StatelessScope` (as in a JAX train
    step), where assigning a variable records the new value instead of
    writing it.

    Private: `keras.src.backend.common.stateless_scope.in_stateless_scope`.
    Fallback: False.
    """
    try:
        from keras.src.backend.common.stateless_scope import in_stateless_scope as active
    except ImportError:
        return False
    return bool(active())


def jax_variables_held_by_trainer(variables):
    """Whether Keras's JAX trainer holds the values of a model's `variables`
    (during `fit`/`evaluate`/`predict` it moves them out of the variables to
    save memory; the model's `jax_state_sync()` puts them back).

    Private: `KerasVariable._value` (None while moved out). Fallback: False
    (the variables are read as they are).
    """
    return bool(variables) and getattr(variables[0], "_value", 0) is None


def jax_variable_values(variables):
    """`[v.value for v in variables]`, without the public property's
    per-read checks where they cannot change the answer (about 1 us each;
    BERT-base has 236 variables read per `predict_on_batch`): outside a
    `keras.StatelessScope` or an autocast scope each variable's stored array
    is read directly; inside one, `.value` (the scope's value, or a cast).
    A value Keras's JAX trainer has moved out comes back as None
    (`jax_variables_held_by_trainer`, `jax_state_sync()`).

    Private: `KerasVariable._value`. Fallback: `.value`, for a variable
    without the attribute.
    """
    if in_variable_scope():
        return [v.value for v in variables]
    try:
        return [v._value for v in variables]
    except AttributeError:
        return [v.value for v in variables]


def stored_value(variable):
    """`variable`'s value in the dtype it is stored in, also inside a layer's
    autocast scope, where reading it gives the compute dtype (a
    `mixed_bfloat16` layer's float32 kernel rounded to bfloat16).

    Private: `keras.src.backend.common.variables.AutocastScope`. Fallback:
    the autocast value cast to float32, the variable dtype of every mixed
    policy (its rounding kept; inside the scope `variable.dtype` names the
    compute dtype too).
    """
    if not isinstance(variable, keras.Variable):
        return variable  # A tensor (e.g. a LoRA-merged kernel): nothing is cast on reading it.
    try:
        from keras.src.backend.common.variables import AutocastScope
    except ImportError:
        return keras.ops.cast(variable.value, "float32")
    with AutocastScope(None):
        return keras.ops.convert_to_tensor(variable.value)


def in_variable_scope():
    """Whether reading a variable's `.value` could give something other than
    what it stores: inside a `keras.StatelessScope` or an autocast scope.

    Private: `keras.src.backend.common.variables.get_autocast_scope`, beside
    `in_stateless_scope`. Fallback: True (callers read `.value`).
    """
    try:
        from keras.src.backend.common.variables import get_autocast_scope
    except ImportError:
        return True
    return in_stateless_scope() or get_autocast_scope() is not None


def carries_jax_step_values(trainer, variables):
    """Whether `carry_jax_step_values(trainer, variables, ...)` was done."""
    return tuple(id(v) for v in variables) in getattr(trainer, "_bertzoo_carried_step_values", set())


def carry_jax_step_values(trainer, variables, values_scope):
    """Threads `variables` (non-trainable variables of `trainer`) through
    `trainer`'s JAX train step: the step runs inside `values_scope(values)`,
    a context manager given `{id(variable): traced value}` that code in the
    step reads and updates, and returns the updated values in its state.

    Keras's JAX train step is stateless: it gets and returns the variables'
    values, and its optimizer step (`stateless_apply`, where variable
    constraints run) maps only the trainable and optimizer variables, so a
    constraint can neither read nor assign any other variable there.

    Private: the step's `state`, `(trainable, non_trainable, optimizer,
    metrics)` values in the order of the trainer's variable lists, and
    `train_function`, reset so the next `fit` traces the new step. Fallback:
    a state of another shape raises a `RuntimeError` naming the Keras
    version. Wrapping the same trainer for the same variables twice is a
    no-op.

    Example:
    ```python
    carry_jax_step_values(model, [counter], my_scope)  # my_scope(values): a context manager
    ```
    """
    key = tuple(id(v) for v in variables)
    carried = getattr(trainer, "_bertzoo_carried_step_values", set())
    if key in carried:
        return
    original = trainer.train_step

    def train_step(state, data):
        if not (isinstance(state, (tuple, list)) and len(state) == 4):
            raise RuntimeError(
                f"Keras {keras.__version__}'s JAX train step state is not (trainable, non_trainable, "
                "optimizer, metrics): bertzoo cannot carry its variables through it."
            )
        position = {id(v): i for i, v in enumerate(trainer.non_trainable_variables)}
        missing = [v.path for v in variables if id(v) not in position]
        if missing:
            raise ValueError(f"{missing} are not non-trainable variables of {trainer.name!r}.")
        indices = [position[id(v)] for v in variables]
        values = {id(v): state[1][i] for v, i in zip(variables, indices)}
        with values_scope(values):
            logs, (trainable, non_trainable, optimizer, metrics) = original(state, data)
        non_trainable = list(non_trainable)
        for variable, i in zip(variables, indices):
            non_trainable[i] = keras.ops.cast(values[id(variable)], non_trainable[i].dtype)
        return logs, (trainable, non_trainable, optimizer, metrics)

    trainer.train_step = train_step
    trainer._bertzoo_carried_step_values = carried | {key}
    trainer.train_function = None


def weight_decay_applies(optimizer, variable):
    """Whether `optimizer` decays `variable` (its `exclude_from_weight_decay`
    settings), or None when this Keras release cannot say.

    Private: `BaseOptimizer._use_weight_decay`.
    """
    try:
        return bool(optimizer._use_weight_decay(variable))
    except AttributeError:
        return None


def compiled_metrics_container(model):
    """The metrics container `compile(metrics=...)` built, or None.

    Private: `Trainer._compile_metrics`.
    """
    return getattr(model, "_compile_metrics", None)


# --- TensorFlow: graph context and ops -------------------------------------


def tensorflow_onednn_enabled():
    """Whether TensorFlow was built with oneDNN and runs with it.

    Private: `tensorflow.python.util._pywrap_util_port.IsMklEnabled`.
    Fallback: False (callers then skip oneDNN-only kernels).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False


def tensorflow_op_def(op_type):
    """The registered `OpDef` of a TensorFlow op, or None when the op is not
    registered (or the registry moved).

    Private: `tensorflow.python.framework.op_def_registry.get`.
    """
    try:
        from tensorflow.python.framework import op_def_registry

        return op_def_registry.get(op_type)
    except (ImportError, AttributeError):
        return None


def tf_text_regex_split_op():
    """tf-text's raw `RegexSplitWithOffsets` op: `(strings, delim_pattern,
    keep_pattern) -> (pieces, starts, ends, row_splits)` over a flat string
    tensor, or None.

    Private: `tensorflow_text.python.ops.regex_split_ops.gen_regex_split_ops`.
    Fallback: None (callers use the public `tf_text.regex_split_with_offsets`,
    whose ragged-tensor validation adds graph branches that every tf.data
    iterator instantiates again).
    """
    try:
        from tensorflow_text.python.ops import regex_split_ops

        return regex_split_ops.gen_regex_split_ops.regex_split_with_offsets
    except (ImportError, AttributeError):
        return None


def gradient_tape_active():
    """Whether a `tf.GradientTape` may be recording right now.

    Private: `tensorflow.python.eager.record.could_possibly_record`.
    Fallback: True (callers then avoid kernels that have no gradient).
    """
    try:
        from tensorflow.python.eager import record

        return bool(record.could_possibly_record())
    except (ImportError, AttributeError):
        return True


@contextlib.contextmanager
def gradient_recording_paused():
    """Within this context no `tf.GradientTape` records (TensorFlow; other
    backends run the block as it is), e.g. for a frozen teacher's forward
    pass inside a training step: it then takes the inference kernels.

    Private: `tensorflow.python.eager.record.stop_recording`. Fallback:
    tapes keep recording (the block is correct either way, only slower).
    """
    stop_recording = None
    if keras.backend.backend() == "tensorflow":
        try:
            from tensorflow.python.eager import record

            stop_recording = record.stop_recording
        except (ImportError, AttributeError):
            pass
    with stop_recording() if stop_recording is not None else contextlib.nullcontext():
        yield


def in_xla_context():
    """Whether the graph being traced is compiled by XLA (`jit_compile=True`).

    Private: `tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`.
    Fallback: True (callers then keep to ops XLA compiles).
    """
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):
        return True


def read_saved_model_proto(path):
    """The `SavedModel` protocol buffer of the SavedModel directory `path`
    (its `saved_model.pb`: graphs, functions, signature definitions).

    Private: `tensorflow.core.protobuf.saved_model_pb2`. There is no public
    fallback (`tf.saved_model.load` gives functions, not the graph's ops or
    the signatures as saved); if the module moves this raises ImportError,
    and exports fail before anything is written at their target.
    """
    from pathlib import Path

    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((Path(path).expanduser() / "saved_model.pb").read_bytes())
    return saved_model


def unexposed_op_runner_available():
    """Whether `run_unexposed_op` can import the TensorFlow internals it
    uses; callers that would route layers through it check this first, so a
    TensorFlow release that moves them turns the fast path off instead of
    breaking every call."""
    try:
        from tensorflow.core.framework import attr_value_pb2  # noqa: F401
        from tensorflow.python.eager import context  # noqa: F401
        from tensorflow.python.eager import execute  # noqa: F401
    except ImportError:
        return False
    return hasattr(execute, "execute") and hasattr(context, "context")


def run_unexposed_op(op_type, inputs, output_dtype, attrs):
    """Runs a registered TensorFlow op that `tf.raw_ops` does not expose (an
    internal, underscore-named one), eagerly or in the graph being traced.

    Private: `tensorflow.python.eager.execute`, `context`, `attr_value_pb2`
    and `Graph.create_op`. There is no fallback: callers check the op with
    `tensorflow_op_def` and these imports with `unexposed_op_runner_available`
    first (see `bertzoo.utils.onednn.fused_int8_status`).
    """
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.eager import context
    from tensorflow.python.eager import execute

    def enum(value):
        return value.as_datatype_enum if isinstance(value, tf.DType) else value

    if tf.executing_eagerly():
        flat = []
        for name, value in attrs.items():
            flat += [name, [enum(v) for v in value] if isinstance(value, list) else enum(value)]
        (output,) = execute.execute(op_type, 1, inputs=inputs, attrs=tuple(flat), ctx=context.context())
        return output

    def proto(value):
        if isinstance(value, bool):
            return attr_value_pb2.AttrValue(b=value)
        if isinstance(value, str):
            return attr_value_pb2.AttrValue(s=value.encode())
        if isinstance(value, float):
            return attr_value_pb2.AttrValue(f=value)
        if isinstance(value, tf.DType):
            return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
        if value and isinstance(value[0], str):
            return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=[v.encode() for v in value]))
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=[enum(v) for v in value]))

    graph = tf.compat.v1.get_default_graph()
    op = graph.create_op(
        op_type,
        inputs,
        dtypes=[output_dtype],
        name=op_type.lstrip("_"),
        attrs={name: proto(value) for name, value in attrs.items()},
    )
    return op.outputs[0]


# --- PyTorch (Keras's torch backend) ----------------------------------------


def torch_int8_matmul():
    """PyTorch's int8 x int8 -> int32 matmul for 2-D tensors on the CPU
    (oneDNN's VNNI/AMX kernels), or None where it is unavailable.

    Keras's torch backend uses it on CUDA only; on the CPU it multiplies
    int8 tensors as int32 with a generic kernel (about 15x slower here).
    Private: `torch._int_mm`. No fallback: None means "multiply with
    `keras.ops.matmul`, as Keras does"; a tensor it refuses raises
    `RuntimeError`, which callers take the same way.
    """
    import torch

    function = getattr(torch, "_int_mm", None)
    return function if callable(function) else None
