"""The bag scene end to end: the seed's two-step smoke check, the first phase, the CLI's file, and the full run (slow)."""
import json

import numpy as np
import pytest

from newtonipc_nb.bag import DT, load_trajectory, main, measure, neck_width, run_bag
from newtonipc_nb.ccd import count_intersections
from newtonipc_nb.inputs import BIN_HEIGHT, BIN_RADIUS, HEM_RING, bag_mesh, ring_vertices


def test_bag_smoke_two_steps(tmp_path):
    out = tmp_path / "smoke.npz"
    run_bag(2 * DT, out=out, progress=False)
    d = load_trajectory(out)
    assert d["film"].shape == (3, 481, 3) and d["spheres"].shape == (3, 7, 3) and d["faces"].shape == (928, 3)
    assert str(d["stopped"]).startswith("completed")
    assert np.all(d["step_min_gap"] > 0)


def test_first_phase_folds_the_bag_over_the_rim(tmp_path):
    out = tmp_path / "phase1.npz"
    run_bag(0.75, out=out, progress=False, every=4)
    d = load_trajectory(out)
    film = d["film"].astype(np.float64)
    hem = film[-1][ring_vertices(HEM_RING)]
    assert np.all(np.linalg.norm(hem[:, :2], axis=1) > BIN_RADIUS), "the hem hangs outside the bin's wall"
    assert np.all(hem[:, 2] < BIN_HEIGHT), "the hem is below the rim"
    assert all(count_intersections(f, d["faces"]) == 0 for f in film)
    assert np.all(d["step_min_gap"] > 0)


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
