/*
 * train/ckdir.c — checkpoint folders (train/ckdir.h): lineage records, the restart lookup
 * (ts_train_checkpoint_latest) and a trainer's saves and pruning (--keep).
 *
 * What a run may touch. A folder can hold more than one run's files: a branch resumed from an older
 * checkpoint, another run, a damaged copy, a FIFO or a link someone named step-<N>.ckpt. Ranking by the
 * number in the name would take any of them for the newest, so nothing here trusts names:
 *   - the restart lookup reads every candidate's metadata (ts_ckpt_load_meta: no tensor data), takes the
 *     lineage of the session that started last and resumes its newest checkpoint that loads whole
 *     (whole-file CRC); damaged or special files are skipped with a warning naming them, other runs'
 *     and branches' files are counted in one warning;
 *   - a trainer removes (--keep) only files of its own lineage, verified when the run starts or written
 *     by it, and only while each is still that file (device and inode); the file just written is never
 *     removed; a save whose name is taken by a file it cannot verify moves that file aside.
 * PyTorch Lightning's ModelCheckpoint likewise deletes only the files it recorded saving, and DeepSpeed
 * resumes what its own record names rather than the highest-numbered tag.
 */
#include "train/ckdir.h"
#include "train/ckpt_keys.h"
#include "tessera/train.h"
#include "core/bytes.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKDIR_PREFIX "step-"
#define CKDIR_SUFFIX ".ckpt"
#define SEG_BYTES 24

/* ---- lineage ------------------------------------------------------------------------------------------ */
void ts__lineage_clear(ts__lineage *l) {
    if (!l) return;
    free(l->seg);
    l->seg = NULL;
    l->n = 0;
}

ts_status ts__lineage_extend(ts__lineage *l, const ts__lineage *parent, uint64_t id, int64_t step, int64_t ns) {
    int from = parent && parent->n >= TS__LINEAGE_MAX ? parent->n - TS__LINEAGE_MAX + 1 : 0;
    int np = parent ? parent->n - from : 0;
    ts__lineage_seg *s = ts__malloc(sizeof *s * (size_t)(np + 1));
    if (!s) return TS_ERR_NOMEM;
    if (np) memcpy(s, parent->seg + from, sizeof *s * (size_t)np);
    s[np] = (ts__lineage_seg){id, step, ns};
    ts__lineage_clear(l);
    l->seg = s;
    l->n = np + 1;
    return TS_OK;
}

ts_status ts__lineage_read(const ts_ckpt *ck, const char *path, ts__lineage *l, bool *present) {
    const void *b = NULL;
    size_t n = 0;
    ts__lineage_clear(l);
    *present = false;
    if (!ts_ckpt_has(ck, TS_CKPT_BYTES, CK_LINEAGE)) return TS_OK;
    TS_TRY(ts_ckpt_get_bytes(ck, CK_LINEAGE, &b, &n));
    if (n == 0 || n % SEG_BYTES != 0 || n / SEG_BYTES > TS__LINEAGE_MAX)
        return ts_error(TS_ERR_FORMAT, "%s: " CK_LINEAGE " holds %zu bytes, not 1 to %d records of %d", path, n,
                        TS__LINEAGE_MAX, SEG_BYTES);
    int k = (int)(n / SEG_BYTES);
    if (!(l->seg = ts__malloc(sizeof *l->seg * (size_t)k))) return TS_ERR_NOMEM;
    const uint8_t *p = b;
    for (int i = 0; i < k; i++, p += SEG_BYTES) {
        ts__lineage_seg s = {ts__get_le(p, 8), (int64_t)ts__get_le(p + 8, 8), (int64_t)ts__get_le(p + 16, 8)};
        if (s.start_step < 0 || s.start_step > TS_TRAIN_MAX_COUNT || (i && s.start_step < l->seg[i - 1].start_step)) {
            ts__lineage_clear(l);
            return ts_error(TS_ERR_FORMAT, "%s: " CK_LINEAGE " record %d starts at step %lld (steps must be in [0, "
                            "2^40] and never decrease)", path, i, (long long)s.start_step);
        }
        l->seg[i] = s;
    }
    l->n = k;
    *present = true;
    return TS_OK;
}

ts_status ts__lineage_write(ts_ckpt *ck, const ts__lineage *l) {
    uint8_t *buf = ts__malloc((size_t)l->n * SEG_BYTES + 1), *p = buf;
    if (!buf) return TS_ERR_NOMEM;
    for (int i = 0; i < l->n; i++, p += SEG_BYTES) {
        ts__put_le(p, l->seg[i].id, 8);
        ts__put_le(p + 8, (uint64_t)l->seg[i].start_step, 8);
        ts__put_le(p + 16, (uint64_t)l->seg[i].start_ns, 8);
    }
    ts_status st = ts_ckpt_set_bytes(ck, CK_LINEAGE, buf, (size_t)l->n * SEG_BYTES);
    free(buf);
    return st;
}

static bool seg_eq(const ts__lineage_seg *a, const ts__lineage_seg *b) {
    return a->id == b->id && a->start_step == b->start_step && a->start_ns == b->start_ns;
}

bool ts__lineage_holds(const ts__lineage *cur, const ts__lineage *f, int64_t step) {
    if (!cur || !f || cur->n < 1 || f->n < 1) return false;
    const ts__lineage_seg *last = &f->seg[f->n - 1];
    int j = cur->n - 1;
    while (j >= 0 && !seg_eq(&cur->seg[j], last)) j--;
    if (j < 0 || step < last->start_step) return false;
    for (int i = 1; i < f->n && j - i >= 0; i++) /* the history before it is the same */
        if (!seg_eq(&f->seg[f->n - 1 - i], &cur->seg[j - i])) return false;
    return j == cur->n - 1 || step <= cur->seg[j + 1].start_step; /* written before cur branched off */
}

/* ---- listing ------------------------------------------------------------------------------------------ */
/* The step of a checkpoint folder's file name, or -1 for other names. */
static int64_t name_step(const char *name) {
    size_t n = strlen(name), p = sizeof CKDIR_PREFIX - 1, q = sizeof CKDIR_SUFFIX - 1;
    if (n <= p + q || strncmp(name, CKDIR_PREFIX, p) != 0 || strcmp(name + n - q, CKDIR_SUFFIX) != 0) return -1;
    int64_t v = 0;
    for (size_t i = p; i < n - q; i++) {
        if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

/* A file named like a checkpoint. usable: a regular file whose metadata reads, records this step, and
 * (has_lin) a lineage. */
typedef struct cand {
    char name[256];
    int64_t step, order_ns; /* order_ns: the writing session's start; -1 without a lineage */
    uint64_t dev, ino;
    ts__lineage lin;
    bool usable, has_lin, tried;
} cand;

static void cands_free(cand *c, int n) {
    for (int i = 0; i < n; i++) ts__lineage_clear(&c[i].lin);
    free(c);
}

/* Reads what c's file says about itself; false (and, when warn, a one-line warning naming it) when it is
 * not a checkpoint this folder can use. */
static bool cand_read(const char *dir, cand *c, bool warn) {
    char path[4096], esc[TS__PATH_ESC];
    snprintf(path, sizeof path, "%s/%s", dir, c->name);
    struct stat sb;
    int gone = lstat(path, &sb) != 0 ? errno : 0;
    if (gone || !S_ISREG(sb.st_mode)) {
        if (warn)
            ts_log(TS_LOG_WARN, "skipping %s: %s%s, not a checkpoint file", ts__printable(path, esc, sizeof esc),
                   gone ? "" : "it is a ", gone ? strerror(gone) : ts__file_type_name((unsigned)sb.st_mode));
        return false;
    }
    c->dev = (uint64_t)sb.st_dev;
    c->ino = (uint64_t)sb.st_ino;
    ts_ckpt *ck = NULL;
    int64_t rec = -1;
    ts_status st = ts_ckpt_load_meta(path, &ck);
    if (st == TS_OK && ts_ckpt_get_i64(ck, CK_STEP, &rec) != TS_OK)
        st = ts_error(TS_ERR_FORMAT, "%s is not a training checkpoint (no " CK_STEP ")", ts__path(path, esc));
    if (st == TS_OK && rec != c->step)
        st = ts_error(TS_ERR_FORMAT, "%s: its name says step %lld, the file records step %lld (renamed or copied?)",
                      ts__path(path, esc), (long long)c->step, (long long)rec);
    if (st == TS_OK) st = ts__lineage_read(ck, path, &c->lin, &c->has_lin);
    ts_ckpt_free(ck);
    if (st != TS_OK) {
        if (warn) ts_log(TS_LOG_WARN, "skipping checkpoint %s", ts_last_error());
        return false;
    }
    c->order_ns = c->has_lin ? c->lin.seg[c->lin.n - 1].start_ns : -1;
    return c->usable = true;
}

/* The files of dir named step-<N>.ckpt into *out (malloc'd, *n of them; none when dir does not exist),
 * the newest session's first, each session's highest step first; files without a lineage last. */
static ts_status list_cands(const char *dir, bool warn, cand **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    char esc[TS__PATH_ESC];
    if (!d)
        return errno == ENOENT ? TS_OK
                               : ts_error(TS_ERR_IO, "checkpoint folder %s: %s", ts__printable(dir, esc, sizeof esc),
                                          strerror(errno));
    int cap = 0;
    ts_status st = TS_OK;
    for (struct dirent *e; st == TS_OK && (e = readdir(d));) {
        int64_t v = name_step(e->d_name);
        if (v < 0 || strlen(e->d_name) >= sizeof(*out)->name) continue;
        if (*n == cap) {
            cand *g = ts__realloc(*out, sizeof *g * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                st = TS_ERR_NOMEM;
                break;
            }
            *out = g;
        }
        cand *c = &(*out)[(*n)++];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", e->d_name);
        c->step = v;
    }
    closedir(d);
    for (int i = 0; i < *n && st == TS_OK; i++) cand_read(dir, &(*out)[i], warn);
    for (int i = 1; i < *n; i++) /* newest first (insertion sort: folders hold a handful) */
        for (int j = i; j > 0; j--) {
            cand *a = &(*out)[j - 1], *b = &(*out)[j];
            if (a->order_ns > b->order_ns || (a->order_ns == b->order_ns && a->step >= b->step)) break;
            cand tmp = *a;
            *a = *b;
            *b = tmp;
        }
    return st;
}

/* Whether c is of head's lineage (files without a lineage record make one lineage of their own). */
static bool same_lineage(const cand *head, const cand *c) {
    if (!head->has_lin || !c->has_lin) return head->has_lin == c->has_lin;
    return ts__lineage_holds(&head->lin, &c->lin, c->step);
}

/* The newest checkpoint of the lineage of the newest usable untried candidate that loads whole. */
static bool pick(const char *dir, cand *c, int n, char *path, size_t cap, int *others) {
    for (int h = 0; h < n; h++) {
        if (!c[h].usable || c[h].tried) continue;
        *others = 0;
        for (int i = 0; i < n; i++) *others += c[i].usable && !same_lineage(&c[h], &c[i]);
        for (int i = h; i < n; i++) {
            if (!c[i].usable || c[i].tried || !same_lineage(&c[h], &c[i])) continue;
            c[i].tried = true;
            ts_train_checkpoint_info info;
            snprintf(path, cap, "%s/%s", dir, c[i].name);
            if (ts_train_checkpoint_read(path, &info) == TS_OK) return true;
            ts_log(TS_LOG_WARN, "skipping checkpoint %s", ts_last_error());
        }
    }
    return false;
}

ts_status ts_train_checkpoint_latest(const char *dir, char *path, size_t n, bool *found) {
    TS_ARG(dir && path && n && found, "ts_train_checkpoint_latest: NULL argument");
    *found = false;
    path[0] = '\0';
    cand *c = NULL;
    int count = 0, others = 0;
    TS_TRY(list_cands(dir, true, &c, &count));
    *found = pick(dir, c, count, path, n, &others);
    if (*found && others > 0) {
        char esc[TS__PATH_ESC];
        ts_log(TS_LOG_WARN, "checkpoint folder %s holds %d checkpoint%s of another run or branch (not ancestors of "
               "%s, the newest checkpoint of the run that saved last): left alone", ts__printable(dir, esc, sizeof esc),
               others, others == 1 ? "" : "s", path);
    }
    if (!*found) path[0] = '\0';
    cands_free(c, count);
    return TS_OK;
}

/* ---- a trainer's folder ------------------------------------------------------------------------------- */
void ts__ckdir_clear(ts__ckdir *d) {
    if (!d) return;
    free(d->f);
    memset(d, 0, sizeof *d);
}

static void ckdir_path(const char *dir, int64_t step, char *buf, size_t n) {
    snprintf(buf, n, "%s/" CKDIR_PREFIX "%012lld" CKDIR_SUFFIX, dir, (long long)step);
}

static int find_step(const ts__ckdir *d, int64_t step) {
    for (int i = 0; i < d->n; i++)
        if (d->f[i].step == step) return i;
    return -1;
}

/* Records (step, dev, ino), replacing the entry of that step; keeps the steps ascending. */
static void record(ts__ckdir *d, int64_t step, uint64_t dev, uint64_t ino) {
    int i = find_step(d, step);
    if (i < 0) {
        if (d->n == d->cap) {
            ts__ckdir_file *g = ts__realloc(d->f, sizeof *g * (size_t)(d->cap = d->cap ? 2 * d->cap : 16));
            if (!g) { /* not recorded: never removed (safe) */
                d->cap = d->n;
                return;
            }
            d->f = g;
        }
        for (i = d->n++; i > 0 && d->f[i - 1].step > step; i--) d->f[i] = d->f[i - 1];
    }
    d->f[i] = (ts__ckdir_file){step, dev, ino};
}

void ts__ckdir_scan(ts__ckdir *d, const char *dir, const ts__lineage *cur) {
    d->n = 0;
    d->scanned = true;
    cand *c = NULL;
    int count = 0, others = 0;
    char names[200] = "", esc[TS__PATH_ESC];
    if (list_cands(dir, false, &c, &count) != TS_OK) {
        ts_log(TS_LOG_WARN, "%s: --keep removes only this run's new checkpoints", ts_last_error());
        return;
    }
    for (int i = 0; i < count; i++) {
        if (c[i].usable && c[i].has_lin && ts__lineage_holds(cur, &c[i].lin, c[i].step)) {
            record(d, c[i].step, c[i].dev, c[i].ino);
            continue;
        }
        if (others++ < 3) { /* names[] holds three step-<N>.ckpt names of any length up to 60 */
            size_t k = strlen(names);
            if (k + 64 < sizeof names) snprintf(names + k, sizeof names - k, "%s%.60s", k ? ", " : "", c[i].name);
        }
    }
    if (others > 0)
        ts_log(TS_LOG_WARN, "checkpoint folder %s holds %d file%s named like checkpoints that are not of this run's "
               "lineage (another run or branch, no lineage record, unreadable or not a regular file: %s%s): --keep "
               "never removes them and a save never replaces them", ts__printable(dir, esc, sizeof esc), others, others == 1 ? "" : "s", names,
               others > 3 ? ", ..." : "");
    cands_free(c, count);
}

ts_status ts__ckdir_prepare(ts__ckdir *d, const char *dir, int64_t step, char *path, size_t n) {
    ckdir_path(dir, step, path, n);
    struct stat sb;
    if (lstat(path, &sb) != 0) return TS_OK;
    int i = find_step(d, step);
    if (i >= 0 && S_ISREG(sb.st_mode) && d->f[i].dev == (uint64_t)sb.st_dev && d->f[i].ino == (uint64_t)sb.st_ino)
        return TS_OK; /* this run's (or its ancestor's): replaced by the new save */
    char aside[4200], e1[TS__PATH_ESC], e2[TS__PATH_ESC];
    for (int k = 1; k < 1000; k++) {
        snprintf(aside, sizeof aside, "%s.other-%d", path, k);
        if (lstat(aside, &sb) == 0 || errno != ENOENT) continue;
        if (rename(path, aside) != 0) break;
        ts_log(TS_LOG_WARN, "%s is not this run's checkpoint (another run or branch, or unverifiable): moved to %s "
               "so that this run's save does not replace it", ts__printable(path, e1, sizeof e1),
               ts__printable(aside, e2, sizeof e2));
        return TS_OK;
    }
    return ts_error(TS_ERR_IO, "%s is not this run's checkpoint and cannot be moved aside (%s): refusing to replace it",
                    ts__printable(path, e1, sizeof e1), strerror(errno));
}

void ts__ckdir_saved(ts__ckdir *d, const char *dir, int64_t step, const char *path, int keep) {
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) record(d, step, (uint64_t)sb.st_dev, (uint64_t)sb.st_ino);
    char old[4096], esc[TS__PATH_ESC];
    while (keep > 0 && d->n > keep && d->f[0].step < step) { /* the oldest first; never the one just written */
        ts__ckdir_file f = d->f[0];
        memmove(d->f, d->f + 1, sizeof *d->f * (size_t)--d->n);
        ckdir_path(dir, f.step, old, sizeof old);
        if (lstat(old, &sb) != 0) continue; /* gone already */
        if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_dev != f.dev || (uint64_t)sb.st_ino != f.ino) {
            ts_log(TS_LOG_WARN, "not removing old checkpoint %s: it was replaced since this run checked it",
                   ts__printable(old, esc, sizeof esc));
            continue;
        }
        if (unlink(old) != 0 && errno != ENOENT)
            ts_log(TS_LOG_WARN, "removing old checkpoint %s: %s", ts__printable(old, esc, sizeof esc), strerror(errno));
    }
}
