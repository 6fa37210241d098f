import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import free_port  # noqa: E402

torch.set_num_threads(1)  # tiny models: threads only add overhead


@pytest.fixture(scope="session")
def tiny_catalog_path(tmp_path_factory):
    from helpers import build_tiny_catalog
    return build_tiny_catalog(tmp_path_factory.mktemp("tiny-catalog"))


@pytest.fixture(scope="session")
def tiny_app(tiny_catalog_path):
    """The real app, launched in-process on the tiny catalog; yields (url, service)."""
    import app
    from assistgen.models.catalog import load_catalog
    from assistgen.app.service import Service
    service = Service(load_catalog(tiny_catalog_path))
    demo = app.build_demo(service)
    app.queue_and_launch(demo, prevent_thread_lock=True, server_port=free_port(), quiet=True, max_file_size="2mb")
    yield demo.local_url, service
    demo.close()



@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A Hugging Face cache, in the hub's own layout, of small stand-ins for every hub model of models.yaml."""
    from hub_cache import build_hub_cache
    return build_hub_cache(tmp_path_factory.mktemp("hf-hub-cache"))
