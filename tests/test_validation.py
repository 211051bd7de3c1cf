"""The validation runner and the Newton VBD side-by-side harness."""
import json
import subprocess
import sys

import pytest

from newtonipc_nb.verification.runner import main

EXPECTED = ["VT scene, 12 steps: min mid-surface distance (µm)", "EE scene, 12 steps: min mid-surface distance (µm)",
            "VT hinge angle at start (°)", "VT hinge angle after 12 steps (°)",
            "initial overlap rejected, outputs untouched", "edge through face rejected, outputs untouched",
            "hinge angle gradient vs central differences", "VT assembled ∇Φ vs central differences of Φ",
            "EE assembled ∇Φ vs central differences of Φ", "swept candidates, 17 instants (24 steps, VT + EE)",
            "linear relative residual, pardiso (default on the CPU)", "linear relative residual, cholespy",
            "linear relative residual, dense", "linear relative residual, pcg",
            "fast crossing α, reference normal bound", "fast crossing α, additive CCD (default)",
            "VT GPU vs CPU, 6 steps (StVK)", "EE GPU vs CPU, 6 steps (StVK)",
            "bag smoke: 2 steps, Neo-Hookean, 7 spheres, bin, floor"]


def test_default_runner_passes_with_every_check(tmp_path, capsys):
    report = tmp_path / "report.json"
    assert main(["--report", str(report)]) == 0
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    names = [r["check"] for r in data["checks"]]
    assert names == EXPECTED
    assert data["failed"] == []
    assert all(r["result"] in ("pass", "skipped") for r in data["checks"])
    for name in EXPECTED: assert name in out
    seeds = {r["check"]: r["reference"] for r in data["checks"]}
    assert seeds[EXPECTED[0]] == "838.96" and seeds[EXPECTED[1]] == "651.40" and seeds[EXPECTED[3]] == "−7.229"


def test_linear_relative_residual_rows_pass_and_can_fail(monkeypatch):
    """The linear relative residual < 1e-7, on the Newton systems of bag contact steps (at least two) and of a 13th step
    of each reference scene: one passing row per solver; a solution off by a relative 1e-6 is caught."""
    import re
    import newtonipc_nb.verification.runner as v
    runs = {k: v.reference_run(k) for k in ("vt", "ee")}
    systems, where = v.linear_systems(runs)
    assert set(systems) == {"bag", "VT", "EE"} and all(len(s) >= 2 for s in systems.values())
    assert float(re.search(r"gap (\d+) µm", where).group(1)) < 900.5       # a barrier contact is active in the bag step
    rows = v.residual_checks(v.linear_residual_table(systems), where)
    assert [r.check for r in rows] == EXPECTED[10:14]
    for r in rows:
        assert r.passed is True and r.reference == "—", (r.check, r.measured)
        solved, unscaled = (float(x) for x in re.match(r"solved (\S+), unscaled (\S+) ", r.measured).groups())
        assert 0 < solved < 1e-7 and 0 < unscaled
        if "pcg" not in r.check: assert unscaled < 1e-7
    g, H, D = systems["bag"][0]
    assert v.linear_residuals((g, H, D), "pardiso")[0] < 1e-10
    exact = v.solve_linear
    monkeypatch.setattr(v, "solve_linear", lambda H, b, m: exact(H, b, m) * (1 + 1e-6))
    solved, unscaled = v.linear_residuals((g, H, D), "pardiso")
    # r = ε·b exactly: the measure is the residual
    assert abs(solved - 1e-6) < 1e-8 and abs(unscaled - 1e-6) < 1e-8
    bad = v.residual_checks(v.linear_residual_table({"bag": systems["bag"][:1]}), "")
    assert [r.passed for r in bad] == [False, False, False, False]


def test_a_failing_check_fails_the_runner(monkeypatch, capsys):
    import newtonipc_nb.verification.runner as v
    def broken(): raise RuntimeError("boom")
    monkeypatch.setattr(v, "check_fast_crossing", broken)
    monkeypatch.setattr(v, "check_bag_smoke", lambda: v.Verdict("bag smoke", "x", "y", "", True))
    assert v.main([]) == 1
    assert "RuntimeError: boom" in capsys.readouterr().out


def test_console_script_exists():
    import configparser, pathlib
    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).parents[1] / "settings.ini")
    scripts = cfg["DEFAULT"]["console_scripts"].split()
    # the runner's main, behind the start-up guard
    assert "newtonipc-validate=newtonipc_nb.scenes.launch:validate" in scripts
    import inspect
    from newtonipc_nb.scenes import launch
    assert '"newtonipc_nb.verification.runner:main"' in inspect.getsource(launch.validate)


@pytest.mark.slow
def test_full_runner(tmp_path):
    assert main(["--full", "--report", str(tmp_path / "r.json"), "--bag-out", str(tmp_path / "bag.npz")]) == 0


def test_vbd_side_by_side_runs_both_solvers_for_0_2_s(tmp_path):
    """The VBD harness: 0.2 s of the bag choreography through SolverIPC and Newton's SolverVBD, same measures."""
    import numpy as np
    from newtonipc_nb.verification.vbd import SEED_SIDE_BY_SIDE, compare_vbd
    table, trajs = compare_vbd(0.2, device="cpu")
    assert table.measured.tolist()[:len(SEED_SIDE_BY_SIDE)] == list(SEED_SIDE_BY_SIDE)
    for name in ("ipc", "vbd"):
        t = trajs[name]
        assert str(t["stopped"]).startswith("completed"), t["stopped"]
        assert t["film"].shape == (49, 481, 3) and t["spheres"].shape == (49, 7, 3)
        assert np.isfinite(t["film"]).all()
        assert abs(t["time"][-1] - 0.2) < 1e-9
    # both solvers moved the hem down (the fold over the rim has begun) and kept the waiting spheres in place
    from newtonipc_nb.scenes.bag_scene import HEM_RING, ring_vertices
    for name in ("ipc", "vbd"):
        f = trajs[name]["film"]
        assert f[-1][ring_vertices(HEM_RING), 2].mean() < f[0][ring_vertices(HEM_RING), 2].mean() - 2e-3
        assert np.abs(trajs[name]["spheres"][-1] - trajs[name]["spheres"][0]).max() < 1e-4
    ours = table.columns[-2:]
    assert all(table.loc[table.measured == "self-intersection frames / all frames", c].item().endswith("/ 49")
               for c in ours)
    # both final frames in one 3D scene, from the saved pair of trajectories
    from newtonipc_nb.verification.vbd import load_side_by_side, save_side_by_side, side_by_side_view
    from newtonipc_nb.viewer import close_widgets
    back = load_side_by_side(save_side_by_side(trajs, tmp_path / "sbs.npz"))
    for name in ("ipc", "vbd"):
        for k in ("film", "spheres", "faces", "time"): assert np.array_equal(back[name][k], trajs[name][k]), (name, k)
    view = side_by_side_view(back)
    objs = {o.name: o for o in view.renderer.scene.children[0].children}
    pos = lambda n: objs[n].geometry.attributes["position"].array
    assert np.allclose(pos("vbd_film"), trajs["vbd"]["film"][-1], atol=1e-6)
    assert np.allclose(pos("ipc_film") - view.shift, trajs["ipc"]["film"][-1], atol=1e-6)
    assert pos("vbd_film")[:, 0].max() < pos("ipc_film")[:, 0].min()
    assert objs["vbd_film"].material.color != objs["ipc_film"].material.color
    assert sum(n.startswith("ipc_sphere") for n in objs) == sum(n.startswith("vbd_sphere") for n in objs) == 7
    assert "SolverVBD" in view.caption.value and "SolverIPC" in view.caption.value and "0.2000 s" in view.caption.value
    close_widgets(view)


def test_vbd_option_writes_both_trajectories(tmp_path, monkeypatch, capsys):
    import numpy as np, pandas as pd
    import newtonipc_nb.verification.runner as v
    import newtonipc_nb.verification.vbd as vbd
    from newtonipc_nb.scenes.bag_scene import bag_mesh, sphere_column
    V, F = bag_mesh()
    traj = lambda dz: dict(film=np.stack([V, V + [0, 0, dz]]).astype(np.float32), spheres=np.stack([sphere_column(
    )] * 2), faces=F, time=np.array([0.0, 0.1]), wall_time=1.0, stopped="completed")
    trajs = dict(ipc=traj(-0.01), vbd=traj(-0.02))
    monkeypatch.setattr(v, "run_validation", lambda full, bag_out=None: [v.Verdict("x", "y", "z", "", True)])
    monkeypatch.setattr(v, "compare_vbd", lambda until, ipc=None, resolution=1:
                        (pd.DataFrame([dict(measured="m")]), trajs))
    out, report = tmp_path / "pair.npz", tmp_path / "r.json"
    assert v.main(["--vbd", "0.1", "--vbd-out", str(out), "--report", str(report)]) == 0
    back = vbd.load_side_by_side(out)
    assert np.array_equal(back["vbd"]["film"], trajs["vbd"]["film"]) and str(back["ipc"]["stopped"]) == "completed"
    assert v.parse_args([]).vbd_out == "validation_vbd.npz"
    assert '"vbd_trajectories"' in report.read_text()


@pytest.mark.slow
def test_vbd_side_by_side_full():
    from newtonipc_nb.verification.vbd import compare_vbd
    table, trajs = compare_vbd(8.45)
    assert str(trajs["vbd"]["stopped"]).startswith("completed")


def test_side_by_side_takes_a_saved_ipc_run(tmp_path):
    """The 8.45 s comparison can reuse a saved `newtonipc-bag` run from t = 0, cut at the measuring instant; resumed
    runs are refused."""
    import pytest
    from newtonipc_nb.scenes.bag_scene import DT
    from newtonipc_nb.scenes.bag_run import run_bag
    from newtonipc_nb.verification.vbd import saved_ipc_run
    out = tmp_path / "bag.npz"
    run_bag(6 * DT, out=out, progress=False)
    cut = saved_ipc_run(out, 4 * DT)
    assert cut["film"].shape == (5, 481, 3) and abs(cut["time"][-1] - 4 * DT) < 1e-12 and "cut at" in cut["stopped"]
    with pytest.raises(ValueError, match="before"):
        saved_ipc_run(out, 1.0)
    run_bag(6 * DT, out=tmp_path / "resumed.npz", progress=False, resume=out, resume_at=3 * DT)
    with pytest.raises(ValueError, match="resumed"):
        saved_ipc_run(tmp_path / "resumed.npz", 4 * DT)


@pytest.mark.parametrize("argv, flag", [(["--report", "{d}/missing/r.json"], "--report"),
                                        (["--report", "/dev/full/r.json"], "--report"),
                                        (["--full", "--bag-out", "{d}/missing/b.npz"], "--bag-out"),
                                        (["--vbd", "0.1", "--vbd-out", "{d}/missing/v.npz"], "--vbd-out")])
def test_outputs_are_checked_before_any_check_runs(argv, flag, tmp_path):
    """An output that cannot be written is one line and exit 2 before the first check (not a traceback after all of
    them)."""
    from pathlib import Path
    exe = Path(sys.executable).with_name("newtonipc-validate")
    r = subprocess.run([str(exe), *(a.format(d=tmp_path) for a in argv)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"newtonipc-validate: {flag} ") and "Traceback" not in r.stderr
    assert "checks:" not in r.stdout, "no check ran"


def test_vbd_harness_takes_a_resolution():
    import numpy as np
    from newtonipc_nb.scenes.bag_scene import DT
    from newtonipc_nb.scenes.choreography import tie_pairs
    from newtonipc_nb.scenes.bag_scene import bag_mesh
    from newtonipc_nb.verification.vbd import VBD_DT, compare_vbd, run_vbd_bag, side_by_side_measures, vbd_bag_scene
    sc = vbd_bag_scene("cpu", resolution=2)
    assert len(sc.film) == 1761 and sc.faces.shape == (3456, 3) and np.array_equal(sc.tie_pairs, tie_pairs(2))
    rec = run_vbd_bag(8 * VBD_DT, device="cpu", resolution=2)
    assert rec["stopped"] == "completed" and rec["film"].shape[1:] == (1761, 3) and rec["resolution"] == 2
    v = bag_mesh(2)[0].astype(np.float32)
    rest = dict(film=np.stack([v] * 3), spheres=np.zeros((3, 7, 3), np.float32), faces=bag_mesh(2)[1],
                time=np.arange(3) * DT, wall_time=1.0, stopped="completed")
    with pytest.raises(ValueError, match="the ipc run's film has 1761 vertices, the mesh at resolution 1 has 481"):
        compare_vbd(2 * DT, ipc=rest, vbd=rec)
    table, _ = compare_vbd(2 * DT, ipc=rest, vbd=rec, resolution=2)
    assert side_by_side_measures(dict(rest, time=np.array([0.0, 3.0, 6.05])))["columns pointing up at 6.05 s (the "
                                                                              "unfold check)"] == "64 / 64"


def test_vbd_resolution_flag_checks_the_saved_ipc_run_before_any_check(tmp_path):
    import numpy as np
    from pathlib import Path
    from newtonipc_nb.scenes.bag_scene import DT
    from newtonipc_nb.scenes.bag_scene import bag_mesh
    v, f = bag_mesh(2)
    saved = tmp_path / "two.npz"
    np.savez(saved, film=np.repeat(v[None].astype(np.float32), 3, 0), spheres=np.zeros((3, 7, 3), np.float32), faces=f,
             time=np.arange(3) * DT)
    exe = Path(sys.executable).with_name("newtonipc-validate")
    r = subprocess.run([str(exe), "--vbd", "0.01", "--vbd-ipc",
                        str(saved), "--vbd-out",
                        str(tmp_path / "v.npz")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "checks:" not in r.stdout, r.stderr[-2000:]
    assert "give --vbd-resolution 2 to use it" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([str(exe), "--vbd", "0.01", "--vbd-resolution", "3"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2 and "'3' is not a mesh resolution" in r.stderr
