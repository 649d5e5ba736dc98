/*
 * test_mismatch.c: a mismatched collective fails on every rank and leaves every output untouched.
 *
 * One rank (the odd one) issues a collective that differs from the others' in count, or in kind
 * (all-to-allv: in the count of one pair, found by that pair's other rank or by the odd rank).
 * Every collective, at sizes that select each algorithm (recursive doubling / Bruck / trees, the
 * scatter-allgather broadcast, rings and the chain), on 2, 3, 4, 5 and 8 ranks (a pair,
 * folded doubling, powers of two), with the odd rank in the middle and at rank 0 (a root):
 *  - every rank's call fails, and its message says "mismatch";
 *  - no rank's output changed: outputs start as a sentinel (or, in place, as the input) and are
 *    compared byte for byte afterwards;
 *  - inputs are untouched as well.
 * The same holds for the same collective issued with another call site (mcclOpOptions_t.call_site),
 * whose messages name the call sites; a call site of 0 matches any.
 */
#include <stdlib.h>
#include <string.h>

#include "core/param.h"
#include "harness.h"

enum { AR, BCAST, AG, RS, REDUCE, GATHER, SCATTER, A2A, A2AV, NKINDS };
static const char* kind_names[NKINDS] = {"allreduce", "broadcast", "allgather", "reducescatter",
                                         "reduce", "gather", "scatter", "alltoall", "alltoallv"};

typedef struct {
  int kind, odd_kind; /* odd_kind: what the odd rank issues instead (== kind: a count mismatch) */
  size_t count;       /* elements: per-rank block for AG/RS/GATHER/SCATTER/A2A, else the buffer */
  int odd;            /* the rank that differs */
  mcclAlgorithm_t algo;
  int sender_side;    /* A2AV: the odd rank sends one element less to rank odd+1 (0: expects one
                         element less from it); all other pairs match */
  int root_mode;      /* which root each rank names: 0: root 0 everywhere; the same kind and count
                         everywhere with 1: rank r names r % 2 (half and half), 2: the odd rank
                         names root 1, the others root 0 */
  int site;           /* 1: the same collective everywhere, but the odd rank issues it with
                         another call site (mcclOpOptions_t.call_site) */
} mismatchCase;

/* Elements of the input and output buffers of `kind` with per-rank count `c` on n ranks. */
static size_t inElems(int kind, size_t c, int n) {
  return (kind == RS || kind == SCATTER || kind == A2A || kind == A2AV) ? c * (size_t)n : c;
}
static size_t outElems(int kind, size_t c, int n) {
  return (kind == AG || kind == GATHER || kind == A2A || kind == A2AV) ? c * (size_t)n : c;
}

/* All-to-allv of c elements per pair, except one pair that disagrees (mismatchCase.sender_side). */
static mcclResult_t issueA2av(const int32_t* in, int32_t* out, size_t c, int r, int n, const mismatchCase* mc,
                              mcclComm_t comm, const mcclOpOptions_t* o) {
  size_t v[4 * 32];
  for (int j = 0; j < n; j++) {
    v[j] = v[2 * n + j] = c;
    v[n + j] = v[3 * n + j] = (size_t)j * c;
  }
  if (r == mc->odd) v[(mc->sender_side ? 0 : 2 * n) + (r + 1) % n] = c - 1;
  return mcclAllToAllv(in, v, v + n, out, v + 2 * n, v + 3 * n, mcclInt32, comm, o, NULL);
}

/* 1 (premulUntouched): the all-reduces are PREMUL_SUM of float32 (the int32 buffers' bytes), which
 * the engine scales before it runs them as sums: the scaled copy must not land in the output. */
static int premul;
static int asFloat; /* 1 (kindsAsFloat): every collective of float32 (the int32 buffers' bytes) */

static mcclResult_t issue(int kind, const int32_t* in, int32_t* out, size_t c, int root, mcclComm_t comm,
                          const mcclOpOptions_t* o) {
  switch (kind) {
    case AR:
      if (premul) return mcclAllReduce(in, out, c, mcclFloat32, mcclPremulSum, comm, o, NULL);
      return mcclAllReduce(in, out, c, asFloat ? mcclFloat32 : mcclInt32, mcclSum, comm, o, NULL);
    case BCAST: return mcclBroadcast(out, c, mcclInt32, root, comm, o, NULL);
    case AG: return mcclAllGather(in, out, c, asFloat ? mcclFloat32 : mcclInt32, comm, o, NULL);
    case RS: return mcclReduceScatter(in, out, c, asFloat ? mcclFloat32 : mcclInt32, mcclSum, comm, o, NULL);
    case REDUCE: return mcclReduce(in, out, c, mcclInt32, mcclSum, root, comm, o, NULL);
    case GATHER: return mcclGather(in, out, c, mcclInt32, root, comm, o, NULL);
    case SCATTER: return mcclScatter(in, out, c, mcclInt32, root, comm, o, NULL);
    default: return mcclAllToAll(in, out, c, mcclInt32, comm, o, NULL);
  }
}

static int mismatchUntouched(int r, int n, mcclStore_t* store, void* arg) {
  const mismatchCase* mc = arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  const int odd = r == mc->odd;
  const int kind = odd ? mc->odd_kind : mc->kind;
  const int root = mc->root_mode == 1 ? r % 2 : (mc->root_mode == 2 && odd ? 1 : 0);
  const int by_count = mc->odd_kind == mc->kind && kind != A2AV && mc->root_mode == 0 && !mc->site;
  const size_t c = odd && by_count ? mc->count + 1 : mc->count;
  const size_t nin = inElems(kind, c, n), nout = outElems(kind, c, n);
  int32_t* in = malloc(nin * sizeof(int32_t) + 1);
  int32_t* out = malloc(nout * sizeof(int32_t) + 1);
  for (size_t i = 0; i < nin; i++) in[i] = (int32_t)(r + 1 + (int)(i % 7));
  /* A broadcast's buffer is root's input; every other output starts as a sentinel. */
  if (kind == BCAST && r == root) for (size_t i = 0; i < nout; i++) out[i] = (int32_t)(i % 11);
  else memset(out, 0x5a, nout * sizeof(int32_t));
  int32_t* in0 = malloc(nin * sizeof(int32_t) + 1);
  int32_t* out0 = malloc(nout * sizeof(int32_t) + 1);
  memcpy(in0, in, nin * sizeof(int32_t));
  memcpy(out0, out, nout * sizeof(int32_t));
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.algorithm = mc->algo;
  o.timeout_ms = 10000;
  const double start = harnessSeconds();
  if (mc->site) o.call_site = odd ? 0xbbbb0002u : 0xaaaa0001u;
  o.premul_factor = 0.5;
  mcclResult_t res = kind == A2AV ? issueA2av(in, out, c, r, n, mc, comm, &o) : issue(kind, in, out, c, root, comm, &o);
  const char* msg = mcclGetLastError(comm);
  /* Found at once, not at the 10 s timeout (with whatever message that brings). With connections
   * opened on first use too: where the odd rank's only frame of the other collective is for a
   * higher rank that needs nothing from it (an all-gather of float32, Bruck, against folded
   * doubling), the odd rank asks that rank to dial (tcp.h, MCCL_HELLO_KIND_ASK) and the frame then
   * shows the mismatch. */
  const double took = harnessSeconds() - start;
  EXPECT(took < 5.0, "%s x %s, count %zu, %d ranks, odd rank %d: rank %d took %.1f s: '%s'",
         kind_names[mc->kind], kind_names[mc->odd_kind], mc->count, n, mc->odd, r, took, msg);
  EXPECT(res != mcclSuccess, "%s x %s, count %zu, %d ranks, odd rank %d: rank %d succeeded",
         kind_names[mc->kind], kind_names[mc->odd_kind], mc->count, n, mc->odd, r);
  EXPECT(res == mcclSuccess || strstr(msg, "mismatch") != NULL,
         "%s x %s, count %zu, %d ranks: rank %d: '%s'", kind_names[mc->kind], kind_names[mc->odd_kind], mc->count,
         n, r, msg);
  /* Every rank's message names the call sites (its own check's, or the notice of the rank that saw them). */
  EXPECT(!mc->site || res == mcclSuccess || strstr(msg, "call site") != NULL,
         "%s with another call site, count %zu, %d ranks: rank %d: '%s'", kind_names[mc->kind], mc->count, n, r, msg);
  EXPECT(memcmp(out, out0, nout * sizeof(int32_t)) == 0,
         "%s x %s, count %zu, algorithm %d, %d ranks, odd rank %d: rank %d's output was written",
         kind_names[mc->kind], kind_names[mc->odd_kind], mc->count, (int)mc->algo, n, mc->odd, r);
  EXPECT(memcmp(in, in0, nin * sizeof(int32_t)) == 0, "%s: rank %d's input was written", kind_names[kind], r);
  mcclCommDestroy(comm);
  free(in);
  free(out);
  free(in0);
  free(out0);
  return 0;
}

/* Float32 all-reduce, all-gather and reduce-scatter: on 3 and 5 ranks an all-gather of 100
 * elements (Bruck) against reduce-scatters (folded doubling) sent the other collective's frames
 * only to links where no receive was posted yet; parked unchecked, they left every rank waiting
 * for the timeout (found from torch, where tensors are float32). */
static int kindsAsFloat(int r, int n, mcclStore_t* store, void* arg) {
  asFloat = 1; /* in this rank's process only */
  return mismatchUntouched(r, n, store, arg);
}

static int premulUntouched(int r, int n, mcclStore_t* store, void* arg) {
  premul = 1; /* in this rank's process only */
  return mismatchUntouched(r, n, store, arg);
}

/* A call site of 0 matches any: rank 0 gives none, the others one, and the all-reduce is exact. */
static int siteWildcard(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  int32_t buf[3000];
  for (int i = 0; i < 3000; i++) buf[i] = r + i;
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.call_site = r == 0 ? 0 : 0x5eed0001u;
  mcclResult_t res = mcclAllReduce(buf, buf, 3000, mcclInt32, mcclSum, comm, &o, NULL);
  EXPECT(res == mcclSuccess, "rank %d: a call site against none: %s", r, mcclGetLastError(comm));
  int wrong = 0;
  for (int i = 0; i < 3000 && res == mcclSuccess; i++) wrong += buf[i] != n * (n - 1) / 2 + n * i;
  EXPECT(wrong == 0, "rank %d: %d elements wrong", r, wrong);
  mcclCommDestroy(comm);
  return 0;
}

int main(void) {
  setenv("MCCL_ALLTOALL_WINDOW", "2", 0); /* all-to-all two pairwise steps at a time, as across hosts */
  const int worlds[] = {2, 3, 4, 5, 8};
  /* Small (doubling, Bruck, trees, root-only broadcast), medium (scatter-allgather broadcast;
   * rings for all-gather and reduce-scatter at 8 ranks) and large (rings, the chain). */
  const size_t counts[] = {100, 12000, 70000};
  const mcclAlgorithm_t algos[] = {mcclAlgoAuto, mcclAlgoRing, mcclAlgoTree, mcclAlgoHalvingDoubling};
  int cases = 0, before = harness_failures;
  for (int w = 0; w < (int)(sizeof(worlds) / sizeof(worlds[0])); w++) {
    const int n = worlds[w];
    for (int k = 0; k < NKINDS; k++) {
      for (int s = 0; s < 3; s++) {
        mismatchCase mc = {k, k, counts[s], n == 8 ? 0 : n / 2, mcclAlgoAuto, 0, 0, 0};
        harnessRunRanks(n, 60, mismatchUntouched, &mc);
        cases++;
        if (k == A2AV) { /* the pair that disagrees finds out at the other end */
          mc.sender_side = 1;
          harnessRunRanks(n, 60, mismatchUntouched, &mc);
          cases++;
        }
      }
      for (int a = 1; a < 4; a++) { /* each algorithm forced where there are two (halving: all-reduce) */
        if (algos[a] == mcclAlgoHalvingDoubling && k != AR) continue;
        mismatchCase mc = {k, k, counts[1], n - 1, algos[a], 0, 0, 0};
        harnessRunRanks(n, 60, mismatchUntouched, &mc);
        cases++;
      }
    }
    /* The odd rank issues another kind with the same output size (all-gather of count/n), or the
     * same per-rank count. */
    const mismatchCase kinds[] = {{AR, BCAST, 100, 1, mcclAlgoAuto, 0, 0, 0},      {AR, BCAST, 70000, 1, mcclAlgoAuto, 0, 0, 0},
                                  {AR, AG, 70000, 2 % n, mcclAlgoAuto, 0, 0, 0},   {AG, RS, 100, 0, mcclAlgoAuto, 0, 0, 0},
                                  {A2A, AG, 4000, n - 1, mcclAlgoAuto, 0, 0, 0},   {SCATTER, GATHER, 100, 1, mcclAlgoAuto, 0, 0, 0},
                                  {BCAST, REDUCE, 12000, 1, mcclAlgoAuto, 0, 0, 0},
                                  /* root runs a reduce to itself, the others a broadcast from it:
                                   * with both trees waiting to receive first, only the agreements
                                   * alongside send anything */
                                  {BCAST, REDUCE, 100, 0, mcclAlgoAuto, 0, 0, 0},
                                  {BCAST, REDUCE, 12000, 0, mcclAlgoAuto, 0, 0, 0}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
      harnessRunRanks(n, 60, mismatchUntouched, (void*)&kinds[i]);
      cases++;
    }
    const mismatchCase floats[] = {{RS, AG, 100, 0, mcclAlgoAuto, 0, 0, 0}, {AR, AG, 100, 0, mcclAlgoAuto, 0, 0, 0},
                                   {AG, AR, 100, 0, mcclAlgoAuto, 0, 0, 0}, {AR, RS, 100, n - 1, mcclAlgoAuto, 0, 0, 0}};
    for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
      harnessRunRanks(n, 60, kindsAsFloat, (void*)&floats[i]);
      cases++;
    }
    /* PREMUL_SUM all-reduces whose counts differ, through doubling, halving-doubling and the
     * ring: the scaled input must not have gone into the output. */
    const mismatchCase premuls[] = {{AR, AR, 100, n - 1, mcclAlgoAuto, 0, 0, 0},
                                    {AR, AR, 12000, n - 1, mcclAlgoHalvingDoubling, 0, 0, 0},
                                    {AR, AR, 70000, n - 1, mcclAlgoRing, 0, 0, 0}};
    for (size_t i = 0; i < sizeof(premuls) / sizeof(premuls[0]); i++) {
      harnessRunRanks(n, 60, premulUntouched, (void*)&premuls[i]);
      cases++;
    }
    /* The rooted collectives with ranks that disagree on the root: half and half (rank r names
     * r % 2), then one rank (the last) naming root 1 where the others name 0. Small sizes take the
     * trees: a reduce tree whose ranks disagree on the root left every rank waiting for a child
     * that sent elsewhere, with no frame to compare, until the timeout, before its agreement ran
     * alongside the data. */
    for (int k = BCAST; k < A2A; k++) {
      if (k == AG || k == RS) continue;
      for (int s = 0; s < 2; s++)
        for (int mode = 1; mode <= 2; mode++) {
          mismatchCase mc = {k, k, counts[s], mode == 2 ? n - 1 : -1, mcclAlgoAuto, 0, mode, 0};
          harnessRunRanks(n, 60, mismatchUntouched, &mc);
          cases++;
        }
    }
    /* The same collective issued from two call sites: each algorithm, small and large (not
     * all-to-allv, whose odd rank's counts differ as well). */
    for (int k = AR; k < A2AV; k++)
      for (int s = 0; s < 3; s += 2) {
        mismatchCase mc = {k, k, counts[s], n / 2, mcclAlgoAuto, 0, 0, 1};
        harnessRunRanks(n, 60, mismatchUntouched, &mc);
        cases++;
      }
    harnessRunRanks(n, 60, siteWildcard, NULL);
  }
  printf("mismatched collectives: %d cases, %s\n", cases, harness_failures == before ? "ok" : "FAILED");
  return harnessExit("test_mismatch");
}
