/*
 * tests/test_trace.c — the timeline recorder (src/core/timeline.c) and the
 * trainer's --trace / --metrics-csv (src/train/trainer.c): events from two
 * threads, the cap (dropped and counted), one recorder per process owned by
 * its thread, the rank file names, and the files a run writes — parsed back by
 * a strict JSON checker here and, when a Python is found
 * (tests/find_python.sh), by Python's json module: plain, DDP on ranks as
 * threads (only the tracing rank's spans; bucket all-reduces with bytes) and
 * the pipeline strategy (stage lanes).
 */
#include "test_util.h"
#include "rank_threads.h"
#include "train_fixtures.h"

#include "core/timeline.h"

#include <pthread.h>
#include <unistd.h>

/* ---- a strict JSON syntax check (RFC 8259), enough to say a file is one JSON value ------------------ */
typedef struct jc {
    const char *p;
    size_t i, n;
} jc;

static void jc_ws(jc *c) {
    while (c->i < c->n && strchr(" \t\r\n", c->p[c->i]) && c->p[c->i]) c->i++;
}

static bool jc_value(jc *c, int depth);

static bool jc_string(jc *c) {
    if (c->i >= c->n || c->p[c->i] != '"') return false;
    for (c->i++; c->i < c->n && c->p[c->i] != '"'; c->i++) {
        if ((unsigned char)c->p[c->i] < 0x20) return false;
        if (c->p[c->i] == '\\') {
            c->i++;
            if (c->i >= c->n || !strchr("\"\\/bfnrtu", c->p[c->i]) || !c->p[c->i]) return false;
            if (c->p[c->i] == 'u') c->i += 4;
        }
    }
    if (c->i >= c->n) return false;
    c->i++;
    return true;
}

static bool jc_digits(jc *c) {
    size_t s = c->i;
    while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9') c->i++;
    return c->i > s;
}

static bool jc_value(jc *c, int depth) {
    if (depth > 64) return false;
    jc_ws(c);
    if (c->i >= c->n) return false;
    char ch = c->p[c->i];
    if (ch == '"') return jc_string(c);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->i++;
        jc_ws(c);
        if (c->i < c->n && c->p[c->i] == close) {
            c->i++;
            return true;
        }
        for (;;) {
            jc_ws(c);
            if (ch == '{') {
                if (!jc_string(c)) return false;
                jc_ws(c);
                if (c->i >= c->n || c->p[c->i++] != ':') return false;
            }
            if (!jc_value(c, depth + 1)) return false;
            jc_ws(c);
            if (c->i >= c->n) return false;
            if (c->p[c->i] == ',') {
                c->i++;
                continue;
            }
            return c->p[c->i++] == close;
        }
    }
    for (const char *const *w = (const char *const[]){"true", "false", "null", NULL}; *w; w++)
        if (c->n - c->i >= strlen(*w) && memcmp(c->p + c->i, *w, strlen(*w)) == 0) {
            c->i += strlen(*w);
            return true;
        }
    if (c->p[c->i] == '-') c->i++;
    if (!jc_digits(c)) return false;
    if (c->i < c->n && c->p[c->i] == '.' && (c->i++, !jc_digits(c))) return false;
    if (c->i < c->n && (c->p[c->i] == 'e' || c->p[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->p[c->i] == '+' || c->p[c->i] == '-')) c->i++;
        if (!jc_digits(c)) return false;
    }
    return true;
}

static bool json_valid(const char *text) {
    jc c = {text, 0, strlen(text)};
    if (!jc_value(&c, 0)) return false;
    jc_ws(&c);
    return c.i == c.n;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Events named `name` (complete events: "ph":"X" ... "name":"<name>"). */
static int events_named(const char *s, const char *name) {
    char needle[96];
    snprintf(needle, sizeof needle, "\"name\":\"%s\",\"cat\"", name);
    return count_of(s, needle);
}

/* Python's json module agrees that path is a trace with `events` complete events (skipped without Python). */
static void python_check(const char *path, int events) {
    FILE *f = popen("bash " TS_TEST_DIR "/find_python.sh json 2>/dev/null", "r");
    char py[1024] = "";
    if (!f) return;
    bool found = fgets(py, sizeof py, f) != NULL;
    pclose(f);
    if (!found) {
        fprintf(stderr, "  (no Python: json.load check skipped)\n");
        return;
    }
    py[strcspn(py, "\n")] = '\0';
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "n=sum(e[\"ph\"]==\"X\" for e in d[\"traceEvents\"]); "
             "assert n==int(sys.argv[2]), n; assert d[\"otherData\"][\"wall_clock_zero_us\"]>0' '%s' %d",
             py, path, events);
    CHECK(system(cmd) == 0);
}

static void tmp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "/tmp/ts_test_trace_%d_%s", (int)getpid(), name);
}

/* ---- the recorder ------------------------------------------------------------------------------------ */
static void test_rank_path(void) {
    char b[64];
    CHECK(ts__tl_rank_path("trace.json", 0, 1, b, sizeof b) && strcmp(b, "trace.json") == 0);
    CHECK(ts__tl_rank_path("trace.json", 0, 2, b, sizeof b) && strcmp(b, "trace.rank0.json") == 0);
    CHECK(ts__tl_rank_path("out/t.v1.json", 3, 4, b, sizeof b) && strcmp(b, "out/t.v1.rank3.json") == 0);
    CHECK(ts__tl_rank_path("run.d/trace", 1, 2, b, sizeof b) && strcmp(b, "run.d/trace.rank1") == 0);
    CHECK(ts__tl_rank_path(".trace", 1, 2, b, sizeof b) && strcmp(b, ".trace.rank1") == 0);
    CHECK(!ts__tl_rank_path("a-rather-long-name.json", 12, 16, b, 16));
}

#define PER_THREAD 300

static void *other_thread(void *arg) {
    bool *mine = arg;
    *mine = ts__tl_on(); /* the recorder belongs to the thread that started it */
    ts__tl_lane(TS__TL_COMM, "worker \"two\"");
    for (int i = 0; i < PER_THREAD; i++) {
        double t = ts_time_now();
        ts__tl_event(TS__TL_COMM, "allreduce", t, t + 1e-4, "bucket", i % 3, "bytes", 4096 * i);
        ts__tl_count(TS__TL_ALLREDUCE_S, 0.5);
    }
    return NULL;
}

static void test_two_threads(void) {
    char path[256];
    tmp_path(path, sizeof path, "two.json");
    CHECK(!ts__tl_on() && ts__tl_now() == 0.0);
    ts__tl_event(TS__TL_TRAINER, "lost", 1.0, 2.0, NULL, 0, NULL, 0); /* not recording: ignored */
    CHECK_OK(ts__tl_start(10000));
    CHECK(ts__tl_on() && ts__tl_now() > 0 && ts__tl_events() == 0);
    CHECK_STATUS(ts__tl_start(10), TS_ERR_STATE); /* one recorder per process */
    ts__tl_lane(TS__TL_TRAINER, "trainer");
    pthread_t th;
    bool other_mine = true;
    CHECK(pthread_create(&th, NULL, other_thread, &other_mine) == 0);
    for (int i = 0; i < PER_THREAD; i++) {
        double t0 = ts__tl_now();
        ts__tl_span(TS__TL_TRAINER, "backward", t0);
        ts__tl_count(TS__TL_ALLREDUCE_S, 0.25);
    }
    pthread_join(th, NULL);
    CHECK(!other_mine);
    CHECK(ts__tl_events() == 2 * PER_THREAD && ts__tl_dropped() == 0);
    CHECK_NEAR(ts__tl_take(TS__TL_ALLREDUCE_S), PER_THREAD * 0.75, 1e-9);
    CHECK(ts__tl_take(TS__TL_ALLREDUCE_S) == 0.0);
    CHECK_OK(ts__tl_write(path, 3, 4));
    ts__tl_stop();
    CHECK(!ts__tl_on() && ts__tl_now() == 0.0);
    CHECK_STATUS(ts__tl_write(path, 0, 1), TS_ERR_STATE);
    char *s = read_all(path);
    CHECK(s != NULL);
    if (s) {
        CHECK(json_valid(s));
        CHECK(count_of(s, "\"ph\":\"X\"") == 2 * PER_THREAD);
        CHECK(events_named(s, "backward") == PER_THREAD && events_named(s, "allreduce") == PER_THREAD);
        CHECK(count_of(s, "\"pid\":3,\"tid\":1,\"name\":\"allreduce\"") == PER_THREAD);
        CHECK(strstr(s, "\"args\":{\"bucket\":2,\"bytes\":8192}") != NULL);
        CHECK(strstr(s, "\"name\":\"worker \\\"two\\\"\"") != NULL); /* lane names escaped */
        CHECK(strstr(s, "\"name\":\"rank 3\"") && strstr(s, "\"wall_clock_zero_us\":") &&
              strstr(s, "\"world_size\":4") && strstr(s, "\"dropped_events\":0"));
        CHECK(!strstr(s, "lost"));
        python_check(path, 2 * PER_THREAD);
    }
    free(s);
    unlink(path);
}

static void test_cap_drops(void) {
    char path[256];
    tmp_path(path, sizeof path, "cap.json");
    CHECK_OK(ts__tl_start(10));
    for (int i = 0; i < 25; i++) ts__tl_event(TS__TL_TRAINER, "step", ts_time_now(), ts_time_now(), "step", i, NULL, 0);
    CHECK(ts__tl_events() == 10 && ts__tl_dropped() == 15);
    CHECK_OK(ts__tl_write(path, 0, 1));
    ts__tl_stop();
    char *s = read_all(path);
    CHECK(s && json_valid(s) && events_named(s, "step") == 10);
    CHECK(s && strstr(s, "\"dropped_events\":15") && strstr(s, "15 events dropped"));
    free(s);
    /* counters only (max 0): nothing kept, nothing counted as dropped; an empty trace is still valid */
    CHECK_OK(ts__tl_start(0));
    ts__tl_event(TS__TL_TRAINER, "step", ts_time_now(), ts_time_now(), NULL, 0, NULL, 0);
    CHECK(ts__tl_events() == 0 && ts__tl_dropped() == 0);
    CHECK_OK(ts__tl_write(path, 0, 1));
    ts__tl_stop();
    s = read_all(path);
    CHECK(s && json_valid(s) && count_of(s, "\"ph\":\"X\"") == 0);
    free(s);
    unlink(path);
}

/* ---- the trainer ------------------------------------------------------------------------------------- */
/* The CSV: the header, then `rows` rows of 7 fields with steps 1, 2, ... */
static void check_csv(const char *path, int rows) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[512];
    CHECK(fgets(line, sizeof line, f) &&
          strcmp(line, "step,epoch,loss,lr,images_per_second,data_wait_share,allreduce_seconds\n") == 0);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        long long step, epoch;
        double loss, lr, ips, share, ar;
        CHECK(sscanf(line, "%lld,%lld,%lf,%lf,%lf,%lf,%lf", &step, &epoch, &loss, &lr, &ips, &share, &ar) == 7);
        CHECK(step == n + 1 && epoch >= 1 && isfinite(loss) && lr > 0 && ips > 0 && share >= 0 && share <= 1 &&
              ar >= 0);
        n++;
    }
    CHECK(n == rows);
    fclose(f);
}

static void test_trainer_files(void) {
    char trace[256], csv[256];
    tmp_path(trace, sizeof trace, "run.json");
    tmp_path(csv, sizeof csv, "run.csv");
    ts_dataset *ds = make_dataset(96, 1), *test = make_dataset(32, 2);
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    ts_strategy *s = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt = NULL;
    ts_batch_source *train = NULL, *eval = NULL;
    ts_trainer *t = NULL;
    ts_dataset_source_opts dso = TS_DATASET_SOURCE_OPTS_INIT;
    dso.batch_size = 8;
    CHECK_OK(ts_strategy_new(make_model(4), &so, &s));
    CHECK_OK(ts_module_parameters(ts_strategy_model(s), &params));
    CHECK_OK(ts_optimizer_by_name("sgd", &params, 0.1, 0.9, 0.0, &opt));
    CHECK_OK(ts_batch_source_dataset(ds, &dso, &train));
    dso.shuffle = false;
    CHECK_OK(ts_batch_source_dataset(test, &dso, &eval));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 2;
    to.max_steps = 7;
    to.accum_steps = 2;
    to.eval = eval;
    to.trace_path = trace;
    to.metrics_csv = csv;
    CHECK_OK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result r;
    CHECK_OK(ts_trainer_run(t, &r));
    CHECK(r.steps == 7 && !ts__tl_on());
    char *j = read_all(trace);
    CHECK(j && json_valid(j));
    if (j) {
        /* 12 batches per epoch, 2 per step: 6 steps in epoch 1, one in epoch 2 */
        CHECK(events_named(j, "step") == 7 && events_named(j, "optimizer step") == 7);
        CHECK(events_named(j, "forward") == 14 && events_named(j, "backward") == 14 &&
              events_named(j, "forward_backward") == 14);
        CHECK(events_named(j, "data wait") >= 14 && events_named(j, "evaluate") == 2);
        CHECK(strstr(j, "\"args\":{\"step\":7,\"epoch\":2}") != NULL);
        python_check(trace, count_of(j, "\"ph\":\"X\""));
    }
    free(j);
    check_csv(csv, 7);
    /* a second run of the trainer (past max_steps: it only evaluates) goes on with the same CSV: rows
     * are appended after step 0, the header stays single */
    CHECK_OK(ts_trainer_run(t, &r));
    check_csv(csv, 7);
    /* a metrics file that cannot be written fails the run before it trains; the recorder is free again */
    ts_trainer_free(t);
    to.metrics_csv = "/nonexistent-dir/m.csv";
    to.trace_path = NULL;
    CHECK_OK(ts_trainer_new(s, opt, train, &to, &t));
    CHECK_STATUS(ts_trainer_run(t, &r), TS_ERR_IO);
    CHECK_ERR_MENTIONS("/nonexistent-dir/m.csv");
    CHECK(!ts__tl_on());
    CHECK_OK(ts__tl_start(1));
    ts__tl_stop();
    ts_trainer_free(t);
    ts_batch_source_free(train);
    ts_batch_source_free(eval);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_dataset_free(ds);
    ts_dataset_free(test);
    unlink(trace);
    unlink(csv);
}

/* DDP over two rank threads, rank 0 tracing: its file (".rank0") holds its own spans only, and
 * the buckets' all-reduces on the communication lane with their bytes. */
typedef struct ddp_trace_cfg {
    ts_dataset *ds;
    const char *trace, *csv;
} ddp_trace_cfg;

typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    int64_t steps;
};
TU_RANK_THREADS(rank_ctx, run_ranks)

static ts_status ddp_rank(rank_ctx *c, ts_process_group *pg) {
    const ddp_trace_cfg *cfg = c->arg;
    ts_strategy *s = NULL;
    ts_optimizer *opt = NULL;
    ts_trainer *t = NULL;
    ts_batch_source *train = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_DDP;
    so.pg = pg;
    ts_dataset_source_opts dso = TS_DATASET_SOURCE_OPTS_INIT;
    dso.batch_size = 4;
    dso.rank = c->rank;
    dso.world_size = c->world;
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.max_steps = 6; /* of the 8 batches of an epoch */
    to.trace_path = c->rank == 0 ? cfg->trace : NULL;
    to.metrics_csv = cfg->csv; /* rank 0 writes it */
    ts_train_result r;
    ts_status st;
    TS_CHECK_GOTO_T(ts_strategy_new(make_model(4), &so, &s));
    TS_CHECK_GOTO_T(ts_module_parameters(ts_strategy_model(s), &params));
    TS_CHECK_GOTO_T(ts_optimizer_by_name("sgd", &params, 0.1, 0.9, 0.0, &opt));
    TS_CHECK_GOTO_T(ts_batch_source_dataset(cfg->ds, &dso, &train));
    TS_CHECK_GOTO_T(ts_trainer_new(s, opt, train, &to, &t));
    TS_CHECK_GOTO_T(ts_trainer_run(t, &r));
    c->steps = r.steps;
fail:
    ts_trainer_free(t);
    ts_batch_source_free(train);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    return st;
}

static void test_trainer_ddp(void) {
    char trace[256], rank0[300], csv[256];
    tmp_path(trace, sizeof trace, "ddp.json");
    tmp_path(csv, sizeof csv, "ddp.csv");
    snprintf(rank0, sizeof rank0, "/tmp/ts_test_trace_%d_ddp.rank0.json", (int)getpid());
    ddp_trace_cfg cfg = {make_dataset(64, 5), trace, csv};
    rank_ctx c[2];
    CHECK(run_ranks(2, ddp_rank, &cfg, c));
    CHECK(c[0].steps == 6 && c[1].steps == 6);
    CHECK(access(trace, F_OK) != 0); /* several ranks: the file names carry the rank */
    char *j = read_all(rank0);
    CHECK(j && json_valid(j));
    if (j) {
        CHECK(events_named(j, "backward") == 6 && events_named(j, "step") == 6); /* not rank 1's */
        CHECK(events_named(j, "allreduce wait") == 6);
        /* the MLP's 4 parameters (~1 KB) fit the first bucket: one all-reduce per step */
        CHECK(count_of(j, "\"tid\":1,\"name\":\"allreduce\",\"cat\":\"comm\"") == 6);
        CHECK(strstr(j, "\"args\":{\"bucket\":0,\"bytes\":") != NULL);
        CHECK(strstr(j, "\"world_size\":2") && strstr(j, "\"name\":\"rank 0\""));
        CHECK(strstr(j, "DDP all-reduce (communication thread)") != NULL);
        python_check(rank0, count_of(j, "\"ph\":\"X\""));
    }
    free(j);
    check_csv(csv, 6);
    FILE *f = fopen(csv, "r");
    char line[512];
    double ar_sum = 0;
    for (int i = 0; f && fgets(line, sizeof line, f);)
        if (i++ > 0) ar_sum += atof(strrchr(line, ',') + 1);
    if (f) fclose(f);
    CHECK(ar_sum > 0); /* DDP's all-reduce seconds reach the rows */
    ts_dataset_free(cfg.ds);
    unlink(rank0);
    unlink(csv);
}

/* The pipeline strategy over two virtual CPU devices: each stage's forward and backward of every
 * micro-batch on its own lane. */
static void test_trainer_pipeline(void) {
    char trace[256];
    tmp_path(trace, sizeof trace, "pp.json");
    ts_dataset *ds = make_dataset(48, 6);
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_PIPELINE;
    so.micro_batches = 4;
    ts_strategy *s = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt = NULL;
    ts_batch_source *train = NULL;
    ts_trainer *t = NULL;
    ts_dataset_source_opts dso = TS_DATASET_SOURCE_OPTS_INIT;
    dso.batch_size = 16;
    CHECK_OK(ts_strategy_new(make_model(4), &so, &s));
    CHECK_OK(ts_module_parameters(ts_strategy_model(s), &params));
    CHECK_OK(ts_optimizer_by_name("sgd", &params, 0.1, 0.9, 0.0, &opt));
    CHECK_OK(ts_batch_source_dataset(ds, &dso, &train));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.trace_path = trace;
    CHECK_OK(ts_trainer_new(s, opt, train, &to, &t));
    CHECK_OK(ts_trainer_run(t, NULL));
    char *j = read_all(trace);
    CHECK(j && json_valid(j));
    int stages = ts_strategy_devices(s, NULL, 0);
    CHECK(stages == 2);
    if (j) {
        CHECK(events_named(j, "step") == 3 && events_named(j, "forward_backward") == 3);
        for (int st = 0; st < stages; st++) {
            char needle[96];
            snprintf(needle, sizeof needle, "\"tid\":%d,\"name\":\"forward\",\"cat\":\"device\"", TS__TL_DEVICE + st);
            CHECK(count_of(j, needle) == 3 * 4);
            snprintf(needle, sizeof needle, "\"tid\":%d,\"name\":\"backward\",\"cat\":\"device\"", TS__TL_DEVICE + st);
            CHECK(count_of(j, needle) == 3 * 4);
            snprintf(needle, sizeof needle, "\"micro_batch\":3,\"stage\":%d", st);
            CHECK(strstr(j, needle) != NULL);
        }
        CHECK(strstr(j, "pipeline stage 1 (cpu:1)") != NULL);
        python_check(trace, count_of(j, "\"ph\":\"X\""));
    }
    free(j);
    ts_trainer_free(t);
    ts_batch_source_free(train);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_dataset_free(ds);
    unlink(trace);
}

TU_MAIN(T(test_rank_path), T(test_two_threads), T(test_cap_drops), T(test_trainer_files), T(test_trainer_ddp),
        T(test_trainer_pipeline))
