"""Benchmark: PARDISO's Cholesky factor in FP32, the FP64 Newton system solved to it by iterative refinement.

z₀ = 0; r_k = b − A z_k in FP64; z_{k+1} = z_k + (L̃L̃ᵀ)⁻¹ r_k with L̃ the FP32 factor (PARDISO's `iparm[27]` = 1: its
arrays and factor in FP32). Two measurements:

* **The bag's own systems** (every Newton system of the step after `--at` of a saved run, four at most; medians of
  `--repeat` calls): FP64 factorisation and solve as committed (`pardiso_handle`), FP32 factorisation and solve, and
  the relative residuals ‖b − A z‖/‖b‖ of the refinement, step by step, to `--tol`.
* **Windows of the bag solved with it** (`--window T0 T1`, resumed from the same run; `--settled` starts the membrane
  rule on absolute values as a whole run at resolution 2 or 4 leaves it): Newton iterations and the solver's timers
  with the committed `PardisoSolver` and with `Fp32Pardiso` below (a prototype: FP32 factor, the residual by Warp's
  block product on the FP64 matrix, the FP64 factor where `REFINE_STEPS` solves do not reach `--tol`);
  `--check-verdicts` also factorises every matrix in FP64 and counts the matrices the two precisions judge apart.

Prints the tables and writes benchmarks/results/mixed_precision.json (or `--out`).

    python benchmarks/bench_mixed_precision.py RUN.npz --at T [--tol 1e-12]
        [--window T0 T1 [--settled] [--check-verdicts]] [--repeat 9]
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
import warp as wp
import warp.sparse as wps

from bench_linear import median_ms, settle_membrane_rule, systems_of_saved_run, window_steps
from bench_pardiso_settings import call
from newtonipc_nb.linear import (NotPositiveDefinite, PardisoSolver, PatternIncomplete, ScalarCSR, import_pypardiso,
                                 pardiso_handle)

REFINE_STEPS = 8


def handle(single: bool):
    ps = pardiso_handle(import_pypardiso())
    ps.iparm[27] = int(single)
    return ps


def measure(system, repeat: int, tol: float) -> dict:
    "FP64 against FP32 on one system, and the refinement's residuals step by step."
    csr = ScalarCSR(system, upper=True)
    csr.refresh()
    U = sp.csr_matrix((csr.data.numpy().copy(), csr.indices, csr.indptr), shape=csr.shape)
    A, n = U + sp.triu(U, 1).T, U.shape[0]
    b = np.random.default_rng(0).standard_normal(n)
    ia, ja = (U.indptr + 1).astype(np.int32), (U.indices + 1).astype(np.int32)
    row = dict(n=n)
    for name, dtype in (("fp64", np.float64), ("fp32", np.float32)):
        ps, a, bb, x = handle(dtype == np.float32), U.data.astype(dtype), b.astype(dtype), np.zeros(n, dtype)
        run = lambda phase: call(ps, phase, n, a, ia, ja, bb, x)        # noqa: E731
        run(11)
        row[f"{name}_factorise_ms"], row[f"{name}_solve_ms"] = median_ms(lambda: run(22), repeat), median_ms(
            lambda: run(33), repeat)
        if name == "fp64": row["fp64_residual"] = float(np.linalg.norm(A @ x - b) / np.linalg.norm(b))
        else:
            z, r, history = np.zeros(n), b.copy(), []
            while len(history) < REFINE_STEPS and (not history or history[-1] > tol):
                bb[:] = r
                run(33)
                z += x
                r = b - A @ z
                history.append(float(np.linalg.norm(r) / np.linalg.norm(b)))
            row.update(refinement_steps=len(history), residuals=history)
        call(ps, -1, n, a, ia, ja, bb, x)
    return row


class Fp32Pardiso(PardisoSolver):
    """Prototype: `PardisoSolver`'s pattern and refusals with the factor in FP32; each solve refines in FP64 (the
    residual by Warp's block product on the system's FP64 matrix) to `tol`, else factorises that matrix in FP64."""
    name = "pardiso-fp32"

    def __init__(self, tol: float, check: bool = False):
        super().__init__()
        self.tol, self.check, self._double = tol, check, PardisoSolver()
        self.stats.update(refinement_steps=0, fallbacks=0, verdicts=0, verdicts_differ=0)

    def analyse(self, system):
        if self._ps is None: self._ps = handle(single=True)
        elif self._n: call(self._ps, -1, self._n, self._a, self._ia, self._ja, self._b, self._x)
        self.csr = ScalarCSR(system, upper=True)
        self._ia, self._ja = self.csr.indptr + 1, self.csr.indices + 1
        self._n = n = 3 * system.n
        self._a, self._b, self._x = np.zeros(len(self.csr.indices), np.float32), np.zeros(n, np.float32), np.zeros(
            n, np.float32)
        self._r = wp.zeros(system.n, dtype=wp.vec3d, device=system.device)
        self._double.invalidate()
        self._fp32(11)

    def _fp32(self, phase: int):
        call(self._ps, phase, self._n, self._a, self._ia, self._ja, self._b, self._x)

    def factorise(self, system):
        if system.flags.numpy()[0]: raise PatternIncomplete("pardiso-fp32: a block outside the pattern")
        np.copyto(self._a, self.csr.refresh().numpy(), casting="same_kind")
        if not self.check: return self._fp32(22)
        verdicts = []
        for factorise in (lambda: self._fp32(22), lambda: self._double.prepare(system)):
            try:
                factorise()
                verdicts.append(True)
            except NotPositiveDefinite:
                verdicts.append(False)
        self.stats["verdicts"] += 1
        self.stats["verdicts_differ"] += verdicts[0] != verdicts[1]
        if not verdicts[0]: raise NotPositiveDefinite("pardiso-fp32: the FP32 factorisation refused the matrix")

    def solve(self, system, out):
        z, r = out.numpy().reshape(-1), self._r.numpy().reshape(-1)     # views of the Warp arrays (CPU)
        z[:] = 0.0
        wp.copy(self._r, system.rhs)
        bound = self.tol * float(np.linalg.norm(r))
        for k in range(1, REFINE_STEPS + 1):
            self._b[:] = r
            self._fp32(33)
            z += self._x
            wp.copy(self._r, system.rhs)
            wps.bsr_mv(system.H, out, self._r, alpha=-1.0, beta=1.0)
            if float(np.linalg.norm(r)) <= bound: break
        self.stats["refinement_steps"] += k
        if float(np.linalg.norm(r)) > bound:
            self.stats["fallbacks"] += 1
            self._double.prepare(system)
            self._double.solve(system, out)
        self.stats["solves"] += 1


def window(run: str, t0: float, t1: float, settled: bool, linear_solver) -> dict:
    "Newton iterations and timers of the bag from `t0` to `t1` resumed from `run`, with `linear_solver`."
    undo = settle_membrane_rule() if settled else (lambda: None)
    wall = time.perf_counter()
    try:
        steps = window_steps(run, t0, t1, linear_solver=linear_solver)
    finally:
        undo()
    row = dict(solver=linear_solver.name, iterations=int(steps["newton_iterations"].sum()),
               wall_s=time.perf_counter() - wall,
               **{f"{k}_s": float(steps[f"time_{k}"].sum()) for k in ("assembly", "factorisation", "solve")})
    if isinstance(linear_solver, Fp32Pardiso):
        row.update({k: linear_solver.stats[k] for k in ("refinement_steps", "fallbacks", "verdicts",
                                                        "verdicts_differ")})
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a saved bag run (every step stored)")
    ap.add_argument("--at", type=float, required=True, help="the systems of the step after this time (s)")
    ap.add_argument("--tol", type=float, default=1e-12, help="the refinement's relative residual")
    ap.add_argument("--window", type=float, nargs=2, metavar=("T0", "T1"), default=None)
    ap.add_argument("--settled", action="store_true", help="the membrane rule starts on absolute values")
    ap.add_argument("--check-verdicts", action="store_true",
                    help="factorise every window matrix in FP64 too and count differing verdicts (timings then "
                         "mean nothing)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mixed_precision.json")
    a = ap.parse_args()
    systems = systems_of_saved_run(a.run, a.at)
    picked = systems[:: max(1, len(systems) // 4)][:4]
    rows = [dict(system=k, **measure(s, a.repeat, a.tol)) for k, s in enumerate(picked)]
    pd.set_option("display.width", 200)
    print(f"{len(picked)} of {len(systems)} Newton systems of the step after t = {a.at:g} s of {a.run}")
    shown = pd.DataFrame(rows).assign(residuals=[" ".join(f"{v:.0e}" for v in r["residuals"]) for r in rows])
    print(shown.to_string(float_format=lambda v: f"{v:.3g}"))
    windows = []
    if a.window:
        for solver in (PardisoSolver(), Fp32Pardiso(a.tol, a.check_verdicts)):
            windows.append(window(a.run, *a.window, a.settled, solver))
        print(f"window {a.window[0]:g}–{a.window[1]:g} s"
              f"{', rule settled' if a.settled else ''}, refinement to {a.tol:g}")
        print(pd.DataFrame(windows).to_string(float_format=lambda v: f"{v:.3g}"))
    a.out.write_text(json.dumps(dict(run=a.run, at=a.at, tol=a.tol, window=a.window, settled=a.settled,
                                     systems=rows, windows=windows), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
