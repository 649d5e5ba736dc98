/*
 * engine.c: issue order, the progress engine, and requests.
 *
 * The calling thread stamps each collective with the communicator's next sequence number under
 * the queue lock; that number, carried in every frame, is the only thing that orders collectives
 * on the wire. The engine thread takes requests in exactly that order and runs each to completion
 * (or failure) before the next, so no thread scheduling can reorder buckets between ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/debug.h"
#include "device/handoff.h"
#include "reduce/reduce.h"

void mcclCommSetError(struct mcclComm* comm, mcclResult_t res, const char* msg) {
  pthread_mutex_lock(&comm->errlock);
  if (comm->async_error == mcclSuccess) {
    comm->async_error = res;
    snprintf(comm->error_msg, sizeof(comm->error_msg), "%s", msg);
    pthread_mutex_unlock(&comm->errlock);
    WARN("rank %d: communicator '%s' failed: %s", comm->rank, comm->name, msg);
    return;
  }
  pthread_mutex_unlock(&comm->errlock);
  INFO(MCCL_SUB_COLL, "rank %d: further error after failure: %s", comm->rank, msg);
}

void mcclRequestRelease(struct mcclRequest* req) {
  if (atomic_fetch_sub(&req->refs, 1) == 1) {
    free(req->v);
    pthread_mutex_destroy(&req->mu);
    pthread_cond_destroy(&req->cv);
    free(req);
  }
}

void mcclRequestFinish(struct mcclRequest* req, mcclResult_t res, const char* msg) {
  pthread_mutex_lock(&req->mu);
  req->result = res;
  snprintf(req->error, sizeof(req->error), "%s", res == mcclSuccess ? "" : msg);
  pthread_mutex_unlock(&req->mu);
  /* The consumer learns next (it may read mcclRequestError), and only then waiters: a caller
   * who sees `done` may free the handoff context. */
  mcclHandoffRelease(&req->handoff, res);
  pthread_mutex_lock(&req->mu);
  req->done = 1;
  pthread_cond_broadcast(&req->cv);
  pthread_mutex_unlock(&req->mu);
}

static mcclResult_t runAlgorithm(struct mcclComm* comm, const mcclOp* op) {
  switch (op->coll) {
    case MCCL_COLL_ALLREDUCE: return mcclAlgoAllReduce(&comm->algo, op);
    case MCCL_COLL_BROADCAST: return mcclAlgoBroadcast(&comm->algo, op);
    case MCCL_COLL_ALLGATHER: return mcclAlgoAllGather(&comm->algo, op);
    case MCCL_COLL_BARRIER: return mcclAlgoBarrier(&comm->algo, op);
    case MCCL_COLL_REDUCE: return mcclAlgoReduce(&comm->algo, op);
    case MCCL_COLL_REDUCE_SCATTER: return mcclAlgoReduceScatter(&comm->algo, op);
    case MCCL_COLL_GATHER: return mcclAlgoGather(&comm->algo, op);
    case MCCL_COLL_SCATTER: return mcclAlgoScatter(&comm->algo, op);
    case MCCL_COLL_ALLTOALL: return mcclAlgoAllToAll(&comm->algo, op);
    case MCCL_COLL_SEND:
    case MCCL_COLL_RECV: break; /* never queued here: p2p.c runs them */
  }
  snprintf(comm->tp.error, sizeof(comm->tp.error), "unknown collective kind %d", (int)op->coll);
  return mcclInternalError;
}

/* PREMUL_SUM: scale this rank's input once (after the producer finished writing it), then run the
 * collective as SUM. All-reduce scales into its output; reduce and reduce-scatter, whose input
 * must stay untouched, scale into a buffer of their own. */
static mcclResult_t runPremul(struct mcclComm* comm, struct mcclRequest* req) {
  mcclOp op = req->op;
  if (op.op != mcclPremulSum) return runAlgorithm(comm, &op);
  size_t n = op.count;
  if (op.coll == MCCL_COLL_REDUCE_SCATTER) n *= (size_t)comm->nranks;
  void* scaled = NULL;
  if (op.coll == MCCL_COLL_ALLREDUCE) {
    scaled = op.recvbuf;
  } else if (n > 0 && (scaled = malloc(n * mcclDataTypeSize(op.dtype))) == NULL) {
    snprintf(comm->tp.error, sizeof(comm->tp.error), "out of memory scaling a PREMUL_SUM input");
    return mcclSystemError;
  }
  mcclReduceScale(scaled, op.sendbuf, n, op.dtype, req->premul_factor);
  op.sendbuf = scaled;
  op.op = mcclSum;
  mcclResult_t res = runAlgorithm(comm, &op);
  if (scaled != op.recvbuf) free(scaled);
  return res;
}

/* A fatal error: record it, tell every peer and cut the connections (so that ranks blocked on
 * this one fail now instead of at their own deadline), and fail all point-to-point work. */
static void failCommunicator(struct mcclComm* comm, mcclResult_t res, const char* msg) {
  mcclCommSetError(comm, res, msg);
  mcclTransportFail(&comm->tp, msg);
  mcclP2pFailAll(comm, res, msg);
}

static void runRequest(struct mcclComm* comm, struct mcclRequest* req) {
  char msg[1024];
  pthread_mutex_lock(&comm->errlock);
  mcclResult_t failed = comm->async_error;
  if (failed != mcclSuccess)
    snprintf(msg, sizeof(msg), "%s #%llu not run: the communicator already failed: %s",
             mcclCollName(req->op.coll), (unsigned long long)req->op.seq, comm->error_msg);
  pthread_mutex_unlock(&comm->errlock);
  if (failed != mcclSuccess) {
    mcclRequestFinish(req, failed, msg);
    return;
  }
  int64_t start = mcclNowNs();
  req->op.deadline_ns = start + req->timeout_ms * 1000000LL;
  mcclResult_t res = mcclHandoffProducerWait(&req->handoff, req->timeout_ms);
  if (res != mcclSuccess) {
    snprintf(comm->tp.error, sizeof(comm->tp.error), "the producer of the buffers did not finish (%s)",
             mcclGetErrorString(res));
  } else {
    TRACE(MCCL_SUB_COLL, "rank %d: start %s #%llu count %zu %s", comm->rank,
          mcclCollName(req->op.coll), (unsigned long long)req->op.seq, req->op.count,
          mcclDtypeName(req->op.dtype));
    res = runPremul(comm, req);
  }
  if (res == mcclSuccess) {
    TRACE(MCCL_SUB_COLL, "rank %d: done %s #%llu in %.3f ms", comm->rank, mcclCollName(req->op.coll),
          (unsigned long long)req->op.seq, (double)(mcclNowNs() - start) / 1e6);
    mcclRequestFinish(req, mcclSuccess, "");
    return;
  }
  snprintf(msg, sizeof(msg), "rank %d: %s #%llu (count %zu %s) failed after %.0f ms (timeout %lld ms): %s",
           comm->rank, mcclCollName(req->op.coll), (unsigned long long)req->op.seq, req->op.count,
           mcclDtypeName(req->op.dtype), (double)(mcclNowNs() - start) / 1e6,
           (long long)req->timeout_ms, comm->tp.error);
  failCommunicator(comm, res, msg);
  mcclRequestFinish(req, res, msg);
}

static mcclResult_t submit(struct mcclComm* comm, const mcclOp* op, size_t* v,
                           const mcclOpOptions_t* options, mcclRequest_t* request);

/* How long destroy lets point-to-point work still in flight finish before failing it. */
#define MCCL_DESTROY_P2P_GRACE_MS 2000

void* mcclEngineMain(void* arg) {
  struct mcclComm* comm = arg;
  int64_t stop_deadline = 0;
  for (;;) {
    pthread_mutex_lock(&comm->qlock);
    while (comm->qhead == NULL && !comm->stopping && !mcclP2pBusy(comm))
      pthread_cond_wait(&comm->qcond, &comm->qlock);
    struct mcclRequest* req = comm->qhead;
    if (req != NULL) {
      comm->qhead = req->next;
      if (comm->qhead == NULL) comm->qtail = NULL;
    }
    int p2p = mcclP2pBusy(comm), stopping = comm->stopping;
    pthread_mutex_unlock(&comm->qlock);
    if (req != NULL) {
      runRequest(comm, req);
      mcclRequestRelease(req);
    } else if (p2p) {
      /* Destroy with sends or receives pending: a short grace for what is in flight, then they
       * fail rather than hold destroy up for their whole timeout. */
      if (stopping && stop_deadline == 0) stop_deadline = mcclNowNs() + MCCL_DESTROY_P2P_GRACE_MS * 1000000LL;
      if (stopping && mcclNowNs() > stop_deadline) {
        mcclP2pFailAll(comm, mcclInvalidUsage, "the communicator was destroyed while this send/recv was pending");
        continue;
      }
      /* Only point-to-point work: progress it (the round hook posts, retires and times out). */
      mcclResult_t res = mcclTransportProgress(&comm->tp, mcclNowNs() + 100 * 1000000LL, &comm->aborted);
      if (res == mcclSuccess && comm->tp.idle) mcclTransportIdleWait(&comm->tp, 100);
      if (res != mcclSuccess && res != mcclTimeout) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "rank %d: point-to-point traffic failed: %s", comm->rank, comm->tp.error);
        failCommunicator(comm, res, msg);
      }
    } else {
      break; /* stopping, and nothing is left */
    }
  }
  return NULL;
}

mcclResult_t mcclEngineSubmitV(struct mcclComm* comm, const mcclOp* op, const size_t* const arrays[4],
                               const mcclOpOptions_t* options, mcclRequest_t* request) {
  size_t n = (size_t)comm->nranks;
  size_t* v = malloc(4 * n * sizeof(size_t));
  if (v == NULL) {
    mcclSetThreadError("out of memory for all-to-allv counts");
    return mcclSystemError;
  }
  for (int k = 0; k < 4; k++) memcpy(v + (size_t)k * n, arrays[k], n * sizeof(size_t));
  return submit(comm, op, v, options, request);
}

mcclResult_t mcclEngineSubmit(struct mcclComm* comm, const mcclOp* op,
                              const mcclOpOptions_t* options, mcclRequest_t* request) {
  return submit(comm, op, NULL, options, request);
}

struct mcclRequest* mcclRequestNew(const mcclOp* op, const mcclOpOptions_t* options, int64_t default_timeout_ms) {
  struct mcclRequest* req = calloc(1, sizeof(*req));
  if (req == NULL) {
    mcclSetThreadError("out of memory for a request");
    return NULL;
  }
  atomic_init(&req->refs, 2); /* the caller's hold and the engine's */
  pthread_mutex_init(&req->mu, NULL);
  pthread_cond_init(&req->cv, NULL);
  req->op = *op;
  req->source = -1;
  req->timeout_ms = options && options->timeout_ms > 0 ? options->timeout_ms : default_timeout_ms;
  if (options && options->handoff) req->handoff = *options->handoff;
  if (options) {
    req->op.algorithm = options->algorithm;
    req->premul_factor = options->premul_factor;
  }
  return req;
}

/* Takes ownership of `v`. */
static mcclResult_t submit(struct mcclComm* comm, const mcclOp* op, size_t* v,
                           const mcclOpOptions_t* options, mcclRequest_t* request) {
  struct mcclRequest* req = mcclRequestNew(op, options, comm->timeout_ms);
  if (req == NULL) {
    free(v);
    return mcclSystemError;
  }
  req->v = v;
  req->op.v = v;

  pthread_mutex_lock(&comm->qlock);
  if (comm->stopping) {
    pthread_mutex_unlock(&comm->qlock);
    mcclRequestRelease(req);
    mcclRequestRelease(req);
    mcclSetThreadError("the communicator is being destroyed");
    return mcclInvalidUsage;
  }
  req->op.seq = comm->next_seq++;
  if (request != NULL) *request = req; /* before the engine can see it: a handoff may read it */
  if (comm->qtail) comm->qtail->next = req;
  else comm->qhead = req;
  comm->qtail = req;
  pthread_cond_signal(&comm->qcond);
  pthread_mutex_unlock(&comm->qlock);

  return request != NULL ? mcclSuccess : mcclRequestWaitAndFree(comm, req);
}

mcclResult_t mcclRequestWaitAndFree(struct mcclComm* comm, struct mcclRequest* req) {
  mcclResult_t res = mcclWait(req, -1);
  if (res != mcclSuccess) {
    pthread_mutex_lock(&comm->errlock);
    snprintf(comm->error_msg, sizeof(comm->error_msg), "%s", req->error);
    pthread_mutex_unlock(&comm->errlock);
  }
  mcclRequestFree(req);
  return res;
}

mcclResult_t mcclWait(mcclRequest_t req, int64_t timeout_ms) {
  if (req == NULL) return mcclInvalidArgument;
  pthread_mutex_lock(&req->mu);
  if (timeout_ms < 0) {
    while (!req->done) pthread_cond_wait(&req->cv, &req->mu);
  } else {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    while (!req->done)
      if (pthread_cond_timedwait(&req->cv, &req->mu, &until) != 0) break;
  }
  mcclResult_t res = req->done ? req->result : mcclInProgress;
  pthread_mutex_unlock(&req->mu);
  return res;
}

mcclResult_t mcclTest(mcclRequest_t req, int* done) {
  if (req == NULL || done == NULL) return mcclInvalidArgument;
  pthread_mutex_lock(&req->mu);
  *done = req->done;
  mcclResult_t res = req->done ? req->result : mcclSuccess;
  pthread_mutex_unlock(&req->mu);
  return res;
}

uint64_t mcclRequestSeq(mcclRequest_t req) { return req ? req->op.seq : 0; }

int mcclRequestSource(mcclRequest_t req) {
  if (req == NULL) return -1;
  pthread_mutex_lock(&req->mu);
  int src = req->done ? req->source : -1;
  pthread_mutex_unlock(&req->mu);
  return src;
}

const char* mcclRequestError(mcclRequest_t req) { return req ? req->error : ""; }

void mcclRequestFree(mcclRequest_t req) {
  if (req != NULL) mcclRequestRelease(req);
}
