/*
 * engine.c: issue order, the progress engine, and requests.
 *
 * Collectives run one at a time, in an order that is the same on every rank: issue order, with
 * follow-ups (mcclOpOptions_t.follows, include/mccl.h "Issue order") run right after the held
 * request they follow. The engine stamps each collective with the next sequence number when it
 * takes it; that number, carried in every frame, is what peers check to know they run the same
 * collective. So no thread scheduling can reorder buckets between ranks.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/debug.h"
#include "core/param.h"
#include "core/trace.h"
#include "device/handoff.h"
#include "reduce/reduce.h"

void mcclCommSetError(struct mcclComm* comm, mcclResult_t res, const char* msg) {
  pthread_mutex_lock(&comm->errlock);
  if (comm->async_error == mcclSuccess) {
    comm->async_error = res;
    snprintf(comm->error_msg, sizeof(comm->error_msg), "%s", msg);
    pthread_mutex_unlock(&comm->errlock);
    WARN("rank %d: communicator '%s' failed: %s", comm->rank, comm->label, msg);
    return;
  }
  pthread_mutex_unlock(&comm->errlock);
  INFO(MCCL_SUB_COLL, "rank %d: further error after failure: %s", comm->rank, msg);
}

void mcclRequestRelease(struct mcclRequest* req) {
  if (atomic_fetch_sub(&req->refs, 1) == 1) {
    if (req->comm != NULL) mcclCommRelease(req->comm);
    free(req->v);
    pthread_mutex_destroy(&req->mu);
    pthread_cond_destroy(&req->cv);
    free(req);
  }
}

void mcclRequestFinish(struct mcclRequest* req, mcclResult_t res, const char* msg) {
  if (atomic_exchange(&req->finished, 1)) {
    WARN("internal error: a request was finished twice (second result %s); ignored", mcclGetErrorString(res));
    return;
  }
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
  /* A collective of no elements moves nothing, but on several ranks it still checks that every
   * rank issued it (the announcements, algo.h): a rank that issues 0 elements where the others
   * issue more then fails with the mismatch as they do, instead of returning at once while they
   * time out naming it (or mismatch on its next collective). Up to MCCL_ANNOUNCE_RANKS ranks it
   * hears from and sends to every rank, so every rank it may block learns of the mismatch at
   * once. All-to-allv's counts are per pair (op->v): it runs as it is. */
  if (op->count == 0 && op->v == NULL && op->coll != MCCL_COLL_BARRIER && comm->nranks > 1) {
    mcclAnnouncement ann;
    MCCLCHECK(mcclAnnounceStart(&comm->algo, op, &ann, 1));
    mcclResult_t res = mcclAnnounceWait(&comm->algo, op, &ann);
    mcclAnnounceEnd(&ann);
    return res;
  }
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
 * collective as SUM. The scaled copy goes into a buffer of the communicator's own (kept for the
 * next one), never into the output or the input: a collective that fails (a mismatch found on
 * another rank) must leave both as they were (algo.h, "Outputs are written only once..."). */
static mcclResult_t runPremul(struct mcclComm* comm, struct mcclRequest* req) {
  mcclOp op = req->op;
  if (op.op != mcclPremulSum) return runAlgorithm(comm, &op);
  size_t n = op.count;
  if (op.coll == MCCL_COLL_REDUCE_SCATTER) n *= (size_t)comm->nranks;
  const size_t bytes = n * mcclDataTypeSize(op.dtype);
  op.op = mcclSum;
  if (bytes == 0) return runAlgorithm(comm, &op);
  if (bytes > comm->premul_bytes) { /* grown to the largest so far (nothing in it to keep) */
    free(comm->premul);
    comm->premul_bytes = 0;
    if ((comm->premul = malloc(bytes)) == NULL) {
      snprintf(comm->tp.error, sizeof(comm->tp.error), "out of memory scaling a PREMUL_SUM input (%zu bytes)", bytes);
      return mcclSystemError;
    }
    comm->premul_bytes = bytes;
  }
  mcclReduceScale(comm->premul, op.sendbuf, n, op.dtype, req->premul_factor);
  op.sendbuf = comm->premul;
  return runAlgorithm(comm, &op);
}

/* A fatal error: tell every peer and cut the connections (so that ranks blocked on this one fail
 * now instead of at their own deadline), record it, and fail all point-to-point work. While the
 * transport lingers it learns which peers stayed silent; naming them in `msg` (of size `cap`)
 * points at a stalled rank when the timeout blamed a neighbour that was only waiting too. */
static void failCommunicator(struct mcclComm* comm, mcclResult_t res, char* msg, size_t cap) {
  mcclTransportFail(&comm->tp, msg);
  size_t len = strlen(msg);
  if (comm->tp.silent[0] != '\0' && len + 1 < cap)
    snprintf(msg + len, cap - len, " [while every other rank reported this failure or closed, %s sent "
             "nothing in the %d ms this rank listened: stalled or stopped, or is the link slow?]",
             comm->tp.silent, comm->tp.silent_ms);
  mcclCommSetError(comm, res, msg);
  mcclP2pFailAll(comm, res, msg);
}

/* O1 without blocking the engine on a device: until the device work that writes `req`'s buffers
 * has finished (its producer timeline reached the request's value), keep point-to-point traffic
 * moving, and otherwise sleep on the timeline in slices of at most 200 us. A producer that is not
 * done by the request's deadline, a failed producer timeline, or an abort ends the wait with an
 * error in comm->tp.error; so does a point-to-point failure meanwhile. */
static mcclResult_t awaitProducer(struct mcclComm* comm, struct mcclRequest* req) {
  const mcclHandoff_t* h = &req->handoff;
  mcclResult_t res = mcclHandoffProducerPoll(h);
  while (res == mcclInProgress) {
    int64_t now = mcclNowNs(), until = now + 200 * 1000;
    if (atomic_load(&comm->aborted)) {
      snprintf(comm->tp.error, sizeof(comm->tp.error), "aborted while waiting for the producer of the buffers");
      return mcclAborted;
    }
    if (now >= req->op.deadline_ns) {
      snprintf(comm->tp.error, sizeof(comm->tp.error),
               "the device work that writes the buffers (producer value %llu) had not finished when the "
               "timeout passed", (unsigned long long)h->producer_value);
      return mcclTimeout;
    }
    if (until > req->op.deadline_ns) until = req->op.deadline_ns;
    pthread_mutex_lock(&comm->qlock); /* callers append point-to-point work under it */
    int p2p = mcclP2pBusy(comm);
    pthread_mutex_unlock(&comm->qlock);
    if (p2p) {
      mcclResult_t p = mcclTransportProgress(&comm->tp, until, &comm->aborted);
      if (p != mcclSuccess && (p != mcclTimeout || mcclP2pStalled(comm))) return p;
    } else {
      mcclTimelineWaitUntil(h->producer, h->producer_value, until, 200 * 1000);
    }
    res = mcclHandoffProducerPoll(h);
  }
  if (res != mcclSuccess)
    snprintf(comm->tp.error, sizeof(comm->tp.error), "the device work that writes the buffers failed (%s)",
             mcclGetErrorString(res));
  return res;
}

static void runRequest(struct mcclComm* comm, struct mcclRequest* req) {
  char msg[1024];
  if (req->marker) { /* an order marker: its place in the run order is all there is to it */
    mcclRequestFinish(req, mcclSuccess, "");
    return;
  }
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
  mcclResult_t res = awaitProducer(comm, req);
  if (res == mcclSuccess) {
    TRACE(MCCL_SUB_COLL, "rank %d: start %s #%llu count %zu %s", comm->rank,
          mcclCollName(req->op.coll), (unsigned long long)req->op.seq, req->op.count,
          mcclDtypeName(req->op.dtype));
    /* Around the collective alone: its wall and CPU time drive the sender thread's load rule. */
    size_t bytes = req->op.count; /* elements: the buffer, or all-to-all's largest block sent */
    if (req->op.coll == MCCL_COLL_ALLGATHER || req->op.coll == MCCL_COLL_REDUCE_SCATTER) bytes *= (size_t)comm->nranks;
    if (req->op.v != NULL)
      for (int p = 0; p < comm->nranks; p++) bytes = req->op.v[p] > bytes ? req->op.v[p] : bytes;
    bytes *= mcclDataTypeSize(req->op.dtype);
    mcclOp as_run = req->op; /* the header fields of its frames (runPremul runs PREMUL_SUM as a sum) */
    if (as_run.op == mcclPremulSum) as_run.op = mcclSum;
    mcclFrame id;
    mcclAlgoFrame(&as_run, &id, 0, 0, 0);
    res = mcclTransportCollectiveBegin(&comm->tp, &id, bytes, req->op.coll == MCCL_COLL_ALLTOALL);
    if (res == mcclSuccess) res = runPremul(comm, req);
    mcclTransportCollectiveEnd(&comm->tp, res);
  }
  /* Consistent failure: a peer whose notice that it failed this collective is already here makes
   * it fail here too, instead of succeeding on this rank alone (mcclTransportSettle, tcp.h). */
  if (res == mcclSuccess) res = mcclTransportSettle(&comm->tp, req->op.seq);
  if (comm->tp.trace) {
    mcclTraceArgs a = {.coll = (uint8_t)req->op.coll, .dtype = (uint8_t)req->op.dtype,
                       .failed = res != mcclSuccess, .seq = req->op.seq, .bytes = req->op.count};
    mcclTraceSpan(comm->tp.trace, 0, MCCL_TRACE_COLLECTIVE, start, mcclNowNs(), &a);
  }
  if (res == mcclSuccess) {
    TRACE(MCCL_SUB_COLL, "rank %d: done %s #%llu in %.3f ms", comm->rank, mcclCollName(req->op.coll),
          (unsigned long long)req->op.seq, (double)(mcclNowNs() - start) / 1e6);
    mcclRequestFinish(req, mcclSuccess, "");
    return;
  }
  /* All-to-allv has no one count: name it, with the elements this rank sends. */
  size_t count = req->op.count;
  if (req->op.v != NULL) {
    count = 0;
    for (int p = 0; p < comm->nranks; p++) count += req->op.v[p];
  }
  snprintf(msg, sizeof(msg), "rank %d: %s%s #%llu (%s%zu %s) failed after %.0f ms (timeout %lld ms): %s",
           comm->rank, mcclCollName(req->op.coll), req->op.v ? "v" : "", (unsigned long long)req->op.seq,
           req->op.v ? "sends " : "count ", count, mcclDtypeName(req->op.dtype),
           (double)(mcclNowNs() - start) / 1e6, (long long)req->timeout_ms, comm->tp.error);
  failCommunicator(comm, res, msg, sizeof(msg));
  mcclRequestFinish(req, res, msg);
}

static mcclResult_t submit(struct mcclComm* comm, const mcclOp* op, size_t* v,
                           const mcclOpOptions_t* options, mcclRequest_t* request, int marker);

/* How long destroy lets point-to-point work still in flight finish before failing it. */
#define MCCL_DESTROY_P2P_GRACE_MS 2000

static int commFailed(struct mcclComm* comm) {
  pthread_mutex_lock(&comm->errlock);
  int failed = comm->async_error != mcclSuccess;
  pthread_mutex_unlock(&comm->errlock);
  return failed;
}

enum { NEXT_RUN, NEXT_IDLE, NEXT_BLOCKED };

/* Under qlock: the next collective in run order. Walks down the stack of open requests: an open
 * request's waiting follow-ups run first; a held, unsealed one blocks everything after it (until
 * `*blocked_until`, its hold's deadline, if anything waits); sealed or unheld ones retire. Then
 * the top-level queue. Once the communicator failed, holds are ignored: every request fails at
 * once whatever its order. */
static int nextRequest(struct mcclComm* comm, int failed, struct mcclRequest** out,
                       struct mcclRequest** blocker) {
  *out = NULL;
  while (comm->open != NULL) {
    struct mcclRequest* top = comm->open;
    if (top->kids_head != NULL) {
      *out = top->kids_head;
      top->kids_head = (*out)->next;
      if (top->kids_head == NULL) top->kids_tail = NULL;
      return NEXT_RUN;
    }
    if (top->held && !top->sealed && !failed) {
      int waiting = comm->qhead != NULL;
      for (struct mcclRequest* r = top->below; r != NULL && !waiting; r = r->below) waiting = r->kids_head != NULL;
      *blocker = top;
      return waiting ? NEXT_BLOCKED : NEXT_IDLE;
    }
    comm->open = top->below;
    top->state = MCCL_REQ_RETIRED;
    mcclRequestRelease(top); /* the engine's hold */
  }
  if (comm->qhead == NULL) return NEXT_IDLE;
  *out = comm->qhead;
  comm->qhead = (*out)->next;
  if (comm->qhead == NULL) comm->qtail = NULL;
  return NEXT_RUN;
}

void* mcclEngineMain(void* arg) {
  struct mcclComm* comm = arg;
  mcclThreadSetName("mccl-engine"); /* benchmarks find its CPU time by this name */
  int64_t stop_deadline = 0;
  int nothing_to_read = 0; /* the last idle read-ahead found no connection to read */
  for (;;) {
    struct mcclRequest *req = NULL, *blocker = NULL;
    int failed = commFailed(comm);
    pthread_mutex_lock(&comm->qlock);
    int next, expired = 0;
    for (;;) {
      next = nextRequest(comm, failed, &req, &blocker);
      int64_t until = next == NEXT_BLOCKED ? blocker->ran_ns + blocker->timeout_ms * 1000000LL : 0;
      if (next == NEXT_BLOCKED && mcclNowNs() >= until) expired = 1;
      if (next == NEXT_RUN || expired || mcclP2pBusy(comm) || (comm->stopping && next == NEXT_IDLE)) break;
      if (next == NEXT_IDLE) {
        /* Nothing to run: read what peers already send for the next collective into the parks
         * (mcclTransportReadAhead), waking for new work through the transport's pipe; once no
         * park can take more, sleep on the queue alone (TCP's window then holds the peers). */
        if (!failed && !comm->stopping && !nothing_to_read && mcclParamInt("MCCL_IDLE_READ")) {
          int polled = 0;
          comm->idle_reading = 1;
          pthread_mutex_unlock(&comm->qlock);
          mcclResult_t res = mcclTransportReadAhead(&comm->tp, 100, &polled);
          pthread_mutex_lock(&comm->qlock);
          comm->idle_reading = 0;
          if (res != mcclSuccess) {
            char msg[1024];
            snprintf(msg, sizeof(msg), "rank %d: reading ahead between collectives: %s", comm->rank, comm->tp.error);
            pthread_mutex_unlock(&comm->qlock);
            failCommunicator(comm, res, msg, sizeof(msg));
            pthread_mutex_lock(&comm->qlock);
            failed = 1;
            continue;
          }
          /* Look at the queue again either way (under the lock): work submitted while it was
           * unlocked signalled a condition nobody waited on. With nothing to read, the next
           * idle pass sleeps on the queue until woken. */
          nothing_to_read = !polled;
          continue;
        }
        pthread_cond_wait(&comm->qcond, &comm->qlock);
        nothing_to_read = 0;
        continue;
      }
      int64_t now = mcclNowNs();
      int64_t wake = now + 100 * 1000000LL; /* also notice failures */
      mcclCondWaitUntil(&comm->qcond, &comm->qlock, until < wake ? until : wake);
      if (commFailed(comm)) failed = 1;
    }
    if (next == NEXT_RUN && !req->marker) req->op.seq = comm->next_seq++;
    if (next == NEXT_RUN && req->marker) req->marker_after = comm->next_seq;
    int p2p = mcclP2pBusy(comm), stopping = comm->stopping;
    pthread_mutex_unlock(&comm->qlock);
    if (next == NEXT_RUN) {
      runRequest(comm, req);
      nothing_to_read = 0; /* its receives drained the parks and reset the read-ahead stops */
      /* It stays open for follow-ups until the next nextRequest() passes it. */
      pthread_mutex_lock(&comm->qlock);
      req->state = MCCL_REQ_OPEN;
      req->ran_ns = mcclNowNs();
      req->below = comm->open;
      comm->open = req;
      pthread_mutex_unlock(&comm->qlock);
    } else if (expired && blocker->marker) {
      char msg[1024], where[64] = "before any collective";
      if (blocker->marker_after > 0)
        snprintf(where, sizeof(where), "after collective #%llu", (unsigned long long)blocker->marker_after - 1);
      snprintf(msg, sizeof(msg),
               "rank %d: a completion callback attached %s did not return within the timeout of "
               "%lld ms, and collectives issued after it wait for it (a callback's collectives run "
               "where it was attached, so a callback that waits for a collective issued after that "
               "point can never finish)", comm->rank, where, (long long)blocker->timeout_ms);
      failCommunicator(comm, mcclTimeout, msg, sizeof(msg));
    } else if (expired) {
      char msg[1024];
      snprintf(msg, sizeof(msg),
               "rank %d: the completion callbacks of %s #%llu did not return within its timeout of "
               "%lld ms, and collectives issued after it wait for them (a callback's collectives "
               "run right after the one it follows, so a callback that waits for a later "
               "collective can never finish)", comm->rank, mcclCollName(blocker->op.coll),
               (unsigned long long)blocker->op.seq, (long long)blocker->timeout_ms);
      failCommunicator(comm, mcclTimeout, msg, sizeof(msg));
    } else if (p2p) {
      /* Destroy with sends or receives pending: a short grace for what is in flight, then they
       * fail rather than hold destroy up for their whole timeout. */
      if (stopping && stop_deadline == 0) stop_deadline = mcclNowNs() + MCCL_DESTROY_P2P_GRACE_MS * 1000000LL;
      if (stopping && mcclNowNs() > stop_deadline) {
        mcclTransportStopSender(&comm->tp); /* failed sends' buffers go back to their owners */
        mcclP2pFailAll(comm, mcclInvalidUsage, "the communicator was destroyed while this send/recv was pending");
        continue;
      }
      /* Only point-to-point work: progress it (the round hook posts, retires and times out). */
      mcclResult_t res = mcclTransportProgress(&comm->tp, mcclNowNs() + 100 * 1000000LL, &comm->aborted);
      /* Sends and receives whose producer is still running are polled every millisecond. */
      if (res == mcclSuccess && comm->tp.idle) mcclTransportIdleWait(&comm->tp, mcclP2pWaiting(comm) ? 1 : 100);
      if (res != mcclSuccess && (res != mcclTimeout || mcclP2pStalled(comm))) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "rank %d: point-to-point traffic failed: %s", comm->rank, comm->tp.error);
        failCommunicator(comm, res, msg, sizeof(msg));
      }
    } else {
      break; /* stopping, and nothing is left */
    }
  }
  /* Retire what is still open (held requests whose owners never sealed them). */
  pthread_mutex_lock(&comm->qlock);
  while (comm->open != NULL) {
    struct mcclRequest* top = comm->open;
    comm->open = top->below;
    top->state = MCCL_REQ_RETIRED;
    mcclRequestRelease(top);
  }
  pthread_mutex_unlock(&comm->qlock);
  return NULL;
}

mcclResult_t mcclEngineSubmitV(struct mcclComm* comm, const mcclOp* op, const size_t* const arrays[4],
                               const mcclOpOptions_t* options, mcclRequest_t* request) {
  size_t n = (size_t)comm->nranks, esz = mcclDataTypeSize(op->dtype);
  static const char* const names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
  for (int k = 0; k < 4; k += 2)
    for (size_t p = 0; p < n; p++) {
      size_t c = arrays[k][p], d = arrays[k + 1][p];
      if (!mcclCountFits(c, esz, 1) || !mcclCountFits(d, esz, 1) || !mcclCountFits(c + d, esz, 1))
        return mcclArgError(comm, mcclInvalidArgument, "mcclAllToAllv: %s[%zu] = %zu with %s[%zu] = %zu does not address "
                           "memory (a negative value cast to size_t?)", names[k], p, c, names[k + 1], p, d);
    }
  size_t* v = malloc(4 * n * sizeof(size_t));
  if (v == NULL) {
    mcclSetThreadError("out of memory for all-to-allv counts");
    return mcclSystemError;
  }
  for (int k = 0; k < 4; k++) memcpy(v + (size_t)k * n, arrays[k], n * sizeof(size_t));
  return submit(comm, op, v, options, request, 0);
}

mcclResult_t mcclEngineSubmit(struct mcclComm* comm, const mcclOp* op,
                              const mcclOpOptions_t* options, mcclRequest_t* request) {
  return submit(comm, op, NULL, options, request, 0);
}

MCCL_API mcclResult_t mcclOrderMarker(mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* marker) {
  if (comm == NULL || marker == NULL) {
    mcclSetThreadError("mcclOrderMarker: %s is NULL", comm == NULL ? "comm" : "marker");
    return mcclInvalidArgument;
  }
  mcclOp op;
  memset(&op, 0, sizeof(op));
  op.coll = MCCL_COLL_BARRIER; /* never run: only named in messages */
  op.dtype = mcclUint8;
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  if (options != NULL) o.follows = options->follows;
  o.hold = 1;
  return submit(comm, &op, NULL, &o, marker, 1);
}

struct mcclRequest* mcclRequestNew(const mcclOp* op, const mcclOpOptions_t* options, int64_t default_timeout_ms) {
  struct mcclRequest* req = calloc(1, sizeof(*req));
  if (req == NULL) {
    mcclSetThreadError("out of memory for a request");
    return NULL;
  }
  atomic_init(&req->refs, 2); /* the caller's hold and the engine's */
  atomic_init(&req->finished, 0);
  pthread_mutex_init(&req->mu, NULL);
  mcclCondInit(&req->cv);
  req->op = *op;
  req->source = -1;
  req->timeout_ms = options && options->timeout_ms > 0 ? options->timeout_ms : default_timeout_ms;
  const int64_t max_ms = INT64_MAX / 1000000 / 10; /* as mcclDeadlineNs: deadlines never overflow */
  if (req->timeout_ms > max_ms) req->timeout_ms = max_ms;
  if (options && options->handoff) req->handoff = *options->handoff;
  if (options) {
    req->op.algorithm = options->algorithm;
    req->premul_factor = options->premul_factor;
    if (op->coll != MCCL_COLL_SEND && op->coll != MCCL_COLL_RECV) req->op.site = options->call_site;
  }
  return req;
}

/* Takes ownership of `v`. `marker`: an order marker (mcclOrderMarker). */
static mcclResult_t submit(struct mcclComm* comm, const mcclOp* op, size_t* v,
                           const mcclOpOptions_t* options, mcclRequest_t* request, int marker) {
  const char* fn = mcclCollName(op->coll);
  mcclResult_t bad = mcclSuccess;
  if (options && (unsigned)options->algorithm > (unsigned)mcclAlgoHalvingDoubling)
    bad = mcclArgError(comm, mcclInvalidArgument, "%s: options.algorithm %d is not an mcclAlgorithm_t value", fn, (int)options->algorithm);
  else if (options && options->hold != 0 && options->hold != 1)
    bad = mcclArgError(comm, mcclInvalidArgument, "%s: options.hold must be 0 or 1, not %d", fn, options->hold);
  if (bad != mcclSuccess) {
    free(v);
    return bad;
  }
  struct mcclRequest* req = mcclRequestNew(op, options, comm->timeout_ms);
  if (req == NULL) {
    free(v);
    return mcclSystemError;
  }
  req->v = v;
  req->op.v = v;

  req->comm = comm;
  atomic_fetch_add(&comm->refs, 1);
  req->ordered = 1;
  req->marker = marker;
  req->held = options != NULL && options->hold;
  req->op.seq = UINT64_MAX; /* stamped when the engine takes it */
  struct mcclRequest* parent = options ? options->follows : NULL;
  if (parent != NULL && (parent->comm != comm || !parent->ordered)) {
    mcclRequestRelease(req);
    mcclRequestRelease(req);
    return mcclArgError(comm, mcclInvalidArgument, "%s: options.follows must be a collective request of the same communicator", fn);
  }

  pthread_mutex_lock(&comm->qlock);
  if (comm->stopping) {
    pthread_mutex_unlock(&comm->qlock);
    mcclRequestRelease(req);
    mcclRequestRelease(req);
    mcclSetThreadError("the communicator is being destroyed");
    return mcclInvalidUsage;
  }
  if (request != NULL) *request = req; /* before the engine can see it: a handoff may read it */
  if (parent != NULL && parent->state != MCCL_REQ_RETIRED) {
    if (parent->kids_tail) parent->kids_tail->next = req;
    else parent->kids_head = req;
    parent->kids_tail = req;
  } else {
    if (parent != NULL)
      INFO(MCCL_SUB_COLL, "rank %d: a follow-up of a request already passed in the run order "
           "takes its place in issue order", comm->rank);
    if (comm->qtail) comm->qtail->next = req;
    else comm->qhead = req;
    comm->qtail = req;
  }
  pthread_cond_signal(&comm->qcond);
  if (comm->idle_reading) mcclTransportWake(&comm->tp);
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
  if (req == NULL) {
    mcclSetThreadError("mcclWait: request is NULL");
    return mcclInvalidArgument;
  }
  pthread_mutex_lock(&req->mu);
  if (timeout_ms < 0) {
    while (!req->done) pthread_cond_wait(&req->cv, &req->mu);
  } else {
    int64_t until = mcclDeadlineNs(timeout_ms);
    while (!req->done)
      if (mcclCondWaitUntil(&req->cv, &req->mu, until) != 0) break;
  }
  mcclResult_t res = req->done ? req->result : mcclInProgress;
  pthread_mutex_unlock(&req->mu);
  return res;
}

mcclResult_t mcclTest(mcclRequest_t req, int* done) {
  if (req == NULL || done == NULL) {
    mcclSetThreadError("mcclTest: %s is NULL", req == NULL ? "request" : "done");
    return mcclInvalidArgument;
  }
  pthread_mutex_lock(&req->mu);
  *done = req->done;
  mcclResult_t res = req->done ? req->result : mcclSuccess;
  pthread_mutex_unlock(&req->mu);
  return res;
}

uint64_t mcclRequestSeq(mcclRequest_t req) {
  if (req == NULL) return UINT64_MAX;
  if (!req->ordered) return req->op.seq;
  pthread_mutex_lock(&req->comm->qlock);
  uint64_t seq = req->op.seq;
  pthread_mutex_unlock(&req->comm->qlock);
  return seq;
}

mcclResult_t mcclRequestSeal(mcclRequest_t req) {
  if (req == NULL) {
    mcclSetThreadError("mcclRequestSeal: request is NULL");
    return mcclInvalidArgument;
  }
  if (!req->ordered) return mcclSuccess;
  pthread_mutex_lock(&req->comm->qlock);
  req->sealed = 1;
  pthread_cond_signal(&req->comm->qcond);
  if (req->comm->idle_reading) mcclTransportWake(&req->comm->tp);
  pthread_mutex_unlock(&req->comm->qlock);
  return mcclSuccess;
}

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
