"""The LAVIS environment's bridge: the packages both environments must share (torch, Ray, Arrow, ...)
are linked from this environment, not installed again (adjcap/models/lavis_env.py). Without building it."""

import json

import pytest

from adjcap.models import lavis_env


def test_the_bridge_is_the_shared_packages_and_what_they_need_here():
    closure = lavis_env.bridge_closure()
    assert {"torch", "torchvision", "ray", "numpy", "pyarrow", "pillow", "pydantic"} <= set(closure)
    assert {"pydantic-core", "pandas", "sympy"} <= set(closure)  # what pydantic, ray[data] and torch need
    assert not {"transformers", "timm", "huggingface-hub", "tokenizers"} & set(closure)  # LAVIS pins its own
    assert lavis_env._lavis_needs_other(closure) == set()  # nothing of it conflicts with the LAVIS pins today


def test_links_into_the_given_site_packages(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    linked = lavis_env.link_bridge(tmp_path, site)
    import torch

    assert f"torch=={torch.__version__.split('+')[0]}" in [x.split("+")[0] for x in linked]
    assert (tmp_path / "bridge" / "torch").resolve() == lavis_env._site_packages_here() / "torch"
    assert (site / lavis_env.BRIDGE_PTH).read_text().strip() == str(tmp_path / "bridge")
    assert lavis_env.dangling_links(tmp_path) == []


def test_an_environment_whose_links_dangle_says_rebuild(tmp_path):
    d = lavis_env.env_dir(tmp_path)
    (d / "bridge").mkdir(parents=True)
    (d / "bridge" / "__pycache__").mkdir()
    (d / lavis_env.MARKER).write_text(json.dumps({"lavis": lavis_env.LAVIS_VERSION}))
    (d / "bridge" / "torch").symlink_to(tmp_path / "moved-away" / "torch", target_is_directory=True)
    with pytest.raises(lavis_env.LavisEnvError, match=r"1 packages it links .* are gone \(torch\).*adjcap lavis-env --force"):
        lavis_env.env_python(tmp_path)
