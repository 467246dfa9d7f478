"""An eager MirroredStrategy(4) training script that knows nothing of
tfdtape: the workload of benchmarks/run_overhead.py (run as a script, it
prints the seconds its training loop took) and of
benchmarks/recorder_overhead.py (which imports `build_step`)."""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf


def build_step():
    """Sets up 4 virtual CPUs, a 5-layer Keras model under MirroredStrategy
    and its data; returns a function that runs one eager training step."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    tf.get_logger().setLevel("ERROR")
    strategy = tf.distribute.MirroredStrategy(
        [device.name for device in tf.config.list_logical_devices("CPU")])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,))] + [
            tf.keras.layers.Dense(8, activation="tanh") for _ in range(4)] + [
            tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.01)
    features = tf.random.stateless_normal((16, 8), seed=(1, 2))
    labels = tf.random.stateless_normal((16, 1), seed=(3, 4))
    shards = strategy.experimental_distribute_values_from_function(
        lambda context: (features[4 * context.replica_id_in_sync_group:][:4],
                         labels[4 * context.replica_id_in_sync_group:][:4]))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2) / 4
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    def step():
        strategy.run(replica_step, args=shards)

    step()  # builds the optimizer
    return step


if __name__ == "__main__":
    train_step = build_step()
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    start = time.perf_counter()
    for _ in range(steps):
        train_step()
    print(f"loop_seconds {time.perf_counter() - start:.6f}")
