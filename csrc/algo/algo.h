/*
 * algo.h: collective algorithms over the transport (layer "algorithms").
 *
 * An algorithm turns one collective into frames posted on peer queues (transport/tcp.h), drives
 * the transport until they complete, and reduces what arrives (reduce/reduce.h). It never touches
 * sockets, never allocates per byte, and runs on its communicator's engine thread only.
 *
 * Bitwise agreement: ring algorithms reduce each chunk along one path and copy the result to every
 * rank; recursive doubling always evaluates (lower rank's operand) op (higher rank's operand), so
 * both partners compute the same bits; halving-doubling reduces each block on the one rank that
 * keeps it (the same operand order) and then copies it. Every rank ends with identical bytes.
 */
#ifndef MCCL_ALGO_H_
#define MCCL_ALGO_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mccl.h"
#include "transport/tcp.h"

/* One collective as the engine hands it to an algorithm. */
typedef struct mcclOp {
  mcclCollKind coll;
  uint64_t seq;            /* the communicator's sequence number, carried in every frame */
  const void* sendbuf;
  void* recvbuf;
  size_t count;            /* elements: allreduce/broadcast total, allgather per rank */
  mcclDataType_t dtype;
  mcclRedOp_t op;
  int root;
  mcclAlgorithm_t algorithm; /* mcclAlgoAuto: chosen by size */
  const size_t* v;         /* all-to-allv: sendcounts, sdispls, recvcounts, rdispls (4 x nranks) */
  int64_t deadline_ns;     /* mcclNowNs() clock */
  uint32_t site;           /* mcclOpOptions_t.call_site, carried in every frame */
} mcclOp;

/* What an algorithm may use. Owned by the engine thread. */
typedef struct mcclAlgoCtx {
  mcclTransport* tp;
  int rank, nranks;
  atomic_int* abort_flag;
  char* scratch;           /* staging for received operands; grown by mcclAlgoScratch */
  size_t scratch_bytes;
  char* work;              /* a collective's intermediate results (partial sums, rotated
                              blocks); grown by mcclAlgoWork, independent of `scratch` */
  size_t work_bytes;
  size_t segment_bytes;    /* MCCL_SEGMENT_BYTES: payload bytes per frame */
  int depth;               /* MCCL_PIPELINE_DEPTH: frames in flight per ring link */
  int relay;               /* MCCL_CHAIN_RELAY: the chain forwards bytes as they land */
  size_t ring_threshold;   /* MCCL_RING_THRESHOLD: bytes at which rings replace trees (all-reduce:
                              halving-doubling takes some sizes on either side, select.c) */
  size_t alpha_beta;       /* MCCL_ALPHA_BETA: the network's latency x bandwidth product
                              (Hockney's alpha x beta) in bytes: messages much smaller than this
                              are latency-bound. The choices that trade rounds for bytes compare
                              against it (select.c); default 32 KiB, switched 10 GbE's ~30 us x
                              ~1.1 GB/s */
  int alltoall_window;     /* MCCL_ALLTOALL_WINDOW: pairwise all-to-all steps in flight (0: all,
                              -1: chosen by single_host) */
  int single_host;         /* every rank on this machine (mcclTransportSingleHost) */
  int announce_ranks;      /* MCCL_ANNOUNCE_RANKS: the largest communicator whose agreement
                              alongside sends to every rank (mcclAlgoAnnounceAll) */
  unsigned plans_logged[16]; /* per collective kind: the plans (bits) already logged (select.c) */
  int* ring_order;         /* NULL: rings visit ranks in rank order; else [2 x nranks]: the rank at
                              each ring position, then each rank's position (core/topology.h) */
  int ngroups;             /* topology groups (>= 1); ring positions [k g, (k+1) g) are group k */
  int group_size;          /* g when every group has g ranks, else 0 (no two-level ring) */
} mcclAlgoCtx;

/* Ring order (core/topology.h): the rank at ring position `pos` (taken mod n), and rank r's
 * position; rank order when ctx->ring_order is NULL. */
int mcclRingRank(const mcclAlgoCtx* ctx, int pos);
int mcclRingPos(const mcclAlgoCtx* ctx, int r);

/* Scratch of at least `bytes`, or NULL when memory ran out (the caller reports it). A call may
 * move the buffer: pointers from an earlier call are invalid after it. mcclAlgoWork is the same
 * for the second buffer, so an algorithm can hold a work area while a callee grows scratch. */
char* mcclAlgoScratch(mcclAlgoCtx* ctx, size_t bytes);
char* mcclAlgoWork(mcclAlgoCtx* ctx, size_t bytes);

/* Report that `bytes` of intermediate results could not be allocated: mcclSystemError. */
mcclResult_t mcclAlgoOutOfMemory(mcclAlgoCtx* ctx, size_t bytes);

/* One side of a point-to-point exchange: `bytes` from/to `buf`, split into frames of at most
 * segment_bytes (one empty frame when bytes == 0), tagged with `step`. */
typedef struct {
  int peer;
  int is_send;
  char* buf;
  size_t bytes;
  size_t offset;           /* byte offset of buf in the collective's buffer, for the header */
  uint32_t step;
} mcclPeerIo;
/* Frames carry op->count, except all-to-all frames, which carry the pair's own element count
 * (ranks send different amounts to different peers). */

/* Post every io at once (sends and receives run concurrently) and progress until all finished. */
mcclResult_t mcclAlgoExchange(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* ios, int nios);

/* Outputs are written only once the collective is known to match on every rank.
 *
 * A rank that writes its output before every other rank's collective has been compared with its
 * own may corrupt it when a mismatch is found elsewhere (the caller then sees an error and a
 * half-written tensor). Every algorithm therefore writes user memory only after this rank has
 * checked, directly or through a chain of ranks each of which checked the previous one before
 * sending on, a frame header of every other rank (the headers carry kind, dtype, op, count, root
 * and sequence number, and the transport compares them with its own). Recursive doubling, Bruck's
 * all-gather, the ring reduce-scatter and the reduce tree have such chains by construction and
 * keep partial results in scratch until their last round; halving-doubling has them after its
 * halving rounds (a hypercube), keeps its partial results in scratch until then and writes the
 * output in its doubling rounds; the rest use one of these two: */

/* Agreement frames carry steps from here up (the wire's control steps); data frames use small
 * step numbers. */
#define MCCL_STEP_AGREE MCCL_STEP_CONTROL

/* For algorithms whose data are already in scratch: the dissemination pattern (Hensgen, Finkel
 * & Manber, 1988) with empty frames stamped with the op's header. In round k a rank sends to
 * r + 2^k and, once that round's frame from r - 2^k has arrived and matched, goes on to round k+1.
 * After ceil(log2 n) rounds every rank's header has reached every other rank through a chain of
 * checks: all ranks issued this collective. Posted after the data, so it never reorders a link. */
mcclResult_t mcclAgree(mcclAlgoCtx* ctx, const mcclOp* op);

/* For algorithms that write early (the rings, and the small broadcast tree whose leaves hear only
 * from their parent): an agreement run alongside the data, posted before any data so that every
 * link it uses carries it first on both ends. `done` once it completed: from then on this rank
 * may write its output. Two forms, chosen by mcclAlgoAnnounceAll (select.c), the same on every
 * rank:
 *  - all peers (communicators of up to MCCL_ANNOUNCE_RANKS ranks): one round in which every rank
 *    sends an empty frame with the op's header to every other rank and receives one from each.
 *    One hop of latency, 2(n-1) empty frames per rank, a connection to every rank;
 *  - dissemination (larger ones): mcclAgree's pattern in ring positions (position p sends to
 *    p + 2^k in round k), every round's frames posted at the start, round k's send gated on
 *    the receives of rounds 0..k-1 (mcclTransportPostAfter: it leaves once those frames arrived
 *    and matched): the chain of checks, without waiting in the algorithm. ceil(log2 n) hops,
 *    2 ceil(log2 n) frames per rank, connections to 2 ceil(log2 n) peers. A link that also
 *    carries data carries it behind the agreement; a point-to-point message posted meanwhile
 *    overtakes a gated frame (transport/tcp.c, p2pBehindGate).
 * `enabled` 0: done at once, nothing posted. */
typedef struct {
  mcclXfer* x;       /* n transfers: sends, then receives */
  int n, first_pending, done;
  int rounds;        /* dissemination: ceil(log2 n) rounds, x[k] round k's send, x[rounds + k]
                        its receive; 0: all peers */
} mcclAnnouncement;
mcclResult_t mcclAnnounceStart(mcclAlgoCtx* ctx, const mcclOp* op, mcclAnnouncement* a, int enabled);
void mcclAnnounceCheck(mcclAnnouncement* a);  /* after each progress round: updates `done` */
mcclResult_t mcclAnnounceWait(mcclAlgoCtx* ctx, const mcclOp* op, mcclAnnouncement* a); /* until done */
void mcclAnnounceEnd(mcclAnnouncement* a);    /* frees it (after done, or after an error) */

/* mcclAlgoExchange for patterns where this rank hears from every rank it receives from directly
 * (gather's root, all-to-all): each io is preceded by an empty announcement frame on its link.
 * This rank may write the ios' buffers once every announcement it expects has arrived and
 * matched. A receive posted before then puts its first two segments into scratch (copied in at
 * the end) and waits with the rest; receives posted later go straight into the ios' buffers.
 * Sends are not held back by announcements.
 * `confirm`: for exchanges whose headers differ per pair (all-to-allv: each pair's count), where
 * matching announcements on this rank's links say nothing of the other pairs: every link also
 * carries an empty confirmation, sent once the sender's own announcements all matched, and
 * this rank writes only once every peer's confirmation arrived (one more hop; data sends wait
 * for this rank's confirmations to go out).
 * Waves: ios with io->step == w form wave w; wave w is posted only once wave w - `window` has
 * completed (window <= 0: every wave at once). Both ends of a link must list its ios in the same
 * wave, since the step travels in the frame header. */
mcclResult_t mcclAlgoExchangeAnnounced(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* ios, int nios,
                                       int window, int confirm);

/* Fill the header fields every frame of `op` shares. */
void mcclAlgoFrame(const mcclOp* op, mcclFrame* f, uint32_t step, size_t offset, size_t length);

/* The collectives. Each returns mcclSuccess or the transport's error (message in ctx->tp->error). */
mcclResult_t mcclAlgoAllReduce(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoBroadcast(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoAllGather(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoBarrier(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoReduce(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoReduceScatter(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoGather(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoScatter(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclAlgoAllToAll(mcclAlgoCtx* ctx, const mcclOp* op);

/* Individual algorithms, exposed so tests and benchmarks can force one. */
mcclResult_t mcclRingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op);
/* The two-level ring (ctx->ngroups groups of ctx->group_size ranks, contiguous in ring order):
 * reduce-scatter inside each group, a ring all-reduce of each shard across the groups, all-gather
 * inside each group. ring.c explains it. */
mcclResult_t mcclTwoLevelAllReduce(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclDoublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op);
/* Recursive halving, then recursive doubling (Rabenseifner): 2 log2 p rounds moving 2 (p-1)/p of
 * the buffer, p the largest power of two <= n (doubling.c). */
mcclResult_t mcclHalvingDoublingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclDoublingAllReduceInScratch(mcclAlgoCtx* ctx, const mcclOp* op); /* recvbuf is ctx->work */
mcclResult_t mcclRingBroadcast(mcclAlgoCtx* ctx, const mcclOp* op);
mcclResult_t mcclRingReduceScatter(mcclAlgoCtx* ctx, const mcclOp* op, char* work);
mcclResult_t mcclRingReduce(mcclAlgoCtx* ctx, const mcclOp* op, char* work);
mcclResult_t mcclBruckAllGather(mcclAlgoCtx* ctx, const mcclOp* op);

/* A pipelined ring or chain schedule, run by mcclRingRun (ring.c).
 *
 * The buffer is cut into `nchunks` chunks (chunk_off/chunk_len, in elements) and every chunk into
 * the same number of segments, each one frame. At step t this rank sends chunk send_chunk[t] to
 * `send_peer` and receives chunk recv_chunk[t] from `recv_peer` (-1: none), either copying it into
 * recvbuf or reducing it into recvbuf (recv_mode). Segment j of the send at step t may leave only
 * after segment j of the receive at step t - lag has landed (lag 1 for rings, where a chunk is
 * forwarded one step after it arrived; lag 0 for a broadcast chain). Both links stream without a
 * barrier between steps: up to `depth` frames are in flight each way. */
enum { MCCL_RECV_COPY = 0, MCCL_RECV_REDUCE = 1, MCCL_RECV_REDUCE_FINAL = 2 };
typedef struct {
  int nsteps, nchunks, lag;
  int send_peer, recv_peer;
  const int* send_chunk;
  const int* recv_chunk;
  const uint8_t* recv_mode;
  const uint8_t* send_from_input; /* 1: read the send from op->sendbuf, 0: from the output */
  const size_t* chunk_off;
  const size_t* chunk_len;
  char* out;               /* where receives land and later sends read: op->recvbuf or scratch */
  char* final_out;         /* RECV_REDUCE_FINAL writes chunk c here at (chunk_off[c] - final_base)
                              elements, instead of into `out`; NULL: into `out` */
  size_t final_base;
  int announce;            /* run an mcclAnnouncement alongside and write `out` only once it is
                              done: until then every receive lands in staging and waits there */
  size_t in_base;          /* sends from op->sendbuf read element (chunk offset - in_base) */
  int reuse_lag;           /* > 0: the receive at step t overwrites what the send at step
                              t - reuse_lag read (the all-reduce's all-gather half lands on the
                              partial sums its reduce-scatter half sent), so segment j of that
                              receive is posted only once segment j of that send is complete:
                              a sender thread may still be reading it (the peer cannot answer
                              before the bytes left, but only `complete` orders the two threads) */
  uint32_t step_base;      /* frames of step t carry step_base + t (plans run one after another
                              in one collective number their steps apart) */
  const char* copy_src;    /* copy_bytes > 0: copy_src[0, copy_bytes) into copy_dst while the ring
                              waits on its links, a segment at a time, once the announcement is
                              done (the all-gather's own block; the regions must not overlap
                              anything the ring reads or writes) */
  char* copy_dst;
  size_t copy_bytes;
  size_t segment_bytes;    /* payload bytes per frame at most; 0: MCCL_SEGMENT_BYTES (the chain
                              broadcast's comes from mcclChainSegmentBytes, select.h) */
  int relay;               /* 1 (lag 0, copies only, each step sends the chunk it receives: the
                              chain): a send is posted with its receive and forwards that
                              receive's bytes as they land (mcclTransportPostRelay); 0: a send
                              waits until its segment has landed whole */
} mcclRingPlan;

mcclResult_t mcclRingRun(mcclAlgoCtx* ctx, const mcclOp* op, const mcclRingPlan* plan);

#endif
