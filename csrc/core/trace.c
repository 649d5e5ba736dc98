/* trace.c: the recorder of trace.h and its Chrome trace-event JSON writer. */
#include "core/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/param.h"
#include "transport/wire.h"

typedef struct {
  int64_t start_ns, end_ns;
  mcclTraceArgs args;
  int32_t track;
  uint8_t kind;
} mcclTraceEvent;

struct mcclTrace {
  pthread_mutex_t mu;
  int rank, nranks;
  char label[128];
  char path[4096];
  mcclTraceEvent* ev;
  size_t n, cap, limit;
  uint64_t dropped;
  int written;
  struct mcclTrace* next; /* in the list of open traces */
};

static const char* const kKindName[MCCL_TRACE_KINDS] = {
    "send", "send-queued", "window", "recv", "recv-wait", "reduce", "copy", "collective", "park", "credit",
    "report", "grant"};

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static mcclTrace* open_list = NULL;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void flushAtExit(void) { mcclTraceFlushAll(); }
static void registerExit(void) { atexit(flushAtExit); }

mcclTrace* mcclTraceOpen(int rank, int nranks, const char* label) {
  const char* prefix = mcclParamString("MCCL_TRACE");
  if (prefix == NULL || prefix[0] == '\0') return NULL;
  mcclTrace* tr = calloc(1, sizeof(*tr));
  if (tr == NULL) {
    WARN("rank %d: MCCL_TRACE is set but there is no memory for a trace; tracing is off", rank);
    return NULL;
  }
  pthread_mutex_init(&tr->mu, NULL);
  tr->rank = rank;
  tr->nranks = nranks;
  snprintf(tr->label, sizeof(tr->label), "%s", label);
  for (char* c = tr->label; *c; c++) /* it goes into JSON strings as it is */
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
  /* The label goes into a file name: keep letters, digits, '-', '_' and '.'. */
  char safe[128];
  size_t k = 0;
  for (const char* c = label; *c && k + 1 < sizeof(safe); c++)
    safe[k++] = ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '-' || *c == '_' || *c == '.') ? *c : '_';
  safe[k] = '\0';
  snprintf(tr->path, sizeof(tr->path), "%s.%s.rank%d.json", prefix, safe, rank);
  tr->limit = (size_t)mcclParamInt("MCCL_TRACE_EVENTS");
  pthread_once(&exit_once, registerExit);
  pthread_mutex_lock(&open_mu);
  tr->next = open_list;
  open_list = tr;
  pthread_mutex_unlock(&open_mu);
  INFO(MCCL_SUB_INIT, "rank %d: tracing communicator '%s' to %s (at most %zu events)", rank, label, tr->path,
       tr->limit);
  return tr;
}

void mcclTraceSpan(mcclTrace* tr, int track, mcclTraceKind kind, int64_t start_ns, int64_t end_ns,
                   const mcclTraceArgs* args) {
  if (tr == NULL || end_ns < start_ns) return;
  pthread_mutex_lock(&tr->mu);
  if (tr->n == tr->cap && tr->cap < tr->limit) {
    size_t cap = tr->cap ? tr->cap * 2 : 4096;
    if (cap > tr->limit) cap = tr->limit;
    mcclTraceEvent* ev = realloc(tr->ev, cap * sizeof(*ev));
    if (ev != NULL) {
      tr->ev = ev;
      tr->cap = cap;
    }
  }
  if (tr->n < tr->cap) {
    mcclTraceEvent* e = &tr->ev[tr->n++];
    e->start_ns = start_ns;
    e->end_ns = end_ns;
    e->track = track;
    e->kind = (uint8_t)kind;
    if (args) e->args = *args;
    else memset(&e->args, 0, sizeof(e->args));
  } else {
    tr->dropped++;
  }
  pthread_mutex_unlock(&tr->mu);
}

static void trackName(int track, char* out, size_t cap) {
  if (track == 0) snprintf(out, cap, "engine");
  else if (track % 2 == 1) snprintf(out, cap, "send to rank %d", (track - 1) / 2);
  else snprintf(out, cap, "recv from rank %d", (track - 2) / 2);
}

/* Writes the JSON; with tr->mu held. Returns 0, or an errno. */
static int writeTrace(mcclTrace* tr) {
  FILE* f = fopen(tr->path, "w");
  if (f == NULL) return errno ? errno : EIO;
  /* Events are in microseconds of mcclNowNs (CLOCK_MONOTONIC).*/
  char host[256] = "";
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  for (char* c = host; *c; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
  /* Timestamps are of this host's clock: traces of one host line up, others' need not. */
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"nranks\":%d,\"communicator\":\"%s\","
             "\"host\":\"%s\",\"clock\":\"CLOCK_MONOTONIC\",\"events\":%zu,\"dropped\":%" PRIu64
             "},\"traceEvents\":[\n",
          tr->rank, tr->nranks, tr->label, host, tr->n, tr->dropped);
  fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}},\n", tr->rank,
          tr->rank);
  fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", tr->rank,
          tr->rank);
  for (int track = 0; track <= 2 * tr->nranks; track++) {
    if (track != 0 && (track - 1) / 2 == tr->rank) continue;
    char name[64];
    trackName(track, name, sizeof(name));
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
            tr->rank, track, name);
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
            tr->rank, track, track);
  }
  for (size_t i = 0; i < tr->n; i++) {
    const mcclTraceEvent* e = &tr->ev[i];
    const mcclTraceArgs* a = &e->args;
    double ts = (double)e->start_ns / 1e3, dur = (double)(e->end_ns - e->start_ns) / 1e3;
    const char* coll = mcclCollName(a->coll);
    if (e->kind == MCCL_TRACE_COLLECTIVE) {
      fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"cat\":\"collective\",\"name\":\"%s #%" PRIu64 "\","
                 "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"coll\":\"%s\",\"seq\":%" PRIu64 ",\"count\":%" PRIu64
                 ",\"dtype\":\"%s\",\"ok\":%s}}",
              tr->rank, coll, a->seq, ts, dur, coll, a->seq, a->bytes, mcclDtypeName(a->dtype),
              a->failed ? "false" : "true");
    } else {
      fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,"
                 "\"args\":{\"coll\":\"%s\",\"seq\":%" PRIu64 ",\"step\":%u,\"offset\":%" PRIu64
                 ",\"bytes\":%" PRIu64 "}}",
              tr->rank, e->track, e->track == 0 ? "engine" : "link", kKindName[e->kind], ts, dur, coll, a->seq,
              (unsigned)a->step, a->offset, a->bytes);
    }
  }
  fprintf(f, "\n]}\n");
  int err = ferror(f) ? EIO : 0;
  if (fclose(f) != 0 && err == 0) err = errno ? errno : EIO;
  return err;
}

static void writeOnce(mcclTrace* tr) {
  pthread_mutex_lock(&tr->mu);
  if (!tr->written) {
    tr->written = 1;
    int err = writeTrace(tr);
    if (err != 0)
      WARN("rank %d: cannot write the trace of communicator '%s' to %s: %s", tr->rank, tr->label, tr->path,
           strerror(err));
    else
      INFO(MCCL_SUB_INIT, "rank %d: wrote %zu trace events of communicator '%s' to %s%s", tr->rank, tr->n,
           tr->label, tr->path, tr->dropped ? " (some dropped: MCCL_TRACE_EVENTS)" : "");
  }
  pthread_mutex_unlock(&tr->mu);
}

void mcclTraceClose(mcclTrace* tr) {
  if (tr == NULL) return;
  pthread_mutex_lock(&open_mu);
  for (mcclTrace** p = &open_list; *p; p = &(*p)->next)
    if (*p == tr) {
      *p = tr->next;
      break;
    }
  pthread_mutex_unlock(&open_mu);
  writeOnce(tr);
  pthread_mutex_destroy(&tr->mu);
  free(tr->ev);
  free(tr);
}

void mcclTraceFlushAll(void) {
  pthread_mutex_lock(&open_mu);
  for (mcclTrace* tr = open_list; tr; tr = tr->next) writeOnce(tr);
  pthread_mutex_unlock(&open_mu);
}

void mcclTraceAfterFork(void) {
  open_list = NULL;
  pthread_mutex_init(&open_mu, NULL);
}
