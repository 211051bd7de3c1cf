"""The bag scene end to end: the reference implementation's two-step smoke check, the first phase, the CLI's file, and
the full run (slow)."""
import errno
import json
import os
import signal
import subprocess
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import newtonipc_nb.scenes.bag_cli as bag_cli_module
import newtonipc_nb.scenes.bag_run as bag_run_module
from newtonipc_nb.intersections import count_intersections
from newtonipc_nb.scenes.bag_cli import main
from newtonipc_nb.scenes.bag_measure import measure, neck_width, waist
from newtonipc_nb.scenes.bag_run import Trajectory, apply_controls, load_trajectory, run_bag
from newtonipc_nb.scenes.bag_scene import (BAG_WAIST, BIN_HEIGHT, BIN_RADIUS, DT, HEM_RING, NECK_RING, BagScene,
                                           bag_mesh, ring_vertices)
from newtonipc_nb.scenes.choreography import SPHERE_DROPS
from newtonipc_nb.solver import EXACT_FROM

from cli_helpers import BAG, cli, fake_run, in_process, one_line, sigint_default


def test_bag_smoke_two_steps(tmp_path):
    out = tmp_path / "smoke.npz"
    run_bag(2 * DT, out=out, progress=False)
    d = load_trajectory(out)
    assert d["film"].shape == (3, 481, 3) and d["spheres"].shape == (3, 7, 3) and d["faces"].shape == (928, 3)
    assert str(d["stopped"]).startswith("completed")
    assert np.all(d["step_min_gap"] > 0)


def test_first_phase_folds_the_bag_over_the_rim_and_leaves_room_for_the_drops(tmp_path):
    out = tmp_path / "phase1.npz"
    run_bag(SPHERE_DROPS[0] - DT, out=out, progress=False, every=4)
    d = load_trajectory(out)
    film = d["film"].astype(np.float64)
    hem, neck = (film[-1][ring_vertices(r)] for r in (HEM_RING, NECK_RING))
    assert np.all(np.linalg.norm(hem[:, :2], axis=1) > BIN_RADIUS), "the hem hangs outside the bin's wall"
    assert hem[:, 2].max() < neck[:, 2].min(), "the flap is turned down over the rim"
    assert neck[:, 2].min() > BIN_HEIGHT, "the held neck stays above the rim: the empty bag is not pressed together"
    # just before the first drop no film halfway up the bin is nearer the axis than the waist the drop points allow for
    assert waist(film[-1]) >= BAG_WAIST
    assert all(count_intersections(f, d["faces"]) == 0 for f in film)
    assert np.all(d["step_min_gap"] > 0)
    # a step's first EXACT_FROM iterations are neither lengthened nor given the exact (perhaps indefinite) membrane
    late = np.maximum(d["step_newton_iterations"] - EXACT_FROM, 0)
    assert d["step_extended"].sum() > 0 and d["step_shifted"].sum() > 0, "the fold has nearly linear, indefinite steps"
    assert np.all(d["step_extended"] <= late) and np.all(d["step_shifted"] <= late)


def test_cli_writes_trajectory_and_measurements(tmp_path, capsys):
    out = tmp_path / "cli.npz"
    assert main(["--until", str(3 * DT), "--out", str(out), "--device", "cpu"]) == 0
    d = load_trajectory(out)
    assert d["film"].shape == (4, 481, 3)
    table = json.loads(out.with_suffix(".json").read_text())
    names = [r["measure"] for r in table["measurements"]]
    assert "self-intersection frames / all frames" in names and "neck width x × y" in names
    assert "self-intersection frames" in capsys.readouterr().out


@pytest.mark.slow
def test_full_bag_run(tmp_path):
    out = tmp_path / "bag.npz"
    run_bag(10.5, out=out, progress=False)
    d = load_trajectory(out)
    m = measure(d).set_index("measure")["value"]
    assert m["self-intersection frames / all frames"].startswith("0 /")
    assert m["sphere centres inside the bag, last frame"] == "7 / 7"
    assert float(m["largest sphere-centre z range, last 1 s"]) < 1.0
    rest = neck_width(bag_mesh()[0])
    nx, ny = (float(v) for v in m["neck width x × y"].split("×"))
    assert nx < 0.6e3 * rest[0] and ny < 0.6e3 * rest[1], "the tie holds the neck below 60 % of its open width"


def test_resume_continues_a_saved_run(tmp_path):
    out = tmp_path / "a.npz"
    a = run_bag(6 * DT, out=out, progress=False)
    b = run_bag(6 * DT, progress=False, resume=out, resume_at=3 * DT)
    assert len(b.time) == len(a.time) and b.resumed.startswith("resumed at t = 0.0125 s")
    assert len(b.steps) == 6 and [s["t"] for s in b.steps[:3]] == [s["t"] for s in a.steps[:3]]
    assert np.abs(np.asarray(b.film) - np.asarray(a.film)).max() < 1e-6
    assert np.abs(np.asarray(b.spheres) - np.asarray(a.spheres)).max() < 1e-6
    with pytest.raises(ValueError, match="no frame at"):
        run_bag(6 * DT, progress=False, resume=out, resume_at=1.0)
    run_bag(4 * DT, out=tmp_path / "every2.npz", progress=False, every=2)
    with pytest.raises(ValueError, match="every step stored"):
        run_bag(6 * DT, progress=False, resume=tmp_path / "every2.npz")


# --- `newtonipc-bag` never loses a finished run: the console script in subprocesses
# -------------------------------------
def bag_cli(*args):
    "`newtonipc-bag` with `args`, in this process (see `in_process`)."
    return in_process(BAG, *args)


@pytest.mark.parametrize("argv, says", [(["--until", "nan"], "≥ 0.00416667"), (["--until", "-1"], "≥ 0.00416667"),
                                        (["--until", "0"], "≥ 0.00416667"), (["--until", "inf"], "≥ 0.00416667"),
                                        (["--until", "ten"], "not a finite time"),
                                        (["--every", "0"], "whole number ≥ 1"), (["--every", "-3"], "whole number ≥ 1"),
                                        (["--resume", "x.npz", "--resume-at", "nan"], "finite time in seconds > 0"),
                                        (["--resume-at", "0.1"], "needs --resume"), (["--save-every", "-1"], "≥ 0")])
def test_cli_argument_ranges(argv, says, tmp_path):
    r = bag_cli(*argv, "--out", tmp_path / "x.npz")
    one_line(r, 2, "newtonipc-bag: error:", says)
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_cli_refuses_out_that_is_its_own_table(tmp_path):
    out = tmp_path / "traj.json"
    out.write_text("an older file")
    one_line(bag_cli("--out", out, "--until", DT), 2, str(out), ".npz name")
    assert out.read_text() == "an older file" and sorted(p.name for p in tmp_path.iterdir()) == ["traj.json"]


@pytest.mark.parametrize("where, says", [("missing/x.npz", "does not exist"), ("/dev/full/x.npz", "is not a directory"),
                                         ("adir", "not a regular file"), ("/dev/null", "not a regular file")])
def test_cli_checks_out_before_the_first_step(where, says, tmp_path):
    (tmp_path / "adir").mkdir()
    out = where if where.startswith("/") else tmp_path / where
    r = bag_cli("--out", out, "--until", DT, "--device", "cpu")
    one_line(r, 2, f"--out {out}", says)
    assert "stored in" not in r.stdout, "nothing was computed"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_cli_checks_out_is_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try: one_line(bag_cli("--out", ro / "x.npz", "--until", DT), 2, "cannot write in", "Permission denied")
    finally: ro.chmod(0o755)


def _truncated(path):
    fake_run(path)
    path.write_bytes(path.read_bytes()[:2000])
    return path

@pytest.mark.parametrize("make, says", [
    (lambda p: p, "no such file"),
    (lambda p: (p.write_bytes(b""), p)[1], "empty file"),
    (_truncated, "not a readable .npz"),
    (lambda p: (p.write_text("film,spheres\n1,2\n"), p)[1], "not a readable .npz"),
    (lambda p: fake_run(p, film=None), "it has no film array"),
    (lambda p: fake_run(p, positions=np.zeros(3), time=None), "it has no time array"),
    (lambda p: fake_run(p, film=np.zeros((5, 400, 3), np.float32)), "film has shape (5, 400, 3), this scene needs "
                                                                    "(5, 481, 3)"),
    (lambda p: fake_run(p, spheres=np.zeros((4, 7, 3), np.float32)), "spheres has shape (4, 7, 3)"),
    (lambda p: fake_run(p, film=np.full((5, 481, 3), np.nan, np.float32)), "5 of 5 frames hold NaN"),
    (lambda p: fake_run(p, time=np.r_[0.0, 1.0, 2.0, 3.0, np.nan]), "1 of 5 frames hold NaN or infinite values "
                                                                    "(the first is frame 4)"),
    (lambda p: fake_run(p, time=np.arange(5) * 2 * DT), "every step stored"),
    (lambda p: fake_run(p, frames=1), "a frame after t = 0"),
])
def test_cli_refuses_unusable_resume_files(make, says, tmp_path):
    f = make(tmp_path / "saved.npz")
    r = bag_cli("--resume", f, "--out", tmp_path / "new.npz", "--until", 0.1)
    one_line(r, 2, f"--resume {f}", says)
    assert not (tmp_path / "new.npz").exists()


def test_cli_resume_rules(tmp_path):
    f = fake_run(tmp_path / "saved.npz", frames=6)
    before = f.read_bytes()
    one_line(bag_cli("--resume", f, "--resume-at", 2 * DT, "--out", f, "--until", 0.1), 2,
             "is the file resumed from", "would drop its frames up to t = 0.0208 s", "give another --out")
    one_line(bag_cli("--resume", f, "--resume-at", 1.0, "--out", tmp_path / "b.npz"), 2, "no frame at t = 1.0000 s")
    one_line(bag_cli("--resume", f, "--out", tmp_path / "b.npz", "--until", 3 * DT), 2, "nothing left to compute")
    assert f.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["saved.npz"]


def _wait_for_frames(p, path, n, timeout=300):
    """Wait until the running command `p` has saved at least `n` frames in `path` (its writes are atomic: a file there
    is whole)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert p.poll() is None, f"newtonipc-bag exited {p.returncode} before {n} frames were saved"
        if path.exists() and len(load_trajectory(path)["time"]) >= n: return
        time.sleep(0.05)
    raise AssertionError(f"no {n} frames in {path} after {timeout} s")


def _interrupt(tmp_path, sig, out):
    """Start the whole scene, send `sig` once 3 frames are saved; the exit code, the last stderr line and the saved
    trajectory."""
    err = tmp_path / f"stderr-{sig}.txt"
    with open(err, "w") as e:
        p = subprocess.Popen([str(BAG), "--until", "10.5", "--out", str(out), "--device", "cpu", "--save-every", "0"],
                             stdout=subprocess.DEVNULL, stderr=e, preexec_fn=sigint_default)
        try:
            _wait_for_frames(p, out, 3)
            p.send_signal(sig)
            rc = p.wait(120)
        finally:
            if p.poll() is None: p.kill()
    text = err.read_text()
    assert "Traceback" not in text, text[-2000:]
    return rc, text.strip().splitlines()[-1], load_trajectory(out)


def test_sigterm_saves_the_run_and_resume_finishes_it_exactly(tmp_path):
    out = tmp_path / "run.npz"
    (tmp_path / "run.json").write_text("the table of an older run")
    rc, last, d = _interrupt(tmp_path, signal.SIGTERM, out)
    m = len(d["time"])
    assert rc == 143 and str(d["stopped"]).startswith("stopped by SIGTERM at t = ") and m >= 3
    assert (f"{m} frames saved in {out}; continue with: newtonipc-bag --resume {out} --out {out} --until 10.5 "
               f"--device cpu") in last
    assert not (tmp_path / "run.json").exists(), "the table of the file replaced is gone"
    assert not list(tmp_path.glob("*.tmp*"))
    n = m - 1 + 3                                           # three steps more than were saved
    r = cli(BAG, "--resume", out, "--out", out, "--until", n * DT, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = load_trajectory(out)
    assert len(d["time"]) == n + 1 and len(d["step_t"]) == n and str(d["stopped"]).startswith("completed")
    assert str(d["resumed"]).startswith(f"resumed at t = {(m - 1) * DT:.4f} s from {out}")
    assert json.loads((tmp_path / "run.json").read_text())["frames"] == n + 1
    ref = run_bag(n * DT, progress=False, device="cpu")
    assert np.abs(d["film"].astype(np.float64) - np.asarray(ref.film)).max() <= 1e-9
    assert np.abs(d["spheres"].astype(np.float64) - np.asarray(ref.spheres)).max() <= 1e-9


def test_ctrl_c_saves_the_run_with_the_resume_hint(tmp_path):
    out = tmp_path / "run.npz"
    rc, last, d = _interrupt(tmp_path, signal.SIGINT, out)
    assert rc == 130 and str(d["stopped"]).startswith("interrupted (Ctrl-C) at t = ")
    assert f"continue with: newtonipc-bag --resume {out} --out {out}" in last and not list(tmp_path.glob("*.tmp*"))


def _without_bar(err):
    "An in-process run's stderr without its progress bar, as a finished command with exit code 1."
    return subprocess.CompletedProcess([], 1, "", "\n".join(l for l in err.splitlines() if not l.startswith("bag:")))


def test_disk_full_cleans_up_and_names_the_path(tmp_path, monkeypatch, capsys):
    """A full disk on the first write: no temporary file, the path named, the older file at --out untouched and not
    reported; on a later write: the file holds this run's last good write, and says so."""
    write = bag_run_module.write_npz
    calls = []
    def full_disk_after(n):
        def write_npz(f, arrays, frames=None):
            calls.append(f)
            if len(calls) <= n: return write(f, arrays, frames)
            Path(f).write_bytes(b"PK\x03\x04 half a file")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return write_npz
    out = tmp_path / "run.npz"
    fake_run(out, stopped=np.asarray("an older run"))
    before = out.read_bytes()
    monkeypatch.setattr(bag_run_module, "write_npz", full_disk_after(0))
    assert main(["--until", str(2 * DT), "--out", str(out), "--device", "cpu", "--save-every", "0"]) == 1
    cap = capsys.readouterr()
    line = one_line(_without_bar(cap.err), 1, f"could not write {out}: No space left on device",
                    "this run wrote nothing there")
    assert "stopped:" not in cap.out and "an older run" not in cap.out + line
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["run.npz"]

    calls.clear()
    monkeypatch.setattr(bag_run_module, "write_npz", full_disk_after(1))
    assert main(["--until", str(3 * DT), "--out", str(out), "--device", "cpu", "--save-every", "0"]) == 1
    cap = capsys.readouterr()
    one_line(_without_bar(cap.err), 1, f"could not write {out}: No space left on device",
             "holds this run's last good write: 2 frames, up to t = 0.0042 s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.npz"]
    assert len(load_trajectory(out)["time"]) == 2


def test_until_past_the_scene_says_what_happens(monkeypatch, tmp_path, capsys):
    def stop(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(bag_cli_module, "run_bag", stop)
    assert main(["--until", "12", "--out", str(tmp_path / "x.npz"), "--device", "cpu"]) == 130
    cap = capsys.readouterr()
    assert ("the scene ends at 10.50 s (every support released at 9.40 s); from there to 12.00 s the bag rests on "
               "the floor with no supports") in cap.out
    assert "nothing was written" in cap.err


def test_save_every_writes_during_the_run(tmp_path):
    "With save_every=0 the file is written after every step (and at the end): each write sees one more frame."
    seen = []
    run_bag(3 * DT, out=tmp_path / "r.npz", progress=False, save_every=0,
            on_save=lambda tr, p: seen.append(len(tr.time)))
    assert seen == [2, 3, 4] and not list(tmp_path.glob("*.tmp*"))


# --- the bag at any resolution: the same choreography on finer meshes -------------------------------------------------
from newtonipc_nb.scenes.choreography import (GROUP_STIFFNESS, Choreographer, ScenarioCheckFailed, columns_up,
                                              group_particles, group_stiffness, tie_pairs)
from newtonipc_nb.scenes.bag_run import read_trajectory
from newtonipc_nb.scenes.bag_scene import bag_grid


def test_auto_membrane_hessian_switches_on_the_finer_bag():
    """At resolution 2 the exact membrane leaves most Newton matrices of the fold indefinite: the solver's default,
    `membrane_hessian="auto"`, turns to absolute values within its first 0.4 s (resolution 1 keeps the exact form:
    the whole run's figures in BENCHMARKS.md)."""
    scene = BagScene.build("cpu", 2)
    ch = Choreographer(resolution=2)
    assert scene.solver.options["membrane_hessian"] == "auto" and scene.solver._late == "exact"
    for k in range(96):
        apply_controls(scene, ch.controls((k + 1) * DT, scene.positions()))
        scene.solver.step(scene.state, scene.scratch, None, None, DT)
        scene.state, scene.scratch = scene.scratch, scene.state
    assert scene.solver._late == "absolute"


def _angles(v, idx):
    return np.arctan2(v[idx, 1], v[idx, 0])


@pytest.mark.parametrize("k", [2, 4])
def test_groups_select_the_same_places_at_every_resolution(k):
    v1, vk = bag_mesh(1)[0], bag_mesh(k)[0]
    for g in ("grips", "flap", "bands"):            # fixed points of the film: the very same rest positions
        assert np.array_equal(vk[group_particles(g, k)], v1[group_particles(g)]), g
    for g in ("hem", "neck", "body"):               # whole rings: at the same height, every column
        idx = group_particles(g, k)
        assert len(idx) == 32 * k and np.all(vk[idx, 2] == v1[group_particles(g)][0, 2]), g
    _, _, neck, hem = bag_grid(k)
    above_neck = np.arange(ring_vertices(neck + 1, k)[0], len(vk))   # rings are stored in order, the neck's next first
    assert np.array_equal(np.sort(group_particles("top_flap", k)), above_neck)
    assert np.array_equal(group_particles("hem", k), np.arange(len(vk) - 32 * k, len(vk))), "the hem is the last ring"


@pytest.mark.parametrize("k", [1, 2, 4])
def test_support_and_tie_totals_do_not_depend_on_resolution(k):
    for g, per_vertex in GROUP_STIFFNESS.items():
        total = group_stiffness(g, k) * len(group_particles(g, k))
        assert total == pytest.approx(per_vertex * len(group_particles(g)), rel=1e-12), g
    x1, xk = bag_mesh(1)[0], bag_mesh(k)[0]
    p1, pk = tie_pairs(), tie_pairs(k)
    assert pk.shape == (48, 2)
    np.testing.assert_array_equal(np.linalg.norm(xk[pk[:, 0]] - xk[pk[:, 1]], axis=1),
                                  np.linalg.norm(x1[p1[:, 0]] - x1[p1[:, 1]], axis=1))
    # what the choreography asks of a step: the same total stiffness on each group at every resolution
    c1, ck = (Choreographer(resolution=r).controls(0.5, bag_mesh(r)[0]) for r in (1, k))
    assert ck.support_stiffness.sum() == pytest.approx(c1.support_stiffness.sum(), rel=1e-12)
    assert len(ck.support_particles) == len(group_particles("hem", k)) + len(group_particles("neck", k))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_columns_up_for_any_column_count(k):
    v = bag_mesh(k)[0]
    up = columns_up(v, k)
    assert up.shape == (32 * k,) and up.all()
    _, columns, _, hem = bag_grid(k)
    v[ring_vertices(hem, k)[::3], 2] = 0.0           # every third column's hem below its neck
    assert np.flatnonzero(~columns_up(v, k)).tolist() == list(range(0, columns, 3))
    x = np.concatenate([bag_mesh(k)[0], np.zeros((40, 3))])       # a whole scene: film first, other particles after
    x[ring_vertices(hem, k)[1], 2] = -1.0
    ch = Choreographer([(0.0, 0.0, "check", "film", dict(check="columns_up"), "")], resolution=k)
    with pytest.raises(ScenarioCheckFailed, match=f"1 of {columns} columns do not point upward \\(columns \\[1\\]\\)"):
        ch.controls(0.0, x)


def test_bag_smoke_two_steps_at_resolution_2(tmp_path):
    out = tmp_path / "smoke2.npz"
    tr = run_bag(2 * DT, out=out, progress=False, resolution=2)
    d = load_trajectory(out)
    assert d["film"].shape == (3, 1761, 3) and d["faces"].shape == (3456, 3) and int(d["resolution"]) == 2
    assert np.array_equal(d["faces"], bag_mesh(2)[1]) and np.all(d["step_min_gap"] > 0)
    m = measure(tr).set_index("measure")["value"]
    assert m["mesh resolution (rings × columns, vertices)"] == "2 (30 × 64, 1,761 vertices)"
    assert m["self-intersection frames / all frames"] == "0 / 3"
    with pytest.raises(ValueError, match="resolution 1"):               # resuming it as a resolution-1 run is refused
        run_bag(4 * DT, progress=False, resume=out)
    b = run_bag(3 * DT, progress=False, resume=out, resolution=2)
    assert len(b.time) == 4 and b.resolution == 2


@pytest.mark.parametrize("value", ["3", "0", "x", "1.5", "-2"])
def test_cli_resolution_must_be_1_2_or_4(value, tmp_path):
    r = bag_cli("--resolution", value, "--out", tmp_path / "x.npz")
    one_line(r, 2, "newtonipc-bag: error: argument --resolution:", f"'{value}' is not a mesh resolution: give 1, 2 "
                                                                   f"or 4")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_cli_refuses_to_resume_a_run_of_another_resolution(tmp_path):
    v2, f2 = bag_mesh(2)
    # an older file: no resolution entry
    two = fake_run(tmp_path / "two.npz", film=np.repeat(v2[None].astype(np.float32), 5, 0), faces=f2)
    one_line(bag_cli("--resume", two, "--out", tmp_path / "b.npz", "--until",
                     0.1), 2, f"--resume {two}", "a run of the bag mesh at resolution 2 (1761 film vertices)",
             "this run is at resolution 1", "give --resolution 2 to use it")
    one = fake_run(tmp_path / "one.npz", resolution=np.asarray(1))
    one_line(bag_cli("--resume", one, "--out", tmp_path / "b.npz", "--until", 0.1, "--resolution",
                     "4"), 2, "a run of the bag mesh at resolution 1 (481 film vertices)",
             "this run is at resolution 4", "give --resolution 1")
    assert read_trajectory(two, 2)["film"].shape == (5, 1761, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.npz", "two.npz"]


def _traced_peak(fn) -> int:
    "The largest Python-traced memory (bytes, numpy arrays included) that `fn()` holds at once beyond what was held."
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _saved_run(path, frames: int):
    "A bag trajectory of `frames` frames of the rest mesh (and 7 sphere centres), saved to `path`."
    film, faces = bag_mesh(1)
    x = np.concatenate([film, [[0.0, 0.0, 0.05 + 0.01 * i] for i in range(7)]])       # the film, then 7 "spheres"
    traj = Trajectory(faces=faces)
    rng = np.random.default_rng(0)
    for k in range(frames):
        traj.record(k * DT, x + 1e-7 * rng.standard_normal(x.shape), np.arange(len(film)), np.arange(len(film), len(x)))
    traj.steps = [dict(t=(k + 1) * DT, newton_iterations=1, min_gap=1e-3) for k in range(frames - 1)]
    return traj, _traced_peak(lambda: traj.save(path))


def test_saving_and_measuring_a_long_run_hold_no_copy_of_its_frames(tmp_path):
    """Memory that follows the run: a save writes the frames one by one and the measurement converts one frame at a
    time, so twice the frames add almost nothing to either peak (a stacked FP32 copy would add the added frames' size,
    all frames in FP64 twice it); what stays is the mesh's own (the end's k-d tree, about 2 MB at resolution 1)."""
    peaks = []
    for n in (200, 400):
        traj, save_peak = _saved_run(tmp_path / f"run{n}.npz", n)
        d = load_trajectory(tmp_path / f"run{n}.npz")
        assert np.array_equal(d["film"], np.asarray(traj.film)) and d["film"].dtype == np.float32
        assert np.array_equal(d["spheres"], np.asarray(traj.spheres))
        measure(d)                                                          # the first call loads Warp's kernels
        peaks.append((save_peak, _traced_peak(lambda: measure(d)), sum(f.nbytes for f in traj.film)))
    added = peaks[1][2] - peaks[0][2]                                       # 200 more frames: 1.15 MB
    assert peaks[1][0] - peaks[0][0] < 0.1 * added
    assert peaks[1][1] - peaks[0][1] < 0.25 * added
