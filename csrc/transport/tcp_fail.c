/* tcp_fail.c: when a rank fails (layer "transport"): ABORT frames to every peer and the linger
 * that lets them arrive, consistent failure (mcclTransportSettle), unread frames at close, and
 * closing the mesh. The data path is tcp.c; opening the mesh is tcp_connect.c. */
#include "transport/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/trace.h"
#include "core/platform.h"

/* How long a failing rank keeps reading after it said why, so that closing its sockets with
 * unread bytes (which makes the kernel send a reset) cannot destroy the ABORT frame before the
 * peer has read it. */
#define MCCL_FAIL_LINGER_MS 250

/* Never dereferences posted transfers: after an error their owners may have returned. */
void mcclTransportFail(mcclTransport* t, const char* full_reason) {
  /* A reason that wraps a peer's reason ("rank 1: ... failed: rank 2 (addr) failed: <rank 2's
   * reason>") is passed on as that peer's reason alone: every reason on the wire is then the
   * root cause, the message of the rank that failed first, however many ranks relayed it (their
   * wrappers, one per hop, used to push the cause out of the frame on large rings). Only a reason
   * that names its rank ("rank 2: ..."; every failing rank's does, mcclCommAbort's too): the
   * receivers' messages name the relaying rank, not the rank that failed first. */
  const char* reason = full_reason;
  size_t len = strlen(full_reason);
  for (int r = 0; r < t->nranks; r++) {
    const char* peer = t->conns[r].abort_reason;
    size_t plen = strlen(peer);
    if (r != t->rank && plen > 0 && plen < len && strncmp(peer, "rank ", 5) == 0 &&
        strcmp(full_reason + len - plen, peer) == 0) {
      reason = peer;
      len = plen;
      break;
    }
  }
  /* A reason too long for a frame: its head and its tail. */
  char clipped[MCCL_MAX_ABORT_REASON + 1];
  if (len > MCCL_MAX_ABORT_REASON) {
    const size_t head = 120, gap = 5, tail = MCCL_MAX_ABORT_REASON - head - gap;
    memcpy(clipped, reason, head);
    memcpy(clipped + head, " ... ", gap);
    memcpy(clipped + head + gap, reason + len - tail, tail);
    clipped[MCCL_MAX_ABORT_REASON] = '\0';
    reason = clipped;
    len = MCCL_MAX_ABORT_REASON;
  }
  mcclTransportStopSender(t); /* what is half-written stays so: send_midframe is final */
  mcclConnectorFailing(t);    /* handshakes under way: links (then told below) or closed */
  /* Peers that already failed or closed have spoken; the others may yet, during the linger. */
  char* heard = calloc((size_t)t->nranks, 1);
  for (int r = 0; r < t->nranks && heard != NULL; r++) heard[r] = r == t->rank || t->conns[r].fd < 0 || t->conns[r].dead;
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_ABORT;
  f.seq = t->settled; /* peers completing a collective this rank did not complete fail it too */
  f.length = (uint32_t)len;
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &f);
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (c->fd < 0) continue;
    /* Only where no frame is half-written: otherwise the ABORT header would land mid-payload.
     * (The posted transfers themselves may be gone: the failed algorithm has returned.) */
    if (!c->dead && !c->send_midframe) {
      struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void*)reason, len}};
      struct msghdr msg;
      memset(&msg, 0, sizeof(msg));
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      ssize_t ignored = sendmsg(c->fd, &msg, MCCL_MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
    }
    shutdown(c->fd, SHUT_WR); /* FIN after the ABORT frame: peers blocked on us fail now */
    c->dead = 1;
    if (c->dead_reason[0] == '\0') snprintf(c->dead_reason, sizeof(c->dead_reason), "this rank failed");
  }
  mcclConnectorTellClaimants(t, hdr, reason, len);
  mcclTransportCancel(t);
  /* With runtime connection, the peers this rank has no link with get the ABORT frame too, each
   * on a connection of its own (a NOTICE, wire.h): one of them may be waiting for this rank to
   * dial it, and no link would ever tell it why this rank stopped. Every failing rank sends
   * them (whoever failed first, a peer may be waiting for any of them): about as many dials as
   * the eager mesh's init, once, within the linger. */
  int* notice = t->connector != NULL ? malloc((size_t)t->nranks * sizeof(int)) : NULL;
  for (int r = 0; r < t->nranks && notice != NULL; r++)
    notice[r] = r != t->rank && t->conns[r].fd < 0 ? mcclConnectorNoticeDial(t, r) : -1;
  /* Linger: discard what peers still send until each has closed too, or the linger time is up.
   * Past MCCL_FAIL_LINGER_MS it goes on (to four times that) only while two or more peers are
   * still unheard, so that under load a slow live peer is not taken for the stalled one. */
  int64_t start = mcclNowNs();
  int64_t until = start + MCCL_FAIL_LINGER_MS * 1000000LL, until_max = start + 4 * MCCL_FAIL_LINGER_MS * 1000000LL;
  for (;;) {
    int np = 0, unheard = 0;
    for (int r = 0; r < t->nranks; r++) {
      if (t->conns[r].fd < 0 || t->conns[r].dead == 2) continue;
      if (heard != NULL && !heard[r]) unheard++;
      mcclTransportWatchIn(t, &t->conns[r], 1); /* any byte: a peer is heard */
      t->pfds[np].fd = t->conns[r].fd;
      t->pfds[np].events = POLLIN;
      t->pfd_peer[np++] = r;
    }
    for (int r = 0; r < t->nranks && notice != NULL; r++) {
      if (notice[r] < 0) continue;
      t->pfds[np].fd = notice[r];
      t->pfds[np].events = POLLOUT;
      t->pfd_peer[np++] = -1 - r;
    }
    /* Connections to this rank (other failing ranks' NOTICEs): accepted and closed at once, so
     * that their senders hear that this rank is alive (mcclConnectorCloseWaiting). */
    const int listener = mcclConnectorListener(t), npeers = np;
    if (listener >= 0 && npeers > 0) {
      t->pfds[np].fd = listener;
      t->pfds[np].events = POLLIN;
      t->pfd_peer[np++] = -1 - t->nranks;
    }
    int64_t now = mcclNowNs();
    int64_t end = (now >= until && unheard <= 1) || heard == NULL ? until : until_max;
    int64_t left_ms = (end - now) / 1000000LL;
    if (npeers == 0 || left_ms <= 0) break; /* every peer closed, or the time is up */
    if (left_ms > MCCL_FAIL_LINGER_MS) left_ms = MCCL_FAIL_LINGER_MS;
    if (poll(t->pfds, (nfds_t)np, (int)left_ms) < 0) break;
    for (int k = 0; k < np; k++) {
      if (t->pfds[k].revents == 0) continue;
      if (t->pfd_peer[k] == -1 - t->nranks) {
        mcclConnectorCloseWaiting(t);
        continue;
      }
      if (t->pfd_peer[k] < 0) { /* a NOTICE's socket: connected (or failed) */
        int r = -1 - t->pfd_peer[k];
        if (mcclConnectorNoticeSend(t, notice[r], r, hdr, reason, len) == 0) {
          /* The peer takes it as its link to this rank and may write to it before it reads the
           * frame: drained as a link until the linger ends, so that no reset destroys it. A live
           * peer answers on it as on any link (its own ABORT, or it closes; a failing one closes
           * it unread): until then it is unheard, so that a stopped rank that this rank was
           * never linked to is named as one that was would be. */
          shutdown(notice[r], SHUT_WR);
          t->conns[r].fd = notice[r];
          t->conns[r].dead = 1;
          snprintf(t->conns[r].dead_reason, sizeof(t->conns[r].dead_reason), "this rank failed");
          if (heard != NULL) heard[r] = 0;
        } else {
          close(notice[r]);
        }
        notice[r] = -1;
        continue;
      }
      char sink[65536];
      ssize_t n = recv(t->pfds[k].fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) t->conns[t->pfd_peer[k]].dead = 2;
      if (heard != NULL && n >= 0) heard[t->pfd_peer[k]] = 1;
    }
  }
  t->silent[0] = '\0';
  t->silent_ms = (int)((mcclNowNs() - start) / 1000000LL);
  int nsilent = 0, nother = 0;
  for (int r = 0; r < t->nranks && heard != NULL; r++) {
    if (r == t->rank) continue;
    nother++;
    if (heard[r] || t->conns[r].dead == 2) continue;
    size_t used = strlen(t->silent);
    if (nsilent++ < 4 && used + MCCL_ADDR_STRLEN + 16 < sizeof(t->silent))
      snprintf(t->silent + used, sizeof(t->silent) - used, "%srank %d (%s)", used ? ", " : "", r, t->conns[r].addr);
  }
  if (nsilent == nother) t->silent[0] = '\0'; /* everyone silent: this rank is the one cut off */
  free(heard);
  for (int r = 0; r < t->nranks && notice != NULL; r++)
    if (notice[r] >= 0) close(notice[r]);
  free(notice);
  /* No connection opens any more: a peer that dials this rank now is refused, and so fails at
   * once instead of waiting out its timeout (tcp.h, mcclTransportInit). */
  mcclConnectorFree(t);
}

/* The failure notice `f` (an ABORT header) from `peer`, with `reason` (`len` bytes, as far as it
 * arrived), says that peer did not complete collective `seq`: fail it here too. */
static mcclResult_t settleFailed(mcclTransport* t, int peer, const mcclFrame* f, const char* reason,
                                 size_t len, uint64_t seq) {
  mcclConn* c = &t->conns[peer];
  memcpy(c->abort_reason, reason, len);
  c->abort_reason[len] = '\0';
  c->rx_mode = MCCL_RX_HEADER;
  c->rx_dst = NULL;
  c->rx_left = 0;
  c->rhdr_got = 0;
  c->dead = 1;
  snprintf(c->dead_reason, sizeof(c->dead_reason), "failed: %.140s", c->abort_reason);
  snprintf(t->error, sizeof(t->error),
           "rank %d (%s) failed before it completed this collective (#%llu; it completed %llu), so rank "
           "%d fails it too: %s", peer, c->addr, (unsigned long long)seq, (unsigned long long)f->seq,
           t->rank, c->abort_reason);
  return mcclRemoteError;
}

/* One peer's connection, readable when the collective `seq` completed: is its next frame a notice
 * that the peer failed before completing `seq`? Looks with MSG_PEEK, so anything else (the peer's
 * next collective, a point-to-point message, a close) is left exactly as it was. */
static mcclResult_t settlePeer(mcclTransport* t, int peer, uint64_t seq) {
  mcclConn* c = &t->conns[peer];
  MCCLCHECK(mcclTransportTakeCredits(t, peer)); /* a notice may wait behind reports */
  uint8_t buf[MCCL_FRAME_BYTES + MCCL_MAX_ABORT_REASON];
  size_t have = c->rhdr_got; /* a header partly read already */
  memcpy(buf, c->rhdr, have);
  ssize_t n;
  do n = recv(c->fd, buf + have, sizeof(buf) - have, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n <= 0 || have + (size_t)n < MCCL_FRAME_BYTES) return mcclSuccess;
  size_t got = have + (size_t)n;
  mcclFrame f;
  char why[300];
  if (mcclFrameHeaderCheck(buf, t->p2p.arrive != NULL, &f, why, sizeof(why)) != MCCL_WIRE_OK)
    return mcclSuccess; /* the receive path reports a broken frame when it gets there */
  if (f.type != MCCL_FRAME_ABORT || f.seq > seq) return mcclSuccess;
  size_t len = f.length < MCCL_MAX_ABORT_REASON ? f.length : MCCL_MAX_ABORT_REASON;
  if (len > got - MCCL_FRAME_BYTES) len = got - MCCL_FRAME_BYTES;
  /* Consume what was looked at (it is in the socket, so the reads cannot block or come short of
   * it for long), which keeps the stream in step with rx_mode. */
  size_t take = MCCL_FRAME_BYTES - have + len;
  uint8_t sink[MCCL_FRAME_BYTES + MCCL_MAX_ABORT_REASON];
  while (take > 0) {
    ssize_t r = recv(c->fd, sink, take, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    take -= (size_t)r;
  }
  return settleFailed(t, peer, &f, (const char*)buf + MCCL_FRAME_BYTES, len, seq);
}

mcclResult_t mcclTransportSettle(mcclTransport* t, uint64_t seq) {
  int np = 0;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank || c->fd < 0 || c->dead) continue;
    if (c->rx_mode == MCCL_RX_ABORT) {
      /* The header arrived in a progress round that then found the socket empty mid-reason. */
      if (c->rx_frame.seq > seq) continue;
      size_t have = (size_t)(c->rx_dst - c->abort_reason);
      if (c->rx_left > 0) { /* what more of the reason is here already */
        ssize_t r2 = recv(c->fd, c->rx_dst, c->rx_left, MSG_DONTWAIT);
        if (r2 > 0) have += (size_t)r2;
      }
      char reason[MCCL_MAX_ABORT_REASON + 1];
      memcpy(reason, c->abort_reason, have);
      return settleFailed(t, r, &c->rx_frame, reason, have, seq);
    }
    /* A frame in progress or held, or a collective frame waiting for its receive, parked or
     * not (a later collective's: the peer completed this one), comes before any notice. */
    if (c->rx_mode != MCCL_RX_HEADER || c->rx_held || c->park.qlen > 0) continue;
    mcclTransportWatchIn(t, c, 0);
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = POLLIN;
    t->pfds[np].revents = 0;
    t->pfd_peer[np++] = r;
  }
  if (np > 0 && poll(t->pfds, (nfds_t)np, 0) > 0) {
    for (int k = 0; k < np; k++)
      if (t->pfds[k].revents & POLLIN) MCCLCHECK(settlePeer(t, t->pfd_peer[k], seq));
  }
  t->settled = seq + 1;
  return mcclSuccess;
}

int mcclTransportSingleHost(const mcclTransport* t) {
  const char* colon = strrchr(t->self_addr, ':');
  if (colon == NULL || t->nranks < 2) return 0;
  size_t host_len = (size_t)(colon - t->self_addr) + 1; /* with the ':': 10.0.0.1 is not 10.0.0.12 */
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank && strncmp(t->conns[r].addr, t->self_addr, host_len) != 0) return 0;
  return 1;
}

int mcclTransportUnread(mcclTransport* t, char* desc, size_t cap) {
  int found = 0;
  size_t len = 0;
  desc[0] = '\0';
  for (int r = 0; r < t->nranks && t->conns != NULL; r++) {
    mcclConn* c = &t->conns[r];
    if (c->fd < 0 || c->dead) continue;
    char b;
    /* Reports of what this rank's peer took last (park.h) are not frames left unread. */
    int pending = mcclTransportTakeCredits(t, r) != mcclSuccess || c->rx_mode != MCCL_RX_HEADER ||
                  c->rhdr_got > 0 || c->park.qlen > 0 ||
                  recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
    if (!pending) continue;
    found++;
    if (len + 40 < cap) len += (size_t)snprintf(desc + len, cap - len, "%s%d", len ? ", " : "", r);
  }
  return found;
}

void mcclTransportClose(mcclTransport* t) {
  mcclTransportStopSender(t);
  mcclConnectorFree(t);
  if (t->conns != NULL)
    for (int r = 0; r < t->nranks; r++) {
      if (t->conns[r].fd >= 0) close(t->conns[r].fd);
      mcclParkFree(&t->conns[r].park);
    }
  if (t->wake[0] >= 0) close(t->wake[0]);
  if (t->wake[1] >= 0) close(t->wake[1]);
  free(t->conns);
  free(t->pfds);
  free(t->pfd_peer);
  t->conns = NULL;
  t->pfds = NULL;
  t->pfd_peer = NULL;
  t->wake[0] = t->wake[1] = -1;
}
