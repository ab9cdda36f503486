"""Compiled on construction with BERT's fine-tuning defaults, XLA decided lazily.

bertzoo's task models and trainers are usable as soon as they are built,
as keras-hub's tasks are: `BertClassifier.from_preset("base").fit(texts,
labels)` needs no `compile()` call. Construction compiles with the defaults
(`bert_optimizer()`, the task's loss and metrics); a user's own
`compile(...)` replaces them.

`jit_compile="auto"` is resolved when Keras first builds a train, test or
predict function, not at `compile()`: the choice may be measured on the
model (see `bertzoo.utils.device.resolve_jit_compile`), which should only
cost time for models that actually run. Backbones are not compiled on
construction, but decide "auto" the same way (`MeasuredJitCompileMixin`).
"""

import functools
import inspect
import threading
import weakref

import keras

from bertzoo.utils import fast_path
from bertzoo.utils import private_api
from bertzoo.utils.device import resolve_jit_compile

_constructing = threading.local()
_NEVER_COMPILED = object()


class MeasuredJitCompileMixin:
    """`jit_compile="auto"` decided when Keras first builds a step, for that
    step's mode only. Mix in before the Keras model class; the subclass's
    `compile` passes `jit_compile` through `_provisional_jit_compile`. A
    model never compiled counts as "auto": its `predict` takes the measured
    choice, where Keras's own "auto" never uses XLA on a CPU with TensorFlow."""

    _AUTO_JIT_ATTRIBUTE = "_bertzoo_auto_jit_compile"

    def _provisional_jit_compile(self, jit_compile, model):
        """What to hand Keras's `compile` now: "auto" is recorded and
        resolved later (`False` until then), and forgets the pin of an
        earlier `compile(jit_compile=True/False)`; `True`/`False` are
        checked against the strategy now."""
        auto = jit_compile == "auto"
        # A weak reference: Keras's weight loading walks every attribute,
        # and the model is often `self`.
        object.__setattr__(self, self._AUTO_JIT_ATTRIBUTE, weakref.ref(model) if auto else None)
        if auto:
            if model is self:  # Else `explain_fast_path` would report the old pin until a step decides.
                fast_path.forget_pin(model)
            return False
        # A trainer's (a Distiller's) pin is its own step's, not its student's `predict`.
        strategy = getattr(self, "distribute_strategy", None)
        return resolve_jit_compile(jit_compile, model, strategy, record_pin=model is self)

    def compile_pin(self):
        """The `jit_compile` (True/False) a user's `compile()` pinned, or
        None when the model decides ("auto", or not compiled)."""
        if not self.compiled or getattr(self, self._AUTO_JIT_ATTRIBUTE, None) is not None:
            return None
        return self.jit_compile if isinstance(self.jit_compile, bool) else None

    def _auto_jit_model(self):
        """The model whose measured choice "auto" takes (this one, or a
        trainer's student), or None where `jit_compile` is pinned."""
        reference = getattr(self, self._AUTO_JIT_ATTRIBUTE, _NEVER_COMPILED)
        if reference is _NEVER_COMPILED:
            return None if self.compiled else self
        return reference() if reference is not None else None

    def _decide_jit_compile(self, mode):
        """Sets `self.jit_compile` to the choice for `mode` ("train", "test"
        or "predict") when the user's compile said "auto" (or there was none)."""
        model = self._auto_jit_model()
        if model is not None and not self.run_eagerly:  # Eager steps compile nothing: nothing to choose.
            # Only this mode is measured: a model that only predicts never
            # pays for timing training steps.
            chosen = resolve_jit_compile("auto", model, getattr(self, "distribute_strategy", None), mode=mode)
            self.jit_compile = fast_path.jit_compile_for(model, mode, default=chosen)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras's in-place `Model.quantize`, without the text layers of a
        task's preprocessor (they hold no weights; Keras refused them as
        never built), and deciding `jit_compile="auto"` again at the next
        step, for the quantized weights. `bertzoo.quantize(model, mode)`
        returns a quantized copy instead, with calibration (SmoothQuant,
        static input ranges) and weight-only options.

        Example:
        ```python
        model = bertzoo.BertClassifier.from_preset("tiny")
        model.quantize("int8")
        model.predict(["a fine film"])
        ```
        """
        preprocessor = getattr(self, "preprocessor", None)
        text_layers = set()
        if preprocessor is not None:
            text_layers = {id(layer) for layer in private_api.flatten_layers(preprocessor, include_self=True)}

        def network_layers(layer):
            return id(layer) not in text_layers and private_api.quantize_filter_matches(layer, filters)

        # Keras collects garbage once per float kernel dropped: once in all (seconds for BERT-base).
        with private_api.one_garbage_collection():
            super().quantize(mode, config=config, filters=network_layers, **kwargs)
        fast_path.forget_choice(self)

    def compile_from_config(self, config):
        # Keras skips (with a warning) restoring the compile state of models
        # that override `compile`; ours only fills in defaults and records
        # "auto", so restore it.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_compile_config(self):
        # Keras would save the provisional value; a reloaded model decides
        # again where it runs.
        config = super().get_compile_config()
        if config is not None and getattr(self, self._AUTO_JIT_ATTRIBUTE, None) is not None:
            config = dict(config, jit_compile="auto")
        return config

    # Keras calls these on every fit/evaluate/predict and reuses the function
    # it built: decide only when one is about to be built.
    def make_train_function(self, force=False):
        if force or getattr(self, "train_function", None) is None:
            self._decide_jit_compile("train")
        return super().make_train_function(force)

    def make_test_function(self, force=False):
        if force or getattr(self, "test_function", None) is None:
            self._decide_jit_compile("test")
        return super().make_test_function(force)

    def make_predict_function(self, force=False):
        if force or getattr(self, "predict_function", None) is None:
            self._decide_jit_compile("predict")
        return super().make_predict_function(force)


class DefaultCompileMixin(MeasuredJitCompileMixin):
    """Compiled on construction, with "auto" everywhere. Mix in before the
    Keras model class. Subclasses implement `_default_compile()` (a plain
    `self.compile()`) and pass `jit_compile` through
    `_provisional_jit_compile`."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_compiles_after", False):
            return

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            # Only the outermost constructor of a subclass chain compiles,
            # once every attribute the defaults read is set.
            depth = getattr(_constructing, "depth", 0)
            _constructing.depth = depth + 1
            try:
                init(self, *args, **kwargs)
            finally:
                _constructing.depth = depth
            if depth == 0 and not self.compiled:
                self._default_compile()

        # The real arguments for introspection: Keras's `clone_model` takes a
        # `(*args, **kwargs)` constructor for Functional's `(inputs, outputs)`.
        __init__.__signature__ = inspect.signature(init)
        __init__._compiles_after = True
        cls.__init__ = __init__

    def _default_compile(self):
        self.compile()
