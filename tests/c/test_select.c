/*
 * test_select.c: choices of algo/select.c that are numbers, not kinds: the broadcast chain's
 * segment (mcclChainSegmentBytes) by size and world size, and chain broadcasts whose segment lies
 * strictly between the floor and MCCL_SEGMENT_BYTES, odd lengths included: every rank's bytes
 * equal the root's, exactly.
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

/* Root 1 broadcasts `count` int32 values i * 7 + 3 (i < count) by the chain (MCCL_ALGO=ring), in
 * segments of mcclChainSegmentBytes: on 3 ranks 96 KiB, 100 KiB (the last segment 4 bytes) and
 * the 64 KiB floor; on 4 ranks the floor. */
static int chainRank(int rank, int nranks, mcclStore_t* store, void* arg) {
  (void)arg;
  harnessSetenv("MCCL_ALGO", "ring");
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
  EXPECT(harnessRunRanks(3, 120, chainRank, NULL) == 0, "chain broadcasts on 3 ranks, exact");
  EXPECT(harnessRunRanks(4, 120, chainRank, NULL) == 0, "chain broadcasts on 4 ranks, exact");
  return harnessExit("test_select");
}
