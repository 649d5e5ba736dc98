/*
 * doubling.c: latency-bound algorithms for small messages: recursive-doubling all-reduce
 * (Thakur, Rabenseifner & Gropp, 2005) and, for medium ones, recursive halving-doubling
 * (Rabenseifner), Bruck's all-gather, the small broadcasts, and the
 * dissemination barrier. Each takes about log2 n rounds, against n-1 or 2(n-1) for the ring.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/select.h"
#include "core/debug.h"
#include "reduce/reduce.h"

/* Rank of virtual rank v after folding: the first `rem` virtual ranks are the odd ranks of the
 * folded pairs (0,1), (2,3), ...; the rest are the unpaired ranks 2*rem, 2*rem+1, ... */
static int unfold(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/* The fold into the largest power of two p <= n (rem = n - p), shared by recursive doubling and
 * halving-doubling: ranks below 2*rem pair up. The even rank hands its input to r+1 (step 0), then
 * receives the finished result into the output (step last_step; it comes only from a partner that
 * finished every round, so it may land in place) and sits out (*sat_out = 1). The odd rank reduces
 * the input it received into `acc`, (lower rank's) op (higher's), which becomes *mine. *vr: this
 * rank's virtual rank among the p that go on. */
static mcclResult_t foldIn(mcclAlgoCtx* ctx, const mcclOp* op, int rem, char* acc, char* tmp, uint32_t last_step,
                           const char** mine, int* vr, int* sat_out) {
  const int r = ctx->rank;
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  *sat_out = 0;
  if (r >= 2 * rem) {
    *vr = r - rem;
    return mcclSuccess;
  }
  if (r % 2 == 0) {
    mcclPeerIo fold = {r + 1, 1, (char*)op->sendbuf, bytes, 0, 0};
    MCCLCHECK(mcclAlgoExchange(ctx, op, &fold, 1));
    mcclPeerIo back = {r + 1, 0, op->recvbuf, bytes, 0, last_step};
    *sat_out = 1;
    return mcclAlgoExchange(ctx, op, &back, 1);
  }
  mcclPeerIo in = {r - 1, 0, tmp, bytes, 0, 0};
  MCCLCHECK(mcclAlgoExchange(ctx, op, &in, 1));
  mcclReduceKernel(acc, tmp, *mine, op->count, op->dtype, op->op, 1);
  *mine = acc;
  *vr = r / 2;
  return mcclSuccess;
}

/* Recursive doubling. With p the largest power of two <= n and rem = n - p, ranks below 2*rem
 * first fold in pairs: the even rank sends its buffer to the odd one and sits out. The p remaining
 * ranks then run log2(p) rounds; in round k a rank swaps its whole partial result with the partner
 * whose virtual rank differs in bit k and both compute (lower's) op (higher's), so they hold the
 * same bits. AVG divides by n in the last round. Finally each odd rank returns the result to its
 * even partner. Bytes per rank: size x (log2 p + 2) at most.
 *
 * Partial results live in `acc` (which may be op->recvbuf only when that is scratch) and reach
 * op->recvbuf after the last round: a rank finishes its rounds only if every partner's frame
 * matched and each partner sent it only after its own earlier rounds matched, so by then every
 * rank has issued the same collective (algo.h, "Outputs are written only once..."). */
static mcclResult_t doublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op, char* acc) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz;
  char* out = op->recvbuf;
  if (n == 1 || bytes == 0) {
    if (op->sendbuf != out) memcpy(out, op->sendbuf, bytes);
    return mcclSuccess;
  }
  char* tmp = mcclAlgoScratch(ctx, bytes);
  if (tmp == NULL) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for a %zu-byte operand", bytes);
    return mcclSystemError;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  int rounds = 0;
  while ((1 << rounds) < p) rounds++;
  const uint32_t last_step = (uint32_t)rounds + 1;

  int vr, sat_out;
  const char* mine = op->sendbuf; /* this rank's current partial result: its input until round 0 */
  MCCLCHECK(foldIn(ctx, op, rem, acc, tmp, last_step, &mine, &vr, &sat_out));
  if (sat_out) return mcclSuccess;
  for (int k = 0; k < rounds; k++) {
    const int pv = vr ^ (1 << k), peer = unfold(pv, rem);
    mcclPeerIo io[2] = {{peer, 1, (char*)mine, bytes, 0, (uint32_t)k + 1},
                        {peer, 0, tmp, bytes, 0, (uint32_t)k + 1}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
    const uint32_t div = k == rounds - 1 ? (uint32_t)n : 1;
    if (pv < vr) mcclReduceKernel(acc, tmp, mine, op->count, op->dtype, op->op, div);
    else mcclReduceKernel(acc, mine, tmp, op->count, op->dtype, op->op, div);
    mine = acc;
  }
  if (acc != out) memcpy(out, acc, bytes);
  if (r < 2 * rem) { /* odd rank of a folded pair: return the result */
    mcclPeerIo back = {r - 1, 1, out, bytes, 0, last_step};
    MCCLCHECK(mcclAlgoExchange(ctx, op, &back, 1));
  }
  return mcclSuccess;
}

mcclResult_t mcclDoublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  char* acc = mcclAlgoWork(ctx, bytes);
  if (acc == NULL && bytes > 0) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for a %zu-byte partial result", bytes);
    return mcclSystemError;
  }
  return doublingAllReduce(ctx, op, acc);
}

/* The same over a whole buffer that is already scratch (op->recvbuf == ctx->work), for the small
 * reduce-scatter (rooted.c). */
mcclResult_t mcclDoublingAllReduceInScratch(mcclAlgoCtx* ctx, const mcclOp* op) {
  return doublingAllReduce(ctx, op, op->recvbuf);
}

/* Element offset of block b when `count` elements are cut into p blocks whose sizes differ by at
 * most one (the first count % p blocks have the extra element). */
static size_t blockOff(size_t count, int p, int b) {
  const size_t q = count / (size_t)p, extra = count % (size_t)p;
  return (size_t)b * q + ((size_t)b < extra ? (size_t)b : extra);
}

/* Recursive halving, then recursive doubling (Rabenseifner 2004; Thakur, Rabenseifner & Gropp
 * 2005, section 4.4): the buffer is cut into p blocks (p the largest power of two <= n; the
 * first 2*rem ranks fold in pairs first, as above). Reduce-scatter by halving: in round k
 * (k = 0 .. log2 p - 1, distance d = p / 2^(k+1)) a rank whose virtual rank has bit d clear
 * keeps the lower half of its current range of blocks and sends the upper half to vr ^ d, which
 * keeps the upper half; each reduces the half it received into the half it keeps, (lower rank's)
 * op (higher rank's). After log2 p rounds virtual rank v holds block v reduced over every rank
 * (AVG divides in the last round). All-gather by doubling: in round k (distance 2^k) partners
 * swap the ranges they hold, which double. Bytes per rank: 2 (p-1)/p S (the ring's 2 (n-1)/n S
 * when n is a power of two) in 2 log2 p rounds (the ring: 2 (n-1) steps), plus 2 S for folded
 * ranks: the algorithm for sizes where the ring's steps are latency-bound and doubling's log2 p
 * whole-buffer swaps cost more than its extra rounds (select.c).
 *
 * Every block's final value is computed on one rank only and then copied, so every rank's bytes
 * are equal. Partial results live in the work buffer (`acc`, mcclAlgoWork); the output is first
 * written after the halving rounds, whose hypercube pattern has by then carried every rank's
 * checked header to this rank through a chain of ranks that each checked the previous one before
 * sending on (algo.h, "Outputs are written only once..."): the doubling rounds write straight
 * into the output.
 * Frames: fold step 0, halving rounds 1 .. L, doubling rounds L+1 .. 2L, the folded result 2L+1. */
mcclResult_t mcclHalvingDoublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz, count = op->count;
  char* out = op->recvbuf;
  if (n == 1 || bytes == 0) {
    if (op->sendbuf != out) memcpy(out, op->sendbuf, bytes);
    return mcclSuccess;
  }
  char* acc = mcclAlgoWork(ctx, bytes);
  char* tmp = acc == NULL ? NULL : mcclAlgoScratch(ctx, bytes);
  if (tmp == NULL) return mcclAlgoOutOfMemory(ctx, 2 * bytes);
  int p = 1, rounds = 0;
  while (p * 2 <= n) {
    p *= 2;
    rounds++;
  }
  const int rem = n - p;
  const uint32_t last_step = 2 * (uint32_t)rounds + 1;

  int vr, sat_out;
  const char* mine = op->sendbuf; /* this rank's partial results: its input until the first reduction */
  MCCLCHECK(foldIn(ctx, op, rem, acc, tmp, last_step, &mine, &vr, &sat_out));
  if (sat_out) return mcclSuccess;

  /* Reduce-scatter by recursive halving: [lo, hi) is the range of blocks this rank still holds. */
  int lo = 0, hi = p;
  for (int k = 0, d = p / 2; d >= 1; k++, d /= 2) {
    const int pv = vr ^ d, peer = unfold(pv, rem), mid = lo + (hi - lo) / 2;
    const int keep_lo = (vr & d) ? mid : lo, keep_hi = (vr & d) ? hi : mid;
    const int give_lo = (vr & d) ? lo : mid, give_hi = (vr & d) ? mid : hi;
    const size_t keep = blockOff(count, p, keep_lo), keep_n = blockOff(count, p, keep_hi) - keep;
    const size_t give = blockOff(count, p, give_lo), give_n = blockOff(count, p, give_hi) - give;
    mcclPeerIo io[2] = {{peer, 1, (char*)mine + give * esz, give_n * esz, give * esz, (uint32_t)k + 1},
                        {peer, 0, tmp, keep_n * esz, keep * esz, (uint32_t)k + 1}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
    const uint32_t div = d == 1 ? (uint32_t)n : 1;
    char* dst = acc + keep * esz;
    if (pv < vr) mcclReduceKernel(dst, tmp, mine + keep * esz, keep_n, op->dtype, op->op, div);
    else mcclReduceKernel(dst, mine + keep * esz, tmp, keep_n, op->dtype, op->op, div);
    mine = acc;
    lo = keep_lo;
    hi = keep_hi;
  }

  /* All-gather by recursive doubling, in the output: this rank holds block vr (lo == vr). */
  const size_t own = blockOff(count, p, lo), own_n = blockOff(count, p, hi) - own;
  if (own_n > 0) memcpy(out + own * esz, acc + own * esz, own_n * esz);
  for (int k = 0, d = 1; d < p; k++, d *= 2) {
    const int pv = vr ^ d, peer = unfold(pv, rem);
    const int their_lo = (vr & d) ? lo - d : hi, their_hi = their_lo + d;
    const size_t mine_at = blockOff(count, p, lo), mine_n = blockOff(count, p, hi) - mine_at;
    const size_t at = blockOff(count, p, their_lo), at_n = blockOff(count, p, their_hi) - at;
    const uint32_t step = (uint32_t)rounds + 1 + (uint32_t)k;
    mcclPeerIo io[2] = {{peer, 1, out + mine_at * esz, mine_n * esz, mine_at * esz, step},
                        {peer, 0, out + at * esz, at_n * esz, at * esz, step}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
    if (their_lo < lo) lo = their_lo;
    else hi = their_hi;
  }
  if (r < 2 * rem) { /* odd rank of a folded pair: return the result */
    mcclPeerIo back = {r - 1, 1, out, bytes, 0, last_step};
    MCCLCHECK(mcclAlgoExchange(ctx, op, &back, 1));
  }
  return mcclSuccess;
}

/* Bruck's all-gather (Bruck et al., 1997) over n blocks that tile a `total`-byte buffer in rank
 * order: block i is bytes [off[i], off[i] + len[i]); blocks may differ in size, and may be empty.
 * ceil(log2 n) rounds for any n. Blocks are kept rotated in `work`: the buffer rotated left by
 * off[r], so position j holds block (r + j) mod n and any run of positions is contiguous. In round
 * k rank r sends positions [0, c) to r - 2^k and receives positions [2^k, 2^k + c) from r + 2^k,
 * c = min(2^k, n - 2^k). This rank's block is copied from `own` first (own == NULL: it is in
 * work already). After the last round the buffer is rotated back into `out` (NULL: not at all):
 * every rank's header has reached this one through a chain of ranks that each checked the previous
 * one's frame before sending on (the dissemination argument), so writing `out` is safe then.
 * Frames of round k carry step first_step + k. */
static size_t rotated(const size_t* len, int r, int n, int j) {
  size_t at = 0;
  for (int i = 0; i < j; i++) at += len[(r + i) % n];
  return at;
}

static mcclResult_t bruckRun(mcclAlgoCtx* ctx, const mcclOp* op, const size_t* off, const size_t* len,
                             size_t total, const char* own, char* work, char* out, uint32_t first_step) {
  const int n = ctx->nranks, r = ctx->rank;
  if (own != NULL) memcpy(work, own, len[r]);
  for (int dist = 1, k = 0; dist < n; dist <<= 1, k++) {
    const int cnt = dist < n - dist ? dist : n - dist;
    const size_t at = rotated(len, r, n, dist);
    const uint32_t step = first_step + (uint32_t)k;
    mcclPeerIo io[2] = {{(r - dist + n) % n, 1, work, rotated(len, r, n, cnt), 0, step},
                        {(r + dist) % n, 0, work + at, rotated(len, r, n, dist + cnt) - at, 0, step}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
  }
  if (out != NULL) {
    memcpy(out + off[r], work, total - off[r]);
    memcpy(out, work + (total - off[r]), off[r]);
  }
  return mcclSuccess;
}

mcclResult_t mcclBruckAllGather(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const size_t blk = op->count * mcclDataTypeSize(op->dtype), total = blk * (size_t)n;
  char* work = mcclAlgoWork(ctx, total);
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  if (work == NULL || geo == NULL) {
    free(geo);
    return mcclAlgoOutOfMemory(ctx, total);
  }
  for (int i = 0; i < n; i++) {
    geo[i] = (size_t)i * blk;
    geo[n + i] = blk;
  }
  mcclResult_t res = bruckRun(ctx, op, geo, geo + n, total, op->sendbuf, work, op->recvbuf, 0);
  free(geo);
  return res;
}

/* Broadcasts below the chain's threshold write the buffer only once every rank is known to have
 * issued the same broadcast. Two algorithms, chosen by the alpha-beta model (Hockney) with
 * alpha x beta = MCCL_ALPHA_BETA (ctx->alpha_beta, algo.h):
 *  - the binomial tree (below): L (alpha + S/beta), L = ceil(log2 n);
 *  - scatter then Bruck's all-gather (the scatter-allgather broadcast of Barnett, Payne, van de
 *    Geijn & Watts, 1994): root sends rank i its 1/n of the buffer (root's link carries (n-1)/n
 *    of it), then the all-gather moves (n-1)/n more: (L + 1) alpha + 2 (n-1)/n S/beta.
 * The second wins when (L - 2(n-1)/n) S > alpha x beta. */
/* Binomial tree rooted at `root`: in virtual ranks v = (r - root) mod n, rank v receives from
 * v - 2^k where 2^k is v's lowest set bit, then sends to v + 2^j for every j < k (all at once).
 * A leaf hears only from its parent, so the tree runs into scratch with announcements alongside
 * (algo.h): the buffer is written once every rank's announcement matched. */
static mcclResult_t treeBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const int v = ((ctx->rank - op->root) % n + n) % n;
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  char* buf = v == 0 ? op->recvbuf : mcclAlgoScratch(ctx, bytes);
  if (buf == NULL) return mcclAlgoOutOfMemory(ctx, bytes);
  mcclAnnouncement ann;
  MCCLCHECK(mcclAnnounceStart(ctx, op, &ann, 1));
  mcclResult_t res = mcclSuccess;
  int mask = 1, k = 0;
  while (mask < n) {
    if (v & mask) {
      mcclPeerIo in = {(v - mask + op->root) % n, 0, buf, bytes, 0, (uint32_t)k};
      res = mcclAlgoExchange(ctx, op, &in, 1);
      break;
    }
    mask <<= 1;
    k++;
  }
  mcclPeerIo outs[32];
  int nout = 0;
  for (mask >>= 1, k--; res == mcclSuccess && mask > 0; mask >>= 1, k--) {
    if (v + mask < n) {
      mcclPeerIo o = {(v + mask + op->root) % n, 1, buf, bytes, 0, (uint32_t)k};
      outs[nout++] = o;
    }
  }
  if (res == mcclSuccess && nout) res = mcclAlgoExchange(ctx, op, outs, nout);
  if (res == mcclSuccess) res = mcclAnnounceWait(ctx, op, &ann);
  if (res == mcclSuccess && v != 0) memcpy(op->recvbuf, buf, bytes);
  mcclAnnounceEnd(&ann);
  return res;
}

static mcclResult_t scatterBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank, root = op->root;
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz;
  char* buf = op->recvbuf;
  char* work = mcclAlgoWork(ctx, bytes);
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  mcclPeerIo* ios = malloc(sizeof(mcclPeerIo) * (size_t)n);
  mcclResult_t res = mcclSuccess;
  if (work == NULL || geo == NULL || ios == NULL) {
    res = mcclAlgoOutOfMemory(ctx, bytes);
    goto done;
  }
  size_t* off = geo;
  size_t* len = geo + n;
  for (int i = 0; i < n; i++) {
    len[i] = (op->count / (size_t)n + ((size_t)i < op->count % (size_t)n ? 1 : 0)) * esz;
    off[i] = i == 0 ? 0 : off[i - 1] + len[i - 1];
  }
  /* Into work: a non-root's own block is position 0 of its rotated buffer. */
  int nio = 0;
  if (r == root) {
    for (int i = 0; i < n; i++)
      if (i != r) ios[nio++] = (mcclPeerIo){i, 1, buf + off[i], len[i], 0, 0};
  } else {
    ios[nio++] = (mcclPeerIo){root, 0, work, len[r], 0, 0};
  }
  res = mcclAlgoExchange(ctx, op, ios, nio);
  /* Root's buffer is its input and is never written. */
  if (res == mcclSuccess)
    res = bruckRun(ctx, op, off, len, bytes, r == root ? buf + off[r] : NULL, work, r == root ? NULL : buf, 1);
done:
  free(geo);
  free(ios);
  return res;
}

mcclResult_t mcclAlgoBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  if (n == 1 || bytes == 0) return mcclSuccess;
  switch (mcclAlgoSelect(ctx, op).kind) { /* select.c says when each pays */
    case MCCL_PLAN_CHAIN: return mcclRingBroadcast(ctx, op);
    case MCCL_PLAN_SCATTER_ALLGATHER: return scatterBroadcast(ctx, op);
    default: return treeBroadcast(ctx, op);
  }
}

/* Dissemination barrier (Hensgen, Finkel & Manber): in round k every rank sends an empty frame
 * to r + 2^k and waits for one from r - 2^k; after ceil(log2 n) rounds every rank has heard,
 * directly or transitively, from every other. */
mcclResult_t mcclAlgoBarrier(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  for (int dist = 1, k = 0; dist < n; dist <<= 1, k++) {
    mcclPeerIo io[2] = {{(r + dist) % n, 1, NULL, 0, 0, (uint32_t)k},
                        {(r - dist + n) % n, 0, NULL, 0, 0, (uint32_t)k}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
  }
  return mcclSuccess;
}
