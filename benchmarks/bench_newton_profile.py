"""Benchmark: where the bag's Newton iterations go — one record per Newton iteration, from `SolverIPC(observer=...)`.

Runs the bag (resolution 1 unless `--resolution`; from t = 0, or `--resume FILE --resume-at T` for a window) with an
observer and records, for every Newton iteration: the step it belongs to, dt (a subdivided step has dt < 1/240 s), the
iteration index, max|Δx|, ∇Φ·Δx, the CCD step bound α₀ of its first line-search trial, the α taken, Φ, and the largest
free-particle |∇Φᵢ| where the iteration started. α < α₀ means the Armijo test cut the step (log₂(α₀/α) overshoots); α₀ <
1 means the step bound did. Writes PREFIX_iterations.npz beside the trajectory PREFIX.npz and prints a per-phase
summary.

    python benchmarks/bench_newton_profile.py OUT_PREFIX [--until 10.5] [--resume FILE --resume-at T] [--resolution R]
                                              [--summary]
    python benchmarks/bench_newton_profile.py --compare BEFORE.npz AFTER.npz   # per-phase table of two full runs

`--compare` prints, per phase, for two trajectories run side by side: steps, Newton iterations, the solver's timed
milliseconds per iteration (all of each step's timers), Armijo overshoots, subdivided steps and subdivisions, and writes
benchmarks/results/newton_iterations.json.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import newtonipc_nb.line_search as line_search_mod
import newtonipc_nb.solver as solver_mod
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.scenes.bag_scene import DT
from newtonipc_nb.scenes.choreography import phase_at, phase_rows

FIELDS = ("step", "dt", "it", "max_dx", "slope", "bound", "alpha", "phi", "max_grad")


class Recorder:
    "The observer, plus a wrapper of the solver's step (the step count) and of the step-bound reading (α₀)."
    def __init__(self, k0: int):
        self.rows, self.step, self.bound = [], k0, np.nan
        step, bound = solver_mod.SolverIPC.step, line_search_mod.bound_from_minimum

        def counted_step(solver, *a, **k):
            self.step += 1
            return step(solver, *a, **k)

        def recorded_bound(m, method="accd"):
            self.bound = bound(m, method)
            return self.bound
        solver_mod.SolverIPC.step, line_search_mod.bound_from_minimum = counted_step, recorded_bound

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


TIMERS = ("candidates", "assembly", "factorisation", "solve", "ccd", "line_search")


def phase_table(path: Path) -> pd.DataFrame:
    "Per-phase sums of one trajectory's step statistics."
    d = np.load(path)
    rows = phase_rows(None)
    df = pd.DataFrame(dict(phase=[phase_at(t, rows) for t in d["step_t"]], iterations=d["step_newton_iterations"],
                           overshoots=d["step_line_search_trials"] - d["step_newton_iterations"],
                           subdivided=d["step_subdivisions"] > 0, subdivisions=d["step_subdivisions"],
                           timed=sum(d[f"step_time_{k}"] for k in TIMERS)))
    g = df.groupby("phase", sort=False).agg(steps=("iterations", "size"), iterations=("iterations", "sum"),
                                             overshoots=("overshoots", "sum"), subdivided=("subdivided", "sum"),
                                             subdivisions=("subdivisions", "sum"), timed=("timed", "sum"))
    g.loc["whole run"] = g.sum()
    g["ms_per_iteration"] = 1e3 * g.timed / g.iterations
    return g.drop(columns="timed").astype({"steps": int, "iterations": int, "overshoots": int, "subdivided": int,
                                              "subdivisions": int})


def compare(before: Path, after: Path):
    tabs = {"before": phase_table(before), "after": phase_table(after)}
    pd.set_option("display.width", 250)
    print(pd.concat(tabs, axis=1).to_string(float_format=lambda v: f"{v:.2f}"))
    out = Path(__file__).parent / "results" / "newton_iterations.json"
    out.write_text(json.dumps({k: t.reset_index().to_dict(orient="list") for k, t in tabs.items()}, indent=1,
                              default=float))
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", type=Path, nargs="?")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE.npz", "AFTER.npz"))
    ap.add_argument("--until", type=float, default=10.5)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--resume-at", type=float, default=None)
    ap.add_argument("--resolution", type=int, default=1)
    ap.add_argument("--summary", action="store_true", help="only summarise PREFIX_iterations.npz written before")
    a = ap.parse_args()
    if a.compare: return compare(*a.compare)
    if a.prefix is None: ap.error("give OUT_PREFIX or --compare")
    it_file = a.prefix.with_name(a.prefix.name + "_iterations.npz")
    if not a.summary:
        k0 = 0 if a.resume_at is None else int(round(a.resume_at / DT))
        rec = Recorder(k0)
        try:
            run_bag(a.until, out=str(a.prefix.with_suffix(".npz")), progress=False, resume=a.resume,
                    resume_at=a.resume_at, observer=rec, save_every=30.0, resolution=a.resolution)
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
