/* select.c: every algorithm choice of the library (select.h explains the rules). */
#include "algo/select.h"

#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "core/debug.h"
#include "core/param.h"
#include "transport/wire.h"

static const char* const kPlanName[MCCL_PLAN_KINDS] = {
    "ring", "doubling", "bruck", "chain", "scatter-allgather", "tree", "pairwise", "two-level",
    "halving-doubling"};

const char* mcclPlanName(mcclPlanKind kind) {
  return (unsigned)kind < MCCL_PLAN_KINDS ? kPlanName[kind] : "unknown";
}

static pthread_once_t forced_once = PTHREAD_ONCE_INIT;
static mcclAlgorithm_t forced = mcclAlgoAuto;

/* MCCL_ALGO's values (any case); each algorithm's first name is the one logs and init records use. */
static const struct {
  const char* name;
  mcclAlgorithm_t algo;
} kAlgoNames[] = {{"ring", mcclAlgoRing},
                  {"tree", mcclAlgoTree},
                  {"doubling", mcclAlgoTree},
                  {"twolevel", MCCL_ALGO_TWO_LEVEL},
                  {"two-level", MCCL_ALGO_TWO_LEVEL},
                  {"halving", mcclAlgoHalvingDoubling},
                  {"halving-doubling", mcclAlgoHalvingDoubling}};

static void readForced(void) {
  const char* v = mcclParamString("MCCL_ALGO");
  if (v == NULL || v[0] == '\0') return;
  for (size_t i = 0; i < sizeof(kAlgoNames) / sizeof(kAlgoNames[0]); i++)
    if (strcasecmp(v, kAlgoNames[i].name) == 0) {
      forced = kAlgoNames[i].algo;
      return;
    }
  WARN("MCCL_ALGO=%s is not 'ring', 'tree', 'doubling', 'twolevel' or 'halving'; the algorithms are chosen by size", v);
}

mcclAlgorithm_t mcclAlgoForced(void) {
  pthread_once(&forced_once, readForced);
  return forced;
}

const char* mcclAlgoForcedName(void) {
  const mcclAlgorithm_t a = mcclAlgoForced();
  for (size_t i = 0; i < sizeof(kAlgoNames) / sizeof(kAlgoNames[0]); i++)
    if (kAlgoNames[i].algo == a) return kAlgoNames[i].name;
  return "auto";
}

int mcclAlgoAnnounceAll(const mcclAlgoCtx* ctx) { return ctx->nranks <= ctx->announce_ranks; }

static mcclPlan plan(mcclPlanKind kind, int window) { return (mcclPlan){kind, window}; }

/* Whether halving-doubling's model cost (see choose) is below the ring's (ring = 1) or recursive
 * doubling's (ring = 0) for an all-reduce of `bytes` on n = ctx->nranks ranks, p = 2^L <= n, L >= 2,
 * in exact integer arithmetic. Multiplied out (x = bytes / ab, f = 2 when p < n):
 *   below doubling's: bytes (L p - 2 (p-1)) > L p ab;
 *   below the ring's: bytes (2 (p-1) n + f p n - 2 (n-1) p) < (2 (n-1) - 2L - f) p n ab. */
#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 wide;
#else
typedef long double wide; /* no 128-bit integers (32-bit targets): exact up to 64-bit products */
#endif

/* a b < c d, exactly (no overflow, no rounding: every rank must choose alike). */
static int productLess(size_t a, size_t b, size_t c, size_t d) { return (wide)a * (wide)b < (wide)c * (wide)d; }

static int halvingBeats(const mcclAlgoCtx* ctx, size_t bytes, int p, int L, int ring) {
  const wide S = (wide)bytes, ab = (wide)(ctx->alpha_beta ? ctx->alpha_beta : 1);
  const wide n = (wide)ctx->nranks, P = (wide)p, l = (wide)L, f = p < ctx->nranks ? 2 : 0;
  if (!ring) return S * (l * P - 2 * (P - 1)) > l * P * ab;
  return S * (2 * (P - 1) * n + f * P * n - 2 * (n - 1) * P) < (2 * (n - 1) - 2 * l - f) * P * n * ab;
}

static mcclPlan choose(const mcclAlgoCtx* ctx, const mcclOp* op, mcclAlgorithm_t algo, const char** why) {
  const int n = ctx->nranks;
  const size_t esz = mcclDataTypeSize(op->dtype), bytes = op->count * esz;
  if (algo == mcclAlgoHalvingDoubling) {
    if (op->coll == MCCL_COLL_ALLREDUCE) {
      *why = "forced";
      return plan(MCCL_PLAN_HALVING_DOUBLING, 0);
    }
    algo = mcclAlgoRing; /* for the collectives it does not apply to */
  }
  const int forced_two = algo == MCCL_ALGO_TWO_LEVEL;
  if (forced_two) algo = mcclAlgoRing; /* for the collectives it does not apply to */
  const int forced_ring = algo == mcclAlgoRing, forced_tree = algo == mcclAlgoTree;
  const int auto_big = algo == mcclAlgoAuto && bytes >= ctx->ring_threshold;
  switch (op->coll) {
    case MCCL_COLL_ALLREDUCE: {
      /* Halving-doubling (doubling.c) against the other two, in the alpha-beta model with
       * x = S / (alpha beta), in units of alpha; p = 2^L the largest power of two <= n, and
       * f = 2 when n is not a power of two (the folded pairs' two extra whole-buffer hops):
       *   doubling (L + f)(1 + x),  halving-doubling 2L + f + (2 (p-1)/p + f) x,
       *   ring 2 (n-1) + 2 (n-1)/n x (Hockney per step: a step's latency is exposed).
       * Halving-doubling beats doubling once x (L - 2 (p-1)/p) > L (77 KiB on 8 ranks at the
       * default alpha x beta); against the ring it saves 2 (n-1) - 2L - f latencies and moves the
       * same bytes when n is a power of two. The ring is kept wherever its chunks S/n exceed
       * alpha x beta: there its steps are bandwidth-bound and its segments overlap sends,
       * receives and reductions, which halving-doubling's whole-half swaps do not; measured on 8
       * hosts at 5 Gbit/s, halving-doubling took 0.7-0.8 ms at 256 KiB against the ring's
       * 1.0-1.4 ms, and tied with it from 512 KiB to 4 MiB (bench/NOTES.md, 2026-12-07).
       * The comparisons are exact integer ones (halvingBeats): every rank must choose alike, and
       * floating point may round differently on two machines of one job (fused multiply-add). */
      int p = 1, L = 0;
      while (p * 2 <= n) {
        p *= 2;
        L++;
      }
      /* Its first rounds' partners are p/2, p/4, ... ranks away: across switches when the
       * topology has groups, where the two-level ring (or the topology-ordered ring) crosses each
       * uplink once. So only on one topology group. */
      const int halving_ok = algo == mcclAlgoAuto && L >= 2 && op->count >= (size_t)p && ctx->ngroups <= 1;
      /* The ring needs a chunk per rank: fewer elements take doubling. */
      if (forced_ring || (auto_big && op->count >= (size_t)n)) {
        /* Two-level pays where the flat ring's steps are latency-bound: chunks S/n below
         * alpha x beta (the cost model's crossover n* = S / (alpha beta), docs/MODEL.md), when
         * the topology has equal groups (G >= 2 groups of g >= 2 ranks). */
        int two_ok = ctx->ngroups >= 2 && ctx->group_size >= 2 && op->count >= (size_t)n;
        if (two_ok && (forced_two || (!forced_ring && bytes / (size_t)n < ctx->alpha_beta))) {
          *why = forced_two ? "forced" : "chunks below alpha x beta, equal topology groups";
          return plan(MCCL_PLAN_TWO_LEVEL, 0);
        }
        if (halving_ok && bytes / (size_t)n <= ctx->alpha_beta && halvingBeats(ctx, bytes, p, L, 1)) {
          *why = "ring chunks S/n <= alpha x beta, halving-doubling's model cost below the ring's";
          return plan(MCCL_PLAN_HALVING_DOUBLING, 0);
        }
        *why = forced_two ? "forced two-level, but the topology has no equal groups of 2 or more ranks"
               : forced_ring ? "forced" : "size >= MCCL_RING_THRESHOLD";
        return plan(MCCL_PLAN_RING, 0);
      }
      if (halving_ok && halvingBeats(ctx, bytes, p, L, 0)) {
        *why = "halving-doubling's model cost below doubling's";
        return plan(MCCL_PLAN_HALVING_DOUBLING, 0);
      }
      *why = forced_tree ? "forced" : "small";
      return plan(MCCL_PLAN_DOUBLING, 0);
    }
    case MCCL_COLL_BROADCAST: {
      /* The pipelined chain of segments of s bytes takes about (S + (n-2) s)/beta (the last rank
       * starts n-2 segments after the first), scatter + all-gather 2 (n-1)/n S/beta: the chain
       * wins once S > n s, s its own segment (mcclChainSegmentBytes: 64 KiB up to 48 MiB on 8
       * ranks). A relaying chain's fill is smaller (hops of a socket read, not a segment), so
       * the rule errs towards scatter + all-gather there. On two ranks the chain is the direct
       * send. */
      if (forced_ring || (auto_big && (n == 2 || op->count < (size_t)n ||
                                       bytes >= (size_t)n * mcclChainSegmentBytes(ctx, bytes)))) {
        *why = forced_ring ? "forced" : "large: S > n x the chain's segment (or 2 ranks)";
        return plan(MCCL_PLAN_CHAIN, 0);
      }
      /* Scatter + all-gather moves 2 (n-1)/n S against the tree's log2(n) S: it pays once the
       * bytes saved outweigh its extra rounds' latency. The comparison is an exact integer one
       * (every rank must choose alike): (L n - 2(n-1)) S > n alpha beta. */
      int L = 0;
      while ((1 << L) < n) L++;
      if (algo == mcclAlgoAuto && op->count >= (size_t)n &&
          productLess((size_t)n, ctx->alpha_beta, (size_t)L * (size_t)n - 2 * (size_t)(n - 1), bytes)) {
        *why = "(log2 n - 2(n-1)/n) S > alpha x beta";
        return plan(MCCL_PLAN_SCATTER_ALLGATHER, 0);
      }
      *why = forced_tree ? "forced" : "small";
      return plan(MCCL_PLAN_TREE, 0);
    }
    case MCCL_COLL_ALLGATHER: /* the whole gathered array decides */
      if (forced_tree || (algo == mcclAlgoAuto && bytes * (size_t)n < ctx->ring_threshold)) {
        *why = forced_tree ? "forced" : "small";
        return plan(MCCL_PLAN_BRUCK, 0);
      }
      *why = forced_ring ? "forced" : "size >= MCCL_RING_THRESHOLD";
      return plan(MCCL_PLAN_RING, 0);
    case MCCL_COLL_REDUCE_SCATTER: /* count is per rank: the whole input decides */
      if (forced_ring || (algo == mcclAlgoAuto && bytes * (size_t)n >= ctx->ring_threshold)) {
        *why = forced_ring ? "forced" : "size >= MCCL_RING_THRESHOLD";
        return plan(MCCL_PLAN_RING, 0);
      }
      *why = forced_tree ? "forced" : "small";
      return plan(MCCL_PLAN_DOUBLING, 0);
    case MCCL_COLL_REDUCE:
      if ((forced_ring || auto_big) && op->count >= (size_t)n) {
        *why = forced_ring ? "forced" : "size >= MCCL_RING_THRESHOLD";
        return plan(MCCL_PLAN_RING, 0);
      }
      *why = forced_tree ? "forced" : "small";
      return plan(MCCL_PLAN_TREE, 0);
    case MCCL_COLL_ALLTOALL: {
      /* Across a network, every step at once means n-1 senders into each receiver's link at once
       * (incast: queues build up and some flows finish late). A step of a larger block should take
       * at least twice the latency it adds: blocks of 2 x alpha x beta and up run
       * MCCL_ALLTOALL_WINDOW steps at a time (default 1). Small blocks are latency-bound, and on
       * one machine there is no link to share, only CPU: every step at once unless
       * MCCL_ALLTOALL_WINDOW says otherwise (bench/NOTES.md has the numbers). */
      size_t sent = 0;
      if (op->v != NULL) {
        for (int p = 0; p < n; p++)
          if (p != ctx->rank) sent += op->v[p] * esz;
      } else {
        sent = bytes * (size_t)(n - 1);
      }
      int window = ctx->alltoall_window >= 0 ? ctx->alltoall_window : (ctx->single_host ? 0 : 1);
      if (n < 2 || sent / (size_t)(n - 1) < 2 * ctx->alpha_beta) {
        *why = "blocks below 2 x alpha x beta: every step at once";
        return plan(MCCL_PLAN_PAIRWISE, 0);
      }
      *why = ctx->alltoall_window >= 0 ? "MCCL_ALLTOALL_WINDOW" : ctx->single_host ? "one host" : "across hosts";
      return plan(MCCL_PLAN_PAIRWISE, window);
    }
    default: /* gather, scatter, barrier: one algorithm each, nothing to choose (select.h) */
      *why = "the only algorithm";
      return plan(MCCL_PLAN_RING, 0);
  }
}

size_t mcclChainSegmentBytes(const mcclAlgoCtx* ctx, size_t bytes) {
  enum { kFillShare = 128, kFloor = 64 * 1024, kAlign = 4096 };
  const size_t cap = ctx->segment_bytes;
  if (ctx->nranks <= 2 || cap <= kFloor) return cap;
  size_t s = bytes / ((size_t)kFillShare * (size_t)(ctx->nranks - 2)) / kAlign * kAlign;
  return s < kFloor ? kFloor : s > cap ? cap : s;
}

mcclPlan mcclAlgoSelect(mcclAlgoCtx* ctx, const mcclOp* op) {
  mcclAlgorithm_t algo = op->algorithm != mcclAlgoAuto ? op->algorithm : mcclAlgoForced();
  const char* why = "";
  mcclPlan p = choose(ctx, op, algo, &why);
  unsigned coll = op->coll < 16 ? op->coll : 15;
  if (!(ctx->plans_logged[coll] & (1u << p.kind))) {
    ctx->plans_logged[coll] |= 1u << p.kind;
    INFO(MCCL_SUB_COLL, "rank %d/%d: %s of %zu %s runs as %s (%s%s); later ones of this kind that choose the same "
         "are not logged", ctx->rank, ctx->nranks, mcclCollName(op->coll), op->count, mcclDtypeName(op->dtype),
         mcclPlanName(p.kind), why, algo != op->algorithm ? ", MCCL_ALGO" : "");
  }
  return p;
}
