/*
 * device/device.c — the device registry and allocation accounting.
 */
#include "device/device.h"

#include <stdio.h>

#define TS_MAX_DEVICES 64

static ts_device *ts_devices[TS_MAX_DEVICES];
static int ts_ndevices;
static pthread_mutex_t ts_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ts_registry_once = PTHREAD_ONCE_INIT;

static void registry_init(void) { ts__cpu_device_init(); }

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

ts_status ts_device_get(const char *name, ts_device **out) {
    TS_ARG(name && out, "ts_device_get: NULL argument");
    pthread_once(&ts_registry_once, registry_init);
    pthread_mutex_lock(&ts_registry_mu);
    ts_device *found = NULL;
    for (int i = 0; i < ts_ndevices; i++)
        if (strcmp(ts_devices[i]->name, name) == 0) found = ts_devices[i];
    pthread_mutex_unlock(&ts_registry_mu);
    if (!found) return ts_error(TS_ERR_DEVICE, "unknown device '%s' (known: cpu)", name);
    *out = found;
    return TS_OK;
}

const char *ts_device_name(const ts_device *d) { return d ? d->name : "(null)"; }
ts_device_type ts_device_type_of(const ts_device *d) { return d->type; }

ts_status ts_device_synchronize(ts_device *d) { return d->ops->synchronize ? d->ops->synchronize(d) : TS_OK; }

void ts_device_empty_cache(ts_device *d) {
    if (d->ops->empty_cache) d->ops->empty_cache(d);
}

size_t ts_device_memory_allocated(const ts_device *d) { return atomic_load(&d->mem_allocated); }
size_t ts_device_memory_peak(const ts_device *d) { return atomic_load(&d->mem_peak); }
void ts_device_memory_reset_peak(ts_device *d) { atomic_store(&d->mem_peak, atomic_load(&d->mem_allocated)); }

void *ts__device_alloc(ts_device *d, size_t nbytes) {
    void *p = d->ops->alloc(d, nbytes);
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
