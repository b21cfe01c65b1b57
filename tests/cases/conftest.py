import pytest


@pytest.fixture
def approx():
    """Durations from epoch-sized floats compare with abs tolerance 1e-3 ms (cases README)."""
    return lambda v: pytest.approx(v, abs=1e-3)
