/* debug.c: logging, result names, the thread-local last error and the monotonic clock. */
#include "core/debug.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/param.h"
#include "core/platform.h"

#if MCCL_HAVE_GETTID
#include <sys/syscall.h>
#endif

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static mcclLogLevel log_level = MCCL_LOG_WARN;
static unsigned log_subsys = MCCL_SUB_ALL;
static char log_host[64] = "?";

static void logInit(void) {
  const char* level = mcclParamString("MCCL_DEBUG");
  if (level != NULL && level[0] != '\0') {
    if (strcasecmp(level, "NONE") == 0) log_level = MCCL_LOG_NONE;
    else if (strcasecmp(level, "WARN") == 0) log_level = MCCL_LOG_WARN;
    else if (strcasecmp(level, "INFO") == 0) log_level = MCCL_LOG_INFO;
    else if (strcasecmp(level, "TRACE") == 0) log_level = MCCL_LOG_TRACE;
    else fprintf(stderr, "MCCL WARN MCCL_DEBUG=%s is not one of NONE, WARN, INFO, TRACE\n", level);
  }
  const char* subsys = mcclParamString("MCCL_DEBUG_SUBSYS");
  if (subsys != NULL && subsys[0] != '\0') {
    static const struct { const char* name; unsigned bit; } names[] = {
        {"INIT", MCCL_SUB_INIT}, {"NET", MCCL_SUB_NET}, {"COLL", MCCL_SUB_COLL},
        {"ENV", MCCL_SUB_ENV}, {"ALL", MCCL_SUB_ALL}};
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", subsys);
    log_subsys = 0;
    char* save = NULL;
    for (char* tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
      for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(tok, names[i].name) == 0) log_subsys |= names[i].bit;
    }
  }
  gethostname(log_host, sizeof(log_host) - 1);
  if (log_level >= MCCL_LOG_INFO) mcclParamLogAll();
}

/* The thread id a log line shows (core/platform.h: MCCL_HAVE_GETTID). */
#if MCCL_HAVE_GETTID
static long logThreadId(void) { return (long)syscall(SYS_gettid); }
#else
static atomic_long log_threads;
static _Thread_local long log_thread_id;
static long logThreadId(void) {
  if (log_thread_id == 0) log_thread_id = atomic_fetch_add(&log_threads, 1) + 1;
  return log_thread_id;
}
#endif

mcclLogLevel mcclLogLevelGet(void) {
  pthread_once(&log_once, logInit);
  return log_level;
}

void mcclLog(mcclLogLevel level, mcclSubsys sub, const char* file, int line, const char* fmt, ...) {
  if (level > MCCL_LOG_WARN && (log_subsys & (unsigned)sub) == 0) return;
  static const char* names[] = {"NONE", "WARN", "INFO", "TRACE"};
  const char* base = strrchr(file, '/');
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s:%d:%ld MCCL %s %s:%d %s\n", log_host, (int)getpid(), logThreadId(),
          names[level], base ? base + 1 : file, line, msg);
}

const char* mcclGetErrorString(mcclResult_t result) {
  switch (result) {
    case mcclSuccess: return "success";
    case mcclInProgress: return "in progress";
    case mcclInvalidArgument: return "invalid argument";
    case mcclInvalidUsage: return "invalid usage";
    case mcclSystemError: return "system error";
    case mcclRemoteError: return "remote error (a peer failed or closed its connection)";
    case mcclTimeout: return "timeout";
    case mcclMismatch: return "collective mismatch between ranks";
    case mcclProtocolError: return "protocol error";
    case mcclAborted: return "aborted";
    case mcclInternalError: return "internal error";
    case mcclUnsupported: return "unsupported";
    default: return "unknown result code";
  }
}

static _Thread_local char thread_error[1024];

void mcclSetThreadError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
  va_end(ap);
}

const char* mcclThreadError(void) { return thread_error; }

void mcclThreadSetName(const char* name) {
#if MCCL_HAVE_SETNAME_OF
  pthread_setname_np(pthread_self(), name);
#elif MCCL_HAVE_SETNAME_SELF
  pthread_setname_np(name); /* macOS names only the calling thread */
#else
  (void)name;
#endif
}

void mcclThreadSetNameOf(pthread_t thread, const char* name) {
#if MCCL_HAVE_SETNAME_OF
  pthread_setname_np(thread, name);
#else
  (void)thread;
  (void)name;
#endif
}

int64_t mcclNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t mcclThreadCpuNs(void) {
#if MCCL_HAVE_THREAD_CPUTIME
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#endif
  return -1;
}

int64_t mcclDeadlineNs(int64_t timeout_ms) {
  const int64_t max_ms = INT64_MAX / 1000000 / 10; /* ~29 years: room for any uptime */
  if (timeout_ms < 0) timeout_ms = 0;
  if (timeout_ms > max_ms) timeout_ms = max_ms;
  return mcclNowNs() + timeout_ms * 1000000LL;
}

void mcclCondInit(pthread_cond_t* cv) {
#if MCCL_HAVE_COND_CLOCK
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
#else
  pthread_cond_init(cv, NULL);
#endif
}

int mcclCondWaitUntil(pthread_cond_t* cv, pthread_mutex_t* mu, int64_t deadline_ns) {
#if MCCL_HAVE_COND_CLOCK
  struct timespec ts = {(time_t)(deadline_ns / 1000000000LL), (long)(deadline_ns % 1000000000LL)};
  return pthread_cond_timedwait(cv, mu, &ts);
#else
  int64_t left = deadline_ns - mcclNowNs();
  if (left <= 0) return ETIMEDOUT;
  struct timespec rel = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
  return pthread_cond_timedwait_relative_np(cv, mu, &rel);
#endif
}
