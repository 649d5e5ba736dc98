"""A cache of dataset files on a machine's local SSD, in front of the shared volume.

:class:`ShardCache` serves a file from the local copy when it has a good one and from the shared
store (:class:`SharedStore`) otherwise, keeping a copy for next time:

- **keys**: a file's cache key is a digest of (manifest path, size, mtime_ns), so a file changed
  on the share after the manifest was made is a different key, never a stale hit; a hit makes no
  call on the shared volume at all, not even a stat.
- **integrity**: every cached copy starts with a header (magic + BLAKE2b-256 of the content). A
  read checks the magic, the length against the manifest's size and (``verify="always"``, the
  default, or the first time in each process with ``"first"``) the digest; a copy that fails is
  deleted and fetched again (``stats["corrupt"]``). A fetch from the share is checked against
  the manifest's size and, if the manifest has digests, its digest.
- **atomic writes**: a copy is written to ``tmp/`` under a name of its own and renamed into
  ``objects/``, so a reader (or a crash, or SIGKILL mid-write) never leaves a partial file where
  readers look; stray temporary files older than an hour are removed at start.
- **several processes** (DataLoader workers, several jobs) share one cache directory: a file
  lock per key stripe (``filelock``) makes one process fetch a missing file while the others
  wait for it instead of reading the share too; eviction runs under a lock of its own.
- **size cap, LRU**: a hit touches the copy's mtime; when the copies' total passes
  ``max_bytes``, the least recently used are removed down to 90% of it. A file larger than the
  cap is served from the share and not kept.
- **fallback**: if the cache directory fails (disk full, permissions), files are served from the
  share (``stats["fallbacks"]``), with one warning.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from typing import Optional, Union

from filelock import FileLock, Timeout

from .manifest import FileEntry, Manifest

__all__ = ["SharedStore", "ShardCache", "DataIntegrityError"]

log = logging.getLogger(__name__)

MAGIC = b"MCCLSC1\n"
DIGEST_BYTES = 32
HEADER = len(MAGIC) + DIGEST_BYTES
LAYOUT = "v1"
STRIPES = 256


class DataIntegrityError(IOError):
    """A file on the shared store does not match its manifest entry (changed since the manifest)."""


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


class SharedStore:
    """The shared volume: reads files of a manifest, and counts them (``reads``, ``bytes``)."""

    def __init__(self, root: str):
        self.root = root
        self.reads = 0
        self.bytes = 0

    def path(self, entry: FileEntry) -> str:
        return os.path.join(self.root, *entry.path.split("/"))

    def read(self, entry: FileEntry, hash: Optional[str] = None) -> bytes:
        """The file's bytes, checked against the entry's size and, with ``hash``, its digest.

        Raises:
            DataIntegrityError: the file differs from the manifest.
            OSError: the share's own errors (file gone, volume unmounted).
        """
        with open(self.path(entry), "rb") as f:
            data = f.read()
        self.reads += 1
        self.bytes += len(data)
        if len(data) != entry.size:
            raise DataIntegrityError(f"{self.path(entry)}: {len(data)} bytes on the share, {entry.size} in the "
                                     f"manifest: the file changed since the manifest was made (rebuild it)")
        if hash and entry.digest and hashlib.new(hash, data).hexdigest() != entry.digest:
            raise DataIntegrityError(f"{self.path(entry)}: its {hash} differs from the manifest's: the file "
                                     f"changed since the manifest was made (rebuild it)")
        return data


class ShardCache:
    """Local copies of a manifest's files (see the module docstring).

    Args:
        directory: the cache's directory on local storage (created).
        store: the shared store, or its root directory.
        max_bytes: the cap on the copies' total size (headers included).
        verify: ``"always"`` (digest checked on every read), ``"first"`` (once per copy per
            process) or ``"never"`` (header and length only).
        hash: the manifest's digest algorithm, to check fetched files (``manifest.hash``).
        lock_timeout_s: how long to wait for another process fetching the same file.
    """

    def __init__(self, directory: str, store: Union[SharedStore, str], max_bytes: int, verify: str = "always",
                 hash: Optional[str] = None, lock_timeout_s: float = 600.0):
        if verify not in ("always", "first", "never"):
            raise ValueError(f"verify must be 'always', 'first' or 'never', got {verify!r}")
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes!r}")
        self.directory = os.path.abspath(directory)
        self.store = store if isinstance(store, SharedStore) else SharedStore(store)
        self.max_bytes = int(max_bytes)
        self.verify = verify
        self.hash = hash
        self.lock_timeout_s = float(lock_timeout_s)
        self.base = os.path.join(self.directory, LAYOUT)
        for sub in ("objects", "tmp", "locks"):
            os.makedirs(os.path.join(self.base, sub), exist_ok=True)
        self.stats = {"hits": 0, "misses": 0, "waited": 0, "corrupt": 0, "evicted": 0, "fallbacks": 0, "too_big": 0}
        self._verified: set = set()
        self._warned = False
        self._clean_tmp()
        self._usage = self.usage()

    @classmethod
    def for_manifest(cls, manifest: Manifest, directory: str, max_bytes: int, **kwargs) -> "ShardCache":
        return cls(directory, SharedStore(manifest.root), max_bytes, hash=manifest.hash, **kwargs)

    # DataLoader workers receive a pickled copy: fresh counters, no inherited state.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["stats"] = {k: 0 for k in self.stats}
        state["_verified"] = set()
        return state

    # ---- layout --------------------------------------------------------------------------------

    @staticmethod
    def key(entry: FileEntry) -> str:
        return hashlib.sha256(f"{entry.path}\0{entry.size}\0{entry.mtime_ns}".encode()).hexdigest()[:40]

    def object_path(self, entry: FileEntry) -> str:
        k = self.key(entry)
        return os.path.join(self.base, "objects", k[:2], k)

    def _lock(self, key: str) -> FileLock:
        return FileLock(os.path.join(self.base, "locks", f"{int(key[:4], 16) % STRIPES:03d}.lock"),
                        timeout=self.lock_timeout_s)

    def _clean_tmp(self, older_than_s: float = 3600.0) -> None:
        tmp = os.path.join(self.base, "tmp")
        now = time.time()
        for name in os.listdir(tmp):
            p = os.path.join(tmp, name)
            try:
                if now - os.stat(p).st_mtime > older_than_s:
                    os.remove(p)
            except OSError:
                pass

    def _objects(self) -> list:
        """(mtime, size, path) of every copy."""
        out = []
        top = os.path.join(self.base, "objects")
        for d in os.scandir(top):
            if not d.is_dir():
                continue
            for e in os.scandir(d.path):
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, st.st_size, e.path))
        return out

    def usage(self) -> int:
        """Bytes the copies take now (scans the directory)."""
        return sum(size for _, size, _ in self._objects())

    # ---- reading ----------------------------------------------------------------------------

    def _read_copy(self, entry: FileEntry, path: str) -> Optional[bytes]:
        """The cached content if the copy is good; None if absent; deletes a bad copy."""
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        data = blob[HEADER:]
        why = None
        if blob[:len(MAGIC)] != MAGIC:
            why = "bad header"
        elif len(data) != entry.size:
            why = f"{len(data)} bytes instead of {entry.size}"
        elif self.verify == "always" or (self.verify == "first" and path not in self._verified):
            if _digest(data) != blob[len(MAGIC):HEADER]:
                why = "content does not match its digest"
            else:
                self._verified.add(path)
        if why:
            self.stats["corrupt"] += 1
            log.warning("cached copy of %s is corrupt (%s): fetching it again", entry.path, why)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            return None
        try:
            os.utime(path)  # most recently used
        except FileNotFoundError:  # evicted by another process since we opened it: still ours
            pass
        return data

    def get(self, entry: FileEntry) -> bytes:
        """The file's bytes: from the local copy, or from the share (then kept).

        Raises:
            DataIntegrityError: the share's file differs from the manifest.
            OSError: the share failed (the cache's own failures fall back to the share).
        """
        path = self.object_path(entry)
        data = None
        fetched = False
        try:
            data = self._read_copy(entry, path)
            if data is not None:
                self.stats["hits"] += 1
                return data
            with self._lock(self.key(entry)):
                data = self._read_copy(entry, path)  # another process may have fetched it meanwhile
                if data is not None:
                    self.stats["waited"] += 1
                    self.stats["hits"] += 1
                    return data
                self.stats["misses"] += 1
                data = self.store.read(entry, self.hash)
                fetched = True
                if HEADER + len(data) > self.max_bytes:
                    self.stats["too_big"] += 1
                    return data
                self._write_copy(path, data)
        except (DataIntegrityError, Timeout):
            raise
        except OSError as exc:
            if not self._cache_error(exc, path):
                raise
            self.stats["fallbacks"] += 1
            return data if fetched else self.store.read(entry, self.hash)
        self._usage += HEADER + len(data)
        if self._usage > self.max_bytes:
            self.evict()
        return data

    def _cache_error(self, exc: OSError, path: str) -> bool:
        """Whether ``exc`` came from the cache directory (not the share); warns once."""
        name = getattr(exc, "filename", None) or ""
        ours = str(name).startswith(self.directory) or not name
        if ours and not self._warned:
            self._warned = True
            log.warning("the cache in %s failed (%s): serving files from the share", self.directory, exc)
        return ours

    def _write_copy(self, path: str, data: bytes) -> None:
        tmp = os.path.join(self.base, "tmp", f"{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC)
                f.write(_digest(data))
                f.write(data)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.replace(tmp, path)  # atomic: readers see no copy or a whole one
        finally:
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass
        self._verified.add(path)

    # ---- eviction -----------------------------------------------------------------------------

    def evict(self, target: Optional[int] = None) -> int:
        """Remove least recently used copies until the total is at most ``target`` (default 90%
        of ``max_bytes``); return the bytes removed. One process at a time evicts."""
        target = int(0.9 * self.max_bytes) if target is None else target
        removed = 0
        with FileLock(os.path.join(self.base, "locks", "evict.lock"), timeout=self.lock_timeout_s):
            objs = sorted(self._objects())
            total = sum(size for _, size, _ in objs)
            for _, size, path in objs:
                if total <= target:
                    break
                try:
                    os.remove(path)
                except FileNotFoundError:
                    continue
                total -= size
                removed += size
                self.stats["evicted"] += 1
                self._verified.discard(path)
            self._usage = total
        return removed

    def clear(self) -> None:
        self.evict(target=0)
