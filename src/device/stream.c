/*
 * device/stream.c — one worker thread per device: the device's stream.
 *
 * A stream is a FIFO of tasks run by one thread that starts on the first
 * submit and lives as long as the process (devices are never destroyed). The
 * worker sets its OpenMP thread budget once (the device's `threads`), so
 * kernels called from tasks use that many threads; two virtual CPU devices on
 * a 2-core machine get one core each and really run at the same time.
 *
 * A task's ts_status and its thread-local error message are stored in the task
 * and handed to the waiter by ts_task_wait. A task that submits to its own
 * device and waits would deadlock; such nested submits run inline instead.
 * Devices without a stream ("cpu") also run tasks inline, in ts_device_submit.
 */
#include "device/device.h"

#include <omp.h>
#include <stdio.h>

struct ts_task {
    ts__stream *s; /* NULL: ran inline */
    ts_task_fn fn;
    void *arg;
    ts_task *next;
    bool done; /* guarded by s->mu */
    ts_status st;
    char msg[TS_ERRMSG_MAX];
};

struct ts__stream {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* tasks queued */
    pthread_cond_t done_cv; /* a task finished */
    ts_task *head, *tail;
    int64_t pending; /* queued + running */
    bool started;
    int threads;
    pthread_t thread;
    char name[32];
};

static _Thread_local ts__stream *ts_current_stream; /* the stream whose worker this thread is */

ts__stream *ts__stream_new(const char *device_name, int threads) {
    ts__stream *s = ts__calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->threads = threads < 1 ? 1 : threads;
    snprintf(s->name, sizeof s->name, "%s", device_name);
    return s;
}

static void run_task(ts_task *t) {
    t->st = t->fn(t->arg);
    if (t->st != TS_OK) snprintf(t->msg, sizeof t->msg, "%s", ts_last_error());
}

static void *worker_main(void *arg) {
    ts__stream *s = arg;
    ts_current_stream = s;
    omp_set_num_threads(s->threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head) pthread_cond_wait(&s->work_cv, &s->mu);
        ts_task *t = s->head;
        s->head = t->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_task(t);
        pthread_mutex_lock(&s->mu);
        t->done = true;
        s->pending--;
        pthread_cond_broadcast(&s->done_cv);
    }
    return NULL; /* not reached: streams live as long as the process */
}

ts_status ts_device_submit(ts_device *d, ts_task_fn fn, void *arg, ts_task **out) {
    TS_ARG(d && fn && out, "ts_device_submit: NULL argument");
    *out = NULL;
    ts_task *t = ts__calloc(1, sizeof *t);
    if (!t) return TS_ERR_NOMEM;
    t->fn = fn;
    t->arg = arg;
    ts__stream *s = d->stream;
    if (!s || s == ts_current_stream) { /* no worker, or nested on our own worker: inline */
        run_task(t);
        t->done = true;
        *out = t;
        return TS_OK;
    }
    pthread_mutex_lock(&s->mu);
    if (!s->started) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&s->thread, &attr, worker_main, s);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            pthread_mutex_unlock(&s->mu);
            free(t);
            return ts_error(TS_ERR_IO, "device %s: cannot start its worker thread (%s)", d->name, strerror(rc));
        }
        s->started = true;
    }
    t->s = s;
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->pending++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    *out = t;
    return TS_OK;
}

ts_status ts_task_wait(ts_task *t) {
    TS_ARG(t, "ts_task_wait: NULL task");
    if (t->s) {
        pthread_mutex_lock(&t->s->mu);
        while (!t->done) pthread_cond_wait(&t->s->done_cv, &t->s->mu);
        pthread_mutex_unlock(&t->s->mu);
    }
    if (t->st != TS_OK) return ts_error(t->st, "%s", t->msg);
    return TS_OK;
}

void ts_task_free(ts_task *t) {
    if (!t) return;
    ts_status st = ts_task_wait(t);
    (void)st;
    free(t);
}

ts_status ts__stream_synchronize(ts__stream *s) {
    if (!s || s == ts_current_stream) return TS_OK;
    pthread_mutex_lock(&s->mu);
    while (s->pending > 0) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return TS_OK;
}

ts_status ts_device_run_parallel(ts_device *const *devs, int n, ts_task_fn fn, void *const *args) {
    TS_ARG(n >= 0 && (n == 0 || (devs && fn && args)), "ts_device_run_parallel: bad arguments");
    ts_task *stack_tasks[TS_MAX_CPU_DEVICES];
    ts_task **tasks = n <= TS_MAX_CPU_DEVICES ? stack_tasks : ts__calloc((size_t)n, sizeof *tasks);
    if (!tasks) return TS_ERR_NOMEM;
    ts_status first = TS_OK;
    char msg[TS_ERRMSG_MAX] = "";
    for (int i = 0; i < n; i++) {
        tasks[i] = NULL;
        if (!devs[i] && first == TS_OK) {
            first = ts_error(TS_ERR_INVALID_ARG, "ts_device_run_parallel: device %d is NULL", i);
            snprintf(msg, sizeof msg, "%s", ts_last_error());
        }
    }
    /* devices with a worker first: a device without one ("cpu", or our own
     * worker's) runs its task inline in submit, which would otherwise hold
     * back the submits after it */
    for (int pass = 0; pass < 2 && first == TS_OK; pass++) {
        for (int i = 0; i < n; i++) {
            bool runs_inline = !devs[i]->stream || devs[i]->stream == ts_current_stream;
            if (runs_inline != (pass == 1)) continue;
            ts_status st = ts_device_submit(devs[i], fn, args[i], &tasks[i]);
            if (st != TS_OK) {
                first = st;
                snprintf(msg, sizeof msg, "%s", ts_last_error());
                break;
            }
        }
    }
    for (int i = 0; i < n; i++) { /* the first failure by index */
        if (!tasks[i]) continue;
        ts_status st = ts_task_wait(tasks[i]);
        if (st != TS_OK && first == TS_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s: %s", devs[i]->name, ts_last_error());
        }
        free(tasks[i]);
    }
    if (tasks != stack_tasks) free(tasks);
    return first == TS_OK ? TS_OK : ts_error(first, "%s", msg);
}
