/*
 * comm.c: communicator lifecycle: bootstrap through the store, the mesh, the engine thread,
 * destroy and abort.
 *
 * Store keys (all under "mccl/<name>/"):
 *   inits          counter every rank adds 1 to at init; generation = (value - 1) / nranks, so
 *                  each init of the same group on the same store gets fresh keys. The value a
 *                  rank got is its slot: the slots of generation g are g * nranks + 1 .. + nranks
 *   join/<slot>    "rank <r> of <nranks>", written by the rank that got the slot; the rank with
 *                  the generation's first slot reads the records of its other slots before
 *                  anything else, the others read the first slot's, which is how ranks started
 *                  with different world sizes (or twice with one rank) find out (joinGroup).
 *                  "!<reason>" where a rank that found such a conflict poisoned a slot nobody had
 *                  taken yet, so that whoever waits on it fails with the reason
 *   joined/<first> the verdict of the rank with slot <first> on its generation's join: "ok", or
 *                  "!<result code> <message>"
 *   g<gen>/token   16 random bytes from rank 0: the job token every handshake must carry
 *   g<gen>/rank/<r> rank r's record (rankRecord below): its listening address ("host:port" or
 *                  "[v6]:port"), topology group and host description (core/host.h: machine,
 *                  network namespace, CPUs), fixed-width fields, NUL-padded; or '!' and the
 *                  reason where rank r failed before it could listen (initPublishFailure)
 *   g<gen>/ranks   the table: every rank's record in rank order, written by rank 0 once it has
 *                  read them all; or '!' and the reason why rank 0 could not (gatherRecords)
 *   g<gen>/addr/<r> rank r's listening address alone, for people and tools (init never reads it)
 *
 * Store reads per rank at init: 2 for the join (the first slot's record and the verdict; n - 1
 * on the rank with the first slot), then rank 0 reads the n - 1 rank records and every other rank
 * reads 2 keys (the token and the table): about 6n reads per job, where every rank reading every
 * rank's join record, address, host and group made about 4n^2.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algo/select.h"
#include "core/comm.h"
#include "core/debug.h"
#include "core/host.h"
#include "core/param.h"
#include "core/topology.h"
#include "core/trace.h"
#include "core/platform.h"
#include "transport/socket.h"

#if MCCL_HAVE_GETRANDOM
#include <sys/random.h>
#endif

void mcclCommConfigInit(mcclCommConfig_t* config) {
  if (config == NULL) {
    mcclSetThreadError("mcclCommConfigInit: config is NULL");
    return;
  }
  memset(config, 0, sizeof(*config));
  config->size = sizeof(*config);
  config->name = "default";
  config->timeout_ms = 30 * 60 * 1000;
}

/* The longest timeout kept as given: request deadlines are start + timeout in nanoseconds. */
#define MCCL_MAX_TIMEOUT_MS (INT64_MAX / 1000000 / 10)

static uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

static int randomBytes(uint8_t* out, size_t n) {
#if MCCL_HAVE_GETRANDOM
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    got += (size_t)r;
  }
  if (got == n) return 0;
#endif
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t got2 = 0;
  while (got2 < n) {
    ssize_t r = read(fd, out + got2, n - got2);
    if (r <= 0) break;
    got2 += (size_t)r;
  }
  close(fd);
  return got2 == n ? 0 : -1;
}

static int64_t remainingMs(int64_t deadline_ns) {
  int64_t ms = (deadline_ns - mcclNowNs()) / 1000000LL;
  return ms > 0 ? ms : 1;
}

/* A store callback failed while init was `doing` something ("waiting for rank 1's address (store
 * key '...')"): write the thread's error and return the code init fails with. The store's own
 * failures are named as such, never as a timeout of this init: a callback that returns an error
 * other than mcclTimeout (mcclRemoteError: the connection closed or was reset), or mcclTimeout
 * long before the deadline it was given (`started_ns`: when that call began), which is how a
 * store whose server went away can answer a wait; that case returns mcclRemoteError. Only a
 * timeout at the deadline is the init's own mcclTimeout. */
static mcclResult_t storeFailed(mcclResult_t res, int64_t started_ns, int64_t deadline_ns, const char* doing) {
  const int64_t now = mcclNowNs();
  if (res == mcclTimeout && now + 50 * 1000000LL >= deadline_ns) {
    mcclSetThreadError("mcclCommInitConfig: timed out %s", doing);
    return mcclTimeout;
  }
  if (res == mcclTimeout) {
    mcclSetThreadError("mcclCommInitConfig: the bootstrap store failed while %s: it reported a timeout "
                       "after %.2f s of the %.1f s it was given (a store whose server went away or whose "
                       "connection closed answers so)",
                       doing, (double)(now - started_ns) / 1e9, (double)(deadline_ns - started_ns) / 1e9);
    return mcclRemoteError;
  }
  if (res == mcclRemoteError)
    mcclSetThreadError("mcclCommInitConfig: the bootstrap store failed while %s: its connection closed or was "
                       "reset (is the store's server still running?)", doing);
  else
    mcclSetThreadError("mcclCommInitConfig: the bootstrap store failed while %s: %s", doing, mcclGetErrorString(res));
  return res;
}

/* Wait until `deadline_ns` for `key`, then read its value (at most `cap` bytes; *len: its full
 * length). `what` names it for the message: mcclTimeout at the deadline, a store failure
 * otherwise (storeFailed). */
static mcclResult_t storeGet(const mcclStore_t* store, const char* key, void* buf, size_t cap,
                             size_t* len, int64_t deadline_ns, const char* what) {
  mcclResult_t res = mcclSuccess;
  int64_t started = mcclNowNs();
  if (store->wait != NULL) res = store->wait(store->ctx, key, remainingMs(deadline_ns));
  if (res == mcclSuccess) {
    started = mcclNowNs();
    res = store->get(store->ctx, key, buf, cap, len, remainingMs(deadline_ns));
  }
  if (res == mcclSuccess) return mcclSuccess;
  char doing[256];
  snprintf(doing, sizeof(doing), "waiting for %s (store key '%s')", what, key);
  return storeFailed(res, started, deadline_ns, doing);
}

/* Store `len` bytes under `key` (`what` names them for a failure's message). */
static mcclResult_t storeSet(const mcclStore_t* store, const char* key, const void* value, size_t len,
                             const char* what) {
  mcclResult_t res = store->set(store->ctx, key, value, len);
  if (res == mcclSuccess) return mcclSuccess;
  char doing[256];
  snprintf(doing, sizeof(doing), "publishing %s (store key '%s')", what, key);
  /* A set has no deadline of its own: any error, a timeout included, is the store's. */
  return storeFailed(res == mcclTimeout ? mcclRemoteError : res, 0, 0, doing);
}

/* Atomically add `delta` to the counter under `key`; *value: the new value. */
static mcclResult_t storeAdd(const mcclStore_t* store, const char* key, int64_t delta, int64_t* value,
                             const char* what) {
  mcclResult_t res = store->add(store->ctx, key, delta, value);
  if (res == mcclSuccess) return mcclSuccess;
  char doing[256];
  snprintf(doing, sizeof(doing), "%s (store add to key '%s')", what, key);
  return storeFailed(res == mcclTimeout ? mcclRemoteError : res, 0, 0, doing);
}

/* ---------------------------------------------------------------------------------------------
 * Fork.
 *
 * A child of fork() inherits every communicator's memory, locks and socket descriptors, but none
 * of its threads: the engine that would run a collective does not exist there, and a lock that a
 * thread of the parent held at the fork stays held forever. So in the child:
 *  - every call on an inherited communicator fails at once with mcclInvalidUsage, saying so
 *    (mcclCommInherited is checked first, before any lock is taken);
 *  - the child's copies of its sockets and wake pipe are closed right in the fork, by the child
 *    handler of pthread_atfork: close() drops only the child's reference, so the parent's
 *    connections carry on untouched, and a parent that dies is seen by its peers at once (a
 *    child holding copies would keep its connections open). Nothing is sent and no socket is
 *    shut down: shutdown() would end the parent's connection too;
 *  - mcclCommDestroy or mcclCommAbort of an inherited communicator frees the child's memory and
 *    joins nothing.
 * The registry below lists the live communicators for the child handler; the prepare handler
 * holds its lock across fork() so that the child sees a consistent list. Nothing else is locked
 * around fork(): a communicator's own locks are never touched in the child.
 * ------------------------------------------------------------------------------------------- */

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mcclComm* live_head;      /* under live_lock */
static atomic_uint fork_count;          /* forks this process descends from (child handler) */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_error;                /* pthread_atfork's result, set once under atfork_once */

/* The child's copies of the communicator's descriptors (its sender thread's pipe excepted: that
 * structure is the transport's own). Only close(), which is async-signal-safe. */
static void forgetDescriptors(struct mcclComm* comm) {
  mcclTransport* t = &comm->tp;
  mcclTransportForgetDescriptors(t);
  t->trace = NULL; /* the parent's recorder: the parent writes it, the child leaves its copy */
}

static void forkPrepare(void) { pthread_mutex_lock(&live_lock); }

static void forkParent(void) { pthread_mutex_unlock(&live_lock); }

static void forkChild(void) {
  atomic_fetch_add(&fork_count, 1);
  for (struct mcclComm* c = live_head; c != NULL; c = c->live_next) forgetDescriptors(c);
  mcclTraceAfterFork();
  /* Held by the thread that forked, whose copy is this one: a fresh lock instead of an unlock by
   * what the lock may take for another thread. */
  pthread_mutex_init(&live_lock, NULL);
}

static void registerAtfork(void) { atfork_error = pthread_atfork(forkPrepare, forkParent, forkChild); }

static void liveAdd(struct mcclComm* comm) {
  pthread_mutex_lock(&live_lock);
  comm->live_prev = NULL;
  comm->live_next = live_head;
  if (live_head != NULL) live_head->live_prev = comm;
  live_head = comm;
  pthread_mutex_unlock(&live_lock);
}

/* A no-op for a communicator that was never listed (a failed init). */
static void liveRemove(struct mcclComm* comm) {
  pthread_mutex_lock(&live_lock);
  if (comm->live_prev != NULL) comm->live_prev->live_next = comm->live_next;
  else if (live_head == comm) live_head = comm->live_next;
  if (comm->live_next != NULL) comm->live_next->live_prev = comm->live_prev;
  comm->live_prev = comm->live_next = NULL;
  pthread_mutex_unlock(&live_lock);
}

int mcclCommInherited(const struct mcclComm* comm) {
  return comm->forks != atomic_load_explicit(&fork_count, memory_order_relaxed);
}

mcclResult_t mcclCommForkError(const struct mcclComm* comm, const char* fn) {
  mcclSetThreadError("%s: communicator '%s' (rank %d of %d) was created in process %ld and cannot be used "
                     "after fork() in this process (%ld), which has none of its threads or connections; "
                     "create a new communicator here", fn, comm->label, comm->rank, comm->nranks,
                     comm->owner_pid, (long)getpid());
  return mcclInvalidUsage;
}

/* The communicator's memory outlives destroy while collective requests still reference it
 * (mcclRequestSeq/Hold/Seal take its queue lock); the last reference frees it. In a child of
 * fork() the locks are left as they are: a lock held, or a condition waited on, by a thread
 * that does not exist here cannot be destroyed (glibc's pthread_cond_destroy would wait for that
 * waiter forever). */
void mcclCommRelease(struct mcclComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  if (!mcclCommInherited(comm)) {
    pthread_mutex_destroy(&comm->qlock);
    pthread_cond_destroy(&comm->qcond);
    pthread_mutex_destroy(&comm->errlock);
  }
  free(comm);
}

/* Everything init allocates (sockets, threads' state, buffers) is freed by commFree, which
 * tolerates a half-built communicator; then the owner's reference goes. */
static void commFree(struct mcclComm* comm) {
  mcclP2pFree(comm);
  mcclTransportClose(&comm->tp);
  mcclTraceClose(comm->tp.trace); /* after the threads that record in it have stopped */
  comm->tp.trace = NULL;
  free(comm->algo.scratch);
  free(comm->algo.work);
  free(comm->premul);
  comm->premul = NULL;
  free(comm->algo.ring_order);
  comm->algo.ring_order = NULL;
  comm->algo.scratch = comm->algo.work = NULL;
  mcclCommRelease(comm);
}

/* Init failures travel through the store, so that a rank that cannot go on (a descriptor limit
 * in accept() or socket(), say) fails the init of every other rank at once with its reason,
 * instead of leaving them to time out on "still missing rank r". Under <prefix>/:
 *   initfail/why  the reason, naming the rank, written first;
 *   initfail      counter, incremented after it (mcclTransportInit's watch polls it);
 *   rank/<r>      if rank r had not published its record yet: '!' and the reason.
 * Only failures of this rank's own (not timeouts, not another rank's failure) are published. */
typedef struct {
  const mcclStore_t* store;
  const char* prefix;
  int rank;
} initWatchCtx;

static void initFailureText(int rank, const char* peer_reason, char* out, size_t cap) {
  snprintf(out, cap, "rank %d stops its init because another rank's init failed: %s", rank, peer_reason);
}

static int initPeerFailed(void* ctx, char* why, size_t cap) {
  const initWatchCtx* w = ctx;
  char key[256], text[800];
  int64_t failures = 0;
  snprintf(key, sizeof(key), "%s/initfail", w->prefix);
  if (w->store->add(w->store->ctx, key, 0, &failures) != mcclSuccess || failures <= 0) return 0;
  size_t len = 0;
  snprintf(key, sizeof(key), "%s/initfail/why", w->prefix);
  if (w->store->get(w->store->ctx, key, text, sizeof(text) - 1, &len, 1000) != mcclSuccess)
    snprintf(text, sizeof(text), "(its reason, store key '%s', could not be read)", key);
  else
    text[len < sizeof(text) ? len : sizeof(text) - 1] = '\0';
  initFailureText(w->rank, text, why, cap);
  return 1;
}

/* `msg` (an init error) without its leading "mcclCommInitConfig: ", for passing on to other ranks. */
static const char* initErrorBody(const char* msg) {
  static const char lead[] = "mcclCommInitConfig: ";
  return strncmp(msg, lead, sizeof(lead) - 1) == 0 ? msg + sizeof(lead) - 1 : msg;
}

/* The deadline of a rank that gathers what others wait for (rank 0's table, the join verdict):
 * min(a tenth of the time left, 2 s) before `deadline`, so that its failure, naming what was
 * missing, reaches the ranks waiting on it before their own deadline. */
static int64_t gathererDeadline(int64_t deadline) {
  const int64_t left = deadline - mcclNowNs();
  return deadline - (left / 10 < 2000000000LL ? left / 10 : 2000000000LL);
}

static void initPublishFailure(const mcclStore_t* store, const char* prefix, int rank, const char* self_addr,
                               int addr_published, const char* msg) {
  msg = initErrorBody(msg);
  char own[32], text[800], key[256];
  snprintf(own, sizeof(own), "rank %d ", rank);
  if (strncmp(msg, own, strlen(own)) == 0) snprintf(text, sizeof(text), "%s", msg);
  else if (self_addr[0] != '\0') snprintf(text, sizeof(text), "rank %d (%s): %s", rank, self_addr, msg);
  else snprintf(text, sizeof(text), "rank %d: %s", rank, msg);
  int64_t ignored = 0;
  snprintf(key, sizeof(key), "%s/initfail/why", prefix);
  if (store->set(store->ctx, key, text, strlen(text)) == mcclSuccess) {
    snprintf(key, sizeof(key), "%s/initfail", prefix);
    store->add(store->ctx, key, 1, &ignored);
  }
  if (!addr_published) {
    char marked[sizeof(text) + 1];
    snprintf(marked, sizeof(marked), "!%s", text);
    snprintf(key, sizeof(key), "%s/rank/%d", prefix, rank);
    store->set(store->ctx, key, marked, strlen(marked));
    if (rank == 0) { /* the others wait on rank 0's table, not on its record */
      snprintf(key, sizeof(key), "%s/ranks", prefix);
      store->set(store->ctx, key, marked, strlen(marked));
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * Every rank's address, group and host, through one table.
 *
 * Each rank publishes one record; rank 0 reads the others' (n - 1 reads) and publishes them all
 * as one value, the table, which every other rank reads once. Every rank then judges the same
 * bytes (its own record too, as the table holds it). A rank that failed before it could listen
 * left '!' and its reason as its record: rank 0 passes the reason on as the table ('!' and a
 * text), so that every rank fails with it. Rank 0 gives up a little before the others' deadline
 * (a tenth of the timeout, at most 2 s), so that its reason, a rank that never published,
 * reaches them while they still wait.
 * ------------------------------------------------------------------------------------------- */

#define MCCL_SETTINGS_STRLEN 256

typedef struct {
  char addr[MCCL_ADDR_STRLEN];
  char group[MCCL_GROUP_STRLEN];
  char host[MCCL_HOST_STRLEN];
  char settings[MCCL_SETTINGS_STRLEN]; /* jobSettings(): what every rank must be given alike */
} rankRecord; /* chars only: no padding, the same bytes on every platform */

static void recordTerminate(rankRecord* rec) {
  rec->addr[MCCL_ADDR_STRLEN - 1] = rec->group[MCCL_GROUP_STRLEN - 1] = rec->host[MCCL_HOST_STRLEN - 1] = '\0';
  rec->settings[MCCL_SETTINGS_STRLEN - 1] = '\0';
}

/* The values of the MCCL_* variables that every rank of a job must be given alike (ENVIRONMENT.md),
 * as this rank uses them (a refused value is its default; MCCL_RUNTIME_CONNECT=-1 resolved): every
 * rank's choices of algorithm, segment (the chain's follows MCCL_CHAIN_RELAY) and agreement, and whether it connects at init, follow them,
 * and ranks that differ would fail later with a frame that names no variable, or wait on peers that
 * never dial. Space-separated NAME=VALUE pairs, in a fixed order. */
static void jobSettings(int nranks, char* out, size_t cap) {
  const char* algo = mcclAlgoForcedName();
  int64_t runtime_connect = mcclParamInt("MCCL_RUNTIME_CONNECT");
  if (runtime_connect < 0) runtime_connect = nranks > mcclParamInt("MCCL_ANNOUNCE_RANKS");
  snprintf(out, cap, "MCCL_ALGO=%s MCCL_RING_THRESHOLD=%lld MCCL_SEGMENT_BYTES=%lld MCCL_ALPHA_BETA=%lld "
           "MCCL_ANNOUNCE_RANKS=%lld MCCL_RUNTIME_CONNECT=%lld MCCL_CHECK_CALL_SITES=%lld MCCL_CHAIN_RELAY=%lld", algo,
           (long long)mcclParamInt("MCCL_RING_THRESHOLD"), (long long)mcclParamInt("MCCL_SEGMENT_BYTES"),
           (long long)mcclParamInt("MCCL_ALPHA_BETA"), (long long)mcclParamInt("MCCL_ANNOUNCE_RANKS"),
           (long long)runtime_connect, (long long)mcclParamInt("MCCL_CHECK_CALL_SITES"),
           (long long)mcclParamInt("MCCL_CHAIN_RELAY"));
}

/* Every rank judges the same table: the first rank whose settings differ from rank 0's fails
 * init on every rank, with the variable, both values and both ranks named. */
static mcclResult_t checkJobSettings(const struct mcclComm* comm, const rankRecord* recs) {
  for (int r = 1; r < comm->nranks; r++) {
    if (strcmp(recs[r].settings, recs[0].settings) == 0) continue;
    const char *a = recs[0].settings, *b = recs[r].settings;
    for (;;) { /* the first NAME=VALUE pair that differs */
      size_t la = strcspn(a, " "), lb = strcspn(b, " ");
      if (la != lb || strncmp(a, b, la) != 0) {
        /* Both list the same names in the same order: NAME=VALUE with the same NAME. */
        const int name = (int)strcspn(a, "=");
        if ((size_t)name < la && strncmp(a, b, (size_t)name + 1) == 0) {
          mcclSetThreadError("mcclCommInitConfig: %.*s is %.*s on rank %d but %.*s on rank 0: every rank of a job "
                             "must be given the same %.*s (docs/ENVIRONMENT.md)", name, a, (int)lb - name - 1,
                             b + name + 1, r, (int)la - name - 1, a + name + 1, name, a);
          return mcclInvalidArgument;
        }
        break;
      }
      if (a[la] == '\0' || b[lb] == '\0') break;
      a += la + 1;
      b += lb + 1;
    }
    mcclSetThreadError("mcclCommInitConfig: rank %d's settings '%s' differ from rank 0's '%s'", r, recs[r].settings,
                       recs[0].settings);
    return mcclInvalidArgument;
  }
  return mcclSuccess;
}

/* Fill recs[0..n-1] (this rank's own, recs[rank], already filled and published). The thread's
 * error names what failed: a rank that failed (mcclRemoteError), the deadline, or the store. */
static mcclResult_t gatherRecords(const struct mcclComm* comm, const mcclStore_t* store, const char* prefix,
                                  rankRecord* recs, int64_t deadline) {
  const int n = comm->nranks;
  const size_t table_len = (size_t)n * sizeof(rankRecord);
  char key[256], what[128], text[900];
  size_t len = 0;
  mcclResult_t res = mcclSuccess;
  if (comm->rank != 0) {
    char* buf = malloc(table_len > sizeof(text) ? table_len : sizeof(text));
    if (buf == NULL) {
      mcclSetThreadError("mcclCommInitConfig: out of memory for the table of %d ranks", n);
      return mcclSystemError;
    }
    snprintf(key, sizeof(key), "%s/ranks", prefix);
    res = storeGet(store, key, buf, table_len > sizeof(text) ? table_len : sizeof(text), &len, deadline,
                   "rank 0's table of every rank's address (written once rank 0 has read them all)");
    if (res == mcclSuccess && len > 0 && buf[0] == '!') {
      snprintf(text, sizeof(text), "%.*s", (int)(len - 1 < sizeof(text) - 1 ? len - 1 : sizeof(text) - 1), buf + 1);
      char why[1000];
      initFailureText(comm->rank, text, why, sizeof(why));
      mcclSetThreadError("mcclCommInitConfig: %s", why);
      res = mcclRemoteError;
    } else if (res == mcclSuccess && len != table_len) {
      mcclSetThreadError("mcclCommInitConfig: store key '%s' holds %zu bytes, not the table of %d ranks (%zu bytes)",
                         key, len, n, table_len);
      res = mcclProtocolError;
    } else if (res == mcclSuccess) {
      memcpy(recs, buf, table_len);
      for (int r = 0; r < n; r++) recordTerminate(&recs[r]);
    }
    free(buf);
    return res;
  }
  const int64_t early = gathererDeadline(deadline);
  char passon[sizeof(text) + 16] = ""; /* what the table says when this fails */
  for (int r = 1; r < n && res == mcclSuccess; r++) {
    char buf[sizeof(rankRecord) > sizeof(text) ? sizeof(rankRecord) : sizeof(text)];
    snprintf(key, sizeof(key), "%s/rank/%d", prefix, r);
    snprintf(what, sizeof(what), "rank %d's address", r);
    res = storeGet(store, key, buf, sizeof(buf), &len, early, what);
    if (res == mcclSuccess && len > 0 && buf[0] == '!') { /* that rank failed before it could listen */
      snprintf(text, sizeof(text), "%.*s", (int)(len - 1 < sizeof(text) - 1 ? len - 1 : sizeof(text) - 1), buf + 1);
      char why[1000];
      initFailureText(comm->rank, text, why, sizeof(why));
      mcclSetThreadError("mcclCommInitConfig: %s", why);
      snprintf(passon, sizeof(passon), "!%s", text); /* the failed rank's own words */
      res = mcclRemoteError;
    } else if (res == mcclSuccess && len != sizeof(rankRecord)) {
      mcclSetThreadError("mcclCommInitConfig: store key '%s' holds %zu bytes, not a rank's record (%zu bytes): "
                         "another program uses this group's keys", key, len, sizeof(rankRecord));
      res = mcclProtocolError;
    } else if (res == mcclSuccess) {
      memcpy(&recs[r], buf, sizeof(rankRecord));
      recordTerminate(&recs[r]);
    }
  }
  snprintf(key, sizeof(key), "%s/ranks", prefix);
  if (res == mcclSuccess) return storeSet(store, key, recs, table_len, "the table of every rank's address");
  /* Passed on to the others as the table; best effort (the store may be what failed). */
  if (passon[0] == '\0') snprintf(passon, sizeof(passon), "!rank 0: %s", initErrorBody(mcclThreadError()));
  store->set(store->ctx, key, passon, strlen(passon));
  return res;
}

/* The ring order (core/topology.h) from every rank's group as the table holds it (this rank's
 * own too, so that every rank computes the same order). */
static mcclResult_t ringOrder(struct mcclComm* comm, const rankRecord* recs, const char* why) {
  const int n = comm->nranks;
  const size_t nn = (size_t)(n > 0 ? n : 1);
  const char** names = calloc(nn, sizeof(*names));
  int* order = malloc(sizeof(int) * nn * 2);
  const char* group = recs[comm->rank].group;
  mcclResult_t res = mcclSuccess;
  if (names == NULL || order == NULL) {
    mcclSetThreadError("mcclCommInitConfig: out of memory for the ring order of %d ranks", n);
    res = mcclSystemError;
  }
  for (int r = 0; r < n && res == mcclSuccess; r++) names[r] = recs[r].group;
  if (res == mcclSuccess) {
    int ngroups = mcclTopologyRingOrder(n, names, order, order + n);
    int identity = 1;
    for (int p = 0; p < n; p++) identity &= order[p] == p;
    /* Equal groups (n = G g; contiguous in ring order) allow the two-level ring. */
    int g = n % ngroups == 0 ? n / ngroups : 0;
    for (int p = 0; p < n && g > 0; p++)
      if (strcmp(names[order[p]], names[order[(p / g) * g]]) != 0) g = 0;
    comm->algo.ngroups = ngroups;
    comm->algo.group_size = g;
    INFO(MCCL_SUB_INIT, "rank %d/%d of '%s': topology group '%s' (from %s); %d group%s", comm->rank, n, comm->label,
         group, why, ngroups, ngroups == 1 ? "" : "s");
    if (!identity && comm->rank == 0) {
      char text[512];
      size_t k = 0;
      for (int p = 0; p < n && k + 16 < sizeof(text); p++)
        k += (size_t)snprintf(text + k, sizeof(text) - k, "%s%d", p ? " " : "", order[p]);
      INFO(MCCL_SUB_INIT, "communicator '%s': rings visit the ranks in the order %s%s (each group's ranks together)",
           comm->label, text, k + 16 >= sizeof(text) ? " ..." : "");
    }
    free(comm->algo.ring_order);
    comm->algo.ring_order = identity ? NULL : order; /* NULL: rank order */
    if (!identity) order = NULL;
  }
  free(order);
  free(names);
  return res;
}

/* ---------------------------------------------------------------------------------------------
 * Joining: every rank's world size and rank, checked before anything else.
 *
 * A rank's generation comes from its own world size (slot - 1) / nranks, so ranks started with
 * different world sizes would look for each other under different key prefixes, or under the same
 * prefix for different sets of ranks, and wait out the timeout on "missing rank r". Instead each
 * rank publishes "rank <r> of <nranks>" under its slot (join/<slot>) and then reads the record of
 * every other slot of its generation, in slot order. Every rank of a generation reads the same
 * slots, so each one that can see a record with another world size, or a second process with its
 * rank number, sees it itself and fails with a message naming both. A rank may instead wait on a
 * slot that nobody will take (its generation has room for more ranks than were started): the rank
 * that found the conflict poisons the slots not yet handed out that such a rank can wait on (the
 * next max(nranks) - 1 after the counter's value), and that rank then fails with the same reason.
 * In a consistent job every slot of a generation is taken by one rank of it, and nothing is
 * poisoned. Only the rank holding the generation's first slot (the checker) reads every slot; it
 * publishes its verdict, and every other rank reads the first slot's record and the verdict: the
 * check costs one store write and 2 reads per rank (n - 1 and a write on the checker). A rank
 * whose first slot holds another world size finds that itself; the checker finds the rest.
 *
 * Limitation: a rank sees only the records in its generation's slots. Ranks whose slots are all
 * taken by consistent ranks (e.g. two ranks started with world size 2 next to one with 3 that
 * joined first) form a complete world and succeed; the others fail.
 * ------------------------------------------------------------------------------------------- */

#define JOIN_POISON '!'

/* Poison the slots after the counter's current value (see above) with `reason`; best effort. */
static void joinPoison(const mcclStore_t* store, const char* name, int span, const char* reason,
                       int64_t deadline) {
  char key[256], text[900];
  int64_t handed = 0;
  snprintf(key, sizeof(key), "mccl/%s/inits", name);
  if (store->add(store->ctx, key, 0, &handed) != mcclSuccess) return;
  snprintf(text, sizeof(text), "%c%s", JOIN_POISON, reason);
  for (int64_t t = handed + 1; t < handed + span && mcclNowNs() < deadline; t++) {
    snprintf(key, sizeof(key), "mccl/%s/join/%lld", name, (long long)t);
    if (store->set(store->ctx, key, text, strlen(text)) != mcclSuccess) return;
  }
}

/* The ranks of 0..n-1 whose `seen` entry is 0 (or 1: want = 1), as "0, 3, 5" (cut short with
 * "..." when it does not fit); returns how many there are. */
static int rankList(const uint8_t* seen, int n, int want, char* out, size_t cap) {
  size_t len = 0;
  int count = 0;
  out[0] = '\0';
  for (int r = 0; r < n; r++) {
    if ((seen[r] != 0) != (want != 0)) continue;
    if (count++ > 0 && len < cap) len += (size_t)snprintf(out + len, cap - len, ", ");
    if (len < cap) len += (size_t)snprintf(out + len, cap - len, "%d", r);
  }
  if (len >= cap && cap > 4) memcpy(out + cap - 4, "...", 4);
  return count;
}

/* One join record (the text of slot `s`, under `key`) against this rank's own: 0 when it is
 * consistent (then seen[] and seen_at[] record it); else the result, with the thread's error set
 * and, for a conflict other ranks must hear of, *span (how many slots to poison) and reason[]. */
static mcclResult_t joinCheckRecord(const struct mcclComm* comm, const char* key, const char* text, int64_t s,
                                    uint8_t* seen, int64_t* seen_at, int* span, char* reason, size_t cap) {
  const int n = comm->nranks;
  int r = -1, rn = -1, used = 0;
  if (text[0] == JOIN_POISON) {
    mcclSetThreadError("mcclCommInitConfig: %s; this is rank %d, started with world size %d", text + 1,
                       comm->rank, n);
    return mcclInvalidArgument;
  }
  if (sscanf(text, "rank %d of %d%n", &r, &rn, &used) != 2 || text[used] != '\0' || rn < 1 || r < 0 || r >= rn) {
    mcclSetThreadError("mcclCommInitConfig: store key '%s' holds '%.60s', not a join record (\"rank <r> of "
                       "<n>\"): another program uses this group's keys", key, text);
    return mcclProtocolError;
  }
  if (rn != n) {
    snprintf(reason, cap, "the ranks of communicator '%s' were started with different world sizes: "
             "rank %d with %d, rank %d with %d (every rank must be given the same world size, e.g. the "
             "same WORLD_SIZE; found by rank %d)", comm->label, r < comm->rank ? r : comm->rank,
             r < comm->rank ? rn : n, r < comm->rank ? comm->rank : r, r < comm->rank ? n : rn, comm->rank);
    *span = rn > n ? rn : n;
    return mcclInvalidArgument;
  }
  if (seen[r]) {
    snprintf(reason, cap, "two processes of communicator '%s' were started as rank %d of %d (store "
             "slots %lld and %lld of 'mccl/%s/inits'): every rank number must go to one process (found by "
             "rank %d)", comm->label, r, n, (long long)seen_at[r], (long long)s, comm->name, comm->rank);
    *span = n;
    return mcclInvalidArgument;
  }
  seen[r] = 1;
  seen_at[r] = s;
  return mcclSuccess;
}

/* "2.5 s", or "40 ms" below a second. */
static void formatSeconds(int64_t ms, char* out, size_t cap) {
  if (ms < 1000) snprintf(out, cap, "%lld ms", (long long)ms);
  else snprintf(out, cap, "%.1f s", (double)ms / 1000.0);
}

/* The timeout's message: the ranks seen[] says joined, and those still missing; `deadline` is the
 * init's, so that the message gives the time actually waited (the checker stops early). */
static void joinTimedOut(const struct mcclComm* comm, const uint8_t* seen, int64_t deadline, int checker) {
  const int n = comm->nranks;
  char missing[200], present[200], waited[32], timeout[32];
  int nmissing = rankList(seen, n, 0, missing, sizeof(missing));
  int npresent = rankList(seen, n, 1, present, sizeof(present));
  int64_t left_ms = (deadline - mcclNowNs()) / 1000000LL;
  formatSeconds(comm->timeout_ms - (left_ms > 0 ? left_ms : 0), waited, sizeof(waited));
  formatSeconds(comm->timeout_ms, timeout, sizeof(timeout));
  mcclSetThreadError("mcclCommInitConfig: timed out after %s%s%s%s waiting for the ranks of communicator '%s' to "
                     "join: %d of %d joined (rank%s %s); still missing rank%s %s", waited,
                     checker ? " (the group's timeout is " : "", checker ? timeout : "",
                     checker ? ", less the margin that lets this rank's verdict reach the others in time)" : "",
                     comm->label, npresent, n, npresent == 1 ? "" : "s", present, nmissing == 1 ? "" : "s",
                     missing);
}

/* Publish this rank's join record under `slot` and check the join (see above): the rank holding
 * the generation's first slot (the checker) reads every other slot and writes its verdict
 * (joined/<first>: "ok", or "!<result> <message>"); every other rank reads the first slot's record
 * (a different world size there is its own to find) and then the verdict: two reads. The checker
 * gives up a little before the deadline (min(timeout/10, 2 s)) so that its verdict, naming the
 * ranks still missing, reaches the others in time. mcclInvalidArgument for ranks that disagree,
 * mcclTimeout naming the ranks still missing at the deadline, or the store's failure; the
 * thread's error says which. */
static mcclResult_t joinGroup(const struct mcclComm* comm, const mcclStore_t* store, int64_t slot,
                              int64_t deadline) {
  const int n = comm->nranks;
  const int64_t first = (int64_t)comm->generation * n + 1;
  char key[256], vkey[256], text[900], what[128], reason[700];
  snprintf(key, sizeof(key), "mccl/%s/join/%lld", comm->name, (long long)slot);
  snprintf(text, sizeof(text), "rank %d of %d", comm->rank, n);
  mcclResult_t res = storeSet(store, key, text, strlen(text), "this rank's join record");
  if (res != mcclSuccess || n == 1) return res;
  uint8_t* seen = calloc((size_t)n, 1);
  int64_t* seen_at = calloc((size_t)n, sizeof(int64_t));
  if (seen == NULL || seen_at == NULL) {
    free(seen);
    free(seen_at);
    mcclSetThreadError("mcclCommInitConfig: out of memory");
    return mcclSystemError;
  }
  seen[comm->rank] = 1;
  seen_at[comm->rank] = slot;
  int span = 0; /* set when this rank found a conflict: how many slots to poison */
  const int checker = slot == first;
  const int64_t early = checker ? gathererDeadline(deadline) : deadline;
  snprintf(vkey, sizeof(vkey), "mccl/%s/joined/%lld", comm->name, (long long)first);
  for (int64_t s = first; s < first + n && res == mcclSuccess; s++) {
    if (s == slot) continue;
    size_t len = 0;
    snprintf(key, sizeof(key), "mccl/%s/join/%lld", comm->name, (long long)s);
    snprintf(what, sizeof(what), "the join record of store slot %lld", (long long)s);
    res = storeGet(store, key, text, sizeof(text) - 1, &len, early, what);
    if (res == mcclTimeout) joinTimedOut(comm, seen, deadline, checker); /* later slots: later, if at all */
    if (res != mcclSuccess) break;
    text[len < sizeof(text) ? len : sizeof(text) - 1] = '\0';
    res = joinCheckRecord(comm, key, text, s, seen, seen_at, &span, reason, sizeof(reason));
    if (!checker) break; /* the first slot's record only; the checker's verdict for the rest */
  }
  if (span > 0) {
    mcclSetThreadError("mcclCommInitConfig: %s", reason);
    joinPoison(store, comm->name, span, reason, deadline);
  }
  if (checker) { /* the verdict, also on failure (best effort: the store may be what failed) */
    if (res == mcclSuccess) {
      res = storeSet(store, vkey, "ok", 2, "the join check's verdict");
    } else {
      snprintf(text, sizeof(text), "!%d %s", (int)res, initErrorBody(mcclThreadError()));
      store->set(store->ctx, vkey, text, strlen(text)); /* keeps this rank's own error */
    }
  } else if (res == mcclSuccess) {
    size_t len = 0;
    snprintf(what, sizeof(what), "the join check of the rank in store slot %lld (it reads every rank's join record)",
             (long long)first);
    res = storeGet(store, vkey, text, sizeof(text) - 1, &len, deadline, what);
    if (res == mcclTimeout) {
      /* No verdict (the checker started later than this rank, or stalled): which ranks joined,
       * looked up now without waiting, so that the message names the missing ones. */
      for (int64_t t = first; t < first + n; t++) {
        snprintf(key, sizeof(key), "mccl/%s/join/%lld", comm->name, (long long)t);
        int r = -1, rn = -1;
        if (t != slot && store->get(store->ctx, key, text, sizeof(text) - 1, &len, 1) == mcclSuccess) {
          text[len < sizeof(text) ? len : sizeof(text) - 1] = '\0';
          if (sscanf(text, "rank %d of %d", &r, &rn) == 2 && rn == n && r >= 0 && r < n) seen[r] = 1;
        }
      }
      joinTimedOut(comm, seen, deadline, 0);
    } else if (res == mcclSuccess) {
      text[len < sizeof(text) ? len : sizeof(text) - 1] = '\0';
      int code = 0, used = 0;
      if (strcmp(text, "ok") == 0) {
        res = mcclSuccess;
      } else if (text[0] == '!' && sscanf(text + 1, "%d %n", &code, &used) == 1 && code > 0 && code < mcclNumResults) {
        int by = -1; /* the checker: the rank whose record holds the first slot */
        for (int r = 0; r < n && by < 0; r++)
          if (seen[r] && seen_at[r] == first) by = r;
        mcclSetThreadError("mcclCommInitConfig: rank %d, which checks the join (the first to arrive), failed it%s: %s",
                           by, code == mcclTimeout ? " (what it had seen when it gave up)" : "", text + 1 + used);
        res = (mcclResult_t)code;
      } else {
        mcclSetThreadError("mcclCommInitConfig: store key '%s' holds '%.60s', not a join verdict: another program "
                           "uses this group's keys", vkey, text);
        res = mcclProtocolError;
      }
    }
  }
  free(seen);
  free(seen_at);
  return res;
}

/* At most this long, a rank 0 whose init failed waits for the other ranks to fail too (below). */
#define MCCL_INIT_LINGER_MS 5000

/* A failed init's last step, once every rank has joined the group's generation (`prefix`). Every
 * other rank counts itself in <prefix>/failed; rank 0 waits until the count reaches n - 1, at most
 * MCCL_INIT_LINGER_MS and not much past the deadline (a rank that was killed never counts).
 * Rank 0's process often hosts the store (torch's TCPStore with env:// outside torchrun): if it
 * returned at once and its process exited, the other ranks would lose the store before reading
 * why (the table's '!', the init failure key) and fail on "the store's connection closed"
 * instead of the cause. */
static void initFailedLinger(const mcclStore_t* store, const char* prefix, int rank, int nranks, int64_t deadline) {
  char key[256];
  int64_t count = 0;
  snprintf(key, sizeof(key), "%s/failed", prefix);
  if (rank != 0) {
    store->add(store->ctx, key, 1, &count); /* best effort: the store may be what failed */
    return;
  }
  const int64_t now = mcclNowNs(), left = deadline > now ? deadline - now : 0;
  const int64_t cap = MCCL_INIT_LINGER_MS * 1000000LL, grace = left + 1000000000LL;
  const int64_t until = now + (grace < cap ? grace : cap);
  while (store->add(store->ctx, key, 0, &count) == mcclSuccess && count < nranks - 1 && mcclNowNs() < until) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* A NULL argument of a communicator call: the thread's last error names it. */
static mcclResult_t nullArgument(const char* fn, const char* arg) {
  mcclSetThreadError("%s: %s is NULL", fn, arg);
  return mcclInvalidArgument;
}

MCCL_API mcclResult_t mcclCommInitConfig(mcclComm_t* out, const mcclCommConfig_t* cfg) {
  if (out == NULL || cfg == NULL) return nullArgument("mcclCommInitConfig", out == NULL ? "comm" : "config");
  *out = NULL;
  if (cfg->size != sizeof(mcclCommConfig_t)) {
    mcclSetThreadError("mcclCommInitConfig: config.size is %zu, expected %zu (call mcclCommConfigInit)",
                       cfg->size, sizeof(mcclCommConfig_t));
    return mcclInvalidArgument;
  }
  if (cfg->nranks < 1 || cfg->nranks > 65535) { /* the handshake carries it as a u16 */
    mcclSetThreadError("mcclCommInitConfig: config.nranks %d is outside 1..65535", cfg->nranks);
    return mcclInvalidArgument;
  }
  if (cfg->rank < 0 || cfg->rank >= cfg->nranks) {
    mcclSetThreadError("mcclCommInitConfig: config.rank %d is outside 0..%d (world size %d)", cfg->rank,
                       cfg->nranks - 1, cfg->nranks);
    return mcclInvalidArgument;
  }
  if (cfg->store.set == NULL || cfg->store.get == NULL || cfg->store.add == NULL) {
    mcclSetThreadError("mcclCommInitConfig: config.store needs set, get and add callbacks (%s is NULL)",
                       cfg->store.set == NULL ? "set" : cfg->store.get == NULL ? "get" : "add");
    return mcclInvalidArgument;
  }
  /* The name is part of every store key: cutting it short could make two groups share keys. */
  if (cfg->name != NULL && (cfg->name[0] == '\0' || strlen(cfg->name) >= sizeof(((struct mcclComm*)0)->name))) {
    mcclSetThreadError("mcclCommInitConfig: config.name must be 1 to %zu characters (NULL: \"default\")",
                       sizeof(((struct mcclComm*)0)->name) - 1);
    return mcclInvalidArgument;
  }
  pthread_once(&atfork_once, registerAtfork);
  if (atfork_error != 0) { /* ENOMEM: a communicator a child could misuse is not made */
    mcclSetThreadError("mcclCommInitConfig: cannot register the fork handlers (pthread_atfork): %s",
                       strerror(atfork_error));
    return mcclSystemError;
  }
  struct mcclComm* comm = calloc(1, sizeof(*comm));
  if (comm == NULL) {
    mcclSetThreadError("mcclCommInitConfig: out of memory");
    return mcclSystemError;
  }
  comm->rank = cfg->rank;
  comm->nranks = cfg->nranks;
  snprintf(comm->name, sizeof(comm->name), "%s", cfg->name ? cfg->name : "default");
  snprintf(comm->label, sizeof(comm->label), "%s", cfg->label && cfg->label[0] ? cfg->label : comm->name);
  comm->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30 * 60 * 1000;
  if (comm->timeout_ms > MCCL_MAX_TIMEOUT_MS) comm->timeout_ms = MCCL_MAX_TIMEOUT_MS; /* "forever" */
  comm->tp.wake[0] = comm->tp.wake[1] = -1;
  pthread_mutex_init(&comm->qlock, NULL);
  mcclCondInit(&comm->qcond); /* timed waits on the monotonic clock */
  pthread_mutex_init(&comm->errlock, NULL);
  atomic_init(&comm->aborted, 0);
  atomic_init(&comm->refs, 1);
  comm->forks = atomic_load(&fork_count);
  comm->owner_pid = (long)getpid();

  const mcclStore_t* store = &cfg->store;
  const int64_t deadline = mcclDeadlineNs(comm->timeout_ms);
  mcclResult_t res = mcclSuccess;
  int listen_fd = -1;
  int publish_failure = 0, addr_published = 0; /* see initPublishFailure */
  int joined = 0; /* every rank is in this generation: see initFailedLinger */
  char (*addrs)[MCCL_ADDR_STRLEN] = calloc((size_t)comm->nranks, MCCL_ADDR_STRLEN);
  rankRecord* recs = calloc((size_t)comm->nranks, sizeof(rankRecord));
  char key[256], prefix[200];
  if (addrs == NULL || recs == NULL) {
    mcclSetThreadError("mcclCommInitConfig: out of memory");
    res = mcclSystemError;
    goto fail;
  }

  /* Generation: a fresh key space for every init of this group on this store. */
  int64_t counter = 0;
  snprintf(key, sizeof(key), "mccl/%s/inits", comm->name);
  MCCLCHECKGOTO(storeAdd(store, key, 1, &counter, "counting this rank in"), res, fail);
  comm->generation = (uint64_t)((counter - 1) / comm->nranks);
  snprintf(prefix, sizeof(prefix), "mccl/%s/g%llu", comm->name, (unsigned long long)comm->generation);
  MCCLCHECKGOTO(joinGroup(comm, store, counter, deadline), res, fail);
  joined = 1;

  if (comm->nranks > 1) {
    mcclTransportAuth auth;
    memset(&auth, 0, sizeof(auth));
    auth.generation = comm->generation;
    auth.comm_hash = fnv1a(comm->name);
    snprintf(key, sizeof(key), "%s/token", prefix);
    if (comm->rank == 0) {
      if (randomBytes(auth.token, sizeof(auth.token)) != 0) {
        mcclSetThreadError("mcclCommInitConfig: no random bytes for the job token: %s", strerror(errno));
        res = mcclSystemError;
        goto fail;
      }
      MCCLCHECKGOTO(storeSet(store, key, auth.token, sizeof(auth.token), "the job token"), res, fail);
    } else {
      size_t len = 0;
      MCCLCHECKGOTO(storeGet(store, key, auth.token, sizeof(auth.token), &len, deadline, "rank 0's job token"), res, fail);
      if (len != sizeof(auth.token)) {
        mcclSetThreadError("mcclCommInitConfig: store key '%s' holds %zu bytes, not a job token", key, len);
        res = mcclProtocolError;
        goto fail;
      }
    }

    publish_failure = 1; /* from here on the store is known to work */
    mcclSockaddr local;
    char ifname[96];
    MCCLCHECKGOTO(mcclFindLocalAddress(cfg->peer_hint, &local, ifname, sizeof(ifname)), res, fail);
    MCCLCHECKGOTO(mcclSocketListen(&local, &listen_fd), res, fail);
    mcclSockaddrFormat(&local, addrs[comm->rank], MCCL_ADDR_STRLEN);
    INFO(MCCL_SUB_INIT, "rank %d/%d of '%s' generation %llu listening on %s (%s)", comm->rank,
         comm->nranks, comm->label, (unsigned long long)comm->generation, addrs[comm->rank], ifname);
    rankRecord* self = &recs[comm->rank];
    snprintf(self->addr, sizeof(self->addr), "%s", addrs[comm->rank]);
    mcclHostDescribe(self->host, sizeof(self->host));
    jobSettings(comm->nranks, self->settings, sizeof(self->settings));
    char group_why[400];
    mcclTopologyGroup(addrs[comm->rank], NULL, mcclParamString("MCCL_TOPOLOGY_GROUP"), mcclParamString("MCCL_TOPOLOGY"),
                      self->group, group_why, sizeof(group_why));
    snprintf(key, sizeof(key), "%s/addr/%d", prefix, comm->rank);
    MCCLCHECKGOTO(storeSet(store, key, addrs[comm->rank], strlen(addrs[comm->rank]), "this rank's address"), res,
                  fail);
    snprintf(key, sizeof(key), "%s/rank/%d", prefix, comm->rank);
    MCCLCHECKGOTO(storeSet(store, key, self, sizeof(*self), "this rank's record"), res, fail);
    addr_published = 1;
    MCCLCHECKGOTO(gatherRecords(comm, store, prefix, recs, deadline), res, fail);
    MCCLCHECKGOTO(checkJobSettings(comm, recs), res, fail);
    for (int r = 0; r < comm->nranks; r++) snprintf(addrs[r], MCCL_ADDR_STRLEN, "%s", recs[r].addr);
    /* A loopback address is reachable from its own host (and network namespace) only: if a rank
     * published one and a rank elsewhere must dial it, the job would wait out its timeout on
     * "connection refused". Every rank sees the same table, so every rank fails here at once.
     * The same descriptions tell which ranks share this rank's CPUs. */
    int lo = -1;
    for (int r = 0; r < comm->nranks && lo < 0; r++) {
      mcclSockaddr a;
      if (mcclSockaddrParse(addrs[r], &a) != 0) continue;
      int is_lo = a.sa.sa_family == AF_INET ? (ntohl(a.sin.sin_addr.s_addr) >> 24) == 127
                                             : IN6_IS_ADDR_LOOPBACK(&a.sin6.sin6_addr);
      if (is_lo) lo = r;
    }
    mcclCpuShare share;
    mcclCpuShareInit(&share, recs[comm->rank].host);
    for (int r = 0; r < comm->nranks; r++) {
      if (r != comm->rank) mcclCpuShareAdd(&share, recs[r].host);
      if (lo >= 0 && !mcclHostSameLoopback(recs[r].host, recs[lo].host)) {
        mcclSetThreadError("mcclCommInitConfig: rank %d published the loopback address %s, but rank %d "
                           "(%s) runs on another host or network namespace and cannot reach it. "
                           "Rank %d's MASTER_ADDR (or MCCL_SOCKET_IFNAME) led it to loopback: give "
                           "MASTER_ADDR as a routable IP address, or set MCCL_SOCKET_IFNAME",
                           lo, addrs[lo], r, addrs[r], lo);
        res = mcclInvalidArgument;
        goto fail;
      }
    }
    MCCLCHECKGOTO(ringOrder(comm, recs, group_why), res, fail);
    initWatchCtx watch_ctx = {store, prefix, comm->rank};
    mcclTransportWatch watch = {&watch_ctx, initPeerFailed};
    /* Runtime connection (tcp.h): by default above MCCL_ANNOUNCE_RANKS ranks, where no
     * collective but all-to-all needs every peer any more; up to it every ring collective's
     * agreement reaches every rank anyway, and the eager mesh's READY exchange makes init fail
     * on every rank when it fails on one. */
    int64_t runtime_connect = mcclParamInt("MCCL_RUNTIME_CONNECT");
    if (runtime_connect < 0) runtime_connect = comm->nranks > mcclParamInt("MCCL_ANNOUNCE_RANKS");
    res = mcclTransportInit(&comm->tp, comm->rank, comm->nranks, listen_fd, addrs, &auth, &watch, deadline,
                            (int)runtime_connect);
    listen_fd = -1; /* the transport's now */
    if (res != mcclSuccess) {
      mcclSetThreadError("mcclCommInitConfig: %s", comm->tp.error);
      goto fail;
    }
    comm->tp.trace = mcclTraceOpen(comm->rank, comm->nranks, comm->label); /* before the sender starts */
    int64_t send_thread = mcclParamInt("MCCL_SEND_THREAD");
    /* A second thread pays off only with a CPU of its own: this rank may run on 2 CPUs, and the
     * ranks that share them have 2 each. */
    int cpus = mcclCpuShareCpus(&share), own = mcclCpuShareSelfCpus(&share);
    if (send_thread < 0) send_thread = own >= 2 && cpus >= 2 * share.ranks;
    INFO(MCCL_SUB_INIT, "rank %d: %s (it may run on %d CPUs; %d CPUs shared by %d ranks of this job)", comm->rank,
         send_thread ? "sends on the mccl-send thread" : "the engine thread sends", own, cpus, share.ranks);
    if (send_thread && mcclTransportStartSender(&comm->tp) != mcclSuccess)
      WARN("rank %d: %s; the engine thread sends too", comm->rank, comm->tp.error);
  } else {
    res = mcclTransportInit(&comm->tp, 0, 1, -1, addrs, NULL, NULL, deadline, 0);
    if (res != mcclSuccess) goto fail;
  }

  if (mcclP2pInit(comm) != mcclSuccess) {
    mcclSetThreadError("mcclCommInitConfig: out of memory");
    res = mcclSystemError;
    goto fail;
  }
  comm->algo.tp = &comm->tp;
  comm->algo.rank = comm->rank;
  comm->algo.nranks = comm->nranks;
  comm->algo.abort_flag = &comm->aborted;
  comm->algo.segment_bytes = (size_t)mcclParamInt("MCCL_SEGMENT_BYTES");
  comm->algo.depth = (int)mcclParamInt("MCCL_PIPELINE_DEPTH");
  comm->algo.relay = (int)mcclParamInt("MCCL_CHAIN_RELAY");
  comm->algo.ring_threshold = (size_t)mcclParamInt("MCCL_RING_THRESHOLD");
  comm->algo.alpha_beta = (size_t)mcclParamInt("MCCL_ALPHA_BETA");
  comm->algo.alltoall_window = (int)mcclParamInt("MCCL_ALLTOALL_WINDOW");
  comm->algo.announce_ranks = (int)mcclParamInt("MCCL_ANNOUNCE_RANKS");
  comm->algo.single_host = mcclTransportSingleHost(&comm->tp);
  INFO(MCCL_SUB_INIT, "rank %d/%d: %s; alpha x beta %zu bytes (MCCL_ALPHA_BETA)", comm->rank, comm->nranks,
       comm->algo.single_host ? "every rank on this host (loopback)" : "ranks on several hosts",
       comm->algo.alpha_beta);

  int rc = pthread_create(&comm->engine, NULL, mcclEngineMain, comm);
  if (rc != 0) {
    mcclSetThreadError("mcclCommInitConfig: cannot start the engine thread: %s", strerror(rc));
    res = mcclSystemError;
    goto fail;
  }
  comm->engine_started = 1;
  mcclThreadSetNameOf(comm->engine, "mccl-engine");
  free(addrs);
  free(recs);
  liveAdd(comm);
  *out = comm;
  return mcclSuccess;

fail:
  if (publish_failure && res != mcclTimeout && res != mcclRemoteError)
    initPublishFailure(store, prefix, comm->rank, addrs != NULL ? addrs[comm->rank] : "", addr_published,
                       mcclThreadError());
  if (listen_fd >= 0) close(listen_fd);
  free(addrs);
  free(recs);
  WARN("rank %d: init of communicator '%s' failed: %s", cfg->rank, comm->label,
       mcclThreadError());
  const int rank = comm->rank, nranks = comm->nranks;
  commFree(comm); /* its sockets close first: peers connected to it see that at once */
  if (joined && nranks > 1) initFailedLinger(store, prefix, rank, nranks, deadline);
  return res;
}

/* Destroy or abort in a child of fork(): free this process's copy. The descriptors were closed
 * in the fork; the engine and sender threads do not exist here, so nothing is joined, sent or
 * shut down. The sender thread's own memory and pipe (the transport's, opaque here) are left. */
static mcclResult_t releaseInherited(struct mcclComm* comm, const char* fn) {
  INFO(MCCL_SUB_INIT, "%s: releasing communicator '%s' (rank %d of %d) inherited from process %ld", fn,
       comm->label, comm->rank, comm->nranks, comm->owner_pid);
  liveRemove(comm);
  forgetDescriptors(comm); /* a no-op when the fork handler found it listed */
  comm->tp.sender = NULL;
  comm->engine_started = 0;
  commFree(comm);
  return mcclSuccess;
}

static void stopEngine(struct mcclComm* comm) {
  pthread_mutex_lock(&comm->qlock);
  comm->stopping = 1;
  pthread_cond_signal(&comm->qcond);
  if (comm->idle_reading) mcclTransportWake(&comm->tp);
  pthread_mutex_unlock(&comm->qlock);
  if (comm->engine_started) pthread_join(comm->engine, NULL);
  comm->engine_started = 0;
}

MCCL_API mcclResult_t mcclCommDestroy(mcclComm_t comm) {
  if (comm == NULL) return nullArgument("mcclCommDestroy", "comm");
  if (mcclCommInherited(comm)) return releaseInherited(comm, "mcclCommDestroy");
  liveRemove(comm);
  stopEngine(comm);
  char peers[256];
  mcclResult_t failed = mcclSuccess;
  mcclCommGetAsyncError(comm, &failed);
  if (failed == mcclSuccess && mcclTransportUnread(&comm->tp, peers, sizeof(peers)) > 0)
    WARN("rank %d: communicator '%s' destroyed with frames from rank %s never read: sends that no "
         "recv matched, a collective that rank issued and this one never did (such as one still in "
         "flight when that rank exited), or collectives that differed between the ranks (for "
         "example broadcasts with different roots), in which case some results may differ between "
         "ranks", comm->rank, comm->label, peers);
  commFree(comm);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclCommAbort(mcclComm_t comm) {
  if (comm == NULL) return nullArgument("mcclCommAbort", "comm");
  if (mcclCommInherited(comm)) return releaseInherited(comm, "mcclCommAbort"); /* no ABORT frames */
  liveRemove(comm);
  atomic_store(&comm->aborted, 1);
  mcclCommSetError(comm, mcclAborted, "the communicator was aborted (mcclCommAbort)");
  mcclTransportWake(&comm->tp);
  stopEngine(comm); /* queued requests fail at once: the communicator has an error now */
  char reason[64]; /* relayed as is (tcp_fail.c): it must name this rank */
  snprintf(reason, sizeof(reason), "rank %d: aborted by its owner (mcclCommAbort)", comm->rank);
  mcclTransportFail(&comm->tp, reason);
  mcclP2pFailAll(comm, mcclAborted, "the communicator was aborted (mcclCommAbort)");
  commFree(comm);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclCommRank(mcclComm_t comm, int* rank) {
  if (comm == NULL || rank == NULL) return nullArgument("mcclCommRank", comm == NULL ? "comm" : "rank");
  if (mcclCommInherited(comm)) return mcclCommForkError(comm, "mcclCommRank");
  *rank = comm->rank;
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclCommCount(mcclComm_t comm, int* nranks) {
  if (comm == NULL || nranks == NULL) return nullArgument("mcclCommCount", comm == NULL ? "comm" : "nranks");
  if (mcclCommInherited(comm)) return mcclCommForkError(comm, "mcclCommCount");
  *nranks = comm->nranks;
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclCommGetAsyncError(mcclComm_t comm, mcclResult_t* error) {
  if (comm == NULL || error == NULL)
    return nullArgument("mcclCommGetAsyncError", comm == NULL ? "comm" : "error");
  if (mcclCommInherited(comm)) {
    *error = mcclInvalidUsage;
    return mcclCommForkError(comm, "mcclCommGetAsyncError");
  }
  pthread_mutex_lock(&comm->errlock);
  *error = comm->async_error;
  pthread_mutex_unlock(&comm->errlock);
  return mcclSuccess;
}

MCCL_API const char* mcclGetLastError(mcclComm_t comm) {
  if (comm == NULL) return mcclThreadError();
  if (mcclCommInherited(comm)) {
    mcclCommForkError(comm, "mcclGetLastError");
    return mcclThreadError();
  }
  return comm->error_msg;
}
