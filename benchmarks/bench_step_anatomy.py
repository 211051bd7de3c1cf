"""Diagnostic: one hard bag step, Newton iteration by Newton iteration.

Resumes a saved run at `--at` (at its resolution) and takes one step. For every Newton iteration it
records the step length α the line search took, the decrease of Φ, the ratio ρ of that decrease to the one a quadratic
model with its minimum at α = 1 predicts (−s(α − α²/2), s = ∇Φ·Δx), the longest particle move ‖Δxᵢ‖ of the direction
and its particle, and the shift τ of the factorisation. Where the line search cut the step (α < 1), Φ is evaluated
along the direction on a grid of α (where is its minimum?) and each term's energy change at α = 1 (which term
rises?). Prints both tables and writes benchmarks/results/step_anatomy.json (or `--out`).

    python benchmarks/bench_step_anatomy.py RUN.npz --at 2.2083
"""
import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import warp as wp

import newtonipc_nb.solver as solver_mod
from newtonipc_nb.line_search import _axpy
from bench_linear import window_steps
from newtonipc_nb.scenes.bag_scene import DT

TERMS = ("inertia", "membrane", "bending", "barrier", "friction", "supports", "tie", "_drag")
GRID = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1.0)


def energy(solver, x: wp.array, names=TERMS) -> dict:
    "Each named term's energy at x (the solver's current candidate sets)."
    out = {}
    for name in names:
        acc = wp.zeros(1, dtype=wp.float64, device=solver.device)
        getattr(solver, name).add_energy(x, acc)
        out[name] = float(acc.numpy()[0])
    return out


def along(solver, x: wp.array, alpha: float) -> wp.array:
    y = wp.zeros_like(x)
    wp.launch(_axpy, dim=len(x), inputs=[x, solver._dx, wp.float64(alpha), y], device=solver.device)
    return y


class Recorder:
    "Wraps `SolverIPC._direction` and `_iteration` for the one step, recording every iteration."
    def __init__(self):
        self.rows, self.cuts = [], []
        self._direction, self._iteration = solver_mod.SolverIPC._direction, solver_mod.SolverIPC._iteration
        rec = self

        def direction(solver, x, st):
            out = rec._direction(solver, x, st)
            rec.slope = out[0]
            return out

        def iteration(solver, x, phi, k, dt, st):
            alpha, phi_t, done = rec._iteration(solver, x, phi, k, dt, st)
            rec.record(solver, x, phi, k, alpha, phi_t)
            return alpha, phi_t, done
        solver_mod.SolverIPC._direction, solver_mod.SolverIPC._iteration = direction, iteration

    def record(self, solver, x, phi, k, alpha, phi_t):
        move = np.linalg.norm(solver._dx.numpy(), axis=1)
        s = self.slope
        self.rows.append(dict(iteration=k, alpha=alpha, decrease=phi - phi_t,
                              rho=(phi - phi_t) / (-s * (alpha - alpha * alpha / 2)) if alpha > 0 else np.nan,
                              slope=s, longest_move_mm=1e3 * float(move.max()), particle=int(move.argmax()),
                              tau=solver.system.tau))
        if 0 < alpha < 1:
            line = [solver._phi(along(solver, x, a)) - phi for a in GRID]
            e0, e1 = energy(solver, x), energy(solver, along(solver, x, 1.0))
            self.cuts.append(dict(iteration=k, alpha=alpha, line_min_alpha=GRID[int(np.argmin(line))],
                                  line_min_decrease=-min(line), taken_decrease=phi - phi_t,
                                  **{f"d_{n}": e1[n] - e0[n] for n in TERMS}))

    def restore(self):
        solver_mod.SolverIPC._direction, solver_mod.SolverIPC._iteration = self._direction, self._iteration


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a saved bag run (every step stored)")
    ap.add_argument("--at", type=float, required=True, help="the frame to take one step from (s)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "step_anatomy.json")
    a = ap.parse_args()
    rec = Recorder()
    try:
        window_steps(a.run, a.at, a.at + DT)
    finally:
        rec.restore()
    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 400)
    fmt = lambda v: f"{v:.3g}"          # noqa: E731
    print(pd.DataFrame(rec.rows).to_string(index=False, float_format=fmt))
    print(f"\nwhere the line search cut the step: Φ along Δx (grid {', '.join(f'{g:g}' for g in GRID)}) and each "
          f"term's energy change at α = 1 (J)")
    print(pd.DataFrame(rec.cuts).to_string(index=False, float_format=fmt))
    a.out.write_text(json.dumps(dict(run=a.run, at=a.at, iterations=rec.rows,
                                     cut=rec.cuts), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
