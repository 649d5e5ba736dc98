/*
 * tcp.h: one TCP connection per peer, authenticated at open, carrying framed payloads both ways
 * at once (layer "transport"). The transport knows nothing about collectives: an algorithm posts
 * transfers (one frame each) on a peer's send or receive queue and calls mcclTransportProgress
 * until they complete. Each queue is FIFO, so frames leave and land in posting order, which is
 * the same order on every rank. A send may be gated on receives (mcclTransportPostAfter): it
 * keeps its place, and it and the collective sends behind it on its link wait until those have
 * arrived; a point-to-point frame queued behind it overtakes it (the receiver matches those by
 * (source, tag) order, core/p2p.c), in its own posting order. A send may also relay a receive
 * (mcclTransportPostRelay): it forwards that receive's payload as it lands (cut-through); once
 * its first bytes are written it is mid-frame, and nothing overtakes it, point-to-point frames
 * and credit reports included, until its receive has landed whole.
 *
 * Flow control: a connection is read while a receive is posted on it, and also, with nothing
 * posted (inside a collective, or between collectives through mcclTransportReadAhead), while its
 * park (park.h) has room for the collective frame that arrives next. Credits (park.h) keep a
 * sender's lead within the receiver's park bound (MCCL_PARK_BYTES per peer): a collective frame
 * waits on its queue, and frames that may overtake (point-to-point frames, credit reports) go
 * first, until the receiver's CREDIT frames say its receives took enough. While the owner is
 * not reading a connection (it holds a frame that no receive or park can take), it cannot see
 * reports on it, and sends to that peer fall back to TCP's window (bounded by the socket
 * buffers), as with MCCL_CREDITS=0. Point-to-point frames are never read ahead, failure notices
 * only during a collective their sender did not complete (which they then fail at once: otherwise
 * a rank blocked on another blocked rank would wait for its timeout). Point-to-point messages
 * that arrive before their receive are parked by the owner (core/p2p.c) within a byte budget per
 * peer; past it the owner holds the next message's header (MCCL_ARRIVE_HOLD) and the connection
 * is not read again until the owner takes it, which is TCP backpressure again.
 *
 * Consistent failure: an ABORT frame carries the number of collectives its sender completed, and
 * mcclTransportSettle, called before the owner reports a collective as succeeded, fails it when a
 * peer's notice that it did not complete it is already readable.
 *
 * Files: tcp_connect.c opens connections (mcclTransportInit, mcclTransportFromFds, and the
 * connector that dials, accepts and handshakes, at init or on first use), tcp.c is the
 * data path (posting, the sender thread, progress; park.c holds frames that come before their
 * receive), tcp_fail.c the failure side (mcclTransportFail,
 * mcclTransportSettle, mcclTransportUnread, mcclTransportClose).
 *
 * Threading: a transport is owned by its communicator's engine thread; only mcclTransportWake
 * may be called from other threads. After mcclTransportStartSender the sending side runs on a
 * thread of its own (the producer/consumer split: the owner posts sends and is woken as they
 * complete; the sender thread writes them): sending and receiving then each get a core, which
 * is what bounds throughput when the kernel's socket copies, not a wire, are the bottleneck
 * (loopback). The owner still calls everything else from one thread.
 */
#ifndef MCCL_TCP_H_
#define MCCL_TCP_H_

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mccl.h"
#include "transport/park.h"
#include "transport/socket.h"
#include "transport/wire.h"

/* One frame to send, or one frame expected. Owned by the algorithm that posts it; it must stay
 * put until `complete` or until the transport is cancelled. */
typedef struct mcclXfer {
  struct mcclXfer* next;
  mcclFrame frame;                /* send: the header to send; receive: the header expected */
  uint8_t hdr[MCCL_FRAME_BYTES];  /* send: encoded header; receive: header as it arrives */
  char* buf;                      /* payload source or destination */
  size_t bytes;                   /* payload bytes (== frame.length) */
  size_t done;                    /* header + payload bytes moved so far */
  atomic_int complete;            /* set last, after the transport's final access: from then on
                                     the owner may reuse or free the transfer (a receive that a
                                     send relays: once that send is complete too) */
  struct mcclXfer* gate;          /* send: NULL, or `ngate` receives in an array
                                     (mcclTransportPostAfter) that must all complete before this
                                     frame, and every send queued behind it on its link, may leave */
  int ngate;
  int gates_send;                 /* receive: a send waits for it (wake the sender thread) */
  const struct mcclXfer* relay;   /* send: NULL, or the receive whose payload it forwards as it
                                     lands (mcclTransportPostRelay): buf and bytes are its */
  _Atomic size_t landed;          /* receive: payload bytes in buf so far (stored with release
                                     after they land; a relaying send writes no further) */
  int admitted;                   /* send: chosen to be written next (its credit counted); from
                                     then on it is never overtaken (it may be partly written) */
  int credit_wait;                /* send: it found the credit at the bound (counted once) */
  int64_t t_credit;               /* with a trace: since when it waits for credit */
  int64_t t_post, t_first;        /* with a trace: when it was posted, when its first byte moved */
} mcclXfer;

/* Receive-side state of a connection: what the bytes arriving next are. */
enum { MCCL_RX_HEADER = 0, MCCL_RX_COLL, MCCL_RX_P2P, MCCL_RX_PEEKED, MCCL_RX_ABORT, MCCL_RX_PARK };

typedef struct mcclConn {
  int fd;                         /* -1 for self and for peers not connected */
  char addr[MCCL_ADDR_STRLEN];    /* the peer's published address */
  mcclXfer *sq_head, *sq_tail;    /* sends, in order */
  int send_midframe;              /* the head send is partly written: nothing may cut in */
  int send_blocked;               /* sender thread: the socket was full at the last write */
  int64_t t_full;                 /* with a trace: since when the socket refuses writes (0: not) */
  uint8_t rhdr[MCCL_FRAME_BYTES]; /* the frame header being read */
  size_t rhdr_got;
  int rx_mode;                    /* MCCL_RX_*: reading a header, a collective payload, a
                                     point-to-point payload, holding a collective header that
                                     no posted receive has claimed yet (and the park cannot
                                     take), reading the reason of an ABORT frame, or reading a
                                     collective payload into the park */
  int rx_held;                    /* 1: the owner asked to hold the P2P frame being read
                                     (MCCL_ARRIVE_HOLD); nothing more is read from this connection
                                     until a later round's ask is answered otherwise */
  mcclFrame rx_frame;             /* the header of the frame being read */
  char* rx_dst;                   /* where its payload goes (NULL: discarded) */
  size_t rx_left;                 /* payload bytes of the frame still to read */
  size_t rx_room;                 /* of those, how many may go to rx_dst before the owner of a
                                     P2P frame is asked where the rest goes */
  int rx_lowat;                   /* the socket's SO_RCVLOWAT as last set (0: the kernel's, 1) */
  mcclXfer *rq_head, *rq_tail;    /* receives, in order */
  mcclPark park;                  /* collective frames that arrived before their receive (park.h);
                                     they come before any frame being read, so a posted receive
                                     takes from here first */
  mcclCredit credit;              /* flow control both ways (park.h): this rank's lead over the
                                     peer's receives, and what this rank's receives took */
  mcclXfer credit_x;              /* the CREDIT frame reporting credit.taken (owned here) */
  int credit_queued;              /* owner: credit_x is on the send queue (until complete) */
  uint8_t taken_coll;             /* owner, for the trace: the collective of the last frame taken */
  uint64_t taken_seq;             /*   and its sequence number */
  atomic_int credit_blind;        /* 1: the owner is not reading this connection (it holds a
                                     frame it cannot place), so reports cannot reach it: sends go
                                     on without credit, held by TCP's window as without credits */
  atomic_int credit_lost;         /* 1: a CREDIT frame could not be written (the peer left); no
                                     more are sent, and the failure is left to any later frame */
  int ahead_stop;                 /* 1: nothing is wanted from this peer and what arrives next
                                     is not a collective frame the park can take (a failure
                                     notice, a point-to-point message, a close, a frame too
                                     large): stop reading ahead until a receive is posted or
                                     the park frees room */
  char abort_reason[MCCL_MAX_ABORT_REASON + 1]; /* an ABORT frame's reason as it arrives */
  int dead;                       /* 1: the peer or this rank failed, later use is an error;
                                     2: also the peer's end is closed (seen while lingering) */
  char dead_reason[160];
} mcclConn;

/* What the owner's arrive hook answers (mcclP2pHooks.arrive). */
enum {
  MCCL_ARRIVE_OK = 0,      /* *dst and *room say where the next bytes go */
  MCCL_ARRIVE_HOLD = 1,    /* not now (a budget is full, or memory is short): stop reading this
                              connection; the transport asks again, with the same arguments, at
                              the start of every later progress round */
  MCCL_ARRIVE_BROKEN = -1, /* the frame breaks the protocol: mcclProtocolError */
  MCCL_ARRIVE_NOMEM = -2   /* this rank cannot take the bytes and cannot wait: mcclSystemError */
};

/* Point-to-point frames are not the transport's to match: its owner (the engine) says where each
 * one goes. All callbacks run on the engine thread, inside mcclTransportProgress. */
typedef struct {
  void* ctx;
  /* A P2P frame from `peer` (its header passed mcclFrameHeaderCheck, so its payload lies inside
   * its message) has `done` of its payload bytes read (0: just the header): set *dst to where the
   * next bytes go (NULL: discard them) and *room to how many may go there (1 up to the frame's
   * remaining bytes; 0 when none remain), and return MCCL_ARRIVE_OK. The transport asks again
   * whenever the room is used up before the frame ends, so an owner can grow a buffer as bytes
   * arrive instead of trusting the length a header claims. MCCL_ARRIVE_HOLD: the owner changed
   * nothing and wants to be asked again later. Negative: `why` says what went wrong, and the
   * transport fails naming the peer (MCCL_ARRIVE_BROKEN: mcclProtocolError; MCCL_ARRIVE_NOMEM:
   * mcclSystemError). */
  int (*arrive)(void* ctx, int peer, const mcclFrame* f, size_t done, char** dst, size_t* room,
                char* why, size_t cap);
  /* That frame's payload has landed. */
  void (*landed)(void* ctx, int peer, const mcclFrame* f);
  /* Nonzero while a receive is posted that frames from `peer` could satisfy. */
  int (*wanted)(void* ctx, int peer);
  /* Runs first in every progress round: the owner posts new work and retires finished work.
   * Anything but mcclSuccess ends the round with that result (the owner wrote t->error). */
  mcclResult_t (*round)(void* ctx);
} mcclP2pHooks;

/* The sending side's thread (tcp.c); NULL in a transport whose owner sends too. */
typedef struct mcclSender mcclSender;

/* Dials, accepts and handshakes (tcp_connect.c): at init for the whole mesh, and with runtime
 * connection also during collectives, for the peers they need. */
typedef struct mcclConnector mcclConnector;

typedef struct mcclTransport {
  int rank, nranks;
  mcclConn* conns;                /* [nranks]; conns[rank] unused */
  mcclConnector* connector;       /* NULL once no connection can be made any more: the mesh is
                                     complete (eager), or FromFds, or after a failure */
  int wake[2];                    /* self-pipe: mcclTransportWake interrupts a poll */
  atomic_int wake_pending;        /* a byte is in the pipe and not yet drained: no need for more */
  mcclSender* sender;             /* see mcclTransportStartSender */
  struct pollfd* pfds;            /* scratch for mcclTransportProgress: the connections, the
                                     connector's sockets and the wake pipe */
  int* pfd_peer;
  char self_addr[MCCL_ADDR_STRLEN];
  mcclP2pHooks p2p;               /* zeroed: no point-to-point traffic expected */
  int idle;                       /* the last progress round had nothing to poll */
  int relay_moved;                /* this round landed bytes a relaying send may forward
                                     (mcclTransportPostRelay): the owner writes them at once */
  int copy_handoff;               /* MCCL_SEND_THREAD_COPY: copy-only schedules hand their
                                     frames to the sender thread too */
  int owner_writes;               /* 1: with a sender thread, the owner writes every frame and the
                                     thread is halted: the load rule says so
                                     (mcclTransportCollectiveEnd), or a copy-only schedule runs with
                                     copy_handoff 0 (mcclTransportCopySchedule) */
  int copy_owned;                 /* owner_writes is the copy-only schedule's, for its duration */
  int load_pct;                   /* MCCL_SEND_THREAD_LOAD (0 where the platform has no thread
                                     CPU clock): the load rule's bound, % of a core */
  int64_t load_t0, load_cpu0;     /* the measured collective's start: wall, the threads' CPU (ns) */
  int64_t load_wall, load_cpu;    /* the window so far: measured collectives' wall and CPU time */
  uint64_t load_flips;            /* times the load rule moved the writing between the threads */
  int load_low;                   /* windows in a row, the thread writing, under the hand-back line */
  int load_lent;                  /* the owner writes by the rule, but this collective's schedule
                                     has the thread write (mcclTransportCollectiveBegin: overlap) */
  uint64_t load_lends;            /* collectives lent to the thread so */
  size_t inline_max;              /* MCCL_SEND_INLINE_BYTES: with a sender thread, frames smaller
                                     than this that find their queue empty are written by the
                                     owner at once (tcp.c, postSend) */
  int lowat_max;                  /* MCCL_RECV_LOWAT: the most bytes a socket's receive low-water
                                     mark asks for before poll() reports it readable; 0: never set */
  char error[768];                /* why the last call failed */
  char silent[256];               /* after mcclTransportFail: live peers that neither reported a
                                     failure nor closed during the linger ("" if none) */
  int silent_ms;                  /* how long that linger listened, in ms */
  uint64_t settled;               /* collectives this rank completed (mcclTransportSettle): the
                                     ABORT frames of mcclTransportFail carry it */
  uint64_t running;               /* 1 + the run-order number of the collective in progress
                                     (mcclTransportCollectiveBegin), 0 between collectives: a
                                     notice read ahead that its sender did not complete that one
                                     fails it at once (tcp.c, aheadHeader) */
  mcclFrame running_id;           /* while running: the header fields every frame of that
                                     collective carries (kind, dtype, op, root, seq, call site) */
  struct mcclTrace* trace;        /* the owner's recorder (core/trace.h), or NULL: frames' send,
                                     receive, waits and full sockets are recorded there */
} mcclTransport;

/* What a rank needs to authenticate its peers. */
typedef struct {
  uint8_t token[MCCL_TOKEN_BYTES];
  uint64_t generation, comm_hash;
} mcclTransportAuth;

/* While the mesh opens: has another rank given up on this init? The owner (comm.c) asks the
 * bootstrap store, where a rank whose init failed publishes why. `failed` returns 1 and writes
 * that rank's reason (naming it) to why[cap], else 0. It is called on the thread that called
 * mcclTransportInit, at most every MCCL_INIT_WATCH_MS. */
typedef struct {
  void* ctx;
  int (*failed)(void* ctx, char* why, size_t cap);
} mcclTransportWatch;

#define MCCL_INIT_WATCH_MS 200

/* Open the mesh: connect to every lower rank, accept every higher rank on `listen_fd`, with the
 * hello/ack handshake in both directions, until `deadline_ns` (mcclNowNs clock). Connections that
 * fail the handshake (strangers, wrong token or generation, out-of-range ranks) are closed and
 * logged; the mesh goes on. A second valid hello for a rank that has one (an impostor holding
 * the job token, tcp_connect.c claimedTwice) fails the mesh, naming both addresses.
 * `peer_addrs[r]` is rank r's published address. Once its own connections are open a rank sends
 * READY on each and returns only when every peer has sent its READY, so that no rank's init
 * succeeds while another's fails. The transport owns `listen_fd` from the call on, whatever it
 * returns.
 *
 * With `runtime_connect` set, nothing is dialled here: the transport keeps `listen_fd` and
 * connects to a peer when a transfer with it is first posted (NCCL's runtime connection), so a
 * rank holds sockets only to the peers its collectives and point-to-point calls use (a ring's 2
 * neighbours, the log2 n partners of recursive doubling and of the dissemination agreement, ...).
 * The rule is the mesh's: the higher rank dials, the lower one accepts (in every progress round
 * and in mcclTransportReadAhead, which an idle engine calls unless MCCL_IDLE_READ=0), with the
 * same handshake and the same checks. A lower rank with a send for a higher rank that has not
 * dialled within 50 ms (it is late, or issued another collective that needs nothing from the
 * lower rank) asks it to, and again each second while the send waits (wire.h,
 * MCCL_HELLO_KIND_ASK): the other collective's frames then arrive and fail it as a mismatch
 * rather than at the timeout. A receive from any
 * source makes a rank dial every lower rank (any of them may send). A dial or an ask
 * that is refused three times in a row (50 ms apart) fails the collective at once: the peer's
 * communicator is gone (its process exited, or its communicator failed, which closes its
 * listener, or was destroyed): a higher rank gone before it dialled is found so by the asks of a
 * rank with a send for it, in about 150 ms. A higher peer that never dials otherwise (it is
 * stalled, or this rank only receives from it) is named by the collective's timeout.
 * There is no READY exchange: a rank whose init fails after the address table is published
 * (it cannot start its threads, say) fails its peers' first collective with it instead.
 *
 * Failures that waiting cannot cure end it at once with t->error naming the cause: a descriptor
 * limit (EMFILE, ENFILE: the message gives the soft RLIMIT_NOFILE, as `ulimit -n` shows it, and
 * what a group of this size needs) or another resource error in socket() or accept(), an address
 * that does not parse (mcclSystemError or mcclInvalidArgument), or another rank's published
 * failure (`watch`, may be NULL: mcclRemoteError). A dial that fails for a reason that may pass
 * (refused, reset, unreachable) is retried; the last reason for each missing rank is in the
 * timeout's message. */
mcclResult_t mcclTransportInit(mcclTransport* t, int rank, int nranks, int listen_fd,
                               char (*peer_addrs)[MCCL_ADDR_STRLEN], const mcclTransportAuth* auth,
                               const mcclTransportWatch* watch, int64_t deadline_ns, int runtime_connect);

/* Connections open now (for logs, tests and tools: descriptors in use grow with it). */
int mcclTransportConnected(const mcclTransport* t);

/* For tests and fuzzers: a transport of `nranks` whose connections are already-connected stream
 * sockets (fds[r] < 0: none; the transport owns and closes the others), without a handshake. */
mcclResult_t mcclTransportFromFds(mcclTransport* t, int rank, int nranks, const int* fds);

void mcclTransportPostSend(mcclTransport* t, int peer, mcclXfer* x);
void mcclTransportPostRecv(mcclTransport* t, int peer, mcclXfer* x);

/* mcclTransportPostSend for a frame that must not leave before the receives gate[0..ngate-1]
 * (posted on this transport, kept until this send completes) have completed: it takes its place
 * in the link's order now, and it and the collective frames queued behind it on its link go out
 * once the gates' frames have arrived (and so matched); P2P frames behind it go out meanwhile. The transport lets it go by itself, whoever waits
 * meanwhile: an algorithm fixes the order of a link at once, while the frame's departure follows
 * other links' arrivals (the agreement's chain, algo.h). */
void mcclTransportPostAfter(mcclTransport* t, int peer, mcclXfer* x, mcclXfer* gate, int ngate);

/* Cut-through forwarding: post `x` to carry the payload of the receive `from` (posted on this
 * transport; x->buf and x->bytes are set to its buffer and length, x->frame is the header to
 * send) as it lands, instead of after it completed. Its header leaves once the first payload
 * bytes have arrived (so the incoming header was checked), and each write sends no more than has
 * landed; the frame is then mid-write, so nothing else leaves on its link until the receive's
 * bytes complete it. A chain's hop then costs a socket read's worth of bytes instead of a whole
 * segment (with MCCL_RECV_LOWAT set, that many bytes; algo/ring.c). `from` must stay posted,
 * with its buffer untouched, until `x` completes, even after `from` itself completed. A failed
 * receive leaves `x` half-written, which the failure path treats as any half-written frame
 * (tcp_fail.c: no ABORT frame after it, only the connection's close, so the next rank names
 * this one, not the cause). In a trace, the send's span includes its waits for the receive. */
void mcclTransportPostRelay(mcclTransport* t, int peer, mcclXfer* x, mcclXfer* from);

/* One round: wait (until `deadline_ns` at most) for any posted transfer to make progress and move
 * as many bytes as the sockets take (with a sender thread: the receives; the sends move there).
 * Returns mcclSuccess (maybe with nothing completed),
 * mcclTimeout when the deadline passed with transfers still posted, mcclAborted when `abort_flag`
 * is set, or the error of a peer (mcclRemoteError, mcclMismatch, mcclProtocolError,
 * mcclSystemError) with t->error saying which peer and which frame. */
mcclResult_t mcclTransportProgress(mcclTransport* t, int64_t deadline_ns, atomic_int* abort_flag);

/* Move the sending side onto a thread of its own ("mccl-send"): posted sends are written there,
 * in the same per-peer FIFO order, and each completion wakes the owner's mcclTransportProgress.
 * A write error is reported by the owner's next mcclTransportProgress, like a receive error.
 * Returns mcclSystemError (t->error says why) when the thread or its pipe cannot be made; the
 * transport then keeps sending on the owner's thread. */
mcclResult_t mcclTransportStartSender(mcclTransport* t);

/* Join the sender thread (a no-op without one); the sends still queued stay queued and move on
 * the owner's thread again. mcclTransportFail and mcclTransportClose call it first. */
void mcclTransportStopSender(mcclTransport* t);

/* A schedule that only copies (no reduction: the broadcast chain, the all-gather ring) starts
 * (on = 1), ends (on = 0), or ends with an error (on = -1: the sender thread stays halted, as
 * mcclTransportHalt leaves it). With MCCL_SEND_THREAD_COPY=0 and a sender thread, the owner
 * writes its own frames in between, as without a thread, and the sender thread waits: an owner
 * with no reductions to overlap gains nothing from the handoff and pays a wake-up each way per
 * frame (bench/NOTES.md, 2026-12-06 seventh session). Frames stay in posting order. Owner thread
 * only; a no-op without a sender thread, with MCCL_SEND_THREAD_COPY=1, or for a schedule whose
 * frames (frame_bytes, the largest payload) are under MCCL_SEND_INLINE_BYTES, which the owner
 * writes itself anyway when their queue is empty. */
void mcclTransportCopySchedule(mcclTransport* t, int on, size_t frame_bytes);

/* The sender thread's load rule (MCCL_SEND_THREAD_LOAD, docs/ENVIRONMENT.md). The handoff to
 * mccl-send costs a thread wake-up each way per frame, and pays only where one thread cannot keep
 * up with the link: at 5 Gbit/s it bought nothing and cost 2-12 points of a core, at 10 Gbit/s
 * the engine alone saturated on 64 MiB and fell to 85% of goodput (bench/NOTES.md, 2026-12-06
 * sixth session). So with a sender thread the owner writes its own frames, the thread halted,
 * until the collectives of at least 1 MiB over a window of at least 50 ms of their wall time
 * used MCCL_SEND_THREAD_LOAD % of a core or more on the owner thread (CPU time, the kernel's
 * work charged to it included: mcclThreadCpuNs); then the thread writes, until the two threads
 * together use less than 70% of the bound over two windows in a row (mcclLoadRuleWant). The rule
 * is per rank: ranks may differ.
 * 0: the thread writes every frame (the rule off; also where the platform has no thread CPU
 * clock); -1: the writing changes hands after every measured collective (tests: every hand-over
 * exercised). `bytes`: the collective's whole buffer (for an `overlap` one, its largest block).
 * `overlap`: its schedule has no pipeline to keep both directions busy (all-to-all's pairwise
 * steps, a block out and a block in per step), so the thread writes it whatever the load where
 * its blocks reach MCCL_SEND_INLINE_BYTES (smaller ones are written inline anyway), and it is
 * never measured: the only comparison there is
 * (8 emulated hosts, 16 MiB, 5 Gbit/s) had it at 96.6% of goodput with the thread and 84.3%
 * without at a load far under the bound. Owner thread only, around each collective
 * (core/engine.c); no-ops without a sender thread. End with the collective's result: after an
 * error the writing changes hands no more (a lent collective's goes back, the thread halted).
 * `id`: a header of the collective's frames (mcclAlgoFrame; its seq is the run-order number, and
 * step, offset, length and count are not looked at). From Begin to End, what arrives from a peer
 * about this collective is acted on as soon as it arrives, even on a link nothing is posted on
 * (read ahead), rather than when a receive for it is posted (which may be never, or after the
 * timeout where this rank is blocked on another rank that is itself blocked):
 *  - a failure notice that says its sender did not complete collective seq fails it (as
 *    mcclTransportSettle would);
 *  - a frame with its seq but another kind, dtype, op, root or call site (its sender issued
 *    another collective in that place) fails it with mcclMismatch; Begin itself returns that
 *    error for such a frame that arrived before (parked). Counts are not compared here
 *    (an algorithm's phases may send frames of another count: the reduce-scatter by doubling
 *    sends the whole array's); a posted receive compares every field. */
mcclResult_t mcclTransportCollectiveBegin(mcclTransport* t, const mcclFrame* id, size_t bytes, int overlap);
void mcclTransportCollectiveEnd(mcclTransport* t, mcclResult_t res);

/* The load rule's decision after a window that used `pct` % of a core (load_pct > 0, the bound):
 * 1 when the thread should write the next collectives, 0 when the owner. `helped`: the thread
 * writes now. `*low` (0 at first): helped windows in a row under the hand-back line, updated.
 * The owner hands over at the bound; the thread hands back after two windows in a row under
 * 70% of it. Pure: tests/c/test_send_load.c runs it on sequences of loads. */
int mcclLoadRuleWant(int helped, int64_t pct, int load_pct, int* low);

/* Keep the sender thread (if any) off every posted transfer until the next
 * mcclTransportProgress: for an owner about to unwind after an error, whose posted transfers go
 * away with it. Returns once the thread has let go of them. mcclTransportProgress does this
 * itself before it returns an error. */
void mcclTransportHalt(mcclTransport* t);

/* Sleep until mcclTransportWake or `timeout_ms` (for an owner whose work all waits on others). */
void mcclTransportIdleWait(mcclTransport* t, int timeout_ms);

/* For an owner with nothing posted (between collectives): wait up to `timeout_ms`, or until
 * mcclTransportWake, for collective frames that peers send ahead, and read them into their parks
 * (park.h), as a round inside a collective does. Only DATA frames that fit are taken; anything
 * else (a failure notice, a P2P frame, a close) stops the reading of that connection until a
 * receive is posted on it, as inside a collective. Without this, a rank that starts a collective
 * late leaves its peers' first segments in the kernel, its receive window closes, and the link
 * into it stalls for the rest of the lateness (bench/NOTES.md, 2026-12-03). *polled is 0 when no
 * connection could take a frame (parks full, or stopped): the owner may then wait without the
 * sockets. Errors: those of a frame being parked (a malformed header, a peer lost mid-payload). */
mcclResult_t mcclTransportReadAhead(mcclTransport* t, int timeout_ms, int* polled);

/* Forget every posted transfer (after an error: their buffers are no longer referenced); a sender
 * thread is halted first (mcclTransportHalt). */
void mcclTransportCancel(mcclTransport* t);

/* Interrupt a blocked mcclTransportProgress from any thread. */
void mcclTransportWake(mcclTransport* t);

/* After any error: best effort, send an ABORT frame with `reason` (and t->settled, the number of
 * collectives this rank completed, in its seq field) to each peer that is not in the middle of a
 * frame, shut the sending side of every connection so that peers blocked on this rank fail at
 * once, forget every posted transfer (without touching them: their owners may have returned),
 * and linger up to MCCL_FAIL_LINGER_MS reading what peers still send so that the ABORT frames
 * arrive. t->silent then names the peers that stayed silent all along (no failure report, no
 * close): when every other rank reports its failure, a silent one is the likely stalled rank, or
 * one whose notice could not cross a slow link in time (t->silent_ms says how long it had). With
 * runtime connection a peer this rank had no link with gets a NOTICE connection and owes an
 * answer on it as on a link; meanwhile this rank accepts and closes every connection made to it
 * (mcclConnectorCloseWaiting), which answers the NOTICEs of other failing ranks. The linger ends
 * early once every peer has closed. */
void mcclTransportFail(mcclTransport* t, const char* reason);

/* Before the owner reports collective `seq` (its run-order number) as succeeded on this rank:
 * look, without blocking, at what every peer's connection already holds. If the next frame from
 * a peer is an ABORT whose sender had completed fewer than seq + 1 collectives (it failed this
 * collective or an earlier one), read it and return mcclRemoteError, t->error naming that peer
 * and its reason: the owner then fails the collective too, as that peer did. Otherwise record
 * `seq` as completed (t->settled) and return mcclSuccess.
 *
 * Only a notice that is already here counts: one that arrives later fails the owner's next call.
 * A connection whose next bytes belong to another frame (the peer's next collective, which it
 * could only start after completing this one; a point-to-point message nobody has received yet;
 * a frame half read) is not looked past. A peer that closed or reset its connection without a
 * notice (it exited after its last collective, or was killed) does not fail the collective: every
 * byte this rank needed from it has arrived. */
mcclResult_t mcclTransportSettle(mcclTransport* t, uint64_t seq);

/* After the last collective: the number of peers that sent bytes this rank never read (their
 * ranks listed in `desc`): ranks that issued different collectives, where no receiver could tell
 * at the time (e.g. broadcasts whose roots differ). */
int mcclTransportUnread(mcclTransport* t, char* desc, size_t cap);

/* Read the CREDIT frames (wire.h) at the front of `peer`'s stream, and only those: for the
 * failure side (tcp_fail.c), which looks for a notice behind them. Fails on a report that does not
 * fit what was sent (mcclProtocolError). Owner's thread. */
mcclResult_t mcclTransportTakeCredits(mcclTransport* t, int peer);

/* 1 when every peer published the same host address as this rank (all ranks on one machine, so
 * every byte crosses loopback and the CPU, not a wire, is the bottleneck), else 0. Transports made
 * by mcclTransportFromFds have no addresses: 0. */
int mcclTransportSingleHost(const mcclTransport* t);

/* Close every socket and free the transport's memory. */
void mcclTransportClose(mcclTransport* t);

/* In a child of fork(): close this process's copies of the transport's descriptors (sockets,
 * listener, handshakes in progress, wake pipe) and nothing else; only close() is called. */
void mcclTransportForgetDescriptors(mcclTransport* t);

/* ---- between the transport's files (not for its owner) ---------------------------------- */

/* tcp.c: a connection the connector opened to `peer` becomes its link (the sender thread, if
 * any, is told). */
void mcclTransportAdopt(mcclTransport* t, int peer, int fd);

/* tcp.c: before poll() watches link `c` for input. With MCCL_RECV_LOWAT > 0 the socket's receive
 * low-water mark (SO_RCVLOWAT) is set to the bytes its reader waits for: the rest of a header, or
 * the rest of a payload (at most MCCL_RECV_LOWAT), so that the kernel reports it readable once,
 * when they are there, not at every burst that arrives. any != 0: any byte (the failure side's
 * drain). A close or an error is reported whatever the mark. One setsockopt() when it changes. */
void mcclTransportWatchIn(mcclTransport* t, mcclConn* c, int any);

/* tcp_connect.c, with runtime connection (t->connector != NULL after init). */
/* A transfer with `peer` is posted and it has no connection: dial it if it is lower (once; again
 * after a failure that may pass), else wait for its dial; where `sending` (a send to it is queued)
 * ask for that dial if it has not come within MCCL_ASK_AFTER_MS (tcp_connect.c), and again each
 * MCCL_ASK_AGAIN_MS while the send waits. Errors: a dial that cannot be made
 * (a descriptor limit, an address that does not parse) or is refused again and again; t->error
 * names the peer and the cause. */
mcclResult_t mcclConnectorWant(mcclTransport* t, int peer, int sending);
/* Start the redials and asks that are due, then append the connector's sockets (listener, dials,
 * handshakes) to pfds from index *np, which it advances. *wait_ms is lowered to the next redial
 * when one is due sooner. Errors: those of mcclConnectorWant. */
mcclResult_t mcclConnectorPollAdd(mcclTransport* t, struct pollfd* pfds, int* np, int64_t* wait_ms);
/* Handle what poll() reported for the entries [first, np) that mcclConnectorPollAdd added. */
mcclResult_t mcclConnectorHandle(mcclTransport* t, const struct pollfd* pfds, int first, int np);
/* Why `peer` has no connection yet, for a timeout's message. */
void mcclConnectorDescribe(const mcclTransport* t, int peer, char* out, size_t cap);
/* A failing rank (mcclTransportFail): each dial whose hello is out becomes a link (its peer may
 * have taken it as one already), so that it gets the ABORT frame; the other handshakes close. The
 * listener stays open (its dialers wait instead of being refused) until mcclConnectorFree. */
void mcclConnectorFailing(mcclTransport* t);
/* A failing rank (mcclTransportFail), with runtime connection: each connection that claimed a rank
 * claimed already (the communicator's failure, tcp_connect.c claimedTwice) gets an ACK and the
 * ABORT frame (`hdr`, then `len` bytes of reason), so that a real rank refused as the second
 * claimant fails with the reason instead of redialling; then it closes. */
void mcclConnectorTellClaimants(mcclTransport* t, const uint8_t* hdr, const char* reason, size_t len);
/* The listening socket while the connector lives (runtime connection), else -1. */
int mcclConnectorListener(const mcclTransport* t);
/* A failing rank's linger: accept each connection waiting on the listener and close it at once,
 * unread, so that a peer that sent a NOTICE there hears that this rank is alive (a reset or an
 * end of stream) instead of taking it for a stopped one. */
void mcclConnectorCloseWaiting(mcclTransport* t);
/* A failing rank's NOTICE to `peer`, which it has no link with (wire.h): a connecting socket, or
 * -1; once it is writable, mcclConnectorNoticeSend writes the NOTICE hello and the ABORT frame
 * (`hdr`, then `len` bytes of reason) in one go: 0, or -1 when it could not. */
int mcclConnectorNoticeDial(mcclTransport* t, int peer);
int mcclConnectorNoticeSend(mcclTransport* t, int fd, int peer, const uint8_t* hdr, const char* reason, size_t len);
/* Close the listener and every handshake in progress, and free the connector. */
void mcclConnectorFree(mcclTransport* t);
/* The most pollfd entries mcclConnectorPollAdd appends, for a transport of `nranks`. */
int mcclConnectorMaxPoll(int nranks);

/* mcclCollName, mcclDtypeName, mcclOpName and mcclFrameDescribe (for error messages) are declared
 * in wire.h. */

#endif
