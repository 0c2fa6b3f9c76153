/* Virtual CPU devices: registry, separate memory, copies with autograd, streams. */
#include "test_util.h"

#include <omp.h>
#include <stdatomic.h>

static ts_device *dev(const char *name) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get(name, &d));
    return d;
}

static void test_names_and_errors(void) {
    CHECK(ts_cpu_device_count() == 3); /* set in main before any virtual device exists */
    ts_device *d0 = dev("cpu:0"), *d2 = dev("cpu:2");
    CHECK(d0 && d2 && d0 != d2 && d0 != ts_device_cpu());
    CHECK(strcmp(ts_device_name(d2), "cpu:2") == 0);
    CHECK(ts_device_type_of(d2) == TS_DEVICE_CPU);
    ts_device *d;
    CHECK_STATUS(ts_device_get("cpu:3", &d), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("3 virtual CPU devices");
    CHECK_STATUS(ts_device_get("cpu:x", &d), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("malformed");
    if (ts_cuda_device_count(NULL, 0) == 0) { /* no GPU here, or no CUDA in the build: the reason is given */
        CHECK_STATUS(ts_device_get("cuda:0", &d), TS_ERR_DEVICE);
        CHECK_ERR_MENTIONS("unknown device 'cuda:0': ");
    }
    CHECK_STATUS(ts_set_cpu_device_count(5), TS_ERR_STATE);
    CHECK_OK(ts_set_cpu_device_count(3)); /* the same count is fine */

    ts_device *list[4];
    int n = 0;
    CHECK_OK(ts_device_list_parse("cpu:1,cpu:0,cpu", list, 4, &n));
    CHECK(n == 3 && list[0] == dev("cpu:1") && list[1] == d0 && list[2] == ts_device_cpu());
    CHECK_STATUS(ts_device_list_parse("cpu:0,cpu:0", list, 4, &n), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("twice");
    CHECK_STATUS(ts_device_list_parse("cpu:0,,cpu:1", list, 4, &n), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_device_list_parse("", list, 4, &n), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_device_list_parse("cpu:0,cpu:7", list, 4, &n), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("cpu:7");
    CHECK_STATUS(ts_device_list_parse("cpu:0,cpu:1,cpu:2", list, 2, &n), TS_ERR_INVALID_ARG);
}

/* Each device has its own pool: memory shows up on the device that holds it, and
 * a copy to another device is a separate buffer with equal values. */
static void test_memory_and_copies(void) {
    ts_device *d0 = dev("cpu:0"), *d1 = dev("cpu:1");
    size_t a0 = ts_device_memory_allocated(d0), a1 = ts_device_memory_allocated(d1);
    int64_t shape[2] = {3, 5};
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_full(d0, 2, shape, 2.5f, &x));
    CHECK(ts_device_memory_allocated(d0) >= a0 + 15 * sizeof(float));
    CHECK(ts_device_memory_allocated(d1) == a1);
    CHECK_OK(ts_to_device(x, d1, &y));
    CHECK(ts_tensor_device(y) == d1);
    CHECK(ts_device_memory_allocated(d1) >= a1 + 15 * sizeof(float));
    CHECK(ts_tensor_data(y) != ts_tensor_data(x));
    CHECK(ts_tensor_item(y, 14) == 2.5);
    ts_tensor_fill_(x, 1.0f);
    CHECK(ts_tensor_item(y, 14) == 2.5); /* a real copy */

    /* ops refuse to mix devices, naming both */
    ts_tensor *z = NULL;
    CHECK_STATUS(ts_add(x, y, &z), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("cpu:1");
    ts_tensor_release(x);
    ts_tensor_release(y);
    CHECK(ts_device_memory_allocated(d0) == a0);
    CHECK(ts_device_memory_allocated(d1) == a1);
}

/* Autograd follows a tensor across devices: the gradient comes back to the source. */
static void test_autograd_across_devices(void) {
    ts_device *d0 = dev("cpu:0"), *d1 = dev("cpu:1");
    int64_t shape[1] = {4};
    float v[4] = {1, -2, 3, 0.5f};
    ts_tensor *x = NULL, *y = NULL, *sq = NULL, *s = NULL;
    CHECK_OK(ts_tensor_from_data(d0, TS_F32, 1, shape, v, &x));
    ts_tensor_set_requires_grad(x, true);
    CHECK_OK(ts_to_device(x, d1, &y));
    CHECK_OK(ts_mul(y, y, &sq));
    CHECK_OK(ts_sum(sq, &s));
    CHECK(ts_tensor_device(s) == d1);
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(x);
    CHECK(g && ts_tensor_device(g) == d0);
    for (int i = 0; g && i < 4; i++) CHECK_NEAR(ts_tensor_item(g, i), 2 * v[i], 1e-6);
    ts_tensor_release(s);
    ts_tensor_release(sq);
    ts_tensor_release(y);
    ts_tensor_release(x);
}

/* A module moved to a virtual device computes what it computes on the CPU. */
static void test_module_to(void) {
    ts_rng r;
    ts_rng_seed(&r, 7);
    ts_module *m = NULL;
    CHECK_OK(ts_nn_linear_new(6, 3, true, &r, &m));
    int64_t shape[2] = {2, 6};
    ts_tensor *x = tu_rand(&r, 2, shape, -1, 1, false), *ref = NULL, *xd = NULL, *out = NULL;
    CHECK_OK(ts_module_forward(m, x, &ref));
    ts_device *d1 = dev("cpu:1");
    CHECK_OK(ts_module_to(m, d1));
    CHECK_OK(ts_to_device(x, d1, &xd));
    CHECK_OK(ts_module_forward(m, xd, &out));
    CHECK(out && ts_tensor_device(out) == d1);
    for (int i = 0; out && i < 6; i++) CHECK(ts_tensor_item(out, i) == ts_tensor_item(ref, i));
    ts_tensor *bad = NULL;
    CHECK_STATUS(ts_module_forward(m, x, &bad), TS_ERR_DEVICE); /* input still on cpu */
    ts_tensor_release(out);
    ts_tensor_release(xd);
    ts_tensor_release(ref);
    ts_tensor_release(x);
    ts_module_free(m);
}

/* ---- streams ------------------------------------------------------------------------------------ */
typedef struct {
    atomic_int *order;
    int *log;
    int id;
    int threads_seen;
} order_arg;

static ts_status log_order(void *p) {
    order_arg *a = p;
    a->log[atomic_fetch_add(a->order, 1)] = a->id;
    a->threads_seen = omp_get_max_threads();
    return TS_OK;
}

static void test_stream_fifo_and_budget(void) {
    ts_device *d0 = dev("cpu:0");
    atomic_int order = 0;
    int log[32];
    order_arg args[16];
    ts_task *tasks[16];
    for (int i = 0; i < 16; i++) {
        args[i] = (order_arg){&order, log, i, 0};
        CHECK_OK(ts_device_submit(d0, log_order, &args[i], &tasks[i]));
    }
    CHECK_OK(ts_device_synchronize(d0));
    CHECK(atomic_load(&order) == 16); /* synchronize waited for all of them */
    for (int i = 0; i < 16; i++) {
        CHECK(log[i] == i);
        CHECK(args[i].threads_seen == ts_cpu_device_threads());
        CHECK_OK(ts_task_wait(tasks[i]));
        ts_task_free(tasks[i]);
    }
    /* "cpu" has no worker: the task runs inline, before submit returns */
    order_arg a = {&order, log, 99, 0};
    ts_task *t = NULL;
    CHECK_OK(ts_device_submit(ts_device_cpu(), log_order, &a, &t));
    CHECK(atomic_load(&order) == 17 && log[16] == 99);
    ts_task_free(t);
}

/* Two tasks that each wait for the other finish only if their devices run
 * at the same time. */
typedef struct {
    atomic_int *flags;
    int me;
} meet_arg;

static ts_status meet(void *p) {
    meet_arg *a = p;
    atomic_store(&a->flags[a->me], 1);
    double t0 = ts_time_now();
    while (!atomic_load(&a->flags[1 - a->me]))
        if (ts_time_now() - t0 > 10) return ts_error(TS_ERR_TIMEOUT, "task %d never met its partner", a->me);
    return TS_OK;
}

static void test_devices_run_concurrently(void) {
    ts_device *devs[2] = {dev("cpu:0"), dev("cpu:1")};
    atomic_int flags[2] = {0, 0};
    meet_arg a0 = {flags, 0}, a1 = {flags, 1};
    void *args[2] = {&a0, &a1};
    CHECK_OK(ts_device_run_parallel(devs, 2, meet, args));
    /* "cpu" runs its task inline: the devices with a worker must be started before it */
    ts_device *mixed[2] = {ts_device_cpu(), dev("cpu:1")};
    atomic_store(&flags[0], 0);
    atomic_store(&flags[1], 0);
    CHECK_OK(ts_device_run_parallel(mixed, 2, meet, args));
}

static ts_status fail_if_odd(void *p) {
    int v = *(int *)p;
    if (v % 2) return ts_error(TS_ERR_SHAPE, "value %d is odd", v);
    return TS_OK;
}

static void test_errors_come_back(void) {
    ts_device *devs[3] = {dev("cpu:0"), dev("cpu:1"), dev("cpu:2")};
    int v[3] = {2, 3, 5};
    void *args[3] = {&v[0], &v[1], &v[2]};
    CHECK_STATUS(ts_device_run_parallel(devs, 3, fail_if_odd, args), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("cpu:1: value 3 is odd"); /* the first failure by index */
    ts_task *t = NULL;
    CHECK_OK(ts_device_submit(devs[2], fail_if_odd, &v[2], &t));
    CHECK_STATUS(ts_task_wait(t), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("value 5 is odd");
    ts_task_free(t);
}

/* A task that submits to its own device and waits runs the inner task inline. */
static ts_status inner(void *p) {
    (*(int *)p)++;
    return TS_OK;
}
typedef struct {
    int count;
    ts_device *d;
} nest_ctx;

static ts_status outer(void *p) {
    nest_ctx *c = p;
    ts_task *t = NULL;
    ts_status st = ts_device_submit(c->d, inner, &c->count, &t);
    if (st != TS_OK) return st;
    st = ts_task_wait(t);
    ts_task_free(t);
    return st;
}

static void test_nested_submit(void) {
    nest_ctx ctx = {0, dev("cpu:1")};
    ts_task *t = NULL;
    CHECK_OK(ts_device_submit(ctx.d, outer, &ctx, &t));
    CHECK_OK(ts_task_wait(t));
    ts_task_free(t);
    CHECK(ctx.count == 1);
}

int main(int argc, char **argv) {
    if (ts_set_cpu_device_count(3) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    static const tu_test tests[] = {T(test_names_and_errors),       T(test_memory_and_copies),
                                    T(test_autograd_across_devices), T(test_module_to),
                                    T(test_stream_fifo_and_budget), T(test_devices_run_concurrently),
                                    T(test_errors_come_back),       T(test_nested_submit)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
