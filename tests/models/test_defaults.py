"""Each task's default pair, chosen below the page: the command line's `fetch --defaults` and the page agree."""
from assistgen.app.service import Service
from assistgen.models.catalog import load_catalog
from assistgen.models.defaults import default_pairs


def test_the_default_pairs_are_the_pages_and_a_pair_that_cannot_load_is_never_one(tiny_catalog_path):
    catalog = load_catalog(tiny_catalog_path)
    assert default_pairs(catalog) == ["tiny-text", "tiny-speech"] == Service(catalog).default_pairs()


def test_a_pair_over_the_memory_budget_is_no_default(tiny_catalog_path):
    assert default_pairs(load_catalog(tiny_catalog_path), budget_bytes=1) == []
