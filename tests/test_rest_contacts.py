"""No film–film pair inside d̂ in the bag's rest shape at any resolution; the solver's rest-shape check."""
import pytest

from newtonipc_nb.inputs import IPCModel
from newtonipc_nb.rest_contacts import check_rest_contacts, rest_film_contacts
from newtonipc_nb.scenes.bag_scene import RESOLUTIONS, bag_scene_builder
from newtonipc_nb.solver import SolverIPC


@pytest.mark.parametrize("k", RESOLUTIONS)
def test_bag_rest_shape_has_no_pair_inside_dhat(k):
    model = bag_scene_builder(resolution=k)[0].finalize(device="cpu")
    assert len(rest_film_contacts(IPCModel.from_newton(model), 1e-3, 3e-5)) == 0
    assert len(check_rest_contacts(IPCModel.from_newton(model), 1e-3, 3e-5)) == 0


def test_rest_contacts_option_is_checked():
    model = bag_scene_builder()[0].finalize(device="cpu")
    with pytest.raises(ValueError, match="option rest_contacts must be one of 'refuse', 'allow'"):
        SolverIPC(model, rest_contacts="ignore")


def test_allow_accepts_a_rest_shape_with_pairs_inside_dhat():
    "The 1 mm strip is refused by default and accepted with rest_contacts='allow' (pairs meant to touch at rest)."
    from newtonipc_nb.scenes.reference import clamped_strip
    model = clamped_strip(1e-3)[0]
    with pytest.raises(ValueError, match="film–film pairs are inside the barrier distance"):
        SolverIPC(model)
    assert SolverIPC(model, rest_contacts="allow").ipc.particle_count == model.particle_count
