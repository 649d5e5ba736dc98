/*
 * collectives.c: the public collective calls. Each validates its arguments on the caller's thread,
 * so that a bad dtype, op, root or pointer fails before any byte is sent and without consuming a
 * sequence number, then hands the request to the engine (engine.c).
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/comm.h"
#include "core/debug.h"
#include "reduce/reduce.h"

/* Record an argument error for mcclGetLastError(comm) and the thread; returns `res`. */
static mcclResult_t argError(struct mcclComm* comm, mcclResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mcclResult_t argError(struct mcclComm* comm, mcclResult_t res, const char* fmt, ...) {
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
  if (comm == NULL) return argError(NULL, mcclInvalidArgument, "%s: communicator is NULL", fn);
  if ((int)dtype < 0 || dtype >= mcclNumTypes)
    return argError(comm, mcclInvalidArgument, "%s: datatype %d is not an mcclDataType_t value", fn, (int)dtype);
  if (count > 0 && (a == NULL || b == NULL))
    return argError(comm, mcclInvalidArgument, "%s: buffer pointer is NULL for count %zu", fn, count);
  if (atomic_load(&comm->aborted))
    return argError(comm, mcclAborted, "%s: the communicator was aborted", fn);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                                    mcclDataType_t datatype, mcclRedOp_t op, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllReduce", datatype, count, sendbuf, recvbuf));
  mcclResult_t ok = mcclReduceCheck(datatype, op);
  if (ok != mcclSuccess)
    return argError(comm, ok, "mcclAllReduce: op %s is not defined for dtype %s", mcclOpName(op),
                    mcclDtypeName(datatype));
  mcclOp o = {MCCL_COLL_ALLREDUCE, 0, sendbuf, recvbuf, count, datatype, op, 0, mcclAlgoAuto, 0};
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclBroadcast(void* buffer, size_t count, mcclDataType_t datatype, int root,
                                    mcclComm_t comm, const mcclOpOptions_t* options,
                                    mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclBroadcast", datatype, count, buffer, buffer));
  if (root < 0 || root >= comm->nranks)
    return argError(comm, mcclInvalidArgument, "mcclBroadcast: root %d is outside 0..%d", root,
                    comm->nranks - 1);
  mcclOp o = {MCCL_COLL_BROADCAST, 0, buffer, buffer, count, datatype, mcclSum, root, mcclAlgoAuto, 0};
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                    mcclDataType_t datatype, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclAllGather", datatype, sendcount, sendbuf, recvbuf));
  mcclOp o = {MCCL_COLL_ALLGATHER, 0, sendbuf, recvbuf, sendcount, datatype, mcclSum, 0, mcclAlgoAuto, 0};
  return mcclEngineSubmit(comm, &o, options, request);
}

MCCL_API mcclResult_t mcclBarrier(mcclComm_t comm, const mcclOpOptions_t* options,
                                  mcclRequest_t* request) {
  MCCLCHECK(checkCommon(comm, "mcclBarrier", mcclUint8, 0, NULL, NULL));
  mcclOp o = {MCCL_COLL_BARRIER, 0, NULL, NULL, 0, mcclUint8, mcclSum, 0, mcclAlgoAuto, 0};
  return mcclEngineSubmit(comm, &o, options, request);
}
