"""Resident memory of `newtonipc-bag` runs: peak and how it grows with simulated time, per mesh resolution.

Each run is the command a user types (`newtonipc-bag --until T --resolution K --out TMP`), in its own process, so the
figures include the imported stack (Warp, Newton, torch, MKL), the solver, the stored frames, the file writes and the
measurement at the end. The parent samples the child's resident set (VmRSS in /proc/PID/status) every `--sample`
seconds and reads the simulated time from the progress bar; the peak is the child's own high-water mark
(`ru_maxrss`, what `/usr/bin/time -v` reports). Growth is the least-squares slope of RSS over simulated time in the
second half of the run (MB per simulated second): memory that follows the mesh is flat there, memory that follows the
run is not. Run with one MKL/OpenMP thread so that runs are comparable on a shared machine.

With `--frames N` it measures only what the end of a long run adds, without running it: a trajectory of N stored
frames of the rest bag (a full 10.5 s run stores 2,521) is saved as `Trajectory.save` does every few seconds, then
loaded and measured as `newtonipc-bag` does when the run ends; each in a fresh process, reporting the peak RSS above
the process's RSS before it (`--frames` 0 measures nothing beyond the imports).

Usage: python benchmarks/bag_memory.py [--resolution 1 2] [--until 0.5] [--sample 0.5] [--frames N]
       [--out benchmarks/results/bag_memory.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

_T = re.compile(rb"t=([0-9.]+)s")
_BAG = "import sys; from newtonipc_nb.scenes.launch import bag; sys.exit(bag())"      # the console script


def _rss_mb(pid: int) -> float | None:
    "The resident set of process `pid` in MB, None once it is gone."
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"): return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(resolution: int, until: float, sample: float) -> dict:
    "One `newtonipc-bag` run in a child process: its RSS samples (simulated time, MB), peak RSS and CPU time."
    env = dict(os.environ, MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", _BAG, "--until", str(until), "--resolution",
               str(resolution), "--out", str(Path(tmp) / "bag.npz"), "--device", "cpu"]
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sim = [0.0]

        def progress():                     # the bar's last "t=…s": how far the run has got
            for chunk in iter(lambda: child.stderr.read1(4096), b""):
                hits = _T.findall(chunk)
                if hits: sim[0] = float(hits[-1])

        reader = threading.Thread(target=progress, daemon=True)
        reader.start()
        samples = []
        while True:                         # reaped here, not by Popen: wait4 also gives the child's peak and CPU time
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid: break
            r = _rss_mb(child.pid)
            if r is not None: samples.append((sim[0], r))
            time.sleep(sample)
        child.returncode = os.waitstatus_to_exitcode(status)
        reader.join(timeout=5)
    if child.returncode != 0: raise SystemExit(f"resolution {resolution}: newtonipc-bag exited {child.returncode}")
    return dict(resolution=resolution, until=until, samples=samples, cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                peak_rss_mb=usage.ru_maxrss / 1024)


def summary(r: dict) -> dict:
    "Peak RSS, RSS once stepping began and at the end of stepping, and the growth rate over the run's second half."
    s = np.array([p for p in r["samples"] if p[0] > 0] or [(0.0, np.nan)])
    late = s[s[:, 0] >= 0.5 * r["until"]]
    slope = float(np.polyfit(late[:, 0], late[:, 1], 1)[0]) if len(np.unique(late[:, 0])) > 2 else float("nan")
    return dict(resolution=r["resolution"], until_s=r["until"], peak_rss_mb=round(r["peak_rss_mb"], 1),
                rss_first_step_mb=round(float(s[0, 1]), 1), rss_last_step_mb=round(float(s[-1, 1]), 1),
                growth_mb_per_simulated_s=round(slope, 2), cpu_s=r["cpu_s"])


def _peak_kb() -> int:
    "This process's resident high-water mark (VmHWM) in kB."
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def frames_child(resolution: int, frames: int, what: str):
    "In a fresh process: the peak RSS (MB) that saving (`save`) or loading and measuring (`measure`) N frames adds."
    import warp as wp
    from newtonipc_nb.scenes.bag_measure import measure
    from newtonipc_nb.scenes.bag_run import Trajectory, load_trajectory
    from newtonipc_nb.scenes.bag_scene import BagScene, bag_mesh
    wp.config.quiet = True
    scene = BagScene.build("cpu", resolution)
    x = scene.positions()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bag.npz"
        traj = Trajectory(faces=bag_mesh(resolution)[1], resolution=resolution)
        for k in range(frames): traj.record(k / 240, x, scene.film, scene.spheres)
        traj.steps = [dict(t=k / 240, newton_iterations=1, min_gap=1e-3) for k in range(max(frames - 1, 0))]
        if what == "measure":
            traj.save(path)
            del traj
        base = _peak_kb()
        traj.save(path) if what == "save" else measure(load_trajectory(path), device="cpu")
        print(json.dumps(dict(resolution=resolution, frames=frames, what=what,
                              added_peak_mb=round((_peak_kb() - base) / 1024, 1), base_peak_mb=round(base / 1024, 1))))


def frames_run(resolution: int, frames: int, what: str) -> dict:
    env = dict(os.environ, MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, __file__, "--child", what, "--resolution", str(resolution), "--frames",
                          str(frames)], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, nargs="+", default=[1, 2])
    p.add_argument("--until", type=float, default=0.5, help="simulated seconds per run (default 0.5)")
    p.add_argument("--sample", type=float, default=0.5, help="seconds between RSS samples (default 0.5)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "bag_memory.json"))
    p.add_argument("--frames", type=int, default=None, help="measure saving and measuring N stored frames instead")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child: return frames_child(a.resolution[0], a.frames, a.child)
    if a.frames is not None:
        rows = [frames_run(k, a.frames, w) for k in a.resolution for w in ("save", "measure")]
        for r in rows:
            print(f"resolution {r['resolution']}, {r['frames']} frames, {r['what']:>7}: +{r['added_peak_mb']} MB peak "
                  f"above {r['base_peak_mb']} MB")
        Path(a.out).write_text(json.dumps(dict(rows=rows), indent=1) + "\n")
        return
    runs = [run(k, a.until, a.sample) for k in a.resolution]
    rows = [summary(r) for r in runs]
    print(f"{'res':>3} {'until s':>7} {'peak MB':>8} {'first step MB':>13} {'last step MB':>12} "
          f"{'MB / sim s (2nd half)':>21} {'CPU s':>7}")
    for w in rows:
        print(f"{w['resolution']:>3} {w['until_s']:>7} {w['peak_rss_mb']:>8} {w['rss_first_step_mb']:>13} "
              f"{w['rss_last_step_mb']:>12} {w['growth_mb_per_simulated_s']:>21} {w['cpu_s']:>7}")
    Path(a.out).write_text(json.dumps(dict(rows=rows, runs=runs), indent=1) + "\n")


if __name__ == "__main__":
    main()
