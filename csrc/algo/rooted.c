/*
 * rooted.c: reduce, reduce-scatter, gather, scatter and all-to-all: the collectives that are
 * either rooted at one rank or built from the ring and doubling pieces elsewhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/select.h"
#include "core/debug.h"
#include "reduce/reduce.h"

static int useRing(mcclAlgoCtx* ctx, const mcclOp* op) { return mcclAlgoSelect(ctx, op).kind == MCCL_PLAN_RING; }

/* Binomial-tree reduce toward root, the broadcast tree run backwards: in virtual ranks
 * v = (r - root) mod n, rank v first combines the partial results of its children v + 2^j
 * (j from 0 up, as they arrive in that order), always as (mine) op (child's): the child covers
 * higher virtual ranks. Then it sends its partial result to its parent.
 * The agreement runs alongside (algo.h), posted before the data: ranks that disagree on the
 * root would otherwise each wait for a child that sends elsewhere, and none would see a frame
 * to compare until the timeout; its frames reach every rank whatever the root, so the mismatch
 * is found at once. Root writes its output, and every rank returns, only once it is done. */
static mcclResult_t treeReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const int v = ((ctx->rank - op->root) % n + n) % n;
  const size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  char* acc = mcclAlgoWork(ctx, bytes);
  char* tmp = acc ? mcclAlgoScratch(ctx, bytes) : NULL;
  if (tmp == NULL) return mcclAlgoOutOfMemory(ctx, bytes * 2);
  mcclAnnouncement ann;
  MCCLCHECK(mcclAnnounceStart(ctx, op, &ann, 1));
  mcclResult_t res = mcclSuccess;
  memcpy(acc, op->sendbuf, bytes);
  int sent = 0;
  for (int mask = 1, k = 0; res == mcclSuccess && !sent && mask < n; mask <<= 1, k++) {
    if (v & mask) {
      mcclPeerIo up = {(v - mask + op->root) % n, 1, acc, bytes, 0, (uint32_t)k};
      res = mcclAlgoExchange(ctx, op, &up, 1);
      sent = 1;
    } else if (v + mask < n) {
      mcclPeerIo in = {(v + mask + op->root) % n, 0, tmp, bytes, 0, (uint32_t)k};
      res = mcclAlgoExchange(ctx, op, &in, 1);
      int last = (v == 0) && (mask << 1) >= n;
      if (res == mcclSuccess) mcclReduceKernel(acc, acc, tmp, op->count, op->dtype, op->op, last ? (uint32_t)n : 1);
    }
  }
  if (res == mcclSuccess) res = mcclAnnounceWait(ctx, op, &ann);
  /* Only root did not send. AVG with n == 1 needs no division. */
  if (res == mcclSuccess && v == 0) memcpy(op->recvbuf, acc, bytes);
  mcclAnnounceEnd(&ann);
  return res;
}

mcclResult_t mcclAlgoReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz;
  if (bytes == 0) return mcclSuccess;
  if (ctx->nranks == 1) {
    if (op->recvbuf != op->sendbuf) memcpy(op->recvbuf, op->sendbuf, bytes);
    return mcclSuccess;
  }
  if (!useRing(ctx, op)) return treeReduce(ctx, op); /* its agreement runs alongside */
  char* work = mcclAlgoWork(ctx, bytes);
  if (work == NULL) return mcclAlgoOutOfMemory(ctx, bytes);
  mcclResult_t res = mcclRingReduce(ctx, op, work);
  /* Root heard from every rank; the others only sent, and without an agreement a rank could return
   * success from a collective that root then finds mismatched. */
  return res == mcclSuccess ? mcclAgree(ctx, op) : res;
}

/* Small reduce-scatters run recursive doubling over a copy of the whole input, then keep their
 * own block: log2(n) rounds instead of n-1. */
mcclResult_t mcclAlgoReduceScatter(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks;
  const size_t esz = mcclDataTypeSize(op->dtype), blk = op->count * esz, total = blk * (size_t)n;
  if (blk == 0) return mcclSuccess;
  const char* mine = (const char*)op->sendbuf + (size_t)ctx->rank * blk;
  if (n == 1) {
    if (op->recvbuf != mine) memmove(op->recvbuf, mine, blk);
    return mcclSuccess;
  }
  char* work = mcclAlgoWork(ctx, total);
  if (work == NULL) return mcclAlgoOutOfMemory(ctx, total);
  if (useRing(ctx, op)) return mcclRingReduceScatter(ctx, op, work);
  mcclOp whole = *op;
  whole.recvbuf = work;
  whole.count = op->count * (size_t)n;
  MCCLCHECK(mcclDoublingAllReduceInScratch(ctx, &whole));
  memcpy(op->recvbuf, work + (size_t)ctx->rank * blk, blk);
  return mcclSuccess;
}

/* Gather and scatter are linear and mirror images: every block crosses root's link exactly once,
 * which is the bound for any algorithm, and root posts all n-1 transfers at once. `blocks` is
 * root's array of n blocks, `own` each rank's single block; gather moves own -> blocks.
 * Outputs are written once the collective matches everywhere (algo.h): gather's root hears from
 * every rank directly, so announcements suffice for its writes; a scatter's receiver hears only
 * from root, so it receives into scratch and writes once the agreement is done. The agreement
 * runs alongside the data, posted before it (algo.h), and every rank returns only once it is
 * done, so that a rank that only sent cannot succeed where root finds a mismatch. Alongside, not
 * after: ranks that disagree on the root may all wait to receive (each its own root) or send
 * where nobody listens; the agreement's frames reach every rank whatever the root, so the
 * mismatch is found at once instead of at the timeout. */
static mcclResult_t linearRooted(mcclAlgoCtx* ctx, const mcclOp* op, int gather) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t blk = op->count * mcclDataTypeSize(op->dtype);
  char* blocks = gather ? op->recvbuf : (char*)op->sendbuf;
  char* own = gather ? (char*)op->sendbuf : op->recvbuf;
  char* mine = blocks + (size_t)r * blk;
  if (n == 1 || blk == 0) {
    if (r == op->root && mine != own) memmove(gather ? mine : own, gather ? own : mine, blk);
    return mcclSuccess;
  }
  char* tmp = NULL;
  mcclPeerIo* ios = NULL;
  if (r != op->root && !gather && (tmp = mcclAlgoScratch(ctx, blk)) == NULL) return mcclAlgoOutOfMemory(ctx, blk);
  if (r == op->root && (ios = malloc(sizeof(mcclPeerIo) * (size_t)n)) == NULL)
    return mcclAlgoOutOfMemory(ctx, sizeof(mcclPeerIo) * (size_t)n);
  mcclAnnouncement ann;
  mcclResult_t res = mcclAnnounceStart(ctx, op, &ann, 1);
  if (res != mcclSuccess) {
    free(ios);
    return res;
  }
  if (r != op->root) {
    mcclPeerIo io = {op->root, gather, gather ? own : tmp, blk, 0, 0};
    res = gather ? mcclAlgoExchangeAnnounced(ctx, op, &io, 1, 0, 0) : mcclAlgoExchange(ctx, op, &io, 1);
  } else {
    int nio = 0;
    for (int p = 0; p < n; p++)
      if (p != r) ios[nio++] = (mcclPeerIo){p, !gather, blocks + (size_t)p * blk, blk, 0, 0};
    res = gather ? mcclAlgoExchangeAnnounced(ctx, op, ios, nio, 0, 0) : mcclAlgoExchange(ctx, op, ios, nio);
  }
  if (res == mcclSuccess) res = mcclAnnounceWait(ctx, op, &ann);
  if (res == mcclSuccess && r != op->root && !gather) memcpy(own, tmp, blk);
  if (res == mcclSuccess && r == op->root && mine != own) memmove(gather ? mine : own, gather ? own : mine, blk);
  mcclAnnounceEnd(&ann);
  free(ios);
  return res;
}

mcclResult_t mcclAlgoGather(mcclAlgoCtx* ctx, const mcclOp* op) { return linearRooted(ctx, op, 1); }
mcclResult_t mcclAlgoScatter(mcclAlgoCtx* ctx, const mcclOp* op) { return linearRooted(ctx, op, 0); }

/* All-to-all: every pair exchanges its blocks over its own connection, all posted at once (each
 * connection carries one block each way), after announcements (every rank hears from every other
 * before it writes), and the own block is copied last. op->v, when set, holds sendcounts,
 * sdispls, recvcounts and rdispls; otherwise blocks are op->count elements. */
mcclResult_t mcclAlgoAllToAll(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype);
  const size_t* v = op->v;
#define SCOUNT(j) (v ? v[(j)] : op->count)
#define SDISPL(j) (v ? v[n + (j)] : (size_t)(j) * op->count)
#define RCOUNT(j) (v ? v[2 * n + (j)] : op->count)
#define RDISPL(j) (v ? v[3 * n + (j)] : (size_t)(j) * op->count)
  if (SCOUNT(r) != RCOUNT(r)) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error),
             "alltoall: rank %d sends itself %zu elements but expects %zu", r, SCOUNT(r), RCOUNT(r));
    return mcclMismatch;
  }
  char* own_out = (char*)op->recvbuf + RDISPL(r) * esz;
  const char* own_in = (const char*)op->sendbuf + SDISPL(r) * esz;
  const size_t own_bytes = SCOUNT(r) * esz;
  if (n == 1) {
    if (own_bytes > 0) memmove(own_out, own_in, own_bytes);
    return mcclSuccess;
  }
  mcclPeerIo* ios = malloc(sizeof(mcclPeerIo) * (size_t)n * 2);
  if (ios == NULL) return mcclAlgoOutOfMemory(ctx, sizeof(mcclPeerIo) * (size_t)n * 2);
  int nio = 0;
  /* Pairwise schedule: at step k-1 this rank sends to r+k and receives from r-k, so at every
   * step each rank has one sender and one receiver; up to `alltoall_window` steps run at once. */
  for (int k = 1; k < n; k++) {
    int to = (r + k) % n, from = (r - k + n) % n;
    ios[nio++] = (mcclPeerIo){to, 1, (char*)op->sendbuf + SDISPL(to) * esz, SCOUNT(to) * esz, 0, (uint32_t)(k - 1)};
    ios[nio++] = (mcclPeerIo){from, 0, (char*)op->recvbuf + RDISPL(from) * esz, RCOUNT(from) * esz, 0, (uint32_t)(k - 1)};
  }
#undef SCOUNT
#undef SDISPL
#undef RCOUNT
#undef RDISPL
  int window = mcclAlgoSelect(ctx, op).window; /* steps in flight: select.c says why */
  /* All-to-all frames carry each pair's count: with uniform counts every rank hears every
   * other's directly, but all-to-allv counts differ per pair, so a mismatch between two other
   * ranks needs their confirmations to reach this one. */
  mcclResult_t res = mcclAlgoExchangeAnnounced(ctx, op, ios, nio, window, v != NULL);
  if (res == mcclSuccess && own_bytes > 0) memmove(own_out, own_in, own_bytes); /* buffers may be NULL at 0 */
  free(ios);
  return res;
}
