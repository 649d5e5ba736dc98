"""mccl.model: alpha-beta cost models of MCCL's all-reduce algorithms, fitted to ``mccl.bench`` JSON.

Three algorithms, each priced with a per-hop cost ``alpha`` (seconds) and a link bandwidth ``beta``
(bytes/s, TCP goodput), for an S-byte buffer on n hosts:

* **Flat pipelined ring** (Patarasuk & Yuan, 2009; ``csrc/algo/ring.c``): 2(n-1) steps, each moving
  one chunk c = S/n over every link at once::

      t_ring = t0 + 2(n-1) * step(c),   step(c) = max(c/beta, alpha + s(c)/beta)

  ``s(c)`` is the segment (frame) that must arrive whole before it is reduced and forwarded:
  MCCL cuts a chunk into ceil(c/seg) equal segments, so s(c) = c / ceil(c/seg) (s(c) = c when
  c <= seg). Why a max and not a sum: segment j of step k+1 leaves a rank once segment j of
  step k has arrived there (alpha + s/beta after it left the left neighbour), but the right link
  is still busy sending the rest of step k's chunk (c/beta in all). With every rank in the same
  phase, step k+1 starts max(c/beta, alpha + s/beta) after step k: the hop cost hides under the
  transfer of the chunk as long as c >= alpha*beta + s. (Its fill, one extra min(alpha, c/beta)
  for the last segment's flight, is left out: under one step in 2(n-1).)

  ``seg = 0`` gives the paper's form, step = max(alpha, c/beta), the reading of issue 18;
  ``seg = inf`` (no pipelining within a step) gives the classic additive Hockney ring
  2(n-1)(alpha + c/beta) of Thakur, Rabenseifner & Gropp (2005). The ring turns latency-bound at
  the **crossover** n* = S / (alpha*beta) with seg = 0; with segments, S / c* where c* (between
  alpha*beta + seg/2 and alpha*beta + seg) is the smallest chunk with c - s(c) >= alpha*beta.

* **Recursive doubling** (Thakur, Rabenseifner & Gropp, 2005; ``csrc/algo/doubling.c``): every
  round swaps the whole buffer::

      t_doubling = t0 + R(n) * (alpha + S/beta),   R(n) = log2(n) for a power of two,
                                                   floor(log2 n) + 2 otherwise (fold in and out)

* **Two-level ring** (the hierarchical decomposition of Jia et al., 2018 and Mikami et al., 2018,
  named in paper section 7): a reduce-scatter inside each group of g hosts, an all-reduce across
  the G groups on each shard (G hosts, one per group, chunk S/(gG) = S/n), an all-gather inside
  each group::

      t_2l = t0 + 2(g-1) * step(S/g) + 2(G-1) * step_inter(S/n)

  Every rank still moves 2(n-1)/n S bytes (bandwidth-optimal) but pays 2(g-1) + 2(G-1) hops instead
  of 2(n-1). With one group (G = 1) or groups of one host it is the flat ring, term by term. For
  uneven groups it is an upper bound: the largest group's intra-group phases and the smallest
  group's shard (S/g_min) in the inter-group phase. ``step_inter`` may use its own alpha and beta
  (a switch uplink shared by the g rings of a group: beta_inter = uplink/g).

busbw = 2(n-1)/n * S / t (nccl-tests' all-reduce factor, ``docs/PERFORMANCE.md``), so a
bandwidth-bound algorithm shows busbw = beta whatever n.

**The paper's parameters** (``/work/shared/paper/mccl-paper.md``): alpha = 306 us per hop
(section 7, "consistent with the measured 0.59 ms round trip") and beta = 1.238 GB/s of TCP goodput
(section 2). Section 7 says a Hockney (1994) model fitted to the 4-24 Mac runs matches every bucket
of 16 MB or more within 1.9%, a 25 MB bucket stays bandwidth-bound up to roughly 70 Macs, and
50 MB buckets move the crossover past 128 Macs and hold 1.23 GB/s at 100 nodes. With seg = 0,
n* = S/(alpha*beta) gives 66.0 hosts for 25 MB (69.2 for 25 MiB, DDP's bucket_cap_mb unit) and
131.9 for 50 MB (138.4 for 50 MiB), and busbw = beta = 1.238 GB/s at 100 hosts for 50 MB: the
paper's figures. The additive form cannot be what the paper used: it gives 0.70 GB/s at 100 hosts
for 50 MB and 64% of goodput at 24 hosts for 16 MB (not within 1.9%). With MCCL's default 256 KiB
segments the same alpha would put the crossover at 44 (25 MB) and 88 (50 MB) hosts: the segment's
own flight adds to the hop, so a fleet-sized ring wants segments well under alpha*beta (379 kB).

Fitting (:func:`fit`): rows of one op and backend, each assigned to the algorithm MCCL ran (the
row's ``algo`` if it has one, else ring from ``MCCL_RING_THRESHOLD``, 256 KiB, up); the parameters
minimise the sum of squared relative errors (model - measured) / measured. Doubling is linear in
(alpha, 1/beta, t0): one weighted least-squares solve. The ring is piecewise linear: for every split
of the points (sorted by c - s(c)) into latency- and bandwidth-bound, one bounded linear solve, the
best of them under the true model, then a local polish. So exact data is fitted back exactly.
With segments, alpha is fitted only when some point is a single-frame step (c <= s: alpha + c/beta);
otherwise every step hides alpha below a frame's flight, and alpha is reported bounded, not fitted.
t0 (a per-collective overhead: dispatch, wake-ups, announcements) is fitted only when asked: with
one host count it cannot be told from R(n) alpha. The command line fits the ring with the segment
MCCL's runs used (:func:`run_segment`), the paper's form for other backends' rows.

Command line: ``python -m mccl.model predict ...`` and ``python -m mccl.model fit FILE.json ...``
(``--help``; docs/MODEL.md has examples and our fitted parameters). Units on the command line:
alpha in us, beta in GB/s (1e9 B/s), buckets in MB (1e6 B, ``--mib`` for MiB).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from . import _cli

#: The paper's measured parameters (section 7 and section 2).
PAPER_ALPHA_S = 306e-6
PAPER_BETA_BPS = 1.238e9
#: MCCL's defaults (docs/ENVIRONMENT.md): ring from this size up, segments of this size.
DEFAULT_RING_THRESHOLD = 256 * 1024
DEFAULT_ALPHA_BETA = 32 * 1024  # MCCL_ALPHA_BETA's default (csrc/core/param.c)
DEFAULT_SEGMENT_BYTES = 256 * 1024

ALGOS = ("ring", "doubling")
OPS = ("all_reduce", "all_gather", "reduce_scatter")


class ModelError(ValueError):
    """A bad argument or an input the model cannot use; the CLI prints it and exits with 2."""


@dataclass(frozen=True)
class Params:
    """Parameters of one algorithm's model.

    alpha: seconds per hop (step or round). beta: bytes/s. segment: bytes that must arrive whole
    before a ring step forwards them (0: the paper's max(alpha, c/beta); ``math.inf``: additive).
    overhead: seconds per collective (t0).
    """

    alpha: float
    beta: float
    segment: float = 0.0
    overhead: float = 0.0

    def __post_init__(self):
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ModelError(f"alpha must be a finite number >= 0 (got {self.alpha!r} s)")
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ModelError(f"beta must be a finite number > 0 (got {self.beta!r} B/s)")
        if not self.segment >= 0:
            raise ModelError(f"segment must be >= 0 bytes (got {self.segment!r})")
        if not (self.overhead >= 0 and math.isfinite(self.overhead)):
            raise ModelError(f"overhead must be a finite number >= 0 (got {self.overhead!r} s)")


PAPER = Params(PAPER_ALPHA_S, PAPER_BETA_BPS)


# ---------------------------------------------------------------------------------------------
# The models. Sizes in bytes, times in seconds; scalars or numpy arrays.

def segment_of(chunk, segment: float):
    """Bytes of the segment a ring step forwards whole: chunk / ceil(chunk / segment), as
    ``csrc/algo/ring.c`` cuts a chunk; 0 when segment is 0 and the chunk itself when it is inf."""
    c = np.asarray(chunk, dtype=float)
    if segment == 0:
        return np.zeros_like(c)
    if math.isinf(segment):
        return c
    return c / np.maximum(np.ceil(c / segment), 1.0)


def ring_step(chunk, p: Params):
    """Seconds of one pipelined ring step moving ``chunk`` bytes: max(c/beta, alpha + s(c)/beta)."""
    c = np.asarray(chunk, dtype=float)
    return np.maximum(c / p.beta, p.alpha + segment_of(c, p.segment) / p.beta)


def ring_steps(op: str, n):
    """Steps of the ring: 2(n-1) for all-reduce, n-1 for all-gather and reduce-scatter."""
    n = np.asarray(n, dtype=float)
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def ring_time(size, n, p: Params, op: str = "all_reduce"):
    """Seconds of the flat pipelined ring on n hosts (``size``: the whole buffer, as nccl-tests'
    S). One host costs t0 only."""
    n = np.asarray(n, dtype=float)
    return p.overhead + ring_steps(op, n) * ring_step(np.asarray(size, dtype=float) / n, p)


def power_fold(n: int) -> tuple[int, int, int]:
    """(L, P, f) for n >= 1 ranks: P = 2^L the largest power of two <= n, and f = 2 when n is
    not one (the fold into and out of P that recursive doubling and halving-doubling add,
    ``csrc/algo/doubling.c``), else 0."""
    L = int(n).bit_length() - 1
    P = 1 << L
    return L, P, 2 if P < n else 0


def doubling_rounds(n) -> np.ndarray:
    """Rounds of recursive doubling on n ranks: log2(n) for a power of two, else floor(log2 n) + 2
    (the fold into and out of the largest power of two, as ``csrc/algo/doubling.c`` does)."""
    n = np.asarray(n, dtype=np.int64)
    out = np.zeros(n.shape, dtype=float)
    for idx, v in np.ndenumerate(n):
        if v > 1:
            L, _, f = power_fold(int(v))
            out[idx] = L + f
    return out if out.shape else float(out)


def doubling_time(size, n, p: Params, op: str = "all_reduce"):
    """Seconds of the small-message algorithm: recursive doubling for all-reduce (and for
    reduce-scatter, run over the whole input), R(n) (alpha + S/beta); Bruck's all-gather for
    all-gather, ceil(log2 n) alpha + (n-1)/n S/beta."""
    size = np.asarray(size, dtype=float)
    n = np.asarray(n, dtype=float)
    if op == "all_gather":
        L = np.ceil(np.log2(np.maximum(n, 1)))
        return p.overhead + L * p.alpha + (n - 1) / n * size / p.beta
    return p.overhead + doubling_rounds(n) * (p.alpha + size / p.beta)


def halving_time(size, n, p: Params) -> float:
    """Seconds of recursive halving-doubling (Rabenseifner) all-reduce on n hosts: 2 log2 P
    rounds of alpha and 2 (P-1)/P S/beta, P the largest power of two <= n, plus 2 (alpha + S/beta)
    for the fold when n is not a power of two (``csrc/algo/doubling.c``; the formula
    ``csrc/algo/select.c`` chooses it by)."""
    n = int(n)
    if n < 2:
        return p.overhead
    L, P, f = power_fold(n)
    return p.overhead + (2 * L + f) * p.alpha + (2 * (P - 1) / P + f) * float(size) / p.beta


def group_sizes(n: int, groups: int | None = None, group_size: int | None = None) -> list[int]:
    """Split n hosts into groups as evenly as possible (sizes differ by at most one): ``groups``
    of them, or ceil(n / group_size) groups of at most ``group_size``; never more groups than
    hosts."""
    if n < 1:
        raise ModelError(f"hosts must be >= 1 (got {n})")
    if (groups is None) == (group_size is None):
        raise ModelError("give exactly one of groups and group_size")
    if groups is not None:
        if groups < 1:
            raise ModelError(f"groups must be >= 1 (got {groups})")
        k = min(groups, n)
    else:
        if group_size < 1:
            raise ModelError(f"group size must be >= 1 (got {group_size})")
        k = -(-n // group_size)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def two_level_time(size: float, sizes: Sequence[int], p: Params, inter: Params | None = None) -> float:
    """Seconds of the two-level all-reduce over groups of ``sizes`` hosts: reduce-scatter inside
    each group, all-reduce across groups on each shard (parameters ``inter``, default ``p``),
    all-gather inside each group. Exact for equal groups; an upper bound for unequal ones (module
    docstring)."""
    if not sizes or min(sizes) < 1:
        raise ModelError(f"group sizes must be >= 1 (got {list(sizes)})")
    inter = inter or p
    G, gmax, gmin = len(sizes), max(sizes), min(sizes)
    intra = max((g - 1) * float(ring_step(size / g, p)) for g in sizes)  # one of the two phases
    cross = 2 * (G - 1) * float(ring_step(size / gmin / G, inter))
    return p.overhead + 2 * intra + cross


def busbw(size, n, t, op: str = "all_reduce"):
    """Bus bandwidth in B/s: S/t times nccl-tests' factor, 2(n-1)/n for all-reduce, (n-1)/n for
    all-gather and reduce-scatter."""
    n = np.asarray(n, dtype=float)
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return np.asarray(size, dtype=float) / np.asarray(t, dtype=float) * factor


def crossover_chunk(p: Params) -> float:
    """The smallest chunk (bytes) whose ring step is bandwidth-bound, c - s(c) >= alpha*beta:
    alpha*beta with the paper's form (segment 0). With segments, s(c) = c/k for k = ceil(c/seg),
    so within k segments the step is bandwidth-bound from c = alpha*beta * k/(k-1) up; the first k
    where that fits under k*seg gives it (so it lies between alpha*beta + seg/2 and
    alpha*beta + seg). Infinite for the additive form, whose step never hides alpha."""
    ab = p.alpha * p.beta
    if p.segment == 0 or ab == 0:
        return ab
    if math.isinf(p.segment):
        return math.inf
    k = max(2, math.floor(ab / p.segment) + 1)
    while ab * k / (k - 1) > k * p.segment:
        k += 1
    return max(ab * k / (k - 1), (k - 1) * p.segment)


def crossover_hosts(size: float, p: Params) -> float:
    """Host count n* above which the flat ring's step is latency-bound: S / (alpha*beta) with the
    paper's form, S / crossover_chunk with segments (about S / (alpha*beta + seg)). For the additive
    form, whose steps are never purely bandwidth-bound, the n where its two terms are equal,
    S / (alpha*beta). Infinite when alpha is 0."""
    c = p.alpha * p.beta if math.isinf(p.segment) else crossover_chunk(p)
    return math.inf if c == 0 else size / c


def alpha_beta_setting(alpha: float, beta: float) -> str:
    """``MCCL_ALPHA_BETA=<bytes>`` for a per-hop cost ``alpha`` (s) and a goodput ``beta`` (B/s):
    the product libmccl's algorithm choice compares message sizes against (csrc/algo/select.c,
    docs/ENVIRONMENT.md), rounded to whole bytes and at least 1 (the variable's range)."""
    return f"MCCL_ALPHA_BETA={max(1, round(alpha * beta))}"


# ---------------------------------------------------------------------------------------------
# Reading mccl.bench JSON.

def parse_size(text: str | int | float) -> int:
    """'256K', '4M', '1G' (binary multiples, as mccl.bench and MCCL_* read them) or a byte count."""
    if isinstance(text, (int, float)):
        return int(text)
    t = str(text).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):
        raise ModelError(f"not a size: {text!r} (expected bytes or a K/M/G multiple)") from None
    if value < 0:
        raise ModelError(f"not a size: {text!r} (a size is 0 or more bytes)")
    return value


@dataclass
class Point:
    """One measured (size, hosts) time, with the algorithm it ran."""

    size: int
    nranks: int
    time_s: float
    algo: str
    source: str = ""


def load_rows(path: str) -> tuple[dict, list[dict]]:
    """(meta, rows) of a ``mccl.bench`` JSON file: {"meta": ..., "results": [...]}. A file is
    parsed once per process while it stays unchanged (fit and segment checks both read it);
    callers must not modify what it returns."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return _parse_rows(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _parse_rows(path: str, _mtime_ns: int, _size: int) -> tuple[dict, list[dict]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ModelError(f"{path}: not a mccl.bench collectives file (no 'results' list)")
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    return meta, data["results"]


def _env(meta: dict) -> dict:
    env = meta.get("env")
    return env if isinstance(env, dict) else {}


def file_goodput(meta: dict) -> float | None:
    """The run's TCP goodput in B/s from its metadata, or None."""
    gp = meta.get("goodput")
    if isinstance(gp, dict) and gp.get("bits_per_s"):
        try:
            v = float(gp["bits_per_s"]) / 8
        except (TypeError, ValueError):
            raise ModelError(f"meta.goodput.bits_per_s is not a number: {gp['bits_per_s']!r}") from None
        return v if v > 0 and math.isfinite(v) else None
    return None


def classify(row: dict, meta: dict, threshold: int | None = None, op: str = "all_reduce") -> str:
    """The algorithm MCCL ran for a row: the row's ``algo`` when the benchmark recorded one, the
    run's MCCL_ALGO when it forced one, else ring from the threshold (the run's
    MCCL_RING_THRESHOLD, else 256 KiB) up and with at least one element per rank, as
    ``csrc/algo/select.c`` decides. For all-gather the whole gathered array decides (n x row
    size there is the full array already), for reduce-scatter the whole input. All-reduce rows that
    select.c runs as halving-doubling are "halving" (no fit takes them) in files whose meta has
    ``algo_select`` >= 2 (mccl.bench writes it; older files predate halving-doubling)."""
    algo = row.get("algo")
    if algo in ALGOS:
        return algo
    env = _env(meta)
    forced = str(env.get("MCCL_ALGO", "")).lower()
    if forced == "ring":
        return "ring"
    if forced in ("tree", "doubling"):
        return "doubling"
    if forced in ("halving", "halving-doubling"):
        return "halving" if op == "all_reduce" else "ring"
    raw = env.get("MCCL_RING_THRESHOLD")
    thr = threshold if threshold is not None else (
        DEFAULT_RING_THRESHOLD if raw is None else libmccl_size(raw, DEFAULT_RING_THRESHOLD, 0, 2**63 - 1))
    count = row.get("count", row["size"])
    kind = "ring" if row["size"] >= thr and count >= row["nranks"] else "doubling"
    cluster = meta.get("cluster") if isinstance(meta.get("cluster"), dict) else {}
    one_group = cluster.get("switches", 1) == 1  # the emulated cluster's switches are its groups
    if op == "all_reduce" and meta.get("algo_select", 1) >= 2 and forced not in ("twolevel", "two-level") \
            and one_group and _halving_chosen(row["size"], count, row["nranks"], kind, env):
        return "halving"
    return kind


def _halving_chosen(size: int, count: int, n: int, kind: str, env: dict) -> bool:
    """Whether ``csrc/algo/select.c`` runs an automatic all-reduce as halving-doubling instead of
    ``kind``: its model cost (units of alpha, x = S / (alpha beta), MCCL_ALPHA_BETA default
    32 KiB) below doubling's, or, where the ring would run, the ring's chunks S/n at most
    alpha x beta and its cost below the ring's; on 4 ranks or more, with a block per power-of-two
    rank, and only on one topology group (the caller checks the emulated cluster's switches; groups
    from MCCL_TOPOLOGY or subnets elsewhere are not known to the file)."""
    raw = env.get("MCCL_ALPHA_BETA")
    ab = DEFAULT_ALPHA_BETA if raw is None else libmccl_size(raw, DEFAULT_ALPHA_BETA, 1, 1 << 40)
    L, p, f = power_fold(n)  # select.c's halvingBeats, in the same exact integer form
    if L < 2 or count < p:
        return False
    if kind == "ring":
        return size // n <= ab and size * (2 * (p - 1) * n + f * p * n - 2 * (n - 1) * p) < \
            (2 * (n - 1) - 2 * L - f) * p * n * ab
    return size * (L * p - 2 * (p - 1)) > L * p * ab


def points_from(paths: Iterable[str], *, backend: str = "mccl", op: str = "all_reduce",
                threshold: int | None = None, min_size: int = 0, max_size: int | None = None,
                algo: str | None = None) -> tuple[list[Point], list[float]]:
    """Timed rows of ``op`` and ``backend`` from the files (no error, no skew, at least 2 ranks,
    size within [min_size, max_size]) as Points, and each file's goodput (B/s) where it has one.
    ``algo`` assigns every row to one algorithm (for backends other than mccl)."""
    pts, goodputs = [], []
    for path in paths:
        meta, rows = load_rows(path)
        try:
            g = file_goodput(meta)
        except ModelError as exc:
            raise ModelError(f"{path}: {exc}") from None
        if g:
            goodputs.append(g)
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or r.get("op") != op or r.get("backend") != backend:
                continue
            if "time_us" not in r or r.get("error") or r.get("unsupported") or (r.get("skew_ms") or 0) > 0:
                continue
            try:
                n, size, t = int(r.get("nranks") or meta.get("world_size") or 0), int(r["size"]), float(r["time_us"])
                if r.get("count") is not None:
                    int(r["count"])
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ModelError(f"{path}: results[{i}]: not a timed row (size, nranks, time_us, count): "
                                 f"{type(exc).__name__}: {exc}") from None
            if not (t > 0 and math.isfinite(t)):
                raise ModelError(f"{path}: results[{i}]: time_us must be a finite number > 0 (got {r['time_us']!r})")
            if n < 2 or size < min_size or (max_size is not None and size > max_size):
                continue
            r = {**r, "nranks": n, "size": size}
            a = algo or (classify(r, meta, threshold, op) if backend == "mccl" else "ring")
            pts.append(Point(size, n, t * 1e-6, a, path))
    return pts, goodputs


# ---------------------------------------------------------------------------------------------
# Fitting.

@dataclass
class Fit:
    """Fitted parameters of one algorithm and the fit's error at every point."""

    algo: str
    op: str
    params: Params
    points: list[Point]
    model_s: np.ndarray
    alpha_identified: bool = True
    alpha_bound: float | None = None  # an upper bound on alpha when it is not identified
    holdout: np.ndarray | None = None  # leave-one-out relative errors, when asked for

    @property
    def rel_err(self) -> np.ndarray:
        t = np.array([p.time_s for p in self.points])
        return (self.model_s - t) / t

    @property
    def rms(self) -> float:
        e = self.rel_err
        return float(np.sqrt(np.mean(e ** 2))) if e.size else 0.0


def predict_points(points: Sequence[Point], p: Params, algo: str, op: str = "all_reduce") -> np.ndarray:
    S = np.array([q.size for q in points], dtype=float)
    n = np.array([q.nranks for q in points], dtype=float)
    return ring_time(S, n, p, op) if algo == "ring" else doubling_time(S, n, p, op)


def _lsq(A: np.ndarray, t: np.ndarray) -> np.ndarray:
    """min sum ((A x - t)/t)^2 with x >= 0 (scipy's bounded linear least squares); columns that
    are all zero get 0."""
    from scipy.optimize import lsq_linear

    W = A / t[:, None]
    x = np.zeros(A.shape[1])
    live = np.any(W != 0, axis=0)
    if not live.any():
        return x
    # Scale the columns to one: alpha (~1e-4) and 1/beta (~1e-9) differ by orders of magnitude.
    scale = np.abs(W[:, live]).max(axis=0)
    res = lsq_linear(W[:, live] / scale, np.ones(len(t)), bounds=(0, np.inf), method="bvls",
                     tol=1e-15, lsmr_tol=None)
    x[live] = res.x / scale
    return x


def _cost(points, p, algo, op, t) -> float:
    return float(np.sum(((predict_points(points, p, algo, op) - t) / t) ** 2))


def _fit_once(points: Sequence[Point], algo: str, op: str, segment: float, overhead: bool):
    """(params, alpha identified, alpha bound) minimising the squared relative errors."""
    t = np.array([q.time_s for q in points])
    S = np.array([q.size for q in points], dtype=float)
    n = np.array([q.nranks for q in points], dtype=float)
    ones = np.ones_like(t) if overhead else np.zeros_like(t)
    if algo == "doubling":
        if op == "all_gather":
            L = np.ceil(np.log2(n))
            A = np.column_stack([L, (n - 1) / n * S, ones])
        else:
            R = doubling_rounds(n)
            A = np.column_stack([R, R * S, ones])
        a, x, t0 = _lsq(A, t)
        if x <= 0:
            raise ModelError(f"{algo}: the points do not determine beta (times do not grow with size)")
        return Params(a, 1 / x, segment, t0), bool(np.any(A[:, 0])), None
    K = ring_steps(op, n)
    c = S / n
    s = segment_of(c, segment)
    key = c - s  # latency-bound iff key < alpha*beta: monotone in c
    order = np.argsort(key, kind="stable")
    # With segments, alpha shows plainly only in single-frame steps (c <= s: alpha + c/beta). A
    # step of several frames hides it unless alpha exceeds the flight of c - s(c) bytes, so
    # without a single-frame point a fit could only read alpha off one point sitting at that
    # kink (a fraction of a percent of noise made alpha hundreds of us): alpha stays bounded.
    anchored = not (0 < segment < math.inf) or bool(np.any(key <= 0))
    best = None
    for split in range(len(points) + 1 if anchored else 1):
        lat = np.zeros(len(points), dtype=bool)
        lat[order[:split]] = True
        A = np.column_stack([np.where(lat, K, 0.0), np.where(lat, K * s, K * c), ones])
        a, x, t0 = _lsq(A, t)
        if x <= 0:
            continue
        cand = Params(a, 1 / x, segment, t0)
        cost = _cost(points, cand, algo, op, t)
        if best is None or cost < best[0] - 1e-15:
            best = (cost, cand)
    if best is None:
        raise ModelError(f"{algo}: the points do not determine beta (times do not grow with size)")
    cost, p = best
    try:  # a local polish of the piecewise-linear optimum (it may sit on a branch boundary)
        from scipy.optimize import least_squares

        x0 = np.array([p.alpha, 1 / p.beta] + ([p.overhead] if overhead else []))
        sc = np.maximum(np.abs(x0), [1e-6, 1e-12] + ([1e-6] if overhead else []))

        def resid(z):
            z = z * sc
            q = Params(max(z[0], 0.0), 1 / max(z[1], 1e-30), segment, max(z[2], 0.0) if overhead else 0.0)
            return (predict_points(points, q, algo, op) - t) / t

        r = least_squares(resid, x0 / sc, bounds=(0, np.inf), xtol=1e-15, ftol=1e-15, gtol=1e-15)
        z = r.x * sc
        q = Params(z[0] if anchored else 0.0, 1 / z[1], segment, z[2] if overhead else 0.0)
        if _cost(points, q, algo, op, t) < cost:
            p = q
    except (ValueError, ZeroDivisionError):
        pass
    # Alpha is seen only through latency-bound points; without one it is only bounded above.
    seg_pts = segment_of(c, segment)
    lat_any = anchored and np.any(K * c / p.beta < K * (p.alpha + seg_pts / p.beta) * (1 + 1e-9))
    bound = None if lat_any else float(np.min((c - seg_pts) / p.beta))
    if not lat_any:
        p = replace(p, alpha=0.0)
    return p, bool(lat_any), bound


def fit(points: Sequence[Point], algo: str, op: str = "all_reduce", *, segment: float = 0.0,
        overhead: bool = False, holdout: str | None = None) -> Fit:
    """Fit ``algo``'s model to the points that ran it (seconds, bytes; see the module docstring).

    ``holdout``: also predict each point from a fit to the others: "point" leaves out that point
    alone, "size" every point of its (size, hosts) cell (other runs of the same cell too), "hosts"
    every point of its host count. Raises ModelError with too few points, when the points cannot
    determine beta, or when ``overhead`` is asked of doubling points at a single host count (t0
    and R(n) alpha are then the same column)."""
    pts = [q for q in points if q.algo == algo]
    need = 3 if overhead else 2
    if len(pts) < need:
        raise ModelError(f"{algo}: {len(pts)} point(s) of {op}; a fit needs at least {need}")
    if overhead and algo == "doubling" and len({q.nranks for q in pts}) < 2:
        raise ModelError("doubling: a per-collective overhead needs points at two or more host counts "
                         "(with one, t0 cannot be told from R(n) alpha)")
    p, ident, bound = _fit_once(pts, algo, op, segment, overhead)
    f = Fit(algo, op, p, pts, predict_points(pts, p, algo, op), ident, bound)
    if holdout:
        keys = {"point": lambda i, q: i, "size": lambda i, q: (q.size, q.nranks), "hosts": lambda i, q: q.nranks}
        if holdout not in keys:
            raise ModelError(f"holdout must be one of {', '.join(keys)} (got {holdout!r})")
        key = [keys[holdout](i, q) for i, q in enumerate(pts)]
        errs = np.full(len(pts), math.nan)
        for k in dict.fromkeys(key):
            rest = [q for q, kk in zip(pts, key) if kk != k]
            if len(rest) < need or (overhead and algo == "doubling" and len({q.nranks for q in rest}) < 2):
                continue
            try:
                q, _, _ = _fit_once(rest, algo, op, segment, overhead)
            except ModelError:
                continue
            for i in (i for i, kk in enumerate(key) if kk == k):
                m = float(predict_points([pts[i]], q, algo, op)[0])
                errs[i] = (m - pts[i].time_s) / pts[i].time_s
        f.holdout = errs
    return f


# ---------------------------------------------------------------------------------------------
# Predictions and the table.

@dataclass
class Row:
    hosts: int
    size: float
    groups: list[int]
    times: dict = field(default_factory=dict)  # algorithm -> seconds

    def busbw(self, algo: str) -> float:
        return float(busbw(self.size, self.hosts, self.times[algo]))


PREDICT_ALGOS = ("flat ring", "two-level", "doubling", "halving-doubling")


def predict(hosts: Sequence[int], sizes: Sequence[float], ring: Params, doubling: Params | None = None, *,
            groups: int | None = None, group_size: int | None = None, inter: Params | None = None,
            uplink: float | None = None) -> list[Row]:
    """All-reduce time of the four algorithms for every (hosts, size): flat ring and two-level
    ring with ``ring`` (the two-level's inter-group phase with ``inter``, default ``ring``),
    doubling and halving-doubling with ``doubling`` (default ``ring``'s parameters; both are
    rounds of whole messages, alpha + bytes/beta each). Groups: ``groups`` of them or
    groups of at most ``group_size`` hosts (default 16), as even as possible. ``uplink`` (B/s):
    one group's uplink, shared by the cross-group rings of its hosts, so the inter-group phase
    gets min(beta, uplink / g_max) each."""
    doubling = doubling or ring
    inter = inter or ring
    if groups is None and group_size is None:
        group_size = 16
    out = []
    for S in sizes:
        for n in hosts:
            gs = group_sizes(n, groups, group_size)
            inter_n = inter if uplink is None else replace(inter, beta=min(inter.beta, uplink / max(gs)))
            out.append(Row(n, S, gs, {
                "flat ring": float(ring_time(S, n, ring)),
                "two-level": two_level_time(S, gs, ring, inter_n),
                "doubling": float(doubling_time(S, n, doubling)),
                "halving-doubling": halving_time(S, n, doubling),
            }))
    return out


def _layout(gs: list[int]) -> str:
    if len(set(gs)) == 1:
        return f"{len(gs)}x{gs[0]}"
    big, small = max(gs), min(gs)
    return f"{gs.count(big)}x{big}+{gs.count(small)}x{small}"


def format_size(S: float) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if S >= m and S % m == 0:
            return f"{S / m:g} {unit}"
    for unit, m in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if S >= m:
            return f"{S / m:g} {unit}"
    return f"{S:g} B"


def format_table(rows: list[Row], goodput: float) -> str:
    """Plain text: one line per (size, hosts); time (ms), busbw (GB/s) and % of goodput of each
    algorithm, and the fastest."""
    head1 = f"{'bucket':>10} {'hosts':>5} {'groups':>9} |" + "|".join(f"{a:^27}" for a in PREDICT_ALGOS) + "| fastest"
    head2 = f"{'':>10} {'':>5} {'':>9} |" + "|".join(f"{'time ms':>9} {'busbw':>7} {'%gp':>7} " for _ in PREDICT_ALGOS) + "|"
    lines = [head1, head2, "-" * len(head1)]
    for r in rows:
        cells = []
        for a in PREDICT_ALGOS:
            bw = r.busbw(a)
            cells.append(f"{r.times[a] * 1e3:>9.2f} {bw / 1e9:>7.3f} {100 * bw / goodput:>6.1f}% ")
        tmin = min(r.times.values())  # ties (within rounding) go to the simpler algorithm
        best = next(a for a in PREDICT_ALGOS if r.times[a] <= tmin * (1 + 1e-9))
        lines.append(f"{format_size(r.size):>10} {r.hosts:>5} {_layout(r.groups):>9} |" + "|".join(cells) + f"| {best}")
    return "\n".join(lines)


def plot(rows: list[Row], goodput: float, path: str, title: str, ring: Params, doubling: Params | None = None,
         **layout) -> None:
    """busbw against hosts (2 to the largest asked for), one panel per bucket size, a line per
    algorithm, goodput and the crossover marked; the table's points as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r.size for r in rows))
    nmax = max(r.hosts for r in rows)
    # The table's own host counts are on the curve too: doubling's cost jumps at powers of two
    # (a non-power of two adds a round), so a grid that steps over 128 would pass beside its marker.
    grid = np.unique(np.concatenate([np.round(np.geomspace(2, max(nmax, 4), 200)).astype(int),
                                     [r.hosts for r in rows]]))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.2), squeeze=False)
    for ax, S in zip(axes.flat, sizes):
        dense = predict(grid, [S], ring, doubling, **layout)
        for a, style in zip(PREDICT_ALGOS, ("-", "--", ":", (0, (5, 1, 1, 1)))):
            ax.plot(grid, [d.busbw(a) / 1e9 for d in dense], linestyle=style, label=a)
            mine = [r for r in rows if r.size == S]
            ax.plot([r.hosts for r in mine], [r.busbw(a) / 1e9 for r in mine], "o", ms=3, color=ax.lines[-1].get_color())
        ax.axhline(goodput / 1e9, color="k", lw=0.8, ls="-.", label=f"goodput {goodput / 1e9:.3f} GB/s")
        nstar = crossover_hosts(S, ring)
        if math.isfinite(nstar) and nstar <= grid[-1]:
            ax.axvline(nstar, color="grey", lw=0.8, ls=":")
            ax.annotate(f"n* = {nstar:.1f}", (nstar, goodput / 1e9 * 0.05), fontsize=8, rotation=90)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, goodput / 1e9 * 1.1)
        ax.set_title(f"all-reduce of {format_size(S)}")
        ax.set_xlabel("hosts")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Command line.

def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got {text!r}")
    return vals


#: The largest fleet ``predict`` prices; the doubling and two-level terms take time linear in hosts.
MAX_HOSTS = 100_000


def _hosts(text: str) -> list[int]:
    vals = _ints(text)
    if min(vals) < 2:
        raise argparse.ArgumentTypeError(f"expected host counts >= 2 (one host has no all-reduce to price), got {text!r}")
    if max(vals) > MAX_HOSTS:
        raise argparse.ArgumentTypeError(f"{max(vals)} hosts: this model prices at most {MAX_HOSTS}")
    return vals


def _floats(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or not all(v > 0 and math.isfinite(v) for v in vals):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return vals


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def _floats_one(text: str) -> float:
    vals = _floats(text)
    if len(vals) != 1:
        raise argparse.ArgumentTypeError(f"expected one number > 0, got {text!r}")
    return vals[0]


def _segment(text: str) -> float:
    if text.strip().lower() in ("inf", "none"):
        return math.inf
    return _positive(text) * 1024


def _add_model_args(p: argparse.ArgumentParser, for_predict: bool) -> None:
    default = ("the segment the files' mccl runs used (their MCCL_SEGMENT_BYTES, else 256), 0 for other backends"
               + ("; without --fit, 0" if for_predict else ""))
    p.add_argument("--segment-kb", type=_segment, default=None, metavar="KB",
                   help="KiB a ring step forwards whole: step = max(c/beta, alpha + s/beta); 0 is the paper's "
                        f"max(alpha, c/beta), 'inf' the additive alpha + c/beta. Default: {default}")


def libmccl_size(raw, default: int, lo: int, hi: int) -> int:
    """The value libmccl takes for a byte-size variable set to ``raw`` (csrc/core/param.c): a
    decimal integer with an optional K/M/G suffix (powers of 1024) within [lo, hi]; anything else
    (libmccl warns and) gives the default."""
    m = re.fullmatch(r"([+-]?[0-9]+)([kKmMgG]?)", raw) if isinstance(raw, str) else None
    if m is None:
        return default
    v = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    return v if lo <= v <= hi else default


def run_segment(paths: Iterable[str], backend: str = "mccl") -> float:
    """Bytes of the ring segment the files' runs used: their MCCL_SEGMENT_BYTES as libmccl reads
    it (256 KiB where unset or not a valid setting) for mccl rows, 0 (the paper's max form) for
    other backends. Raises ModelError when the files ran different segments (pooling them under
    one model would be wrong)."""
    if backend != "mccl":
        return 0.0
    segs = {}
    for path in paths:
        meta, _ = load_rows(path)
        raw = _env(meta).get("MCCL_SEGMENT_BYTES")
        segs[path] = float(DEFAULT_SEGMENT_BYTES if raw is None else
                           libmccl_size(raw, DEFAULT_SEGMENT_BYTES, 4096, 1 << 30))
    if len(set(segs.values())) > 1:
        raise ModelError("the files ran different ring segments ("
                         + ", ".join(f"{k}: {v / 1024:g} KiB" for k, v in segs.items())
                         + "); fit them separately or give --segment-kb")
    return next(iter(segs.values()), float(DEFAULT_SEGMENT_BYTES))


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mccl.model", description=__doc__.split("\n\n")[0],
                                 epilog="docs/MODEL.md: the formulas, their sources and our fitted parameters.")
    sub = ap.add_subparsers(dest="cmd", metavar="{predict,fit}")
    sub.required = True

    pp = sub.add_parser("predict", help="all-reduce time and busbw of flat ring, two-level ring and doubling",
                        description="Predict all-reduce time, busbw and % of goodput for the flat ring, the "
                                    "two-level ring and recursive doubling, from the paper's parameters (default), "
                                    "given ones, or a fit to a mccl.bench JSON file.")
    pp.add_argument("--hosts", type=_hosts, default=[8, 24, 70, 128, 256], help="host counts, 2 or more (default 8,24,70,128,256)")
    pp.add_argument("--bucket-mb", type=_floats, default=[25.0, 50.0], help="bucket sizes in MB (default 25,50)")
    pp.add_argument("--mib", action="store_true", help="read --bucket-mb in MiB (2^20 B), as DDP's bucket_cap_mb")
    src = pp.add_mutually_exclusive_group()
    src.add_argument("--fit", metavar="FILE.json", nargs="+", help="fit alpha and beta to these mccl.bench files")
    src.add_argument("--alpha-us", type=_positive, default=None, help="per-hop cost in us (default 306, the paper's)")
    pp.add_argument("--goodput-gbs", type=_floats_one, default=None, metavar="GBS",
                    help="TCP goodput beta in GB/s (default 1.238, the paper's); with --fit, the %%goodput reference")
    grp = pp.add_mutually_exclusive_group()
    grp.add_argument("--groups", type=int, default=None, help="number of groups (switches) for the two-level ring")
    grp.add_argument("--group-size", type=int, default=None, help="hosts per group (default 16: the paper's groups of "
                                                                  "10-16 Macs on one switch)")
    pp.add_argument("--uplink-gbs", type=_floats_one, default=None,
                    help="bandwidth of one group's uplink, shared by its g cross-group rings (default: no limit)")
    pp.add_argument("--inter-alpha-us", type=_positive, default=None, help="per-hop cost across groups (default alpha)")
    pp.add_argument("--backend", default="mccl", help="with --fit: the backend's rows (default mccl)")
    pp.add_argument("--plot", metavar="OUT.png", type=_cli.output_file, default=None, help="write busbw against hosts here (matplotlib)")
    _add_model_args(pp, for_predict=True)

    fp = sub.add_parser("fit", help="fit alpha and beta per algorithm to mccl.bench JSON; per-point errors",
                        description="Fit each algorithm's alpha-beta model to the rows of one op and backend and "
                                    "print the parameters and every point's error.")
    fp.add_argument("files", nargs="+", metavar="FILE.json", help="mccl.bench --json output (several: pooled)")
    fp.add_argument("--backend", default="mccl", help="rows of this backend (default mccl)")
    fp.add_argument("--op", default="all_reduce", choices=OPS, help="rows of this collective (default all_reduce)")
    fp.add_argument("--algo", choices=ALGOS, default=None,
                    help="count every row as this algorithm (default: what MCCL ran: ring from the threshold up)")
    fp.add_argument("--threshold", default=None, help="ring from this size up (default: the run's MCCL_RING_THRESHOLD, 256K)")
    fp.add_argument("--min-size", default="0", help="leave out rows below this size (e.g. 1M)")
    fp.add_argument("--max-size", default=None, help="leave out rows above this size")
    fp.add_argument("--overhead", action="store_true", help="fit a per-collective overhead t0 too")
    fp.add_argument("--holdout", nargs="?", const="size", default=None, choices=("size", "hosts", "point"),
                    help="also predict each point from a fit without it: 'size' (default) leaves out its whole "
                         "(size, hosts) cell, 'hosts' its host count, 'point' the point alone")
    _add_model_args(fp, for_predict=False)
    return ap


def _fits_from(files, backend, op="all_reduce", segment=0.0, overhead=False, holdout=False, **kw):
    pts, goodputs = points_from(files, backend=backend, op=op, **kw)
    if not pts:
        raise ModelError(f"no timed {op} rows of backend {backend!r} on 2 or more ranks in {', '.join(files)}")
    fits, skipped = {}, []
    for a in ALGOS:
        if sum(q.algo == a for q in pts) >= (3 if overhead else 2):
            try:
                fits[a] = fit(pts, a, op, segment=segment, overhead=overhead, holdout=holdout)
            except ModelError as exc:  # the other algorithm's fit still stands
                skipped.append(str(exc))
    if not fits:
        raise ModelError(f"no algorithm could be fitted to the {op} rows of backend {backend!r}: "
                         + ("; ".join(skipped) if skipped else
                            ", ".join(f"{a} {sum(q.algo == a for q in pts)} rows" for a in ALGOS)))
    return fits, goodputs, [f"not fitted: {why}" for why in skipped]


def libmccl_alpha(fits: dict, op: str = "all_reduce") -> tuple[float, float, str] | None:
    """(alpha, beta, where alpha came from) for MCCL_ALPHA_BETA: select.c compares chunks against
    alpha x beta, the crossover of the paper's max(alpha, c/beta) form, so the ring is refitted in
    that form when it was fitted with segments; the ring's alpha when its points identify it, else
    doubling's per-round cost; the ring's beta. None when neither gives an alpha."""
    if "ring" not in fits:
        return None
    ring = fits["ring"] if fits["ring"].params.segment == 0 else fit(fits["ring"].points, "ring", op)
    if ring.alpha_identified:
        how = "the ring's" + (", fitted as max(alpha, c/beta)" if fits["ring"].params.segment else "")
        return ring.params.alpha, ring.params.beta, how
    if "doubling" in fits:
        return fits["doubling"].params.alpha, ring.params.beta, "doubling's"
    return None


def describe(f: Fit) -> str:
    p = f.params
    alpha = (f"alpha = {p.alpha * 1e6:.2f} us" if f.alpha_identified else
             f"alpha not identified (every point bandwidth-bound): alpha <= {f.alpha_bound * 1e6:.2f} us")
    seg = "" if f.algo != "ring" else (", segment inf (additive)" if math.isinf(p.segment) else
                                       f", segment {p.segment / 1024:g} KiB" if p.segment else ", max(alpha, c/beta)")
    t0 = f", t0 = {p.overhead * 1e6:.2f} us" if p.overhead else ""
    e = np.abs(f.rel_err)
    return (f"{f.algo}: {len(f.points)} points, {alpha}, beta = {p.beta / 1e9:.4f} GB/s{t0}{seg}; "
            f"|error| rms {100 * f.rms:.2f}%, max {100 * e.max():.2f}%")


def _mixed_networks(files: Sequence[str], tolerance: float = 0.10) -> str | None:
    """Why pooling ``files`` mixes networks (goodputs more than ``tolerance`` apart, or some files
    with a measured goodput and some without, e.g. a loopback run), or None."""
    per_file = {f: file_goodput(load_rows(f)[0]) for f in dict.fromkeys(files)}
    known = {f: g for f, g in per_file.items() if g is not None}
    if known and len(known) < len(per_file):
        bare = [f for f, g in per_file.items() if g is None]
        return f"{', '.join(bare)} has no measured goodput (loopback, or no --goodput) and the others do"
    if known and max(known.values()) > (1 + tolerance) * min(known.values()):
        return "the files were measured on networks of different goodput (" + ", ".join(
            f"{f}: {g / 1e9:.4f} GB/s" for f, g in known.items()) + ")"
    return None


def _cmd_fit(a) -> int:
    segment = a.segment_kb if a.segment_kb is not None else run_segment(a.files, a.backend)
    fits, goodputs, skipped = _fits_from(a.files, a.backend, a.op, segment, a.overhead, a.holdout,
                                threshold=parse_size(a.threshold) if a.threshold else None,
                                min_size=parse_size(a.min_size), max_size=parse_size(a.max_size) if a.max_size else None,
                                algo=a.algo)
    print(f"# mccl.model fit: {a.op}, backend {a.backend}, {', '.join(a.files)}")
    if goodputs:
        print(f"# goodput in the file(s): {', '.join(f'{g / 1e9:.4f}' for g in sorted(set(goodputs)))} GB/s")
    mixed = _mixed_networks(a.files)
    if mixed:
        print(f"# warning: {mixed}; one alpha and beta fitted to all of them describe none", file=sys.stderr)
    for line in [describe(f) for f in fits.values()] + skipped:
        print("# " + line)
    # libmccl's choices need the hop cost of latency-bound transfers and the link's goodput.
    if a.op == "all_reduce" and "ring" in fits:
        lib = libmccl_alpha(fits, a.op)
        if lib is None:
            print("# for libmccl: no setting: the ring's alpha is not identified by these points and there is "
                  "no doubling fit to take it from")
        else:
            alpha, beta, how = lib
            print(f"# for libmccl: alpha {alpha * 1e6:.2f} us ({how}) x beta {beta / 1e9:.4f} GB/s (the ring's): "
                  + alpha_beta_setting(alpha, beta))
    hold = any(f.holdout is not None for f in fits.values())
    print(f"{'algo':>8} {'size (B)':>11} {'hosts':>5} {'measured us':>12} {'model us':>12} {'error':>8}"
          + (f" {'held out':>9}" if hold else "") + "  file")
    for f in fits.values():
        for i, (q, m, e) in enumerate(zip(f.points, f.model_s, f.rel_err)):
            h = (f" {100 * f.holdout[i]:>+8.2f}%" if f.holdout is not None and math.isfinite(f.holdout[i])
                 else f" {'-':>9}" if hold else "")
            print(f"{f.algo:>8} {q.size:>11} {q.nranks:>5} {q.time_s * 1e6:>12.1f} {m * 1e6:>12.1f} {100 * e:>+7.2f}%{h}  {q.source}")
        if f.holdout is not None:
            h = np.abs(f.holdout[np.isfinite(f.holdout)])
            if h.size:
                print(f"# {f.algo}: held out by {a.holdout}: |error| rms {100 * np.sqrt(np.mean(h ** 2)):.2f}%, "
                      f"max {100 * h.max():.2f}% over {h.size} points")
            else:
                print(f"# {f.algo}: held out by {a.holdout}: no point could be predicted (too few left)")
    return 0


def _cmd_predict(a) -> int:
    if a.groups is not None and a.groups < 1:
        raise ModelError(f"--groups must be >= 1 (got {a.groups})")
    if a.group_size is not None and a.group_size < 1:
        raise ModelError(f"--group-size must be >= 1 (got {a.group_size})")
    unit = 1 << 20 if a.mib else 1e6
    sizes = [v * unit for v in a.bucket_mb]
    if a.fit:
        segment = a.segment_kb if a.segment_kb is not None else run_segment(a.fit, a.backend)
        fits, goodputs, skipped = _fits_from(a.fit, a.backend, segment=segment)
        if "ring" not in fits:
            raise ModelError(f"{', '.join(a.fit)}: no ring rows to fit (sizes >= 256 KiB)")
        ring = fits["ring"].params
        dbl = fits["doubling"].params if "doubling" in fits else None
        notes = [describe(f) for f in fits.values()] + skipped
        if not fits["ring"].alpha_identified:
            if dbl is None:
                raise ModelError("the ring's alpha is not identified by these points and there is no doubling fit to "
                                 "take it from")
            ring = replace(ring, alpha=dbl.alpha)
            notes.append(f"the ring uses the doubling fit's alpha, {dbl.alpha * 1e6:.2f} us")
        goodput = a.goodput_gbs * 1e9 if a.goodput_gbs else (goodputs[0] if goodputs else ring.beta)
        if dbl is not None and dbl.beta > goodput * 1.01:
            notes.append(f"doubling's beta ({dbl.beta / 1e9:.3f} GB/s) exceeds the goodput: its small sizes beat the "
                         "link (on the emulated cluster, tbf's burst), so its large-size rows are optimistic")
        source = f"fitted to {', '.join(a.fit)}"
    else:
        alpha = (a.alpha_us if a.alpha_us is not None else PAPER_ALPHA_S * 1e6) * 1e-6
        beta = a.goodput_gbs * 1e9 if a.goodput_gbs else PAPER_BETA_BPS
        ring = Params(alpha, beta, a.segment_kb or 0.0)
        dbl, goodput, notes = None, beta, []
        source = "the paper's parameters" if (alpha, beta) == (PAPER_ALPHA_S, PAPER_BETA_BPS) else "given parameters"
    inter = None if a.inter_alpha_us is None else replace(ring, alpha=a.inter_alpha_us * 1e-6)
    layout = dict(groups=a.groups, group_size=a.group_size if a.groups is None else None, inter=inter,
                  uplink=None if a.uplink_gbs is None else a.uplink_gbs * 1e9)
    rows = predict(a.hosts, sizes, ring, dbl, **layout)
    print(f"# mccl.model predict: all-reduce, {source}: alpha = {ring.alpha * 1e6:.2f} us, "
          f"beta = {ring.beta / 1e9:.4f} GB/s"
          + (f", segment {ring.segment / 1024:g} KiB" if ring.segment and math.isfinite(ring.segment)
             else ", additive steps" if math.isinf(ring.segment) else ", step = max(alpha, c/beta)")
          + (f"; doubling alpha = {dbl.alpha * 1e6:.2f} us, beta = {dbl.beta / 1e9:.4f} GB/s" if dbl else ""))
    for line in notes:
        print(f"# fit: {line}")
    lib = libmccl_alpha(fits) if a.fit else (ring.alpha, ring.beta, "")
    if lib is not None:
        print(f"# for libmccl: {alpha_beta_setting(lib[0], lib[1])} (alpha x beta, bytes"
              + ("; as `fit` prints it for these files" if a.fit else "") + ")")
    if a.uplink_gbs is not None or a.inter_alpha_us is not None:
        print(f"# inter-group: alpha = {(inter or ring).alpha * 1e6:.2f} us"
              + (f", uplink {a.uplink_gbs:g} GB/s per group shared by its rings" if a.uplink_gbs is not None else ""))
    print(f"# busbw = 2(n-1)/n S/t in GB/s (1e9 B/s); %gp = busbw / goodput ({goodput / 1e9:.4f} GB/s); "
          f"groups: the two-level ring's layout")
    print("# halving-doubling is priced as on one switch: libmccl takes it only within one topology group "
          "(its first partners are n/2 hosts away)")
    for S in sizes:
        nstar = crossover_hosts(S, ring)
        if math.isinf(ring.segment):
            print(f"# {format_size(S)} ({S:.0f} B): additive steps are never purely bandwidth-bound; alpha and "
                  f"c/beta are equal at n = S/(alpha*beta) = {nstar:.1f} hosts")
            continue
        print(f"# {format_size(S)} ({S:.0f} B): flat ring crossover n* = "
              + (f"S/c*, c* = {crossover_chunk(ring):.0f} B" if ring.segment
                 else "S/(alpha*beta)") + f" = {nstar:.1f} hosts"
              + (f": bandwidth-bound up to {math.ceil(nstar) - 1} hosts" if math.isfinite(nstar) else ""))
    print(format_table(rows, goodput))
    if a.plot:
        if os.path.splitext(a.plot)[1].lower() not in (".png", ".pdf", ".svg"):
            raise ModelError(f"--plot {a.plot}: give a .png, .pdf or .svg file")
        plot(rows, goodput, a.plot, f"mccl.model: {source}, alpha {ring.alpha * 1e6:.1f} us, "
             f"beta {ring.beta / 1e9:.3f} GB/s", ring, dbl, **layout)
        print(f"# wrote {a.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _build_parser()
    a = ap.parse_args(argv)
    try:
        return _cmd_fit(a) if a.cmd == "fit" else _cmd_predict(a)
    except ModelError as exc:
        ap.exit(2, f"{ap.prog} {a.cmd}: error: {exc}\n")
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
