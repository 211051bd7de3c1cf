"""Device check, for a session lent a CUDA machine (run it once, under 8 minutes): the `gpu` tests, then the bag timed
on CUDA.

1. `NEWTONIPC_TEST_FLAGS=gpu pytest -m gpu`: CUDA against the CPU (candidate search, elastic terms, linear solvers, the
first 24 bag steps: positions within 2e-7 m). 2. The bag scene on CUDA for --until seconds (default 3.0: the drops and
the peel-off), wall time and Newton iterations, and the same window's positions against a CPU run of the first 0.1 s.
Prints one table and writes benchmarks/results/gpu_check.json. Without a CUDA device it says so and exits 2.

python benchmarks/gpu_check.py [--until 3.0]

"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--until", type=float, default=3.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_check.json"))
    a = ap.parse_args()
    wp.config.quiet = True
    if not wp.is_cuda_available():
        print("gpu_check: no CUDA device here; nothing to check", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[1]
    t = time.perf_counter()
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"], cwd=root,
                           env={**os.environ, "NEWTONIPC_TEST_FLAGS": "gpu"}, capture_output=True, text=True)
    tests_s = time.perf_counter() - t
    summary = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(tests.stdout[-4000:])
    from newtonipc_nb.scenes.bag_run import run_bag
    run_bag(2 / 240, device="cuda", progress=False)                     # compile
    tr = run_bag(a.until, device="cuda", progress=False)
    its = int(sum(s["newton_iterations"] for s in tr.steps))
    cpu = run_bag(0.1, device="cpu", progress=False)
    k = len(cpu.film)
    diff = float(
        max(
            np.abs(np.asarray(tr.film[:k]) - np.asarray(cpu.film)).max(),
            np.abs(np.asarray(tr.spheres[:k]) - np.asarray(cpu.spheres)).max()))
    rows = {
        "gpu tests": summary,
        "gpu tests (s)": round(tests_s, 1),
        "bag on CUDA: simulated (s)": a.until,
        "bag on CUDA: wall (s)": round(tr.wall_time, 1),
        "bag on CUDA: Newton iterations": its,
        "bag on CUDA: ms per iteration": round(1e3 * tr.wall_time / max(its, 1), 2),
        "bag on CUDA: stopped": tr.stopped,
        "CUDA vs CPU, first 0.1 s: max position difference (m)": diff,
        "device": wp.get_device("cuda").name
    }
    for k2, v in rows.items(): print(f"{k2:55s} {v}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0 if tests.returncode == 0 and diff <= 2e-7 else 1


if __name__ == "__main__":
    sys.exit(main())
