"""The app loads and warms its default pairs at start-up, so the first click pays for neither."""
from assistgen.models.catalog import load_catalog
from assistgen.app.service import Service
from assistgen.comparison.runtime import is_warm


def test_preload_loads_and_warms_each_default_pair(tiny_catalog_path):
    service = Service(load_catalog(tiny_catalog_path))
    defaults = service.default_pairs()
    assert defaults == ["tiny-text", "tiny-speech"]   # the missing pair is never a default
    assert service.preload(defaults + ["tiny-missing"]) == ["tiny-missing"]
    for name in defaults:
        pair = service.pool.pair(name)
        assert is_warm(pair.target) and is_warm(pair.assistant)
    assert set(service.pool.resident()) == {"tiny-text-target", "tiny-text-assistant", "tiny-speech-target",
                                            "tiny-speech-assistant"}
