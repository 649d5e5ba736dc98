/*
 * select.h: the one place where MCCL chooses how a collective runs (layer "algo"; issue 18).
 *
 * Every rank must make the same choice for the same collective, or their frames would not match
 * (the mismatch check then fails every rank, naming the difference): so the plan's kind depends
 * only on what every rank knows alike: the collective, its element count and type, the world
 * size, the per-call option (mcclOpOptions_t.algorithm), and parameters every rank of a job must
 * be given the same (MCCL_ALGO, MCCL_RING_THRESHOLD, MCCL_SEGMENT_BYTES, MCCL_ALPHA_BETA: init
 * compares every rank's values and fails every rank, naming the variable, when they differ:
 * core/comm.c, checkJobSettings). An all-to-all's window (steps in flight) is this rank's own
 * business (it changes no frame) and may differ: it follows the bytes this rank sends,
 * MCCL_ALLTOALL_WINDOW and single_host.
 *
 * The model behind the thresholds is Hockney's alpha-beta (docs/algorithms.md): a message of S
 * bytes costs alpha + S/beta; MCCL_ALPHA_BETA gives alpha x beta in bytes (default 32 KiB, switched
 * 10 GbE's; `python -m mccl.model fit` prints the value for a measured network: 379 KB for the
 * paper's 306 us x 1.238 GB/s). Rings are bandwidth-optimal (each rank moves 2(n-1)/n S for an
 * all-reduce; Patarasuk & Yuan 2009) but take 2(n-1) steps; recursive doubling and Bruck take
 * ceil(log2 n) rounds of larger messages (Thakur, Rabenseifner & Gropp 2005), so small messages
 * take them and large ones the ring, from MCCL_RING_THRESHOLD bytes (default 256 KiB). All-reduce
 * on 4 ranks or more in one topology group takes recursive halving-doubling (Rabenseifner: the
 * ring's bytes in 2 log2 p rounds) below the threshold where the model prices it below doubling,
 * and from the threshold up where the ring's chunks S/n are at most alpha x beta and the model
 * prices it below the ring (to 256 KiB on 8 ranks, 2 MiB on 64; select.c).
 */
#ifndef MCCL_SELECT_H_
#define MCCL_SELECT_H_

#include "algo/algo.h"

typedef enum {
  MCCL_PLAN_RING = 0,          /* pipelined ring: all-reduce (reduce-scatter + all-gather),
                                  all-gather, reduce-scatter, reduce (reduce-scatter + gather) */
  MCCL_PLAN_DOUBLING,          /* recursive doubling: all-reduce; reduce-scatter over a copy of
                                  the whole input */
  MCCL_PLAN_BRUCK,             /* all-gather in ceil(log2 n) rounds */
  MCCL_PLAN_CHAIN,             /* broadcast: a pipelined chain of segments */
  MCCL_PLAN_SCATTER_ALLGATHER, /* broadcast: scatter, then a Bruck all-gather (doubling.c) */
  MCCL_PLAN_TREE,              /* broadcast, reduce: a binomial tree */
  MCCL_PLAN_PAIRWISE,          /* all-to-all(v): pairwise exchange, `window` steps at a time */
  MCCL_PLAN_TWO_LEVEL,         /* all-reduce: reduce-scatter in each topology group, all-reduce
                                  across the groups, all-gather in each group (ring.c) */
  MCCL_PLAN_HALVING_DOUBLING,  /* all-reduce: reduce-scatter by recursive halving, all-gather by
                                  recursive doubling (Rabenseifner; doubling.c) */
  MCCL_PLAN_KINDS
} mcclPlanKind;

typedef struct {
  mcclPlanKind kind;
  int window; /* MCCL_PLAN_PAIRWISE: steps in flight (0: all n - 1) */
} mcclPlan;

/* How `op` (all-reduce, broadcast, all-gather, reduce-scatter, reduce or all-to-all: the
 * collectives with more than one algorithm; gather, scatter and barrier have one each) runs on
 * this communicator. Logs each (collective, plan) pair the first time the
 * communicator uses it, at INFO (subsystem COLL), with the reason. */
mcclPlan mcclAlgoSelect(mcclAlgoCtx* ctx, const mcclOp* op);

/* 1: the agreement that runs alongside early-writing algorithms (mcclAnnounceStart, algo.h)
 * sends to every rank, 0: it runs the dissemination pattern. All peers costs one hop and 2(n-1)
 * frames per rank, dissemination ceil(log2 n) hops and 2 ceil(log2 n) frames, so all peers is
 * the choice while n - 1 - ceil(log2 n) frames cost less than ceil(log2 n) - 1 hops: up to
 * MCCL_ANNOUNCE_RANKS ranks (default 16; bench/NOTES.md has the measurements). */
int mcclAlgoAnnounceAll(const mcclAlgoCtx* ctx);

/* The payload bytes per frame of a broadcast chain of `bytes` on this communicator. The chain's
 * last rank starts (n-2) segments after the first, so a broadcast of S bytes in segments of s
 * takes about (S + (n-2) s)/beta: the fill costs (n-2) s / S of the time, 37% for 4 MiB on 8
 * ranks in 256 KiB segments. The segment is S / (128 (n-2)) (a fill of under 1%), in multiples
 * of 4 KiB, between 64 KiB (smaller frames cost more CPU per byte) and MCCL_SEGMENT_BYTES;
 * MCCL_SEGMENT_BYTES on 2 ranks (no fill). Every rank computes the same value. Measured in
 * bench/NOTES.md (2026-12-06, third session). */
size_t mcclChainSegmentBytes(const mcclAlgoCtx* ctx, size_t bytes);

/* "ring", "doubling", ...: a plan's name, as MCCL_ALGO and the log spell it. */
const char* mcclPlanName(mcclPlanKind kind);

/* MCCL_ALGO=twolevel: an algorithm beyond the public mcclAlgorithm_t values (all-reduce only; the
 * other collectives run as with MCCL_ALGO=ring). MCCL_ALGO=halving is mcclAlgoHalvingDoubling. */
#define MCCL_ALGO_TWO_LEVEL ((mcclAlgorithm_t)4)

/* The collective's algorithm forced by MCCL_ALGO for the whole process (mcclAlgoAuto when unset):
 * "ring" is mcclAlgoRing, "tree" (or "doubling") mcclAlgoTree, "twolevel" MCCL_ALGO_TWO_LEVEL,
 * "halving" (or "halving-doubling") mcclAlgoHalvingDoubling (those two: all-reduce; the other
 * collectives take the ring), any case; another value is a warning and
 * changes nothing. A per-call option other than mcclAlgoAuto wins over it. Read once. */
mcclAlgorithm_t mcclAlgoForced(void);
/* MCCL_ALGO as this process uses it: "ring", "tree", "twolevel", "halving", or "auto" (unset or
 * not understood). */
const char* mcclAlgoForcedName(void);

#endif
