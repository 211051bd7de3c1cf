"""The bag scene at several mesh resolutions: one row per saved `newtonipc-bag` run (any `--resolution`, from t = 0,
every step stored) with its cost and its shape at a common time and at its end; writes nbs/data/bag_resolutions.json,
and with --preview a light copy (`thin_trajectory`) of one run for the bag page's playback.

Usage: python benchmarks/bag_resolutions.py RUN.npz [RUN.npz ...] [--at 3.0] [--rss RUN.npz=MB ...]
[--wall RUN.npz=SECONDS ...] [--preview RUN.npz --every 16]

A run resumed from a saved one (`newtonipc-bag --resume`) holds every frame and every step's statistics from t = 0,
but its file's wall time covers only the last segment: give the whole run's with --wall, or its row says none.

"""
import argparse
import json
from pathlib import Path

import numpy as np

from newtonipc_nb.scenes.bag_measure import flap_height, measure, neck_width
from newtonipc_nb.scenes.bag_run import load_trajectory, thin_trajectory, trajectory_resolution

DATA = Path(__file__).resolve().parents[1] / "nbs" / "data"


def _shape_at(d, t):
    "Neck width (mm, x × y) and flap height (mm) of the stored frame nearest `t`, with that frame's time."
    k = int(np.argmin(np.abs(d["time"] - t)))
    f = d["film"][k].astype(np.float64)
    nx, ny = neck_width(f)
    return dict(time=float(d["time"][k]), neck_width_mm=[round(1e3 * nx, 2), round(1e3 * ny, 2)],
                flap_height_mm=round(1e3 * flap_height(f), 2))


def summary(path, at: float, rss_mb=None, wall_s=None) -> dict:
    """One run's row: resolution, cost, shape at `at` and at its end, and its full measurement table; `wall_s` the
    whole run's wall time where the file's does not cover it (a resumed run)."""
    d = load_trajectory(path)
    resumed = str(d.get("resumed", ""))
    if float(d["time"][0]) > 0: raise SystemExit(f"{path}: its first frame is at t = {float(d['time'][0])} s; give "
                                                 f"runs stored from t = 0")
    if wall_s is None and not resumed: wall_s = float(d["wall_time"])
    t = np.asarray(d["time"])
    it = np.asarray(d["step_newton_iterations"])
    early = np.asarray(d["step_t"]) <= at + 1e-9
    timed = sum(np.asarray(d[k]) for k in d if k.startswith("step_time_"))
    return dict(file=Path(path).name, resolution=trajectory_resolution(d), vertices=int(d["film"].shape[1]),
                stopped=str(d["stopped"]), end=float(t[-1]), steps=int(len(it)),
                resumed=resumed, wall_time_s=None if wall_s is None else round(wall_s, 1),
                newton_iterations=int(it.sum()), subdivisions=int(np.sum(d["step_subdivisions"])),
                solver_s_per_step=round(float(timed.sum() / len(it)), 4),
                solver_s_per_step_to_at=round(float(timed[early].sum() / max(early.sum(), 1)),
                                              4), newton_iterations_to_at=int(it[early].sum()), peak_rss_mb=rss_mb,
                at=_shape_at(d, at) if t[-1] >= at - 1e-9 else None, last=_shape_at(d, t[-1]),
                measurements=measure(d).to_dict(orient="records"))


def _per_run(parser, pairs: list[str], runs: list[Path]) -> dict:
    """RUN.npz=VALUE pairs keyed by the run's resolved path: two runs in different folders may share a file name."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if Path(key).resolve() not in runs: parser.error(f"{pair}: {key} is not one of the runs given")
        try: out[Path(key).resolve()] = float(value)
        except ValueError: parser.error(f"{pair}: {value!r} is not a number")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="saved newtonipc-bag trajectories (every step stored, from t = 0)")
    p.add_argument("--at", type=float, default=3.0, help="common time (s) at which every run's shape is compared "
                                                         "(default 3.0, the end of the peel)")
    p.add_argument("--rss", nargs="*", default=[], metavar="RUN.npz=MB", help="peak resident memory of a run (from "
                                                                              "/usr/bin/time -v)")
    p.add_argument("--wall", nargs="*", default=[], metavar="RUN.npz=SECONDS", help="the whole run's wall time, for "
                                                                                 "a resumed run")
    p.add_argument("--preview", default=None, metavar="RUN.npz", help="also write a light copy of this run to "
                                                                      "nbs/data/bag_res<K>_preview.npz")
    p.add_argument("--every", type=int, default=16, help="frames kept in the preview: every N-th (default 16)")
    p.add_argument("--out", default=str(DATA / "bag_resolutions.json"))
    a = p.parse_args(argv)
    runs = [Path(r).resolve() for r in a.runs]
    rss, wall = _per_run(p, a.rss, runs), _per_run(p, a.wall, runs)
    rows = [summary(r, a.at, rss.get(k), wall.get(k)) for r, k in zip(a.runs, runs)]
    Path(a.out).write_text(json.dumps(dict(at=a.at, runs=rows), indent=1, ensure_ascii=False) + "\n")
    for r in rows:
        print(f"resolution {r['resolution']}: {r['stopped']}; {r['wall_time_s']} s wall, "
              f"{r['newton_iterations']:,} iterations, "
              f"{r['solver_s_per_step']} s solver per step; at {a.at} s: {r['at']}; end: {r['last']}")
    if a.preview:
        k = trajectory_resolution(load_trajectory(a.preview))
        print("preview:", thin_trajectory(a.preview, DATA / f"bag_res{k}_preview.npz", every=a.every))


if __name__ == "__main__":
    main()
