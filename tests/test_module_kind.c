/* Typed layer introspection: ts_module_kind on every module type Tessera
 * defines (the parallel wrappers and SyncBatchNorm included), the typed
 * configuration accessors on the right and the wrong kind, the owner hooks
 * src/parallel uses (replica shells, BatchNorm2d -> SyncBatchNorm in place),
 * BatchNorm's shared argument checks, and the bounds of the parameter and
 * buffer slots. */
#include "nn/module.h"
#include "test_util.h"

static ts_device *devs[2];

/* Checks m's kind and that the kind's name is m's type name; frees m. */
static void check_kind(ts_module *m, ts_module_kind_id want) {
    CHECK(m != NULL);
    if (!m) return;
    CHECK(ts_module_kind(m) == want);
    if (ts_module_kind(m) != want)
        fprintf(stderr, "  %s: kind %d (%s), expected %d (%s)\n", ts_module_type_name(m), (int)ts_module_kind(m),
                ts_module_kind_name(ts_module_kind(m)), (int)want, ts_module_kind_name(want));
    CHECK(strcmp(ts_module_kind_name(want), ts_module_type_name(m)) == 0);
    ts_module_free(m);
}

/* A Sequential(Conv2d, ReLU, Flatten, Linear) for 1x4x4 inputs. */
static ts_module *small_seq(void) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    CHECK_OK(ts_nn_sequential_new(&s));
    CHECK_OK(ts_nn_conv2d_new(1, 2, 3, 3, p, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_flatten_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_linear_new(32, 3, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    return s;
}

static ts_status custom_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    *out = ts_tensor_retain((ts_tensor *)x);
    return TS_OK;
}
static const ts_module_vt custom_vt = {.name = "Custom", .forward = custom_forward}; /* kind left out */

static void test_kind_of_every_type(void) {
    ts_module *m = NULL;
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_pool2d_params pool = {{2, 2}, {0, 0}, {0, 0}, {0, 0}, false, false};

    CHECK_OK(ts_nn_sequential_new(&m));
    check_kind(m, TS_MODULE_SEQUENTIAL);
    CHECK_OK(ts_nn_linear_new(3, 2, true, &r, &m));
    check_kind(m, TS_MODULE_LINEAR);
    CHECK_OK(ts_nn_conv2d_new(1, 2, 3, 3, TS_CONV2D_DEFAULT, false, &r, &m));
    check_kind(m, TS_MODULE_CONV2D);
    CHECK_OK(ts_nn_batchnorm2d_new(4, 1e-5f, 0.1f, true, true, &m));
    check_kind(m, TS_MODULE_BATCHNORM2D);
    CHECK_OK(ts_nn_sync_batchnorm2d_new(4, 1e-5f, 0.1f, true, true, NULL, &m));
    check_kind(m, TS_MODULE_SYNC_BATCHNORM);
    CHECK_OK(ts_nn_relu_new(&m));
    check_kind(m, TS_MODULE_RELU);
    CHECK_OK(ts_nn_maxpool2d_new(pool, &m));
    check_kind(m, TS_MODULE_MAXPOOL2D);
    CHECK_OK(ts_nn_avgpool2d_new(pool, &m));
    check_kind(m, TS_MODULE_AVGPOOL2D);
    CHECK_OK(ts_nn_global_avgpool2d_new(&m));
    check_kind(m, TS_MODULE_ADAPTIVE_AVGPOOL2D);
    CHECK_OK(ts_nn_flatten_new(&m));
    check_kind(m, TS_MODULE_FLATTEN);
    CHECK_OK(ts_nn_dropout_new(0.5f, &r, &m));
    check_kind(m, TS_MODULE_DROPOUT);
    CHECK_OK(ts_nn_embedding_new(5, 3, &r, &m));
    check_kind(m, TS_MODULE_EMBEDDING);
    CHECK_OK(ts_nn_residual_block_new(2, 4, 2, &r, &m));
    check_kind(m, TS_MODULE_RESIDUAL_BLOCK);
    CHECK_OK(ts_nn_layernorm_new(1, (int64_t[]){4}, 1e-5f, true, &m));
    check_kind(m, TS_MODULE_LAYERNORM);
    CHECK_OK(ts_nn_groupnorm_new(2, 4, 1e-5f, true, &m));
    check_kind(m, TS_MODULE_GROUPNORM);
    CHECK_OK(ts_nn_batchnorm1d_new(4, 1e-5f, 0.1f, true, true, &m));
    check_kind(m, TS_MODULE_BATCHNORM1D);

    /* the parallel wrappers (src/parallel) */
    CHECK_OK(ts_nn_to_device_new(devs[1], &m));
    check_kind(m, TS_MODULE_TO_DEVICE);
    CHECK_OK(ts_nn_data_parallel_new(small_seq(), devs, 2, NULL, &m));
    check_kind(m, TS_MODULE_DATA_PARALLEL);
    CHECK_OK(ts_nn_model_parallel_new(small_seq(), devs, 2, NULL, NULL, &m));
    check_kind(m, TS_MODULE_MODEL_PARALLEL);
    CHECK_OK(ts_nn_pipeline_parallel_new(small_seq(), devs, 2, NULL, 2, TS_PP_GPIPE, NULL, &m));
    check_kind(m, TS_MODULE_PIPELINE_PARALLEL);
    CHECK_OK(ts_nn_tile_parallel_new(small_seq(), devs, 2, NULL, &m));
    check_kind(m, TS_MODULE_TILE_PARALLEL);

    /* a type defined outside the list, and NULL */
    CHECK_OK(ts__module_new(&custom_vt, 0, &m));
    CHECK(ts_module_kind(m) == TS_MODULE_CUSTOM);
    ts_module_free(m);
    CHECK(ts_module_kind(NULL) == TS_MODULE_CUSTOM);

    /* every kind has a name; out of range is "?" */
    for (int k = 0; k < TS_MODULE_KIND_COUNT; k++) CHECK(strcmp(ts_module_kind_name((ts_module_kind_id)k), "?") != 0);
    CHECK(strcmp(ts_module_kind_name(TS_MODULE_KIND_COUNT), "?") == 0);
    CHECK(strcmp(ts_module_kind_name((ts_module_kind_id)-1), "?") == 0);

    /* kinds inside a tree: the reference CNN's children */
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    static const ts_module_kind_id cnn[12] = {
        TS_MODULE_CONV2D,    TS_MODULE_BATCHNORM2D, TS_MODULE_RELU,   TS_MODULE_MAXPOOL2D,
        TS_MODULE_CONV2D,    TS_MODULE_BATCHNORM2D, TS_MODULE_RELU,   TS_MODULE_MAXPOOL2D,
        TS_MODULE_FLATTEN,   TS_MODULE_LINEAR,      TS_MODULE_RELU,   TS_MODULE_LINEAR};
    CHECK(ts_module_kind(m) == TS_MODULE_SEQUENTIAL && ts_nn_sequential_len(m) == 12);
    for (int i = 0; i < 12; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        CHECK(ts_module_kind(ts_module_child(m, name)) == cnn[i]);
    }
    ts_module_free(m);
}

static void test_accessors(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *lin = NULL, *conv = NULL, *bn = NULL, *mp = NULL, *ap = NULL, *drop = NULL, *emb = NULL,
              *relu = NULL;
    ts_conv2d_params cp = {{2, 1}, {1, 0}, {1, 2}, 2};
    ts_pool2d_params pp = {{3, 2}, {0, 1}, {1, 0}, {2, 0}, true, false};
    CHECK_OK(ts_nn_linear_new(7, 5, false, &r, &lin));
    CHECK_OK(ts_nn_conv2d_new(4, 6, 3, 5, cp, true, &r, &conv));
    CHECK_OK(ts_nn_batchnorm2d_new(9, 1e-3f, -1.0f, false, true, &bn));
    CHECK_OK(ts_nn_maxpool2d_new(pp, &mp));
    CHECK_OK(ts_nn_avgpool2d_new(pp, &ap));
    CHECK_OK(ts_nn_dropout_new(0.25f, &r, &drop));
    CHECK_OK(ts_nn_embedding_new(11, 3, &r, &emb));
    CHECK_OK(ts_nn_relu_new(&relu));

    int64_t a = -1, b = -1;
    bool flag = true;
    CHECK_OK(ts_linear_get_config(lin, &a, &b, &flag));
    CHECK(a == 7 && b == 5 && !flag);
    CHECK_OK(ts_linear_get_config(lin, NULL, NULL, NULL)); /* every output optional */

    int kh = 0, kw = 0;
    ts_conv2d_params got;
    memset(&got, 0, sizeof got);
    CHECK_OK(ts_conv2d_get_config(conv, &a, &b, &kh, &kw, &got, &flag));
    CHECK(a == 4 && b == 6 && kh == 3 && kw == 5 && flag);
    CHECK(memcmp(&got, &cp, sizeof cp) == 0);

    ts_pool2d_params gp;
    memset(&gp, 0, sizeof gp);
    CHECK_OK(ts_pool2d_get_params(mp, &gp));
    CHECK(gp.kernel[0] == 3 && gp.kernel[1] == 2 && gp.stride[0] == 0 && gp.stride[1] == 1 && gp.padding[0] == 1 &&
          gp.dilation[0] == 2 && gp.dilation[1] == 0 && gp.ceil_mode);
    memset(&gp, 0, sizeof gp);
    CHECK_OK(ts_pool2d_get_params(ap, &gp));
    CHECK(gp.kernel[0] == 3 && gp.ceil_mode);

    float eps = 0, mom = 0, p = 0;
    bool affine = true, track = false;
    CHECK_OK(ts_batchnorm2d_get_config(bn, &a, &eps, &mom, &affine, &track));
    CHECK(a == 9 && eps == 1e-3f && mom == -1.0f && !affine && track);

    CHECK_OK(ts_dropout_get_p(drop, &p));
    CHECK(p == 0.25f);
    CHECK_OK(ts_embedding_get_config(emb, &a, &b));
    CHECK(a == 11 && b == 3);

    /* the wrong kind: TS_ERR_INVALID_ARG naming the actual type, outputs untouched */
    a = 42;
    CHECK_STATUS(ts_linear_get_config(conv, &a, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_linear_get_config");
    CHECK_ERR_MENTIONS("Conv2d");
    CHECK(a == 42);
    CHECK_STATUS(ts_conv2d_get_config(lin, &a, NULL, &kh, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("got a Linear");
    CHECK(a == 42);
    CHECK_STATUS(ts_pool2d_get_params(relu, &gp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ReLU");
    CHECK_STATUS(ts_batchnorm2d_get_config(mp, &a, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("MaxPool2d");
    CHECK(a == 42);
    p = 7;
    CHECK_STATUS(ts_dropout_get_p(bn, &p), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("BatchNorm2d");
    CHECK(p == 7);
    CHECK_STATUS(ts_embedding_get_config(drop, &a, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("Dropout");
    CHECK_STATUS(ts_linear_get_config(emb, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("Embedding");
    CHECK_STATUS(ts_conv2d_get_config(ap, NULL, NULL, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("AvgPool2d");
    CHECK_STATUS(ts_conv2d_get_config(NULL, NULL, NULL, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("NULL module");
    ts_module *wrap = NULL;
    CHECK_OK(ts_nn_to_device_new(devs[0], &wrap));
    CHECK_STATUS(ts_batchnorm2d_get_config(wrap, NULL, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ToDevice");
    ts_module_free(wrap);

    ts_module_free(lin);
    ts_module_free(conv);
    ts_module_free(bn);
    ts_module_free(mp);
    ts_module_free(ap);
    ts_module_free(drop);
    ts_module_free(emb);
    ts_module_free(relu);
}

/* SyncBatchNorm: built directly or converted in place, it answers the BatchNorm2d accessor. */
static void test_sync_batchnorm(void) {
    ts_module *m = NULL, *seq = NULL, *bn = NULL;
    int64_t nf = 0;
    float eps = 0, mom = 0;
    bool affine = false, track = true;
    CHECK_OK(ts_nn_sync_batchnorm2d_new(3, 2e-5f, 0.3f, true, false, NULL, &m));
    CHECK_OK(ts_batchnorm2d_get_config(m, &nf, &eps, &mom, &affine, &track));
    CHECK(nf == 3 && eps == 2e-5f && mom == 0.3f && affine && !track);
    ts_module_free(m);

    /* in place: the same handle and tensors, the configuration kept */
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_batchnorm2d_new(5, 1e-4f, -1.0f, false, true, &bn));
    CHECK_OK(ts_nn_sequential_add(seq, "bn", bn));
    ts_tensor_list before = TS_TENSOR_LIST_INIT, after = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_buffers(seq, &before));
    CHECK_OK(ts_nn_convert_sync_batchnorm(seq, NULL));
    CHECK(ts_module_child(seq, "bn") == bn && ts_module_kind(bn) == TS_MODULE_SYNC_BATCHNORM);
    CHECK(ts_module_kind(seq) == TS_MODULE_SEQUENTIAL);
    CHECK_OK(ts_batchnorm2d_get_config(bn, &nf, &eps, &mom, &affine, &track));
    CHECK(nf == 5 && eps == 1e-4f && mom == -1.0f && !affine && track);
    CHECK_OK(ts_module_buffers(seq, &after));
    CHECK(before.n == 3 && after.n == 3);
    for (int i = 0; i < before.n && i < after.n; i++) CHECK(before.tensors[i] == after.tensors[i]);
    /* converting again rebinds, keeping the configuration */
    CHECK_OK(ts_nn_convert_sync_batchnorm(seq, NULL));
    CHECK_OK(ts_batchnorm2d_get_config(bn, &nf, &eps, NULL, NULL, NULL));
    CHECK(nf == 5 && eps == 1e-4f && ts_module_kind(bn) == TS_MODULE_SYNC_BATCHNORM);
    ts_tensor_list_clear(&before);
    ts_tensor_list_clear(&after);
    ts_module_free(seq);
}

/* One argument check for the BatchNorm family, naming the constructor called. */
static void test_batchnorm_argument_checks(void) {
    ts_module *m = NULL;
    CHECK_STATUS(ts_nn_batchnorm2d_new(0, 1e-5f, 0.1f, true, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_nn_batchnorm2d_new: num_features");
    CHECK_STATUS(ts_nn_sync_batchnorm2d_new(0, 1e-5f, 0.1f, true, true, NULL, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_nn_sync_batchnorm2d_new: num_features");
    CHECK_STATUS(ts_nn_batchnorm2d_new(4, 0.0f, 0.1f, true, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("eps");
    CHECK_STATUS(ts_nn_sync_batchnorm2d_new(4, -1.0f, 0.1f, true, true, NULL, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_nn_sync_batchnorm2d_new: eps");
    CHECK_STATUS(ts_nn_batchnorm2d_new(4, 1e-5f, 1.5f, true, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("momentum");
    CHECK_STATUS(ts_nn_sync_batchnorm2d_new(4, 1e-5f, 1.5f, true, true, NULL, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_nn_sync_batchnorm2d_new: momentum");
    CHECK_STATUS(ts_nn_sync_batchnorm2d_new(4, 1e-5f, NAN, true, true, NULL, &m), TS_ERR_INVALID_ARG);
    CHECK(m == NULL);
    CHECK_OK(ts__batchnorm2d_check_args("f", 1, 1e-5f, -1.0f)); /* momentum < 0: cumulative average */
}

/* The owner hooks of nn/module.h that src/parallel uses. */
static void test_owner_hooks(void) {
    ts_rng r;
    ts_rng_seed(&r, 9);
    ts_module *conv = NULL, *shell = NULL, *relu = NULL, *bn = NULL;
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.stride[0] = 2;
    CHECK_OK(ts_nn_conv2d_new(2, 4, 3, 1, cp, false, &r, &conv));

    /* replica shell: the source's kind and configuration, training flag, no slots */
    ts_module_train(conv, false);
    CHECK_OK(ts__module_new_replica(conv, &shell));
    CHECK(ts_module_kind(shell) == TS_MODULE_CONV2D && !ts_module_is_training(shell));
    CHECK(ts_module_num_parameters(shell) == 0);
    int kh = 0, kw = 0;
    ts_conv2d_params got;
    memset(&got, 0, sizeof got);
    CHECK_OK(ts_conv2d_get_config(shell, NULL, NULL, &kh, &kw, &got, NULL));
    CHECK(kh == 3 && kw == 1 && got.stride[0] == 2);
    ts_module_free(shell); /* leaves conv's configuration alone (ASan would say) */
    CHECK_OK(ts_conv2d_get_config(conv, NULL, NULL, &kh, NULL, NULL, NULL));

    /* ts_replicate's replicas: same kinds, same configuration */
    ts_module *seq = NULL, *reps[2] = {NULL, NULL};
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, conv));
    CHECK_OK(ts_nn_dropout_new(0.125f, &r, &conv));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, conv));
    conv = NULL;
    CHECK_OK(ts_module_to(seq, devs[0]));
    CHECK_OK(ts_replicate(seq, devs, 2, reps));
    for (int i = 0; i < 2; i++) {
        CHECK(ts_module_kind(reps[i]) == TS_MODULE_SEQUENTIAL);
        CHECK(ts_module_kind(ts_module_child(reps[i], "0")) == TS_MODULE_CONV2D);
        CHECK(ts_module_kind(ts_module_child(reps[i], "1")) == TS_MODULE_DROPOUT);
        float p = 0;
        CHECK_OK(ts_dropout_get_p(ts_module_child(reps[i], "1"), &p));
        CHECK(p == 0.125f);
        CHECK_OK(ts_conv2d_get_config(ts_module_child(reps[i], "0"), NULL, NULL, &kh, NULL, &got, NULL));
        CHECK(kh == 3 && got.stride[0] == 2);
        ts_module_free(reps[i]);
    }
    ts_module_free(seq);

    /* BatchNorm2d conversion refuses another kind (naming it) and leaves impl to the caller */
    static const ts_module_vt fake_sync_vt = {
        .name = "FakeSync", .kind = TS_MODULE_SYNC_BATCHNORM, .forward = custom_forward};
    CHECK_OK(ts_nn_relu_new(&relu));
    void *blk = calloc(1, sizeof(ts__bn_config) + 16);
    CHECK_STATUS(ts__batchnorm2d_convert(relu, &fake_sync_vt, blk), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ReLU");
    CHECK(ts_module_kind(relu) == TS_MODULE_RELU);
    CHECK_OK(ts_nn_batchnorm2d_new(6, 1e-5f, 0.1f, true, true, &bn));
    CHECK_STATUS(ts__batchnorm2d_convert(bn, &custom_vt, blk), TS_ERR_INVALID_ARG); /* not of kind SYNC_BATCHNORM */
    CHECK(ts_module_kind(bn) == TS_MODULE_BATCHNORM2D);
    CHECK_OK(ts__batchnorm2d_convert(bn, &fake_sync_vt, blk)); /* blk is bn's now */
    CHECK(ts_module_kind(bn) == TS_MODULE_SYNC_BATCHNORM && strcmp(ts_module_type_name(bn), "FakeSync") == 0);
    int64_t nf = 0;
    CHECK_OK(ts_batchnorm2d_get_config(bn, &nf, NULL, NULL, NULL, NULL));
    CHECK(nf == 6 && ((const ts__bn_config *)blk)->num_features == 6);
    ts_module_free(bn);
    ts_module_free(relu);
}

/* Parameter and buffer slots are bounded: the slot past TS_MODULE_MAX_SLOTS is an error, not an overflow. */
static void test_slot_bounds(void) {
    static const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"};
    _Static_assert(sizeof names / sizeof names[0] > TS_MODULE_MAX_SLOTS, "names for every slot and one more");
    ts_module *m = NULL;
    CHECK_OK(ts__module_new(&custom_vt, 0, &m));
    for (int i = 0; i <= TS_MODULE_MAX_SLOTS; i++) {
        ts_tensor *p = NULL, *b = NULL;
        CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){2}, &p));
        CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){2}, &b));
        ts_status sp = ts__module_add_param(m, names[i], p); /* takes p, also on failure */
        if (i < TS_MODULE_MAX_SLOTS) {
            CHECK_OK(sp);
        } else {
            CHECK(sp == TS_ERR_INVALID_ARG);
            CHECK_ERR_MENTIONS("Custom");
            CHECK(strstr(ts_last_error(), names[TS_MODULE_MAX_SLOTS]) != NULL);
        }
        ts_status sb = ts__module_add_buffer(m, names[i], b);
        CHECK(sb == (i < TS_MODULE_MAX_SLOTS ? TS_OK : TS_ERR_INVALID_ARG));
    }
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &l));
    CHECK(l.n == TS_MODULE_MAX_SLOTS);
    ts_tensor_list_clear(&l);
    CHECK_OK(ts_module_buffers(m, &l));
    CHECK(l.n == TS_MODULE_MAX_SLOTS);
    ts_tensor_list_clear(&l);
    ts_module_free(m);
    /* a NULL slot counts too (Linear without bias) */
    CHECK_OK(ts__module_new(&custom_vt, 0, &m));
    for (int i = 0; i < TS_MODULE_MAX_SLOTS; i++) CHECK_OK(ts__module_add_param(m, names[i], NULL));
    CHECK_STATUS(ts__module_add_param(m, names[TS_MODULE_MAX_SLOTS], NULL), TS_ERR_INVALID_ARG);
    ts_module_free(m);
}

int main(int argc, char **argv) {
    if (ts_set_cpu_device_count(2) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    if (ts_device_get("cpu:0", &devs[0]) != TS_OK || ts_device_get("cpu:1", &devs[1]) != TS_OK) {
        fprintf(stderr, "ts_device_get: %s\n", ts_last_error());
        return 1;
    }
    static const tu_test tests[] = {T(test_kind_of_every_type), T(test_accessors),
                                    T(test_sync_batchnorm),     T(test_batchnorm_argument_checks),
                                    T(test_owner_hooks),        T(test_slot_bounds)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
