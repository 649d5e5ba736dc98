/*
 * comm.h: the communicator and its requests (layer "core").
 *
 * Threading contract:
 *  - Caller threads issue requests: they validate arguments, take `qlock`, stamp the next
 *    sequence number and append to the queue. Nothing else of the communicator is theirs.
 *  - The engine thread (one per communicator) owns `tp` and `algo` and runs requests strictly
 *    in queue (= sequence) order, one at a time.
 *  - `aborted` is written by mcclCommAbort from any thread and read by the engine.
 *  - `async_error` / `error_msg` are written once (first error wins) under `errlock`.
 *  - After fork(), in the child, no thread of the communicator exists and its locks may be held
 *    forever: every call checks mcclCommInherited first and then touches nothing but the thread's
 *    error message (comm.c, "Fork").
 */
#ifndef MCCL_COMM_H_
#define MCCL_COMM_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "algo/algo.h"
#include "mccl.h"
#include "transport/tcp.h"

struct mcclRequest {
  atomic_int refs;                /* the caller's hold + the engine's hold */
  atomic_int finished;            /* mcclRequestFinish ran (it runs once: the handoff's release) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;                       /* under mu */
  mcclResult_t result;            /* valid once done */
  char error[1024];               /* valid once done */
  mcclOp op;                      /* seq, buffers, sizes */
  size_t* v;                      /* all-to-allv arrays (4 x nranks), owned; op.v points here */
  double premul_factor;           /* mcclPremulSum */
  int64_t timeout_ms;
  mcclHandoff_t handoff;
  struct mcclRequest* next;       /* queue link, under the communicator's qlock */
  /* Collective run order (engine.c), under the communicator's qlock. */
  struct mcclComm* comm;
  int ordered;                    /* a collective (not point-to-point) */
  int state;                      /* MCCL_REQ_QUEUED, MCCL_REQ_OPEN or MCCL_REQ_RETIRED */
  int held, sealed;               /* mcclRequestHold / mcclRequestSeal */
  int marker;                     /* mcclOrderMarker: nothing to run, no sequence number */
  uint64_t marker_after;          /* a marker: collectives that ran before it (for messages) */
  struct mcclRequest* follows;    /* the request this one follows up, at issue */
  struct mcclRequest *kids_head, *kids_tail; /* follow-ups waiting to run */
  struct mcclRequest* below;      /* the next open request down the stack */
  int64_t ran_ns;                 /* when it finished running (the hold's timeout counts from it) */
  /* Point-to-point only (p2p.c), engine-owned once posted. */
  int peer, tag;                  /* peer may be MCCL_ANY_SOURCE for a receive */
  int source;                     /* the sender of a finished receive, else -1 */
  size_t bytes, landed;
  mcclXfer* xfers;                /* a send's frames */
  int nxfers;
  int64_t deadline_ns;
};

enum { MCCL_REQ_QUEUED = 0, MCCL_REQ_OPEN = 1, MCCL_REQ_RETIRED = 2 };

struct mcclP2pState;

void mcclCommRelease(struct mcclComm* comm);

/* Record an argument error for mcclGetLastError(comm) (unless the communicator already failed)
 * and for the thread; returns `res`. collectives.c. */
mcclResult_t mcclArgError(struct mcclComm* comm, mcclResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Element counts and offsets must address memory: `blocks` blocks of `count` elements of `esz`
 * bytes fit in PTRDIFF_MAX bytes (this also rejects negative values cast to size_t). */
static inline int mcclCountFits(size_t count, size_t esz, size_t blocks) {
  return count <= (size_t)PTRDIFF_MAX / esz / blocks;
}

struct mcclComm {
  int rank, nranks;
  char name[128];  /* part of every store key */
  char label[128]; /* how messages name it: config.label, else the name */
  uint64_t generation;
  int64_t timeout_ms;

  /* Engine-owned. */
  mcclTransport tp;
  mcclAlgoCtx algo;
  void* premul;         /* PREMUL_SUM's scaled input (engine.c, runPremul), grown as needed */
  size_t premul_bytes;

  /* Issue queue. */
  pthread_mutex_t qlock;
  pthread_cond_t qcond;
  struct mcclRequest *qhead, *qtail; /* top-level collectives in issue order */
  struct mcclRequest* open;       /* requests that ran and may still get follow-ups (a stack) */
  uint64_t next_seq;              /* run order, stamped when the engine takes a collective */
  uint64_t next_p2p;              /* numbers point-to-point requests (their own sequence) */
  int stopping;                   /* destroy: finish the queue, then exit */
  int idle_reading;               /* the idle engine waits in mcclTransportReadAhead, not on qcond:
                                     whoever signals qcond also wakes the transport (qlock held) */
  pthread_t engine;
  int engine_started;

  atomic_int aborted;
  atomic_int refs;                /* the owner + every live collective request */

  /* Point-to-point: submitted under qlock, then matched and progressed by the engine (p2p.c). */
  struct mcclRequest *p2p_new_head, *p2p_new_tail;
  struct mcclP2pState* p2p;

  pthread_mutex_t errlock;
  mcclResult_t async_error;
  char error_msg[1024];           /* the first fatal error, or the last argument error */

  /* Fork (comm.c): written at init, before the communicator is returned; read-only after. */
  unsigned forks;                 /* the process's fork count at creation (see mcclCommInherited) */
  long owner_pid;                 /* the creating process, named in the error of a child's call */
  struct mcclComm *live_prev, *live_next; /* the list of live communicators, under its lock */
};

/* 1 when `comm` was created by another process: this one is a child of fork() that inherited it
 * (an atomic load, no lock). Every public call on the communicator or its requests must then
 * return mcclCommForkError at once, touching none of its locks, threads or sockets. */
int mcclCommInherited(const struct mcclComm* comm);

/* The error of call `fn` on an inherited communicator: writes the thread's last error (it was
 * created in process P and cannot be used after fork() in this one) and returns
 * mcclInvalidUsage. Takes no lock. */
mcclResult_t mcclCommForkError(const struct mcclComm* comm, const char* fn);

/* Record the communicator's first fatal error (later ones are logged only). */
void mcclCommSetError(struct mcclComm* comm, mcclResult_t res, const char* msg);

/* Requests (engine.c): finish (consumer release, then waiters) and drop one hold. */
void mcclRequestFinish(struct mcclRequest* req, mcclResult_t res, const char* msg);
void mcclRequestRelease(struct mcclRequest* req);
/* For a blocking call: wait for `req`, copy its error into the communicator's last error, free it. */
mcclResult_t mcclRequestWaitAndFree(struct mcclComm* comm, struct mcclRequest* req);
struct mcclRequest* mcclRequestNew(const mcclOp* op, const mcclOpOptions_t* options, int64_t default_timeout_ms);

/* Point-to-point (p2p.c). Init installs the transport hooks; Submit runs on caller threads; the
 * rest on the engine thread. FailAll finishes every point-to-point request with `res`. */
mcclResult_t mcclP2pInit(struct mcclComm* comm);
void mcclP2pFree(struct mcclComm* comm);
void mcclP2pSubmit(struct mcclComm* comm, struct mcclRequest* req);
int mcclP2pBusy(struct mcclComm* comm); /* engine thread, under qlock */
/* 1 while a submitted send or receive waits for its producer (device work writing its buffer). */
int mcclP2pWaiting(struct mcclComm* comm);
/* 1 once a send or receive passed its deadline with its message partly on the wire: the progress
 * round that found it returned mcclTimeout, and the communicator must fail. */
int mcclP2pStalled(struct mcclComm* comm);
void mcclP2pFailAll(struct mcclComm* comm, mcclResult_t res, const char* msg);

/* Engine thread entry and request submission (engine.c). */
void* mcclEngineMain(void* arg);
mcclResult_t mcclEngineSubmit(struct mcclComm* comm, const mcclOp* op,
                              const mcclOpOptions_t* options, mcclRequest_t* request);
/* The same, for all-to-allv: copies the four nranks-long arrays into the request. */
mcclResult_t mcclEngineSubmitV(struct mcclComm* comm, const mcclOp* op, const size_t* const arrays[4],
                               const mcclOpOptions_t* options, mcclRequest_t* request);

#endif
