/* param.c: the table of MCCL_* environment parameters and its read-once cache. */
#include "core/param.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/debug.h"

typedef struct {
  const char* name;
  int64_t default_value; /* for integer parameters */
  int64_t min, max;      /* accepted range; values outside it are refused with a warning */
  int is_string;
  const char* raw;       /* the environment's value, or NULL */
  int64_t value;
} mcclParam;

/* Keep in step with docs/ENVIRONMENT.md. */
static mcclParam params[] = {
    {"MCCL_DEBUG", 0, 0, 0, 1, NULL, 0},
    {"MCCL_DEBUG_SUBSYS", 0, 0, 0, 1, NULL, 0},
    {"MCCL_SOCKET_IFNAME", 0, 0, 0, 1, NULL, 0},
    {"MCCL_SOCKET_FAMILY", 0, 0, 0, 1, NULL, 0},
    /* Messages of at least this many bytes use the ring; smaller ones recursive doubling/trees. */
    {"MCCL_RING_THRESHOLD", 256 * 1024, 0, INT64_MAX, 0, NULL, 0},
    /* Bytes: the network's latency x bandwidth product (Hockney's alpha x beta): messages much
     * smaller are latency-bound. The choices that trade rounds for bytes compare against it
     * (algo/select.c); 32K is switched 10 GbE's ~30 us x ~1.1 GB/s. Every rank must be given the
     * same. */
    {"MCCL_ALPHA_BETA", 32 * 1024, 1, (int64_t)1 << 40, 0, NULL, 0},
    /* Bytes per ring frame: the unit that is sent, received and reduced as one pipeline stage. */
    {"MCCL_SEGMENT_BYTES", 256 * 1024, 4096, 1 << 30, 0, NULL, 0},
    /* 1: the broadcast chain forwards a segment's bytes as they land (cut-through: a hop costs a
     * socket read, not a segment; transport/tcp.h, mcclTransportPostRelay); 0: a segment leaves a
     * rank once all of it has arrived (store-and-forward), in smaller frames (mcclChainSegmentBytes).
     * Every rank must be given the same. */
    {"MCCL_CHAIN_RELAY", 1, 0, 1, 0, NULL, 0},
    /* Frames in flight per ring link (posted receives and sends ahead of the reducer). */
    {"MCCL_PIPELINE_DEPTH", 4, 1, 64, 0, NULL, 0},
    /* Pairwise all-to-all steps in flight at once for blocks of 2 x MCCL_ALPHA_BETA and up (0: all
     * n-1; -1: 1 across hosts, all when every rank is on one machine). */
    {"MCCL_ALLTOALL_WINDOW", -1, -1, 1 << 20, 0, NULL, 0},
    /* Communicators of up to this many ranks check that a collective matches with an empty
     * frame to and from every rank (one hop); larger ones with the dissemination agreement
     * (ceil(log2 n) hops, 2 ceil(log2 n) frames; algo/algo.h). Every rank must be given the same. */
    {"MCCL_ANNOUNCE_RANKS", 16, 0, 1 << 30, 0, NULL, 0},
    /* 1: the torch shim tags every collective with the place in the Python program that issued
     * it (mcclOpOptions_t.call_site), so that collectives issued from two places never pair up.
     * Every rank must be given the same. */
    {"MCCL_CHECK_CALL_SITES", 0, 0, 1, 0, NULL, 0},
    /* 1: connect to a peer when a transfer with it is first posted (transport/tcp.h); 0: the
     * full mesh at init; -1: 1 above MCCL_ANNOUNCE_RANKS ranks. Every rank must be given the same. */
    {"MCCL_RUNTIME_CONNECT", -1, -1, 1, 0, NULL, 0},
    /* 1: a communicator writes its sockets on a thread of its own ("mccl-send") while the
     * engine thread receives and reduces; 0: the engine thread does all three; -1: 1 when
     * this rank may run on two CPUs and the ranks sharing its CPUs have two each (core/host.h). */
    {"MCCL_SEND_THREAD", -1, -1, 1, 0, NULL, 0},
    /* Bytes: with a sender thread, a frame smaller than this that finds its link's queue empty is
     * written by the engine thread at once instead of handed over (transport/tcp.c). */
    {"MCCL_SEND_INLINE_BYTES", 64 * 1024, 0, 1 << 30, 0, NULL, 0},
    /* 1: schedules that only copy (the broadcast chain, the all-gather ring) hand their frames to
     * the sender thread like the others; 0: their engine thread writes them (transport/tcp.h,
     * mcclTransportCopySchedule). */
    {"MCCL_SEND_THREAD_COPY", 1, 0, 1, 0, NULL, 0},
    /* % of a core: with a sender thread, the owner thread's load from which the thread takes the
     * writing over (transport/tcp.h, mcclTransportCollectiveEnd); 0: the thread always writes;
     * -1: the writing changes hands after every collective (tests). */
    {"MCCL_SEND_THREAD_LOAD", 85, -1, 1000, 0, NULL, 0},
    /* Bytes of point-to-point messages that arrived before their recv, parked per peer; past it
     * that peer's connection is not read until recvs claim them (TCP backpressure, core/p2p.c). */
    {"MCCL_P2P_PARK_BYTES", 64 << 20, 0, (int64_t)1 << 50, 0, NULL, 0},
    /* Bytes of collective frames that arrived before their receive, parked per peer so that the
     * connection is read on (transport/park.h); -1: (MCCL_PIPELINE_DEPTH + 2) x
     * MCCL_SEGMENT_BYTES; 0: no parking (such a frame stops the reading: TCP backpressure). */
    {"MCCL_PARK_BYTES", -1, -1, (int64_t)1 << 40, 0, NULL, 0},
    /* 1: an engine with no collective to run still reads peers' early frames into the parks
     * (mcclTransportReadAhead); 0: it waits on its queue alone, the sockets unread. */
    {"MCCL_IDLE_READ", 1, 0, 1, 0, NULL, 0},
    /* 1: a rank starts a collective frame only while its lead over what the peer's receives took
     * fits the peer's park (transport/park.h, CREDIT frames); 0: TCP's window alone holds it. */
    {"MCCL_CREDITS", 1, 0, 1, 0, NULL, 0},
    /* Bytes: while a frame is partly read, its socket's SO_RCVLOWAT asks for the rest (at most
     * this many) before poll() wakes the engine: fewer wake-ups and reads per frame, at the cost
     * of reading each frame later (transport/tcp.c; bench/NOTES.md has the trade); 0: the
     * kernel's default of 1 byte. */
    {"MCCL_RECV_LOWAT", 0, 0, 1 << 30, 0, NULL, 0},
    /* A TCP congestion control for this rank's sockets (Linux TCP_CONGESTION: "cubic", "reno",
     * "bbr", ...); unset: the system's default (transport/socket.h). */
    {"MCCL_TCP_CONGESTION", 0, 0, 0, 1, NULL, 0},
    /* SO_SNDBUF/SO_RCVBUF in bytes; 0 leaves the kernel's autotuning on. */
    {"MCCL_SOCKET_BUFSIZE", 0, 0, 1 << 30, 0, NULL, 0},
    /* MPS tensors: 1 reduces in place in unified memory; 0 stages every bucket through CPU
     * memory with a wait (the paper's ablation). Read by the torch shim through mcclGetEnvInt. */
    {"MCCL_UNIFIED_COLLECTIVE", 1, 0, 1, 0, NULL, 0},
    /* A path prefix: each communicator writes a Chrome trace of its collectives and links to
     * <prefix>.<communicator>.rank<r>.json (core/trace.h). Unset: no tracing. */
    {"MCCL_TRACE", 0, 0, 0, 1, NULL, 0},
    /* "ring" or "tree"/"doubling": every collective uses that family (algo/select.h), as
     * NCCL_ALGO does; unset: chosen by size. Every rank of a job must be given the same. */
    {"MCCL_ALGO", 0, 0, 0, 1, NULL, 0},
    /* This process's topology group (switch, room), or a map (file or "key=group,...") from
     * addresses, networks and host names to groups: rings keep each group's ranks together
     * (core/topology.h). Unset: groups by subnet. */
    {"MCCL_TOPOLOGY_GROUP", 0, 0, 0, 1, NULL, 0},
    {"MCCL_TOPOLOGY", 0, 0, 0, 1, NULL, 0},
    /* Events a trace keeps per communicator (64 bytes each); later ones are counted, not kept. */
    {"MCCL_TRACE_EVENTS", 1 << 20, 1, (int64_t)1 << 28, 0, NULL, 0},
};

static pthread_once_t params_once = PTHREAD_ONCE_INIT;

extern char** environ;

#define NPARAMS (sizeof(params) / sizeof(params[0]))

/* Optimal string alignment distance (Levenshtein plus adjacent transpositions), ignoring case.
 * Parameter names are short: a name of W bytes or more is taken as W away from everything. */
static int nameDistance(const char* a, size_t la, const char* b, size_t lb) {
  enum { W = 64 };
  if (la >= W || lb >= W) return W;
  int d[W][W];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int ca = toupper((unsigned char)a[i - 1]), cb = toupper((unsigned char)b[j - 1]);
      int best = d[i - 1][j - 1] + (ca != cb);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == toupper((unsigned char)b[j - 2]) && toupper((unsigned char)a[i - 2]) == cb &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

/* A variable named like a parameter but not one (MCCL_RING_THRESHHOLD, mccl_algo) is most likely
 * a misspelling that silently changes nothing: warn, naming the parameter it is nearest to. Other
 * MCCL_* names are left alone: the Python tools have variables of their own (MCCL_CLUSTER_ID, ...). */
static void warnNearMisses(void) {
  for (char** e = environ; e != NULL && *e != NULL; e++) {
    const char* eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    if (len < 6 || strncasecmp(*e, "MCCL_", 5) != 0) continue;
    const char* nearest = NULL;
    int best = 3, known = 0; /* nearest: at most 2 edits away (a case difference counts as none) */
    for (size_t i = 0; i < NPARAMS && !known; i++) {
      size_t pl = strlen(params[i].name);
      known = pl == len && strncmp(*e, params[i].name, len) == 0;
      int dist = nameDistance(*e, len, params[i].name, pl);
      if (dist < best) best = dist, nearest = params[i].name;
    }
    if (!known && nearest != NULL)
      fprintf(stderr, "MCCL WARN %.*s is set but is no MCCL parameter, so it changes nothing; did you mean %s? "
              "(docs/ENVIRONMENT.md)\n", (int)len, *e, nearest);
  }
}

static void paramsRead(void) {
  for (size_t i = 0; i < NPARAMS; i++) {
    mcclParam* p = &params[i];
    p->raw = getenv(p->name);
    p->value = p->default_value;
    if (p->raw == NULL || p->is_string) continue;
    /* Decimal only (a leading 0 is not octal), with an optional K/M/G suffix (powers of 1024)
     * for byte sizes; a value that overflows is refused, not wrapped. */
    char* end = NULL;
    errno = 0;
    long long v = strtoll(p->raw, &end, 10);
    int shift = 0;
    if (end != p->raw) {
      if (*end == 'k' || *end == 'K') shift = 10, end++;
      else if (*end == 'm' || *end == 'M') shift = 20, end++;
      else if (*end == 'g' || *end == 'G') shift = 30, end++;
    }
    if (end == p->raw || *end != '\0' || isspace((unsigned char)p->raw[0])) {
      fprintf(stderr, "MCCL WARN %s=%s is not a decimal integer (with an optional K, M or G suffix); using %lld\n",
              p->name, p->raw, (long long)p->default_value);
      continue;
    }
    const long long unit = (long long)1 << shift;
    int overflow = errno == ERANGE || v > INT64_MAX / unit || v < INT64_MIN / unit;
    if (!overflow) v *= unit;
    if (overflow || v < p->min || v > p->max) {
      fprintf(stderr, "MCCL WARN %s=%s is outside %lld..%lld; using %lld\n", p->name, p->raw,
              (long long)p->min, (long long)p->max, (long long)p->default_value);
      continue;
    }
    p->value = v;
  }
}

static void paramsInit(void) {
  warnNearMisses();
  paramsRead();
}

void mcclParamReload(void) {
  pthread_once(&params_once, paramsInit);
  paramsRead();
}

static mcclParam* paramFind(const char* name) {
  pthread_once(&params_once, paramsInit);
  for (size_t i = 0; i < NPARAMS; i++)
    if (strcmp(params[i].name, name) == 0) return &params[i];
  return NULL;
}

int64_t mcclParamInt(const char* name) {
  mcclParam* p = paramFind(name);
  return p ? p->value : 0;
}

const char* mcclParamString(const char* name) {
  mcclParam* p = paramFind(name);
  return p ? p->raw : NULL;
}

/* Called by the logger's one-time init, so it logs through mcclLog directly. */
void mcclParamLogAll(void) {
  pthread_once(&params_once, paramsInit);
  for (size_t i = 0; i < NPARAMS; i++)
    if (params[i].raw != NULL)
      mcclLog(MCCL_LOG_INFO, MCCL_SUB_ENV, __FILE__, __LINE__,
              params[i].is_string ? "%s set by environment to %s" : "%s set by environment to %s: using %lld",
              params[i].name, params[i].raw, (long long)params[i].value);
}

MCCL_API const char* mcclGetEnvName(int index, int* is_string) {
  if (index < 0 || (size_t)index >= NPARAMS) return NULL;
  if (is_string) *is_string = params[index].is_string;
  return params[index].name;
}

MCCL_API mcclResult_t mcclGetEnvInt(const char* name, int64_t* value) {
  mcclParam* p = name ? paramFind(name) : NULL;
  if (p == NULL || p->is_string || value == NULL) {
    mcclSetThreadError("mcclGetEnvInt: %s is not an integer MCCL_* parameter", name ? name : "NULL");
    return mcclInvalidArgument;
  }
  *value = p->value;
  return mcclSuccess;
}
