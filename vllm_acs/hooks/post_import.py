"""Run a function on a module right after it is imported (or now, if it already is).

Used by compat.py from the general plugin, in every vLLM process: it patches vLLM's worker and
request classes without importing them in processes that never do (the API server).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

Patch = Callable[[ModuleType], None]


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Patch]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        patches = self.pending.pop(fullname)
        exec_module = loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            for patch in patches:
                patch(module)

        # Loaders of source modules are per module: patching this instance touches nothing else.
        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


_finder = _AfterImportFinder()


def when_imported(name: str, patch: Patch) -> None:
    """Calls `patch(module)` once `name` is imported: now if it is, else right after."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _finder.pending.setdefault(name, []).append(patch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
