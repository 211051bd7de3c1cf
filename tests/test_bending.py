"""Bending from the film's thickness against plate theory: the hinge energy of a mesh bent exactly into a cylinder, and
the static sag of a clamped strip of the bag film, between the plate and the beam predictions."""
import math

import numpy as np
import pytest

from newtonipc_nb.elastic import cylinder_energy_ratio, equilateral_mesh
from newtonipc_nb.inputs import BAG_FILM, grid_faces, hinge_edge_ke, hinge_k_theta
from newtonipc_nb.scenes.reference import clamped_strip, strip_sag
from newtonipc_nb.scenes.test_scenes import bag_wall_patch


def grid_mesh(n):
    s = np.linspace(0.0, 1.0, n)
    return np.stack(np.meshgrid(s, s, indexing="ij"), -1).reshape(-1, 2)[:, ::-1].copy(), grid_faces(n)


MESHES = {"right-triangle grid": lambda: grid_mesh(41), "equilateral": lambda: equilateral_mesh(41, 1 / 40),
          "bag wall patch": lambda: bag_wall_patch(4)}


@pytest.mark.parametrize("name", sorted(MESHES))
def test_calibrated_hinge_matches_the_plate_on_a_cylinder(name):
    "Bent along its rows or columns, each converged mesh stores ½ D κ² A within 5 %; the reference rule stores 6× that."
    uv, f = MESHES[name]()
    for angle in (0.0, math.pi / 2):
        ratio = cylinder_energy_ratio(uv, f, 2.0, angle, D=BAG_FILM.D)
        assert abs(ratio - 1) < 0.05, (angle, ratio)
    reference = cylinder_energy_ratio(uv, f, 2.0, angle, rule="reference", D=BAG_FILM.D)
    assert reference == pytest.approx(6 * ratio, rel=1e-5)


def test_equilateral_mesh_is_isotropic():
    "On the equilateral mesh the ratio stays within 5 % of 1 whatever the cylinder's axis."
    uv, f = equilateral_mesh(41, 1 / 40)
    for deg in (15, 30, 45, 90):
        assert abs(cylinder_energy_ratio(uv, f, 2.0, math.radians(deg)) - 1) < 0.05, deg


def test_hinge_rules():
    assert hinge_edge_ke(2.0, 0.5, 4.0) == pytest.approx(0.25)
    assert hinge_k_theta(2.0, 0.5, 4.0, rule="reference") == pytest.approx(6 * 2.0 * 0.25 / 4.0)
    with pytest.raises(ValueError, match="rule must be one of 'calibrated', 'reference'"):
        hinge_k_theta(2.0, 0.5, 4.0, rule="plate")


@pytest.mark.slow
def test_clamped_strip_converges_between_plate_and_beam():
    """The bag film's 10 mm × 2.5 mm strip with calibrated hinges, 1 mm and 0.5 mm cells (d̂ = 0.1 mm): the tip
    deflection falls as the mesh refines (a chain of hinges over-bends a cantilever by about 1 + 2/n at n cells) and its
    first-order extrapolation to zero cell size lies between the plate's qL⁴/8D and the beam's qL⁴/(8Eh³/12)."""
    w = {}
    for cell in (1e-3, 0.5e-3):
        model, tip, plate, beam = clamped_strip(cell)
        w[cell] = strip_sag(model, tip, dhat=1e-4, min_gap=1e-5)
    assert plate < w[0.5e-3] < w[1e-3]
    w0 = 2 * w[0.5e-3] - w[1e-3]
    assert plate <= w0 <= beam, (w, w0, plate, beam)


def test_fine_strip_is_refused_not_locked():
    "1 mm cells, the defaults (d̂ = 1 mm): refused, the error naming d̂, the shortest edge and a d̂ that works."
    model, tip, plate, beam = clamped_strip(1e-3)
    with pytest.raises(ValueError, match=r"dhat = 0\.001 m at rest .* shortest rest edge 0\.001 m") as e:
        strip_sag(model, tip)
    dhat = float(str(e.value).split("pass dhat ≤ ")[1].split(" m")[0])
    assert 3e-5 < dhat < 1e-3


@pytest.mark.slow
def test_fine_strip_with_the_suggested_dhat_sags():
    "With the d̂ the error suggests, the same strip is not locked: it sags at least as far as the plate."
    model, tip, plate, beam = clamped_strip(1e-3)
    with pytest.raises(ValueError) as e:
        strip_sag(model, tip, steps=1)
    dhat = float(str(e.value).split("pass dhat ≤ ")[1].split(" m")[0])
    assert strip_sag(model, tip, dhat=dhat) > plate
