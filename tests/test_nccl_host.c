/*
 * tests/test_nccl_host.c — the NCCL backend's host-side parts, on any machine: the communicator's unique id
 * passed through the rendezvous store (rank 0 publishes, the others wait; rank 0's failure reaches them at
 * once; a missing rank 0 is a timeout naming it), and what `--backend nccl` says where it cannot run (a
 * build without NCCL, a machine without a GPU). With a GPU (and NCCL) it also runs a group of one rank on
 * cuda:0: collectives on device tensors and on CPU tensors staged through the device.
 */
#include "distributed/nccl/nccl.h"
#include "test_util.h"

#include <pthread.h>

typedef struct id_rank {
    ts_store *store;
    int rank;
    double timeout_s;
    bool fail; /* rank 0's maker fails */
    unsigned char id[TS_NCCL_ID_BYTES];
    ts_status st;
    char err[512];
    double seconds;
} id_rank;

static ts_status fake_maker(void *user, unsigned char id[TS_NCCL_ID_BYTES]) {
    const id_rank *r = user;
    if (r->fail) return ts_error(TS_ERR_DEVICE, "no NCCL network interface found (test)");
    for (int i = 0; i < TS_NCCL_ID_BYTES; i++) id[i] = (unsigned char)(i * 7 + 3);
    return TS_OK;
}

static void *id_thread(void *arg) {
    id_rank *r = arg;
    double t0 = ts_time_now();
    r->st = ts__nccl_exchange_id(r->store, r->rank, r->timeout_s, fake_maker, r, r->id);
    r->seconds = ts_time_now() - t0;
    snprintf(r->err, sizeof r->err, "%s", r->st == TS_OK ? "" : ts_last_error());
    return NULL;
}

static void run_ranks(id_rank *r, int n) {
    pthread_t th[8];
    for (int i = n - 1; i >= 0; i--) pthread_create(&th[i], NULL, id_thread, &r[i]); /* rank 0 last */
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* Three ranks: every one ends with rank 0's id. */
static void test_id_exchange(void) {
    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    id_rank r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) r[i] = (id_rank){.store = s, .rank = i, .timeout_s = 30};
    run_ranks(r, 3);
    unsigned char want[TS_NCCL_ID_BYTES];
    CHECK_OK(fake_maker(&r[0], want));
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].st == TS_OK);
        CHECK(memcmp(r[i].id, want, sizeof want) == 0);
    }
    ts_store_release(s);
}

/* Rank 0 cannot make an id: the others fail at once (not at their 30 s timeout) with its message. */
static void test_id_error_reaches_peers(void) {
    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    id_rank r[2];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 2; i++) r[i] = (id_rank){.store = s, .rank = i, .timeout_s = 30, .fail = true};
    run_ranks(r, 2);
    CHECK(r[0].st == TS_ERR_DEVICE && strstr(r[0].err, "no NCCL network interface") != NULL);
    CHECK(r[1].st == TS_ERR_REMOTE);
    CHECK(strstr(r[1].err, "rank 0 could not create") != NULL && strstr(r[1].err, "no NCCL network interface") != NULL);
    CHECK(r[1].seconds < 10);
    printf("rank 1: %s (%.2f s)\n", r[1].err, r[1].seconds);
    ts_store_release(s);
}

/* No rank 0: the wait ends at the timeout and names what it waited for. */
static void test_id_timeout(void) {
    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    id_rank r = {.store = s, .rank = 1, .timeout_s = 0.3};
    id_thread(&r);
    CHECK(r.st == TS_ERR_TIMEOUT);
    CHECK(strstr(r.err, "rank 0's unique id") != NULL);
    CHECK(r.seconds < 5);
    /* a malformed value is refused, not copied */
    CHECK_OK(ts_store_set(s, TS_NCCL_ID_KEY, "Ixyz", 4));
    id_thread(&r);
    CHECK(r.st == TS_ERR_FORMAT && strstr(r.err, "not a unique id") != NULL);
    ts_store_release(s);
}

/* A group of one over a memory store, backend nccl. */
static ts_status nccl_group(const char *device, ts_process_group **pg) {
    ts_store *s = NULL;
    ts_status st = ts_store_memory_new(&s);
    if (st != TS_OK) return st;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.backend = "nccl";
    o.store = s;
    o.rank = 0;
    o.world_size = 1;
    o.local_rank = 0;
    o.local_world_size = 1;
    o.timeout_s = 30;
    o.device = device;
    st = ts_pg_new(&o, pg);
    ts_store_release(s);
    return st;
}

/* Where the backend cannot run, it says why; on a GPU, a group of one runs every kind of buffer. */
static void test_backend(void) {
    ts_process_group *pg = NULL;
    if (!ts_pg_backend_available("nccl")) {
        CHECK_STATUS(nccl_group(NULL, &pg), TS_ERR_UNSUPPORTED);
        CHECK_ERR_MENTIONS("not built into this Tessera");
        printf("no NCCL in this build: %s\n", ts_last_error());
        return;
    }
    char why[256];
    if (ts_cuda_device_count(why, sizeof why) == 0) {
        CHECK_STATUS(nccl_group(NULL, &pg), TS_ERR_DEVICE);
        CHECK_ERR_MENTIONS("cuda:0");
        printf("no GPU: %s\n", ts_last_error());
        CHECK_STATUS(nccl_group("cpu", &pg), TS_ERR_DEVICE); /* a CPU device is refused by name */
        CHECK_ERR_MENTIONS("needs a CUDA device");
        return;
    }
    CHECK_OK(nccl_group("cuda:0", &pg));
    if (!pg) return;
    CHECK(strcmp(ts_pg_backend_name(pg), "nccl") == 0);
    char links[200];
    ts_pg_describe_links(pg, links, sizeof links);
    printf("%s\n", links);
    CHECK(strstr(links, "NCCL") != NULL && strstr(links, "cuda:0") != NULL);
    ts_device *gpu = NULL;
    CHECK_OK(ts_device_get("cuda:0", &gpu));
    float v[5] = {1, -2, 3.5f, 4, 1e-3f}, back[5];
    int64_t n = 5;
    ts_tensor *d = NULL, *h = NULL;
    CHECK_OK(ts_tensor_from_data(gpu, TS_F32, 1, &n, v, &d));
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 1, &n, v, &h));
    /* device tensor: sum, avg, max over one rank are the values themselves; asynchronous too */
    CHECK_OK(ts_all_reduce(pg, d, TS_REDUCE_SUM, NULL));
    ts_work *w = NULL;
    CHECK_OK(ts_all_reduce(pg, d, TS_REDUCE_AVG, &w));
    CHECK_OK(ts_work_wait(w, -1));
    ts_work_free(w);
    CHECK_OK(ts_tensor_to_host(d, back, sizeof back));
    CHECK(memcmp(back, v, sizeof v) == 0);
    /* a CPU tensor goes through the device */
    CHECK_OK(ts_all_reduce(pg, h, TS_REDUCE_MAX, NULL));
    CHECK(memcmp(ts_tensor_data(h), v, sizeof v) == 0);
    CHECK_OK(ts_broadcast(pg, d, 0, NULL));
    CHECK_OK(ts_barrier(pg, NULL));
    ts_tensor *out = NULL;
    CHECK_OK(ts_tensor_zeros(gpu, TS_F32, 1, &n, &out));
    CHECK_OK(ts_all_gather(pg, out, d, NULL));
    CHECK_OK(ts_tensor_to_host(out, back, sizeof back));
    CHECK(memcmp(back, v, sizeof v) == 0);
    /* a tensor on another device than the group's is refused by name */
    ts_device *other = NULL;
    if (ts_cuda_device_count(NULL, 0) > 1 && ts_device_get("cuda:1", &other) == TS_OK) {
        ts_tensor *o1 = NULL;
        CHECK_OK(ts_tensor_zeros(other, TS_F32, 1, &n, &o1));
        CHECK_STATUS(ts_all_reduce(pg, o1, TS_REDUCE_SUM, NULL), TS_ERR_DEVICE);
        CHECK_ERR_MENTIONS("runs on cuda:0");
        ts_tensor_release(o1);
    }
    ts_tensor_release(out);
    ts_tensor_release(d);
    ts_tensor_release(h);
    ts_pg_free(pg);
}

TU_MAIN(T(test_id_exchange), T(test_id_error_reaches_peers), T(test_id_timeout), T(test_backend))
