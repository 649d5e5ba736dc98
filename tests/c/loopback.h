/*
 * loopback.h: rank 0 of a two-rank communicator whose rank 1 is the test itself, at the other end
 * of a socketpair. The test writes whatever bytes it likes as "rank 1" and drives rank 0's real
 * receive path (transport/tcp.c connRecv, wire.c checks, core/p2p.c matching and parking) with
 * mcclTransportProgress, the way the engine thread would, but on the test's own thread: there is
 * no engine thread, no store and no handshake.
 *
 * Used by tests/c/test_wire.c and tests/fuzz/fuzz_rx.c. Header-only (static functions) so each
 * includer compiles it with its own flags.
 */
#ifndef MCCL_TEST_LOOPBACK_H_
#define MCCL_TEST_LOOPBACK_H_

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/debug.h"

typedef struct {
  struct mcclComm* comm; /* rank 0 */
  int peer_fd;           /* rank 1's end: write frames here */
} mcclLoopback;

/* Zero on success. `segment_bytes` only matters for sends (frames per message). */
static inline int loopbackOpen(mcclLoopback* lb, size_t segment_bytes) {
  memset(lb, 0, sizeof(*lb));
  lb->peer_fd = -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  struct mcclComm* comm = calloc(1, sizeof(*comm));
  if (comm == NULL) {
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  comm->rank = 0;
  comm->nranks = 2;
  snprintf(comm->name, sizeof(comm->name), "loopback");
  comm->timeout_ms = 10000;
  pthread_mutex_init(&comm->qlock, NULL);
  pthread_cond_init(&comm->qcond, NULL);
  pthread_mutex_init(&comm->errlock, NULL);
  atomic_init(&comm->aborted, 0);
  atomic_init(&comm->refs, 1);
  int fds[2] = {-1, sv[0]};
  if (mcclTransportFromFds(&comm->tp, 0, 2, fds) != mcclSuccess || mcclP2pInit(comm) != mcclSuccess) {
    close(sv[1]);
    mcclP2pFree(comm);
    mcclTransportClose(&comm->tp);
    free(comm);
    return -1;
  }
  comm->algo.segment_bytes = segment_bytes;
  int flags = fcntl(sv[1], F_GETFL, 0);
  fcntl(sv[1], F_SETFL, flags | O_NONBLOCK); /* a full socket must not block the test */
  lb->comm = comm;
  lb->peer_fd = sv[1];
  return 0;
}

/* Fail what is still pending (as destroy would) and free everything. */
static inline void loopbackClose(mcclLoopback* lb) {
  if (lb->comm != NULL) {
    mcclP2pFailAll(lb->comm, mcclAborted, "loopback closed");
    mcclP2pFree(lb->comm);
    mcclTransportClose(&lb->comm->tp);
    pthread_mutex_destroy(&lb->comm->qlock);
    pthread_cond_destroy(&lb->comm->qcond);
    pthread_mutex_destroy(&lb->comm->errlock);
    free(lb->comm);
  }
  if (lb->peer_fd >= 0) close(lb->peer_fd);
  lb->comm = NULL;
  lb->peer_fd = -1;
}

/* A receive as mcclRecv would submit it (collectives.c p2pSubmit), without argument checks.
 * Returns the caller's hold (mcclRequestFree it), or NULL when out of memory. */
static inline struct mcclRequest* loopbackRecv(mcclLoopback* lb, void* buf, size_t count,
                                               mcclDataType_t dtype, int peer, int tag,
                                               int64_t timeout_ms) {
  mcclOp o;
  memset(&o, 0, sizeof(o));
  o.coll = MCCL_COLL_RECV;
  o.sendbuf = buf;
  o.recvbuf = buf;
  o.count = count;
  o.dtype = dtype;
  o.root = peer;
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = timeout_ms;
  struct mcclRequest* req = mcclRequestNew(&o, &opts, lb->comm->timeout_ms);
  if (req == NULL) return NULL;
  req->peer = peer;
  req->tag = tag;
  req->bytes = count * mcclDataTypeSize(dtype);
  req->op.seq = lb->comm->next_p2p++;
  mcclP2pSubmit(lb->comm, req);
  return req;
}

/* Write as much of `len` bytes as the socket takes; returns the count written. */
static inline size_t loopbackWrite(mcclLoopback* lb, const void* data, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(lb->peer_fd, (const char*)data + done, len - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue; /* libFuzzer's timer signal */
    if (n <= 0) break;
    done += (size_t)n;
  }
  return done;
}

/* Progress rounds that never wait, as long as rank 0 wants and finds bytes: stops when a round
 * finds nothing to read (or nothing is wanted), at the first error, which it returns, or after
 * `max_rounds`. */
static inline mcclResult_t loopbackDrain(mcclLoopback* lb, int max_rounds) {
  for (int i = 0; i < max_rounds; i++) {
    /* A deadline of "now" makes the poll non-blocking; mcclTimeout then means "nothing arrived". */
    mcclResult_t res = mcclTransportProgress(&lb->comm->tp, mcclNowNs(), NULL);
    if (res == mcclTimeout) return mcclSuccess;
    if (res != mcclSuccess) return res;
    if (lb->comm->tp.idle) return mcclSuccess;
  }
  return mcclSuccess;
}

/* The header of a P2P frame as rank 1 would send it (p2p.c postSend). */
static inline void loopbackP2pHeader(uint8_t out[MCCL_FRAME_BYTES], int tag, uint64_t msg_seq,
                                     mcclDataType_t dtype, uint64_t count, uint64_t offset,
                                     uint32_t length) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_P2P;
  f.coll = MCCL_COLL_SEND;
  f.dtype = (uint8_t)dtype;
  f.seq = msg_seq;
  f.count = count;
  f.offset = offset;
  f.length = length;
  f.root = (uint32_t)tag;
  mcclFrameEncode(out, &f);
}

#endif
