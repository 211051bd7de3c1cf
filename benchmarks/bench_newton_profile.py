"""Benchmark: where the bag's Newton iterations go — one record per Newton iteration, from `SolverIPC(observer=...)`.

Runs the resolution-1 bag (from t = 0, or `--resume FILE --resume-at T` for a window) with an observer and records,
for every Newton iteration: the step it belongs to, dt (a subdivided step has dt < 1/240 s), the iteration index,
max|Δx|, ∇Φ·Δx, the CCD step bound α₀ of its first line-search trial, the α taken, Φ, and the largest free-particle
|∇Φᵢ| where the iteration started. α < α₀ means the Armijo test cut the step (log₂(α₀/α) overshoots); α₀ < 1 means the
step bound did. Writes PREFIX_iterations.npz beside the trajectory PREFIX.npz and prints a per-phase summary.

    python benchmarks/bench_newton_profile.py OUT_PREFIX [--until 10.5] [--resume FILE --resume-at T] [--summary]
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import newtonipc_nb.solver as solver_mod
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.scenes.bag_scene import DT
from newtonipc_nb.scenes.choreography import phase_at, phase_rows

FIELDS = ("step", "dt", "it", "max_dx", "slope", "bound", "alpha", "phi", "max_grad")


class Recorder:
    "The observer, plus a wrapper of the solver's step (the step count) and of the step-bound reading (α₀)."
    def __init__(self, k0: int):
        self.rows, self.step, self.bound = [], k0, np.nan
        step, bound = solver_mod.SolverIPC.step, solver_mod.bound_from_minimum

        def counted_step(solver, *a, **k):
            self.step += 1
            return step(solver, *a, **k)

        def recorded_bound(m, method="accd"):
            self.bound = bound(m, method)
            return self.bound
        solver_mod.SolverIPC.step, solver_mod.bound_from_minimum = counted_step, recorded_bound

    def __call__(self, info):
        g = info.system.grad.numpy()
        self.rows.append((self.step, info.dt, info.iteration, info.max_dx, info.slope, self.bound, info.alpha,
                          info.energy, float(np.abs(g).max())))
        self.bound = np.nan

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=FIELDS)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    "Per phase: steps, iterations, steps done in 2, bound-cut and Armijo-cut iterations, median α, overshoots."
    rows = phase_rows(None)
    df = df.assign(phase=[phase_at(s * DT, rows) for s in df.step])
    df["over"] = np.where(df.alpha > 0, np.round(np.log2(df.bound / df.alpha.where(df.alpha > 0))), 0)
    per_step = df.groupby("step").agg(n=("it", "size"), phase=("phase", "first"), sub=("dt", "min"))
    g = per_step.groupby("phase", sort=False).agg(steps=("n", "size"), iterations=("n", "sum"),
                                                 in_two=("n", lambda n: int((n <= 2).sum())),
                                                 subdivided=("sub", lambda d: int((d < DT * 0.99).sum())))
    h = df.groupby("phase", sort=False).agg(bound_cut=("bound", lambda b: int((b < 1).sum())),
                                            armijo_cut=("over", lambda o: int((o > 0).sum())),
                                            overshoots=("over", "sum"), alpha_median=("alpha", "median"))
    return g.join(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", type=Path)
    ap.add_argument("--until", type=float, default=10.5)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--resume-at", type=float, default=None)
    ap.add_argument("--summary", action="store_true", help="only summarise PREFIX_iterations.npz written before")
    a = ap.parse_args()
    it_file = a.prefix.with_name(a.prefix.name + "_iterations.npz")
    if not a.summary:
        k0 = 0 if a.resume_at is None else int(round(a.resume_at / DT))
        rec = Recorder(k0)
        try:
            run_bag(a.until, out=str(a.prefix.with_suffix(".npz")), progress=False, resume=a.resume,
                    resume_at=a.resume_at, observer=rec, save_every=30.0)
        finally:
            df = rec.frame()
            np.savez(it_file, **{c: df[c].to_numpy() for c in FIELDS})
    d = np.load(it_file)
    df = pd.DataFrame({c: d[c] for c in FIELDS})
    pd.set_option("display.width", 250)
    print(summary(df).to_string(float_format=lambda v: f"{v:.3g}"))
    print(f"total iterations {len(df)}", file=sys.stderr)


if __name__ == "__main__":
    main()
