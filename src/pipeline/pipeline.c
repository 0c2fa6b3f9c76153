/*
 * pipeline/pipeline.c — the executor: worker threads turn the reader's sample
 * stream into ready NCHW batches, prefetch_queue_depth of them ahead.
 *
 *   consumer thread (ts_pipeline_next)           worker threads (num_threads)
 *   ---------------------------------           -------------------------------
 *   frees the slot it handed out last time,     take the next (slot, position) of the
 *   plans batches into free slots (runs the     oldest slot still being filled, read +
 *   reader: cheap, no I/O), waits until the     decode + crop/resize/flip/normalise the
 *   oldest planned slot is READY, hands it out  sample straight into that slot's batch
 *   (borrowed views; copies to the device       memory, and mark the slot READY when its
 *   when the device is not host memory)         last position is done
 *
 * Slots: prefetch_queue_depth + 1 (the extra one is the batch the caller
 * holds). A slot's memory belongs to the one worker writing a position, so
 * workers only take the mutex to pick a position and to report it.
 * Ownership: the pipeline owns the reader, the slots' tensors and the views it
 * hands out; they stay valid until the next call, a seek or ts_pipeline_free.
 */
#include "pipeline/pipeline_internal.h"
#include "device/k_image.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD } slot_state;

typedef struct slot {
    slot_state state;
    int64_t seq;          /* planning order; the consumer takes seq == take_seq */
    int64_t epoch, batch; /* position of the batch */
    int64_t n, next, done; /* planned samples, next position to hand a worker, positions finished */
    int64_t skipped;       /* samples left out as corrupt */
    bool last;            /* ends its epoch */
    bool dropped;         /* a short last batch left out (TS_LAST_BATCH_DROP): planned with no samples */
    ts_reader_sample *smp; /* B planned samples */
    uint8_t *ok;           /* B: decoded (0: skipped as corrupt) */
    uint8_t *ondev;        /* B: written on the device by its decoder (mixed decoding), not in hx */
    void **written;        /* B: mixed decoding's markers after each row's device write (device ops), the device's
                              stream waits for them before it reads the rows; NULL where none is pending */
    void *released;        /* marker after the last readers of the slot's memory (the training step that used
                              its batch), which the decoders' writes wait for; NULL: nothing to wait for */
    ts_tensor *x, *y;      /* (B, C, H, W) f32 and (B) i64 on the device */
    float *hx;             /* where workers write: x's memory, or host staging */
    int64_t *hy;
    bool pinned;           /* hx, hy are the device's pinned host memory: uploaded without waiting */
    void *uploaded;        /* the pending upload's completion marker (pinned staging), NULL when none */
    ts_status err;         /* first failure (lowest position) */
    int64_t err_pos;
    char errmsg[1024];
} slot;

typedef struct worker {
    struct ts_pipeline *p;
    pthread_t tid;
    bool started;
    ts__decoder *dec;
    uint8_t *file;     /* file bytes, grown as needed */
    size_t file_cap;
    ts_image img;      /* decoded image */
    ts__resample_ws ws; /* resize scratch */
    ts_image_decoder *gdec; /* mixed decoding: this thread's device decoder (NULL: decode on the host) */
} worker;

struct ts_pipeline {
    ts_pipeline_opts o;
    ts_reader *reader;
    int C, H, W;
    int64_t B, numel;
    bool staged; /* the device is not host memory: workers write to staging buffers */
    const struct ts_kernels_image *ki; /* mixed decoding: the device's image kernels (NULL: host decoding) */
    slot *slots;
    int nslots, depth;
    worker *workers;
    int nworkers;

    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    bool stop, paused;
    int in_flight;
    int64_t plan_seq, take_seq;     /* next batch to plan / to hand out */
    int64_t plan_epoch, plan_batch; /* position of the next planned batch */
    int64_t cur_epoch, cur_batch;   /* position of the next batch handed out */
    bool epoch_end_pending;         /* the next call reports the end of cur_epoch */
    int held;                       /* slot the caller holds, or -1 */
    ts_tensor *vx, *vy;             /* views of a short batch handed out */
    int64_t *held_idx, held_n;      /* listing-order indices of the rows of the batch handed out */
    ts_status sticky;
    char sticky_msg[1024];
    int64_t decoded, skipped;
};

/* ---- per-sample work ------------------------------------------------------------------------- */
static uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The augmentation generator of one sample: a function of (seed, epoch, position in the epoch). */
static void sample_rng(const ts_pipeline *p, int64_t epoch, int64_t pos, ts_rng *r) {
    uint64_t s = splitmix((uint64_t)p->o.reader.seed ^ splitmix(((uint64_t)epoch << 32) ^ (uint64_t)pos));
    ts_rng_seed(r, s);
}

static ts_status gray_to_rgb(const uint8_t *src, int w, int h, ts_image *dst) {
    TS_TRY(ts_image_alloc(dst, w, h, 3));
    size_t n = (size_t)w * (size_t)h;
    for (size_t i = 0; i < n; i++) dst->data[3 * i] = dst->data[3 * i + 1] = dst->data[3 * i + 2] = src[i];
    return TS_OK;
}

/* A JPEG's random resized crop, chosen from the size in its header while it is being decoded. */
typedef struct choose_ctx {
    const ts_pipeline *p;
    ts_rng *rng;
    ts_roi roi;
    bool mirror;
} choose_ctx;

static void choose_window(void *vctx, int w, int h, ts_roi *win, int *denom) {
    choose_ctx *c = vctx;
    const ts_pipeline *p = c->p;
    c->roi = ts_random_resized_crop_roi(c->rng, w, h, p->o.rrc_scale, p->o.rrc_ratio);
    c->mirror = p->o.flip_prob > 0 && ts_rng_uniform(c->rng) < p->o.flip_prob;
    int d = 1;
    if (p->o.jpeg_scaled_decode)
        while (d < 8 && c->roi.w / (2 * d) >= p->W && c->roi.h / (2 * d) >= p->H) d *= 2;
    *win = c->roi;
    *denom = d;
}

ts_roi ts_center_crop_roi(int width, int height, int out_w, int out_h, float fraction) {
    /* source pixels per output pixel after the resize */
    double shorter = width < height ? width : height, out_shorter = out_w < out_h ? out_w : out_h;
    double scale = fraction * shorter / out_shorter;
    int cw = (int)lround(out_w * scale), ch = (int)lround(out_h * scale);
    cw = cw > width ? width : cw < 1 ? 1 : cw;
    ch = ch > height ? height : ch < 1 ? 1 : ch;
    return (ts_roi){(int)lround((width - cw) / 2.0), (int)lround((height - ch) / 2.0), cw, ch};
}

/* The window of a w x h source that becomes the output: a random resized crop, else the whole image
 * (center_crop resamples the whole image its own way: eval_crop). */
static ts_roi base_window(const ts_pipeline *p, ts_rng *rng, int w, int h) {
    if (p->o.random_resized_crop) return ts_random_resized_crop_roi(rng, w, h, p->o.rrc_scale, p->o.rrc_ratio);
    return (ts_roi){0, 0, w, h};
}

/* center_crop: torchvision's Resize(int(min(out) / center_crop)) + CenterCrop(out) of the whole image,
 * mirrored when asked. */
static ts_status eval_crop(worker *wk, const ts_image *im, bool mirror, float *dst) {
    const ts_pipeline *p = wk->p;
    const int resize = (int)((double)(p->W < p->H ? p->W : p->H) / (double)p->o.center_crop);
    TS_TRY(ts__resize_center_crop_normalize_ws(&wk->ws, im, resize, p->W, p->H, p->o.mean, p->o.std, dst));
    for (int64_t r = 0; mirror && r < (int64_t)p->C * p->H; r++)
        for (int a = 0, b = p->W - 1; a < b; a++, b--) {
            float t = dst[r * p->W + a];
            dst[r * p->W + a] = dst[r * p->W + b];
            dst[r * p->W + b] = t;
        }
    return TS_OK;
}

/* Reads, decodes and augments sample `pos` of slot s into its batch memory. */
static ts_status process(worker *wk, slot *s, int64_t pos) {
    ts_pipeline *p = wk->p;
    const ts_reader_sample *smp = &s->smp[pos];
    float *dst = s->hx + pos * p->numel;
    s->hy[pos] = smp->label;
    ts_rng rng;
    sample_rng(p, s->epoch, s->batch * p->B + pos, &rng);
    ts_image view = TS_IMAGE_INIT, *im = &wk->img;
    const bool center = !p->o.random_resized_crop && p->o.center_crop > 0;
    int w, h;
    const char *path = NULL;
    ts__fmt fmt = TS__FMT_UNKNOWN;
    if (ts__reader_kind(p->reader) == TS__SRC_IDX) {
        const uint8_t *px = ts__reader_idx_pixels(p->reader, smp->index, &w, &h);
        if (p->C == 3) {
            TS_TRY(gray_to_rgb(px, w, h, im));
        } else {
            view = (ts_image){(uint8_t *)px, w, h, 1, 0};
            im = &view;
        }
    } else {
        size_t n = 0;
        path = ts_reader_path(p->reader, smp->index);
        TS_TRY(ts__read_file(path, ts__reader_listed_regular(p->reader, smp->index), &wk->file, &wk->file_cap, &n));
        const uint8_t *b = wk->file;
        if (p->o.random_resized_crop && !wk->gdec && n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) {
            /* the common case, one header parse: DALI's fused decode + random crop */
            choose_ctx cc = {p, &rng, {0, 0, 0, 0}, false};
            ts_roi roi;
            TS_TRY(ts__decode_window_chosen(wk->dec, wk->file, n, (ts_color)p->C, path, choose_window, &cc, im, &roi));
            return ts__crop_resize_normalize_ws(&wk->ws, im, &roi, p->W, p->H, cc.mirror, p->o.mean, p->o.std, dst);
        }
        TS_TRY(ts__decode_header(wk->dec, wk->file, n, path, &fmt, &w, &h));
        /* the window is drawn on the full-size image so the draws do not depend on the decoder */
        ts_roi roi = base_window(p, &rng, w, h);
        bool mirror = p->o.flip_prob > 0 && ts_rng_uniform(&rng) < p->o.flip_prob;
        if (center) { /* torchvision's two resamplings of the whole image, on the host */
            TS_TRY(ts__decode(wk->dec, wk->file, n, (ts_color)p->C, path, 1, im));
            return eval_crop(wk, im, mirror, dst);
        }
        if (fmt == TS__FMT_JPEG && wk->gdec && ts__jpeg_has_end(wk->file, n)) { /* mixed: decoded on the device */
            ts_resample_plan plan;
            TS_TRY(ts__resample_plan_ws(&wk->ws, w, h, p->C, &roi, p->W, p->H, mirror, p->o.mean, p->o.std, &plan));
            float *row = ts__f32(s->x) + pos * p->numel;
            ts_status st = p->ki->jpeg_decode_resample(wk->gdec, wk->file, n, path, &plan, row, s->released,
                                                       &s->written[pos]);
            if (st == TS_OK) {
                s->ondev[pos] = 1;
                return TS_OK;
            }
            if (st != TS_ERR_FORMAT && st != TS_ERR_UNSUPPORTED) return st;
            /* a file the device decoder refuses goes to the host's, which names what is wrong with it */
            ts_log(TS_LOG_DEBUG, "pipeline: decoding on the host: %s", ts_last_error());
        }
        int denom = 1;
        if (fmt == TS__FMT_JPEG && p->o.jpeg_scaled_decode)
            while (denom < 8 && roi.w / (2 * denom) >= p->W && roi.h / (2 * denom) >= p->H) denom *= 2;
        if (fmt == TS__FMT_JPEG && (roi.w < w || roi.h < h || denom > 1)) { /* DALI's fused decode + crop */
            ts_roi win = roi;
            TS_TRY(ts__decode_window(wk->dec, wk->file, n, (ts_color)p->C, path, denom, &win, im, &roi));
        } else {
            TS_TRY(ts__decode(wk->dec, wk->file, n, (ts_color)p->C, path, 1, im));
        }
        return ts__crop_resize_normalize_ws(&wk->ws, im, &roi, p->W, p->H, mirror, p->o.mean, p->o.std, dst);
    }
    ts_roi roi = base_window(p, &rng, w, h);
    bool mirror = p->o.flip_prob > 0 && ts_rng_uniform(&rng) < p->o.flip_prob;
    if (center) return eval_crop(wk, im, mirror, dst);
    return ts__crop_resize_normalize_ws(&wk->ws, im, &roi, p->W, p->H, mirror, p->o.mean, p->o.std, dst);
}

/* Mixed decoding's ordering (device ops; no-ops on devices without markers): the device's stream waits for
 * the decoder's write of row pos (before it reads the row: a move, the hand-out, a re-plan of the slot). */
static ts_status written_wait(ts_pipeline *p, slot *s, int64_t pos) {
    void *m = s->written[pos];
    if (!m) return TS_OK;
    s->written[pos] = NULL;
    return p->o.device->ops->device_wait(p->o.device, m);
}

/* written_wait for rows 0..n-1 of s; the first failure. */
static ts_status written_wait_rows(ts_pipeline *p, slot *s, int64_t n) {
    ts_status st = TS_OK;
    for (int64_t pos = 0; pos < n; pos++) {
        ts_status w = written_wait(p, s, pos);
        if (st == TS_OK) st = w;
    }
    return st;
}

/* A new `released` marker for s, after the work queued so far (its batch's last readers). */
static ts_status slot_released(ts_pipeline *p, slot *s) {
    const ts_device_ops *ops = p->o.device->ops;
    if (!p->ki || !ops->marker_record) return TS_OK;
    if (s->released) ops->marker_free(p->o.device, s->released);
    s->released = NULL;
    return ops->marker_record(p->o.device, &s->released);
}

/* Mixed decoding: moves the device row `from` of slot s to row `to`, queued on the device's stream after
 * the decoder's write of it. */
static ts_status move_device_row(ts_pipeline *p, slot *s, int64_t from, int64_t to) {
    float *x = ts__f32(s->x);
    ts_device *d = p->o.device;
    TS_TRY(written_wait(p, s, from));
    return d->ops->copy_d2d(d, x + to * p->numel, x + from * p->numel, sizeof(float) * (size_t)p->numel);
}

/* ---- planning (under the mutex) ------------------------------------------------------------------ */
/* Pulls batch `batch` of `epoch` from the reader: up to B samples, stopping after an epoch's last sample.
 * Returns the count; *last tells whether it ended the epoch. TS_LAST_BATCH_DROP: after the epoch's last
 * whole batch the samples left are read and dropped (that batch ends the epoch); an epoch without a whole
 * batch gives 0 samples. */
static int64_t take_batch(ts_pipeline *p, int64_t epoch, int64_t batch, ts_reader_sample *out, bool *last) {
    int64_t n = 0;
    ts_reader_sample tmp;
    *last = false;
    while (n < p->B) {
        ts_reader_sample *s = out ? &out[n] : &tmp;
        ts_reader_next(p->reader, n == 0, n == p->B - 1, s);
        n++;
        if (s->epoch_end) {
            *last = true;
            break;
        }
    }
    if (p->o.last_batch != TS_LAST_BATCH_DROP) return n;
    if (n < p->B) return 0; /* a short batch: the epoch has no whole one */
    if (!*last && batch + 1 == ts_pipeline_num_batches(p, epoch)) {
        do ts_reader_next(p->reader, false, false, &tmp);
        while (!tmp.epoch_end);
        *last = true;
    }
    return n;
}

static void plan_locked(ts_pipeline *p) {
    int ahead = 0;
    for (int i = 0; i < p->nslots; i++) ahead += p->slots[i].state == SLOT_FILLING || p->slots[i].state == SLOT_READY;
    for (int i = 0; i < p->nslots && ahead < p->depth; i++) {
        slot *s = &p->slots[i];
        if (s->state != SLOT_FREE) continue;
        s->n = take_batch(p, p->plan_epoch, p->plan_batch, s->smp, &s->last);
        s->dropped = s->n == 0; /* an epoch without a whole batch (TS_LAST_BATCH_DROP): read, never decoded */
        s->skipped = 0;
        s->epoch = p->plan_epoch;
        s->batch = p->plan_batch;
        s->seq = p->plan_seq++;
        s->next = s->done = 0;
        s->err = TS_OK;
        s->err_pos = INT64_MAX;
        memset(s->ondev, 0, (size_t)p->B);
        if (written_wait_rows(p, s, p->B) != TS_OK) { /* rows decoded for a batch never handed out (an error) */
            s->err = TS_ERR_DEVICE;
            s->err_pos = 0;
            snprintf(s->errmsg, sizeof s->errmsg, "%s", ts_last_error());
        }
        s->state = s->dropped ? SLOT_READY : SLOT_FILLING;
        if (s->last) {
            p->plan_epoch++;
            p->plan_batch = 0;
        } else {
            p->plan_batch++;
        }
        ahead++;
    }
    pthread_cond_broadcast(&p->work_cv);
}

/* A filled slot: leave out the skipped samples (rows move up, order kept). */
static void finish_slot(ts_pipeline *p, slot *s) {
    int64_t k = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (!s->ok[i]) continue;
        if (k != i) {
            if (s->ondev[i]) {
                ts_status st = move_device_row(p, s, i, k);
                if (st != TS_OK && s->err == TS_OK) { /* reported when the batch is reached */
                    s->err = st;
                    s->err_pos = i;
                    snprintf(s->errmsg, sizeof s->errmsg, "%s", ts_last_error());
                }
            } else {
                memmove(s->hx + k * p->numel, s->hx + i * p->numel, sizeof(float) * (size_t)p->numel);
            }
            s->ondev[k] = s->ondev[i];
            s->written[k] = s->written[i]; /* NULL after a move; a host row has none */
            s->written[i] = NULL;
            s->hy[k] = s->hy[i];
            s->smp[k] = s->smp[i];
        }
        k++;
    }
    s->skipped = s->n - k;
    s->n = k;
    s->state = SLOT_READY;
}

static slot *next_task(ts_pipeline *p, int64_t *pos) {
    slot *best = NULL;
    for (int i = 0; i < p->nslots; i++) {
        slot *s = &p->slots[i];
        if (s->state == SLOT_FILLING && s->next < s->n && (!best || s->seq < best->seq)) best = s;
    }
    if (best) *pos = best->next++;
    return best;
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    ts_pipeline *p = wk->p;
    if (p->ki && p->ki->decoder_new(p->o.device, &wk->gdec) != TS_OK) /* ts_pipeline_new made one: rare */
        ts_log(TS_LOG_WARN, "pipeline: worker decodes on the host: %s", ts_last_error());
    pthread_mutex_lock(&p->mu);
    for (;;) {
        slot *s = NULL;
        int64_t pos = 0;
        while (!p->stop && (p->paused || !(s = next_task(p, &pos)))) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        p->in_flight++;
        pthread_mutex_unlock(&p->mu);
        ts_status st = process(wk, s, pos);
        pthread_mutex_lock(&p->mu);
        p->in_flight--;
        bool skippable = st == TS_ERR_FORMAT || st == TS_ERR_IO;
        s->ok[pos] = st == TS_OK;
        if (st == TS_OK) {
            p->decoded++;
        } else if (p->o.skip_corrupt && skippable) {
            /* skip_corrupt: say what is left out (the first ones by name; the count goes on) */
            if (++p->skipped <= 20) ts_log(TS_LOG_WARN, "skipping a corrupt sample: %s", ts_last_error());
            if (p->skipped == 20) ts_log(TS_LOG_WARN, "skipping further corrupt samples without naming them (they are counted)");
        } else if (pos < s->err_pos) {
            s->err = st;
            s->err_pos = pos;
            snprintf(s->errmsg, sizeof s->errmsg, "%s", ts_last_error());
        }
        if (++s->done == s->n) {
            finish_slot(p, s);
            pthread_cond_broadcast(&p->done_cv);
        }
        if (p->paused && p->in_flight == 0) pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- uploads (a device that is not host memory) ----------------------------------------------------- */
/* One copy of n bytes from host staging to the device: queued without waiting from pinned staging (the
 * last one of a batch leaving its completion marker in s->uploaded), else the device's waiting copy. */
static ts_status stage_copy(ts_pipeline *p, slot *s, void *dst, const void *src, size_t n, bool last) {
    ts_device *d = p->o.device;
    if (s->pinned) return d->ops->copy_h2d_async(d, dst, src, n, last ? &s->uploaded : NULL);
    return d->ops->copy_h2d(d, dst, src, n);
}

/* The batch in s's host staging to its device tensors: the rows not decoded on the device (all of them
 * but with mixed decoding), a run at a time, then the labels. */
static ts_status upload(ts_pipeline *p, slot *s) {
    const size_t row = sizeof(float) * (size_t)p->numel;
    ts_status st = TS_OK;
    for (int64_t i = 0; i < s->n && st == TS_OK;) {
        if (s->ondev[i]) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < s->n && !s->ondev[j]) j++;
        st = stage_copy(p, s, (char *)ts__ptr(s->x) + (size_t)i * row, s->hx + i * p->numel, (size_t)(j - i) * row,
                        false);
        i = j;
    }
    if (st == TS_OK) st = stage_copy(p, s, ts__ptr(s->y), s->hy, sizeof(int64_t) * (size_t)s->n, true);
    if (st != TS_OK && s->pinned) /* copies queued before the failure have no marker: let them finish */
        p->o.device->ops->synchronize(p->o.device);
    return st;
}

/* Waits for s's pending upload (its staging may be written then). */
static ts_status upload_wait(ts_pipeline *p, slot *s) {
    if (!s->uploaded) return TS_OK;
    void *u = s->uploaded;
    s->uploaded = NULL;
    return p->o.device->ops->host_wait(p->o.device, u);
}

/* Whether someone besides the slot holds t or its memory (a retained handle, a view, a DLPack export). */
static bool tensor_shared(ts_tensor *t) {
    return atomic_load(&t->refcount) > 1 || atomic_load(&t->storage->refcount) > 1;
}

/* A slot whose batch the caller still holds gets new tensors (from the device's caching allocator), so a batch
 * handed out is never written again while it can be read. Called on the consumer's thread, with the pipeline's
 * own views released and the slot not being filled. */
static ts_status slot_unshare(ts_pipeline *p, slot *s) {
    if (!tensor_shared(s->x) && !tensor_shared(s->y)) return TS_OK;
    int64_t xs[4] = {p->B, p->C, p->H, p->W};
    ts_tensor *x = NULL, *y = NULL;
    TS_TRY(ts__new(p->o.device, TS_F32, 4, xs, &x));
    ts_status st = ts__new(p->o.device, TS_I64, 1, &p->B, &y);
    if (st != TS_OK) {
        ts_tensor_release(x);
        return st;
    }
    ts_tensor_release(s->x);
    ts_tensor_release(s->y);
    s->x = x;
    s->y = y;
    if (!p->staged) {
        s->hx = ts__f32(x);
        s->hy = ts__ptr(y);
    }
    return TS_OK;
}

/* ---- construction -------------------------------------------------------------------------------- */
static void release_views(ts_pipeline *p) {
    ts_tensor_release(p->vx);
    ts_tensor_release(p->vy);
    p->vx = p->vy = NULL;
}

void ts_pipeline_free(ts_pipeline *p) {
    if (!p) return;
    if (p->workers) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->nworkers; i++) {
            if (p->workers[i].started) pthread_join(p->workers[i].tid, NULL);
            if (p->ki) p->ki->decoder_free(p->workers[i].gdec);
            ts__decoder_free(p->workers[i].dec);
            free(p->workers[i].file);
            ts_image_free(&p->workers[i].img);
            ts__resample_ws_free(&p->workers[i].ws);
        }
        free(p->workers);
    }
    release_views(p);
    for (int i = 0; p->slots && i < p->nslots; i++) {
        slot *s = &p->slots[i];
        ts_status st = upload_wait(p, s); /* before the memory goes (the decoders were freed above: done) */
        ts_status w = s->written ? written_wait_rows(p, s, p->B) : TS_OK;
        if (st == TS_OK) st = w;
        if (st != TS_OK)
            ts_log(TS_LOG_WARN, "pipeline: waiting for the last copies to %s: %s", p->o.device->name, ts_last_error());
        if (s->released) p->o.device->ops->marker_free(p->o.device, s->released);
        ts_tensor_release(s->x);
        ts_tensor_release(s->y);
        if (s->pinned) {
            p->o.device->ops->host_free(p->o.device, s->hx);
            p->o.device->ops->host_free(p->o.device, s->hy);
        } else if (p->staged) {
            free(s->hx);
            free(s->hy);
        }
        free(s->smp);
        free(s->ok);
        free(s->ondev);
        free(s->written);
    }
    free(p->slots);
    free(p->held_idx);
    ts_reader_free(p->reader);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

ts_status ts_pipeline_new(const ts_pipeline_opts *opts, ts_pipeline **out) {
    TS_ARG(opts && out, "ts_pipeline_new: NULL argument");
    *out = NULL;
    const ts_pipeline_opts *o = opts;
    TS_ARG(o->batch_size >= 1 && o->batch_size <= (1 << 24), "ts_pipeline_new: batch_size %lld is out of range",
           (long long)o->batch_size);
    TS_ARG(o->num_threads >= 1 && o->num_threads <= 1024, "ts_pipeline_new: num_threads %d must be in [1, 1024]",
           o->num_threads);
    TS_ARG(o->prefetch_queue_depth >= 1 && o->prefetch_queue_depth <= 64,
           "ts_pipeline_new: prefetch_queue_depth %d must be in [1, 64]", o->prefetch_queue_depth);
    TS_ARG(o->color == TS_COLOR_GRAY || o->color == TS_COLOR_RGB, "ts_pipeline_new: color %d is not gray or RGB",
           (int)o->color);
    TS_ARG(o->out_width >= 1 && o->out_height >= 1 && o->out_width <= 65536 && o->out_height <= 65536,
           "ts_pipeline_new: output size %d x %d (set out_width and out_height)", o->out_width, o->out_height);
    TS_ARG(!o->random_resized_crop || (o->rrc_scale[0] > 0 && o->rrc_scale[0] <= o->rrc_scale[1] &&
                                       o->rrc_scale[1] <= 1 && o->rrc_ratio[0] > 0 &&
                                       o->rrc_ratio[0] <= o->rrc_ratio[1]),
           "ts_pipeline_new: random resized crop scale (%g, %g) / ratio (%g, %g) out of range", o->rrc_scale[0],
           o->rrc_scale[1], o->rrc_ratio[0], o->rrc_ratio[1]);
    TS_ARG(o->flip_prob >= 0 && o->flip_prob <= 1, "ts_pipeline_new: flip_prob %g is not in [0, 1]", o->flip_prob);
    TS_ARG(o->center_crop >= 0 && o->center_crop <= 1, "ts_pipeline_new: center_crop %g is not in [0, 1]",
           o->center_crop);
    TS_ARG(o->max_pixels >= 0, "ts_pipeline_new: max_pixels %lld is negative", (long long)o->max_pixels);
    TS_ARG(o->decode == TS_DECODE_CPU || o->decode == TS_DECODE_MIXED, "ts_pipeline_new: decode %d is not cpu or mixed",
           (int)o->decode);
    TS_ARG(ts_last_batch_name(o->last_batch), "ts_pipeline_new: last_batch %d is not partial, drop or fill",
           (int)o->last_batch);
    if (o->decode == TS_DECODE_MIXED) {
        const ts_device *d = o->device ? o->device : ts_device_cpu();
        TS_ARG(d->k_image && d->k_image->decoder_new,
               "ts_pipeline_new: decode \"mixed\" decodes on the batches' device, and %s has no image decoder "
               "(give a CUDA device, or decode \"cpu\")", d->name);
    }
    for (int c = 0; c < (int)o->color; c++)
        TS_ARG(o->std[c] != 0 && isfinite(o->std[c]) && isfinite(o->mean[c]), "ts_pipeline_new: bad mean %g / std %g",
               o->mean[c], o->std[c]);

    ts_pipeline *p = ts__calloc(1, sizeof *p);
    if (!p) return TS_ERR_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->o = *o;
    p->o.reader.batch_size = o->batch_size;
    if (o->last_batch == TS_LAST_BATCH_FILL) p->o.reader.pad_last_batch = true;
    if (!p->o.device) p->o.device = ts_device_cpu();
    p->held = -1;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(ts_reader_new(&p->o.reader, &p->reader));
    p->o.reader = *ts__reader_opts(p->reader); /* the reader's copies of the strings */
    p->C = (int)o->color;
    p->H = o->out_height;
    p->W = o->out_width;
    p->B = o->batch_size;
    p->numel = (int64_t)p->C * p->H * p->W;
    p->staged = !p->o.device->host_accessible;
    if (o->decode == TS_DECODE_MIXED) { /* one decoder now: a device that cannot decode says why, once */
        char why[512];
        if (ts_mixed_decode_available(p->o.device, why, sizeof why))
            p->ki = p->o.device->k_image;
        else
            ts_log(TS_LOG_WARN, "pipeline: decoding JPEGs on the CPU, not on %s: %s", p->o.device->name, why);
    }
    p->depth = o->prefetch_queue_depth;
    p->nslots = p->depth + 1;
    p->slots = ts__calloc((size_t)p->nslots, sizeof *p->slots);
    p->held_idx = ts__malloc(sizeof *p->held_idx * (size_t)p->B);
    if (!p->slots || !p->held_idx) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < p->nslots; i++) {
        slot *s = &p->slots[i];
        int64_t xs[4] = {p->B, p->C, p->H, p->W};
        TS_CHECK_GOTO(ts__new(p->o.device, TS_F32, 4, xs, &s->x));
        TS_CHECK_GOTO(ts__new(p->o.device, TS_I64, 1, &p->B, &s->y));
        s->smp = ts__malloc(sizeof *s->smp * (size_t)p->B);
        s->ok = ts__malloc((size_t)p->B);
        s->ondev = ts__calloc((size_t)p->B, 1);
        s->written = ts__calloc((size_t)p->B, sizeof *s->written);
        if (p->staged) { /* pinned where the device has it (the uploads do not wait), else pageable */
            const ts_device_ops *ops = p->o.device->ops;
            const size_t nx = sizeof(float) * (size_t)(p->B * p->numel), ny = sizeof(int64_t) * (size_t)p->B;
            if (ops->host_alloc && ops->copy_h2d_async && ops->host_wait) {
                s->hx = ops->host_alloc(p->o.device, nx);
                s->hy = s->hx ? ops->host_alloc(p->o.device, ny) : NULL;
                s->pinned = s->hx && s->hy;
                if (!s->pinned) {
                    if (s->hx) ops->host_free(p->o.device, s->hx);
                    s->hx = NULL;
                    s->hy = NULL;
                }
            }
            if (!s->pinned) {
                s->hx = ts__malloc(nx);
                s->hy = ts__malloc(ny);
            }
        } else {
            s->hx = ts__f32(s->x);
            s->hy = ts__ptr(s->y);
        }
        if (!s->smp || !s->ok || !s->ondev || !s->written || !s->hx || !s->hy) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
    }
    p->nworkers = o->num_threads;
    p->workers = ts__calloc((size_t)p->nworkers, sizeof *p->workers);
    if (!p->workers) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < p->nworkers; i++) {
        p->workers[i].p = p;
        TS_CHECK_GOTO(ts__decoder_new(&p->workers[i].dec));
        ts__decoder_set_max_pixels(p->workers[i].dec, o->max_pixels);
    }
    pthread_mutex_lock(&p->mu);
    plan_locked(p);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++) {
        int e = pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i]);
        if (e) {
            st = ts_error(TS_ERR_INTERNAL, "ts_pipeline_new: cannot start worker thread %d: %s", i, strerror(e));
            goto fail;
        }
        p->workers[i].started = true;
    }
    *out = p;
    return TS_OK;
fail:
    ts_pipeline_free(p);
    return st;
}

/* ---- the iterator ---------------------------------------------------------------------------------- */
static slot *find_seq(ts_pipeline *p, int64_t seq) {
    for (int i = 0; i < p->nslots; i++)
        if (p->slots[i].state != SLOT_FREE && p->slots[i].state != SLOT_HELD && p->slots[i].seq == seq)
            return &p->slots[i];
    return NULL;
}

ts_status ts_pipeline_next(ts_pipeline *p, ts_tensor **x, ts_tensor **y, ts_batch_info *info) {
    TS_ARG(p && x && y, "ts_pipeline_next: NULL argument");
    *x = *y = NULL;
    ts_batch_info tmp;
    if (!info) info = &tmp;
    memset(info, 0, sizeof *info);
    if (p->sticky != TS_OK) return ts_error(p->sticky, "%s", p->sticky_msg);
    release_views(p);
    if (p->held >= 0) { /* its staging and (mixed decoding) its device memory are written again */
        TS_TRY(upload_wait(p, &p->slots[p->held]));
        TS_TRY(slot_released(p, &p->slots[p->held]));
        TS_TRY(slot_unshare(p, &p->slots[p->held]));
    }
    pthread_mutex_lock(&p->mu);
    if (p->held >= 0) {
        p->slots[p->held].state = SLOT_FREE;
        p->held = -1;
        plan_locked(p);
    }
    for (;;) {
        if (p->epoch_end_pending) {
            p->epoch_end_pending = false;
            info->epoch = p->cur_epoch;
            info->batch = p->cur_batch;
            info->epoch_end = true;
            p->cur_epoch++;
            p->cur_batch = 0;
            pthread_mutex_unlock(&p->mu);
            return TS_OK;
        }
        slot *s;
        while (!(s = find_seq(p, p->take_seq)) || s->state != SLOT_READY) {
            if (!s) plan_locked(p); /* nothing planned yet (cannot happen with a free slot) */
            pthread_cond_wait(&p->done_cv, &p->mu);
        }
        p->take_seq++;
        p->cur_epoch = s->epoch;
        p->cur_batch = s->batch + !s->dropped;
        if (s->last) p->epoch_end_pending = true;
        if (s->err != TS_OK) {
            p->sticky = s->err;
            snprintf(p->sticky_msg, sizeof p->sticky_msg, "%s", s->errmsg);
            s->state = SLOT_FREE;
            pthread_mutex_unlock(&p->mu);
            return ts_error(p->sticky, "%s", p->sticky_msg);
        }
        if (s->n == 0) { /* every sample skipped, or a short last batch dropped */
            s->state = SLOT_FREE;
            plan_locked(p);
            continue;
        }
        s->state = SLOT_HELD;
        p->held = (int)(s - p->slots);
        plan_locked(p); /* prefetch_queue_depth batches ahead of the one held: the free slot starts filling */
        info->epoch = s->epoch;
        info->batch = s->batch;
        info->size = s->n;
        info->last = s->last;
        for (int64_t i = 0; i < s->n; i++) info->real += !s->smp[i].pad;
        info->skipped = s->skipped;
        break;
    }
    slot *s = &p->slots[p->held];
    for (int64_t i = 0; i < s->n; i++) p->held_idx[i] = s->smp[i].index;
    p->held_n = s->n;
    pthread_mutex_unlock(&p->mu);
    ts_status st = TS_OK;
    ts_tensor *bx = s->x, *by = s->y;
    if (s->n < p->B) {
        int64_t xs[4] = {s->n, p->C, p->H, p->W};
        if ((st = ts__view(s->x, 4, xs, &p->vx)) != TS_OK || (st = ts__view(s->y, 1, &s->n, &p->vy)) != TS_OK) {
            release_views(p);
            return st;
        }
        bx = p->vx;
        by = p->vy;
    }
    TS_TRY(written_wait_rows(p, s, s->n)); /* the device's rows, before they are read */
    if (p->staged) TS_TRY(upload(p, s));
    *x = bx;
    *y = by;
    return TS_OK;
}

ts_status ts_pipeline_seek(ts_pipeline *p, int64_t epoch, int64_t batch) {
    TS_ARG(p && epoch >= 0 && batch >= 0, "ts_pipeline_seek: bad position (epoch %lld, batch %lld)", (long long)epoch,
           (long long)batch);
    TS_ARG(batch <= ts_pipeline_num_batches(p, epoch), "ts_pipeline_seek: batch %lld is past the %lld batches of epoch %lld",
           (long long)batch, (long long)ts_pipeline_num_batches(p, epoch), (long long)epoch);
    release_views(p);
    ts_status st = TS_OK;
    for (int i = 0; i < p->nslots; i++) { /* the batch handed out last may still be on its way */
        ts_status u = upload_wait(p, &p->slots[i]);
        if (st == TS_OK) st = u;
    }
    pthread_mutex_lock(&p->mu);
    p->paused = true;
    while (p->in_flight > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    for (int i = 0; i < p->nslots; i++) { /* decodes still running write nowhere the new batches go */
        ts_status w = written_wait_rows(p, &p->slots[i], p->B), r = slot_released(p, &p->slots[i]);
        if (st == TS_OK) st = w != TS_OK ? w : r;
    }
    for (int i = 0; i < p->nslots; i++) {
        ts_status u = slot_unshare(p, &p->slots[i]); /* the batch the caller may still hold */
        if (st == TS_OK) st = u;
        p->slots[i].state = SLOT_FREE;
    }
    p->held = -1;
    ts_reader_reset(p->reader);
    bool last = false;
    int64_t e = 0, b = 0;
    while (e < epoch) { /* run the reader's order forward, batch by batch, without decoding */
        take_batch(p, e, b, NULL, &last);
        b = last ? 0 : b + 1;
        e += last;
    }
    p->epoch_end_pending = false;
    for (b = 0; b < batch; b++) {
        take_batch(p, epoch, b, NULL, &last);
        if (last) { /* positioned after the epoch's last batch: the next call reports its end */
            p->epoch_end_pending = true;
            b++;
            break;
        }
    }
    p->plan_epoch = p->epoch_end_pending ? epoch + 1 : epoch;
    p->plan_batch = p->epoch_end_pending ? 0 : b;
    p->cur_epoch = epoch;
    p->cur_batch = b;
    p->plan_seq = p->take_seq = 0;
    p->sticky = TS_OK;
    p->paused = false;
    plan_locked(p);
    pthread_mutex_unlock(&p->mu);
    return st;
}

int64_t ts_pipeline_num_batches(const ts_pipeline *p, int64_t epoch) {
    int64_t n = ts_reader_epoch_length(p->reader, epoch);
    return p->o.last_batch == TS_LAST_BATCH_DROP ? n / p->B : (n + p->B - 1) / p->B;
}

ts_status ts_pipeline_wait(ts_pipeline *p, double timeout_s, bool *ready) {
    TS_ARG(p && ready && timeout_s >= 0 && timeout_s <= 1e9, "ts_pipeline_wait: bad argument (timeout %g s)",
           timeout_s);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* done_cv's clock */
    double whole = floor(timeout_s);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    for (;;) {
        slot *s = find_seq(p, p->take_seq);
        if (!s && !p->epoch_end_pending) plan_locked(p); /* as ts_pipeline_next does */
        *ready = p->sticky != TS_OK || p->epoch_end_pending || (s && s->state == SLOT_READY);
        if (*ready || pthread_cond_timedwait(&p->done_cv, &p->mu, &until) == ETIMEDOUT) break;
    }
    if (!*ready) { /* the last look, after the timeout */
        slot *s = find_seq(p, p->take_seq);
        *ready = p->sticky != TS_OK || p->epoch_end_pending || (s && s->state == SLOT_READY);
    }
    pthread_mutex_unlock(&p->mu);
    return TS_OK;
}
int64_t ts_pipeline_epoch(const ts_pipeline *p) { return p->cur_epoch; }

const int64_t *ts_pipeline_batch_samples(const ts_pipeline *p, int64_t *n) {
    if (n) *n = p && p->held >= 0 ? p->held_n : 0;
    return p && p->held >= 0 ? p->held_idx : NULL;
}

int ts_pipeline_sample_shape(const ts_pipeline *p, int64_t *shape) {
    if (!p || !shape) return 0;
    shape[0] = p->C;
    shape[1] = p->H;
    shape[2] = p->W;
    return 3;
}
int64_t ts_pipeline_batch_index(const ts_pipeline *p) { return p->cur_batch; }
const ts_reader *ts_pipeline_reader(const ts_pipeline *p) { return p->reader; }

void ts_pipeline_counts(const ts_pipeline *p, int64_t *decoded, int64_t *skipped) {
    ts_pipeline *q = (ts_pipeline *)p;
    pthread_mutex_lock(&q->mu);
    if (decoded) *decoded = q->decoded;
    if (skipped) *skipped = q->skipped;
    pthread_mutex_unlock(&q->mu);
}

/* ---- a decoded evaluation set ------------------------------------------------------------------- */
ts_status ts_dataset_load_images(const ts_pipeline_opts *opts, ts_dataset **out) {
    TS_ARG(opts && out, "ts_dataset_load_images: NULL argument");
    *out = NULL;
    ts_pipeline_opts o = *opts;
    o.reader.random_shuffle = o.reader.shuffle_after_epoch = o.reader.pad_last_batch = false;
    o.random_resized_crop = false;
    o.flip_prob = 0;
    o.device = NULL;
    o.decode = TS_DECODE_CPU; /* the data set lives in host memory */
    if (o.batch_size < 256) o.batch_size = 256;
    ts_pipeline *p = NULL;
    TS_TRY(ts_pipeline_new(&o, &p));
    int64_t cap = ts_reader_shard_size(p->reader, 0), n = 0;
    float *hx = ts__malloc(sizeof(float) * (size_t)(cap * p->numel));
    int64_t *hy = ts__malloc(sizeof(int64_t) * (size_t)cap);
    ts_status st = hx && hy ? TS_OK : TS_ERR_NOMEM;
    while (st == TS_OK) {
        ts_tensor *x, *y;
        ts_batch_info bi;
        if ((st = ts_pipeline_next(p, &x, &y, &bi)) != TS_OK || !x) break;
        if (n + bi.size > cap) {
            st = ts_error(TS_ERR_INTERNAL, "ts_dataset_load_images: more samples than the shard holds");
            break;
        }
        memcpy(hx + n * p->numel, ts__f32(x), sizeof(float) * (size_t)(bi.size * p->numel));
        memcpy(hy + n, ts__ptr(y), sizeof(int64_t) * (size_t)bi.size);
        n += bi.size;
    }
    ts_tensor *tx = NULL, *ty = NULL;
    if (st == TS_OK && n == 0) st = ts_error(TS_ERR_FORMAT, "ts_dataset_load_images: every image was skipped as corrupt");
    if (st == TS_OK) {
        int64_t xs[4] = {n, p->C, p->H, p->W};
        st = ts_tensor_from_data(NULL, TS_F32, 4, xs, hx, &tx);
        if (st == TS_OK) st = ts_tensor_from_data(NULL, TS_I64, 1, &n, hy, &ty);
        if (st == TS_OK) st = ts_dataset_from_tensors(tx, ty, out);
    }
    ts_tensor_release(tx);
    ts_tensor_release(ty);
    free(hx);
    free(hy);
    ts_pipeline_free(p);
    return st;
}

/* ---- option names -------------------------------------------------------------------------------- */
/* names[v] is value v's name (NULL: no such value); what names the option in messages. */
static ts_status parse_name(const char *what, const char *const *names, int n, const char *s, int *out) {
    for (int v = 0; s && v < n; v++)
        if (names[v] && strcmp(s, names[v]) == 0) {
            *out = v;
            return TS_OK;
        }
    char list[128];
    ts__name_list(names, n, list, sizeof list);
    return ts_error(TS_ERR_INVALID_ARG, "%s '%s': expected %s", what, s ? s : "(null)", list);
}

static const char *const decode_names[] = {[TS_DECODE_CPU] = "cpu", [TS_DECODE_MIXED] = "mixed"};
static const char *const shuffle_names[] = {[TS_SHUFFLE_NONE] = "none", [TS_SHUFFLE_BUFFER] = "buffer",
                                            [TS_SHUFFLE_EPOCH] = "epoch"};
static const char *const last_batch_names[] = {[TS_LAST_BATCH_PARTIAL] = "partial", [TS_LAST_BATCH_DROP] = "drop",
                                               [TS_LAST_BATCH_FILL] = "fill"};
static const char *const color_names[] = {[TS_COLOR_GRAY] = "gray", [TS_COLOR_RGB] = "rgb"};
#define NAME_OF(names, v) ((int)(v) >= 0 && (size_t)(v) < TS_ARRAY_LEN(names) ? names[v] : NULL)

ts_status ts_decode_device_parse(const char *s, ts_decode_device *out) {
    TS_ARG(out, "ts_decode_device_parse: NULL argument");
    int v = 0;
    TS_TRY(parse_name("decode device", decode_names, (int)TS_ARRAY_LEN(decode_names), s, &v));
    *out = (ts_decode_device)v;
    return TS_OK;
}
const char *ts_decode_device_name(ts_decode_device d) { return NAME_OF(decode_names, d); }

ts_status ts_shuffle_parse(const char *s, ts_shuffle *out) {
    TS_ARG(out, "ts_shuffle_parse: NULL argument");
    int v = 0;
    TS_TRY(parse_name("shuffle", shuffle_names, (int)TS_ARRAY_LEN(shuffle_names), s, &v));
    *out = (ts_shuffle)v;
    return TS_OK;
}
const char *ts_shuffle_name(ts_shuffle s) { return NAME_OF(shuffle_names, s); }

void ts_reader_opts_set_shuffle(ts_reader_opts *o, ts_shuffle s) {
    o->random_shuffle = s == TS_SHUFFLE_BUFFER;
    o->shuffle_after_epoch = s == TS_SHUFFLE_EPOCH;
}

ts_status ts_last_batch_parse(const char *s, ts_last_batch *out) {
    TS_ARG(out, "ts_last_batch_parse: NULL argument");
    int v = 0;
    TS_TRY(parse_name("last batch", last_batch_names, (int)TS_ARRAY_LEN(last_batch_names), s, &v));
    *out = (ts_last_batch)v;
    return TS_OK;
}
const char *ts_last_batch_name(ts_last_batch b) { return NAME_OF(last_batch_names, b); }

ts_status ts_color_parse(const char *s, ts_color *out) {
    TS_ARG(out, "ts_color_parse: NULL argument");
    int v = 0;
    TS_TRY(parse_name("color", color_names, (int)TS_ARRAY_LEN(color_names), s, &v));
    *out = (ts_color)v;
    return TS_OK;
}
const char *ts_color_name(ts_color c) { return NAME_OF(color_names, c); }

bool ts_mixed_decode_available(ts_device *d, char *why, size_t why_len) {
    const char *reason = NULL;
    char buf[512];
    ts_image_decoder *probe = NULL;
    if (!d) {
        reason = "no device";
    } else if (!d->k_image || !d->k_image->decoder_new) {
        snprintf(buf, sizeof buf, "%s has no image decoder", d->name);
        reason = buf;
    } else if (d->k_image->decoder_new(d, &probe) != TS_OK) {
        snprintf(buf, sizeof buf, "%s", ts_last_error());
        reason = buf;
    } else {
        d->k_image->decoder_free(probe);
    }
    if (why && why_len) snprintf(why, why_len, "%s", reason ? reason : "");
    return !reason;
}
