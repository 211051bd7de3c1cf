"""Benchmark: SolverIPC time per step and its split on a cloth drop, for 500 to 32k film vertices and three linear
solvers.

The scene is the cloth drop of tests/test_solver.py scaled up: an n × n square sheet of the bag film (30 µm, StVK
membrane + hinge bending, 5 mm vertex spacing so the flat sheet has no self-contact within dhat) starting 0.5 mm above a
fixed sphere of radius 0.2·L (L the sheet width) resting on a fixed floor, falling at 0.1 m/s under gravity, drag 2 s⁻¹.
Contact is active from the first step. Each configuration runs its first few steps of dt = 1/240 s (kernels are compiled
beforehand on a 6 × 6 sheet); we report the mean over the timed steps of the wall time per step, Newton iterations and
line-search trials, and the split of `SolverIPC.last_stats.times` (candidates / assembly / solve / ccd / line search;
"other" is the rest of the step: FP32 recheck, intersection check of the start, inertia set-up). Dense Cholesky runs
only up to --dense-max vertices (8·(3N)² bytes and O(N³) per factorisation). Scaling exponents are least-squares slopes
of log(time) over log(vertices) per linear solver, per step and per Newton iteration (the iteration count grows with the
size). The solver's `observer` sees every Newton iteration: PCG's CG iterations per solve and the number of pattern
analyses come from the linear solver's own statistics.

python benchmarks/bench_solver.py [--sizes 22 45 90 179] [--solvers pardiso cholespy dense pcg] [--budget 240]

"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import warp as wp

import newton
from newtonipc_nb.inputs import BAG_FILM, add_mesh, grid_faces, set_hinge_stiffness
from newtonipc_nb.solver import SolverIPC
from newtonipc_nb.solver_interface import TIME_KEYS as SPLIT


def drop_scene(n, spacing=5e-3, gap=5e-4, speed=0.1, device="cpu"):
    "An n × n film sheet `gap` above a fixed sphere of radius 0.2 L on a fixed floor; returns (model, state)."
    L = spacing * (n - 1)
    R = 0.2 * L
    b = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -9.81))
    u = np.linspace(-L / 2, L / 2, n)
    X, Y = np.meshgrid(u, u, indexing="ij")
    v = np.stack([X.ravel(), Y.ravel(), np.full(n * n, R + gap)], 1)
    first = len(b.edge_indices)
    add_mesh(b, v, grid_faces(n), density=BAG_FILM.areal_density, mu=BAG_FILM.mu, lam=BAG_FILM.lam)
    set_hinge_stiffness(b, first, BAG_FILM.D, rule="reference")
    h = L
    add_mesh(b, np.array([[-h, -h, -R - 1e-3], [h, -h, -R - 1e-3], [h, h, -R - 1e-3], [-h, h, -R - 1e-3]]),
             np.array([[0, 1, 2], [0, 2, 3]], np.int32), density=0.0)
    b.add_particle(wp.vec3(0.0, 0.0, 0.0), wp.vec3(0.0, 0.0, 0.0), mass=0.0, radius=R)   # the fixed sphere
    model = b.finalize(device=device)
    state = model.state()
    qd = state.particle_qd.numpy()
    qd[:n * n, 2] = -speed
    state.particle_qd.assign(qd)
    return model, state


def run_config(n, solver_name, steps, budget, device="cpu"):
    model, s0 = drop_scene(n, device=device)
    s1 = model.state()
    cg_iterations = []          # CG iterations of every PCG solve, from the linear solver's statistics
    def observe(info):
        if "last_cg_iterations" in info.linear_stats: cg_iterations.append(info.linear_stats["last_cg_iterations"])
    solver = SolverIPC(model, linear_solver=solver_name, drag=2.0, observer=observe)
    rows = []
    start = time.perf_counter()
    for k in range(steps):
        if k and time.perf_counter() - start > budget: break
        t = time.perf_counter()
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
        wall = time.perf_counter() - t
        st = solver.last_stats
        rows.append(
            dict(wall=wall, iterations=st.newton_iterations, trials=st.line_search_trials, subdivisions=st.subdivisions,
                 n_candidates=sum(st.candidates.values()), min_gap=st.min_gap,
                 **{f't_{k2}': st.times[k2]
                    for k2 in SPLIT}))
    r = pd.DataFrame(rows).mean()
    nv = n * n
    out = dict(n=n, vertices=nv, dofs=3 * nv, linear_solver=solver_name, steps=len(rows),
               step_s=r.wall, iterations=r.iterations, line_search_trials=r.trials, subdivisions=r.subdivisions,
               candidates=r.n_candidates, min_gap_um=1e6 * r.min_gap,
               **{f"{k2}_s": r[f't_{k2}'] for k2 in SPLIT})
    out["other_s"] = out["step_s"] - sum(out[f"{k2}_s"] for k2 in SPLIT)
    for k2 in ("step", "assembly", "factorisation", "solve"):
        out[f"{k2}_per_iteration_s"] = out[f"{k2}_s"] / max(out["iterations"], 1)
    out["pcg_iterations_mean"] = float(np.mean(cg_iterations)) if cg_iterations else None
    out["pattern_analyses"] = solver.linear.stats["analyses"]
    return out


def warm_up(solvers, device):
    "Compile every kernel once on a tiny sheet so that no timed step includes compilation."
    for s in solvers:
        model, s0 = drop_scene(6, device=device)
        SolverIPC(model, linear_solver=s, drag=2.0).step(s0, model.state(), None, None, 1 / 240)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[22, 45, 90, 179], help="sheet side n (n² film vertices)")
    ap.add_argument("--solvers", nargs="+", default=["pardiso", "cholespy", "dense", "pcg"])
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 3, 2, 2], help="timed steps per size (last value "
                                                                               "repeats)")
    ap.add_argument("--dense-max", type=int, default=3000, help="largest vertex count for the dense solver")
    ap.add_argument("--pcg-max", type=int, default=3000, help="largest vertex count for PCG (hundreds of CG "
                                                              "iterations per solve on the CPU)")
    ap.add_argument("--budget", type=float, default=240.0, help="stop timing a configuration after this many "
                                                                "seconds (≥ 1 step)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "solver.json"))
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    warm_up(a.solvers, a.device)
    rows, skipped = [], []
    for i, n in enumerate(a.sizes):
        steps = a.steps[min(i, len(a.steps) - 1)]
        for s in a.solvers:
            if s == "dense" and n * n > a.dense_max:
                skipped.append(
                    dict(vertices=n * n, linear_solver=s,
                         reason=f"dense matrix {8 * (3 * n * n) ** 2 / 2**30:.1f} GiB, O(N³) factorisation"))
                continue
            if s == "pcg" and n * n > a.pcg_max:
                skipped.append(dict(vertices=n * n, linear_solver=s, reason="PCG (Warp CG, block-Jacobi, to a true "
                                                                            "relative residual of 1e-12) needs "
                                                                            "hundreds of CG iterations per solve "
                                                                            "on these stiff, light films"))
                continue
            r = run_config(n, s, steps, a.budget, a.device)
            rows.append(r)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            # progress, in case the run is cut short
            Path(a.out).with_suffix(".partial.json").write_text(json.dumps(rows, indent=1))
            print(f"n={n:4d} ({n * n:6d} vertices) {s:9s} {r['step_s']:9.3f} s/step  {r['iterations']:.1f} it  "
                  + "  ".join(f"{k}={r[k + '_s']:.3f}" for k in SPLIT), flush=True)
    table = pd.DataFrame(rows)
    exps = {}
    for s, g in table.groupby("linear_solver"):
        if len(g) >= 2:
            fit = lambda col: float(np.polyfit(np.log(g.vertices), np.log(g[col]), 1)[0])
            exps[s] = dict(step=fit("step_s"), step_per_iteration=fit("step_per_iteration_s"),
                           solve_per_iteration=fit("solve_per_iteration_s"),
                           factorisation_per_iteration=fit("factorisation_per_iteration_s"),
                           assembly_per_iteration=fit("assembly_per_iteration_s"),
                           vertices=[int(v) for v in g.vertices])
    pd.set_option("display.width", 200)
    cols = (["vertices", "linear_solver", "steps", "step_s", "iterations", "line_search_trials", "candidates"] +
            [f"{k}_s" for k in SPLIT] + [
                "other_s", "factorisation_per_iteration_s", "solve_per_iteration_s", "pattern_analyses",
                "pcg_iterations_mean"
            ])
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for s, e in exps.items():
        print(f"scaling exponent ({s}, over {e['vertices']}): step {e['step']:.2f}, per Newton iteration: step "
              f"{e['step_per_iteration']:.2f}, "
              f"solve {e['solve_per_iteration']:.2f}, assembly {e['assembly_per_iteration']:.2f}")
    for k in skipped: print(f"skipped: {k}")
    meta = dict(
        benchmark="solver", scene="cloth drop: n×n bag-film sheet (5 mm spacing), 0.5 mm above a fixed "
        "sphere (R = 0.2 L) on a floor, 0.1 m/s down, drag 2/s", dt=1 / 240,
        options="SolverIPC defaults (StVK, dhat 1 mm, kappa 1000, mu 0.35, tolerance 1.2e-5 m, "
        "ACCD step bound)",
        statistic="mean over the timed steps (the first steps of the drop; kernels compiled beforehand on "
        "a tiny sheet), wall seconds per step",
        note="2 CPU cores; other work may share them: absolute times vary ±30 %", device=a.device,
        warp=wp.config.version, numpy=np.__version__, torch=__import__("torch").__version__,
        python=platform.python_version(), machine=platform.machine(), cpu_count=os.cpu_count(),
        date=time.strftime("%Y-%m-%d"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(meta=meta, results=rows, skipped=skipped, scaling_exponents=exps), indent=1))
    Path(a.out).with_suffix(".partial.json").unlink(missing_ok=True)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
