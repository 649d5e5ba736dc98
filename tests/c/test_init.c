/*
 * test_init.c: init failures that must name their cause, on every rank that can see it, long
 * before the timeout:
 *  - ranks started with different world sizes (in every order of arrival, including the one where
 *    the generations they compute differ), and two processes started with one rank number;
 *  - ranks that never start: a timeout naming the ranks still missing;
 *  - a bootstrap store that goes away mid-init (its server stopped), and one that answers a wait
 *    with a timeout at once: both are store failures, not timeouts of the init.
 * The order in which ranks join is forced by watching the store's init counter, so each case is
 * deterministic.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define GROUP "init"

/* Wait until `joined` ranks have counted themselves into the group's inits counter. */
static void waitJoined(mcclStore_t* store, int64_t joined) {
  int64_t v = 0;
  for (int i = 0; i < 2000; i++) {
    if (store->add(store->ctx, "mccl/" GROUP "/inits", 0, &v) != mcclSuccess || v >= joined) return;
    harnessSleepUs(5000);
  }
}

/* Init as `rank` of `nranks` on `store` with `timeout_ms`; *took: seconds spent. */
static mcclResult_t initAs(int rank, int nranks, mcclStore_t* store, int64_t timeout_ms, mcclComm_t* comm,
                           double* took) {
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = rank;
  cfg.nranks = nranks;
  cfg.store = *store;
  cfg.name = GROUP;
  cfg.timeout_ms = timeout_ms;
  cfg.peer_hint = "127.0.0.1";
  double start = harnessSeconds();
  mcclResult_t res = mcclCommInitConfig(comm, &cfg);
  *took = harnessSeconds() - start;
  return res;
}

/* One case of world sizes: process p inits as rank ranks[p] of sizes[p], after order[p] others
 * joined; expect[p] is 1 when that process must succeed. */
typedef struct {
  const char* name;
  int nprocs;
  int ranks[4], sizes[4], order[4], expect_ok[4];
  const char* words[4]; /* the failure message must contain each (NULL-terminated) */
} sizeCase;

static int sizeRank(int p, int nprocs, mcclStore_t* store, void* arg) {
  (void)nprocs;
  const sizeCase* c = arg;
  waitJoined(store, c->order[p]);
  mcclComm_t comm = NULL;
  double took = 0;
  mcclResult_t res = initAs(c->ranks[p], c->sizes[p], store, 20000, &comm, &took);
  const char* msg = mcclGetLastError(NULL);
  if (c->expect_ok[p]) {
    EXPECT(res == mcclSuccess, "%s: process %d (rank %d of %d) failed: %s", c->name, p, c->ranks[p], c->sizes[p],
           msg);
    if (res == mcclSuccess) EXPECT_OK(comm, mcclCommDestroy(comm));
    return 0;
  }
  EXPECT(res == mcclInvalidArgument, "%s: process %d got %s: %s", c->name, p, mcclGetErrorString(res), msg);
  EXPECT(took < 5.0, "%s: process %d failed after %.1f s (the timeout is 20 s)", c->name, p, took);
  EXPECT(strchr(msg, '\n') == NULL, "%s: process %d: the message is not one line: %s", c->name, p, msg);
  for (int w = 0; w < 4 && c->words[w] != NULL; w++)
    EXPECT(strstr(msg, c->words[w]) != NULL, "%s: process %d: '%s' not in: %s", c->name, p, c->words[w], msg);
  return 0;
}

static const sizeCase kSizeCases[] = {
    /* Two processes, in both orders: rank 0 of 2 and rank 1 of 3. */
    {"2 vs 3, rank 0 first", 2, {0, 1}, {2, 3}, {0, 1}, {0, 0},
     {"different world sizes", "rank 0 with 2, rank 1 with 3", NULL}},
    {"2 vs 3, rank 1 first", 2, {0, 1}, {2, 3}, {1, 0}, {0, 0},
     {"different world sizes", "rank 0 with 2, rank 1 with 3", NULL}},
    /* Rank 0 of 2 joins last: slot 3, generation 1 by its world size, waiting on slot 4 that
     * nobody takes, until a rank of generation 0 poisons it. */
    {"2 vs 3 vs 3, rank 0 last", 3, {0, 1, 2}, {2, 3, 3}, {2, 0, 1}, {0, 0, 0},
     {"different world sizes", "with 2", "with 3", NULL}},
    {"2 vs 3 vs 3, rank 0 first", 3, {0, 1, 2}, {2, 3, 3}, {0, 1, 2}, {0, 0, 0},
     {"different world sizes", "with 2", "with 3", NULL}},
    /* Rank 2 of 3 first, then ranks 0 and 1 of 2: the second of those is alone in generation 1. */
    {"3 vs 2 vs 2, rank 2 first", 3, {0, 1, 2}, {2, 2, 3}, {1, 2, 0}, {0, 0, 0},
     {"different world sizes", "with 2", "rank 2 with 3", NULL}},
    /* Ranks 0 and 1 of 2 first: a complete world of 2 that cannot see rank 2 (which fails). */
    {"3 vs 2 vs 2, rank 2 last", 3, {0, 1, 2}, {2, 2, 3}, {0, 1, 2}, {1, 1, 0},
     {"different world sizes", "rank 0 with 2, rank 2 with 3", NULL}},
    /* Two processes both started as rank 0 of 2. */
    {"rank 0 twice", 2, {0, 0}, {2, 2}, {0, 1}, {0, 0}, {"started as rank 0 of 2", NULL}},
};

/* Two of three ranks start: both time out at the deadline, naming rank 2 as missing. */
static int missingRank(int r, int n, mcclStore_t* store, void* arg) {
  (void)n;
  (void)arg;
  mcclComm_t comm = NULL;
  double took = 0;
  mcclResult_t res = initAs(r, 3, store, 1500, &comm, &took);
  const char* msg = mcclGetLastError(NULL);
  EXPECT(res == mcclTimeout, "rank %d: got %s: %s", r, mcclGetErrorString(res), msg);
  EXPECT(took > 1.3 && took < 4.0, "rank %d timed out after %.1f s (timeout 1.5 s)", r, took);
  EXPECT(strstr(msg, "2 of 3 joined (ranks 0, 1); still missing rank 2") != NULL, "rank %d: %s", r, msg);
  /* The time actually waited, not the timeout: the rank that checks the join stops early. */
  const char* at = strstr(msg, "timed out after ");
  double said = -1;
  EXPECT(at != NULL && sscanf(at, "timed out after %lf s", &said) == 1 && said >= 1.2 && said <= 1.5,
         "rank %d: the message says it waited %.2f s (timeout 1.5 s): %s", r, said, msg);
  return 0;
}

/* ---- store failures ------------------------------------------------------------------------ */

typedef struct {
  mcclTcpStoreServer_t* server;
  pthread_t thread;
} privateStore;

static void* serve(void* arg) {
  mcclTcpStoreServe(arg, 0);
  return NULL;
}

/* After 500 ms: stop serving and free the server, which closes every client's connection. */
static void* stopLater(void* arg) {
  privateStore* ps = arg;
  harnessSleepUs(500000);
  mcclTcpStoreStop(ps->server);
  pthread_join(ps->thread, NULL);
  mcclTcpStoreFree(ps->server);
  return NULL;
}

/* Rank 0 serves a store of its own, which both ranks use to init a group of 3 (so they wait for
 * rank 2); after 500 ms rank 0 stops it. Both inits must fail at once, naming the store. */
static int storeStopped(int r, int n, mcclStore_t* store, void* arg) {
  (void)n;
  (void)arg;
  privateStore ps = {NULL, 0};
  int port = 0;
  if (r == 0) {
    EXPECT_OK(NULL, mcclTcpStoreListen("127.0.0.1", 0, &port, &ps.server));
    if (ps.server == NULL) return 1;
    pthread_create(&ps.thread, NULL, serve, ps.server);
    char text[16];
    snprintf(text, sizeof(text), "%d", port);
    EXPECT_OK(NULL, store->set(store->ctx, "test/port", text, strlen(text)));
  } else {
    char text[16] = "";
    size_t len = 0;
    EXPECT_OK(NULL, store->get(store->ctx, "test/port", text, sizeof(text) - 1, &len, 10000));
    text[len < sizeof(text) ? len : 0] = '\0';
    port = atoi(text);
  }
  mcclStore_t mine;
  if (mcclTcpStoreConnect("127.0.0.1", port, 5000, &mine) != mcclSuccess) {
    EXPECT(0, "rank %d: cannot reach rank 0's store: %s", r, mcclGetLastError(NULL));
    return 1;
  }
  mcclComm_t comm = NULL;
  double took = 0;
  pthread_t stopper;
  if (r == 0) pthread_create(&stopper, NULL, stopLater, &ps); /* while this thread waits in init */
  mcclResult_t res = initAs(r, 3, &mine, 20000, &comm, &took);
  const char* msg = mcclGetLastError(NULL);
  EXPECT(res == mcclRemoteError, "rank %d: got %s: %s", r, mcclGetErrorString(res), msg);
  EXPECT(took < 5.0, "rank %d failed after %.1f s (the timeout is 20 s)", r, took);
  EXPECT(strstr(msg, "the bootstrap store failed while waiting for") != NULL && strstr(msg, "closed") != NULL,
         "rank %d: %s", r, msg);
  mcclTcpStoreClose(&mine);
  if (r == 0) pthread_join(stopper, NULL);
  return 0;
}

/* A store whose wait answers mcclTimeout at once (as a torch store whose connection closed may):
 * a store failure, not the init's timeout. */
static mcclResult_t waitTimesOutAtOnce(void* ctx, const char* key, int64_t timeout_ms) {
  (void)ctx;
  (void)key;
  (void)timeout_ms;
  return mcclTimeout;
}

static int storeTimesOut(int r, int n, mcclStore_t* store, void* arg) {
  (void)n;
  (void)arg;
  mcclStore_t broken = *store;
  broken.wait = waitTimesOutAtOnce;
  mcclComm_t comm = NULL;
  double took = 0;
  mcclResult_t res = initAs(r, 2, &broken, 20000, &comm, &took);
  const char* msg = mcclGetLastError(NULL);
  EXPECT(res == mcclRemoteError, "got %s: %s", mcclGetErrorString(res), msg);
  EXPECT(took < 2.0, "failed after %.1f s (the timeout is 20 s)", took);
  EXPECT(strstr(msg, "the bootstrap store failed while waiting for the join record of store slot 2") != NULL &&
             strstr(msg, "reported a timeout after 0.0") != NULL,
         "%s", msg);
  return 0;
}

int main(void) {
  for (size_t i = 0; i < sizeof(kSizeCases) / sizeof(kSizeCases[0]); i++) {
    int before = harness_failures;
    harnessRunRanks(kSizeCases[i].nprocs, 60, sizeRank, (void*)&kSizeCases[i]);
    printf("init: %s: %s\n", kSizeCases[i].name, harness_failures == before ? "ok" : "FAILED");
    fflush(stdout);
  }
  harnessRunRanks(2, 60, missingRank, NULL);
  harnessRunRanks(2, 60, storeStopped, NULL);
  harnessRunRanks(1, 60, storeTimesOut, NULL);
  return harnessExit("test_init");
}
