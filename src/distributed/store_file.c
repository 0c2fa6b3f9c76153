/*
 * distributed/store_file.c — the file store: one append-only file on a filesystem all
 * ranks share (torch's FileStore, gloo's FileStore).
 *
 * File format: the 8-byte header "TSSTORE1", then records
 *     u32 key_len | u64 value_len | key bytes | value bytes     (big-endian)
 * each one a set; a later record for a key replaces the earlier one. add is
 * a set of the new decimal value, computed under the write lock.
 *
 * Locking: writers take an exclusive lock on the whole file (open-file-
 * description locks, F_OFD_SETLK, so two stores in one process exclude each
 * other too; plain fcntl locks where OFD locks are missing), write the header
 * if the file is empty, and append one record with O_APPEND. Readers take a
 * shared lock, read from their cached offset to the end, and replay the new
 * records into their cache (a ts__kv). get/wait re-read the file with short
 * sleeps (1 ms doubling to 20 ms) until the key appears or the timeout passes.
 * Lock attempts never block: they retry until the operation's deadline.
 *
 * The file is never deleted by the store: reusing a path from an earlier run
 * sees that run's keys (the rendezvous detects this as "joined twice").
 */
#include "core/bytes.h"
#include "distributed/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_MAGIC "TSSTORE1"
#define FILE_MAGIC_LEN 8
#define REC_HEAD 12

#ifdef F_OFD_SETLK
#define LOCK_CMD F_OFD_SETLK
#else
#define LOCK_CMD F_SETLK
#endif

typedef struct file_store {
    ts_store base;
    char *path;
    int fd;
    pthread_mutex_t mu; /* guards kv and offset, and serialises this object's lock use */
    ts__kv kv;
    off_t offset; /* bytes of the file already replayed into kv */
} file_store;

static ts_status file_lock(file_store *f, short type, double deadline) {
    for (;;) {
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        if (fcntl(f->fd, LOCK_CMD, &fl) == 0) return TS_OK;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR)
            return ts_error(TS_ERR_IO, "file store: cannot lock %s: %s", f->path, strerror(errno));
        if (ts_time_now() >= deadline)
            return ts_error(TS_ERR_TIMEOUT, "file store: timed out waiting for the lock on %s", f->path);
        ts__sleep_s(0.001);
    }
}

static void file_unlock(file_store *f) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    (void)fcntl(f->fd, LOCK_CMD, &fl);
}

/* Replays records appended since f->offset (mu held, file lock held). */
static ts_status file_refresh_locked(file_store *f) {
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return ts_error(TS_ERR_IO, "file store: cannot stat %s: %s", f->path, strerror(errno));
    if (sb.st_size <= f->offset) return TS_OK;
    size_t n = (size_t)(sb.st_size - f->offset);
    uint8_t *buf = ts__malloc(n);
    if (!buf) return TS_ERR_NOMEM;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->fd, buf + got, n - got, f->offset + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(buf);
            return ts_error(TS_ERR_IO, "file store: cannot read %s: %s", f->path, strerror(errno));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    ts_status st = TS_OK;
    size_t pos = 0;
    if (f->offset == 0) {
        if (got < FILE_MAGIC_LEN) goto done; /* header still being written */
        if (memcmp(buf, FILE_MAGIC, FILE_MAGIC_LEN) != 0) {
            st = ts_error(TS_ERR_FORMAT, "file store: %s is not a tessera store file (bad header)", f->path);
            goto done;
        }
        pos = FILE_MAGIC_LEN;
    }
    while (got - pos >= REC_HEAD) {
        uint64_t kl = ts__get_be(buf + pos, 4), vl = ts__get_be(buf + pos + 4, 8);
        if (vl > got - pos - REC_HEAD || kl > got - pos - REC_HEAD - vl) break; /* incomplete */
        char *key = ts__malloc(kl + 1);
        if (!key) {
            st = TS_ERR_NOMEM;
            break;
        }
        memcpy(key, buf + pos + REC_HEAD, kl);
        key[kl] = 0;
        st = ts__kv_set(&f->kv, key, buf + pos + REC_HEAD + kl, vl);
        free(key);
        if (st != TS_OK) break;
        pos += REC_HEAD + kl + vl;
    }
done:
    f->offset += (off_t)pos;
    free(buf);
    return st;
}

static ts_status file_refresh(file_store *f, double deadline) {
    TS_TRY(file_lock(f, F_RDLCK, deadline));
    ts_status st = file_refresh_locked(f);
    file_unlock(f);
    return st;
}

/* Appends one set record (mu held, write lock held). */
static ts_status file_append_locked(file_store *f, const char *key, const void *value, size_t len) {
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return ts_error(TS_ERR_IO, "file store: cannot stat %s: %s", f->path, strerror(errno));
    size_t kl = strlen(key), hdr = sb.st_size == 0 ? FILE_MAGIC_LEN : 0;
    size_t n = hdr + REC_HEAD + kl + len;
    uint8_t *rec = ts__malloc(n);
    if (!rec) return TS_ERR_NOMEM;
    memcpy(rec, FILE_MAGIC, hdr);
    ts__put_be(rec + hdr, kl, 4);
    ts__put_be(rec + hdr + 4, len, 8);
    memcpy(rec + hdr + REC_HEAD, key, kl);
    if (len) memcpy(rec + hdr + REC_HEAD + kl, value, len);
    size_t done = 0;
    ts_status st = TS_OK;
    while (done < n) {
        ssize_t w = write(f->fd, rec + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            st = ts_error(TS_ERR_IO, "file store: cannot write %s: %s", f->path, w < 0 ? strerror(errno) : "short write");
            break;
        }
        done += (size_t)w;
    }
    free(rec);
    return st;
}

static ts_status file_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    file_store *f = (file_store *)s;
    pthread_mutex_lock(&f->mu);
    ts_status st = file_lock(f, F_WRLCK, ts_time_now() + timeout_s);
    if (st == TS_OK) {
        st = file_append_locked(f, key, value, len);
        file_unlock(f);
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static ts_status file_add(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result) {
    file_store *f = (file_store *)s;
    pthread_mutex_lock(&f->mu);
    ts_status st = file_lock(f, F_WRLCK, ts_time_now() + timeout_s);
    if (st == TS_OK) {
        int64_t cur = 0, next = 0;
        st = file_refresh_locked(f);
        ts__kv_entry *e = st == TS_OK ? ts__kv_find(&f->kv, key) : NULL;
        if (e) st = ts__kv_parse_int(e->value, e->len, key, &cur);
        if (st == TS_OK) st = ts__kv_sum(cur, delta, key, &next);
        if (st == TS_OK) {
            char buf[32];
            int n = snprintf(buf, sizeof buf, "%lld", (long long)next);
            st = file_append_locked(f, key, buf, (size_t)n);
        }
        if (st == TS_OK) *result = next;
        file_unlock(f);
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

/* Polls the file until every key exists. *missing: the first absent key on timeout. */
static ts_status file_wait_keys(file_store *f, const char *const *keys, int nkeys, double timeout_s,
                                const char **missing, void **value, size_t *len) {
    double deadline = ts_time_now() + timeout_s, nap = 0.001;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        ts_status st = file_refresh(f, deadline);
        int i = 0;
        while (st == TS_OK && i < nkeys && ts__kv_find(&f->kv, keys[i])) i++;
        if (st == TS_OK && i == nkeys && value) st = ts__kv_copy_value(ts__kv_find(&f->kv, keys[0]), value, len);
        pthread_mutex_unlock(&f->mu);
        if (st != TS_OK || i == nkeys) return st;
        *missing = keys[i];
        double left = deadline - ts_time_now();
        if (left <= 0) return TS_ERR_TIMEOUT;
        ts__sleep_s(TS_MIN(nap, left));
        nap = TS_MIN(nap * 2, 0.02);
    }
}

static ts_status file_get(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    file_store *f = (file_store *)s;
    const char *missing = key;
    ts_status st = file_wait_keys(f, &key, 1, timeout_s, &missing, value, len);
    if (st == TS_ERR_TIMEOUT)
        return ts_error(st, "file store %s: timed out after %.3g s waiting for key '%s'", f->path, timeout_s, key);
    return st;
}

static ts_status file_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    file_store *f = (file_store *)s;
    const char *missing = keys[0];
    ts_status st = file_wait_keys(f, keys, nkeys, timeout_s, &missing, NULL, NULL);
    if (st == TS_ERR_TIMEOUT)
        return ts_error(st, "file store %s: timed out after %.3g s waiting for key '%s'", f->path, timeout_s,
                        missing);
    return st;
}

static ts_status file_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    file_store *f = (file_store *)s;
    pthread_mutex_lock(&f->mu);
    ts_status st = file_refresh(f, ts_time_now() + timeout_s);
    *exists = st == TS_OK && ts__kv_find(&f->kv, key) != NULL;
    pthread_mutex_unlock(&f->mu);
    return st;
}

static void file_destroy(ts_store *s) {
    file_store *f = (file_store *)s;
    close(f->fd);
    ts__kv_free(&f->kv);
    pthread_mutex_destroy(&f->mu);
    free(f->path);
    free(f);
}

static const ts_store_vtable file_vtable = {"file", file_set, file_get, file_add, file_wait, file_check, NULL,
                                            file_destroy};

ts_status ts_store_file_new(const char *path, double timeout_s, ts_store **out) {
    TS_ARG(path && out, "ts_store_file_new: NULL argument");
    TS_ARG(path[0], "ts_store_file_new: empty path");
    *out = NULL;
    file_store *f = ts__calloc(1, sizeof *f);
    if (!f) return TS_ERR_NOMEM;
    f->path = ts__strdup(path);
    if (!f->path) {
        free(f);
        return TS_ERR_NOMEM;
    }
    f->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        ts_status st = ts_error(TS_ERR_IO, "file store: cannot open %s: %s", path, strerror(errno));
        free(f->path);
        free(f);
        return st;
    }
    pthread_mutex_init(&f->mu, NULL);
    f->kv = TS__KV_INIT;
    ts__store_init(&f->base, &file_vtable, timeout_s);
    /* Reject a file that is not a store now rather than at the first get. */
    pthread_mutex_lock(&f->mu);
    ts_status st = file_refresh(f, ts_time_now() + ts__store_timeout(&f->base));
    pthread_mutex_unlock(&f->mu);
    if (st != TS_OK) {
        file_destroy(&f->base);
        return st;
    }
    *out = &f->base;
    return TS_OK;
}
