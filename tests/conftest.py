"""One real local Ray for the whole suite (ray.init costs ~10 s and ~0.7 GB here)."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before ray is imported anywhere

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, object_store_memory=256 * 1024**2, include_dashboard=False,
                 log_to_driver=False)
    yield ray
    ray.shutdown()
