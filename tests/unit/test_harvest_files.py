"""The user's side of a harvest on files the server's own writers made: one layer's rows come
back once per pass, BOS rows dropped, shuffled, in full batches; a cut download resumes with a
Range request and ends byte-identical."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from vllm_acs.client import HarvestNotReady, download_harvest, open_harvest
from vllm_acs.harvest.manifest import Manifest, ShardEntry
from vllm_acs.harvest.shards import HarvestedPrompt, shard_bytes, shard_name

BOS, HIDDEN, LAYERS = 0, 8, [1, 3]


def _bits(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _write(directory, n_prompts: int = 10, shard_size: int = 4) -> dict[int, np.ndarray]:
    """A harvest whose layer-3 rows are prompt index + position / 8 (exact in bf16, so every row
    is told apart); returns each prompt's layer-3 rows."""
    rng = np.random.default_rng(0)
    manifest = Manifest(
        job_id="job_x",
        model="m",
        checkpoint="c",
        tokenizer="c",
        hidden_size=HIDDEN,
        n_model_layers=4,
        layer_indices=LAYERS,
        n_prompts=n_prompts,
        shard_size=shard_size,
        max_prompt_tokens=100,
        truncated_prompts=[],
        bos_token_id=BOS,
        vllm_version="v",
        vllm_acs_version="v",
        complete=True,
    )
    rows: dict[int, np.ndarray] = {}
    prompts = []
    for i in range(n_prompts):
        n = int(rng.integers(2, 6))
        tokens = np.asarray([BOS if i % 2 == 0 else 7] + [5] * (n - 1), dtype=np.int32)
        values = np.stack([np.full((n, HIDDEN), float(k), np.float32) for k in (-1, i)])
        values[1] += np.arange(n, dtype=np.float32)[:, None] / 8  # position, exact in bf16
        rows[i] = values[1]
        prompts.append(HarvestedPrompt(index=i, tokens=tokens, bits=_bits(values)))
    for number, start in enumerate(range(0, n_prompts, shard_size)):
        chunk = prompts[start : start + shard_size]
        data = shard_bytes(chunk)
        (directory / shard_name(number)).write_bytes(data)
        manifest.shards.append(
            ShardEntry(
                shard_name(number),
                chunk[0].index,
                chunk[-1].index,
                sum(p.n_tokens for p in chunk),
                len(data),
            )
        )
    (directory / "manifest.json").write_bytes(manifest.to_bytes())
    return rows


def test_a_layer_comes_back_once_per_pass_without_bos_in_full_batches(tmp_path):
    rows = _write(tmp_path)
    expected = np.concatenate([r[1:] if i % 2 == 0 else r for i, r in rows.items()])
    files = open_harvest(tmp_path)
    batches = list(files.iter_layer(3, batch_size=4, shuffle_rows=8, seed=1))
    assert all(b.shape == (4, HIDDEN) and b.dtype == torch.float32 for b in batches)
    got = torch.cat(batches).numpy()
    assert len(got) == len(expected) // 4 * 4
    # Every row at most once, none invented, in a shuffled order.
    as_set = lambda a: sorted(map(tuple, a))  # noqa: E731
    assert set(as_set(got)) <= set(as_set(expected))
    assert len(set(as_set(got))) == len(got)
    assert not np.array_equal(got, expected[: len(got)])
    with pytest.raises(ValueError, match="not harvested"):
        next(files.iter_layer(2, batch_size=4))


def test_repeat_keeps_giving_batches(tmp_path):
    _write(tmp_path)
    stream = open_harvest(tmp_path).iter_layer(1, batch_size=16, repeat=True, shuffle_rows=16)
    assert all(next(stream).shape == (16, HIDDEN) for _ in range(20))


def _serving(directory, seen: list[str | None]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        data = (directory / request.url.path.rsplit("/", 1)[-1]).read_bytes()
        wanted = request.headers.get("range")
        seen.append(wanted)
        if wanted:
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            return httpx.Response(206, content=data[start:])
        return httpx.Response(200, content=data)

    return httpx.MockTransport(handler)


def test_a_cut_download_resumes_with_a_range_request(tmp_path):
    source, target = tmp_path / "server", tmp_path / "client"
    source.mkdir()
    target.mkdir()
    _write(source)
    (source / "stats.safetensors").write_bytes(b"stats")
    names = sorted(p.name for p in source.glob("shard_*"))
    job = {
        "job_id": "job_x",
        "status": "done",
        "result": {
            "manifest_url": "http://node/downloads/job_x/manifest.json?s=1",
            "stats_url": "http://node/downloads/job_x/stats.safetensors?s=1",
            "shard_urls": [f"http://node/downloads/job_x/{n}?s=1" for n in names],
        },
    }
    cut = (source / names[1]).read_bytes()
    (target / f"{names[1]}.part").write_bytes(cut[: len(cut) // 2])
    seen: list[str | None] = []
    files = download_harvest(job, target, transport=_serving(source, seen))
    assert f"bytes={len(cut) // 2}-" in seen
    for name in names:
        assert (target / name).read_bytes() == (source / name).read_bytes()
    assert not list(target.glob("*.part"))
    assert [p.name for p in files.shard_paths] == names
    # Again: the complete shards are not fetched a second time.
    seen.clear()
    download_harvest(job, target, transport=_serving(source, seen))
    assert len(seen) == 2  # the manifest and the stats only


def test_a_harvest_not_done_has_nothing_to_download(tmp_path):
    with pytest.raises(HarvestNotReady):
        download_harvest({"job_id": "j", "status": "running"}, tmp_path)
