"""The validation runner (SPEC.md §6) and the Newton VBD side-by-side harness (SPEC.md §7)."""
import json
import subprocess
import sys

import pytest

from newtonipc_nb.validation import checks_table, main, run_validation

EXPECTED = ["VT scene, 12 steps: min mid-surface distance (µm)", "EE scene, 12 steps: min mid-surface distance (µm)",
            "VT hinge angle at start (°)", "VT hinge angle after 12 steps (°)",
            "initial overlap rejected, outputs untouched", "edge through face rejected, outputs untouched",
            "hinge angle gradient vs central differences", "VT assembled ∇Φ vs central differences of Φ",
            "EE assembled ∇Φ vs central differences of Φ", "swept candidates, 17 instants (24 steps, VT + EE)",
            "fast crossing α, seed normal bound", "fast crossing α, additive CCD (default)",
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
    seeds = {r["check"]: r["seed"] for r in data["checks"]}
    assert seeds[EXPECTED[0]] == "838.96" and seeds[EXPECTED[1]] == "651.40" and seeds[EXPECTED[3]] == "−7.229"


def test_a_failing_check_fails_the_runner(monkeypatch, capsys):
    import newtonipc_nb.validation as v
    def broken(): raise RuntimeError("boom")
    monkeypatch.setattr(v, "check_fast_crossing", broken)
    monkeypatch.setattr(v, "check_bag_smoke", lambda: v.Check("bag smoke", "x", "y", "", True))
    assert v.main([]) == 1
    assert "RuntimeError: boom" in capsys.readouterr().out


def test_console_script_exists():
    import configparser, pathlib
    cfg = configparser.ConfigParser(); cfg.read(pathlib.Path(__file__).parents[1] / "settings.ini")
    assert "newtonipc-validate=newtonipc_nb.validation:main" in cfg["DEFAULT"]["console_scripts"].split()


@pytest.mark.slow
def test_full_runner(tmp_path):
    assert main(["--full", "--report", str(tmp_path / "r.json"), "--bag-out", str(tmp_path / "bag.npz")]) == 0


def test_vbd_side_by_side_runs_both_solvers_for_0_2_s():
    """SPEC.md §7 harness: 0.2 s of the bag choreography through SolverIPC and Newton's SolverVBD, same measures."""
    import numpy as np
    from newtonipc_nb.validation import SEED_SIDE_BY_SIDE, compare_vbd
    table, trajs = compare_vbd(0.2, device="cpu")
    assert table.measured.tolist()[:5] == list(SEED_SIDE_BY_SIDE)
    for name in ("ipc", "vbd"):
        t = trajs[name]
        assert str(t["stopped"]).startswith("completed"), t["stopped"]
        assert t["film"].shape == (49, 481, 3) and t["spheres"].shape == (49, 7, 3)
        assert np.isfinite(t["film"]).all()
        assert abs(t["time"][-1] - 0.2) < 1e-9
    # both solvers moved the hem down (the fold over the rim has begun) and kept the waiting spheres in place
    from newtonipc_nb.inputs import HEM_RING, ring_vertices
    for name in ("ipc", "vbd"):
        f = trajs[name]["film"]
        assert f[-1][ring_vertices(HEM_RING), 2].mean() < f[0][ring_vertices(HEM_RING), 2].mean() - 2e-3
        assert np.abs(trajs[name]["spheres"][-1] - trajs[name]["spheres"][0]).max() < 1e-4
    ours = table.columns[-2:]
    assert all(table.loc[table.measured == "self-intersection frames / all frames", c].item().endswith("/ 49") for c in ours)


@pytest.mark.slow
def test_vbd_side_by_side_full():
    from newtonipc_nb.validation import compare_vbd
    table, trajs = compare_vbd(8.45)
    assert str(trajs["vbd"]["stopped"]).startswith("completed")
