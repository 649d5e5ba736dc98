"""Data loading for a fleet: file manifests, a local cache of shards in front of the shared volume,
and a Dataset/sampler that reads through both and splits the files by rank.

    python -m mccl.data manifest /Volumes/audio/set1 -o set1.json --workers 32

    from mccl.data import Manifest, ManifestDataset, RankShardSampler, ShardCache
    manifest = Manifest.load("set1.json", root="/Volumes/audio/set1")
    cache = ShardCache.for_manifest(manifest, "/var/tmp/mccl-cache", max_bytes=200 << 30)
    data = ManifestDataset(manifest, cache, decode=my_decoder)
    loader = DataLoader(data, batch_size=64, sampler=RankShardSampler(data), num_workers=4)
"""
from .cache import DataIntegrityError, ShardCache, SharedStore
from .dataset import ManifestDataset, RankShardSampler, rank_files
from .manifest import FileEntry, Manifest, build_manifest, walk_files

__all__ = ["DataIntegrityError", "FileEntry", "Manifest", "ManifestDataset", "RankShardSampler", "ShardCache",
           "SharedStore", "build_manifest", "rank_files", "walk_files"]
