/*
 * device/device.c — the device registry and allocation accounting.
 */
#include "core/env.h"
#include "device/device.h"
#include "device/cuda.h"

#include <limits.h>
#include <omp.h>
#include <stdio.h>

#define TS_MAX_DEVICES 64

static ts_device *ts_devices[TS_MAX_DEVICES];
static int ts_ndevices;
static pthread_mutex_t ts_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ts_registry_once = PTHREAD_ONCE_INIT;

/* The host CPU is entry 0 (an empty registry cannot refuse it). */
static void registry_init(void) { (void)ts__device_register(ts__cpu_device_init()); }

ts_status ts__device_register(ts_device *d) {
    pthread_mutex_lock(&ts_registry_mu);
    for (int i = 0; i < ts_ndevices; i++) {
        if (strcmp(ts_devices[i]->name, d->name) == 0) {
            pthread_mutex_unlock(&ts_registry_mu);
            return ts_error(TS_ERR_INVALID_ARG, "device '%s' is already registered", d->name);
        }
    }
    if (ts_ndevices == TS_MAX_DEVICES) {
        pthread_mutex_unlock(&ts_registry_mu);
        return ts_error(TS_ERR_INVALID_ARG, "too many devices (max %d)", TS_MAX_DEVICES);
    }
    ts_devices[ts_ndevices++] = d;
    pthread_mutex_unlock(&ts_registry_mu);
    return TS_OK;
}

ts_device *ts_device_cpu(void) {
    pthread_once(&ts_registry_once, registry_init);
    return ts_devices[0];
}

/* ---- virtual CPU devices ------------------------------------------------------------------------- */
/* Created all at once, on the first lookup of a "cpu:K" name; the count is
 * fixed from then on (tensors and modules hold device pointers). */
static int ts_vcpu_count = -1;   /* -1: not configured (TS_CPU_DEVICES or 2) */
static int ts_vcpu_threads = -1; /* -1: not configured (TS_CPU_DEVICE_THREADS or cores / count) */
static bool ts_vcpu_created;
static ts_device *ts_vcpu[TS_MAX_CPU_DEVICES];

static int vcpu_count_locked(void) {
    if (ts_vcpu_count < 0) ts_vcpu_count = (int)TS_MIN(ts_env_int(TS_ENV_CPU_DEVICES), TS_MAX_CPU_DEVICES);
    return ts_vcpu_count;
}

static int vcpu_threads_locked(void) {
    if (ts_vcpu_threads > 0) return ts_vcpu_threads;
    int t = (int)ts_env_int(TS_ENV_CPU_DEVICE_THREADS); /* 0: unset */
    int cores = omp_get_num_procs();
    return t > 0 ? t : TS_MAX(1, cores / TS_MAX(1, vcpu_count_locked()));
}

ts_status ts_set_cpu_device_count(int n) {
    TS_ARG(n >= 1 && n <= TS_MAX_CPU_DEVICES, "ts_set_cpu_device_count: %d is not in [1, %d]", n, TS_MAX_CPU_DEVICES);
    pthread_mutex_lock(&ts_registry_mu);
    bool created = ts_vcpu_created;
    int have = ts_vcpu_count;
    if (!created) ts_vcpu_count = n;
    pthread_mutex_unlock(&ts_registry_mu);
    if (created && have != n)
        return ts_error(TS_ERR_STATE, "ts_set_cpu_device_count(%d): the %d virtual CPU devices already exist", n, have);
    return TS_OK;
}

int ts_cpu_device_count(void) {
    pthread_mutex_lock(&ts_registry_mu);
    int n = vcpu_count_locked();
    pthread_mutex_unlock(&ts_registry_mu);
    return n;
}

void ts_set_cpu_device_threads(int n) {
    pthread_mutex_lock(&ts_registry_mu);
    ts_vcpu_threads = n < 1 ? 1 : n;
    pthread_mutex_unlock(&ts_registry_mu);
}

int ts_cpu_device_threads(void) {
    pthread_mutex_lock(&ts_registry_mu);
    int n = vcpu_threads_locked();
    pthread_mutex_unlock(&ts_registry_mu);
    return n;
}

/* Called with ts_registry_mu held: registers cpu:0..N-1 once. */
static ts_status vcpu_create_locked(void) {
    if (ts_vcpu_created) return TS_OK;
    int n = vcpu_count_locked(), threads = vcpu_threads_locked();
    pthread_mutex_unlock(&ts_registry_mu); /* ts__device_register takes the lock */
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++) {
        st = ts__cpu_virtual_device_new(i, threads, &ts_vcpu[i]);
        if (st == TS_OK) st = ts__device_register(ts_vcpu[i]);
    }
    pthread_mutex_lock(&ts_registry_mu);
    if (st == TS_OK) ts_vcpu_created = true;
    return st;
}

static pthread_mutex_t ts_vcpu_create_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises vcpu_create_locked */

/* ---- CUDA devices ----------------------------------------------------------------------------------- */
/* cuda:K is created on its first lookup ("cuda" is cuda:0, as PyTorch's current device starts). */
static ts_device *ts_cuda_devs[TS_MAX_CUDA_DEVICES];
static pthread_mutex_t ts_cuda_create_mu = PTHREAD_MUTEX_INITIALIZER;

static ts_status cuda_lookup(const char *name, ts_device **out) {
    long k = 0;
    if (name[4] == ':') {
        char *end;
        k = strtol(name + 5, &end, 10);
        if (name[5] < '0' || name[5] > '9' || *end || k > INT_MAX)
            return ts_error(TS_ERR_DEVICE, "malformed device name '%s' (want cpu, cpu:K or cuda:K)", name);
    }
    pthread_mutex_lock(&ts_cuda_create_mu);
    ts_status st = TS_OK;
    if (k >= TS_MAX_CUDA_DEVICES || !ts_cuda_devs[k]) { /* n <= TS_MAX_CUDA_DEVICES: a k past it fails below */
        char why[256] = "";
        int n = ts__cuda_device_count(why, sizeof why);
        if (n == 0)
            st = ts_error(TS_ERR_DEVICE, "unknown device '%s': %s", name, why);
        else if (k >= n)
            st = ts_error(TS_ERR_DEVICE, "unknown device '%s': there %s %d CUDA device%s, cuda:0%s%.0d", name,
                          n == 1 ? "is" : "are", n, n == 1 ? "" : "s", n > 1 ? " to cuda:" : "", n > 1 ? n - 1 : 0);
        else {
            ts_device *d = NULL;
            st = ts__cuda_device_new((int)k, &d);
            if (st == TS_OK) st = ts__device_register(d);
            if (st == TS_OK) ts_cuda_devs[k] = d;
        }
    }
    ts_device *d = st == TS_OK ? ts_cuda_devs[k] : NULL;
    pthread_mutex_unlock(&ts_cuda_create_mu);
    TS_TRY(st);
    *out = d;
    return TS_OK;
}

int ts_cuda_device_count(char *why, size_t why_len) {
    char buf[256] = "";
    int n = ts__cuda_device_count(buf, sizeof buf);
    if (why && why_len) snprintf(why, why_len, "%s", n ? "" : buf);
    return n;
}

void ts_device_describe(const ts_device *d, char *buf, size_t len) {
    if (d->type == TS_DEVICE_CUDA)
        ts__cuda_device_describe(d, buf, len);
    else if (d->stream)
        snprintf(buf, len, "virtual CPU device, %d kernel thread%s", ts_cpu_device_threads(),
                 ts_cpu_device_threads() == 1 ? "" : "s");
    else
        snprintf(buf, len, "host CPU, %d core%s", omp_get_num_procs(), omp_get_num_procs() == 1 ? "" : "s");
}

size_t ts_device_memory_reserved(const ts_device *d) {
    return d->ops->reserved ? d->ops->reserved(d) : atomic_load(&d->mem_allocated);
}

static ts_status lookup(const char *name, ts_device **out) {
    ts_device *found = NULL;
    ts_status st = TS_OK;
    if (strncmp(name, "cpu:", 4) == 0) {
        char *end;
        long k = strtol(name + 4, &end, 10);
        if (name[4] < '0' || name[4] > '9' || *end)
            return ts_error(TS_ERR_DEVICE, "malformed device name '%s' (want cpu, cpu:K or cuda:K)", name);
        pthread_mutex_lock(&ts_vcpu_create_mu);
        pthread_mutex_lock(&ts_registry_mu);
        st = vcpu_create_locked();
        int n = ts_vcpu_count;
        if (st == TS_OK && k >= 0 && k < n) found = ts_vcpu[k];
        pthread_mutex_unlock(&ts_registry_mu);
        pthread_mutex_unlock(&ts_vcpu_create_mu);
        TS_TRY(st);
        if (!found)
            return ts_error(TS_ERR_DEVICE,
                            "unknown device '%s': there are %d virtual CPU devices, cpu:0 to cpu:%d (set "
                            "TS_CPU_DEVICES or ts_set_cpu_device_count for more)",
                            name, n, n - 1);
        *out = found;
        return TS_OK;
    }
    if (strcmp(name, "cuda") == 0 || strncmp(name, "cuda:", 5) == 0) return cuda_lookup(name, out);
    pthread_mutex_lock(&ts_registry_mu);
    for (int i = 0; i < ts_ndevices; i++)
        if (strcmp(ts_devices[i]->name, name) == 0) found = ts_devices[i];
    pthread_mutex_unlock(&ts_registry_mu);
    if (!found) {
        return ts_error(TS_ERR_DEVICE, "unknown device '%s' (known: cpu, cpu:0 ... cpu:%d)", name,
                        ts_cpu_device_count() - 1);
    }
    *out = found;
    return TS_OK;
}

ts_status ts_device_get(const char *name, ts_device **out) {
    TS_ARG(name && out, "ts_device_get: NULL argument");
    pthread_once(&ts_registry_once, registry_init);
    return lookup(name, out);
}

ts_status ts_device_list_parse(const char *list, ts_device **out, int max, int *count) {
    TS_ARG(list && out && count && max > 0, "ts_device_list_parse: bad arguments");
    *count = 0;
    const char *p = list;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[64];
        if (len == 0 || len >= sizeof name)
            return ts_error(TS_ERR_INVALID_ARG, "device list '%s': empty or overlong entry at offset %d", list,
                            (int)(p - list));
        memcpy(name, p, len);
        name[len] = 0;
        if (*count == max) return ts_error(TS_ERR_INVALID_ARG, "device list '%s': more than %d devices", list, max);
        ts_device *d;
        ts_status st = ts_device_get(name, &d);
        if (st != TS_OK) return ts__error_prefix(st, "device list '%s'", list);
        for (int i = 0; i < *count; i++)
            if (out[i] == d) return ts_error(TS_ERR_INVALID_ARG, "device list '%s': %s appears twice", list, name);
        out[(*count)++] = d;
        p += len;
        if (*p == ',') p++;
    }
    if (*count == 0) return ts_error(TS_ERR_INVALID_ARG, "device list '%s' is empty", list);
    return TS_OK;
}

const char *ts_device_name(const ts_device *d) { return d ? d->name : "(null)"; }
ts_device_type ts_device_type_of(const ts_device *d) { return d->type; }
int ts_device_index(const ts_device *d) { return d->index; }

ts_status ts_device_synchronize(ts_device *d) { return d->ops->synchronize ? d->ops->synchronize(d) : TS_OK; }

void ts_device_empty_cache(ts_device *d) {
    if (d->ops->empty_cache) d->ops->empty_cache(d);
}

size_t ts_device_memory_allocated(const ts_device *d) { return atomic_load(&d->mem_allocated); }
size_t ts_device_memory_peak(const ts_device *d) { return atomic_load(&d->mem_peak); }
void ts_device_memory_reset_peak(ts_device *d) { atomic_store(&d->mem_peak, atomic_load(&d->mem_allocated)); }

void *ts__device_alloc(ts_device *d, size_t nbytes) {
    /* failure injection sits here, above the backend's cache: a cached block
     * would otherwise hide an injected failure */
    void *p = ts__alloc_injected_failure() ? NULL : d->ops->alloc(d, nbytes);
    if (!p) {
        ts_error(TS_ERR_NOMEM, "out of memory on device %s allocating %zu bytes (%zu in use)", d->name, nbytes,
                 atomic_load(&d->mem_allocated));
        return NULL;
    }
    size_t now = atomic_fetch_add(&d->mem_allocated, nbytes) + nbytes;
    size_t peak = atomic_load(&d->mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&d->mem_peak, &peak, now)) {
    }
    return p;
}

void ts__device_free(ts_device *d, void *p, size_t nbytes) {
    if (!p) return;
    atomic_fetch_sub(&d->mem_allocated, nbytes);
    d->ops->free(d, p, nbytes);
}
