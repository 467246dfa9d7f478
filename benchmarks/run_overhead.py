"""Cost of `python -m tfdtape run` on an eager MirroredStrategy(4) training
script, against the same script under plain `python`.

One fresh process per sample, the two configurations alternating (their
order swaps every round). Reported: the medians of the whole process's wall
time and of the training loop's time (which the script prints), and their
ratios. Target: instrumented <= 1.05x plain.

Usage: python benchmarks/run_overhead.py [--samples 8] [--steps 30]
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

SCRIPT = pathlib.Path(__file__).with_name("eager_training_script.py")
COMMANDS = {
    "python": [sys.executable, str(SCRIPT)],
    "tfdtape run": [sys.executable, "-m", "tfdtape", "run", "--quiet",
                    str(SCRIPT)],
}


def sample(command, steps):
    """(wall seconds, loop seconds) of one fresh process."""
    start = time.perf_counter()
    completed = subprocess.run(command + [str(steps)], capture_output=True,
                               text=True, check=False,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    wall = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{completed.stderr[-2000:]}")
    loop = float(completed.stdout.split("loop_seconds")[1].split()[0])
    return wall, loop


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    names = list(COMMANDS)
    found = {name: [] for name in names}
    for index in range(args.samples):
        for name in (names if index % 2 == 0 else names[::-1]):
            wall, loop = sample(COMMANDS[name], args.steps)
            found[name].append((wall, loop))
            print(f"sample {index + 1}/{args.samples} {name:12} wall {wall:6.2f} s"
                  f"  loop {loop:6.3f} s", file=sys.stderr, flush=True)
    medians = {name: (statistics.median(w for w, _ in samples),
                      statistics.median(loop for _, loop in samples))
               for name, samples in found.items()}
    plain, instrumented = medians["python"], medians["tfdtape run"]
    print(f"eager MirroredStrategy(4) training script, {args.steps} steps, "
          f"{args.samples} fresh processes each, medians")
    print(f"{'':12} {'python':>10} {'tfdtape run':>12} {'ratio':>8}")
    print(f"{'wall (s)':12} {plain[0]:10.2f} {instrumented[0]:12.2f} "
          f"{instrumented[0] / plain[0]:7.3f}x")
    print(f"{'loop (s)':12} {plain[1]:10.3f} {instrumented[1]:12.3f} "
          f"{instrumented[1] / plain[1]:7.3f}x")


if __name__ == "__main__":
    main()
