/*
 * tests/test_cuda_host.c — the CUDA backend's host-side logic, on any machine:
 * the caching allocator's bins, reuse, limit, empty_cache and out-of-memory
 * retry (device/cache_alloc.h, over a malloc that can be told to fail), and the
 * registry's answers for cuda:N names (malformed names, no GPU, beyond the count),
 * and the run-time loading of nvJPEG (CUDA builds).
 */
#include "device/cache_alloc.h"
#include "device/k_image.h"
#include "test_util.h"

#include <dlfcn.h>
#include <sys/stat.h>

typedef struct fake_raw {
    int live, fail_next; /* fail_next > 0: that many allocations fail (out of memory) */
    size_t budget, used; /* budget > 0: allocations beyond it fail */
} fake_raw;

static void *fake_alloc(void *ctx, size_t n) {
    fake_raw *f = ctx;
    if (f->fail_next > 0) {
        f->fail_next--;
        return NULL;
    }
    if (f->budget && f->used + n > f->budget) return NULL;
    void *p = malloc(n + sizeof(size_t));
    if (!p) return NULL;
    *(size_t *)p = n;
    f->used += n;
    f->live++;
    return (char *)p + sizeof(size_t);
}

static void fake_free(void *ctx, void *p) {
    fake_raw *f = ctx;
    char *b = (char *)p - sizeof(size_t);
    f->used -= *(size_t *)b;
    f->live--;
    free(b);
}

static void test_bins(void) {
    CHECK(ts__cache_bin(0) == 512);
    CHECK(ts__cache_bin(1) == 512);
    CHECK(ts__cache_bin(512) == 512);
    CHECK(ts__cache_bin(513) == 1024);
    CHECK(ts__cache_bin(1 << 20) == 1 << 20);
    CHECK(ts__cache_bin((1 << 20) + 1) == (1 << 20) + (1 << 17)); /* eighths of 1 MiB above 1 MiB */
    CHECK(ts__cache_bin(3000000) == 3145728);                     /* 3 MiB: 24 eighths of 1 MiB... */
    /* every bin holds its request and wastes at most 1/8 above 1 MiB, 511 bytes below */
    for (size_t n = 1; n < ((size_t)64 << 20); n = n * 3 / 2 + 7) {
        size_t b = ts__cache_bin(n);
        CHECK(b >= n);
        CHECK(b == ts__cache_bin(b)); /* a bin size is its own bin */
        CHECK(n <= (1 << 20) ? b - n < 512 : (double)(b - n) <= (double)n / 8);
    }
}

static void test_reuse_and_stats(void) {
    fake_raw f = {0};
    ts__cache_alloc c;
    ts__cache_init(&c, fake_alloc, fake_free, &f, SIZE_MAX);
    void *a = ts__cache_get(&c, 1000), *b = ts__cache_get(&c, 1000);
    CHECK(a && b && a != b);
    ts__cache_stats s = ts__cache_get_stats(&c);
    CHECK(s.reserved == 2048 && s.cached == 0 && s.raw_allocs == 2);
    ts__cache_put(&c, a, 1000);
    s = ts__cache_get_stats(&c);
    CHECK(s.cached == 1024 && s.reserved == 2048);
    void *a2 = ts__cache_get(&c, 900); /* same bin (1024): the cached block comes back */
    CHECK(a2 == a);
    void *d = ts__cache_get(&c, 2000); /* another bin: a new raw allocation */
    s = ts__cache_get_stats(&c);
    CHECK(d && s.hits == 1 && s.raw_allocs == 3 && s.reserved == 4096 && s.peak_reserved == 4096);
    ts__cache_put(&c, a2, 900);
    ts__cache_put(&c, b, 1000);
    ts__cache_put(&c, d, 2000);
    CHECK(f.live == 3);
    ts__cache_empty(&c);
    s = ts__cache_get_stats(&c);
    CHECK(f.live == 0 && s.reserved == 0 && s.cached == 0 && s.peak_reserved == 4096);
}

static void test_limit(void) {
    fake_raw f = {0};
    ts__cache_alloc c;
    ts__cache_init(&c, fake_alloc, fake_free, &f, 1536); /* room for one 1 KiB block and one 512 B block */
    void *p[4];
    for (int i = 0; i < 4; i++) p[i] = ts__cache_get(&c, 1024);
    for (int i = 0; i < 4; i++) ts__cache_put(&c, p[i], 1024);
    ts__cache_stats s = ts__cache_get_stats(&c);
    CHECK(s.cached == 1024 && f.live == 1 && s.raw_frees == 3);
    ts__cache_alloc off;
    ts__cache_init(&off, fake_alloc, fake_free, &f, 0); /* limit 0: no caching at all */
    void *q = ts__cache_get(&off, 10);
    ts__cache_put(&off, q, 10);
    CHECK(ts__cache_get_stats(&off).cached == 0 && f.live == 1);
    ts__cache_empty(&c);
    CHECK(f.live == 0);
}

/* When the raw allocator is out of memory, the cache is emptied and the request tried once more. */
static void test_oom_retry(void) {
    fake_raw f = {0};
    f.budget = 4096;
    ts__cache_alloc c;
    ts__cache_init(&c, fake_alloc, fake_free, &f, SIZE_MAX);
    void *a = ts__cache_get(&c, 2048), *b = ts__cache_get(&c, 2048);
    CHECK(a && b);
    ts__cache_put(&c, a, 2048);
    ts__cache_put(&c, b, 2048);
    void *big = ts__cache_get(&c, 4096); /* fails raw, succeeds after the two cached blocks go back */
    ts__cache_stats s = ts__cache_get_stats(&c);
    CHECK(big != NULL && s.retries == 1 && s.cached == 0 && f.live == 1);
    void *none = ts__cache_get(&c, 4096); /* nothing cached to give back: NULL */
    CHECK(none == NULL);
    ts__cache_put(&c, big, 4096);
    f.fail_next = 1; /* a transient failure with a cached block of another bin: retried */
    void *x = ts__cache_get(&c, 100);
    CHECK(x != NULL && ts__cache_get_stats(&c).retries == 2);
    ts__cache_put(&c, x, 100);
    ts__cache_empty(&c);
    CHECK(f.live == 0 && f.used == 0);
}

/* Why there is no GPU, in words that say what is true: never the runtime's "driver version is insufficient"
 * when there is no driver at all. Without libcuda.so.1: "no NVIDIA GPU driver found"; with a driver older
 * than the runtime (tests/fake_libcuda.c, a driver supporting CUDA 11.8, through LD_LIBRARY_PATH and
 * TS_TEST_FAKE_DRIVER=1): both versions. */
static void check_no_gpu_wording(const char *why) {
#ifdef TS_HAVE_CUDA
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    const char *fake = getenv("TS_TEST_FAKE_DRIVER");
    if (fake && *fake) {
        CHECK(h != NULL);
        CHECK(strstr(why, "the NVIDIA driver is older than this Tessera's CUDA runtime needs: the driver supports "
                          "CUDA 11.8, the runtime is CUDA ") != NULL);
    } else if (!h) {
        CHECK(strstr(why, "no NVIDIA GPU driver found (libcuda.so.1: ") != NULL);
    }
    CHECK(strstr(why, "insufficient") == NULL);
    if (h) dlclose(h);
#else
    CHECK(strstr(why, "built without CUDA") != NULL);
#endif
}

/* Device names: malformed ones are refused naming the form; without a GPU (or without CUDA in the build)
 * cuda:N says why; with GPUs, an index past the count says how many there are. */
static void test_cuda_names(void) {
    ts_device *d = NULL;
    CHECK_STATUS(ts_device_get("cuda:x", &d), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("malformed");
    CHECK_STATUS(ts_device_get("cuda:-1", &d), TS_ERR_DEVICE);
    CHECK_STATUS(ts_device_get("cuda:", &d), TS_ERR_DEVICE);
    char why[256];
    int n = ts_cuda_device_count(why, sizeof why);
    if (n == 0) {
        printf("no CUDA devices here: %s\n", why);
        CHECK(why[0] != 0);
        check_no_gpu_wording(why);
        CHECK_STATUS(ts_device_get("cuda:0", &d), TS_ERR_DEVICE);
        CHECK_ERR_MENTIONS("cuda:0");
        CHECK_STATUS(ts_device_get("cuda", &d), TS_ERR_DEVICE);
    } else {
        printf("%d CUDA device(s)\n", n);
        CHECK(why[0] == 0);
        CHECK_OK(ts_device_get("cuda", &d));
        ts_device *d0 = NULL;
        CHECK_OK(ts_device_get("cuda:0", &d0));
        CHECK(d == d0 && ts_device_type_of(d) == TS_DEVICE_CUDA);
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", n);
        CHECK_STATUS(ts_device_get(name, &d), TS_ERR_DEVICE);
        CHECK_ERR_MENTIONS("CUDA device");
    }
    char line[256];
    ts_device_describe(ts_device_cpu(), line, sizeof line);
    CHECK(strstr(line, "host CPU") != NULL);
}

/* nvJPEG (mixed decoding) is loaded at run time: TS_NVJPEG_LIB naming a library file must load and give
 * every function ops/cuda/image.c calls (tests/nvjpeg_api.sh points it at NVIDIA's nvidia-nvjpeg package);
 * any other value is refused naming it (make test sets a path that does not exist). CUDA builds only. */
static void test_nvjpeg_loader(void) {
#ifdef TS_HAVE_CUDA
    const char *lib = getenv("TS_NVJPEG_LIB");
    struct stat sb;
    if (lib && *lib && stat(lib, &sb) == 0) {
        ts_status st = ts__nvjpeg_load();
        if (st != TS_OK) fprintf(stderr, "loading %s: %s\n", lib, ts_last_error());
        CHECK(st == TS_OK);
        printf("nvJPEG loaded from %s\n", lib);
    } else if (lib && *lib) {
        CHECK_STATUS(ts__nvjpeg_load(), TS_ERR_UNSUPPORTED);
        CHECK_ERR_MENTIONS(lib);
        CHECK_ERR_MENTIONS("set TS_NVJPEG_LIB to libnvjpeg.so.13");
        printf("without nvJPEG: %s\n", ts_last_error());
    } else {
        printf("SKIP part: TS_NVJPEG_LIB unset\n");
    }
#else
    printf("SKIP part: a build without CUDA\n");
#endif
}

TU_MAIN(T(test_bins), T(test_reuse_and_stats), T(test_limit), T(test_oom_retry), T(test_cuda_names),
        T(test_nvjpeg_loader))
