"""`make bench`: runs every benchmark module in this folder that defines `main()`, in name order."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    names = sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_")
    )
    if not names:
        print("no benchmarks yet")
        return 0
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        if hasattr(module, "main"):
            print(f"== {name}")
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
