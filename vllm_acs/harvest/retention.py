"""How long a harvest's files live, and the sweep that deletes them after: 7 days after the
harvest ended (the life of its download URLs), or once its job row is gone.

API server process (the job runner's sweep) and the CLI (`vllm-acs jobs sweep`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from ..storage.files import FileStore
from ..storage.jobs import JobRepository

logger = logging.getLogger(__name__)

KIND = "harvest"
# A harvest's files, and its result that names them, are kept this long after it ended.
FILES_KEPT = timedelta(days=7)
# Each kind's result retention where it is not the default (for JobRepository.sweep).
RESULT_TTLS = {KIND: FILES_KEPT}
# Files whose job row is missing are left alone this long: a submit writes the prompts just
# before the row.
ORPHAN_GRACE = timedelta(hours=1)


def job_prefix(job_id: str) -> str:
    return f"harvests/{job_id}"


async def sweep_files(files: FileStore, jobs: JobRepository, now: datetime) -> int:
    """Deletes the files of harvests that ended more than FILES_KEPT ago, and of harvests whose
    row is gone (retention deleted it, or a submit failed); returns how many."""
    removed = 0
    for job_id in await files.children("harvests"):
        job = await jobs.get(job_id)
        if job is not None and not (
            job.ended and job.finished_at is not None and job.finished_at < now - FILES_KEPT
        ):
            continue
        if job is None:
            written = await files.modified_at(job_prefix(job_id))
            # None: nothing is left under it (an object store may list an emptied folder a
            # while: SeaweedFS does).
            if written is None or written > now - ORPHAN_GRACE:
                continue
        await files.delete_tree(job_prefix(job_id))
        removed += 1
    if removed:
        logger.info("deleted the files of %d harvest(s) past their retention", removed)
    return removed
