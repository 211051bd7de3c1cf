"""Whether the seven spheres settle the same way when the path is nudged. The bag scene runs from t = 0 to --until
(default 3.0 s, the end of the lift; at least 0.89 s, the first drop), once as it is and once per seed with every
film vertex moved, after the first step, by a seeded random offset of --nudge in each coordinate (default 1e-7 m:
smaller than the 2e-7 m by which the device check, benchmarks/gpu_check.py, lets a CUDA run's positions differ from
the CPU's over the first 24 steps). A run whose packing depends on such a nudge depends on the device and the linear
solver's rounding too.

Per run: the film's waist (`bag_measure.waist`: its least distance from the axis halfway up the bin) just before the
first drop (what the drop points allow for) and how far the film vertex farthest from the un-nudged run's is then;
for runs that reach the hem's release, the pile's top at the step before it against the rim and how far the farthest
sphere sits from where the un-nudged run put it then; how many spheres are inside the bag at --until, Newton
iterations and wall time; a run to the scene's end (--until 10.5) also gets the scene's verdict:
intersecting frames, neck and flap. --neck-stiffness and --neck-release set how the neck is held while the bag is
filled (`Choreography`; the handling before 2026-12-07: 20 N/m, let go at 0.8 s). Prints a table, writes JSON.

Usage: python benchmarks/bag_drops.py [--resolution 1] [--seeds 0 1 2 3] [--nudge 1e-7] [--until 3.0]
[--neck-stiffness 300] [--neck-release 2.0] [--json benchmarks/results/bag_drops_res1.json]
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from newtonipc_nb.scenes.bag_measure import inside_bag, measure, waist
from newtonipc_nb.scenes.bag_run import load_trajectory, run_bag
from newtonipc_nb.scenes.bag_scene import BAG_WAIST, BIN_HEIGHT, DT, SPHERE_RADII
from newtonipc_nb.scenes.choreography import SPHERE_DROPS, Choreography

HEM_RELEASE = 2.0               # s, the timeline lets go of the hem here: the pile is measured one step before
SCENE_END = 10.5                # s, the end of the timeline: a run to it is judged on every frame


def nudged_start(first: dict, seed, nudge: float) -> dict:
    "The one-step run `first` with its last film frame moved by a seeded offset in [-nudge, nudge] (seed None: as is)."
    d = dict(first)
    if seed is not None:
        film = d["film"].copy()
        film[-1] += np.random.default_rng(seed).uniform(-nudge, nudge, film[-1].shape).astype(np.float32)
        d["film"] = film
    return d


def _frame(d: dict, t: float) -> int:
    return int(np.argmin(np.abs(d["time"] - t)))


def summary(d: dict, base: dict | None, wall: float) -> dict:
    "One run's row (`base`: the un-nudged run's trajectory, for how far its spheres moved)."
    film = d["film"].astype(np.float64)
    k0 = _frame(d, SPHERE_DROPS[0] - DT)
    fold = None if base is None else round(1e3 * np.abs(film[k0] - base["film"][k0]).max(), 3)
    s = d["spheres"].astype(np.float64)
    pile = {}
    if d["time"][-1] >= HEM_RELEASE - 1e-9:     # the drops are over: how high and where the spheres lie
        kp = _frame(d, HEM_RELEASE - DT)
        top = (s[kp, :, 2] + np.asarray(SPHERE_RADII)).max()
        moved = None if base is None else round(1e3 * np.linalg.norm(s[kp] - base["spheres"][kp], axis=1).max(), 2)
        pile = {f"pile top at {d['time'][kp]:.4f} s (mm)": round(1e3 * top, 1),
                "above the rim (mm)": round(1e3 * (top - BIN_HEIGHT), 1),
                "farthest sphere from the un-nudged run's (mm)": moved}
    inside = inside_bag(s[-1], film[-1], d["faces"])
    it = np.asarray(d["step_newton_iterations"])
    whole = {}
    if d["time"][-1] >= SCENE_END - 1e-9:       # a whole run: the scene's verdict on every stored frame too
        m = {r["measure"]: r["value"] for r in measure(d).to_dict(orient="records")}
        whole = {k: m[k] for k in ("self-intersection frames / all frames", "neck width x × y", "flap height")}
    return {"waist before the drops (mm)": round(1e3 * waist(film[k0]), 2),
            "farthest film vertex from the un-nudged run's then (mm)": fold, **pile,
            f"spheres inside at {d['time'][-1]:.2f} s": f"{int(inside.sum())} / {len(inside)}",
            **whole, "Newton iterations": int(it.sum()), "wall (s)": round(wall, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resolution", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3])
    p.add_argument("--nudge", type=float, default=1e-7, help="m, the largest offset per coordinate")
    p.add_argument("--until", type=float, default=3.0)
    p.add_argument("--neck-stiffness", type=float, default=Choreography().neck_stiffness,
                   help="N/m per neck vertex at resolution 1")
    p.add_argument("--neck-release", type=float, default=Choreography().neck_release, help="s")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if a.until < SPHERE_DROPS[0]: p.error(f"--until must reach the first drop, {SPHERE_DROPS[0]:.2f} s")
    try:
        ch = Choreography(neck_stiffness=a.neck_stiffness, neck_release=a.neck_release)
    except ValueError as e:
        p.error(str(e))
    rows, base = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "first.npz"
        run_bag(DT, out=first, progress=False, resolution=a.resolution, device=a.device, choreography=ch)
        first = load_trajectory(first)
        for seed in [None, *a.seeds]:
            t0 = time.perf_counter()
            traj = run_bag(a.until, resume=nudged_start(first, seed, a.nudge), progress=False, device=a.device,
                           resolution=a.resolution, choreography=ch, out=Path(tmp) / "run.npz")
            wall = time.perf_counter() - t0
            d = load_trajectory(Path(tmp) / "run.npz")
            if not str(traj.stopped).startswith("completed"): raise SystemExit(f"seed {seed}: {traj.stopped}")
            name = "un-nudged" if seed is None else f"seed {seed}"
            rows[name] = summary(d, base, wall)
            if seed is None: base = d
            print(name, rows[name], flush=True)
    table = pd.DataFrame(rows).T
    print(f"\nresolution {a.resolution}, nudge {a.nudge:g} m after the first step, neck held at {ch.neck_stiffness:g} "
          f"N/m until {ch.neck_release:g} s; the drop points allow for a waist of {1e3 * BAG_WAIST:.1f} mm; rim at "
          f"{1e3 * BIN_HEIGHT:.0f} mm\n")
    print(table.to_string())
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(dict(resolution=a.resolution, nudge_m=a.nudge, until_s=a.until,
                                          neck_stiffness=ch.neck_stiffness, neck_release_s=ch.neck_release, runs=rows),
                                     indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
