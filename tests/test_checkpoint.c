/*
 * tests/test_checkpoint.c — activation checkpointing (ts_module_set_checkpointed, nn/checkpoint.c):
 *  - a GPT with dropout 0.1, its blocks checkpointed: loss and every gradient of one forward + backward equal
 *    to the plain model's (bit for bit: the same kernels in the same order), then 30 AdamW steps equal within
 *    1e-5 (exactly, in fact) and the default generator left where the plain run leaves it;
 *  - a small ResNet in training mode (BatchNorm): gradients equal and the running statistics updated once;
 *  - a unit holding a Dropout module with its own generator: masks replayed from that generator;
 *  - a retain_graph backward run twice through checkpointed units: the same gradients twice;
 *  - the allocator's figures on a GPT where activations dominate: what forward + loss leave allocated (the
 *    saved activations) at least halves, and the peak of forward + backward drops;
 *  - which units ts_model_set_activation_checkpointing marks, and its error for a model without units;
 *  - out of memory at every allocation of a checkpointed step (once, and from then on): TS_ERR_NOMEM, the
 *    module's parameter and buffer slots hold their own tensors again, and a clean step follows.
 */
#include "test_util.h"
#include "core/internal.h"

#include <limits.h>

/* two generators in the same state (field by field: the struct has padding) */
static bool same_rng(const ts_rng *a, const ts_rng *b) {
    return a->state_hi == b->state_hi && a->state_lo == b->state_lo && a->inc_hi == b->inc_hi &&
           a->inc_lo == b->inc_lo && a->has_spare == b->has_spare && (!a->has_spare || a->spare_normal == b->spare_normal);
}

/* loss of model on x against targets t (GPT: logits (B, T, V) flattened), with backward when grad mode is on */
static double step_loss(ts_module *m, const ts_tensor *x, const ts_tensor *t, bool backward) {
    ts_tensor *o = NULL, *o2 = NULL, *loss = NULL;
    CHECK_OK(ts_module_forward(m, x, &o));
    if (!o) return NAN;
    const int64_t C = ts_tensor_dim(o, -1);
    CHECK_OK(ts_reshape(o, 2, (int64_t[]){-1, C}, &o2));
    CHECK_OK(ts_cross_entropy(o2, t, 0.0f, &loss));
    double v = loss ? ts_tensor_item(loss, 0) : NAN;
    if (backward && loss) CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_release(o);
    ts_tensor_release(o2);
    ts_tensor_release(loss);
    return v;
}

/* max |a - b| over two f32 tensors of one shape (INFINITY when either is missing or shapes differ) */
static double max_diff(ts_tensor *a, ts_tensor *b) {
    if (!a || !b || ts_tensor_numel(a) != ts_tensor_numel(b)) return INFINITY;
    const int64_t n = ts_tensor_numel(a);
    float *pa = malloc(sizeof(float) * (size_t)n), *pb = malloc(sizeof(float) * (size_t)n);
    CHECK_OK(ts_tensor_to_host(a, pa, sizeof(float) * (size_t)n));
    CHECK_OK(ts_tensor_to_host(b, pb, sizeof(float) * (size_t)n));
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)pa[i] - pb[i]));
    free(pa);
    free(pb);
    return d;
}

/* max difference over every parameter's gradient (grads) or every state-dict entry (values) of a and b */
static double max_diff_models(ts_module *a, ts_module *b, bool grads) {
    ts_tensor_list la = TS_TENSOR_LIST_INIT, lb = TS_TENSOR_LIST_INIT;
    CHECK_OK(grads ? ts_module_parameters(a, &la) : ts_module_state_dict(a, &la));
    CHECK_OK(grads ? ts_module_parameters(b, &lb) : ts_module_state_dict(b, &lb));
    CHECK(la.n == lb.n && la.n > 0);
    double d = la.n == lb.n ? 0 : INFINITY;
    for (int i = 0; i < la.n && i < lb.n; i++) {
        if (ts_tensor_dtype(la.tensors[i]) != TS_F32) { /* num_batches_tracked */
            CHECK(ts_tensor_item(la.tensors[i], 0) == ts_tensor_item(lb.tensors[i], 0));
            continue;
        }
        double di = grads ? max_diff(ts_tensor_grad(la.tensors[i]), ts_tensor_grad(lb.tensors[i]))
                          : max_diff(la.tensors[i], lb.tensors[i]);
        if (di > d) d = di;
    }
    ts_tensor_list_clear(&la);
    ts_tensor_list_clear(&lb);
    return d;
}

static ts_module *tiny_gpt(int64_t layers, int64_t embd, int64_t T, float dropout) {
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = layers;
    c.n_head = 2;
    c.n_embd = embd;
    c.seq_len = T;
    c.vocab_size = 64;
    c.dropout = dropout;
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    return m;
}

/* tokens (B, T) and their next tokens (B*T) from seed */
static void tokens(int64_t B, int64_t T, uint64_t seed, ts_tensor **x, ts_tensor **t) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * (T + 1)));
    for (int64_t i = 0; i < B * (T + 1); i++) ids[i] = (int64_t)ts_rng_below(&r, 64);
    int64_t *xs = malloc(sizeof(int64_t) * (size_t)(B * T)), *ts = malloc(sizeof(int64_t) * (size_t)(B * T));
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < T; j++) {
            xs[b * T + j] = ids[b * (T + 1) + j];
            ts[b * T + j] = ids[b * (T + 1) + j + 1];
        }
    const int64_t n = B * T;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){B, T}, xs, x));
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, &n, ts, t));
    free(ids);
    free(xs);
    free(ts);
}

static void test_gpt_same_gradients_and_steps(void) {
    ts_module *plain = tiny_gpt(3, 32, 16, 0.1f), *ck = tiny_gpt(3, 32, 16, 0.1f);
    int units = 0;
    CHECK_OK(ts_model_set_activation_checkpointing(ck, true, &units));
    CHECK(units == 3);
    CHECK(ts_module_is_checkpointed(ts_module_child(ck, "transformer.h.2")));
    CHECK(!ts_module_is_checkpointed(ts_module_child(plain, "transformer.h.2")));
    ts_tensor *x = NULL, *t = NULL;
    tokens(4, 16, 5, &x, &t);

    ts_manual_seed(99);
    double l0 = step_loss(plain, x, t, true);
    ts_rng after_plain = *ts_rng_default();
    ts_manual_seed(99);
    double l1 = step_loss(ck, x, t, true);
    ts_rng after_ck = *ts_rng_default();
    CHECK(l0 == l1);
    CHECK(same_rng(&after_plain, &after_ck)); /* the replay draws nothing */
    double g = max_diff_models(plain, ck, true);
    printf("  GPT, dropout 0.1: loss %.7f both ways, gradients differ by at most %.3g%s\n", l0, g,
           g == 0 ? " (bit for bit)" : "");
    CHECK(g <= 1e-6);

    /* 30 AdamW steps each, the same dropout stream */
    ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(plain, &pa));
    CHECK_OK(ts_module_parameters(ck, &pb));
    ts_adamw_config ac = TS_ADAMW_CONFIG_INIT;
    ac.lr = 3e-3f;
    ts_optimizer *oa = NULL, *ob = NULL;
    CHECK_OK(ts_optim_adamw_new(&pa, &ac, &oa));
    CHECK_OK(ts_optim_adamw_new(&pb, &ac, &ob));
    double first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        ts_module *mm[2] = {plain, ck};
        ts_optimizer *oo[2] = {oa, ob};
        for (int k = 0; k < 2; k++) {
            ts_manual_seed(1000 + (uint64_t)s);
            ts_optimizer_zero_grad(oo[k]);
            double l = step_loss(mm[k], x, t, true);
            CHECK_OK(ts_optimizer_step(oo[k]));
            if (k == 0 && s == 0) first = l;
            if (k == 0) last = l;
        }
    }
    double w = max_diff_models(plain, ck, false);
    printf("  30 AdamW steps (loss %.4f -> %.4f): parameters differ by at most %.3g\n", first, last, w);
    CHECK(last < first);
    CHECK(w <= 1e-5);
    ts_optimizer_free(oa);
    ts_optimizer_free(ob);
    ts_tensor_list_clear(&pa);
    ts_tensor_list_clear(&pb);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(plain);
    ts_module_free(ck);
}

/* conv stem, BatchNorm, two residual blocks (one downsampling), a linear head */
static ts_module *small_resnet(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *s = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    CHECK_OK(ts_nn_conv2d_new(3, 8, 3, 3, (ts_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1}, false, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "conv1", c));
    CHECK_OK(ts_nn_batchnorm2d_new(8, 1e-5f, 0.1f, true, true, &c));
    CHECK_OK(ts_nn_sequential_add(s, "bn1", c));
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, "relu", c));
    CHECK_OK(ts_nn_residual_block_new(8, 8, 1, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "layer1", c));
    CHECK_OK(ts_nn_residual_block_new(8, 16, 2, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "layer2", c));
    CHECK_OK(ts_nn_flatten_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, "flatten", c));
    CHECK_OK(ts_nn_linear_new(16 * 4 * 4, 5, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "fc", c));
    return s;
}

static void test_resnet_same_gradients_and_running_stats(void) {
    ts_module *plain = small_resnet(), *ck = small_resnet();
    int units = 0;
    CHECK_OK(ts_model_set_activation_checkpointing(ck, true, &units));
    CHECK(units == 2);
    ts_rng r;
    ts_rng_seed(&r, 4);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){4, 3, 8, 8}, -1, 1, false);
    int64_t lab[4] = {0, 3, 1, 4};
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){4}, lab, &t));
    ts_sgd_config sc = TS_SGD_CONFIG_INIT;
    sc.lr = 0.1f;
    sc.momentum = 0.9f;
    ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(plain, &pa));
    CHECK_OK(ts_module_parameters(ck, &pb));
    ts_optimizer *oa = NULL, *ob = NULL;
    CHECK_OK(ts_optim_sgd_new(&pa, &sc, &oa));
    CHECK_OK(ts_optim_sgd_new(&pb, &sc, &ob));
    for (int s = 0; s < 3; s++) {
        ts_optimizer_zero_grad(oa);
        ts_optimizer_zero_grad(ob);
        double l0 = step_loss(plain, x, t, true), l1 = step_loss(ck, x, t, true);
        CHECK(l0 == l1);
        double g = max_diff_models(plain, ck, true);
        if (s == 0)
            printf("  ResNet blocks, training mode: gradients differ by at most %.3g%s\n", g,
                   g == 0 ? " (bit for bit)" : "");
        CHECK(g <= 1e-6);
        CHECK_OK(ts_optimizer_step(oa));
        CHECK_OK(ts_optimizer_step(ob));
    }
    /* parameters, running means and variances, num_batches_tracked (3, not 6) */
    CHECK(max_diff_models(plain, ck, false) <= 1e-6);
    CHECK(ts_tensor_item(ts_module_buffer(ts_module_child(ck, "layer1.bn1"), "num_batches_tracked"), 0) == 3);
    ts_optimizer_free(oa);
    ts_optimizer_free(ob);
    ts_tensor_list_clear(&pa);
    ts_tensor_list_clear(&pb);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(plain);
    ts_module_free(ck);
}

/* Sequential(Linear, Sequential(Linear, ReLU, Dropout(own generator), Linear) as the unit) */
static ts_module *mlp_with_dropout(ts_rng *drop_rng, ts_module **unit) {
    ts_rng r;
    ts_rng_seed(&r, 8);
    ts_module *s = NULL, *u = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    CHECK_OK(ts_nn_linear_new(6, 16, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "in", c));
    CHECK_OK(ts_nn_sequential_new(&u));
    CHECK_OK(ts_nn_linear_new(16, 16, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(u, "a", c));
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_OK(ts_nn_sequential_add(u, "relu", c));
    CHECK_OK(ts_nn_dropout_new(0.3f, drop_rng, &c));
    CHECK_OK(ts_nn_sequential_add(u, "drop", c));
    CHECK_OK(ts_nn_linear_new(16, 3, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(u, "b", c));
    CHECK_OK(ts_nn_sequential_add(s, "unit", u));
    *unit = u;
    return s;
}

static void test_dropout_module_generator_replayed(void) {
    ts_rng ra, rb;
    ts_rng_seed(&ra, 21);
    ts_rng_seed(&rb, 21);
    ts_module *ua = NULL, *ub = NULL;
    ts_module *plain = mlp_with_dropout(&ra, &ua), *ck = mlp_with_dropout(&rb, &ub);
    CHECK_OK(ts_module_set_checkpointed(ub, true));
    CHECK_STATUS(ts_model_set_activation_checkpointing(plain, true, NULL), TS_ERR_INVALID_ARG);
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){8, 6}, -1, 1, false);
    int64_t lab[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){8}, lab, &t));
    for (int s = 0; s < 2; s++) { /* the second step draws new masks, the same on both */
        double l0 = step_loss(plain, x, t, true), l1 = step_loss(ck, x, t, true);
        CHECK(l0 == l1);
        CHECK(max_diff_models(plain, ck, true) == 0);
        CHECK(same_rng(&ra, &rb));
    }
    /* with retain_graph, a second backward through the checkpoint replays the same masks */
    ts_tensor *o = NULL, *loss = NULL;
    CHECK_OK(ts_module_forward(ck, x, &o));
    CHECK_OK(ts_cross_entropy(o, t, 0.0f, &loss));
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ck, &p));
    for (int i = 0; i < p.n; i++) ts_tensor_zero_grad(p.tensors[i]);
    CHECK_OK(ts_backward(loss, NULL, true));
    ts_tensor *g1 = NULL;
    CHECK_OK(ts_tensor_clone(ts_tensor_grad(ts_module_param(ts_module_child(ck, "unit.a"), "weight")), &g1));
    for (int i = 0; i < p.n; i++) ts_tensor_zero_grad(p.tensors[i]);
    CHECK_OK(ts_backward(loss, NULL, false));
    CHECK(max_diff(g1, ts_tensor_grad(ts_module_param(ts_module_child(ck, "unit.a"), "weight"))) == 0);
    CHECK_STATUS(ts_backward(loss, NULL, false), TS_ERR_STATE); /* freed after a pass without retain */
    ts_tensor_list_clear(&p);
    ts_tensor_release(g1);
    ts_tensor_release(o);
    ts_tensor_release(loss);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(plain);
    ts_module_free(ck);
}

/* bytes forward + loss leave allocated (the graph's saved tensors), and the peak over forward + backward */
static void measure(ts_module *m, const ts_tensor *x, const ts_tensor *t, size_t *saved, size_t *peak) {
    ts_device *cpu = ts_device_cpu();
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &p));
    for (int i = 0; i < p.n; i++) ts_tensor_zero_grad(p.tensors[i]);
    const size_t base = ts_device_memory_allocated(cpu);
    ts_device_memory_reset_peak(cpu);
    ts_tensor *o = NULL, *o2 = NULL, *loss = NULL;
    CHECK_OK(ts_module_forward(m, x, &o));
    CHECK_OK(ts_reshape(o, 2, (int64_t[]){-1, ts_tensor_dim(o, -1)}, &o2));
    CHECK_OK(ts_cross_entropy(o2, t, 0.0f, &loss));
    ts_tensor_release(o);
    ts_tensor_release(o2);
    *saved = ts_device_memory_allocated(cpu) - base;
    CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_release(loss);
    *peak = ts_device_memory_peak(cpu) - base;
    for (int i = 0; i < p.n; i++) ts_tensor_zero_grad(p.tensors[i]);
    ts_tensor_list_clear(&p);
}

static void test_memory_drops(void) {
    /* 6 blocks, 64 wide, 128 positions, batch 8: the activations (a block keeps ~ 20 B*T*C floats) dwarf
     * the 0.3 M parameters */
    ts_module *m = tiny_gpt(6, 64, 128, 0.1f);
    ts_tensor *x = NULL, *t = NULL;
    tokens(8, 128, 6, &x, &t);
    size_t s0, p0, s1, p1;
    ts_manual_seed(5);
    measure(m, x, t, &s0, &p0);
    CHECK_OK(ts_model_set_activation_checkpointing(m, true, NULL));
    ts_manual_seed(5);
    measure(m, x, t, &s1, &p1);
    printf("  GPT 6x64, B 8, T 128: saved after forward %.2f -> %.2f MiB (%.1fx less), peak of forward + "
           "backward %.2f -> %.2f MiB (%.1fx less)\n",
           s0 / 1048576.0, s1 / 1048576.0, (double)s0 / (double)s1, p0 / 1048576.0, p1 / 1048576.0,
           (double)p0 / (double)p1);
    CHECK(s1 * 2 <= s0);
    CHECK(p1 * 2 <= p0);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(m);
}

static void test_memory_drops_resnet(void) {
    /* resnet50's 16 Bottlenecks keep their inputs only; the stem (conv1, bn1, relu, maxpool) and the head are
     * not units and keep theirs */
    ts_module *m = NULL;
    CHECK_OK(ts_model_resnet(50, 10, NULL, &m));
    ts_rng r;
    ts_rng_seed(&r, 9);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 64, 64}, -1, 1, false), *t = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){2}, (int64_t[]){3, 7}, &t));
    size_t s0, p0, s1, p1;
    measure(m, x, t, &s0, &p0);
    CHECK_OK(ts_model_set_activation_checkpointing(m, true, NULL));
    measure(m, x, t, &s1, &p1);
    printf("  ResNet-50, 2 x 3x64x64: saved after forward %.2f -> %.2f MiB (%.1fx less), peak of forward + backward "
           "(with the gradients of 23.5 M parameters) %.2f -> %.2f MiB\n",
           s0 / 1048576.0, s1 / 1048576.0, (double)s0 / (double)s1, p0 / 1048576.0, p1 / 1048576.0);
    CHECK(s1 * 2 <= s0);
    CHECK(p1 < p0);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(m);
}

static void test_units(void) {
    ts_module *m = NULL;
    int n = -1;
    CHECK_OK(ts_model_resnet(18, 10, NULL, &m));
    CHECK_OK(ts_model_set_activation_checkpointing(m, true, &n));
    CHECK(n == 8);
    CHECK(ts_module_is_checkpointed(ts_module_child(m, "layer3.1")));
    CHECK(!ts_module_is_checkpointed(ts_module_child(m, "layer3")));
    ts_module *shared = NULL; /* what DDP, DataParallel and the run build on: the marks go along */
    CHECK_OK(ts_module_share(m, &shared));
    CHECK(shared && ts_module_is_checkpointed(ts_module_child(shared, "layer3.1")));
    ts_module_free(shared);
    CHECK_OK(ts_model_set_activation_checkpointing(m, false, &n));
    CHECK(!ts_module_is_checkpointed(ts_module_child(m, "layer3.1")));
    ts_module_free(m);
    CHECK_OK(ts_model_resnet(50, 10, NULL, &m));
    CHECK_OK(ts_model_set_activation_checkpointing(m, true, &n));
    CHECK(n == 16); /* Bottlenecks: 3 + 4 + 6 + 3 */
    ts_module_free(m);
    CHECK_OK(ts_model_new("cnn", 10, NULL, &m));
    CHECK_STATUS(ts_model_set_activation_checkpointing(m, true, &n), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("no unit");
    CHECK(n == 0);
    ts_module_free(m);
    CHECK_STATUS(ts_module_set_checkpointed(NULL, true), TS_ERR_INVALID_ARG);
    CHECK(!ts_module_is_checkpointed(NULL));
}

/* one residual block (with a downsample: conv, BatchNorm) and a linear head, for failure injection */
static ts_module *one_block(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *s = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    CHECK_OK(ts_nn_residual_block_new(3, 4, 2, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "layer2", c));
    CHECK_OK(ts_nn_flatten_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, "flatten", c));
    CHECK_OK(ts_nn_linear_new(4 * 4 * 4, 5, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "fc", c));
    return s;
}

/* forward + loss + backward without CHECKs (for failure injection) */
static ts_status try_step(ts_module *m, const ts_tensor *x, const ts_tensor *t) {
    ts_tensor *o = NULL, *loss = NULL;
    ts_status st = ts_module_forward(m, x, &o);
    if (st == TS_OK) st = ts_cross_entropy(o, t, 0.0f, &loss);
    if (st == TS_OK) st = ts_backward(loss, NULL, false);
    ts_tensor_release(o);
    ts_tensor_release(loss);
    return st;
}

static void test_out_of_memory(void) {
    ts_rng r;
    ts_rng_seed(&r, 4);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 8, 8}, -1, 1, false), *t = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){2}, (int64_t[]){1, 4}, &t));
    ts_module *m = one_block();
    CHECK_OK(ts_model_set_activation_checkpointing(m, true, NULL));
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(try_step(m, x, t));
    const long allocs = ts__alloc_count();
    ts__alloc_fail_after(-1);
    ts_module_free(m);
    CHECK(allocs > 0);
    long failed = 0;
    for (int once = 0; once < 2; once++)
        for (long n = 0; n <= allocs; n++) {
            m = one_block();
            CHECK_OK(ts_model_set_activation_checkpointing(m, true, NULL));
            ts_module *blk = ts_module_child(m, "layer2");
            ts_tensor *w = ts_module_param(ts_module_child(blk, "conv1"), "weight");
            ts_tensor *rm = ts_module_buffer(ts_module_child(blk, "bn1"), "running_mean");
            if (once)
                ts__alloc_fail_once_after(n);
            else
                ts__alloc_fail_after(n);
            ts_status st = try_step(m, x, t);
            const long injected = ts__alloc_failures();
            ts__alloc_fail_after(-1);
            if (injected > 0) {
                failed++;
                if (st != TS_ERR_NOMEM)
                    fprintf(stderr, "fail %s after %ld of %ld: %s (%s)\n", once ? "once" : "from then on", n, allocs,
                            ts_status_name(st), ts_last_error());
                CHECK(st == TS_ERR_NOMEM);
            } else {
                CHECK_OK(st);
            }
            CHECK(ts_module_param(ts_module_child(blk, "conv1"), "weight") == w);
            CHECK(ts_module_buffer(ts_module_child(blk, "bn1"), "running_mean") == rm);
            ts_tensor_list p = TS_TENSOR_LIST_INIT;
            CHECK_OK(ts_module_parameters(m, &p));
            for (int i = 0; i < p.n; i++) ts_tensor_zero_grad(p.tensors[i]);
            CHECK_OK(try_step(m, x, t)); /* a clean step afterwards */
            for (int i = 0; i < p.n; i++) CHECK(ts_tensor_grad(p.tensors[i]) != NULL);
            ts_tensor_list_clear(&p);
            ts_module_free(m);
        }
    printf("  out of memory at each of %ld allocations of a step, once and from then on: %ld failed steps, each "
           "TS_ERR_NOMEM\n", allocs, failed);
    ts_tensor_release(x);
    ts_tensor_release(t);
}

TU_MAIN(T(test_gpt_same_gradients_and_steps), T(test_resnet_same_gradients_and_running_stats),
        T(test_dropout_module_generator_replayed), T(test_memory_drops),
        T(test_memory_drops_resnet), T(test_units),
        T(test_out_of_memory))
