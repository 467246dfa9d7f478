"""What the recorder behind `python -m tfdtape run` costs per training step,
in one process: the eager MirroredStrategy(4) step of
benchmarks/eager_training_script.py with a recorder open and with it closed
(tfdtape installed in both), in interleaved rounds (the order swaps every
round). Reported: the median seconds per round of each, and their ratio.

Usage: python benchmarks/recorder_overhead.py [--rounds 20] [--steps 10]
"""

import argparse
import statistics
import time

import eager_training_script
import tfdtape  # noqa: F401 (installs tfdtape)
from tfdtape import events
from tfdtape.cli import event_counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    step = eager_training_script.build_step()
    recorder = event_counts.EventCounts()
    seconds = {"recorder open": [], "recorder closed": []}
    for index in range(args.rounds):
        order = list(seconds) if index % 2 == 0 else list(seconds)[::-1]
        for name in order:
            if name == "recorder open":
                events.open_sink(recorder)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds[name].append(time.perf_counter() - start)
            if name == "recorder open":
                events.close_sink(recorder)
    opened, closed = (statistics.median(seconds[name]) for name in seconds)
    print(f"eager MirroredStrategy(4) step, {args.rounds} rounds of "
          f"{args.steps} steps, medians")
    print(f"recorder open {opened:.4f} s  closed {closed:.4f} s  "
          f"ratio {opened / closed:.3f}x")


if __name__ == "__main__":
    main()
