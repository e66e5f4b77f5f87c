"""The seed's privateNodes block in tests/fixtures is the one in the seed, as it stands."""
from pathlib import Path

import pytest

SEED = Path(__file__).resolve().parents[2] / "shared" / "seed"


def test_the_fixture_is_copied_verbatim_from_the_seed(seed_block):
    seeds = sorted(SEED.glob("*.txt"))
    if not seeds:
        pytest.skip("shared/seed is not beside this checkout")
    assert seed_block.strip() in seeds[0].read_text()
