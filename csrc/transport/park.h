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
 * Credits (below) keep a sender's lead within the park bound, so the park rarely fills.
 *
 * Only DATA frames (collectives) are parked here; point-to-point messages have their own park
 * (core/p2p.c), and a failure notice is read ahead only during a collective its sender did not
 * complete (tcp.c, aheadHeader), which it then fails; otherwise mcclTransportSettle sees it.
 * Everything runs on the transport owner's thread.
 */
#ifndef MCCL_PARK_H_
#define MCCL_PARK_H_

#include <stdatomic.h>
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
/* The i-th oldest parked frame, 0 <= i < qlen. */
mcclParkedFrame* mcclParkAt(mcclPark* p, int i);

/* Where the next payload bytes of the newest frame `e` go: *dst and *room (the contiguous bytes
 * there, up to what the frame still lacks; 0 once whole). */
void mcclParkSpan(const mcclPark* p, const mcclParkedFrame* e, char** dst, size_t* room);

/* Copy the first `n` arrived payload bytes of `e` to `dst` (n <= e->got). */
void mcclParkCopyOut(const mcclPark* p, const mcclParkedFrame* e, char* dst, size_t n);

/* Drop the oldest frame and release its bytes. */
void mcclParkPop(mcclPark* p);

/* Free everything (the park may be used again afterwards, empty). */
void mcclParkFree(mcclPark* p);

/* ---- credits -------------------------------------------------------------------------------
 *
 * The park takes only what fits; without more, a sender that runs further ahead fills its
 * receiver's socket until TCP's window closes. Credits (the paper's section 4.3) stop it first:
 * the receiver of a connection tells its sender, in CREDIT frames (wire.h), how many collective
 * payload bytes its posted receives have taken so far, and the sender starts a collective frame
 * only while its lead (bytes sent and not yet reported taken) stays within `window`: the sender's
 * own park bound (MCCL_PARK_BYTES; the ranks do not exchange theirs). When every rank has the same
 * bound, what a rank sends ahead of its peer's receives fits that peer's park, so the peer keeps
 * reading. A receiver with a smaller park than its sender's can be sent more than it parks; the
 * rest waits in its kernel buffers under TCP's window, as without credits (exact, and bounded by
 * the sender's window).
 *
 * A report goes each time MCCL_CREDIT_CHUNK (256 KiB, wire.h) more bytes were taken: a sixth of
 * the default window, so a sender at the bound gets credit back long before it runs dry. Every
 * rank reports, whatever its own settings; MCCL_CREDITS=0 (or a park of 0) only makes a rank's
 * sends ignore the reports. A sender whose lead is under the chunk may always start a frame: the
 * receiver may hold back up to chunk - 1 bytes of report, and a frame larger than the window's
 * rest would otherwise wait for a report that never comes. The lead is therefore at most
 * max(window, chunk - 1 + frame): the window for the ring's segments with the defaults
 * (256 KiB - 1 + 256 KiB < 1.5 MiB).
 *
 * Units are payload bytes; headers and empty frames (announcements) cost nothing. `sent` and
 * `granted` are atomics: the sender thread starts frames, the owner's reader takes reports.
 * `taken` and `reported` are the owner's alone. */
typedef struct {
  size_t window;            /* the sender's bound on its lead; 0: credits off */
  _Atomic uint64_t sent;    /* sender: payload bytes of the collective frames it started */
  _Atomic uint64_t granted; /* sender: the receiver's latest report */
  _Atomic uint64_t peak;    /* sender: the largest lead a frame started with (its bytes included) */
  _Atomic uint64_t waits;   /* sender: frames that found the lead at the bound and waited */
  uint64_t taken, reported; /* receiver: payload bytes its receives took; the total last reported */
} mcclCredit;

/* Zero the counts and set the window for a park of `park_bytes` (MCCL_CREDITS=0 or a park of 0:
 * window 0, the reports ignored). */
void mcclCreditInit(mcclCredit* k, size_t park_bytes);

/* Sender: may a collective frame of `bytes` payload start now? */
int mcclCreditAllows(const mcclCredit* k, size_t bytes);

/* Sender: a frame of `bytes` started (its first byte was written). */
void mcclCreditStart(mcclCredit* k, size_t bytes);

/* Sender: the receiver reports `total` bytes taken. Returns 0, or -1 (with why[cap]) for a report
 * that goes backwards or covers more than was sent: a peer out of step. */
int mcclCreditGrant(mcclCredit* k, uint64_t total, char* why, size_t cap);

/* Receiver: is a report due (MCCL_CREDIT_CHUNK or more taken since the last one)? */
int mcclCreditDue(const mcclCredit* k);

#endif
