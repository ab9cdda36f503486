"""`Dropout`: Keras's Dropout layer, whose TensorFlow mask costs half the
random numbers.

Keras's TensorFlow dropout draws one uniform float per element in the
input's dtype. Drawing random numbers is a large share of a BERT training
step on CPUs (BERT-base in bfloat16, batch 8 x 128: about 13% of the step in
TensorFlow's profiler, with attention-probability dropout the largest
part). Here each 32-bit random integer is split into two 16-bit ones and an
element is kept when its 16-bit number is at least `round(rate * 65536)`:
half the random draws, no float conversion, and in bfloat16 a more exact
rate than Keras's (a bfloat16 uniform only has 256 levels below 1, so
`rate=0.1` drops 10.2% there; here 10.0%). Kept elements are scaled by the
exact inverse of the keep probability, so the expected output equals the
input.

The fast mask is used on the TensorFlow backend in training for
`0 < rate < 1` without `noise_shape`; everything else is Keras's own
`Dropout` unchanged. The seed generator, `seed` and config are Keras's, so
a seeded layer repeats its masks.

Example:
```python
dropout = bertzoo.layers.Dropout(0.1, seed=7)
y = dropout(keras.ops.ones((4, 8)), training=True)  # ~10% zeros, the rest 1 / 0.9
```
"""

import keras

from bertzoo.utils.optional import tf

_LEVELS = 65536  # 16-bit random numbers.


def _tensorflow_dropout(inputs, rate, seed):
    # Stateless ops want an int32 seed; Keras's seed state may be int64.
    seed = tf.cast(tf.math.floormod(tf.cast(seed, tf.int64), tf.int32.max - 1), tf.int32)
    threshold = int(round(rate * _LEVELS))
    size = tf.size(inputs)
    words = tf.random.stateless_uniform([(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
    numbers = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
    keep = tf.reshape(numbers >= tf.constant(threshold, tf.uint16), tf.shape(inputs))
    scale = tf.cast(_LEVELS / (_LEVELS - threshold), inputs.dtype)
    return tf.where(keep, inputs * scale, tf.zeros([], inputs.dtype))


@keras.saving.register_keras_serializable(package="bertzoo")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with a cheaper mask on TensorFlow (see the module)."""

    def call(self, inputs, training=False):
        if (
            training
            and 0.0 < self.rate < 1.0
            and self.noise_shape is None
            and keras.backend.backend() == "tensorflow"
            and round(self.rate * _LEVELS) < _LEVELS
        ):
            return _tensorflow_dropout(inputs, self.rate, self.seed_generator.next())
        return super().call(inputs, training=training)
