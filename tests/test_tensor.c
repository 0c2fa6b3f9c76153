/* Tensors, storage, devices, RNG, status codes. */
#include "test_util.h"

static void test_create_and_copy(void) {
    int64_t shape[2] = {2, 3};
    float data[6] = {1, 2, 3, 4, 5, 6};
    ts_tensor *t = tu_tensor(2, shape, data);
    CHECK(ts_tensor_ndim(t) == 2);
    CHECK(ts_tensor_numel(t) == 6);
    CHECK(ts_tensor_dim(t, -1) == 3);
    CHECK(ts_tensor_is_contiguous(t));
    CHECK(ts_tensor_device(t) == ts_device_cpu());
    float back[6];
    CHECK_OK(ts_tensor_to_host(t, back, sizeof back));
    CHECK(memcmp(back, data, sizeof data) == 0);
    CHECK_STATUS(ts_tensor_to_host(t, back, 5), TS_ERR_INVALID_ARG);
    ts_tensor *c = NULL;
    CHECK_OK(ts_tensor_clone(t, &c));
    ts_tensor_data_f32(c)[0] = 42;
    CHECK(ts_tensor_data_f32(t)[0] == 1); /* clone owns its storage */
    CHECK_NEAR(ts_tensor_item(c, 0), 42, 0);
    ts_tensor_release(c);
    ts_tensor_release(t);
}

static void test_zeros_full_fill(void) {
    ts_tensor *z = NULL, *f = NULL;
    int64_t shape[3] = {4, 5, 6};
    CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 3, shape, &z));
    CHECK_OK(ts_tensor_full(NULL, 3, shape, 2.5f, &f));
    double s = 0;
    for (int i = 0; i < 120; i++) s += ts_tensor_data_f32(z)[i] + ts_tensor_data_f32(f)[i];
    CHECK_NEAR(s, 300, 1e-9);
    ts_tensor_release(z);
    ts_tensor_release(f);
    ts_tensor *bad = NULL;
    int64_t neg[1] = {-1};
    CHECK_STATUS(ts_tensor_empty(NULL, TS_F32, 1, neg, &bad), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("negative");
}

static void test_dtypes(void) {
    CHECK(ts_dtype_size(TS_F32) == 4);
    CHECK(ts_dtype_size(TS_BF16) == 2);
    CHECK(ts_dtype_size(TS_I64) == 8);
    int64_t shape[1] = {3};
    int64_t v[3] = {7, -1, 5};
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, shape, v, &t));
    CHECK(ts_tensor_dtype(t) == TS_I64);
    CHECK_NEAR(ts_tensor_item(t, 1), -1, 0);
    CHECK_STATUS(ts_tensor_fill_(t, 1.0f), TS_ERR_DTYPE);
    ts_tensor_release(t);
}

static void test_device_registry(void) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get("cpu", &d));
    CHECK(d == ts_device_cpu());
    CHECK(strcmp(ts_device_name(d), "cpu") == 0);
    CHECK_STATUS(ts_device_get("tpu:7", &d), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("tpu:7");
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts_tensor *t = NULL;
    int64_t shape[1] = {1000};
    CHECK_OK(ts_tensor_empty(NULL, TS_F32, 1, shape, &t));
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before + 4000);
    ts_tensor_release(t);
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
}

static void test_rng(void) {
    ts_rng a, b;
    ts_rng_seed(&a, 7);
    ts_rng_seed(&b, 7);
    for (int i = 0; i < 100; i++) CHECK(ts_rng_u64(&a) == ts_rng_u64(&b));
    ts_rng_seed(&b, 8);
    CHECK(ts_rng_u64(&a) != ts_rng_u64(&b));
    /* uniform mean and normal moments */
    double s = 0, s2 = 0, m = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        m += ts_rng_uniform(&a);
        double z = ts_rng_normal(&a);
        s += z;
        s2 += z * z;
    }
    CHECK_NEAR(m / n, 0.5, 0.01);
    CHECK_NEAR(s / n, 0.0, 0.01);
    CHECK_NEAR(s2 / n, 1.0, 0.02);
    /* below() is in range and covers it */
    int seen[7] = {0};
    for (int i = 0; i < 7000; i++) seen[ts_rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++) CHECK(seen[i] > 800 && seen[i] < 1200);
    /* shuffle is a permutation */
    int64_t idx[100];
    for (int i = 0; i < 100; i++) idx[i] = i;
    ts_rng_shuffle_i64(&a, idx, 100);
    int64_t sum = 0, moved = 0;
    for (int i = 0; i < 100; i++) sum += idx[i], moved += idx[i] != i;
    CHECK(sum == 4950 && moved > 50);
}

static void test_status_strings(void) {
    CHECK(strcmp(ts_status_name(TS_ERR_SHAPE), "TS_ERR_SHAPE") == 0);
    CHECK(strlen(ts_status_str(TS_ERR_IO)) > 0);
    ts_error(TS_ERR_IO, "file %s", "x.idx");
    CHECK(strcmp(ts_last_error(), "file x.idx") == 0);
    ts_clear_error();
    CHECK(ts_last_error()[0] == '\0');
}

TU_MAIN(T(test_create_and_copy), T(test_zeros_full_fill), T(test_dtypes), T(test_device_registry), T(test_rng),
        T(test_status_strings))
