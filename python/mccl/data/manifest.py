"""File manifests: the list of a dataset's files (path, size, mtime, optional hash), made once by a
parallel walk and read by every worker at start instead of walking the shared volume again.

The paper measured a cold walk of thousands of files on the studio's ZFS volume at 10.6 s over
SMB (0.9 s over NFS); 200 workers each walking it at once multiply that load. A manifest is one
file read: ``python -m mccl.data manifest ROOT -o manifest.json``.

Format (JSON, by columns, so that loading 100,000 entries takes milliseconds: no object per
file is made until one is asked for)::

    {"format": "mccl-manifest", "version": 1, "root": "/Volumes/audio/set1", "created": "...",
     "hash": "sha256" | null, "count": 20000, "total_bytes": 123456,
     "paths": ["a/b.wav", ...], "sizes": [...], "mtimes_ns": [...], "digests": ["hex", ...] | null}

Paths are relative to ``root``, use "/" and are sorted. Names starting with "." (macOS's
``.DS_Store`` and the ``._*`` AppleDouble files an SMB share shows) are skipped unless
``hidden=True``.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime as _dt
import fnmatch
import hashlib
import json
import os
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

__all__ = ["FileEntry", "Manifest", "build_manifest", "walk_files", "hash_file", "HASHES"]

FORMAT = "mccl-manifest"
VERSION = 1
#: Digests a manifest may carry (hashlib names).
HASHES = ("sha256", "blake2b", "md5")


class FileEntry(NamedTuple):
    """One file: ``path`` relative to the manifest's root ("/"-separated), ``size`` in bytes,
    ``mtime_ns`` (nanoseconds since the epoch), ``digest`` (hex, of the manifest's hash) or None."""

    path: str
    size: int
    mtime_ns: int
    digest: Optional[str] = None


def hash_file(path: str, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _scan(root: str, rel: str, include: Sequence[str], hidden: bool) -> tuple[list, list]:
    """One directory: (files [(rel path, size, mtime_ns)], subdirectories [rel path])."""
    files, dirs = [], []
    with os.scandir(os.path.join(root, rel) if rel else root) as it:
        for entry in it:
            if not hidden and entry.name.startswith("."):
                continue
            sub = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir():
                    dirs.append(sub)
                elif entry.is_file():
                    if include and not any(fnmatch.fnmatch(entry.name, p) for p in include):
                        continue
                    st = entry.stat()
                    files.append((sub, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:  # removed while we looked
                continue
    return files, dirs


def walk_files(root: str, workers: int = 16, include: Sequence[str] = (), hidden: bool = False,
               progress: Optional[Callable[[int], None]] = None) -> list[tuple[str, int, int]]:
    """Every file under ``root`` as (relative path, size, mtime_ns), sorted by path.

    Directories are listed by ``workers`` threads at once: on a network volume each listing and
    each stat is a round trip, and the threads overlap them (the GIL is released in the system
    calls). ``include`` keeps only names matching one of the shell patterns.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root} is not a directory")
    out: list = []
    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending = {pool.submit(_scan, root, "", include, hidden)}
        while pending:
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                files, dirs = fut.result()
                out.extend(files)
                if progress and files:
                    progress(len(files))
                for d in dirs:
                    pending.add(pool.submit(_scan, root, d, include, hidden))
    out.sort()
    return out


class Manifest:
    """A dataset's files, loaded from a manifest file or made by :func:`build_manifest`.

    The columns (``paths``, ``sizes``, ``mtimes_ns``, ``digests``) are kept as loaded; indexing
    makes the :class:`FileEntry` of one file.
    """

    def __init__(self, root: str, paths: Sequence[str], sizes: Sequence[int], mtimes_ns: Sequence[int],
                 digests: Optional[Sequence[str]] = None, hash: Optional[str] = None, created: str = ""):
        if not (len(paths) == len(sizes) == len(mtimes_ns)) or (digests is not None and len(digests) != len(paths)):
            raise ValueError("manifest columns differ in length")
        self.root = root
        self.paths, self.sizes, self.mtimes_ns = list(paths), list(sizes), list(mtimes_ns)
        self.digests = None if digests is None else list(digests)
        self.hash = hash
        self.created = created
        self._index: Optional[dict] = None

    @classmethod
    def from_entries(cls, root: str, entries: Sequence[FileEntry], hash: Optional[str] = None,
                     created: str = "") -> "Manifest":
        digests = [e.digest for e in entries] if hash else None
        return cls(root, [e.path for e in entries], [e.size for e in entries], [e.mtime_ns for e in entries],
                   digests, hash, created)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> FileEntry:
        return FileEntry(self.paths[i], self.sizes[i], self.mtimes_ns[i], None if self.digests is None else self.digests[i])

    def __iter__(self) -> Iterator[FileEntry]:
        return (self[i] for i in range(len(self)))

    @property
    def files(self) -> list[FileEntry]:
        return list(self)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def entry(self, path: str) -> FileEntry:
        """The entry of relative ``path`` (KeyError if absent)."""
        if self._index is None:
            self._index = {p: i for i, p in enumerate(self.paths)}
        return self[self._index[path]]

    def full_path(self, entry: FileEntry) -> str:
        return os.path.join(self.root, *entry.path.split("/"))

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "root": self.root, "created": self.created,
                "hash": self.hash, "count": len(self), "total_bytes": self.total_bytes,
                "paths": self.paths, "sizes": self.sizes, "mtimes_ns": self.mtimes_ns, "digests": self.digests}

    def save(self, path: str) -> None:
        """Write atomically (a temporary file renamed over ``path``)."""
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.to_json(), f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # no half-written file left beside the target
            raise

    @classmethod
    def load(cls, path: str, root: Optional[str] = None) -> "Manifest":
        """Read a manifest file; ``root`` overrides the root it was made at (the same share
        mounted elsewhere: ``/Volumes/audio`` on a Mac, ``/mnt/audio`` on Linux).

        Raises:
            OSError: the file cannot be read.
            ValueError: not JSON, not an mccl manifest, or a version this code does not read.
        """
        with open(path) as f:
            try:
                data = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"{path} is not an mccl manifest: not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not an mccl manifest (python -m mccl.data manifest ROOT -o {path})")
        if data.get("version") != VERSION:
            raise ValueError(f"{path}: manifest version {data.get('version')!r}; this mccl reads version {VERSION}")
        return cls(root or data["root"], data["paths"], data["sizes"], data["mtimes_ns"], data.get("digests"),
                   data.get("hash"), data.get("created", ""))


def build_manifest(root: str, hash: Optional[str] = None, workers: int = 16, include: Sequence[str] = (),
                   hidden: bool = False, progress: Optional[Callable[[int], None]] = None) -> Manifest:
    """Walk ``root`` in parallel (see :func:`walk_files`) and, if ``hash`` is one of
    :data:`HASHES`, digest every file (also in parallel; this reads every byte once)."""
    if hash is not None and hash not in HASHES:
        raise ValueError(f"hash must be one of {HASHES} or None, got {hash!r}")
    root = os.path.abspath(root)
    rows = walk_files(root, workers, include, hidden, progress=None if hash else progress)
    digests: list = [None] * len(rows)
    if hash:
        with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futs = {pool.submit(hash_file, os.path.join(root, *r[0].split("/")), hash): i for i, r in enumerate(rows)}
            for fut in cf.as_completed(futs):
                digests[futs[fut]] = fut.result()
                if progress:
                    progress(1)
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return Manifest(root, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                    digests if hash else None, hash, created)
