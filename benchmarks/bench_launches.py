"""Benchmark: replayed kernel launches (`terms.launch`) against plain `wp.launch`, interleaved step by step.

The package's kernels go through `terms.launch`, which replays a recorded launch instead of packing every argument
anew (on the CPU by calling the kernel's entry with the packed arguments it keeps). `--against warp-replay` measures
that last part alone: the other way replays the same records through Warp's own `Launch.launch`. The two ways run the
same kernels on the same arguments, so a run takes the same path either way, frame for
frame. That allows a measurement that this machine's drift (whole runs of the same code differ by 20–40 % from hour to
hour) cannot spoil: one run replays on even steps and launches plainly on odd ones, a second run the other way round,
and each step's `SolverIPC.step` is timed. Every step is then timed once each way, alternating within seconds.

Launches are counted too: replays (of a record), records (`wp.launch(record_cmd=True)`, a launch whose kernel and
arrays have no record yet) and plain launches (`wp.launch`).

python benchmarks/bench_launches.py [--until 10.5] [--resolution 1] [--against plain|warp-replay]
    [--out benchmarks/results/launches.json]
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
import newtonipc_nb
from newtonipc_nb import terms
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.solver import SolverIPC

# every module whose kernels go through `terms.launch` (it is looked up in the module's globals at each call)
MODULES = [m for m in (importlib.import_module(f"newtonipc_nb.{i.name}")
                       for i in pkgutil.iter_modules(newtonipc_nb.__path__))
           if getattr(m, "launch", None) is terms.launch]
REPLAYED = terms.launch       # kept: `terms` is one of MODULES, so its own `launch` is switched too
RUN = terms._Recorded.run     # a replay: the kernel's entry on the CPU


def warp_replay(record):
    "A replay through Warp's own `Launch.launch`, which packs the arguments again."
    record.cmd.launch()


class Interleaved:
    """Patches `SolverIPC.step` to switch every module's `launch` (or, against "warp-replay", how records replay) by
    step parity, time each step and count launches."""
    def __init__(self, parity: int, against: str):
        self.ways, self.parity = ("replayed", against), parity
        self.seconds = dict.fromkeys(self.ways, 0.0)
        self.steps, self.counts = collections.Counter(), collections.Counter()
        self._k, self._way = 0, None

    def install(self):
        step, record, bench = SolverIPC.step, wp.launch, self
        modes = {"replayed": (REPLAYED, RUN), "plain": (wp.launch, RUN), "warp-replay": (REPLAYED, warp_replay)}

        def timed_step(solver, *args, **kw):
            bench._way = self.ways[(bench._k + bench.parity) % 2]
            launch, bench._run = modes[bench._way]
            for m in MODULES: m.launch = launch
            t = time.perf_counter()
            try: return step(solver, *args, **kw)
            finally:
                bench.seconds[bench._way] += time.perf_counter() - t
                bench.steps[bench._way] += 1
                bench._k += 1

        def counted_launch(kernel, *args, record_cmd=False, **kw):
            bench.counts[(bench._way, "records" if record_cmd else "plain launches")] += 1
            return record(kernel, *args, record_cmd=record_cmd, **kw)

        def counted_replay(r):
            bench.counts[(bench._way, "replays")] += 1
            bench._run(r)

        SolverIPC.step, wp.launch, terms._Recorded.run = timed_step, counted_launch, counted_replay
        self._restore = (step, record)
        return self

    def uninstall(self):
        SolverIPC.step, wp.launch = self._restore
        terms._Recorded.run = RUN
        for m in MODULES: m.launch = REPLAYED


def run(parity: int, until: float, resolution: int, against: str):
    "One run, replaying on the steps of `parity`; returns (bench, trajectory)."
    bench = Interleaved(parity, against).install()
    try: traj = run_bag(until, resolution=resolution, device="cpu", progress=False)
    finally: bench.uninstall()
    return bench, traj


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--until", type=float, default=10.5)
    p.add_argument("--resolution", type=int, default=1)
    p.add_argument("--against", choices=("plain", "warp-replay"), default="plain")
    p.add_argument("--out", default="benchmarks/results/launches.json")
    a = p.parse_args()
    runs = [run(parity, a.until, a.resolution, a.against) for parity in (0, 1)]
    same = all(np.array_equal(runs[0][1].film, r[1].film) and np.array_equal(runs[0][1].spheres, r[1].spheres)
               for r in runs[1:])
    rows = []
    for way in ("replayed", a.against):
        seconds, steps = sum(b.seconds[way] for b, _ in runs), sum(b.steps[way] for b, _ in runs)
        counts = {k: sum(b.counts[(way, k)] for b, _ in runs) for k in ("replays", "records", "plain launches")}
        rows.append(dict(way=way, steps=steps, step_s=round(seconds, 2), ms_per_step=round(1e3 * seconds / steps, 3),
                         **counts))
    table = pd.DataFrame(rows).set_index("way")
    ratio = table.loc["replayed", "step_s"] / table.loc[a.against, "step_s"]
    iterations = int(sum(s["newton_iterations"] for s in runs[0][1].steps))
    print(table.to_string())
    print(f"\nreplayed / {a.against} step time: {ratio:.3f}; {iterations:,} Newton iterations a run; frames of both "
          f"runs identical: {same}")
    Path(a.out).write_text(json.dumps(dict(until=a.until, resolution=a.resolution, against=a.against, rows=rows,
                                           ratio=round(ratio, 4), newton_iterations=iterations, frames_identical=same,
                                           wall_s=[round(t.wall_time, 1) for _, t in runs]), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
