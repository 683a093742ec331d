"""The Ray node image carrying vLLM for a cluster's Ray version (`RayCluster.vllm_image`), from
settings.RAY_VLLM_VERSIONS and RAY_VLLM_IMAGE_TEMPLATE / RAY_VLLM_GPU_IMAGE_TEMPLATE."""

from __future__ import annotations

import pytest

from cleverthis.settings.env import env_map
from raymgr.models import RayCluster


def test_a_paired_version_names_its_image_and_an_unpaired_one_none(settings):
    settings.RAY_VLLM_VERSIONS = {"2.60.0": "0.32.0"}
    settings.RAY_VLLM_IMAGE_TEMPLATE = "registry.example.test/ray-vllm:{version}-vllm{vllm}"
    settings.RAY_VLLM_GPU_IMAGE_TEMPLATE = "registry.example.test/ray-vllm:{version}-vllm{vllm}-gpu"
    assert RayCluster(ray_version="2.60.0").vllm_image() == "registry.example.test/ray-vllm:2.60.0-vllm0.32.0"
    assert RayCluster(ray_version="2.60.0").vllm_image(gpu=True).endswith(":2.60.0-vllm0.32.0-gpu")
    assert RayCluster(ray_version="2.9.0").vllm_image() == ""


def test_the_documented_defaults_pair_ray_2_60_with_vllm_0_32_only():
    from cleverthis.settings import base

    assert base.RAY_VLLM_VERSIONS == {"2.60.0": "0.32.0"}
    assert set(base.RAY_VLLM_VERSIONS) <= set(base.RAY_VERSIONS)
    assert base.RAY_VLLM_IMAGE_TEMPLATE == "cleverthis/ray-vllm:{version}-vllm{vllm}"


def test_the_pairs_setting_reads_ray_equals_vllm_items_and_refuses_others(monkeypatch):
    monkeypatch.setenv("RAY_VLLM_VERSIONS", "2.60.0=0.32.0, 2.61.0 = 0.33.0")
    assert env_map("RAY_VLLM_VERSIONS", {}) == {"2.60.0": "0.32.0", "2.61.0": "0.33.0"}
    monkeypatch.setenv("RAY_VLLM_VERSIONS", "2.60.0")
    with pytest.raises(ValueError, match="key=value"):
        env_map("RAY_VLLM_VERSIONS", {})
    monkeypatch.delenv("RAY_VLLM_VERSIONS")
    assert env_map("RAY_VLLM_VERSIONS", {"a": "b"}) == {"a": "b"}
