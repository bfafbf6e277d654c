"""Shared fixtures. The tests never touch the user's profile: FASTENSOR_PROFILE is empty."""

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
