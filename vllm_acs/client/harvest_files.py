"""A researcher's side of a harvest: download its files (a cut download resumes where it
stopped), open them, and iterate one layer's rows as float32 torch batches, BOS rows dropped and
shuffled within a bounded buffer: what SAELens's `SAETrainer` takes as its `data_provider`.

The user's process (re-exported by `vllm_acs.client`). httpx, safetensors and torch, imported
when used; nothing of the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MANIFEST = "manifest.json"
STATS = "stats.safetensors"
CHUNK = 1 << 20


class HarvestNotReady(RuntimeError):
    """The harvest has not ended `done`: there are no files to download."""


def download_harvest(
    job: Mapping[str, Any] | str,
    directory: str | Path,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    transport: Any = None,
) -> HarvestFiles:
    """Downloads a done harvest's manifest, stats and shards into `directory` and opens them.

    `job` is the harvest as `GET /v1/harvest/{id}` answers it, or its id (then `base_url`, e.g.
    `https://host/v1`, and `api_key` read it). Files already complete are kept; a partial one
    (`<name>.part`) continues with an HTTP Range request. The file URLs need no key.
    `transport` is httpx's (a proxy, a test's), if any.
    """
    import httpx

    with httpx.Client(timeout=timeout, follow_redirects=True, transport=transport) as client:
        if isinstance(job, str):
            if base_url is None:
                raise ValueError("a harvest id needs base_url (and api_key) to read the harvest")
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            answer = client.get(f"{base_url.rstrip('/')}/harvest/{job}", headers=headers)
            answer.raise_for_status()
            job = answer.json()
        result = job.get("result")
        if job.get("status") != "done" or not isinstance(result, Mapping):
            raise HarvestNotReady(f"harvest {job.get('job_id')} is {job.get('status')}, not done")
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        _fetch(client, result["manifest_url"], target)
        manifest = json.loads((target / MANIFEST).read_bytes())
        sizes = {shard["file"]: shard["bytes"] for shard in manifest["shards"]}
        _fetch(client, result["stats_url"], target)
        for url in result["shard_urls"]:
            _fetch(client, url, target, sizes.get(_name(url)))
    return HarvestFiles(target)


def _name(url: str) -> str:
    return urlsplit(url).path.rsplit("/", 1)[-1]


def _fetch(client: Any, url: str, directory: Path, size: int | None = None) -> Path:
    final = directory / _name(url)
    # A shard whose size the manifest gives is kept once complete; the small files are fetched
    # again every time (a manifest of a resumed download may be newer).
    if size is not None and final.exists() and final.stat().st_size == size:
        return final
    partial = final.with_name(final.name + ".part")
    start = partial.stat().st_size if partial.exists() else 0
    headers = {"Range": f"bytes={start}-"} if start else {}
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 416 and size is not None and start == size:
            partial.replace(final)  # it was all there already
            return final
        response.raise_for_status()
        mode = "ab" if response.status_code == 206 else "wb"
        with partial.open(mode) as handle:
            for chunk in response.iter_bytes(CHUNK):
                handle.write(chunk)
    if size is not None and partial.stat().st_size != size:
        raise OSError(f"{final.name}: {partial.stat().st_size} bytes, the manifest says {size}")
    partial.replace(final)
    return final


class HarvestFiles:
    """A harvest's files in one directory (as `download_harvest` leaves them)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.manifest: dict[str, Any] = json.loads((self.directory / MANIFEST).read_bytes())
        self.layer_indices: list[int] = list(self.manifest["layer_indices"])
        self.bos_token_id: int | None = self.manifest.get("bos_token_id")
        self.hidden_size: int = int(self.manifest["hidden_size"])

    @property
    def shard_paths(self) -> list[Path]:
        return [self.directory / shard["file"] for shard in self.manifest["shards"]]

    def stats(self) -> dict[str, Any]:
        """`stats.safetensors` as torch tensors (rows in `layer_indices` order)."""
        from safetensors.torch import load_file

        return load_file(self.directory / STATS)

    def prompts(self) -> Iterator[tuple[int, Any, Any]]:
        """(index, bf16 rows [n_layers_kept, n_tokens, hidden], int32 tokens), shard by shard."""
        from safetensors import safe_open

        for path, shard in zip(self.shard_paths, self.manifest["shards"], strict=True):
            with safe_open(str(path), framework="pt") as handle:
                for index in range(shard["first_prompt"], shard["last_prompt"] + 1):
                    yield (
                        index,
                        handle.get_tensor(f"prompt_{index}"),
                        handle.get_tensor(f"tokens_{index}"),
                    )

    def iter_layer(
        self,
        layer: int,
        *,
        batch_size: int,
        shuffle_rows: int = 65536,
        seed: int = 0,
        drop_bos: bool = True,
        repeat: bool = False,
    ) -> Iterator[Any]:
        """Float32 batches `[batch_size, hidden]` of one layer's rows (block index `layer`).

        Rows are shuffled within a buffer of about `shuffle_rows` (memory stays bounded whatever
        the harvest's size); a last batch short of `batch_size` is dropped. `repeat` goes over
        the files again and again (a trainer that asks for a fixed number of batches).
        """
        import torch

        if layer not in self.layer_indices:
            raise ValueError(f"layer {layer} was not harvested; kept: {self.layer_indices}")
        row = self.layer_indices.index(layer)
        bos = self.bos_token_id if drop_bos else None
        # Half the buffer is served each time it fills: it must hold two batches at least.
        shuffle_rows = max(shuffle_rows, 2 * batch_size)
        generator = torch.Generator().manual_seed(seed)
        buffered: list[Any] = []
        count = 0
        while True:
            for _, rows, tokens in self.prompts():
                values = rows[row].float()
                if bos is not None and len(tokens) and int(tokens[0]) == bos:
                    values = values[1:]
                buffered.append(values)
                count += values.shape[0]
                if count >= shuffle_rows:
                    pool = torch.cat(buffered)[torch.randperm(count, generator=generator)]
                    keep = count // 2
                    usable = (count - keep) // batch_size * batch_size
                    yield from pool[:usable].split(batch_size)
                    buffered, count = [pool[usable:]], count - usable
            if not repeat:
                break
        if count >= batch_size:
            pool = torch.cat(buffered)[torch.randperm(count, generator=generator)]
            usable = count // batch_size * batch_size
            yield from pool[:usable].split(batch_size)


def open_harvest(directory: str | Path) -> HarvestFiles:
    return HarvestFiles(directory)
