/*
 * doubling.c: latency-bound algorithms for small messages: recursive-doubling all-reduce
 * (Thakur, Rabenseifner & Gropp, 2005), the binomial-tree broadcast and the dissemination barrier.
 * Each takes ceil(log2 n) rounds, against 2(n-1) for the ring.
 */
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
#include "core/debug.h"
#include "reduce/reduce.h"

/* Rank of virtual rank v after folding: the first `rem` virtual ranks are the odd ranks of the
 * folded pairs (0,1), (2,3), ...; the rest are the unpaired ranks 2*rem, 2*rem+1, ... */
static int unfold(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/* Recursive doubling. With p the largest power of two <= n and rem = n - p, ranks below 2*rem
 * first fold in pairs: the even rank sends its buffer to the odd one and sits out. The p remaining
 * ranks then run log2(p) rounds; in round k a rank swaps its whole buffer with the partner whose
 * virtual rank differs in bit k and both compute (lower's) op (higher's), so they hold the same
 * bits. AVG divides by n in the last round. Finally each odd rank returns the result to its even
 * partner. Bytes per rank: size x (log2 p + 2) at most. */
mcclResult_t mcclDoublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz;
  char* buf = op->recvbuf;
  if (op->sendbuf != op->recvbuf) memcpy(buf, op->sendbuf, bytes);
  if (n == 1 || bytes == 0) return mcclSuccess;
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

  int vr;
  if (r < 2 * rem) {
    if (r % 2 == 0) { /* fold: hand the buffer to r+1, get the result back at the end */
      mcclPeerIo out = {r + 1, 1, buf, bytes, 0, 0};
      MCCLCHECK(mcclAlgoExchange(ctx, op, &out, 1));
      mcclPeerIo back = {r + 1, 0, buf, bytes, 0, last_step};
      return mcclAlgoExchange(ctx, op, &back, 1);
    }
    mcclPeerIo in = {r - 1, 0, tmp, bytes, 0, 0};
    MCCLCHECK(mcclAlgoExchange(ctx, op, &in, 1));
    mcclReduceKernel(buf, tmp, buf, op->count, op->dtype, op->op, 1);
    vr = r / 2;
  } else {
    vr = r - rem;
  }
  for (int k = 0; k < rounds; k++) {
    const int pv = vr ^ (1 << k), peer = unfold(pv, rem);
    mcclPeerIo io[2] = {{peer, 1, buf, bytes, 0, (uint32_t)k + 1},
                        {peer, 0, tmp, bytes, 0, (uint32_t)k + 1}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
    const uint32_t div = k == rounds - 1 ? (uint32_t)n : 1;
    if (pv < vr) mcclReduceKernel(buf, tmp, buf, op->count, op->dtype, op->op, div);
    else mcclReduceKernel(buf, buf, tmp, op->count, op->dtype, op->op, div);
  }
  if (r < 2 * rem) { /* odd rank of a folded pair: return the result */
    mcclPeerIo back = {r - 1, 1, buf, bytes, 0, last_step};
    MCCLCHECK(mcclAlgoExchange(ctx, op, &back, 1));
  }
  return mcclSuccess;
}

/* Binomial tree rooted at `root`: in virtual ranks v = (r - root) mod n, rank v receives from
 * v - 2^k where 2^k is v's lowest set bit, then sends to v + 2^j for every j < k (all at once). */
static mcclResult_t treeBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const int v = ((ctx->rank - op->root) % n + n) % n;
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  char* buf = op->recvbuf;
  int mask = 1, k = 0;
  while (mask < n) {
    if (v & mask) {
      mcclPeerIo in = {(v - mask + op->root) % n, 0, buf, bytes, 0, (uint32_t)k};
      MCCLCHECK(mcclAlgoExchange(ctx, op, &in, 1));
      break;
    }
    mask <<= 1;
    k++;
  }
  mcclPeerIo outs[32];
  int nout = 0;
  for (mask >>= 1, k--; mask > 0; mask >>= 1, k--) {
    if (v + mask < n) {
      mcclPeerIo o = {(v + mask + op->root) % n, 1, buf, bytes, 0, (uint32_t)k};
      outs[nout++] = o;
    }
  }
  return nout ? mcclAlgoExchange(ctx, op, outs, nout) : mcclSuccess;
}

mcclResult_t mcclAlgoBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  if (ctx->nranks == 1 || bytes == 0) return mcclSuccess;
  int chain = op->algorithm == mcclAlgoRing ||
              (op->algorithm == mcclAlgoAuto && bytes >= ctx->ring_threshold && ctx->nranks > 2);
  if (chain) return mcclRingBroadcast(ctx, op);
  return treeBroadcast(ctx, op);
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

/* Bruck's all-gather (Bruck et al., 1997) for small blocks: ceil(log2 n) rounds for any n. Blocks
 * are kept rotated in `work`, where position j holds rank (r + j) mod n's block. In round k rank r
 * sends its first min(2^k, n - 2^k) blocks to r - 2^k and receives as many from r + 2^k into
 * position 2^k; at the end the blocks are rotated into place. */
mcclResult_t mcclBruckAllGather(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t blk = op->count * mcclDataTypeSize(op->dtype);
  char* work = mcclAlgoWork(ctx, blk * (size_t)n);
  if (work == NULL) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for %zu bytes", blk * (size_t)n);
    return mcclSystemError;
  }
  memcpy(work, (const char*)op->recvbuf + (size_t)r * blk, blk);
  for (int dist = 1, k = 0; dist < n; dist <<= 1, k++) {
    size_t cnt = (size_t)(dist < n - dist ? dist : n - dist);
    mcclPeerIo io[2] = {{(r - dist + n) % n, 1, work, cnt * blk, 0, (uint32_t)k},
                        {(r + dist) % n, 0, work + (size_t)dist * blk, cnt * blk, 0, (uint32_t)k}};
    MCCLCHECK(mcclAlgoExchange(ctx, op, io, 2));
  }
  for (int j = 0; j < n; j++) memcpy((char*)op->recvbuf + (size_t)((r + j) % n) * blk, work + (size_t)j * blk, blk);
  return mcclSuccess;
}
