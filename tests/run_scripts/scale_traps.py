"""The MEAN trap of a tape around strategy.run on MirroredStrategy(2) with
Keras 3: a MEAN of compute_average_loss (1/N of the gradient); and the
correct programs beside it, which must not be warned about: the tutorial's
SUM, a MEAN of per-replica means, the total applied by a LossScaleOptimizer
in cross-replica context, and the tutorial loop."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.01), initial_scale=1.0)
features, labels = tf.ones((8, 3)), tf.ones((8, 1))
batches = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((features, labels)).batch(8))
x, y = next(iter(batches))


def per_example(x, y):
    error = model(x) - y
    return tf.reduce_sum(error * error, axis=1)


def average_loss(x, y):
    return tf.nn.compute_average_loss(per_example(x, y), global_batch_size=8)


def mean_loss(x, y):
    return tf.reduce_mean(per_example(x, y))


def spanning_gradients(share, reduction):
    with tf.GradientTape() as tape:
        loss = strategy.reduce(reduction, strategy.run(share, args=(x, y)),  # REDUCE
                               axis=None)
    return tape.gradient(loss, model.trainable_variables)


def apply(gradients):
    optimizer.apply(gradients, model.trainable_variables)


def tutorial_step(x, y):
    with tf.GradientTape() as tape:
        loss = average_loss(x, y)
    apply(tape.gradient(loss, model.trainable_variables))


with strategy.scope():
    apply(spanning_gradients(average_loss, "SUM"))
    apply(spanning_gradients(mean_loss, "MEAN"))
    mean_trap = spanning_gradients(average_loss, "MEAN")
strategy.run(tutorial_step, args=(x, y))
print("trained")
