"""Benchmark and acceptance runs: Newton's own cloth examples on SolverIPC and on their own SolverVBD, in one run.

Each example runs through `newtonipc_nb.verification.newton_examples.run_example` (the example module imported
unmodified from the installed newton, its solver swapped for SolverIPC on the IPC side), IPC first and then VBD,
in this one process on one device. Wall time is the sum of the examples' `step()` calls (construction, graph
capture, recording and measurements excluded); `cpu_s` is the process CPU time of the run (construction and
measurement included), the figure to compare when other jobs share the cores. Each run is measured on every stored
frame: intersecting triangle pairs (`count_intersections`) and the smallest signed distance from the particles to each
collision shape.

Writes the summaries to --out (JSON; reruns merge into it, keyed by example and solver), a preview of both runs
per example to --previews (the page `nbs/38_newton_examples_page.ipynb` shows them) and, with --npz DIR, every full
trajectory.

    python benchmarks/bench_newton_examples.py [--examples cloth_hanging cloth_twist cloth_poker_cards]
        [--frames cloth_twist=150] [--budget cloth_twist=1800] [--solvers ipc vbd] [--device cpu]
        [--ipc KEY=VALUE ...]

--budget NAME=SECONDS (or NAME:SOLVER=SECONDS for one solver) ends each solver's run of that example after the
frame that passes SECONDS of wall time (construction included): the partial run is measured and stored like a full
one, with the frames reached and "deadline reached after K of N frames" in place of the example's test (which is
only meaningful at the end).
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd
import warp as wp

from newtonipc_nb.verification.newton_examples import (_option_value, examples_table, ipc_acceptance,
                                                        measure_run, run_example, run_summary, save_preview, save_run)

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="+", default=["cloth_hanging", "cloth_twist", "cloth_poker_cards"])
    ap.add_argument("--frames", nargs="*", default=[], metavar="NAME=N", help="frames of an example (default: its own)")
    ap.add_argument("--budget", nargs="*", default=[], metavar="NAME[:SOLVER]=SECONDS",
                    help="wall-time limit of each solver's run of an example (default: none)")
    ap.add_argument("--solvers", nargs="+", choices=("ipc", "vbd"), default=["ipc", "vbd"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ipc", action="append", default=[], metavar="KEY=VALUE", help="a SolverIPC option (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "newton_examples.json"))
    ap.add_argument("--previews", default=str(ROOT / "nbs" / "data"), help="folder for the newton_example_NAME.npz")
    ap.add_argument("--npz", default=None, help="folder for the full trajectories (NAME_SOLVER.npz)")
    a = ap.parse_args()
    frames = {k: int(v) for k, v in (kv.split("=", 1) for kv in a.frames)}
    budget = {k: float(v) for k, v in (kv.split("=", 1) for kv in a.budget)}
    options = {k: _option_value(v) for k, v in (kv.split("=", 1) for kv in a.ipc)}
    wp.config.quiet = True
    out = Path(a.out)
    done = json.loads(out.read_text()) if out.exists() else dict(runs=[])
    for name in a.examples:
        runs = {}
        for solver in a.solvers:
            t0, c0 = time.perf_counter(), time.process_time()
            limit = budget.get(f"{name}:{solver}", budget.get(name))
            deadline = time.time() + limit if limit is not None else None
            run = run_example(name, solver=solver, frames=frames.get(name), device=a.device, ipc_options=options,
                              progress=True, deadline=deadline)
            measures = measure_run(run, device=a.device)
            s = run_summary(run, measures)
            # CPU seconds of this process (all its threads): unlike wall time, not inflated by other jobs
            s.update(date=time.strftime("%Y-%m-%d %H:%M"), total_s=time.perf_counter() - t0,
                     cpu_s=time.process_time() - c0,
                     acceptance=ipc_acceptance(s) if solver == "ipc" else None)
            runs[solver] = (run, measures)
            done["runs"] = [r for r in done["runs"] if (r["example"], r["solver"]) != (name, solver)] + [s]
            stopped = f" ({s['error']})" if s['error'] else ""
            print(f"{name} {solver}: {s['frames']} frames{stopped}, steps {s['wall_s']:.1f} s, "
                  f"test_final {s['test_final']}, "
                  f"intersecting frames {s['intersecting_frames']}, "
                  f"min distance to shapes {s['min_shape_distance']:.3e} m",
                  flush=True)
            if a.npz:
                Path(a.npz).mkdir(parents=True, exist_ok=True)
                save_run(run, measures, Path(a.npz) / f"{name}_{solver}.npz")
        save_preview(runs, Path(a.previews) / f"newton_example_{name}.npz")
        done["meta"] = dict(device=a.device, warp=wp.config.version, python=platform.python_version(),
                            machine=platform.machine(), cpu_count=os.cpu_count(), ipc_options=options,
                            note="2 shared cores, other jobs running: wall times are inflated by contention")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(done, indent=1))
    pd.set_option("display.width", 250)
    print(examples_table(done["runs"]).to_string(index=False))


if __name__ == "__main__":
    main()
