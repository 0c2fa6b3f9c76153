/* Rendezvous stores (memory, file, TCP, prefix), the launch environment and
 * the rendezvous join: threads and forked processes, on 127.0.0.1 only. */
#include "test_util.h"

#include "tessera/dist.h"
#include "distributed/heartbeat.h"
#include "distributed/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------------- */

/* A port nobody listens on right now (bound to 127.0.0.1:0, then closed). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &l) != 0)
        abort();
    close(fd);
    return ntohs(a.sin_port);
}

/* Waits for a child; kills it after timeout_s. Returns its exit status, or -1. */
static int wait_child(pid_t pid, double timeout_s) {
    double t0 = ts_time_now();
    for (;;) {
        int status = 0;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r < 0) return -1;
        if (ts_time_now() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "child %d killed after %.0f s\n", (int)pid, timeout_s);
            return -1;
        }
        usleep(10000);
    }
}

static bool value_is(ts_store *s, const char *key, const char *want) {
    void *v = NULL;
    size_t n = 0;
    ts_status st = ts_store_get(s, key, &v, &n);
    bool ok = st == TS_OK && n == strlen(want) && memcmp(v, want, n + 1) == 0;
    if (!ok) fprintf(stderr, "get '%s': %s (%s) '%s'\n", key, ts_status_name(st), ts_last_error(), v ? (char *)v : "");
    free(v);
    return ok;
}

typedef struct getter {
    ts_store *s;
    const char *key;
    ts_status st;
    char err[256];
    void *value;
    size_t len;
} getter;

static void *getter_main(void *arg) {
    getter *g = arg;
    g->st = ts_store_get(g->s, g->key, &g->value, &g->len);
    snprintf(g->err, sizeof g->err, "%s", ts_last_error());
    return NULL;
}

typedef struct adder {
    ts_store *s;
    int n;
    ts_status st;
} adder;

static void *adder_main(void *arg) {
    adder *a = arg;
    a->st = TS_OK;
    for (int i = 0; i < a->n && a->st == TS_OK; i++) a->st = ts_store_add(a->s, "counter", 1, NULL);
    return NULL;
}

/* The behaviour every store shares; a and b are two handles on the same keys. */
static void exercise(ts_store *a, ts_store *b) {
    ts_store_set_timeout(a, 10);
    ts_store_set_timeout(b, 10);
    /* set, get, overwrite, empty and binary values */
    CHECK_OK(ts_store_set(a, "k1", "hello", 5));
    CHECK(value_is(b, "k1", "hello"));
    CHECK_OK(ts_store_set(b, "k1", "bye", 3));
    CHECK(value_is(a, "k1", "bye"));
    CHECK_OK(ts_store_set(a, "empty", NULL, 0));
    CHECK(value_is(b, "empty", ""));
    const char bin[5] = {1, 0, 2, 0, 3};
    CHECK_OK(ts_store_set(a, "bin", bin, sizeof bin));
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(ts_store_get(b, "bin", &v, &n));
    CHECK(n == 5 && v && memcmp(v, bin, 5) == 0 && ((char *)v)[5] == 0);
    free(v);
    /* check */
    bool ex = false;
    CHECK_OK(ts_store_check(b, "k1", &ex));
    CHECK(ex);
    CHECK_OK(ts_store_check(b, "never-set", &ex));
    CHECK(!ex);
    /* get waits for a set made later by another thread */
    getter g = {b, "late", TS_ERR_INTERNAL, "", NULL, 0};
    pthread_t th;
    pthread_create(&th, NULL, getter_main, &g);
    ts__sleep_s(0.05);
    CHECK_OK(ts_store_set(a, "late", "now", 3));
    pthread_join(th, NULL);
    CHECK(g.st == TS_OK && g.len == 3 && g.value && memcmp(g.value, "now", 4) == 0);
    if (g.st != TS_OK) fprintf(stderr, "late get: %s\n", g.err);
    free(g.value);
    /* add from many threads: an exact total */
    adder ad[4];
    pthread_t at[4];
    for (int i = 0; i < 4; i++) {
        ad[i] = (adder){i % 2 ? a : b, 50, TS_OK};
        pthread_create(&at[i], NULL, adder_main, &ad[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(at[i], NULL);
        CHECK(ad[i].st == TS_OK);
    }
    int64_t total = -1;
    CHECK_OK(ts_store_add(a, "counter", 0, &total));
    CHECK(total == 200);
    CHECK(value_is(b, "counter", "200"));
    CHECK_OK(ts_store_add(b, "counter", -250, &total));
    CHECK(total == -50);
    CHECK_STATUS(ts_store_add(a, "k1", 1, &total), TS_ERR_INVALID_ARG); /* "bye" is no counter */
    CHECK_ERR_MENTIONS("k1");
    /* wait */
    const char *keys[2] = {"k1", "late"};
    CHECK_OK(ts_store_wait(b, keys, 2, -1));
    /* timeouts name the key and come back quickly */
    ts_store_set_timeout(b, 0.2);
    double t0 = ts_time_now();
    CHECK_STATUS(ts_store_get(b, "missing-key", &v, &n), TS_ERR_TIMEOUT);
    CHECK_ERR_MENTIONS("missing-key");
    const char *wk[3] = {"k1", "missing-two", "late"};
    CHECK_STATUS(ts_store_wait(b, wk, 3, -1), TS_ERR_TIMEOUT);
    CHECK_ERR_MENTIONS("missing-two");
    CHECK_STATUS(ts_store_wait(a, wk + 1, 1, 0.1), TS_ERR_TIMEOUT);
    CHECK_ERR_MENTIONS("missing-two");
    CHECK(ts_time_now() - t0 < 5.0);
    ts_store_set_timeout(b, 10);
    /* the store still works after timeouts */
    CHECK(value_is(b, "k1", "bye"));
    /* argument errors */
    CHECK_STATUS(ts_store_set(a, NULL, "x", 1), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_store_wait(a, NULL, 1, -1), TS_ERR_INVALID_ARG);
    CHECK_OK(ts_store_wait(a, NULL, 0, -1));
}

/* ---- memory and prefix stores ----------------------------------------------------------------------- */

static void test_memory_store(void) {
    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    exercise(m, m);
    ts_store_release(m);
}

static void test_prefix_store(void) {
    ts_store *m = NULL, *p1 = NULL, *p1b = NULL, *p2 = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    CHECK_OK(ts_store_prefix_new(m, "g1", &p1));
    CHECK_OK(ts_store_prefix_new(m, "g1", &p1b));
    CHECK_OK(ts_store_prefix_new(m, "g2", &p2));
    ts_store_release(m); /* the prefix stores keep it alive */
    exercise(p1, p1b);
    bool ex = true;
    CHECK_OK(ts_store_check(p2, "k1", &ex));
    CHECK(!ex); /* isolated */
    CHECK_OK(ts_store_set(p2, "k1", "other", 5));
    CHECK(value_is(p1, "k1", "bye"));
    CHECK(value_is(p2, "k1", "other"));
    ts_store *root = NULL;
    CHECK_OK(ts_store_prefix_new(p2, "sub", &root)); /* nested: "g2/sub/x" */
    CHECK_OK(ts_store_set(root, "x", "1", 1));
    CHECK(value_is(p2, "sub/x", "1"));
    CHECK(ts_store_tcp_port(p1) == -1); /* not a TCP store */
    ts_store_release(root);
    ts_store_release(p1);
    ts_store_release(p1b);
    ts_store_release(p2);
}

/* ---- file store ----------------------------------------------------------------------------------- */

static void test_file_store(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/store1", tu_tmpdir());
    ts_store *a = NULL, *b = NULL;
    CHECK_OK(ts_store_file_new(path, 10, &a));
    CHECK_OK(ts_store_file_new(path, 10, &b));
    exercise(a, b);
    ts_store_release(a);
    ts_store_release(b);
    /* reopening sees the keys */
    CHECK_OK(ts_store_file_new(path, 10, &a));
    CHECK(value_is(a, "counter", "-50"));
    ts_store_release(a);
    /* not a store file */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/not_a_store", tu_tmpdir());
    FILE *f = fopen(bad, "w");
    fputs("hello world, this is not a store\n", f);
    fclose(f);
    CHECK_STATUS(ts_store_file_new(bad, 1, &a), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS(bad);
    CHECK_STATUS(ts_store_file_new("/nonexistent-dir/x/store", 1, &a), TS_ERR_IO);
    CHECK_ERR_MENTIONS("/nonexistent-dir/x/store");
}

static void test_file_store_fork(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/store_fork", tu_tmpdir());
    ts_store *a = NULL;
    CHECK_OK(ts_store_file_new(path, 10, &a));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ts_store *c = NULL;
        int ok = ts_store_file_new(path, 10, &c) == TS_OK;
        ok = ok && ts_store_set(c, "child", "hi", 2) == TS_OK;
        ok = ok && value_is(c, "parent", "hello");
        for (int i = 0; i < 100 && ok; i++) ok = ts_store_add(c, "n", 1, NULL) == TS_OK;
        ts_store_release(c);
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0);
    ts__sleep_s(0.02);
    CHECK_OK(ts_store_set(a, "parent", "hello", 5));
    for (int i = 0; i < 100; i++) CHECK_OK(ts_store_add(a, "n", 1, NULL));
    CHECK(value_is(a, "child", "hi"));
    CHECK(wait_child(pid, 15) == 0);
    CHECK(value_is(a, "n", "200"));
    ts_store_release(a);
}

/* ---- TCP store ------------------------------------------------------------------------------------ */

static void test_tcp_store(void) {
    ts_store *srv = NULL, *cli = NULL;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 10, &srv));
    if (!srv) return;
    int port = ts_store_tcp_port(srv);
    CHECK(port > 0);
    CHECK_OK(ts_store_tcp_new("127.0.0.1", port, false, 10, &cli));
    CHECK(ts_store_tcp_port(cli) == port);
    exercise(srv, cli);
    /* several client stores in threads */
    ts_store *clients[4] = {0};
    adder ad[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK_OK(ts_store_tcp_new("127.0.0.1", port, false, 10, &clients[i]));
    for (int i = 0; i < 4; i++) {
        ad[i] = (adder){clients[i], 100, TS_OK};
        pthread_create(&th[i], NULL, adder_main, &ad[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(ad[i].st == TS_OK);
        ts_store_release(clients[i]);
    }
    CHECK(value_is(cli, "counter", "350"));
    /* a big value */
    size_t big = 3u << 20;
    char *buf = malloc(big);
    for (size_t i = 0; i < big; i++) buf[i] = (char)(i * 7);
    CHECK_OK(ts_store_set(cli, "big", buf, big));
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(ts_store_get(srv, "big", &v, &n));
    CHECK(n == big && v && memcmp(v, buf, big) == 0);
    free(v);
    free(buf);
    /* host names resolve (localhost may be ::1 first: the client tries each address) */
    ts_store *byname = NULL;
    CHECK_OK(ts_store_tcp_new("localhost", port, false, 5, &byname));
    if (byname) CHECK(value_is(byname, "k1", "bye"));
    ts_store_release(byname);
    ts_store_release(cli);
    ts_store_release(srv);
    CHECK_STATUS(ts_store_tcp_new("127.0.0.1", 0, false, 1, &cli), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_store_tcp_new("127.0.0.1", 70000, true, 1, &cli), TS_ERR_INVALID_ARG);
}

static void test_tcp_ipv6(void) {
    ts_store *srv = NULL, *cli = NULL;
    if (ts_store_tcp_new("::1", 0, true, 5, &srv) != TS_OK) {
        fprintf(stderr, "  (no IPv6 loopback here: %s)\n", ts_last_error());
        return;
    }
    CHECK_OK(ts_store_tcp_new("::1", ts_store_tcp_port(srv), false, 5, &cli));
    CHECK_OK(ts_store_set(srv, "six", "6", 1));
    if (cli) CHECK(value_is(cli, "six", "6"));
    ts_store_release(cli);
    ts_store_release(srv);
}

static void test_tcp_fork(void) {
    ts_store *srv = NULL;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 10, &srv));
    if (!srv) return;
    int port = ts_store_tcp_port(srv);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ts_store *c = NULL;
        int ok = ts_store_tcp_new("127.0.0.1", port, false, 10, &c) == TS_OK;
        ok = ok && ts_store_set(c, "child", "hi", 2) == TS_OK;
        ok = ok && value_is(c, "parent", "hello");
        int64_t r = 0;
        ok = ok && ts_store_add(c, "n", 5, &r) == TS_OK;
        const char *k = "parent-done";
        ok = ok && ts_store_wait(c, &k, 1, -1) == TS_OK;
        ts_store_release(c);
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0);
    ts__sleep_s(0.05);
    CHECK_OK(ts_store_set(srv, "parent", "hello", 5));
    CHECK(value_is(srv, "child", "hi"));
    CHECK_OK(ts_store_set(srv, "parent-done", "", 0));
    CHECK(wait_child(pid, 15) == 0);
    CHECK(value_is(srv, "n", "5"));
    ts_store_release(srv);
}

static void test_tcp_port_in_use(void) {
    ts_store *a = NULL, *b = NULL;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 5, &a));
    if (!a) return;
    int port = ts_store_tcp_port(a);
    CHECK_STATUS(ts_store_tcp_new("127.0.0.1", port, true, 5, &b), TS_ERR_IO);
    CHECK(b == NULL);
    char want[64];
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d", port);
    CHECK_ERR_MENTIONS(want);
    CHECK_ERR_MENTIONS("Address already in use");
    ts_store_release(a);
}

/* A port held for a moment longer (the last attempt's server, still dying) is tried again: the store
 * comes up once it is free. */
static void *release_after(void *arg) {
    nanosleep(&(struct timespec){0, 600 * 1000 * 1000}, NULL);
    close(*(int *)arg);
    return NULL;
}

static void test_tcp_port_freed_soon(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 4) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    int port = ntohs(sa.sin_port);
    pthread_t th;
    pthread_create(&th, NULL, release_after, &fd);
    ts_store *s = NULL;
    double t0 = ts_time_now();
    CHECK_OK(ts_store_tcp_new("127.0.0.1", port, true, 5, &s));
    double took = ts_time_now() - t0;
    CHECK(took >= 0.5 && took < 4.5);
    pthread_join(th, NULL);
    if (s) CHECK_OK(ts_store_set(s, "k", "v", 1));
    ts_store_release(s);
}

static void test_tcp_no_server(void) {
    int port = free_port();
    ts_store *c = NULL;
    double t0 = ts_time_now();
    CHECK_STATUS(ts_store_tcp_new("127.0.0.1", port, false, 0.5, &c), TS_ERR_TIMEOUT);
    CHECK(ts_time_now() - t0 < 5);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    CHECK_ERR_MENTIONS(want);
    CHECK_ERR_MENTIONS("0.5");
    CHECK(c == NULL);
}

static void test_tcp_server_gone(void) {
    ts_store *srv = NULL, *cli = NULL;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 10, &srv));
    if (!srv) return;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", ts_store_tcp_port(srv), false, 10, &cli));
    if (!cli) return;
    getter g = {cli, "never", TS_OK, "", NULL, 0};
    pthread_t th;
    pthread_create(&th, NULL, getter_main, &g);
    ts__sleep_s(0.2);
    double t0 = ts_time_now();
    ts_store_release(srv); /* the server thread stops; the waiting client must not hang */
    pthread_join(th, NULL);
    CHECK(ts_time_now() - t0 < 5);
    CHECK(g.st == TS_ERR_REMOTE);
    CHECK(strstr(g.err, "closed") != NULL);
    free(g.value);
    /* later calls fail fast too */
    CHECK_STATUS(ts_store_set(cli, "x", "1", 1), TS_ERR_REMOTE);
    ts_store_release(cli);
}

/* ---- launch environment ---------------------------------------------------------------------------- */

static const char *env_names[] = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                  "SLURM_PROCID",
                                  "SLURM_NTASKS",
                                  "SLURM_LOCALID",
                                  "SLURM_NTASKS_PER_NODE",
                                  "SLURM_TASKS_PER_NODE",
                                  "SLURM_STEP_ID",
                                  "TORCHELASTIC_RUN_ID",
                                  "TS_DIST_TIMEOUT"};

static void env_clear(void) {
    for (size_t i = 0; i < sizeof env_names / sizeof env_names[0]; i++) unsetenv(env_names[i]);
}

static void test_env(void) {
    env_clear();
    ts_dist_env e;
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("RANK");
    /* torchrun */
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "node0.example", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("TORCHELASTIC_RUN_ID", "none", 1);
    setenv("OMPI_COMM_WORLD_RANK", "7", 1); /* ignored: torchrun names come first (test_launch_env.c has more) */
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.rank == 3 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 2);
    CHECK(strcmp(e.master_addr, "node0.example") == 0 && e.master_port == 29500);
    CHECK(strcmp(e.source, "torchrun") == 0);
    /* errors name the variable and the value */
    setenv("RANK", "abc", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("RANK");
    CHECK_ERR_MENTIONS("abc");
    setenv("RANK", "8", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("RANK=8");
    CHECK_ERR_MENTIONS("WORLD_SIZE=8");
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "99999999999999", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("WORLD_SIZE='99999999999999'");
    setenv("WORLD_SIZE", "0", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("WORLD_SIZE='0'");
    unsetenv("WORLD_SIZE");
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("WORLD_SIZE");
    setenv("WORLD_SIZE", "8", 1);
    setenv("MASTER_PORT", "70000", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("MASTER_PORT='70000'");
    setenv("MASTER_PORT", "29x", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("MASTER_PORT='29x'");
    unsetenv("MASTER_PORT");
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.master_port == 0);
    setenv("LOCAL_RANK", "2", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("LOCAL_RANK=2");
    CHECK_ERR_MENTIONS("LOCAL_WORLD_SIZE=2");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.local_rank == -1 && e.local_world_size == -1); /* unknown: derived at rendezvous */
    /* mpirun */
    env_clear();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    setenv("SLURM_PROCID", "0", 1); /* ignored: mpirun comes before srun */
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("MASTER_ADDR");
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "1234", 1);
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.rank == 5 && e.world_size == 6 && e.local_rank == 2 && e.local_world_size == 3);
    CHECK(strcmp(e.source, "mpirun") == 0 && strcmp(e.master_addr, "10.0.0.1") == 0 && e.master_port == 1234);
    setenv("OMPI_COMM_WORLD_SIZE", "-6", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("OMPI_COMM_WORLD_SIZE='-6'");
    /* srun */
    env_clear();
    setenv("SLURM_PROCID", "4", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_NTASKS", "6", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NTASKS_PER_NODE", "2(x3)", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.rank == 4 && e.world_size == 6 && e.local_rank == 0 && e.local_world_size == 2);
    CHECK(strcmp(e.source, "srun") == 0 && e.master_port == 0);
    setenv("SLURM_NTASKS_PER_NODE", "(x3)", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("SLURM_NTASKS_PER_NODE='(x3)'");
    unsetenv("SLURM_NTASKS_PER_NODE");
    setenv("SLURM_TASKS_PER_NODE", "3(x2)", 1);
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(e.local_world_size == 3);
    setenv("SLURM_PROCID", "6", 1);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("SLURM_PROCID=6");
    CHECK_ERR_MENTIONS("SLURM_NTASKS=6");
    env_clear();
}

/* ---- rendezvous -------------------------------------------------------------------------------------- */

typedef struct rdv {
    ts_pg_options o;
    ts_status st;
    char err[512];
    ts_store *store;
    int rank, world, lrank, lworld;
    double timeout;
} rdv;

static void *rdv_main(void *arg) {
    rdv *r = arg;
    r->st = ts__rendezvous(&r->o, &r->store, &r->rank, &r->world, &r->lrank, &r->lworld, &r->timeout);
    snprintf(r->err, sizeof r->err, "%s", ts_last_error());
    return NULL;
}

/* r reset to rank `rank` of `world` on store (NULL: the options' init_method) with a timeout; the caller
 * adds what else the case needs. */
static void rdv_init(rdv *r, ts_store *store, int rank, int world, double timeout_s) {
    memset(r, 0, sizeof *r);
    r->o = TS_PG_OPTIONS_INIT;
    r->o.store = store;
    r->o.rank = rank;
    r->o.world_size = world;
    r->o.timeout_s = timeout_s;
}

/* Runs n ranks as threads with options built by the caller; returns after all finish. */
static void rdv_threads(rdv *r, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, rdv_main, &r[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void test_rendezvous_memory(void) {
    env_clear();
    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    rdv r[4];
    for (int i = 0; i < 4; i++) {
        rdv_init(&r[i], m, i, 4, 10);
    }
    rdv_threads(r, 4);
    for (int i = 0; i < 4; i++) {
        CHECK(r[i].st == TS_OK);
        if (r[i].st != TS_OK) fprintf(stderr, "rank %d: %s\n", i, r[i].err);
        CHECK(r[i].rank == i && r[i].world == 4 && r[i].lrank == i && r[i].lworld == 4 && r[i].timeout == 10);
        /* the returned store is prefixed with the group name */
        if (r[i].store) CHECK_OK(ts_store_set(r[i].store, "after", "1", 1));
        ts_store_release(r[i].store);
    }
    CHECK(value_is(m, "default/joined", "4"));
    CHECK(value_is(m, "default/after", "1"));
    /* joining the same group again with the same rank is detected */
    rdv again;
    memset(&again, 0, sizeof again);
    again.o = r[0].o;
    rdv_main(&again);
    CHECK(again.st == TS_ERR_STATE && strstr(again.err, "twice"));
    /* a rank that never comes: timeout naming how many arrived and who is missing */
    for (int i = 0; i < 2; i++) {
        rdv_init(&r[i], m, i, 3, 0.3);
        r[i].o.group_name = "partial";
        r[i].o.local_rank = i; /* given: not derived */
        r[i].o.local_world_size = 2;
    }
    rdv_threads(r, 2);
    for (int i = 0; i < 2; i++) {
        CHECK(r[i].st == TS_ERR_TIMEOUT && r[i].store == NULL);
        CHECK(strstr(r[i].err, "2 of 3 ranks") && strstr(r[i].err, "missing ranks: 2") &&
              strstr(r[i].err, "partial"));
        if (!strstr(r[i].err, "missing ranks: 2")) fprintf(stderr, "got: %s\n", r[i].err);
    }
    ts_store_release(m);
}

/* A restarted attempt's rank that finds its earlier self in the round: the round is void (its members
 * learn it through "failed"), and the rank waits for the round's store to go — here a TCP server
 * released 0.6 s in — rather than failing at once, so that its launcher's next attempt meets a new
 * store. Without a restart it fails at once, as before. Members waiting for heartbeat addresses see
 * the verdict at once, not at the store's timeout. */
static void *release_server_soon(void *arg) {
    nanosleep(&(struct timespec){0, 600 * 1000 * 1000}, NULL);
    ts_store_release(arg);
    return NULL;
}

static void test_rendezvous_void_round(void) {
    env_clear();
    ts_store *srv = NULL, *cli = NULL;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 10, &srv));
    if (!srv) return;
    CHECK_OK(ts_store_tcp_new("127.0.0.1", ts_store_tcp_port(srv), false, 10, &cli));
    CHECK_OK(ts_store_set(srv, "default/rank/1/joined", "1", 1)); /* the earlier self */
    rdv r;
    rdv_init(&r, cli, 1, 2, 10);
    r.o.heartbeat_timeout_s = 0;
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    pthread_t th;
    pthread_create(&th, NULL, release_server_soon, srv);
    double t0 = ts_time_now();
    rdv_main(&r);
    double took = ts_time_now() - t0;
    pthread_join(th, NULL);
    CHECK(r.st == TS_ERR_STATE && strstr(r.err, "rank 1 joined twice (this is a restarted attempt"));
    CHECK(took >= 0.5 && took < 6);
    ts_store_release(cli);
    unsetenv("TORCHELASTIC_RESTART_COUNT");

    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    CHECK_OK(ts_store_set(m, "default/rank/1/joined", "1", 1));
    rdv_init(&r, m, 1, 2, 10);
    t0 = ts_time_now();
    rdv_main(&r);
    CHECK(r.st == TS_ERR_STATE && strstr(r.err, "two processes with the same rank") && ts_time_now() - t0 < 2);
    ts_store_release(m);
}

static void test_heartbeat_addresses_see_failed(void) {
    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    ts__heartbeat *hb = NULL;
    CHECK_OK(ts__heartbeat_new(0, 2, 2.0, NULL, NULL, NULL, &hb));
    if (!hb) return;
    const char *why = "rank 1 joined twice (this is a restarted attempt ...)";
    CHECK_OK(ts_store_set(m, "failed", why, strlen(why)));
    double t0 = ts_time_now();
    CHECK_STATUS(ts__heartbeat_peers_from_store(hb, m), TS_ERR_REMOTE); /* rank 1's address never comes */
    CHECK(ts_time_now() - t0 < 3);
    CHECK_ERR_MENTIONS("waiting for rank 1's heartbeat address: the round failed: rank 1 joined twice");
    ts__heartbeat_stop(hb);
    ts_store_release(m);
}

static void test_rendezvous_options(void) {
    env_clear();
    ts_store *s = NULL;
    int a, b, c, d;
    double t;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.magic = 0;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("magic");
    o = TS_PG_OPTIONS_INIT;
    o.size = 8;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("size");
    o = TS_PG_OPTIONS_INIT;
    o.version = 9;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("version");
    o = TS_PG_OPTIONS_INIT;
    o.rank = 4;
    o.world_size = 4;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("rank");
    o = TS_PG_OPTIONS_INIT;
    o.init_method = "carrier-pigeon://coop:1";
    o.rank = 0;
    o.world_size = 1;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("carrier-pigeon://");
    o.init_method = "tcp://nohostport";
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("tcp://nohostport");
    o = TS_PG_OPTIONS_INIT; /* env:// with nothing set */
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("RANK");
    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    o.store = m;
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("rank");
    /* timeout: options, else TS_DIST_TIMEOUT, else the default */
    o.rank = 0;
    o.world_size = 1;
    o.group_name = "t1";
    CHECK_OK(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t));
    CHECK(t == TS_DIST_DEFAULT_TIMEOUT_S && a == 0 && b == 1 && c == 0 && d == 1);
    ts_store_release(s);
    setenv("TS_DIST_TIMEOUT", "2.5", 1);
    o.group_name = "t2";
    CHECK_OK(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t));
    CHECK(t == 2.5);
    ts_store_release(s);
    setenv("TS_DIST_TIMEOUT", "soon", 1);
    o.group_name = "t3";
    CHECK_STATUS(ts__rendezvous(&o, &s, &a, &b, &c, &d, &t), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_DIST_TIMEOUT='soon'");
    unsetenv("TS_DIST_TIMEOUT");
    ts_store_release(m);
}

static void test_rendezvous_file_and_tcp(void) {
    env_clear();
    char im[600];
    snprintf(im, sizeof im, "file://%s/rdv", tu_tmpdir());
    char tcp[64];
    snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", free_port());
    const char *methods[2] = {im, tcp};
    for (int m = 0; m < 2; m++) {
        rdv r[3];
        for (int i = 0; i < 3; i++) {
            rdv_init(&r[i], NULL, i, 3, 10);
            r[i].o.init_method = methods[m];
        }
        rdv_threads(r, 3);
        for (int i = 0; i < 3; i++) {
            CHECK(r[i].st == TS_OK && r[i].rank == i && r[i].world == 3 && r[i].lrank == i && r[i].lworld == 3);
            if (r[i].st != TS_OK) fprintf(stderr, "%s rank %d: %s\n", methods[m], i, r[i].err);
        }
        for (int i = 2; i >= 0; i--) ts_store_release(r[i].store); /* rank 0 (the server) last */
    }
}

static void test_rendezvous_env_fork(void) {
    env_clear();
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("TS_DIST_TIMEOUT", "15", 1);
    fflush(NULL);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            setenv("RANK", r == 0 ? "0" : "1", 1);
            ts_store *s = NULL;
            int rank = -1, world = -1, lr = -1, lw = -1;
            double t = 0;
            ts_status st = ts__rendezvous(NULL, &s, &rank, &world, &lr, &lw, &t);
            int ok = st == TS_OK && rank == r && world == 2 && lr == r && lw == 2 && t == 15;
            if (st != TS_OK) fprintf(stderr, "rank %d: %s\n", r, ts_last_error());
            /* rank 1 tells rank 0 (the server) it is done; rank 0 waits for that */
            if (ok && r == 1) ok = ts_store_set(s, "rank1-done", "1", 1) == TS_OK;
            const char *k = "rank1-done";
            if (ok && r == 0) ok = ts_store_wait(s, &k, 1, -1) == TS_OK;
            ts_store_release(s);
            _exit(ok ? 0 : 1);
        }
    }
    for (int r = 0; r < 2; r++) CHECK(pids[r] > 0 && wait_child(pids[r], 18) == 0);
    env_clear();
}

/* Ranks that disagree on the world size fail together, at once, naming both values and ranks. */
static void test_rendezvous_world_disagreement(void) {
    env_clear();
    ts_store *m = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    rdv r[2];
    for (int i = 0; i < 2; i++) {
        rdv_init(&r[i], m, i, i == 0 ? 3 : 2, 120);
        r[i].o.group_name = "disagree";
    }
    double t0 = ts_time_now();
    rdv_threads(r, 2);
    double dt = ts_time_now() - t0;
    fprintf(stderr, "  WORLD_SIZE 3 against 2: both ranks failed after %.2f s (timeout 120 s)\n", dt);
    for (int i = 0; i < 2; i++) {
        CHECK(r[i].st != TS_OK && r[i].store == NULL);
        CHECK(strstr(r[i].err, "disagree on the world size") && strstr(r[i].err, "WORLD_SIZE=3") &&
              strstr(r[i].err, "WORLD_SIZE=2") && strstr(r[i].err, "rank 0") && strstr(r[i].err, "rank 1"));
        if (!strstr(r[i].err, "WORLD_SIZE=3")) fprintf(stderr, "rank %d: %s\n", i, r[i].err);
    }
    CHECK(dt < 30);
    ts_store_release(m);
}

/* A rank that joined and then went silent (stopped, dead) ends everyone's wait within about the
 * heartbeat timeout, naming it; the long rendezvous timeout is only for ranks that never came. */
static void test_rendezvous_silent_rank(void) {
    env_clear();
    ts_store *m = NULL, *p = NULL;
    CHECK_OK(ts_store_memory_new(&m));
    CHECK_OK(ts_store_prefix_new(m, "silent", &p));
    /* rank 2 joins as a rank does, then never beats: what a SIGSTOP right after joining looks like */
    int64_t n = 0;
    CHECK_OK(ts_store_add(p, "rank/2/joined", 1, &n));
    CHECK_OK(ts_store_set(p, "rank/2/host", "h2", 2));
    CHECK_OK(ts_store_set(p, "rank/2/world", "4", 1));
    CHECK_OK(ts_store_add(p, "joined", 1, &n));
    CHECK_OK(ts_store_set(p, "slot/1", "2", 1));
    rdv r[2];
    for (int i = 0; i < 2; i++) {
        rdv_init(&r[i], m, i, 4, 300); /* rank 3 never comes */
        r[i].o.heartbeat_timeout_s = 1;
        r[i].o.group_name = "silent";
    }
    double t0 = ts_time_now();
    rdv_threads(r, 2);
    double dt = ts_time_now() - t0;
    fprintf(stderr, "  a rank silent after joining: the others failed after %.2f s (heartbeat timeout 1 s)\n", dt);
    for (int i = 0; i < 2; i++) {
        CHECK(r[i].st != TS_OK && strstr(r[i].err, "rank 2 (host h2) joined and then went silent"));
        if (!strstr(r[i].err, "rank 2 (host h2)")) fprintf(stderr, "rank %d: %s\n", i, r[i].err);
    }
    CHECK(dt < 30);
    ts_store_release(p);
    ts_store_release(m);
}

/* The timeout report costs O(arrivals), not O(world size): one rank of a million over TCP. An absurd
 * world size is refused at once, naming the limit. */
static void test_rendezvous_huge_world(void) {
    env_clear();
    ts_store *srv = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 30, NULL, &srv));
    if (!srv) return;
    rdv r;
    rdv_init(&r, srv, 5, 1000000, 1);
    r.o.local_rank = 0;
    r.o.local_world_size = 1;
    double t0 = ts_time_now();
    rdv_main(&r);
    double dt = ts_time_now() - t0;
    fprintf(stderr, "  1 of 1,000,000 ranks, --timeout 1: reported after %.2f s: %s\n", dt, r.err);
    CHECK(r.st == TS_ERR_TIMEOUT);
    CHECK(strstr(r.err, "1 of 1,000,000 ranks arrived") &&
          strstr(r.err, "missing ranks: 0, 1, 2, 3, 4, 6, 7,") && strstr(r.err, "and 999,983 more"));
    CHECK(dt < 10);
    r.o.world_size = 1000000000;
    r.o.group_name = "absurd";
    t0 = ts_time_now();
    rdv_main(&r);
    CHECK(r.st == TS_ERR_INVALID_ARG && strstr(r.err, "world size 1000000000") &&
          strstr(r.err, "over the limit of 1048576 ranks"));
    CHECK(ts_time_now() - t0 < 5);
    ts_store_release(srv);
}

/* ---- nothing left behind ---------------------------------------------------------------------------- */

#include <dirent.h>

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int fds_at_start, threads_at_start;

static void test_no_leaked_fds_or_threads(void) {
    CHECK(count_entries("/proc/self/fd") == fds_at_start);
    CHECK(count_entries("/proc/self/task") == threads_at_start);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_DFL); /* the store must not need SIGPIPE ignored */
    fds_at_start = count_entries("/proc/self/fd");
    threads_at_start = count_entries("/proc/self/task");
    static const tu_test tests[] = {
        T(test_memory_store),  T(test_prefix_store),      T(test_file_store),
        T(test_file_store_fork), T(test_tcp_store),       T(test_tcp_ipv6),
        T(test_tcp_fork),      T(test_tcp_port_in_use),   T(test_tcp_port_freed_soon), T(test_tcp_no_server),
        T(test_tcp_server_gone), T(test_env),             T(test_rendezvous_memory), T(test_rendezvous_void_round), T(test_heartbeat_addresses_see_failed),
        T(test_rendezvous_options), T(test_rendezvous_file_and_tcp), T(test_rendezvous_env_fork),
        T(test_rendezvous_world_disagreement), T(test_rendezvous_silent_rank), T(test_rendezvous_huge_world),
        T(test_no_leaked_fds_or_threads),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
