"""Newton's own cloth examples on SolverIPC: the command end to end on a small cloth_hanging (quick), and the full
acceptance runs of cloth_hanging, cloth_twist (150 of its 300 frames) and cloth_poker_cards (slow)."""
import json
import subprocess
import sys
import time

import pytest

COMMAND = [sys.executable, "-c",
           "import sys; from newtonipc_nb.verification.newton_examples import main; sys.exit(main())"]

from newtonipc_nb.verification.newton_examples import ipc_acceptance, measure_run, run_example, run_summary


def test_command_small_hanging(tmp_path):
    "Both solvers, 2 frames of an 8 × 4 cloth_hanging: exit 0, both trajectories and the summaries written."
    cmd = [*COMMAND, "cloth_hanging", "--frames", "2",
           "--out", str(tmp_path), "--", "--width", "8", "--height", "4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "cloth_hanging_ipc.npz").exists() and (tmp_path / "cloth_hanging_vbd.npz").exists()
    rows = json.loads((tmp_path / "cloth_hanging.json").read_text())["summaries"]
    assert [r["solver"] for r in rows] == ["ipc", "vbd"]
    for r in rows:
        assert (r["vertices"], r["frames"], r["test_final"], r["intersecting_frames"]) == (45, 2, "passed", 0)
        assert r["min_shape_distance"] > 3.0                       # the cloth hangs ~4 m above the ground
    assert "cloth_hanging" in done.stdout and "IPC wall (s)" in done.stdout


def test_command_bad_argument():
    done = subprocess.run([*COMMAND, "cloth_hangin"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "cloth_hangin" in done.stderr


def test_deadline_stops_a_run_and_says_how_far_it_got():
    "A run past its wall-clock deadline stops after whole frames, is stored and measured, and skips test_final."
    run = run_example("cloth_hanging", solver="vbd", frames=3, extra=["--width", "8", "--height", "4"],
                      deadline=time.time())
    summary = run_summary(run, measure_run(run))
    assert summary["frames"] == 0 and run.q.shape[0] == 1
    assert summary["error"] == "deadline reached after 0 of 3 frames"
    assert summary["test_final"].startswith("not run")


@pytest.mark.slow
@pytest.mark.parametrize("name,frames,options", [("cloth_hanging", None, {}), ("cloth_twist", 150, {}),
                                                 ("cloth_poker_cards", None, {"dhat": 8e-4})])
def test_example_on_ipc(name, frames, options):
    """Acceptance: the example's own test_final passes, no intersecting frame, no particle within min_gap of a shape.
    The poker cards rest 0.97 mm apart in their stack, so d̂ = 0.8 mm keeps their barriers off at rest."""
    if name == "cloth_twist": pytest.importorskip("pxr")
    run = run_example(name, solver="ipc", frames=frames, ipc_options=options)
    summary = run_summary(run, measure_run(run))
    assert ipc_acceptance(summary) == [], summary
