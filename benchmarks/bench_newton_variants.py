"""Benchmark: Newton-iteration variants on windows of the bag, each resumed from one saved run.

Every variant patches the solver in this process only; the committed solver is the first row. Variants:

* `friction-sticky`: friction's majorizing blocks for the rest of a step once one of its line searches cut the step
  (committed: only in the iteration right after a cut one); `friction-exact`: never the majorizer.
* `shift-keep`: after a shifted iteration, the step's next factorisation starts at that τ (committed: τ = 0, then a
  tenth of it, then ×10); `shift-tenth`: starts at a tenth of it, skipping τ = 0.
* `damped`: after a step cut below α = ½ the next iteration is shifted by at least `--damping` (Levenberg–Marquardt
  on the equilibrated matrix; four times more after each further cut), and only a full step removes the shift; such
  a damped iteration never declares convergence (its step is shorter than the Newton step the tolerance is about);
  `damped-converges` lets it.
* `barrier-exact`: each contact's unprojected Hessian from the fifth iteration on, after a full step.
* `membrane-absolute`: the membrane's absolute-value Hessian instead of its exact one in an iteration (from the
  fourth) that follows a step cut below α = ½.

Prints Newton iterations per window and the refused (indefinite) factorisations of all windows, and writes
benchmarks/results/newton_variants.json (or `--out`).

    python benchmarks/bench_newton_variants.py RUN.npz [--windows 2.0 2.3 5.4 5.8 ...]
        [--variants committed friction-sticky ...] [--damping 0.3]
"""
import argparse
import json
import time
from pathlib import Path

import pandas as pd

import newtonipc_nb.linear as linear_mod
import newtonipc_nb.solver as solver_mod
from bench_linear import window_steps

WINDOWS = (2.0, 2.3, 5.4, 5.8, 6.2, 6.6, 8.0, 8.4, 9.38, 9.6)
REFUSED = [0]          # factorisations refused (indefinite) under the current variant
VARIANTS = ("committed", "friction-sticky", "friction-exact", "shift-keep", "shift-tenth", "damped",
            "damped-converges", "barrier-exact", "membrane-absolute")


def patched(variant: str, damping: float):
    """Install `variant` into the solver module; returns a function that restores it. The step's state (a cut seen, the
    last τ, the damping) lives on the solver, reset at each step's first iteration."""
    S, factorise_shifted = solver_mod.SolverIPC, linear_mod.factorise_shifted
    iteration, direction = S._iteration, S._direction

    def shifted(linear, system, last=0.0, shift=True):
        s, refused = shifted.solver, linear.stats["indefinite"]
        start = {"shift-keep": s._last_tau, "shift-tenth": s._last_tau / 10, "damped": s._damp,
                 "damped-converges": s._damp}.get(variant, 0.0)
        if not (shift and start > 0): tau = factorise_shifted(linear, system, last, shift)
        else:
            tau = start
            while True:
                system.shift(tau)
                try:
                    linear.prepare(system)
                    break
                except linear_mod.NotPositiveDefinite:
                    linear.stats["indefinite"] += 1
                    if tau >= linear_mod.SHIFT_MAX: raise
                    tau *= 10
            linear.stats["shifted"] += 1
        s._last_tau = tau
        REFUSED[0] += linear.stats["indefinite"] - refused
        return tau

    def new_iteration(s, x, phi, k, dt, st):
        if k == 0: s._cut, s._cut_half, s._last_tau, s._damp = False, False, 0.0, 0.0
        shifted.solver, s._k, tolerance = s, k, s.options["tolerance"]
        if variant == "damped" and s._damp > 0: s.options["tolerance"] = 0.0
        try:
            alpha, phi_t, done = iteration(s, x, phi, k, dt, st)
        finally:
            s.options["tolerance"] = tolerance
        s._cut, s._cut_half = s._cut or not s._full, 0 < alpha < 0.5
        if variant.startswith("damped"):
            s._damp = max(4 * s._damp, damping) if 0 < alpha < 0.5 else (0.0 if alpha == 1.0 else s._damp)
        return alpha, phi_t, done

    def new_direction(s, x, st):
        if variant == "friction-sticky" and s._cut: s.friction.hessian = "majorizer"
        if variant == "friction-exact": s.friction.hessian = "exact"
        if variant == "barrier-exact" and s._k >= 4 and s._full: s.barrier.hessian = "exact"
        if variant == "membrane-absolute" and s._cut_half and s.membrane.hessian == "exact":
            s.membrane.hessian = "absolute"
        return direction(s, x, st)

    S._iteration, S._direction, solver_mod.factorise_shifted = new_iteration, new_direction, shifted

    def restore():
        S._iteration, S._direction, solver_mod.factorise_shifted = iteration, direction, factorise_shifted
    return restore


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a saved bag run (every step stored)")
    ap.add_argument("--windows", type=float, nargs="+", default=list(WINDOWS), help="pairs T0 T1 (s)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--damping", type=float, default=0.3, help="`damped`: the shift after a cut step")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "newton_variants.json")
    a = ap.parse_args()
    if len(a.windows) % 2: ap.error("--windows takes pairs T0 T1")
    windows = list(zip(a.windows[::2], a.windows[1::2]))
    rows = []
    for variant in a.variants:
        restore, wall, REFUSED[0] = patched(variant, a.damping), time.perf_counter(), 0
        try:
            counts = [int(window_steps(a.run, t0, t1)["newton_iterations"].sum()) for t0, t1 in windows]
        finally:
            restore()
        rows.append(dict(variant=variant, **{f"{t0:g}–{t1:g}": n for (t0, t1), n in zip(windows, counts)},
                         total=sum(counts), refused=REFUSED[0], wall_s=round(time.perf_counter() - wall, 1)))
        print(rows[-1], flush=True)
    pd.set_option("display.width", 200)
    print(pd.DataFrame(rows).to_string(index=False))
    a.out.write_text(json.dumps(dict(run=a.run, damping=a.damping, rows=rows), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
