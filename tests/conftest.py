"""Shared pytest set-up: the `slow` and `gpu` markers, skipped unless NEWTONIPC_TEST_FLAGS names them."""
import os

import pytest

FORCED = set(os.environ.get("NEWTONIPC_TEST_FLAGS", "").split())


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long run, skipped unless NEWTONIPC_TEST_FLAGS contains 'slow'")
    config.addinivalue_line("markers", "gpu: needs a CUDA device, skipped unless NEWTONIPC_TEST_FLAGS contains 'gpu'")


def pytest_collection_modifyitems(config, items):
    for item in items:
        for flag in ("slow", "gpu"):
            if flag in item.keywords and flag not in FORCED:
                item.add_marker(pytest.mark.skip(reason=f"'{flag}' test; set NEWTONIPC_TEST_FLAGS={flag} to run it"))
