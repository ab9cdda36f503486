"""One test per private Keras/TensorFlow symbol bertzoo uses.

Each wrapper in `bertzoo.utils.private_api` is checked against the installed
Keras and TensorFlow, so a release that moves a symbol fails here, by name,
and where a wrapper has a public fallback the fallback is checked too.
"""

import contextlib
import gc
import importlib
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.utils import private_api


class Wrapper(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(3, name="inner")
        self.pair = [keras.layers.Dense(2, name="first"), keras.layers.Dense(2, name="second")]

    def call(self, x):
        return self.pair[1](self.pair[0](self.inner(x)))


def small_model():
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, name="head")(Wrapper(name="wrapper")(inputs))
    return keras.Model(inputs, outputs)


def test_flatten_layers_finds_nested_layers_and_the_fallback_agrees():
    model = small_model()
    names = [layer.name for layer in private_api.flatten_layers(model, include_self=False)]
    assert {"wrapper", "inner", "first", "second", "head"} <= set(names)
    assert len(names) == len(set(names))
    fallback = [layer.name for layer in private_api._walk_layers(model, include_self=False, recursive=True)]
    assert set(fallback) == set(names)
    top = [layer.name for layer in private_api._walk_layers(model, include_self=False, recursive=False)]
    assert "inner" not in top and "wrapper" in top


def test_dense_kernel_variable_is_the_stored_variable():
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    variable = private_api.dense_kernel_variable(layer)
    assert isinstance(variable, keras.Variable) and variable is layer.kernel
    layer.quantize("int8")
    assert keras.backend.standardize_dtype(private_api.dense_kernel_variable(layer).dtype) == "int8"


def test_save_and_load_weights_only_skip_the_named_objects(tmp_path):
    model = small_model()
    model(np.ones((1, 4), "float32"))
    wrapper = model.get_layer("wrapper")
    path = tmp_path / "head.weights.h5"
    private_api.save_weights_only(model, path, objects_to_skip=[wrapper])
    everything = tmp_path / "all.weights.h5"
    private_api.save_weights_only(model, everything)
    assert path.stat().st_size < everything.stat().st_size

    other = small_model()
    other(np.ones((1, 4), "float32"))
    before = [w.copy() for w in other.get_layer("wrapper").get_weights()]
    private_api.load_weights_only(other, path, objects_to_skip=[other.get_layer("wrapper")])
    np.testing.assert_array_equal(other.get_layer("head").get_weights()[0], model.get_layer("head").get_weights()[0])
    for a, b in zip(before, other.get_layer("wrapper").get_weights()):
        np.testing.assert_array_equal(a, b)  # Skipped: untouched.


def test_fresh_layer_names_numbers_from_zero_and_restores_the_counter():
    keras.layers.Dropout(0.1)
    keras.layers.Dropout(0.1)
    with private_api.fresh_layer_names():
        assert keras.layers.Dropout(0.1).name == "dropout"
    assert keras.layers.Dropout(0.1).name not in ("dropout", "dropout_1")


def test_one_garbage_collection_patches_gc_collect_only_inside():
    original = gc.collect
    with private_api.one_garbage_collection():
        assert gc.collect is not original and gc.collect() == 0
    assert gc.collect is original


def test_learning_rate_schedule_of_an_optimizer():
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5)
    assert private_api.learning_rate_schedule(keras.optimizers.Adam(schedule)) is schedule
    assert private_api.learning_rate_schedule(keras.optimizers.Adam(1e-3)) is None


def test_adam_moments_are_the_slot_variables_of_a_variable():
    variable = keras.Variable(np.ones((2, 3), "float32"))
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build([variable])
    m, v = private_api.adam_moments(optimizer, variable)
    assert tuple(m.shape) == tuple(v.shape) == (2, 3)
    optimizer.apply_gradients([(np.ones((2, 3), "float32"), variable)])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(m), 0.1, rtol=1e-5)  # (1 - beta_1) * gradient.
    assert private_api.adam_moments(keras.optimizers.SGD(0.1), variable) is None


def test_route_gradient_application_runs_the_step_or_hands_it_back():
    steps = []

    def step(optimizer, grads, variables):
        steps.append(len(variables))
        return optimizer.fused

    @private_api.route_gradient_application(step)
    class Routed(keras.optimizers.SGD):
        fused = True

    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = Routed(0.5)
    optimizer.apply_gradients([(np.ones(3, "float32"), variable)])
    np.testing.assert_allclose(variable.numpy(), 1.0)  # The routed step did nothing.
    Routed.fused = False
    optimizer.apply_gradients([(np.ones(3, "float32"), variable)])
    np.testing.assert_allclose(variable.numpy(), 0.5)  # Keras's own SGD step.
    assert steps == [1, 1]
    assert int(optimizer.iterations.numpy()) == 2


def test_route_gradient_clipping_clips_or_hands_it_back():
    def clip(optimizer, grads):
        return [g * 0.0 for g in grads] if optimizer.mine else None

    @private_api.route_gradient_clipping(clip)
    class Routed(keras.optimizers.SGD):
        mine = True

    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = Routed(0.5, global_clipnorm=1.0)
    optimizer.apply_gradients([(np.full(3, 4.0, "float32"), variable)])
    np.testing.assert_allclose(variable.numpy(), 1.0)  # The routed clipping zeroed the gradient.
    Routed.mine = False
    optimizer.apply_gradients([(np.full(3, 4.0, "float32"), variable)])
    # Keras's clipping: the gradient (norm 4 * sqrt(3)) scaled to norm 1.
    np.testing.assert_allclose(variable.numpy(), 1.0 - 0.5 / np.sqrt(3), rtol=1e-6)


def test_in_stateless_scope_only_inside_one():
    assert not private_api.in_stateless_scope()
    with keras.StatelessScope():
        assert private_api.in_stateless_scope()


def test_jax_variable_values_are_what_value_reads_with_a_fallback():
    variables = [keras.Variable(np.arange(3.0), name="a"), keras.Variable(2.0, name="b")]
    assert not private_api.in_variable_scope()
    for value, variable in zip(private_api.jax_variable_values(variables), variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(value), keras.ops.convert_to_numpy(variable.value))
    with keras.StatelessScope(state_mapping=[(variables[1], np.float32(7.0))]):
        # `.value` reads the scope there, and so do they.
        assert private_api.in_variable_scope()
        assert float(keras.ops.convert_to_numpy(private_api.jax_variable_values(variables)[1])) == 7.0

    class PublicOnly:  # A variable without the private attribute: read through `.value`.
        value = np.float32(5.0)

    assert private_api.jax_variable_values([PublicOnly()]) == [5.0]
    assert private_api.jax_variables_held_by_trainer(variables) is False


def test_carry_jax_step_values_threads_the_values_through_the_step_state():
    # A stand-in for Keras's JAX trainer: train_step(state, data) -> (logs, state),
    # state = (trainable, non_trainable, optimizer, metrics) values.
    scopes = []

    def scope(values):
        scopes.append(values)
        return contextlib.nullcontext()

    class Trainer:
        name = "trainer"
        non_trainable_variables = [keras.Variable(1.0, name="seed"), keras.Variable(10.0, name="counter")]
        train_function = "compiled"

        def train_step(self, state, data):
            # Adds `data` to the counter through the values the scope got.
            values = scopes[-1]
            values[id(counter)] = values[id(counter)] + data
            return {"loss": 0.0}, state

    trainer = Trainer()
    counter = trainer.non_trainable_variables[1]
    private_api.carry_jax_step_values(trainer, [counter], scope)
    assert trainer.train_function is None  # The next fit traces the new step.
    state = ([], [np.float32(1.0), np.float32(10.0)], [], [])
    logs, (_, non_trainable, _, _) = trainer.train_step(state, 5.0)
    assert logs == {"loss": 0.0} and [float(v) for v in non_trainable] == [1.0, 15.0]
    step = trainer.train_step
    private_api.carry_jax_step_values(trainer, [counter], scope)  # The same variables: no second wrapper.
    assert trainer.train_step is step
    with pytest.raises(RuntimeError, match="JAX train step state"):
        trainer.train_step((1, 2), 0.0)
    private_api.carry_jax_step_values(trainer, [keras.Variable(0.0, name="stray")], scope)
    with pytest.raises(ValueError, match="not non-trainable variables"):
        trainer.train_step(state, 0.0)


def test_weight_decay_applies_follows_the_exclusions():
    kernel, bias = keras.Variable(np.ones((2, 2), "float32"), name="kernel"), keras.Variable(np.ones(2), name="bias")
    optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build([kernel, bias])
    assert private_api.weight_decay_applies(optimizer, kernel) is True
    assert private_api.weight_decay_applies(optimizer, bias) is False


def test_compiled_metrics_container_exists_after_compile():
    model = small_model()
    assert private_api.compiled_metrics_container(model) is None
    model.compile(loss="mse", metrics=["mae"])
    assert private_api.compiled_metrics_container(model) is not None


def test_tensorflow_onednn_enabled_is_a_bool():
    assert isinstance(private_api.tensorflow_onednn_enabled(), bool)


def test_tensorflow_op_def_of_registered_and_unknown_ops():
    assert private_api.tensorflow_op_def("MatMul").name == "MatMul"
    assert private_api.tensorflow_op_def("NoSuchOpAnywhere") is None


def test_gradient_tape_active_only_under_a_tape():
    assert private_api.gradient_tape_active() is False
    with tf.GradientTape():
        assert private_api.gradient_tape_active() is True


def test_gradient_recording_paused_hides_the_block_from_tapes():
    x = tf.constant(2.0)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        with private_api.gradient_recording_paused():
            assert private_api.gradient_tape_active() is False
            unrecorded = x * x
        recorded = x * x
    assert tape.gradient(unrecorded, x) is None
    assert float(tape.gradient(recorded, x)) == 4.0


def test_in_xla_context_only_under_jit_compile():
    seen = {}

    def probe(x, key):
        seen[key] = private_api.in_xla_context()
        return x + 1

    tf.function(lambda x: probe(x, "graph"))(tf.constant(1.0))
    tf.function(lambda x: probe(x, "xla"), jit_compile=True)(tf.constant(1.0))
    assert seen == {"graph": False, "xla": True}
    assert private_api.in_xla_context() is False  # Eager.


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "graph"])
def test_run_unexposed_op_runs_an_op_by_name(traced):
    a, b = tf.constant([1.0, 2.0]), tf.constant([3.0, 5.0])

    def run(x, y):
        return private_api.run_unexposed_op("AddV2", [x, y], tf.float32, {"T": tf.float32})

    result = tf.function(run)(a, b) if traced else run(a, b)
    np.testing.assert_array_equal(result.numpy(), [4.0, 7.0])


def test_read_saved_model_proto_lists_signatures_and_ops(tmp_path):
    module = tf.Module()
    module.double = tf.function(lambda x: 2.0 * x, input_signature=[tf.TensorSpec((None,), tf.float32)])
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.double})
    proto = private_api.read_saved_model_proto(tmp_path)
    graph = proto.meta_graphs[0]
    assert "serving_default" in graph.signature_def
    ops = {node.op for function in graph.graph_def.library.function for node in function.node_def}
    assert "Mul" in ops


def test_settle_dtype_policy_gives_a_layer_its_own_map_entry():
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
    policy_map["head"] = keras.dtype_policies.get("int8_from_float32")
    inputs = keras.Input((4,))
    layer = keras.layers.Dense(3, name="head", dtype=policy_map)
    keras.Model(inputs, layer(inputs))
    private_api.settle_dtype_policy(layer)
    assert layer.dtype_policy.name == "int8_from_float32" and layer.quantization_mode == "int8"
    plain = keras.layers.Dense(2, name="plain")
    plain.build((None, 4))
    private_api.settle_dtype_policy(plain)  # No map: unchanged.
    assert plain.dtype_policy.name == "float32"


def test_embeddings_variable_is_the_stored_table():
    layer = keras.layers.Embedding(10, 4)
    layer.build((None,))
    assert private_api.embeddings_variable(layer) is layer.embeddings
    layer.quantize("int8")
    assert keras.backend.standardize_dtype(private_api.embeddings_variable(layer).dtype) == "int8"


def test_accept_raw_inputs_lets_a_layer_take_strings():
    class Lengths(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            private_api.accept_raw_inputs(self)

        def call(self, texts):
            return tf.strings.length(texts)

    assert Lengths()(["a", "abc"]).numpy().tolist() == [1, 3]
    assert Lengths()(tf.constant(["hello"])).numpy().tolist() == [5]


def test_one_garbage_collection_is_safe_nested_and_across_threads():
    import threading

    original = gc.collect
    barrier = threading.Barrier(4)

    def worker():
        with private_api.one_garbage_collection():
            barrier.wait()
            with private_api.one_garbage_collection():
                assert gc.collect() == 0
            barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.collect is original


def test_torch_int8_matmul_multiplies_int8_exactly():
    torch = pytest.importorskip("torch", reason="PyTorch is optional (the torch backend's job)")
    matmul = private_api.torch_int8_matmul()
    assert matmul is not None
    rng = np.random.default_rng(0)
    a = rng.integers(-127, 128, (5, 37), dtype=np.int8)
    b = rng.integers(-127, 128, (37, 3), dtype=np.int8)
    out = matmul(torch.from_numpy(a), torch.from_numpy(b))
    assert out.dtype == torch.int32
    np.testing.assert_array_equal(out.numpy(), a.astype(np.int32) @ b.astype(np.int32))


class CountingInitializer(keras.initializers.Initializer):
    """Ones, counting the draws (one per variable it initializes)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, shape, dtype=None):
        self.calls += 1
        return keras.ops.ones(shape, dtype=dtype)


def dropout_model(initializer):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, kernel_initializer=initializer, bias_initializer=initializer, name="dense")(inputs)
    return keras.Model(inputs, keras.layers.Dropout(0.5, seed=7, name="dropout")(hidden))


def uninitialized_registry():
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("uninitialized_variables") or []


def test_deferred_initialization_draws_only_what_loading_leaves(tmp_path):
    source = dropout_model("glorot_uniform")
    path = tmp_path / "model.weights.h5"
    source.save_weights(path)
    initializer = CountingInitializer()
    with private_api.deferred_initialization() as deferred:
        model = dropout_model(initializer)
    assert initializer.calls == 0 and len(deferred.variables) == 3  # Kernel, bias, the dropout's seed.
    assert uninitialized_registry() == []  # Taken from Keras: nothing else initializes them.
    deferred.fill(lambda: model.load_weights(path), model)
    assert initializer.calls == 0
    for loaded, saved in zip(model.weights, source.weights):
        np.testing.assert_array_equal(np.asarray(loaded), np.asarray(saved))
    # The seed, which no weights file holds, took its initializer's value: the Dropout's seed 7.
    seed = model.get_layer("dropout").seed_generator.state
    assert keras.ops.convert_to_numpy(seed).tolist() == [7, 0]
    x = np.ones((2, 4), "float32")
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(source(x)), rtol=1e-6)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, np.zeros((2, 3), "float32"), verbose=0)
    with private_api.deferred_initialization() as again:
        other = dropout_model(initializer)
    with pytest.raises(ValueError, match=r"shape \(5, 3\) to the variable .*kernel of shape \(4, 3\)"):
        again.fill(lambda: other.get_layer("dense").kernel.assign(np.ones((5, 3), "float32")), other)
    assert initializer.calls == 2  # Kernel and bias drawn before the error left: no half-made model.


def test_deferred_variables_that_loading_bypasses_are_drawn_then_loaded_again():
    initializer = CountingInitializer()
    with private_api.deferred_initialization() as deferred:
        model = dropout_model(initializer)
    dense = model.get_layer("dense")
    loads = []

    def load():  # Assigns the kernel only on its first run, as a loader that bypassed `assign` for the bias.
        loads.append(1)
        dense.kernel.assign(np.full((4, 3), 2.0, "float32"))
        if len(loads) > 1:
            dense.bias.assign(np.full((3,), 3.0, "float32"))

    deferred.fill(load, model)
    assert len(loads) == 2 and initializer.calls == 1  # The bias was drawn, then loaded.
    assert np.asarray(dense.kernel).tolist() == [[2.0] * 3] * 4 and np.asarray(dense.bias).tolist() == [3.0] * 3

    with private_api.deferred_initialization() as deferred:
        model = dropout_model(initializer)
    with pytest.raises(OSError, match="disk"):
        deferred.fill(lambda: (_ for _ in ()).throw(OSError("disk")), model)
    assert initializer.calls == 3  # Both drawn before the error left: no half-made model.
    assert all(np.isfinite(np.asarray(v)).all() for v in model.weights)


def test_a_first_assignment_is_a_copy_and_expected_weights_bound_the_reload():
    initializer = CountingInitializer()
    with private_api.deferred_initialization() as deferred:
        model = dropout_model(initializer)
    kernel = model.get_layer("dense").kernel
    source = keras.Variable(np.full((4, 3), 2.0, "float32"))
    loads = []
    # The bias is left on purpose (as a converted checkpoint leaves a pooler it lacks): drawn, no reload.
    deferred.fill(lambda: loads.append(kernel.assign(source)), model, expected=[kernel])
    assert len(loads) == 1 and initializer.calls == 1
    source.assign(np.zeros((4, 3), "float32"))
    assert np.asarray(kernel).tolist() == [[2.0] * 3] * 4  # Its own memory, not the source's.


def test_deferred_initialization_disabled_or_nested_initializes_as_usual():
    initializer = CountingInitializer()
    with private_api.deferred_initialization(enabled=False) as deferred:
        dropout_model(initializer)
    assert initializer.calls == 2 and deferred.variables == []
    with keras.StatelessScope():
        with private_api.deferred_initialization() as deferred:
            dropout_model(initializer)
    assert deferred.variables == []  # A caller's stateless scope decides, not this block.


# --- The fallbacks, with the private symbol taken away -------------------------


def hide_module(monkeypatch, name):
    """Makes `from package import module` of `name` raise ImportError, as
    after a release that moved it (Keras/TF modules that already imported it
    keep their reference, so the public API still works)."""
    # Imported whole first: a package first imported while hidden stays half-made.
    with contextlib.suppress(ImportError):
        importlib.import_module(name)
    package, _, leaf = name.rpartition(".")
    parent = sys.modules.get(package)
    if parent is not None and hasattr(parent, leaf):
        monkeypatch.delattr(parent, leaf)
    monkeypatch.setitem(sys.modules, name, None)


def compiled_model(seed):
    keras.utils.set_random_seed(seed)
    model = small_model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((4, 4), "float32"), np.ones((4, 2), "float32"), verbose=0)  # Builds the optimizer.
    return model


def test_weights_fallbacks_round_trip_a_compiled_model_without_saving_lib(tmp_path, monkeypatch):
    hide_module(monkeypatch, "keras.src.saving.saving_lib")
    with pytest.raises(ImportError):
        from keras.src.saving import saving_lib  # noqa: F401
    source, target = compiled_model(0), compiled_model(1)
    path = tmp_path / "model.weights.h5"
    # Presets always skip the optimizer of a compiled model (`_without_optimizer`): both fallbacks accept it.
    private_api.save_weights_only(source, path, objects_to_skip=[source.optimizer])
    moments = [keras.ops.convert_to_numpy(v) for v in target.optimizer.variables]
    private_api.load_weights_only(target, path, objects_to_skip=[target.optimizer])
    for ours, theirs in zip(target.get_weights(), source.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    # The optimizer was skipped: its state (step count, moments) is the target's own.
    for before, after in zip(moments, target.optimizer.variables):
        np.testing.assert_array_equal(before, keras.ops.convert_to_numpy(after))
    # Skipping part of the model needs the private API, on both sides.
    wrapper = target.get_layer("wrapper")
    with pytest.raises(RuntimeError, match="saving part of a model is unavailable"):
        private_api.save_weights_only(source, path, objects_to_skip=[source.get_layer("wrapper")])
    with pytest.raises(RuntimeError, match="loading part of a model is unavailable"):
        private_api.load_weights_only(target, path, objects_to_skip=[wrapper, target.optimizer])


def test_keras_int8_hooks_available_and_its_fallback(monkeypatch, caplog):
    assert private_api.keras_int8_hooks_available() is True
    monkeypatch.setitem(private_api._int8_hooks_reported, "missing", False)
    monkeypatch.delattr(keras.layers.Dense, "_int8_call")  # As if a Keras release renamed it.
    with caplog.at_level("WARNING", logger="bertzoo"):
        assert private_api.keras_int8_hooks_available() is False
        assert private_api.keras_int8_hooks_available() is False
    warnings = [r.getMessage() for r in caplog.records if "_int8_call" in r.getMessage()]
    assert len(warnings) == 1 and "Keras's own int8 path" in warnings[0]  # Logged once.


def test_bertzoo_dense_refuses_a_static_input_range_without_the_int8_call_hook(monkeypatch):
    from bertzoo.layers.dense import Dense

    monkeypatch.setitem(private_api._int8_hooks_reported, "missing", True)  # Already logged.
    monkeypatch.delattr(keras.layers.Dense, "_int8_call")
    # Keras's own int8 path serves a plain int8 layer and one with smoothed inputs (per-token scales).
    plain = Dense(3)
    plain.build((None, 4))
    plain.quantize("int8")
    assert plain.quantization_mode == "int8"
    smoothed = Dense(3)
    smoothed.build((None, 4))
    smoothed.smooth_inputs(np.full(4, 2.0, "float32"))
    assert smoothed.input_scale is not None
    # A static input range would be ignored by Keras's path: refused, by name.
    static = Dense(3, name="static_layer")
    static.build((None, 4))
    kernel = np.array(static.kernel)
    with pytest.raises(RuntimeError, match=r"no _int8_call, so layer 'static_layer' cannot use a static input"):
        static.smooth_inputs(np.full(4, 2.0, "float32"), input_range=4.0)
    np.testing.assert_array_equal(np.array(static.kernel), kernel)  # Refused before the kernel was scaled.
    assert static.quantization_mode is None


def test_fresh_layer_names_fallback_keeps_the_numbering(monkeypatch):
    hide_module(monkeypatch, "keras.src.backend.common.global_state")
    keras.layers.Dropout(0.1)
    with private_api.fresh_layer_names():
        assert keras.layers.Dropout(0.1).name != "dropout"


def test_deferred_initialization_fallback_initializes_as_usual(monkeypatch, tmp_path):
    hide_module(monkeypatch, "keras.src.backend.common.global_state")
    source = dropout_model("glorot_uniform")
    source.save_weights(tmp_path / "model.weights.h5")
    initializer = CountingInitializer()
    with private_api.deferred_initialization() as deferred:
        model = dropout_model(initializer)
    assert initializer.calls == 2 and deferred.variables == []
    deferred.fill(lambda: model.load_weights(tmp_path / "model.weights.h5"), model)
    np.testing.assert_array_equal(np.asarray(model.weights[0]), np.asarray(source.weights[0]))


def test_in_stateless_scope_and_in_variable_scope_fallbacks(monkeypatch):
    hide_module(monkeypatch, "keras.src.backend.common.stateless_scope")
    with keras.StatelessScope():
        assert private_api.in_stateless_scope() is False  # Fallback: False.
    hide_module(monkeypatch, "keras.src.backend.common.variables")
    assert private_api.in_variable_scope() is True  # Fallback: True (callers read `.value`).


def test_layer_variable_fallbacks_use_the_public_attributes():
    class DenseLike:  # A layer without the private attributes (a Keras that renamed them).
        kernel = "public kernel"
        embeddings = "public table"

    assert private_api.dense_kernel_variable(DenseLike()) == "public kernel"
    assert private_api.embeddings_variable(DenseLike()) == "public table"
    assert private_api.learning_rate_schedule(object()) is None
    assert private_api.adam_moments(object(), keras.Variable(1.0)) is None
    assert private_api.weight_decay_applies(object(), keras.Variable(1.0)) is None
    assert private_api.compiled_metrics_container(object()) is None


@pytest.mark.parametrize(
    "decorator, hook",
    [
        (private_api.route_gradient_application, "_backend_apply_gradients"),
        (private_api.route_gradient_clipping, "_clip_gradients"),
    ],
)
def test_optimizer_routes_leave_the_class_alone_without_the_hook(monkeypatch, caplog, decorator, hook):
    monkeypatch.setattr(keras.optimizers.Optimizer, hook, None)  # As if a Keras release removed it.
    calls = []

    def route(*args):
        calls.append(args)
        return False

    with caplog.at_level("INFO", logger="bertzoo"):

        @decorator(route)
        class Plain(keras.optimizers.SGD):
            pass

    assert hook not in vars(Plain)
    assert any(hook in r.getMessage() and "Plain" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()  # Keras's own step, with its hook back, for the check below.
    variable = keras.Variable(np.ones(3, "float32"))
    Plain(0.5).apply_gradients([(np.ones(3, "float32"), variable)])
    np.testing.assert_allclose(variable.numpy(), 0.5)
    assert calls == []


@pytest.mark.parametrize(
    "module, function, fallback",
    [
        ("tensorflow.python.util._pywrap_util_port", "tensorflow_onednn_enabled", False),
        ("tensorflow.python.eager.record", "gradient_tape_active", True),
        ("tensorflow.python.ops.control_flow_util", "in_xla_context", True),
        ("tensorflow.python.eager.execute", "unexposed_op_runner_available", False),
        ("tensorflow_text.python.ops.regex_split_ops", "tf_text_regex_split_op", None),
    ],
)
def test_tensorflow_fallbacks_when_a_module_moves(monkeypatch, module, function, fallback):
    hide_module(monkeypatch, module)
    assert getattr(private_api, function)() is fallback


def test_regex_split_falls_back_to_tf_texts_public_function(monkeypatch):
    from bertzoo.text.normalization import regex_split

    strings = tf.constant(["a, b", "", "c"])
    fast = [t.to_list() for t in regex_split(strings, " |,", ",", with_offsets=True)]
    # (Hiding tf-text's module, as the test above does, would hide the public function too.)
    monkeypatch.setattr(private_api, "tf_text_regex_split_op", lambda: None)
    assert [t.to_list() for t in regex_split(strings, " |,", ",", with_offsets=True)] == fast
    assert fast[0] == [[b"a", b",", b"b"], [], [b"c"]]


def test_tensorflow_op_def_fallback_and_gradient_recording_paused_without_record(monkeypatch):
    hide_module(monkeypatch, "tensorflow.python.framework.op_def_registry")
    assert private_api.tensorflow_op_def("MatMul") is None
    monkeypatch.undo()
    hide_module(monkeypatch, "tensorflow.python.eager.record")
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        with private_api.gradient_recording_paused():  # Fallback: the tape keeps recording.
            y = x * x
    assert float(tape.gradient(y, x)) == 6.0


def test_stored_value_reads_past_the_autocast_scope_with_a_fallback(monkeypatch):
    class Probe(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(3,), initializer=keras.initializers.Constant(1.0 + 2.0**-12))

        def call(self, x):
            self.read = private_api.stored_value(self.w), self.w.value
            return x

    layer = Probe(dtype="mixed_bfloat16")
    layer(np.ones((1, 3), "float32"))
    stored, autocast = layer.read
    assert keras.ops.convert_to_numpy(stored).dtype == np.float32
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(stored), np.float32(1.0 + 2.0**-12))  # Exact.
    assert float(keras.ops.convert_to_numpy(keras.ops.cast(autocast, "float32"))[0]) == 1.0  # bfloat16 lost it.
    hide_module(monkeypatch, "keras.src.backend.common.variables")
    layer(np.ones((1, 3), "float32"))
    assert keras.ops.convert_to_numpy(layer.read[0]).dtype == np.float32  # Fallback: cast back, rounding kept.
