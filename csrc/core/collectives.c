/*
 * collectives.c: the public collective calls. Each validates its arguments on the caller's thread,
 * so that a bad dtype, op, root or pointer fails before any byte is sent and without consuming a
 * sequence number, then hands the request to the engine (engine.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/comm.h"
#include "core/debug.h"
#include "reduce/reduce.h"

mcclResult_t mcclArgError(struct mcclComm* comm, mcclResult_t res, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  mcclSetThreadError("%s", msg);
  if (comm != NULL) {
    pthread_mutex_lock(&comm->errlock);
    if (comm->async_error == mcclSuccess) snprintf(comm->error_msg, sizeof(comm->error_msg), "%s", msg);
    pthread_mutex_unlock(&comm->errlock);
  }
  return res;
}

static mcclResult_t checkCommon(struct mcclComm* comm, const char* fn, mcclDataType_t dtype,
                                size_t count, const void* a, const void* b) {
  if (comm == NULL) return mcclArgError(NULL, mcclInvalidArgument, "%s: communicator is NULL", fn);
  if (mcclCommInherited(comm)) return mcclCommForkError(comm, fn); /* before any lock: comm.c, "Fork" */
  if ((int)dtype < 0 || dtype >= mcclNumTypes)
    return mcclArgError(comm, mcclInvalidArgument, "%s: datatype %d is not an mcclDataType_t value", fn, (int)dtype);
  if (count > 0 && (a == NULL || b == NULL))
    return mcclArgError(comm, mcclInvalidArgument, "%s: buffer pointer is NULL for count %zu", fn, count);
  /* Every buffer a collective touches is at most nranks blocks of `count` elements, and must fit
   * in PTRDIFF_MAX bytes (this also rejects negative counts cast to size_t). */
  if (!mcclCountFits(count, mcclDataTypeSize(dtype), (size_t)comm->nranks))
    return mcclArgError(comm, mcclInvalidArgument, "%s: count %zu of %s is too large for %d ranks (a negative "
                    "value cast to size_t?)", fn, count, mcclDtypeName(dtype), comm->nranks);
  if (atomic_load(&comm->aborted))
    return mcclArgError(comm, mcclAborted, "%s: the communicator was aborted", fn);
  return mcclSuccess;
}

/* mcclOp with the fields every collective sets; the engine fills seq, algorithm and deadline. */
#define OP(kind, send, recv, n, dt, red, rt) \
  ((mcclOp){.coll = (kind), .sendbuf = (send), .recvbuf = (recv), .count = (n), .dtype = (dt), .op = (red), .root = (rt)})

static mcclResult_t checkOp(struct mcclComm* comm, const char* fn, mcclDataType_t dtype, mcclRedOp_t op) {
  mcclResult_t ok = mcclReduceCheck(dtype, op);
  if (ok != mcclSuccess)
    return mcclArgError(comm, ok, "%s: op %s is not defined for dtype %s", fn, mcclOpName(op), mcclDtypeName(dtype));
  return mcclSuccess;
}

static mcclResult_t checkRoot(struct mcclComm* comm, const char* fn, int root) {
  if (root < 0 || root >= comm->nranks)
    return mcclArgError(comm, mcclInvalidArgument, "%s: root %d is outside 0..%d", fn, root, comm->nranks - 1);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                                    mcclDataType_t datatype, mcclRedOp_t op, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllReduce", datatype, count, sendbuf, recvbuf));
  MCCLCHECK(checkOp(comm, "mcclAllReduce", datatype, op));
  mcclOp o = OP(MCCL_COLL_ALLREDUCE, sendbuf, recvbuf, count, datatype, op, 0);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclBroadcast(void* buffer, size_t count, mcclDataType_t datatype, int root,
                                    mcclComm_t comm, const mcclOpOptions_t* options,
                                    mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclBroadcast", datatype, count, buffer, buffer));
  MCCLCHECK(checkRoot(comm, "mcclBroadcast", root));
  mcclOp o = OP(MCCL_COLL_BROADCAST, buffer, buffer, count, datatype, mcclSum, root);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                    mcclDataType_t datatype, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllGather", datatype, sendcount, sendbuf, recvbuf));
  mcclOp o = OP(MCCL_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, datatype, mcclSum, 0);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclReduce(const void* sendbuf, void* recvbuf, size_t count,
                                 mcclDataType_t datatype, mcclRedOp_t op, int root, mcclComm_t comm,
                                 const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclReduce", datatype, count, sendbuf, sendbuf));
  MCCLCHECK(checkOp(comm, "mcclReduce", datatype, op));
  MCCLCHECK(checkRoot(comm, "mcclReduce", root));
  if (comm->rank == root && count > 0 && recvbuf == NULL)
    return mcclArgError(comm, mcclInvalidArgument, "mcclReduce: recvbuf is NULL on root");
  mcclOp o = OP(MCCL_COLL_REDUCE, sendbuf, recvbuf, count, datatype, op, root);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclReduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                        mcclDataType_t datatype, mcclRedOp_t op, mcclComm_t comm,
                                        const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclReduceScatter", datatype, recvcount, sendbuf, recvbuf));
  MCCLCHECK(checkOp(comm, "mcclReduceScatter", datatype, op));
  mcclOp o = OP(MCCL_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, datatype, op, 0);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                 mcclDataType_t datatype, int root, mcclComm_t comm,
                                 const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclGather", datatype, sendcount, sendbuf, sendbuf));
  MCCLCHECK(checkRoot(comm, "mcclGather", root));
  if (comm->rank == root && sendcount > 0 && recvbuf == NULL)
    return mcclArgError(comm, mcclInvalidArgument, "mcclGather: recvbuf is NULL on root");
  mcclOp o = OP(MCCL_COLL_GATHER, sendbuf, recvbuf, sendcount, datatype, mcclSum, root);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclScatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                  mcclDataType_t datatype, int root, mcclComm_t comm,
                                  const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclScatter", datatype, recvcount, recvbuf, recvbuf));
  MCCLCHECK(checkRoot(comm, "mcclScatter", root));
  if (comm->rank == root && recvcount > 0 && sendbuf == NULL)
    return mcclArgError(comm, mcclInvalidArgument, "mcclScatter: sendbuf is NULL on root");
  mcclOp o = OP(MCCL_COLL_SCATTER, sendbuf, recvbuf, recvcount, datatype, mcclSum, root);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclAllToAll(const void* sendbuf, void* recvbuf, size_t count,
                                   mcclDataType_t datatype, mcclComm_t comm,
                                   const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllToAll", datatype, count, sendbuf, recvbuf));
  if (count > 0 && sendbuf == recvbuf)
    return mcclArgError(comm, mcclInvalidArgument, "mcclAllToAll: sendbuf and recvbuf must differ");
  mcclOp o = OP(MCCL_COLL_ALLTOALL, sendbuf, recvbuf, count, datatype, mcclSum, 0);
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclAllToAllv(const void* sendbuf, const size_t* sendcounts,
                                    const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                    const size_t* rdispls, mcclDataType_t datatype, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllToAllv", datatype, 0, NULL, NULL));
  if (!sendcounts || !sdispls || !recvcounts || !rdispls)
    return mcclArgError(comm, mcclInvalidArgument, "mcclAllToAllv: count and displacement arrays must not be NULL");
  size_t sent = 0, received = 0;
  for (int j = 0; j < comm->nranks; j++) {
    sent += sendcounts[j];
    received += recvcounts[j];
  }
  if ((sent > 0 && sendbuf == NULL) || (received > 0 && recvbuf == NULL))
    return mcclArgError(comm, mcclInvalidArgument, "mcclAllToAllv: the %s buffer is NULL but its counts are not all 0",
                        sent > 0 && sendbuf == NULL ? "send" : "receive");
  mcclOp o = OP(MCCL_COLL_ALLTOALL, sendbuf, recvbuf, 0, datatype, mcclSum, 0);
  const size_t* arrays[4] = {sendcounts, sdispls, recvcounts, rdispls};
  return mcclEngineSubmitV(comm, &o, arrays, options, request);
}

MCCL_API mcclResult_t mcclBarrier(mcclComm_t comm, const mcclOpOptions_t* options,
                                  mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclBarrier", mcclUint8, 0, NULL, NULL));
  mcclOp o = OP(MCCL_COLL_BARRIER, NULL, NULL, 0, mcclUint8, mcclSum, 0);
  return mcclEngineSubmit(comm, &o, options, request);
}

/* Point-to-point: validated here, then handed to the engine outside the collective queue. */
static mcclResult_t p2pSubmit(struct mcclComm* comm, const char* fn, mcclCollKind kind, const void* buf,
                              size_t count, mcclDataType_t datatype, int peer, int tag,
                              const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, fn, datatype, count, buf, buf));
  int any_ok = kind == MCCL_COLL_RECV && peer == MCCL_ANY_SOURCE;
  if (!any_ok && (peer < 0 || peer >= comm->nranks || peer == comm->rank))
    return mcclArgError(comm, mcclInvalidArgument, "%s: peer %d is not another rank of 0..%d", fn, peer, comm->nranks - 1);
  if (tag < 0) return mcclArgError(comm, mcclInvalidArgument, "%s: tag %d is negative", fn, tag);
  mcclOp o = OP(kind, buf, (void*)buf, count, datatype, mcclSum, peer);
  struct mcclRequest* req = mcclRequestNew(&o, options, comm->timeout_ms);
  if (req == NULL) return mcclSystemError;
  req->peer = peer;
  req->tag = tag;
  req->bytes = count * mcclDataTypeSize(datatype);
  pthread_mutex_lock(&comm->qlock);
  req->op.seq = comm->next_p2p++;
  pthread_mutex_unlock(&comm->qlock);
  if (request != NULL) *request = req; /* the caller's hold; the engine has its own */
  mcclP2pSubmit(comm, req);
  return request != NULL ? mcclSuccess : mcclRequestWaitAndFree(comm, req);
}

MCCL_API mcclResult_t mcclSend(const void* buf, size_t count, mcclDataType_t datatype, int peer, int tag,
                               mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* request) {
  return p2pSubmit(comm, "mcclSend", MCCL_COLL_SEND, buf, count, datatype, peer, tag, options, request);
}

MCCL_API mcclResult_t mcclRecv(void* buf, size_t count, mcclDataType_t datatype, int peer, int tag,
                               mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* request) {
  return p2pSubmit(comm, "mcclRecv", MCCL_COLL_RECV, buf, count, datatype, peer, tag, options, request);
}
