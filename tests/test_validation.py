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
