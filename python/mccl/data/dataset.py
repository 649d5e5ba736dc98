"""A map-style ``Dataset`` over a manifest, read through a :class:`~mccl.data.cache.ShardCache`
(or straight from the share), and a sampler that gives every rank the same files every epoch.

Why a sampler of its own: ``torch.utils.data.DistributedSampler`` reshuffles the whole dataset
across ranks every epoch, so each machine reads different files each epoch and its local cache
only pays off once it holds the whole dataset. :class:`RankShardSampler` assigns each file to
one rank by a hash of its path, once, and shuffles only within a rank's share each epoch: from
the second epoch on every read is a local hit.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch.utils.data import Dataset, Sampler

from .cache import ShardCache, SharedStore
from .manifest import FileEntry, Manifest

__all__ = ["ManifestDataset", "RankShardSampler", "rank_files"]


class ManifestDataset(Dataset):
    """Item ``i`` is ``decode(bytes of manifest file i, entry)`` (default: the raw bytes).

    Args:
        manifest: the files (a :class:`Manifest` or the path of a manifest file).
        cache: where to read through; None reads every item from the share (counted by
            ``self.store``).
        decode: turns a file's bytes into a sample (e.g. ``soundfile.read(io.BytesIO(b))``).
    """

    def __init__(self, manifest: Union[Manifest, str], cache: Optional[ShardCache] = None,
                 decode: Optional[Callable[[bytes, FileEntry], Any]] = None):
        self.manifest = Manifest.load(manifest) if isinstance(manifest, str) else manifest
        self.cache = cache
        self.store = cache.store if cache is not None else SharedStore(self.manifest.root)
        self.decode = decode

    def __len__(self) -> int:
        return len(self.manifest)

    def read(self, i: int) -> bytes:
        entry = self.manifest[i]
        if self.cache is not None:
            return self.cache.get(entry)
        return self.store.read(entry, self.manifest.hash)

    def __getitem__(self, i: int) -> Any:
        data = self.read(i)
        return data if self.decode is None else self.decode(data, self.manifest[i])


def _path_hash(path: str) -> int:
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "big")


def rank_files(paths: list[str], rank: int, world_size: int) -> list[int]:
    """Indices of the files that ``rank`` of ``world_size`` reads: the files ordered by a hash
    of their path, then every ``world_size``-th from ``rank`` on. Each rank gets ``n // world_size``
    or one more; the split depends only on the paths, not on their order or the epoch."""
    order = sorted(range(len(paths)), key=lambda i: (_path_hash(paths[i]), paths[i]))
    return order[rank::world_size]


class RankShardSampler(Sampler[int]):
    """This rank's files (:func:`rank_files`), reshuffled within the rank every epoch.

    Every rank yields the same number of indices, ``ceil(n / world_size)`` (DDP needs the same
    number of steps everywhere): a rank with one file fewer repeats one of its own files, so
    padding never reads another rank's file.

    Args:
        dataset: a :class:`ManifestDataset` (or anything with ``.manifest``).
        rank, world_size: default: the default process group's, else 0 and 1.
        shuffle: permute within the rank each epoch (seeded by ``seed + epoch``).
    """

    def __init__(self, dataset: ManifestDataset, rank: Optional[int] = None, world_size: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0):
        import torch.distributed as dist

        if world_size is None:
            world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        paths = dataset.manifest.paths
        self.indices = rank_files(paths, rank, world_size)
        self.num_samples = math.ceil(len(paths) / world_size) if paths else 0
        if not self.indices and self.num_samples:
            raise ValueError(f"rank {rank} of {world_size} has no files ({len(paths)} in the manifest)")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        mine = list(self.indices)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            mine = [mine[i] for i in torch.randperm(len(mine), generator=g).tolist()]
        while len(mine) < self.num_samples:
            mine.append(mine[len(mine) % len(self.indices)])
        return iter(mine[:self.num_samples])
