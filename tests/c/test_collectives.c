/*
 * test_collectives.c: all-reduce (ring and recursive doubling, forced) of every dtype and op, every
 * other collective and send/recv of every dtype, broadcast, all-gather and barrier on 1..9 ranks
 * forked on 127.0.0.1, with random start skew per rank, against exact references; every rank
 * reports a digest of every result and the harness checks they agree bitwise. Inputs are small integers so every dtype's result is exact.
 *
 * Usage: test_collectives [max_ranks]   (default 9)
 *
 * MCCL_TEST_QUICK=1 (the sanitizer builds: make asan, make tsan) shrinks the largest buffers
 * (64 Mi-element all-reduce to 4 Mi, 1 Mi-element cases to 256 Ki, the 300 K all-gather to 70 K);
 * every collective, algorithm, dtype and op still runs, and every large case still spans several
 * ring segments. MCCL_TEST_MAX_RANKS=n (or the argument) runs 1..n ranks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "reduce/reduce.h"
#include "transport/wire.h"

static int isUnsigned(mcclDataType_t dt) {
  return dt == mcclUint8 || dt == mcclUint16 || dt == mcclUint32 || dt == mcclUint64;
}

/* The integer value rank r contributes at index i for `op` (small, so sums and products of up to
 * 9 ranks are exact in every floating type, including fp16 and bf16; non-negative for the
 * unsigned types). */
static int64_t inputValue(mcclDataType_t dt, mcclRedOp_t op, int r, size_t i) {
  if (dt == mcclBool) return (i % 5 == 0) ? 1 : ((i + (size_t)r) % 3 == 0);
  if (op == mcclProd) {
    static const int v[5] = {1, 2, -1, -2, 1};
    int64_t x = v[(i * 3 + (size_t)r) % 5];
    return isUnsigned(dt) ? (x < 0 ? -x : x) : x;
  }
  int64_t x = (int64_t)((i * 7 + (size_t)r * 13) % 11) - 5;
  return isUnsigned(dt) ? x + 5 : x;
}

static void storeValue(void* buf, mcclDataType_t dt, size_t i, double v) {
  switch (dt) {
    case mcclInt8: ((int8_t*)buf)[i] = (int8_t)(int64_t)v; break;
    case mcclUint8: ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v; break;
    case mcclBool: ((uint8_t*)buf)[i] = v != 0; break;
    case mcclInt32: ((int32_t*)buf)[i] = (int32_t)(int64_t)v; break;
    case mcclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case mcclInt16: ((int16_t*)buf)[i] = (int16_t)(int64_t)v; break;
    case mcclUint16: ((uint16_t*)buf)[i] = (uint16_t)(int64_t)v; break;
    case mcclUint32: ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v; break;
    case mcclUint64: ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v; break;
    case mcclFloat16: ((uint16_t*)buf)[i] = mcclFloatToHalf((float)v); break;
    case mcclBfloat16: ((uint16_t*)buf)[i] = mcclFloatToBfloat16((float)v); break;
    case mcclFloat32: ((float*)buf)[i] = (float)v; break;
    case mcclFloat64: ((double*)buf)[i] = v; break;
    default: break;
  }
}

/* Reference for element i over n ranks, written into `ref` at i in the dtype's representation.
 * Integers wrap like the hardware (computed in int64 then truncated); AVG follows the documented
 * rule: floats divide the exact sum once (fp32 for the half types), integers truncate. */
static void referenceValue(void* ref, mcclDataType_t dt, mcclRedOp_t op, int n, size_t i) {
  int64_t acc = inputValue(dt, op, 0, i);
  for (int r = 1; r < n; r++) {
    int64_t x = inputValue(dt, op, r, i);
    switch (op) {
      case mcclSum: case mcclAvg: acc = dt == mcclBool ? (acc || x) : acc + x; break;
      case mcclProd: acc = dt == mcclBool ? (acc && x) : acc * x; break;
      case mcclMax: acc = x > acc ? x : acc; break;
      case mcclMin: acc = x < acc ? x : acc; break;
      default: break;
    }
  }
  if (op != mcclAvg) {
    if (dt == mcclInt8) ((int8_t*)ref)[i] = (int8_t)(uint8_t)(uint64_t)acc;
    else storeValue(ref, dt, i, (double)acc);
    return;
  }
  switch (dt) {
    case mcclFloat16: case mcclBfloat16: case mcclFloat32:
      storeValue(ref, dt, i, (double)((float)acc / (float)n));
      break;
    case mcclFloat64: storeValue(ref, dt, i, (double)acc / (double)n); break;
    default: storeValue(ref, dt, i, (double)(acc / n)); break;
  }
}

/* inputValue depends on i only through i mod 3, 5 and 11, so every array below repeats with this
 * period: compute one period, then copy it forward (keeps 64 Mi-element cases fast). */
#define PERIOD 165

static void tile(char* buf, size_t esz, size_t count) {
  for (size_t have = PERIOD; have < count; have *= 2)
    memcpy(buf + have * esz, buf, (count - have < have ? count - have : have) * esz);
}

static void fillInput(void* buf, mcclDataType_t dt, mcclRedOp_t op, int r, size_t count) {
  for (size_t i = 0; i < count && i < PERIOD; i++) {
    int64_t v = inputValue(dt, op, r, i);
    if (dt == mcclInt8) ((int8_t*)buf)[i] = (int8_t)v;
    else storeValue(buf, dt, i, (double)v);
  }
  tile(buf, mcclDataTypeSize(dt), count);
}

static int quick; /* MCCL_TEST_QUICK: smaller buffers and worlds (see the top of the file) */

static void skew(uint64_t* rng) { harnessSleepUs(harnessRandom(rng) % 3000); }

static const mcclRedOp_t kOps[] = {mcclSum, mcclProd, mcclMax, mcclMin, mcclAvg};
static const mcclDataType_t kTypes[] = {mcclInt8,    mcclUint8,   mcclInt32,   mcclInt64, mcclFloat16,
                                        mcclFloat32, mcclFloat64, mcclBfloat16, mcclBool,  mcclInt16,
                                        mcclUint16,  mcclUint32,  mcclUint64};

/* One all-reduce: fill, run, compare with the reference, report the digest. */
static void checkAllReduce(mcclComm_t comm, int r, int n, mcclDataType_t dt, mcclRedOp_t op,
                           size_t count, mcclAlgorithm_t algo, int in_place, uint64_t* rng) {
  size_t esz = mcclDataTypeSize(dt), bytes = count * esz;
  char* send = malloc(bytes + 1);
  char* recv = in_place ? send : malloc(bytes + 1);
  char* ref = malloc(bytes + 1);
  fillInput(send, dt, op, r, count);
  if (!in_place) memset(recv, 0xA5, bytes);
  for (size_t i = 0; i < count && i < PERIOD; i++) referenceValue(ref, dt, op, n, i);
  tile(ref, esz, count);
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.algorithm = algo;
  skew(rng);
  mcclResult_t res = mcclAllReduce(send, recv, count, dt, op, comm, &opts, NULL);
  EXPECT(res == mcclSuccess, "allreduce n=%d count=%zu dtype=%d op=%d algo=%d: %s", n, count,
         (int)dt, (int)op, (int)algo, mcclGetLastError(comm));
  size_t bad = 0, first_bad = 0;
  if (memcmp(recv, ref, bytes) != 0)
    for (size_t i = 0; i < count; i++)
      if (memcmp(recv + i * esz, ref + i * esz, esz) != 0 && bad++ == 0) first_bad = i;
  EXPECT(bad == 0, "rank %d n=%d dtype=%d op=%d count=%zu algo=%d in_place=%d: %zu wrong, first at %zu",
         r, n, (int)dt, (int)op, count, (int)algo, in_place, bad, first_bad);
  harnessReport(harnessDigest(recv, bytes));
  free(send);
  if (!in_place) free(recv);
  free(ref);
}

/* Element i of the input "rank" `who` (any number: it only seeds the values) would contribute,
 * in dtype dt's representation (as fillInput writes it). */
static void storeInput(void* buf, mcclDataType_t dt, size_t at, mcclRedOp_t op, int who, size_t i) {
  storeValue(buf, dt, at, (double)inputValue(dt, op, who, i));
}

/* Compare `count` elements with `want`; one check, naming the first wrong element. */
static void expectSame(const void* got, const void* want, mcclDataType_t dt, size_t count, const char* what,
                       int r, int n) {
  size_t esz = mcclDataTypeSize(dt), bad = 0, first = 0;
  for (size_t i = 0; i < count; i++)
    if (memcmp((const char*)got + i * esz, (const char*)want + i * esz, esz) != 0 && bad++ == 0) first = i;
  EXPECT(bad == 0, "%s %s rank %d n=%d count=%zu: %zu wrong, first at %zu", what, mcclDtypeName(dt), r, n, count,
         bad, first);
}

/* Every collective once for dtype dt (a count that is not a multiple of n): broadcast, all-gather,
 * reduce-scatter (SUM) and reduce (MAX, defined for every dtype), all-to-all, gather, scatter
 * and a ring of sends and receives, each against an exact reference. */
static void checkEveryCollective(mcclComm_t comm, int r, int n, mcclDataType_t dt, uint64_t* rng) {
  const size_t c = 37 + (size_t)n, nc = c * (size_t)n, esz = mcclDataTypeSize(dt);
  char* in = malloc(nc * esz);
  char* out = malloc(nc * esz);
  char* want = malloc(nc * esz);
  /* Broadcast from the last rank. */
  const int last = n - 1;
  for (size_t i = 0; i < c; i++) storeInput(want, dt, i, mcclSum, 100 + last, i);
  if (r == last) memcpy(out, want, c * esz);
  else memset(out, 0xA5, c * esz);
  skew(rng);
  EXPECT_OK(comm, mcclBroadcast(out, c, dt, last, comm, NULL, NULL));
  expectSame(out, want, dt, c, "broadcast", r, n);
  /* All-gather: block q is rank q's input. */
  for (size_t i = 0; i < c; i++) storeInput(in, dt, i, mcclSum, r, i);
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++) storeInput(want, dt, (size_t)q * c + i, mcclSum, q, i);
  skew(rng);
  EXPECT_OK(comm, mcclAllGather(in, out, c, dt, comm, NULL, NULL));
  expectSame(out, want, dt, nc, "allgather", r, n);
  harnessReport(harnessDigest(out, nc * esz));
  /* Reduce-scatter SUM: every rank's input is the n * c elements of fillInput, and this rank's
   * block r of the result is the reference at global indices r * c + i. */
  fillInput(in, dt, mcclSum, r, nc);
  for (size_t i = 0; i < c; i++) referenceValue(want, dt, mcclSum, n, (size_t)r * c + i);
  skew(rng);
  EXPECT_OK(comm, mcclReduceScatter(in, out, c, dt, mcclSum, comm, NULL, NULL));
  expectSame(out, want + (size_t)r * c * esz, dt, c, "reduce_scatter", r, n);
  /* Reduce MAX to rank 0. */
  fillInput(in, dt, mcclMax, r, c);
  for (size_t i = 0; i < c; i++) referenceValue(want, dt, mcclMax, n, i);
  memset(out, 0xA5, c * esz);
  skew(rng);
  EXPECT_OK(comm, mcclReduce(in, out, c, dt, mcclMax, 0, comm, NULL, NULL));
  if (r == 0) expectSame(out, want, dt, c, "reduce max", r, n);
  /* All-to-all: block j of rank q's input goes to rank j. */
  fillInput(in, dt, mcclSum, r, nc);
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++) storeInput(want, dt, (size_t)q * c + i, mcclSum, q, (size_t)r * c + i);
  skew(rng);
  EXPECT_OK(comm, mcclAllToAll(in, out, c, dt, comm, NULL, NULL));
  expectSame(out, want, dt, nc, "alltoall", r, n);
  /* Gather to the last rank, scatter from rank 0. */
  for (size_t i = 0; i < c; i++) storeInput(in, dt, i, mcclSum, r, i);
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++) storeInput(want, dt, (size_t)q * c + i, mcclSum, q, i);
  skew(rng);
  EXPECT_OK(comm, mcclGather(in, out, c, dt, last, comm, NULL, NULL));
  if (r == last) expectSame(out, want, dt, nc, "gather", r, n);
  fillInput(in, dt, mcclSum, 0, nc);
  for (size_t i = 0; i < c; i++) storeInput(want, dt, i, mcclSum, 0, (size_t)r * c + i);
  skew(rng);
  EXPECT_OK(comm, mcclScatter(in, out, c, dt, 0, comm, NULL, NULL));
  expectSame(out, want, dt, c, "scatter", r, n);
  /* Sends and receives around the ring, tagged with the dtype. */
  if (n > 1) {
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    for (size_t i = 0; i < c; i++) storeInput(in, dt, i, mcclSum, r, i);
    for (size_t i = 0; i < c; i++) storeInput(want, dt, i, mcclSum, from, i);
    mcclRequest_t send = NULL;
    EXPECT_OK(comm, mcclSend(in, c, dt, to, (int)dt, comm, NULL, &send));
    EXPECT_OK(comm, mcclRecv(out, c, dt, from, (int)dt, comm, NULL, NULL));
    if (send != NULL) {
      EXPECT(mcclWait(send, -1) == mcclSuccess, "send %s: %s", mcclDtypeName(dt), mcclRequestError(send));
      mcclRequestFree(send);
    }
    expectSame(out, want, dt, c, "send/recv", r, n);
  }
  free(in);
  free(out);
  free(want);
}

/* Reduce (to the first and last rank), reduce-scatter, gather, scatter, all-to-all (even and
 * uneven) and PREMUL_SUM, through both algorithm families where there are two. */
static void checkRootedAndAllToAll(mcclComm_t comm, int r, int n, uint64_t* rng) {
  const mcclAlgorithm_t algos[] = {mcclAlgoRing, mcclAlgoTree};
  const size_t counts[] = {0, 1, 7919, 100003};
  for (size_t a = 0; a < 2; a++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      const size_t count = counts[c];
      mcclOpOptions_t opts;
      memset(&opts, 0, sizeof(opts));
      opts.algorithm = algos[a];
      size_t nc = count * (size_t)n;
      int32_t* in = malloc(nc * 4 + 4);
      int32_t* out = malloc(nc * 4 + 4);
      for (size_t i = 0; i < nc; i++) in[i] = (int32_t)((i * 7 + (size_t)r * 13) % 11) - 5;
      /* reduce to the first and the last rank: sum over ranks of in[i] */
      for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1)) {
        for (size_t i = 0; i < count; i++) out[i] = -99;
        skew(rng);
        EXPECT_OK(comm, mcclReduce(in, out, count, mcclInt32, mcclSum, root, comm, &opts, NULL));
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
          int32_t want = 0;
          for (int q = 0; q < n; q++) want += (int32_t)((i * 7 + (size_t)q * 13) % 11) - 5;
          bad += out[i] != (r == root ? want : -99);
        }
        EXPECT(bad == 0, "reduce n=%d root=%d count=%zu algo=%d: %zu wrong", n, root, count, (int)algos[a], bad);
        if (n == 1) break;
      }
      /* reduce-scatter with AVG on float32 (sums of small integers / n, exact per the rule) */
      float* fin = malloc(nc * 4 + 4);
      float* fout = malloc(count * 4 + 4);
      for (size_t i = 0; i < nc; i++) fin[i] = (float)in[i];
      skew(rng);
      EXPECT_OK(comm, mcclReduceScatter(fin, fout, count, mcclFloat32, mcclAvg, comm, &opts, NULL));
      size_t bad = 0;
      for (size_t i = 0; i < count; i++) {
        size_t g = (size_t)r * count + i;
        int32_t sum = 0;
        for (int q = 0; q < n; q++) sum += (int32_t)((g * 7 + (size_t)q * 13) % 11) - 5;
        bad += fout[i] != (float)sum / (float)n;
      }
      EXPECT(bad == 0, "reduce_scatter avg n=%d count=%zu algo=%d: %zu wrong", n, count, (int)algos[a], bad);
      /* PREMUL_SUM all-reduce and reduce-scatter: factor 0.5, inputs even integers */
      opts.premul_factor = 0.5;
      for (size_t i = 0; i < nc; i++) fin[i] = (float)(2 * in[i]);
      skew(rng);
      EXPECT_OK(comm, mcclReduceScatter(fin, fout, count, mcclFloat32, mcclPremulSum, comm, &opts, NULL));
      bad = 0;
      for (size_t i = 0; i < count; i++) {
        size_t g = (size_t)r * count + i;
        int32_t sum = 0;
        for (int q = 0; q < n; q++) sum += (int32_t)((g * 7 + (size_t)q * 13) % 11) - 5;
        bad += fout[i] != (float)sum;
      }
      EXPECT(bad == 0, "reduce_scatter premul n=%d count=%zu: %zu wrong", n, count, bad);
      bad = 0;
      for (size_t i = 0; i < nc; i++) bad += fin[i] != (float)(2 * in[i]);
      EXPECT(bad == 0, "premul changed %zu input elements", bad);
      opts.premul_factor = 0;
      free(fin);
      free(fout);
      if (a == 1) { free(in); free(out); continue; }
      /* gather to and scatter from the last rank */
      int root = n - 1;
      for (size_t i = 0; i < nc; i++) out[i] = -1;
      skew(rng);
      EXPECT_OK(comm, mcclGather(in + (size_t)r * count, out, count, mcclInt32, root, comm, NULL, NULL));
      bad = 0;
      if (r == root)
        for (int q = 0; q < n; q++)
          for (size_t i = 0; i < count; i++) {
            size_t g = (size_t)q * count + i;
            bad += out[g] != (int32_t)((g * 7 + (size_t)q * 13) % 11) - 5;
          }
      EXPECT(bad == 0, "gather n=%d count=%zu: %zu wrong", n, count, bad);
      for (size_t i = 0; i < count; i++) out[i] = -1;
      skew(rng);
      EXPECT_OK(comm, mcclScatter(in, out, count, mcclInt32, root, comm, NULL, NULL));
      bad = 0;
      for (size_t i = 0; i < count; i++) {
        size_t g = (size_t)r * count + i;
        bad += out[i] != (int32_t)((g * 7 + (size_t)root * 13) % 11) - 5;
      }
      EXPECT(bad == 0, "scatter n=%d count=%zu: %zu wrong", n, count, bad);
      /* all-to-all: block j of rank q is q * 1000 + j + i */
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++) in[(size_t)j * count + i] = r * 1000 + j + (int32_t)(i % 100);
      skew(rng);
      EXPECT_OK(comm, mcclAllToAll(in, out, count, mcclInt32, comm, NULL, NULL));
      bad = 0;
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++) bad += out[(size_t)q * count + i] != q * 1000 + r + (int32_t)(i % 100);
      EXPECT(bad == 0, "alltoall n=%d count=%zu: %zu wrong", n, count, bad);
      free(in);
      free(out);
    }
  /* Uneven all-to-all: rank q sends (q + j) % 3 * 5 + j elements to rank j, value q * 100 + j. */
  size_t* v = calloc((size_t)n * 4, sizeof(size_t));
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < n; j++) {
    v[j] = (size_t)((r + j) % 3) * 5 + (size_t)j;
    v[n + j] = stotal;
    stotal += v[j];
    v[2 * n + j] = (size_t)((j + r) % 3) * 5 + (size_t)r;
    v[3 * n + j] = rtotal;
    rtotal += v[2 * n + j];
  }
  int64_t* sb = malloc(stotal * 8 + 8);
  int64_t* rb = malloc(rtotal * 8 + 8);
  for (int j = 0; j < n; j++)
    for (size_t i = 0; i < v[j]; i++) sb[v[n + j] + i] = r * 100 + j;
  skew(rng);
  EXPECT_OK(comm, mcclAllToAllv(sb, v, v + n, rb, v + 2 * n, v + 3 * n, mcclInt64, comm, NULL, NULL));
  size_t bad = 0;
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < v[2 * n + q]; i++) bad += rb[v[3 * n + q] + i] != q * 100 + r;
  EXPECT(bad == 0, "alltoallv n=%d: %zu wrong", n, bad);
  free(sb);
  free(rb);
  free(v);
}

static int rankMain(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  uint64_t rng = 0x1234u + (uint64_t)r * 7919u;
  const mcclAlgorithm_t algos[] = {mcclAlgoRing, mcclAlgoTree, mcclAlgoHalvingDoubling};

  /* Every op x dtype, every all-reduce algorithm, a count that is not a multiple of n. */
  for (size_t a = 0; a < 3; a++)
    for (size_t t = 0; t < sizeof(kTypes) / sizeof(kTypes[0]); t++)
      for (size_t o = 0; o < sizeof(kOps) / sizeof(kOps[0]); o++) {
        if (mcclReduceCheck(kTypes[t], kOps[o]) != mcclSuccess) continue;
        checkAllReduce(comm, r, n, kTypes[t], kOps[o], 1000 + (size_t)n, algos[a], (int)(t + o) % 2, &rng);
      }

  /* Every other collective, once per dtype. */
  for (size_t t = 0; t < sizeof(kTypes) / sizeof(kTypes[0]); t++) checkEveryCollective(comm, r, n, kTypes[t], &rng);

  /* Edge and large counts, int32 SUM (exact, every byte position different). */
  const size_t big = quick ? (1u << 18) + 3 : (1u << 20) + 3;
  const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n, (size_t)n + 1, 7919, big};
  for (size_t a = 0; a < 3; a++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      checkAllReduce(comm, r, n, mcclInt32, mcclSum, counts[c], algos[a], (int)c % 2, &rng);
  /* 64 Mi elements (int8: 64 MiB per rank) through every algorithm. */
  for (size_t a = 0; a < 3; a++)
    checkAllReduce(comm, r, n, mcclInt8, mcclSum, quick ? ((size_t)4 << 20) + 5 : (size_t)64 << 20, algos[a],
                   (int)a, &rng);

  /* Broadcast from the first and last rank, through the tree, the chain and the automatic choice
   * (scatter-allgather for sizes between the ring threshold and n x the chain's segment: 100003
   * int32 from 7 ranks up). */
  const size_t bcounts[] = {0, 1, 7919, 100003, big};
  const mcclAlgorithm_t balgos[] = {mcclAlgoRing, mcclAlgoTree, mcclAlgoAuto};
  for (size_t a = 0; a < 3; a++)
    for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1))
      for (size_t c = 0; c < sizeof(bcounts) / sizeof(bcounts[0]); c++) {
        size_t count = bcounts[c];
        int32_t* buf = malloc(count * 4 + 4);
        for (size_t i = 0; i < count; i++) buf[i] = r == root ? (int32_t)(i * 31 + (size_t)root) : -1;
        mcclOpOptions_t opts;
        memset(&opts, 0, sizeof(opts));
        opts.algorithm = balgos[a];
        skew(&rng);
        EXPECT_OK(comm, mcclBroadcast(buf, count, mcclInt32, root, comm, &opts, NULL));
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) bad += buf[i] != (int32_t)(i * 31 + (size_t)root);
        EXPECT(bad == 0, "broadcast n=%d root=%d count=%zu algo=%d: %zu wrong", n, root, count,
               (int)balgos[a], bad);
        harnessReport(harnessDigest(buf, count * 4));
        free(buf);
        if (n == 1) break;
      }

  /* All-gather, out of place and in place at every count (out of place, the ring copies the own
   * block into place a segment at a time while it waits on its links: 300000 floats are 5). */
  const size_t gcounts[] = {0, 1, 7919, quick ? 70000 : 300000};
  for (size_t c = 0; c < 2 * sizeof(gcounts) / sizeof(gcounts[0]); c++) {
    size_t count = gcounts[c / 2];
    float* out = malloc(count * (size_t)n * 4 + 4);
    float* in = malloc(count * 4 + 4);
    for (size_t i = 0; i < count; i++) in[i] = (float)(r * 1000 + (int)(i % 997));
    int in_place = (int)c % 2;
    if (in_place) memcpy(out + (size_t)r * count, in, count * 4);
    skew(&rng);
    EXPECT_OK(comm, mcclAllGather(in_place ? out + (size_t)r * count : in, out, count, mcclFloat32,
                                  comm, NULL, NULL));
    size_t bad = 0;
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < count; i++) bad += out[(size_t)q * count + i] != (float)(q * 1000 + (int)(i % 997));
    EXPECT(bad == 0, "allgather n=%d count=%zu in_place=%d: %zu wrong", n, count, in_place, bad);
    harnessReport(harnessDigest(out, count * (size_t)n * 4));
    free(out);
    free(in);
  }

  checkRootedAndAllToAll(comm, r, n, &rng);

  for (int b = 0; b < 3; b++) {
    skew(&rng);
    EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  }
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  /* The ranks all run here, where all-to-all would post every step at once: run the pairwise
   * schedule one step at a time instead, as across hosts (unless the caller chose a window). */
  setenv("MCCL_ALLTOALL_WINDOW", "1", 0);
  quick = getenv("MCCL_TEST_QUICK") != NULL && atoi(getenv("MCCL_TEST_QUICK")) != 0;
  const char* env_ranks = getenv("MCCL_TEST_MAX_RANKS");
  int max_ranks = argc > 1 ? atoi(argv[1]) : env_ranks != NULL ? atoi(env_ranks) : 9;
  for (int n = 1; n <= max_ranks; n++) {
    int before = harness_failures;
    harnessRunRanks(n, 300, rankMain, NULL);
    printf("collectives on %d rank%s: %s\n", n, n == 1 ? "" : "s", harness_failures == before ? "ok" : "FAILED");
    fflush(stdout);
  }
  return harnessExit("test_collectives");
}
