/*
 * test_send_load.c: the sender thread's load rule (MCCL_SEND_THREAD_LOAD, transport/tcp.h:
 * mcclTransportCollectiveBegin/End). 3 ranks with the sender thread forced on
 * (MCCL_SEND_THREAD=1) run ring and doubling all-reduces, reduce-scatter, the all-gather ring and
 * the broadcast chain (odd sizes, one rank late at times), every result exact (integer-valued,
 * compared with ==) and every rank's bytes equal (harnessReport), under each setting:
 *  - -1, the writing changes hands after every collective, with rank 1 also on
 *    MCCL_SEND_THREAD_COPY=0 (its copy-only schedules take the writing inside the rule's): the
 *    rule moved it exactly once per collective, and the owner writes after an even count;
 *  - 1 (% of a core): every busy window reaches it, so the thread takes over once, and keeps it;
 *  - 1000 (ten cores): never reached: the owner writes every frame but the all-to-alls', which
 *    the thread writes (each lent and taken back: the writing never moves for good);
 *  - 0: the rule is off: the thread writes from the start and nothing changes hands.
 * Before them, the decision itself (mcclLoadRuleWant) on sequences of loads: the hand-over at the
 * bound, the hand-back only after two windows in a row under 70% of it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/comm.h"
#include "harness.h"

#define NRANKS 3
#define ROUNDS 4 /* of 6 collectives each, 5 of them measured by the rule */

typedef struct {
  const char* load;
  int copy0_rank; /* this rank also sets MCCL_SEND_THREAD_COPY=0 (-1: none) */
} Setting;

/* One round: all-reduce 2^20 + 5 floats (ring), all-reduce 257 int32 (doubling), reduce-scatter
 * 2^18 + 1 int32 per rank, all-gather 2^18 + 3 int32 per rank, all-to-all of 2^17 + 1 int32
 * blocks (lent to the thread, never measured), broadcast 3 MiB + 1 bytes from rank (round % NRANKS). Rank (round % NRANKS) arrives 20 ms late to the first. */
static int runRound(mcclComm_t comm, int rank, int nranks, int round) {
  int bad = 0;
  const size_t n = (1u << 20) + 5;
  float* x = malloc(n * sizeof(*x));
  for (size_t i = 0; i < n; i++) x[i] = (float)((i % 1009) + (size_t)rank + (size_t)round);
  if (rank == round % nranks) harnessSleepUs(20 * 1000);
  if (mcclAllReduce(x, x, n, mcclFloat32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
  for (size_t i = 0; i < n && !bad; i++)
    if (x[i] != (float)(nranks * ((i % 1009) + (size_t)round) + (size_t)(nranks * (nranks - 1) / 2))) bad++;
  EXPECT(!bad, "rank %d round %d: ring all-reduce exact", rank, round);
  harnessReport(harnessDigest(x, n * sizeof(*x)));
  free(x);

  int32_t small[257];
  for (int i = 0; i < 257; i++) small[i] = i * (rank + 1);
  if (mcclAllReduce(small, small, 257, mcclInt32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
  for (int i = 0; i < 257 && !bad; i++)
    if (small[i] != i * (nranks * (nranks + 1) / 2)) bad++;
  EXPECT(!bad, "rank %d round %d: small all-reduce exact", rank, round);

  const size_t rs = (1u << 18) + 1;
  const size_t ag = (1u << 18) + 3;
  int32_t* in = malloc(ag * NRANKS * sizeof(*in)); /* ag > rs: room for both */
  int32_t* out = malloc(ag * NRANKS * sizeof(*out));
  for (size_t i = 0; i < rs * NRANKS; i++) in[i] = (int32_t)(i % 997) * (rank + 1);
  if (mcclReduceScatter(in, out, rs, mcclInt32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
  for (size_t i = 0; i < rs && !bad; i++)
    if (out[i] != (int32_t)((rank * rs + i) % 997) * (nranks * (nranks + 1) / 2)) bad++;
  EXPECT(!bad, "rank %d round %d: reduce-scatter exact", rank, round);

  for (size_t i = 0; i < ag; i++) in[i] = (int32_t)(i % 991) + 1000 * rank;
  if (mcclAllGather(in, out, ag, mcclInt32, comm, NULL, NULL) != mcclSuccess) bad++;
  for (int r = 0; r < nranks && !bad; r++)
    for (size_t i = 0; i < ag && !bad; i++)
      if (out[(size_t)r * ag + i] != (int32_t)(i % 991) + 1000 * r) bad++;
  EXPECT(!bad, "rank %d round %d: all-gather exact", rank, round);
  harnessReport(harnessDigest(out, ag * NRANKS * sizeof(*out)));
  free(in);
  free(out);

  /* All-to-all, 2^17 + 1 int32 per block: the thread writes it whatever the rule says. */
  const size_t blk = (1u << 17) + 1;
  int32_t* ai = malloc(blk * NRANKS * sizeof(*ai));
  int32_t* ao = malloc(blk * NRANKS * sizeof(*ao));
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < blk; i++) ai[(size_t)p * blk + i] = (int32_t)(i % 983) + 100 * rank + 10000 * p;
  if (mcclAllToAll(ai, ao, blk, mcclInt32, comm, NULL, NULL) != mcclSuccess) bad++;
  for (int p = 0; p < nranks && !bad; p++)
    for (size_t i = 0; i < blk && !bad; i++)
      if (ao[(size_t)p * blk + i] != (int32_t)(i % 983) + 100 * p + 10000 * rank) bad++;
  EXPECT(!bad, "rank %d round %d: all-to-all exact", rank, round);
  free(ai);
  free(ao);

  const size_t bn = (3u << 20) + 1;
  const int root = round % nranks;
  uint8_t* b = malloc(bn);
  for (size_t i = 0; i < bn; i++) b[i] = rank == root ? (uint8_t)(i * 7 + (size_t)round) : 0;
  if (mcclBroadcast(b, bn, mcclUint8, root, comm, NULL, NULL) != mcclSuccess) bad++;
  for (size_t i = 0; i < bn && !bad; i++)
    if (b[i] != (uint8_t)(i * 7 + (size_t)round)) bad++;
  EXPECT(!bad, "rank %d round %d: broadcast exact", rank, round);
  harnessReport(harnessDigest(b, bn));
  free(b);
  return bad;
}

static int loadRank(int rank, int nranks, mcclStore_t* store, void* arg) {
  const Setting* s = arg;
  harnessSetenv("MCCL_SEND_THREAD", "1");
  harnessSetenv("MCCL_SEND_THREAD_LOAD", s->load);
  if (rank == s->copy0_rank) harnessSetenv("MCCL_SEND_THREAD_COPY", "0");
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  const int load = atoi(s->load);
  mcclTransport* tp = &comm->tp;
  EXPECT(tp->sender != NULL, "rank %d: MCCL_SEND_THREAD=1 starts the sender thread", rank);
  EXPECT(tp->load_pct == load, "rank %d: MCCL_SEND_THREAD_LOAD=%s read as %d", rank, s->load, tp->load_pct);
  EXPECT(tp->owner_writes == (load != 0), "rank %d, load %d: the owner writes first unless the rule is off", rank,
         load);
  int bad = 0;
  for (int round = 0; round < ROUNDS; round++) bad += runRound(comm, rank, nranks, round);
  /* Completed collectives: their waits ordered the engine's writes of these before the reads. */
  const uint64_t colls = ROUNDS * 5;
  if (load < 0) {
    EXPECT(tp->load_flips == colls, "rank %d: -1 moves the writing after each of %llu collectives: %llu moves", rank,
           (unsigned long long)colls, (unsigned long long)tp->load_flips);
    EXPECT(tp->owner_writes == (colls % 2 == 0), "rank %d: after an even count the owner writes again", rank);
  } else if (load == 1) {
    EXPECT(tp->load_flips == 1 && tp->owner_writes == 0,
           "rank %d: at 1%% of a core the thread takes over once and keeps it: %llu moves, owner writes %d", rank,
           (unsigned long long)tp->load_flips, tp->owner_writes);
  } else {
    EXPECT(tp->load_lends == (load != 0 ? ROUNDS : 0), "rank %d, load %d: each all-to-all lent to the thread: %llu",
           rank, load, (unsigned long long)tp->load_lends);
    EXPECT(tp->load_flips == 0 && tp->owner_writes == (load != 0),
           "rank %d, load %d: nothing changes hands: %llu moves, owner writes %d", rank, load,
           (unsigned long long)tp->load_flips, tp->owner_writes);
  }
  EXPECT(tp->copy_owned == 0 && tp->load_lent == 0, "rank %d: no schedule holds the writing after it ended", rank);
  mcclCommDestroy(comm);
  return bad != 0;
}

/* The decision alone (mcclLoadRuleWant), on sequences of windows' loads, bound 85%: the owner
 * hands over at 85, the thread hands back after two windows in a row under 59.5 (70% of 85). */
static void decisions(void) {
  static const struct {
    int pct[8];
    int want[8]; /* after each window: 1, the thread writes */
  } seqs[] = {
      {{30, 84, 85, 40, 70, 40, 50, 90}, {0, 0, 1, 1, 1, 1, 0, 1}}, /* one low window is a transient */
      {{99, 59, 60, 59, 59, 100, 10, 10}, {1, 1, 1, 1, 0, 1, 1, 0}}, /* 59.5: 59 is under, 60 is not */
  };
  for (size_t k = 0; k < sizeof(seqs) / sizeof(seqs[0]); k++) {
    int helped = 0, low = 0;
    for (int i = 0; i < 8; i++) {
      helped = mcclLoadRuleWant(helped, seqs[k].pct[i], 85, &low);
      EXPECT(helped == seqs[k].want[i], "sequence %zu, window %d (%d%%): want %d, got %d", k, i, seqs[k].pct[i],
             seqs[k].want[i], helped);
    }
  }
}

int main(void) {
  decisions();
  static const Setting settings[] = {{"-1", 1}, {"1", -1}, {"1000", -1}, {"0", -1}};
  for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
    EXPECT(harnessRunRanks(NRANKS, 90, loadRank, (void*)&settings[i]) == 0,
           "MCCL_SEND_THREAD_LOAD=%s (rank %d with MCCL_SEND_THREAD_COPY=0): every rank exact and equal",
           settings[i].load, settings[i].copy0_rank);
  return harnessExit("test_send_load");
}
