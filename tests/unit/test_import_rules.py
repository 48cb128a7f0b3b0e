"""The import rules of docs/architecture.md, checked on the source (no import needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_acs"
LEAVES = {
    "vllm_acs.errors",
    "vllm_acs.settings",
    "vllm_acs.states",
    "vllm_acs.served_model",
    "vllm_acs.auth.principal",
    "vllm_acs.metrics",
    "vllm_acs.private_paths",
}
# The pluggy extension points run in the API server, framework-free.
PLUGIN_MODULES = {"vllm_acs.hookspecs", "vllm_acs.plugins"}


HARVEST_FILES = "vllm_acs.client.harvest_files"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module the file imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


def _in(module: str, package: str) -> bool:
    # Not a bare prefix test: `vllm_acs.hookspecs` is not inside `vllm_acs.hooks`.
    return module == package or module.startswith(package + ".")


def _project(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith("vllm_acs.")}


def _violations(path: Path) -> list[str]:
    module = _module_name(path)
    names = _imports(path)
    third_party = {_top(n) for n in names}
    inside = _project(names)
    found: list[str] = []

    def forbid_third_party(*tops: str) -> None:
        found.extend(f"{module} imports {t}" for t in tops if t in third_party)

    def forbid_project(*prefixes: str) -> None:
        for name in inside:
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                found.append(f"{module} imports {name}")

    if module in LEAVES:
        found.extend(f"{module} (a leaf) imports {n}" for n in inside if n != module)
    if _in(module, "vllm_acs.storage"):
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        # storage imports only the leaves (and itself)
        found.extend(
            f"{module} imports {n}"
            for n in inside
            if not _in(n, "vllm_acs.storage") and not any(_in(n, leaf) for leaf in LEAVES)
        )
    if module in PLUGIN_MODULES:
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.middleware"):
        forbid_third_party("torch", "vllm")
        forbid_project("vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.hooks"):
        forbid_third_party("fastapi", "starlette", "sqlalchemy", "redis")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.storage")
    if _in(module, "vllm_acs.jobs"):
        # The job machinery: storage and the leaves; it replays through an ASGI app it is given.
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.harvest"):
        # Harvests: storage, activations, the job machinery and the engine client; no web layer.
        forbid_third_party("fastapi", "starlette")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.looms"):
        # Looms: pure tree operations, the branch job kind; storage and the job machinery.
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.deployment"):
        # The deployment's registry: storage and the leaves; no web layer.
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks")
    if _in(module, "vllm_acs.auth"):
        # Access: the principal (a leaf), the built-in key plugin, the local key, the refusals;
        # leaves, storage and the plugin hooks; no web layer (the package's __init__ imports
        # nothing, so storage can import the principal leaf).
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project(
            "vllm_acs.middleware",
            "vllm_acs.routes",
            "vllm_acs.hooks",
            "vllm_acs.cli",
            "vllm_acs.account",
        )
    if _in(module, "vllm_acs.account"):
        # An account's keys and usage: shared by the CLI and the routes; no web layer.
        forbid_third_party("fastapi", "starlette", "torch", "vllm")
        forbid_project("vllm_acs.middleware", "vllm_acs.routes", "vllm_acs.hooks", "vllm_acs.cli")
    if _in(module, "vllm_acs.engine_core"):
        # The EngineCore's scheduler: vLLM, the leaves and batch work's priorities, nothing else.
        forbid_third_party("fastapi", "starlette", "sqlalchemy", "redis")
        found.extend(
            f"{module} imports {n}"
            for n in inside
            if not _in(n, "vllm_acs.engine_core")
            and not _in(n, "vllm_acs.jobs.batch_share")
            and not any(_in(n, leaf) for leaf in LEAVES)
        )
    if _in(module, "vllm_acs.routes"):
        forbid_project("vllm_acs.middleware", "vllm_acs.hooks")
    is_client_codec = _in(module, "vllm_acs.client") and module != HARVEST_FILES
    if _in(module, "vllm_acs.activations") or is_client_codec:
        # Shared by the API server, the workers and users: numpy and the standard library, and
        # of the project only the leaves and activations itself (the client also its own
        # modules: the codec helpers, and the harvest helpers, loaded lazily).
        forbid_third_party("fastapi", "starlette", "sqlalchemy", "redis", "vllm", "torch")
        found.extend(
            f"{module} imports {n}"
            for n in inside
            if not _in(n, "vllm_acs.activations")
            and not any(_in(n, leaf) for leaf in LEAVES)
            and not (is_client_codec and _in(n, "vllm_acs.client"))
        )
    if module == HARVEST_FILES:
        # The user's side of a harvest: httpx, safetensors, torch; nothing of the server.
        forbid_third_party("fastapi", "starlette", "sqlalchemy", "redis", "vllm")
        found.extend(f"{module} imports {n}" for n in inside)
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_module_follows_the_import_rules(path: Path):
    assert _violations(path) == []


@pytest.mark.parametrize(
    ("subpackage", "source", "expected"),
    [
        (
            "activations",
            "import torch\nfrom ..hooks import compat\n",
            [
                "vllm_acs.activations.bad imports torch",
                "vllm_acs.activations.bad imports vllm_acs.hooks",
                "vllm_acs.activations.bad imports vllm_acs.hooks.compat",
            ],
        ),
        (
            "middleware",
            "import torch\nfrom ..routes.models import service\n",
            [
                "vllm_acs.middleware.bad imports torch",
                "vllm_acs.middleware.bad imports vllm_acs.routes.models",
                "vllm_acs.middleware.bad imports vllm_acs.routes.models.service",
            ],
        ),
        (
            # storage may import only the leaves (auth.principal is one; auth.key_auth is not)
            "storage",
            "from ..auth.principal import Principal\nfrom ..auth.key_auth import KeyAuthPlugin\n",
            [
                "vllm_acs.storage.bad imports vllm_acs.auth.key_auth",
                "vllm_acs.storage.bad imports vllm_acs.auth.key_auth.KeyAuthPlugin",
            ],
        ),
    ],
)
def test_the_checker_sees_a_violation(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    subpackage: str,
    source: str,
    expected: list[str],
):
    fake_package = tmp_path / "vllm_acs"
    (fake_package / subpackage).mkdir(parents=True)
    bad = fake_package / subpackage / "bad.py"
    bad.write_text(source)
    monkeypatch.setitem(globals(), "PACKAGE", fake_package)
    assert sorted(_violations(bad)) == expected
