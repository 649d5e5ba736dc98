/*
 * trace.h: a segment-level timeline of one communicator, written as a Chrome / Perfetto trace
 * (layer "core"; issue 17). Off unless MCCL_TRACE=<path prefix> is set: then every communicator
 * records, in memory, what its engine and each of its peer links did, and writes
 * <prefix>.<label>.rank<r>.json when it is destroyed or aborted (or at process exit, for one still
 * alive). Open it in ui.perfetto.dev or chrome://tracing, or summarise it with
 * `python -m mccl.trace summary <files>`.
 *
 * Tracks (Chrome "threads" of process <rank>): tid 0 is the engine (one span per collective, and
 * the reductions and copies it made); tid 1 + 2p is "send to rank p", tid 2 + 2p "recv from rank
 * p" (a link is full duplex: each direction has a track of its own so that its spans never
 * overlap). Events, each a complete ("X") span with its frame in `args` (collective, seq, step,
 * offset, bytes):
 *   send         first byte written .. last byte written of one frame;
 *   send-queued  posted .. first byte written (behind earlier frames, or the socket was full);
 *   window       the socket refused a write (full: the peer's TCP window) .. it took bytes again;
 *   recv         first byte read .. last byte read of one posted receive;
 *   recv-wait    posted .. first byte read (nothing from that peer yet);
 *   reduce, copy on the engine track, with their bytes;
 *   <collective> #seq on the engine track, from run to completion (args: count, dtype, result).
 * Timestamps are mcclNowNs (CLOCK_MONOTONIC) in microseconds; ranks on one machine share the clock.
 *
 * Cost: off, each instrumented point tests one pointer. On, each event takes the clock once or
 * twice and a mutex (segments are 256 KiB by default, so tens of thousands of events a second at
 * line rate). At most MCCL_TRACE_EVENTS events are kept per communicator (the rest are counted and
 * the count written in the trace's metadata), 64 bytes each.
 *
 * Thread safety: mcclTraceSpan may be called from any thread (the engine and the sender thread
 * both record); mcclTraceOpen/Close from the communicator's owner.
 */
#ifndef MCCL_TRACE_H_
#define MCCL_TRACE_H_

#include <stddef.h>
#include <stdint.h>

typedef struct mcclTrace mcclTrace;

typedef enum {
  MCCL_TRACE_SEND = 0,
  MCCL_TRACE_SEND_QUEUED,
  MCCL_TRACE_WINDOW,
  MCCL_TRACE_RECV,
  MCCL_TRACE_RECV_WAIT,
  MCCL_TRACE_REDUCE,
  MCCL_TRACE_COPY,
  MCCL_TRACE_COLLECTIVE,
  MCCL_TRACE_PARK,         /* a collective frame's bytes arriving into the park (transport/park.h) */
  MCCL_TRACE_CREDIT,       /* a collective frame waiting for the receiver's credit (park.h) */
  MCCL_TRACE_REPORT,       /* instant, on a receive track: a credit report posted to that peer
                              (bytes: the total its receives took; coll/seq: the last frame's) */
  MCCL_TRACE_GRANT,        /* instant, on a send track: that peer's report arrived (bytes: its
                              total; coll/seq are not on the wire: 0) */
  MCCL_TRACE_KINDS
} mcclTraceKind;

/* What a span was about: a frame's header fields, or a collective's. */
typedef struct {
  uint8_t coll;     /* mcclCollKind (transport/wire.h) */
  uint8_t dtype;    /* collectives: mcclDataType_t */
  uint8_t failed;   /* collectives: 1 when it did not succeed */
  uint32_t step;    /* frames: the algorithm's step */
  uint64_t seq;     /* the collective's sequence number */
  uint64_t offset;  /* frames: byte offset in the collective's buffer */
  uint64_t bytes;   /* payload bytes (collectives: elements) */
} mcclTraceArgs;

/* A recorder for rank `rank` of `nranks` of communicator `label`, or NULL when MCCL_TRACE is unset
 * (or memory ran out: logged). */
mcclTrace* mcclTraceOpen(int rank, int nranks, const char* label);

/* Record one span on track `track` (0: engine; mcclTraceSendTrack / mcclTraceRecvTrack) from
 * start_ns to end_ns (mcclNowNs clock). A NULL trace, or end_ns < start_ns, records nothing. */
void mcclTraceSpan(mcclTrace* tr, int track, mcclTraceKind kind, int64_t start_ns, int64_t end_ns,
                   const mcclTraceArgs* args);

static inline int mcclTraceSendTrack(int peer) { return 1 + 2 * peer; }
static inline int mcclTraceRecvTrack(int peer) { return 2 + 2 * peer; }

/* Write the trace file (logged at INFO with its path; a failure is a WARN) and free the recorder.
 * NULL: a no-op. */
void mcclTraceClose(mcclTrace* tr);

/* Write every trace still open (at process exit). */
void mcclTraceFlushAll(void);

/* In a child of fork(): forget the parent's recorders (the parent writes them; the child's copies
 * are left as they are, their locks perhaps held by threads the child does not have). */
void mcclTraceAfterFork(void);

#endif
