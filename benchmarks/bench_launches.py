"""Benchmark: replayed kernel launches (`terms.launch`) against plain `wp.launch`, interleaved step by step.

The package's kernels go through `terms.launch`, which replays a recorded launch instead of packing every argument
anew. The two ways run the same kernels on the same arguments, so a run takes the same path either way, frame for
frame. That allows a measurement that this machine's drift (whole runs of the same code differ by 20–40 % from hour to
hour) cannot spoil: one run replays on even steps and launches plainly on odd ones, a second run the other way round,
and each step's `SolverIPC.step` is timed. Every step is then timed once each way, alternating within seconds.

Launches are counted too: replays (`Launch.launch`), records (`wp.launch(record_cmd=True)`, a launch whose kernel and
arrays have no record yet) and plain launches (`wp.launch`).

python benchmarks/bench_launches.py [--until 10.5] [--resolution 1] [--out benchmarks/results/launches.json]
"""
import argparse
import collections
import importlib
import json
import pkgutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import warp as wp
from warp._src.context import Launch

import newtonipc_nb
from newtonipc_nb import terms
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.solver import SolverIPC

# every module whose kernels go through `terms.launch` (it is looked up in the module's globals at each call)
MODULES = [m for m in (importlib.import_module(f"newtonipc_nb.{i.name}")
                       for i in pkgutil.iter_modules(newtonipc_nb.__path__))
           if getattr(m, "launch", None) is terms.launch]
WAYS = ("replayed", "plain")
REPLAYED = terms.launch       # kept: `terms` is one of MODULES, so its own `launch` is switched too


class Interleaved:
    "Patches `SolverIPC.step` to switch every module's `launch` by step parity, time each step and count launches."
    def __init__(self, parity: int):
        self.parity, self.seconds = parity, dict.fromkeys(WAYS, 0.0)
        self.steps, self.counts = collections.Counter(), collections.Counter()
        self._k, self._way = 0, None

    def install(self):
        step, record, replay, bench = SolverIPC.step, wp.launch, Launch.launch, self

        def timed_step(solver, *args, **kw):
            bench._way = WAYS[(bench._k + bench.parity) % 2]
            for m in MODULES: m.launch = REPLAYED if bench._way == "replayed" else wp.launch
            t = time.perf_counter()
            try: return step(solver, *args, **kw)
            finally:
                bench.seconds[bench._way] += time.perf_counter() - t
                bench.steps[bench._way] += 1
                bench._k += 1

        def counted_launch(kernel, *args, record_cmd=False, **kw):
            bench.counts[(bench._way, "records" if record_cmd else "plain launches")] += 1
            return record(kernel, *args, record_cmd=record_cmd, **kw)

        def counted_replay(cmd, *args, **kw):
            bench.counts[(bench._way, "replays")] += 1
            return replay(cmd, *args, **kw)

        SolverIPC.step, wp.launch, Launch.launch = timed_step, counted_launch, counted_replay
        self._restore = (step, record, replay)
        return self

    def uninstall(self):
        SolverIPC.step, wp.launch, Launch.launch = self._restore
        for m in MODULES: m.launch = REPLAYED


def run(parity: int, until: float, resolution: int):
    "One run, replaying on the steps of `parity`; returns (bench, trajectory)."
    bench = Interleaved(parity).install()
    try: traj = run_bag(until, resolution=resolution, device="cpu", progress=False)
    finally: bench.uninstall()
    return bench, traj


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--until", type=float, default=10.5)
    p.add_argument("--resolution", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/launches.json")
    a = p.parse_args()
    runs = [run(parity, a.until, a.resolution) for parity in (0, 1)]
    same = all(np.array_equal(runs[0][1].film, r[1].film) and np.array_equal(runs[0][1].spheres, r[1].spheres)
               for r in runs[1:])
    rows = []
    for way in WAYS:
        seconds, steps = sum(b.seconds[way] for b, _ in runs), sum(b.steps[way] for b, _ in runs)
        counts = {k: sum(b.counts[(way, k)] for b, _ in runs) for k in ("replays", "records", "plain launches")}
        rows.append(dict(way=way, steps=steps, step_s=round(seconds, 2), ms_per_step=round(1e3 * seconds / steps, 3),
                         **counts))
    table = pd.DataFrame(rows).set_index("way")
    ratio = table.loc["replayed", "step_s"] / table.loc["plain", "step_s"]
    iterations = int(sum(s["newton_iterations"] for s in runs[0][1].steps))
    print(table.to_string())
    print(f"\nreplayed / plain step time: {ratio:.3f}; {iterations:,} Newton iterations a run; frames of both runs "
          f"identical: {same}")
    Path(a.out).write_text(json.dumps(dict(until=a.until, resolution=a.resolution, rows=rows, ratio=round(ratio, 4),
                                           newton_iterations=iterations, frames_identical=same,
                                           wall_s=[round(t.wall_time, 1) for _, t in runs]), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
