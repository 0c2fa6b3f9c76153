/*
 * tools/cmd_bench_loader.c — `tessera bench loader DIR`: images/s of the input
 * pipeline (read + decode + random resized crop + flip + normalise into NCHW
 * batches, T worker threads) beside the raw decode speed of libjpeg-turbo
 * alone (tjDecompress2 of the same files, already in memory, full size, T
 * threads). The Tessera half of bench/loader_vs_torchvision.sh.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

static double cpu_seconds(void);

typedef struct raw_job {
    const ts_reader *reader; /* with_read: read each file (page cache) before decoding it */
    bool with_read;
    uint8_t **bufs;
    size_t *lens;
    int64_t nfiles;
    int tid, nthreads, color;
    double seconds;
    int64_t decoded;
    int failed;
    char err[256];
} raw_job;

/* Decodes files tid, tid + T, ... over and over until `seconds` have passed. */
static void *raw_decode(void *arg) {
    raw_job *j = arg;
    tjhandle tj = tjInitDecompress();
    ts_image im = TS_IMAGE_INIT;
    uint8_t *fbuf = NULL;
    size_t fcap = 0;
    if (!tj) {
        j->failed = 1;
        return NULL;
    }
    double t0 = ts_time_now();
    for (int64_t i = j->tid; !j->failed; i += j->nthreads) {
        int64_t k = i % j->nfiles;
        const uint8_t *b = j->bufs[k];
        size_t len = j->lens[k];
        if (j->with_read) { /* open, read, close: what any loader pays per file */
            /* O_NONBLOCK + fstat: a file replaced by a FIFO since it was read fails instead of blocking */
            int fd = open(ts_reader_path(j->reader, k), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            struct stat sb;
            if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                snprintf(j->err, sizeof j->err, "cannot open %s: %s", ts_reader_path(j->reader, k),
                         fd < 0 ? strerror(errno) : "no longer a regular file");
                if (fd >= 0) close(fd);
                j->failed = 1;
                break;
            }
            if (fcap < j->lens[k] + 1) {
                free(fbuf);
                fcap = 2 * j->lens[k] + 1;
                fbuf = malloc(fcap);
            }
            ssize_t got = fbuf ? read(fd, fbuf, fcap) : 0;
            len = got > 0 ? (size_t)got : 0;
            close(fd);
            b = fbuf;
        }
        if (len >= 3 && b[0] == 0xff && b[1] == 0xd8) {
            int w, h, sub, cs;
            if (tjDecompressHeader3(tj, b, (unsigned long)len, &w, &h, &sub, &cs) != 0 ||
                ts_image_alloc(&im, w, h, j->color) != TS_OK ||
                tjDecompress2(tj, b, (unsigned long)len, im.data, w, 0, h,
                              j->color == 3 ? TJPF_RGB : TJPF_GRAY, 0) != 0) {
                snprintf(j->err, sizeof j->err, "%s", tjGetErrorStr2(tj));
                j->failed = 1;
            }
        } else if (ts_image_decode(b, len, (ts_color)j->color, "file", &im) != TS_OK) { /* PNG: libspng */
            snprintf(j->err, sizeof j->err, "%s", ts_last_error());
            j->failed = 1;
        }
        j->decoded++;
        if ((j->decoded & 7) == 0 && ts_time_now() - t0 >= j->seconds) break;
    }
    ts_image_free(&im);
    free(fbuf);
    tjDestroy(tj);
    return NULL;
}

/* Raw decoding with T threads for about `seconds`: images/s (wall) and per CPU-second. */
static int raw_run(raw_job *jobs, pthread_t *tids, int64_t threads, bool with_read, double *ips, double *cpu_ips) {
    for (int t = 0; t < threads; t++) {
        jobs[t].with_read = with_read;
        jobs[t].decoded = 0;
    }
    double t0 = ts_time_now(), c0 = cpu_seconds();
    for (int t = 0; t < threads; t++) pthread_create(&tids[t], NULL, raw_decode, &jobs[t]);
    int64_t total = 0;
    int ok = 1;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        total += jobs[t].decoded;
        if (jobs[t].failed) {
            fprintf(stderr, "tessera bench loader: raw decode failed: %s\n", jobs[t].err);
            ok = 0;
        }
    }
    *ips = (double)total / (ts_time_now() - t0);
    *cpu_ips = (double)total / (cpu_seconds() - c0);
    return ok;
}

/* CPU seconds this process has used (all threads, user + system). */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

/* A listed image file, whole: the library's checked reader (regular files only, never a FIFO, at most 1 GiB). */
static int read_all(const char *path, uint8_t **buf, size_t *n) {
    char *b = NULL;
    if (ts_read_file(path, "an image file", (uint64_t)1 << 30, &b, n) != TS_OK) return -1;
    *buf = (uint8_t *)b;
    return 0;
}

typedef struct loader_args {
    int64_t threads, batch, size, max_files;
    double seconds;
    bool gray, json, no_scaled, no_raw;
    const char *decode, *device, *path;
    ts_decode_device dec;
    ts_device *dev;
} loader_args;

static int loader_flags(int argc, char **argv, loader_args *a) {
    const cli_flag flags[] = {
        {"data-threads", CLI_INT, &a->threads, "pipeline worker threads (and raw decode threads)", 1, 1024},
        {"batch-size", CLI_INT, &a->batch, "images per batch", 1, 1 << 16},
        {"image-size", CLI_INT, &a->size, "output side (random resized crop to N x N)", 1, 4096},
        {"seconds", CLI_FLOAT, &a->seconds, "time each measurement for about this long", 0.1, 3600},
        {"max-files", CLI_INT, &a->max_files, "files held in memory for the raw decode", 1, 1e7},
        {"gray", CLI_BOOL, &a->gray, "decode to gray (1 channel)", 1, 0},
        {"no-scaled-decode", CLI_BOOL, &a->no_scaled, "always decode JPEGs at full size", 1, 0},
        {"no-raw", CLI_BOOL, &a->no_raw, "skip the raw decode measurement", 1, 0},
        {"device", CLI_STRING, &a->device, "where the batches land: cpu or cuda:N", 1, 0},
        {"decode", CLI_STRING, &a->decode, "cpu (the worker threads decode) or mixed (nvJPEG on --device: DALI's \"mixed\")", 1, 0},
        {"json", CLI_BOOL, &a->json, "print one JSON object", 1, 0},
        {"threads", CLI_INT, &a->threads, NULL, 1, 1024}, /* the old spellings */
        {"size", CLI_INT, &a->size, NULL, 1, 4096},
    };
    const cli_command cmd = {
        "bench loader", "tessera bench loader DIR|LIST [flags]",
        "Times the input pipeline (read, decode, random resized crop, flip, normalise into NCHW\n"
        "float batches) with T worker threads, and raw libjpeg-turbo decoding (tjDecompress2, full size,\n"
        "files already in memory) with T threads on the same files. DIR has one sub-folder per class.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    const char *pos[2];
    int npos = 0;
    int rc = cli_parse(&cmd, argc, argv, pos, 2, &npos);
    if (rc) return rc;
    if (npos != 1) return cli_usage_error(&cmd, "expected one folder or file list");
    a->path = pos[0];
    if (ts_decode_device_parse(a->decode, &a->dec) != TS_OK) return cli_usage_error(&cmd, "--decode: %s", ts_last_error());
    if (ts_device_get(a->device, &a->dev) != TS_OK) return cli_usage_error(&cmd, "--device: %s", ts_last_error());
    return 0;
}

/* The pipeline benchmarked: random resized crop + flip + ImageNet's normalisation, shuffled. */
static void loader_opts(const loader_args *a, ts_pipeline_opts *o, char *rootbuf, size_t n) {
    *o = TS_PIPELINE_OPTS_INIT;
    ts_data_reader_opts(a->path, "train", &o->reader, rootbuf, n);
    o->batch_size = a->batch;
    o->num_threads = (int)a->threads;
    o->color = a->gray ? TS_COLOR_GRAY : TS_COLOR_RGB;
    o->out_width = o->out_height = (int)a->size;
    o->random_resized_crop = true;
    o->flip_prob = 0.5f;
    o->jpeg_scaled_decode = !a->no_scaled;
    o->device = a->dev;
    o->decode = a->dec;
    const float mean[3] = {0.485f * 255, 0.456f * 255, 0.406f * 255}, std[3] = {0.229f * 255, 0.224f * 255, 0.225f * 255};
    memcpy(o->mean, mean, sizeof mean);
    memcpy(o->std, std, sizeof std);
    o->reader.random_shuffle = true; /* as the DataLoader's shuffle=True beside it */
}

/* Raw decoding of up to max_files of r's files held in memory: rates[0..3] = in memory (wall, CPU), read +
 * decode (wall, CPU). Returns 0, or 1 after printing why. */
static int time_raw(const loader_args *a, ts_reader *r, double *rates) {
    int64_t nfiles = ts_reader_size(r), nraw = nfiles < a->max_files ? nfiles : a->max_files;
    int64_t threads = a->threads;
    uint8_t **bufs = calloc((size_t)nraw, sizeof *bufs);
    size_t *lens = calloc((size_t)nraw, sizeof *lens);
    raw_job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    int ok = bufs && lens && jobs && tids;
    for (int64_t i = 0; ok && i < nraw; i++)
        if (read_all(ts_reader_path(r, i), &bufs[i], &lens[i]) != 0) {
            fprintf(stderr, "tessera bench loader: %s\n", ts_last_error());
            ok = 0;
        }
    if (ok) {
        for (int t = 0; t < threads; t++)
            jobs[t] = (raw_job){r, false, bufs, lens, nraw, t, (int)threads, a->gray ? 1 : 3, a->seconds, 0, 0, ""};
        /* warm up: one pass over a few files per thread */
        raw_job warm = jobs[0];
        warm.seconds = 0.3;
        warm.nthreads = 1;
        raw_decode(&warm);
        ok = raw_run(jobs, tids, threads, false, &rates[0], &rates[1]) &&
             raw_run(jobs, tids, threads, true, &rates[2], &rates[3]);
    }
    for (int64_t i = 0; bufs && i < nraw; i++) free(bufs[i]);
    free(bufs);
    free(lens);
    free(jobs);
    free(tids);
    return ok ? 0 : 1;
}

/* The pipeline for about a->seconds after one untimed batch: rates[0..1] = images per wall and CPU second. */
static int time_pipeline(const loader_args *a, const ts_pipeline_opts *o, double *rates, int64_t *batches, double *dt) {
    ts_pipeline *p = NULL;
    if (ts_pipeline_new(o, &p) != TS_OK) {
        fprintf(stderr, "tessera bench loader: %s\n", ts_last_error());
        return 1;
    }
    ts_tensor *x, *y;
    ts_batch_info bi;
    int status = ts_pipeline_next(p, &x, &y, &bi) != TS_OK; /* warm-up batch, not timed */
    int64_t images = 0;
    *batches = 0;
    double t0 = ts_time_now(), c0 = cpu_seconds();
    while (status == 0 && ts_time_now() - t0 < a->seconds) {
        if (ts_pipeline_next(p, &x, &y, &bi) != TS_OK) {
            status = 1;
            break;
        }
        if (!x) continue;
        images += bi.size;
        ++*batches;
    }
    if (status == 0 && ts_device_synchronize(a->dev) != TS_OK) status = 1; /* the device's decoding is done */
    *dt = ts_time_now() - t0;
    double cpu = cpu_seconds() - c0;
    if (status) fprintf(stderr, "tessera bench loader: %s\n", ts_last_error());
    ts_pipeline_free(p);
    rates[0] = (double)images / *dt;
    rates[1] = (double)images / cpu;
    return status;
}

/* raw: in memory (wall, CPU), read + decode (wall, CPU); pl: the pipeline's (wall, CPU). */
static void print_loader(const loader_args *a, int64_t nfiles, const double *raw, const double *pl, int64_t batches,
                         double dt) {
    int color = a->gray ? 1 : 3;
    bool mixed = a->dec == TS_DECODE_MIXED;
    if (a->json) {
        printf("{\"framework\": \"tessera\", \"decode\": \"%s\", \"device\": \"%s\", \"threads\": %lld, \"files\": %lld, "
               "\"batch_size\": %lld, \"size\": %lld, "
               "\"channels\": %d, \"scaled_decode\": %s, \"images_per_second\": %.1f, "
               "\"raw_decode_images_per_second\": %.1f, \"images_per_cpu_second\": %.1f, "
               "\"raw_decode_images_per_cpu_second\": %.1f, \"raw_read_decode_images_per_second\": %.1f, "
               "\"raw_read_decode_images_per_cpu_second\": %.1f, \"batches\": %lld, \"seconds\": %.3f}\n",
               a->decode, ts_device_name(a->dev), (long long)a->threads, (long long)nfiles, (long long)a->batch,
               (long long)a->size, color, a->no_scaled || mixed ? "false" : "true", pl[0], raw[0], pl[1], raw[1],
               raw[2], raw[3], (long long)batches, dt);
        return;
    }
    printf("%s: %lld files, output %dx%lldx%lld, batch %lld, random resized crop + flip + normalize%s%s%s\n", a->path,
           (long long)nfiles, color, (long long)a->size, (long long)a->size, (long long)a->batch,
           a->no_scaled && !mixed ? ", full-size decode" : "", mixed ? ", decoded by nvJPEG on " : "",
           mixed ? ts_device_name(a->dev) : "");
    printf("                 raw decode (in memory)   raw read + decode   pipeline (read + decode + augment)\n");
    printf("img/s (wall)     %22.0f   %17.0f   %17.0f (%.2f, %.2f of raw)\n", raw[0], raw[2], pl[0],
           raw[0] > 0 ? pl[0] / raw[0] : 0.0, raw[2] > 0 ? pl[0] / raw[2] : 0.0);
    printf("img/CPU-second   %22.0f   %17.0f   %17.0f (%.2f, %.2f of raw)\n", raw[1], raw[3], pl[1],
           raw[1] > 0 ? pl[1] / raw[1] : 0.0, raw[3] > 0 ? pl[1] / raw[3] : 0.0);
    printf("(%lld threads; img/CPU-second is the per-thread rate, unaffected by other load on the machine)\n",
           (long long)a->threads);
}

int ts_bench_loader(int argc, char **argv) {
    loader_args a = {.threads = 1, .batch = 64, .size = 224, .max_files = 2000, .seconds = 4.0, .decode = "cpu",
                     .device = "cpu"};
    int rc = loader_flags(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    char rootbuf[4096];
    ts_pipeline_opts o;
    loader_opts(&a, &o, rootbuf, sizeof rootbuf);
    ts_reader *r = NULL;
    if (ts_reader_new(&o.reader, &r) != TS_OK) {
        fprintf(stderr, "tessera bench loader: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    int64_t nfiles = ts_reader_size(r), batches = 0;
    double raw[4] = {0, 0, 0, 0}, pl[2] = {0, 0}, dt = 0;
    rc = a.no_raw ? 0 : time_raw(&a, r, raw);
    ts_reader_free(r);
    if (rc == 0) rc = time_pipeline(&a, &o, pl, &batches, &dt);
    if (rc == 0) print_loader(&a, nfiles, raw, pl, batches, dt);
    return rc;
}
