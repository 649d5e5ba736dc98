/*
 * park.h: collective frames that arrive before their receive is posted (layer "transport").
 *
 * Without a park, a collective frame whose receive is not posted yet stops the reading of its
 * connection, and TCP's window is then the only flow control: the receive window closes, the
 * sender's socket fills, and the link idles until the algorithm posts the receive and the window
 * reopens (zero-window probes, ACK round trips). With one, the connection's reader goes on: the
 * frame's payload lands in a bounded per-peer buffer (the paper's parking, section 4) and is
 * copied into the receive when it is posted, in arrival order.
 *
 * One park per connection: a byte ring of `cap` payload bytes (allocated at the first frame
 * parked, so peers that never run ahead cost nothing) and a FIFO of the parked frames' headers.
 * A frame is parked whole or not at all: one that does not fit (the park is full, or the frame is
 * larger than the whole park) stops the reading as before, so memory stays within `cap` plus the
 * headers (at most MCCL_PARK_MAX_FRAMES). The bound: MCCL_PARK_BYTES, by default
 * (MCCL_PIPELINE_DEPTH + 2) x MCCL_SEGMENT_BYTES (1.5 MiB with their defaults): the ring's
 * pipeline depth plus two segments, the lead a ring sender can have over its successor.
 *
 * Only DATA frames (collectives) are parked here; point-to-point messages have their own park
 * (core/p2p.c), and failure notices are never read ahead (tcp_fail.c, mcclTransportSettle).
 * Everything runs on the transport owner's thread.
 */
#ifndef MCCL_PARK_H_
#define MCCL_PARK_H_

#include <stddef.h>
#include <stdint.h>

#include "transport/wire.h"

/* Headers a park holds at most (empty frames, e.g. announcements, take no payload bytes). */
#define MCCL_PARK_MAX_FRAMES 4096

typedef struct {
  mcclFrame frame;   /* its header, as checked on arrival (mcclFrameHeaderCheck) */
  size_t off;        /* where its payload starts in the byte ring */
  size_t got;        /* payload bytes arrived so far (== frame.length once whole) */
  int64_t t_first;   /* with a trace: when its header arrived (mcclNowNs), else 0 */
} mcclParkedFrame;

typedef struct {
  char* buf;         /* the byte ring, `cap` bytes; NULL until a frame with a payload is parked */
  size_t cap;        /* payload bytes this park may hold (0: parking off) */
  size_t head, used; /* the payloads parked: `used` bytes from `head`, wrapping at cap */
  size_t peak;       /* the most bytes it ever held */
  uint64_t parked;   /* frames parked so far */
  mcclParkedFrame* q;     /* FIFO of parked frames (circular), qlen of qcap from qhead */
  int qcap, qhead, qlen;
} mcclPark;

/* The per-peer bound in bytes: MCCL_PARK_BYTES, or (depth + 2) x segment when unset (see above). */
size_t mcclParkBytes(void);

/* 1 when a frame with `bytes` of payload fits now, else 0. */
int mcclParkFits(const mcclPark* p, size_t bytes);

/* Append a frame (the caller checked mcclParkFits): its header is copied; its payload arrives
 * later through mcclParkSpan. Returns NULL when memory runs out (nothing changed). */
mcclParkedFrame* mcclParkPush(mcclPark* p, const mcclFrame* f);

/* The oldest parked frame, or NULL; the newest (the one whose payload may still be arriving). */
mcclParkedFrame* mcclParkHead(mcclPark* p);
mcclParkedFrame* mcclParkTail(mcclPark* p);

/* Where the next payload bytes of the newest frame `e` go: *dst and *room (the contiguous bytes
 * there, up to what the frame still lacks; 0 once whole). */
void mcclParkSpan(const mcclPark* p, const mcclParkedFrame* e, char** dst, size_t* room);

/* Copy the first `n` arrived payload bytes of `e` to `dst` (n <= e->got). */
void mcclParkCopyOut(const mcclPark* p, const mcclParkedFrame* e, char* dst, size_t n);

/* Drop the oldest frame and release its bytes. */
void mcclParkPop(mcclPark* p);

/* Free everything (the park may be used again afterwards, empty). */
void mcclParkFree(mcclPark* p);

#endif
