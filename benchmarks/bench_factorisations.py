"""Benchmark: where the bag's factorisations go — accepted and refused, and the exact membrane's trials, per phase.

A Newton iteration factorises its matrix at least once. PARDISO refuses an indefinite matrix, and the refusal is
paid for in full: with the membrane's exact form (`membrane_hessian="auto"` before it settles on absolute values) a
refused matrix is shifted by τ I and factorised again (`factorise_shifted`), and once the rule has settled, the exact
form tried after a full step (`MembraneHessianRule.trial`) is factorised and, if refused, the iteration is assembled
and factorised again in absolute values. This script runs the bag (resolution 1 unless `--resolution`; from t = 0,
or `--resume FILE --resume-at T` for a window, where the rule starts again in the exact form) with an observer and
counts per phase: Newton iterations, accepted and refused factorisations, iterations with a shifted matrix, trials
of the exact form and refused trials, pattern analyses, and the run's wall time. `--settled` starts the rule in its
settled form (absolute values, exact on trial), as a whole run at resolution 2 or 4 leaves it, so that a window
resumed from its state is solved the same way; `--no-trials` never tries the exact form. Prints the table and
writes benchmarks/results/factorisations.json (or `--out`).

    python benchmarks/bench_factorisations.py [--resolution 2] [--until 10.5] [--resume FILE --resume-at T]
                                              [--settled] [--no-trials]
"""
import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd

from bench_linear import settle_membrane_rule
import newtonipc_nb.elastic as elastic_mod
import newtonipc_nb.solver as solver_mod
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.scenes.bag_scene import DT
from newtonipc_nb.scenes.choreography import phase_at, phase_rows

COUNTS = ("factorisations", "indefinite", "analyses")


class Counter:
    "The observer, plus wrappers of the solver's step (the step count) and of the rule's trial outcome."
    def __init__(self, k0: int, settled: bool = False, trials: bool = True):
        self.step, self.rows, self.trials = k0, [], []
        rule = elastic_mod.MembraneHessianRule
        step, tried = solver_mod.SolverIPC.step, rule.tried

        def counted_step(solver, *a, **k):
            self.step += 1
            return step(solver, *a, **k)

        def counted_trial(rule, refused):
            self.trials.append((self.step, bool(refused)))
            return tried(rule, refused)
        solver_mod.SolverIPC.step, rule.tried = counted_step, counted_trial
        if settled: settle_membrane_rule()
        if not trials: rule.trial = lambda r: False

    def __call__(self, info):
        self.rows.append((self.step, info.system.tau > 0, *(info.linear_stats.get(k, 0) for k in COUNTS)))

    def table(self) -> pd.DataFrame:
        "Per phase: iterations, accepted and refused factorisations, shifted iterations, trials, refused trials."
        df = pd.DataFrame(self.rows, columns=("step", "shifted", *COUNTS))
        totals = df[list(COUNTS)]
        df[list(COUNTS)] = totals.diff().fillna(totals.iloc[0])       # the solver's counts are running totals
        rows = phase_rows(None)
        df["phase"] = [phase_at(s * DT, rows) for s in df.step]
        tr = pd.DataFrame(self.trials, columns=("step", "refused"))
        tr["phase"] = [phase_at(s * DT, rows) for s in tr.step]
        g = df.groupby("phase", sort=False).agg(iterations=("step", "size"), accepted=("factorisations", "sum"),
                                                refused=("indefinite", "sum"), shifted=("shifted", "sum"),
                                                analyses=("analyses", "sum"))
        g = g.join(tr.groupby("phase", sort=False).agg(trials=("step", "size"), refused_trials=("refused", "sum")))
        g = g.fillna(0).astype(int)
        g.loc["whole run"] = g.sum()
        return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--until", type=float, default=10.5)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--resume-at", type=float, default=None)
    ap.add_argument("--resolution", type=int, default=1)
    ap.add_argument("--settled", action="store_true", help="the membrane rule starts settled on absolute values")
    ap.add_argument("--no-trials", action="store_true", help="never try the exact membrane")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "factorisations.json")
    a = ap.parse_args()
    counter = Counter(0 if a.resume_at is None else int(round(a.resume_at / DT)), a.settled, not a.no_trials)
    t = time.perf_counter()
    run_bag(a.until, progress=False, resume=a.resume, resume_at=a.resume_at, observer=counter,
            resolution=a.resolution)
    wall = time.perf_counter() - t
    g = counter.table()
    pd.set_option("display.width", 250)
    print(g.to_string())
    total = g.loc["whole run"]
    print(f"run wall {wall:.1f} s; refused factorisations per iteration {total.refused / max(1, total.iterations):.3f}")
    a.out.write_text(json.dumps(dict(resolution=a.resolution, until=a.until, resume=a.resume, resume_at=a.resume_at,
                                     settled=a.settled, trials=not a.no_trials,
                                     wall_s=wall, machine=platform.processor() or platform.machine(),
                                     table=g.reset_index().to_dict(orient="list")), indent=1, default=float))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
