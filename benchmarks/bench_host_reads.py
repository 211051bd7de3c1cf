"""Benchmark: device→host reads per Newton iteration of SolverIPC on the bag scene, per call site.

A read is every `wp.array.numpy()` that the package makes (`terms.read_back` is one): on a CUDA device each one waits
for every launch queued before it, so the solver's inner loop should make as few as it can. A *scalar* read copies a
small array (at most 16 entries: flags, counts, norms, Φ); a *bulk* read copies a whole array (positions, the matrix
values and right-hand side that PARDISO takes on the host, the candidate pairs of a rebuild's error path). Bulk reads
are the linear solver's or the step's own data, and are counted apart.

Each read is attributed to its call site: the innermost package function that made it and the package function that
called that one. Only reads inside `SolverIPC.step` are counted (not the scene's construction, its choreography or the
trajectory's records). Reads made while `SolverIPC._iteration` runs are per Newton iteration; the rest are once per step
(the start: candidate update, the start's gap check, friction lagging, prescribed motion, extrapolation; the end: the
FP32 gap check).

The solver runs with `line_search_batch` as given (default 4, what a CUDA device gets by default: the first batch of
line-search trials goes with the direction's read); the line-search trials actually evaluated are counted too, since a
batch evaluates trials that the sequential search would not have needed.

Windows: the bag at resolution 1 from rest to `--until` (the fold) and, resumed from a saved run of the same scene, a
window of the same length from `--resume-at` (the gather). The saved run is made once (`--resume-file`, uninstrumented)
and reused.

python benchmarks/bench_host_reads.py [--until 0.3] [--resume-at 6.5] [--resume-file /tmp/bag_to_6.5.npz]
       [--line-search-batch 4] [--out benchmarks/results/host_reads.json]
"""
import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import warp as wp  # noqa: E402

import newtonipc_nb  # noqa: E402
from newtonipc_nb.scenes.bag_run import run_bag  # noqa: E402
from newtonipc_nb.line_search import LineSearch  # noqa: E402
from newtonipc_nb.solver import SolverIPC  # noqa: E402

SMALL = 16                                   # entries: at most this many is a scalar read
_PKG = os.path.dirname(newtonipc_nb.__file__)


class Counter:
    "Counts the package's `wp.array.numpy()` calls, per call site, inside and outside Newton iterations."
    def __init__(self):
        self.reads = collections.Counter()   # (where, kind, site) → count
        self.iterations = self.steps = self.evaluated = 0
        self._in_iteration = self._in_step = 0

    def site(self) -> str:
        "`module.function ← module.function` of the two innermost package frames (read_back itself skipped)."
        names, f = [], sys._getframe(2)
        while f is not None and len(names) < 2:
            path = f.f_code.co_filename
            if path.startswith(_PKG) and not (path.endswith("terms.py") and f.f_code.co_name == "read_back"):
                names.append(f"{Path(path).stem}.{f.f_code.co_name}")
            f = f.f_back
        return " ← ".join(names) or "outside the package"

    def install(self):
        numpy, iteration, step, trials = wp.array.numpy, SolverIPC._iteration, SolverIPC.step, LineSearch.launch
        counter = self

        def counted_numpy(a):
            site = counter.site()
            if site != "outside the package" and counter._in_step:
                kind = "scalar" if a.size <= SMALL else "bulk"
                where = "iteration" if counter._in_iteration else "step"
                counter.reads[(where, kind, site)] += 1
            return numpy(a)

        def counted_iteration(solver, *args, **kw):
            counter.iterations += 1
            counter._in_iteration += 1
            try: return iteration(solver, *args, **kw)
            finally: counter._in_iteration -= 1

        def counted_step(solver, *args, **kw):
            counter.steps += 1
            counter._in_step += 1
            try: return step(solver, *args, **kw)
            finally: counter._in_step -= 1

        def counted_trials(ls, terms, x, dx, xt, alpha, k):
            if counter._in_iteration: counter.evaluated += k
            return trials(ls, terms, x, dx, xt, alpha, k)

        wp.array.numpy, SolverIPC._iteration, SolverIPC.step = counted_numpy, counted_iteration, counted_step
        LineSearch.launch = counted_trials
        return lambda: setattr(wp.array, "numpy", numpy) or setattr(SolverIPC, "_iteration", iteration) or setattr(
            SolverIPC, "step", step) or setattr(LineSearch, "launch", trials)

    def table(self) -> dict:
        per_it, per_step = self.iterations or 1, self.steps or 1
        rows = [dict(where=w, kind=k, site=s, count=c, per=round(c / (per_it if w == "iteration" else per_step), 3))
                for (w, k, s), c in sorted(self.reads.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[1]))]
        tot = collections.Counter()
        for (w, k, _), c in self.reads.items(): tot[(w, k)] += c
        return dict(iterations=self.iterations, steps=self.steps, rows=rows,
                    trials_evaluated_per_iteration=round(self.evaluated / per_it, 3),
                    scalar_per_iteration=round(tot[("iteration", "scalar")] / per_it, 3),
                    bulk_per_iteration=round(tot[("iteration", "bulk")] / per_it, 3),
                    scalar_per_step_outside_iterations=round(tot[("step", "scalar")] / per_step, 3),
                    bulk_per_step_outside_iterations=round(tot[("step", "bulk")] / per_step, 3))


def window(name, batch, **kw) -> dict:
    "Run one window of the bag with the reads counted; returns its table and CPU time."
    c = Counter()
    undo = c.install()
    t0 = time.process_time()
    try: run_bag(resolution=1, device="cpu", progress=False, line_search_batch=batch, **kw)
    finally: undo()
    r = dict(window=name, cpu_s=round(time.process_time() - t0, 2), **c.table())
    print(f"\n{name}: {r['iterations']} Newton iterations in {r['steps']} steps, CPU {r['cpu_s']} s")
    print(f"  line-search trials evaluated per iteration {r['trials_evaluated_per_iteration']}")
    print(f"  scalar reads per iteration {r['scalar_per_iteration']}, bulk {r['bulk_per_iteration']}; per step outside "
          f"iterations: scalar {r['scalar_per_step_outside_iterations']}, bulk {r['bulk_per_step_outside_iterations']}")
    print(f"  {'where':>9} {'kind':>6} {'per':>7}  call site")
    for row in r["rows"]:
        print(f"  {row['where']:>9} {row['kind']:>6} {row['per']:>7}  {row['site']}")
    return r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--until", type=float, default=0.3, help="window length in simulated seconds (default 0.3)")
    p.add_argument("--resume-at", type=float, default=6.5, help="start of the resumed window (default 6.5 s)")
    p.add_argument("--resume-file", default="/tmp/bag_host_reads_resume.npz", help="saved run to resume from "
                   "(made when missing)")
    p.add_argument("--line-search-batch", type=int, default=4, help="SolverIPC's line_search_batch (default 4, CUDA's "
                   "default; the CPU's is 1)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "host_reads.json"))
    a = p.parse_args(argv)
    wp.config.quiet = True
    if not Path(a.resume_file).exists():
        print(f"making {a.resume_file}: the bag to {a.resume_at} s (uninstrumented)")
        run_bag(a.resume_at, resolution=1, device="cpu", progress=False, out=a.resume_file, save_every=1e9)
    rows = [window(f"rest to {a.until:g} s", a.line_search_batch, until=a.until),
            window(f"{a.resume_at:g} s to {a.resume_at + a.until:g} s (resumed)", a.line_search_batch,
                   until=a.resume_at + a.until, resume=a.resume_file, resume_at=a.resume_at)]
    Path(a.out).write_text(json.dumps(dict(windows=rows, line_search_batch=a.line_search_batch,
                                           threads=dict(MKL=os.environ["MKL_NUM_THREADS"])), indent=1) + "\n")


if __name__ == "__main__":
    main()
