"""One test per private Keras/TensorFlow symbol bertzoo uses.

Each wrapper in `bertzoo.utils.private_api` is checked against the installed
Keras and TensorFlow, so a release that moves a symbol fails here, by name,
and where a wrapper has a public fallback the fallback is checked too.
"""

import contextlib
import gc

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
