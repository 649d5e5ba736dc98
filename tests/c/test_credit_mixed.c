/*
 * test_credit_mixed.c: credits and parks set differently on each rank of one job (transport/park.h).
 *
 * Every rank reports what its receives took whatever its own settings, and a rank's sends obey
 * only its own window, so ranks may differ in MCCL_CREDITS and MCCL_PARK_BYTES: rank 0 ignores
 * reports (MCCL_CREDITS=0), rank 1 parks at most 4096 bytes (its credit window too, below one
 * report's 256 KiB), rank 2 parks nothing (MCCL_PARK_BYTES=0: credits off as well), rank 3 keeps
 * the defaults. Ring all-reduces (with one rank 300 ms late, so the others run ahead into its
 * park and kernel buffers), reduce-scatter, all-gather and broadcast at sizes that do not divide
 * into segments: every result exact (integer-valued, compared with ==) and every rank's bytes
 * equal (harnessReport).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

#define NRANKS 4

/* Set before the rank's first communicator: this process's parameters are read once, then. */
static void rankSettings(int rank) {
  if (rank == 0) harnessSetenv("MCCL_CREDITS", "0");
  if (rank == 1) harnessSetenv("MCCL_PARK_BYTES", "4096");
  if (rank == 2) harnessSetenv("MCCL_PARK_BYTES", "0");
}

static int mixedRank(int rank, int nranks, mcclStore_t* store, void* arg) {
  (void)arg;
  rankSettings(rank);
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  int bad = 0;
  /* All-reduce, ring from 256 KiB: 262145 and 3 x 2^20 + 7 floats (the second 12 MiB, over the
   * 1.5 MiB default window several times). Rank 3 comes 300 ms late to the last one. */
  const size_t counts[] = {262145, (3u << 20) + 7, (3u << 20) + 7};
  for (int c = 0; c < 3; c++) {
    size_t n = counts[c];
    float* x = malloc(n * sizeof(*x));
    for (size_t i = 0; i < n; i++) x[i] = (float)((i % 1013) + (size_t)rank);
    if (c == 2 && rank == 3) harnessSleepUs(300 * 1000);
    if (mcclAllReduce(x, x, n, mcclFloat32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
    for (size_t i = 0; i < n && !bad; i++)
      if (x[i] != (float)(nranks * (i % 1013) + (size_t)(nranks * (nranks - 1) / 2))) bad++;
    EXPECT(!bad, "rank %d: all-reduce of %zu floats exact", rank, n);
    harnessReport(harnessDigest(x, n * sizeof(*x)));
    free(x);
  }
  /* Reduce-scatter and all-gather of 2^19 + 3 int32 per rank's block, broadcast of 5 MiB + 1 from
   * rank 2 (the rank that parks nothing). */
  const size_t block = (1u << 19) + 3;
  int32_t* in = malloc(block * NRANKS * sizeof(*in));
  int32_t* out = malloc(block * NRANKS * sizeof(*out));
  for (size_t i = 0; i < block * NRANKS; i++) in[i] = (int32_t)(i % 997) * (rank + 1);
  if (mcclReduceScatter(in, out, block, mcclInt32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
  for (size_t i = 0; i < block && !bad; i++)
    if (out[i] != (int32_t)((rank * block + i) % 997) * (nranks * (nranks + 1) / 2)) bad++;
  EXPECT(!bad, "rank %d: reduce-scatter exact", rank);
  for (size_t i = 0; i < block; i++) in[i] = (int32_t)(i % 991) + 1000 * rank;
  if (mcclAllGather(in, out, block, mcclInt32, comm, NULL, NULL) != mcclSuccess) bad++;
  for (int r = 0; r < nranks && !bad; r++)
    for (size_t i = 0; i < block && !bad; i++)
      if (out[(size_t)r * block + i] != (int32_t)(i % 991) + 1000 * r) bad++;
  EXPECT(!bad, "rank %d: all-gather exact", rank);
  harnessReport(harnessDigest(out, block * NRANKS * sizeof(*out)));
  const size_t bn = (5u << 20) + 1;
  uint8_t* b = malloc(bn);
  for (size_t i = 0; i < bn; i++) b[i] = rank == 2 ? (uint8_t)(i * 7 + 3) : 0;
  if (mcclBroadcast(b, bn, mcclUint8, 2, comm, NULL, NULL) != mcclSuccess) bad++;
  for (size_t i = 0; i < bn && !bad; i++)
    if (b[i] != (uint8_t)(i * 7 + 3)) bad++;
  EXPECT(!bad, "rank %d: broadcast exact", rank);
  harnessReport(harnessDigest(b, bn));
  free(b);
  free(in);
  free(out);
  mcclCommDestroy(comm);
  return bad != 0;
}

int main(void) {
  EXPECT(harnessRunRanks(NRANKS, 60, mixedRank, NULL) == 0,
         "4 ranks: MCCL_CREDITS=0 / MCCL_PARK_BYTES=4096 / MCCL_PARK_BYTES=0 / defaults: every rank exact and equal");
  return harnessExit("test_credit_mixed");
}
