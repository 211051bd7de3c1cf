"""Friction on an inclined plane: a sphere particle and a film patch stick below atan μ (creeping at the smoothing's
speed) and slide at g(sin θ − μ cos θ) within 2 % above it (nbs/21_incline.ipynb explains the set-up)."""
import math

import pytest

from newtonipc_nb.scenes.incline import slide_on_incline

MU, G = 0.35, 9.81


@pytest.mark.parametrize("body", ["sphere", "film"])
def test_sticks_below_atan_mu(body):
    r = slide_on_incline(15, body)                      # tan 15° = 0.268 < μ = 0.35
    assert not r["slides"]
    assert abs(r["a_measured"]) < 0.01 * G * math.sin(math.radians(15))      # no acceleration
    assert abs(r["creep_rel_err"]) < 0.02                                      # creeps at v_c = 1.19 mm/s, no faster
    assert r["displacement"] < 1.02 * r["v_creep_expected"] * 0.25             # ≤ 0.30 mm over the 0.25 s run
    assert r["ref_rel_err"] < 1e-3 and abs(r["load_ratio"] - 1) < 1e-3


@pytest.mark.parametrize("body", ["sphere", "film"])
def test_slides_above_atan_mu_at_the_coulomb_rate(body):
    r = slide_on_incline(30, body)                      # tan 30° = 0.577 > μ
    assert r["slides"] and abs(r["a_rel_err"]) < 0.02, r
    assert r["ref_rel_err"] < 1e-3 and r["lateral_drift"] < 1e-6 and r["normal_drift"] < 1e-5


def test_slides_within_2_percent_at_the_spec_tolerance():
    r = slide_on_incline(40, "sphere", tolerance=5e-7)  # the after-release tolerance
    assert abs(r["a_rel_err"]) < 0.02, r


def test_without_friction_the_sphere_slides_freely():
    # the stick above is friction's doing: at μ = 0 it slides at g sin θ
    r = slide_on_incline(15, "sphere", mu=0.0)
    assert r["slides"] and abs(r["a_rel_err"]) < 1e-3 and r["displacement"] > 0.07


def test_starts_sliding_at_the_default_tolerance():
    r = slide_on_incline(30, "sphere", tolerance=1.2e-5)
    assert abs(r["a_rel_err"]) < 0.02, r


@pytest.mark.slow
def test_full_incline_table():
    rows = [slide_on_incline(th, body, steps=120, mu=mu)
            for mu, ths in ((0.35, (5, 10, 15, 18, 19, 20, 21, 22, 25, 30, 35, 40, 45, 50)), (0.6, (20, 25, 35, 45)))
            for body in ("sphere", "film") for th in ths]
    for r in rows:
        assert r["ref_rel_err"] < 1e-3, r                                      # the smoothed law, every angle
        if r["slides"]:
            assert abs(r["a_rel_err"]) < 0.02, r
        else:
            assert abs(r["creep_rel_err"]) < 0.02 and abs(
                r["a_measured"]) < 0.01 * G * math.sin(math.radians(r["theta_deg"])), r
