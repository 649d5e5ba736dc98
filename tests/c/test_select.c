/*
 * test_select.c: choices of algo/select.c that are numbers, not kinds: the broadcast chain's
 * segment (mcclChainSegmentBytes) by size and world size, and chain broadcasts whose segment lies
 * strictly between the floor and MCCL_SEGMENT_BYTES, odd lengths included: every rank's bytes
 * equal the root's, exactly (relayed or not); the all-reduce's choice among doubling,
 * halving-doubling and the ring, and the small broadcast's between the tree and
 * scatter-allgather, by size and world size (the model's crossovers, select.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "algo/select.h"

static void expectSegment(int nranks, size_t cap, size_t bytes, size_t want) {
  mcclAlgoCtx ctx;
  memset(&ctx, 0, sizeof(ctx));
  ctx.nranks = nranks;
  ctx.segment_bytes = cap;
  size_t got = mcclChainSegmentBytes(&ctx, bytes);
  EXPECT(got == want, "%d ranks, cap %zu, %zu bytes: segment %zu, want %zu", nranks, cap, bytes, got, want);
}

static void testSegment(void) {
  const size_t K = 1024, M = 1024 * 1024, cap = 256 * K;
  /* Two ranks: the direct send has no fill, so the cap. */
  expectSegment(2, cap, 64 * M, cap);
  /* 8 ranks: S / (128 x 6), in 4 KiB steps, within [64 KiB, cap]. */
  expectSegment(8, cap, 4 * M, 64 * K);          /* 5461 B: the floor */
  expectSegment(8, cap, 16 * M, 64 * K);         /* 21845 B: the floor */
  expectSegment(8, cap, 64 * M, 84 * K);         /* 87381 B -> 84 KiB: a fill of 0.77% */
  expectSegment(8, cap, 256 * M, cap);           /* 349525 B: the cap */
  expectSegment(3, cap, 12 * M, 96 * K);         /* 98304 B exactly */
  /* A cap at or below the floor is kept: MCCL_SEGMENT_BYTES is an upper bound. */
  expectSegment(8, 32 * K, 64 * M, 32 * K);
  expectSegment(8, 64 * K, 64 * M, 64 * K);
  /* The result never exceeds the cap, whatever the size. */
  expectSegment(4, 128 * K, (size_t)1 << 40, 128 * K);
}

/* The plan select.c makes for `count` elements of `dtype` at the default MCCL_RING_THRESHOLD,
 * MCCL_SEGMENT_BYTES (256 KiB) and MCCL_ALPHA_BETA (32 KiB). */
static mcclPlanKind planOf(int nranks, int ngroups, mcclCollKind coll, mcclDataType_t dtype, size_t count, mcclAlgorithm_t algo) {
  mcclAlgoCtx ctx;
  memset(&ctx, 0, sizeof(ctx));
  ctx.nranks = nranks;
  ctx.segment_bytes = 256 * 1024;
  ctx.ring_threshold = 256 * 1024;
  ctx.alpha_beta = 32 * 1024;
  ctx.ngroups = ngroups;
  mcclOp op;
  memset(&op, 0, sizeof(op));
  op.coll = coll;
  op.dtype = dtype;
  op.count = count;
  op.algorithm = algo;
  return mcclAlgoSelect(&ctx, &op).kind;
}

static void expectAllReducePlanIn(int nranks, int ngroups, size_t bytes, mcclAlgorithm_t algo, mcclPlanKind want) {
  mcclPlanKind got = planOf(nranks, ngroups, MCCL_COLL_ALLREDUCE, mcclFloat32, bytes / 4, algo);
  EXPECT(got == want, "all-reduce of %zu bytes on %d ranks in %d groups (algorithm %d): %s, want %s", bytes, nranks,
         ngroups, (int)algo, mcclPlanName(got), mcclPlanName(want));
}

static void expectAllReducePlan(int nranks, size_t bytes, mcclAlgorithm_t algo, mcclPlanKind want) {
  expectAllReducePlanIn(nranks, 1, bytes, algo, want);
}

/* The all-reduce's plans at the default MCCL_RING_THRESHOLD (256 KiB) and MCCL_ALPHA_BETA
 * (32 KiB): halving-doubling from (L alpha beta) / (L - 2 (p-1)/p) bytes (77 KiB on 8 ranks,
 * 128 KiB on 4) up to where the ring's chunks exceed alpha x beta (n x 32 KiB), or, for n not a
 * power of two, where its model cost reaches the ring's (between 234 and 256 KiB on 12 ranks, so
 * the ring from the ring threshold there). */
static void testAllReducePlans(void) {
  const size_t K = 1024, M = 1024 * 1024;
  const mcclPlanKind D = MCCL_PLAN_DOUBLING, H = MCCL_PLAN_HALVING_DOUBLING, R = MCCL_PLAN_RING;
  expectAllReducePlan(8, 64 * K, mcclAlgoAuto, D);
  expectAllReducePlan(8, 76 * K, mcclAlgoAuto, D);
  expectAllReducePlan(8, 80 * K, mcclAlgoAuto, H);
  expectAllReducePlan(8, 128 * K, mcclAlgoAuto, H);
  expectAllReducePlan(8, 256 * K, mcclAlgoAuto, H);  /* chunks of 32 KiB = alpha x beta */
  expectAllReducePlan(8, 260 * K, mcclAlgoAuto, R);
  expectAllReducePlan(8, 1 * M, mcclAlgoAuto, R);
  expectAllReducePlan(4, 124 * K, mcclAlgoAuto, D);
  expectAllReducePlan(4, 132 * K, mcclAlgoAuto, H);
  expectAllReducePlan(4, 256 * K, mcclAlgoAuto, R);
  expectAllReducePlan(12, 200 * K, mcclAlgoAuto, H);
  expectAllReducePlan(12, 240 * K, mcclAlgoAuto, H);  /* below the ring threshold: against doubling only */
  expectAllReducePlan(12, 256 * K, mcclAlgoAuto, R);  /* x = 8 > 7.3: the ring's model cost is less */
  expectAllReducePlan(64, 2 * M, mcclAlgoAuto, H);
  expectAllReducePlan(64, 4 * M, mcclAlgoAuto, R);
  /* Two and three ranks never take it by themselves (p = 2: doubling's one swap is cheaper). */
  expectAllReducePlan(2, 200 * K, mcclAlgoAuto, D);
  expectAllReducePlan(3, 200 * K, mcclAlgoAuto, D);
  /* Topology groups of unequal size (no two-level ring): the rules without halving-doubling,
   * whose partners p/2 ranks away would cross the uplinks. */
  expectAllReducePlanIn(8, 3, 128 * K, mcclAlgoAuto, D);
  expectAllReducePlanIn(8, 3, 256 * K, mcclAlgoAuto, R);
  /* Forced choices. */
  expectAllReducePlan(3, 4 * M, mcclAlgoHalvingDoubling, H);
  expectAllReducePlan(8, 64 * K, mcclAlgoRing, R);
  expectAllReducePlan(8, 128 * K, mcclAlgoTree, D);
}

static void expectBroadcastPlan(int nranks, size_t bytes, mcclPlanKind want) {
  mcclPlanKind got = planOf(nranks, 1, MCCL_COLL_BROADCAST, mcclUint8, bytes, mcclAlgoAuto);
  EXPECT(got == want, "broadcast of %zu bytes on %d ranks: %s, want %s", bytes, nranks, mcclPlanName(got),
         mcclPlanName(want));
}

/* The broadcast's plans below the ring threshold (alpha x beta 32 KiB): scatter-allgather once
 * (L n - 2(n-1)) S > n alpha beta (8 ranks: above 25.6 KiB; 4 ranks: above 64 KiB), compared in
 * integers; the binomial tree below it, and on 2 ranks. */
static void testBroadcastPlans(void) {
  const size_t K = 1024;
  const mcclPlanKind T = MCCL_PLAN_TREE, SA = MCCL_PLAN_SCATTER_ALLGATHER;
  expectBroadcastPlan(8, 1, T);
  expectBroadcastPlan(8, 25 * K, T);
  expectBroadcastPlan(8, 26 * K, SA);
  expectBroadcastPlan(4, 64 * K, T);  /* 2 x 64 KiB = 4 x 32 KiB: not above */
  expectBroadcastPlan(4, 65 * K, SA);
  expectBroadcastPlan(2, 200 * K, T);
}

/* Root 1 broadcasts `count` int32 values i * 7 + 3 (i < count) by the chain (MCCL_ALGO=ring).
 * With arg "0" (MCCL_CHAIN_RELAY=0), in segments of mcclChainSegmentBytes: on 3 ranks 96 KiB,
 * 100 KiB (the last segment 4 bytes) and the 64 KiB floor; on 4 ranks the floor. With "1", in
 * relayed frames of MCCL_SEGMENT_BYTES, the last one short. */
static int chainRank(int rank, int nranks, mcclStore_t* store, void* arg) {
  harnessSetenv("MCCL_ALGO", "ring");
  harnessSetenv("MCCL_CHAIN_RELAY", (const char*)arg);
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  int bad = 0;
  const size_t counts[] = {(12u << 20) / 4, (25u << 19) / 4 + 1, 1000003};
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
    size_t count = counts[c];
    int32_t* x = malloc(count * sizeof(*x));
    for (size_t i = 0; i < count; i++) x[i] = rank == 1 ? (int32_t)(i * 7 + 3) : -1;
    if (mcclBroadcast(x, count, mcclInt32, 1, comm, NULL, NULL) != mcclSuccess) bad++;
    for (size_t i = 0; i < count && !bad; i++)
      if (x[i] != (int32_t)(i * 7 + 3)) {
        fprintf(stderr, "rank %d, count %zu: element %zu is %d\n", rank, count, i, x[i]);
        bad++;
      }
    harnessReport(harnessDigest(x, count * sizeof(*x)));
    free(x);
  }
  mcclCommDestroy(comm);
  return bad != 0;
}

int main(void) {
  testSegment();
  EXPECT(harnessRunRanks(3, 120, chainRank, "0") == 0, "store-and-forward chain broadcasts on 3 ranks, exact");
  EXPECT(harnessRunRanks(4, 120, chainRank, "0") == 0, "store-and-forward chain broadcasts on 4 ranks, exact");
  EXPECT(harnessRunRanks(4, 120, chainRank, "1") == 0, "relayed chain broadcasts on 4 ranks, exact");
  /* After the ranks: mcclAlgoSelect reads MCCL_ALGO once per process, and forked ranks would
   * inherit that reading (chainRank sets MCCL_ALGO=ring). */
  testAllReducePlans();
  testBroadcastPlans();
  return harnessExit("test_select");
}
