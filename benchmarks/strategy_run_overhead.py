"""Per-call cost of an eager `strategy.run` with no tape recording, tfdtape
installed against stock TensorFlow, side by side.

tfdtape replaces `mirrored_run._call_for_each_replica` (to let tapes around
`strategy.run` record the replicas); with no tape recording, its only work is
finding that out. Measured in one process, the configurations interleaved
(every repeat runs each once, in turn): the median over repeats of the time
per call of `strategy.run` of a small replica function under
MirroredStrategy(4), with no tape, and, for scale, with a tape around it
(which tfdtape then lets record in the replicas; stock records nothing
there). An eager `strategy.run` takes milliseconds and varies by several
percent from call to call on a shared machine, so the replacement's own work
is also timed alone (timeit, its TensorFlow function replaced by a no-op):
the microseconds it adds to every call, and that over a stock call. Target:
no tape, tfdtape <= 1.01x stock.

Usage: python benchmarks/strategy_run_overhead.py [--repeats 9] [--calls 200]
"""

import argparse
import os
import statistics
import time
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TFDTAPE_AUTOINSTALL", "0")

import tensorflow as tf

from tfdtape import spanning_tapes
from tfdtape import testing

CONFIGURATIONS = ("stock", "tfdtape")
REPLICAS = 4


def per_call(strategy, v, calls, taped):
    """Seconds per eager strategy.run call."""
    def replica_fn():
        return v * 2.0

    with strategy.scope():
        if taped:
            with tf.GradientTape():
                start = time.perf_counter()
                for _ in range(calls):
                    strategy.run(replica_fn)
                return (time.perf_counter() - start) / calls
        start = time.perf_counter()
        for _ in range(calls):
            strategy.run(replica_fn)
        return (time.perf_counter() - start) / calls


def replacement_cost(calls=200000):
    """Seconds the replacement adds to a call with no tape recording: its
    own work around a no-op in place of TensorFlow's function."""
    def no_op(distribution, fn, args, kwargs):
        del distribution, fn, args, kwargs

    replaced = spanning_tapes.make_call_for_each_replica(no_op)
    bare = min(timeit.repeat(lambda: no_op(None, None, (), {}), number=calls,
                             repeat=5))
    wrapped = min(timeit.repeat(lambda: replaced(None, None, (), {}),
                                number=calls, repeat=5))
    return (wrapped - bare) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    strategy = tf.distribute.MirroredStrategy(testing.virtual_cpus(REPLICAS))
    with strategy.scope():
        v = tf.Variable(3.0)
    found = {(c, taped): [] for c in CONFIGURATIONS for taped in (False, True)}
    for repeat in range(args.repeats + 1):  # the first round warms up
        order = CONFIGURATIONS if repeat % 2 == 0 else CONFIGURATIONS[::-1]
        for configuration in order:
            with testing.configuration(configuration):
                for taped in (False, True):
                    seconds = per_call(strategy, v, args.calls, taped)
                    if repeat:
                        found[(configuration, taped)].append(seconds)
    print(f"eager strategy.run under MirroredStrategy({REPLICAS}), {args.calls} "
          f"calls x {args.repeats} interleaved repeats, median microseconds per call")
    print(f"{'':26} {'stock':>10} {'tfdtape':>10} {'tfdtape/stock':>14}")
    for taped, label in ((False, "no tape"), (True, "a tape around the run")):
        stock = statistics.median(found[("stock", taped)])
        ours = statistics.median(found[("tfdtape", taped)])
        print(f"{label:26} {stock * 1e6:10.1f} {ours * 1e6:10.1f} "
              f"{ours / stock:13.3f}x")
        if not taped:
            added = replacement_cost()
            print(f"{'  the replacement alone':26} {stock * 1e6:10.1f} "
                  f"{(stock + added) * 1e6:10.1f} {(stock + added) / stock:13.4f}x"
                  f"  (+{added * 1e6:.2f} us per call)")


if __name__ == "__main__":
    main()
