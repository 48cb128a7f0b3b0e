"""Folders and files of the node's data, created private (0700 / 0600) whatever the umask.

Every process (API server, CLI). The data home holds the SQLite database (prompts of jobs,
completions, Looms), harvest files, the local key and the URL secret: none of it is for other
users of the machine. Only what this module creates is made private; a folder the operator made
keeps the mode they gave it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def make_private_folder(path: Path) -> None:
    """Creates `path` and its missing parents, each 0700; an existing folder is left as it is."""
    missing: list[Path] = []
    walk = path
    while not walk.exists():
        missing.append(walk)
        walk = walk.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            folder.mkdir(mode=FOLDER_MODE)
            os.chmod(folder, FOLDER_MODE)  # mkdir's mode passes through the umask


def touch_private_file(path: Path) -> None:
    """Creates `path` empty and 0600 (its folders private too) unless it exists, so that what
    later writes it (SQLite, a lock) finds it private. SQLite gives its -wal and -shm files the
    database file's mode."""
    make_private_folder(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
