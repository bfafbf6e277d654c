"""Shared fixtures. The tests never touch the user's profile: FASTENSOR_PROFILE is empty."""

import contextlib
import os

os.environ["FASTENSOR_PROFILE"] = ""

import pytest  # noqa: E402


@pytest.fixture
def engine():
    """A fresh engine with every available backend, learning into no profile."""
    import fastensor

    return fastensor.Engine()


def leftovers(directory) -> list[str]:
    """Files a save may have left next to its target (temporaries)."""
    return sorted(n for n in os.listdir(directory) if ".tmp." in n)


@pytest.fixture(scope="session")
def object_stores(tmp_path_factory):
    """Every object store's server (``_s3.py``), the process environment pointing its
    clients at it, for the whole session: the default engine makes its clients once, from
    the environment it first sees, so the servers must outlive every test that uses it."""
    from _s3 import Azurite, S3Server, azurite_binary, serving

    with contextlib.ExitStack() as stack:
        out = {
            "s3": stack.enter_context(S3Server.in_environment(tmp_path_factory.mktemp("s3"))),
            "gs": stack.enter_context(
                S3Server.in_environment(tmp_path_factory.mktemp("gs"), anonymous=True)
            ),
        }
        if azurite_binary():
            root = tmp_path_factory.mktemp("az")
            out["az"] = stack.enter_context(serving(Azurite(azurite_binary(), root)))
        yield out


@pytest.fixture(params=["s3", "gs", "az"])
def server(request, object_stores):
    """Each store's server in turn, its faults and counters cleared before and after."""
    if request.param not in object_stores:
        pytest.skip("no Azurite (FASTENSOR_AZURITE unset)")
    store = object_stores[request.param]
    store.clear()
    yield store
    store.clear()
