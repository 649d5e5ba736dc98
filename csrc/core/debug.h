/*
 * debug.h: logging, result checks and error messages (layer "core").
 *
 * Logging is controlled by MCCL_DEBUG=WARN|INFO|TRACE (default WARN) and MCCL_DEBUG_SUBSYS
 * (comma list of INIT, NET, COLL, ENV, ALL; default ALL). Lines go to stderr as
 * "host:pid:tid [rank] MCCL LEVEL file:line message".
 */
#ifndef MCCL_DEBUG_H_
#define MCCL_DEBUG_H_

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>

#include "mccl.h"

typedef enum { MCCL_LOG_NONE = 0, MCCL_LOG_WARN = 1, MCCL_LOG_INFO = 2, MCCL_LOG_TRACE = 3 } mcclLogLevel;
typedef enum {
  MCCL_SUB_INIT = 1 << 0,
  MCCL_SUB_NET = 1 << 1,
  MCCL_SUB_COLL = 1 << 2,
  MCCL_SUB_ENV = 1 << 3,
  MCCL_SUB_ALL = 0xff
} mcclSubsys;

/* Current level; read from the environment once, on first use. */
mcclLogLevel mcclLogLevelGet(void);

void mcclLog(mcclLogLevel level, mcclSubsys sub, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define MCCL_LOG(level, sub, ...)                                   \
  do {                                                              \
    if (mcclLogLevelGet() >= (level)) mcclLog((level), (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define WARN(...) MCCL_LOG(MCCL_LOG_WARN, MCCL_SUB_ALL, __VA_ARGS__)
#define INFO(sub, ...) MCCL_LOG(MCCL_LOG_INFO, (sub), __VA_ARGS__)
#define TRACE(sub, ...) MCCL_LOG(MCCL_LOG_TRACE, (sub), __VA_ARGS__)

/* Propagate a failed mcclResult_t, leaving a breadcrumb at INFO. */
#define MCCLCHECK(call)                                                               \
  do {                                                                                \
    mcclResult_t res_ = (call);                                                       \
    if (res_ != mcclSuccess && res_ != mcclInProgress) {                              \
      INFO(MCCL_SUB_ALL, "%s: a step failed (%s), so it returns that error", __func__,  \
           mcclGetErrorString(res_));                                                 \
      return res_;                                                                    \
    }                                                                                 \
  } while (0)

#define MCCLCHECKGOTO(call, res, label)                                               \
  do {                                                                                \
    (res) = (call);                                                                   \
    if ((res) != mcclSuccess && (res) != mcclInProgress) {                            \
      INFO(MCCL_SUB_ALL, "%s: a step failed (%s), so it stops and cleans up", __func__, \
           mcclGetErrorString(res));                                                  \
      goto label;                                                                     \
    }                                                                                 \
  } while (0)

/* Retry a system call while it fails with EINTR; evaluates to its final return value. */
#define SYSCALL_RETRY(expr)                     \
  ({                                            \
    __typeof__(expr) rv_;                       \
    do { rv_ = (expr); } while (rv_ < 0 && errno == EINTR); \
    rv_;                                        \
  })

/* The calling thread's last error message (for failures that have no communicator yet). */
void mcclSetThreadError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
const char* mcclThreadError(void);

/* Name the calling thread (at most 15 characters; shown by top -H and /proc/<pid>/task/<tid>/comm,
 * where the benchmarks find each thread's CPU time). Best effort. */
void mcclThreadSetName(const char* name);
/* Name a thread the caller has just started, so that it carries the name as soon as the caller
 * returns (a benchmark that looks right after init finds it). Linux only (core/platform.h:
 * MCCL_HAVE_SETNAME_OF); elsewhere the new thread's own mcclThreadSetName call is what names it. */
void mcclThreadSetNameOf(pthread_t thread, const char* name);

/* Monotonic clock in nanoseconds. */
int64_t mcclNowNs(void);

/* CPU time the calling thread has used, in nanoseconds (user + system, including the kernel work
 * the scheduler charges to it), or -1 where the platform has no thread CPU-time clock
 * (core/platform.h: MCCL_HAVE_THREAD_CPUTIME). A system call on Linux (about 0.1-0.3 us). */
int64_t mcclThreadCpuNs(void);

/* mcclNowNs() + timeout_ms, without overflow: timeouts beyond about 29 years (which callers use
 * for "forever") are clamped to that, negative ones count as 0. */
int64_t mcclDeadlineNs(int64_t timeout_ms);

/* Condition variables whose timed waits count on the mcclNowNs clock (CLOCK_MONOTONIC), so that a
 * step of the wall clock moves no deadline. mcclCondInit initialises `cv` for that;
 * mcclCondWaitUntil waits on it (with `mu` held, as pthread_cond_wait) until woken or until
 * `deadline_ns` (mcclNowNs clock) and returns 0 or ETIMEDOUT. */
void mcclCondInit(pthread_cond_t* cv);
int mcclCondWaitUntil(pthread_cond_t* cv, pthread_mutex_t* mu, int64_t deadline_ns);

#endif
