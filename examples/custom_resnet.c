/*
 * examples/custom_resnet.c — a network of your own, written by hand: a small
 * ResNet whose residual blocks are C functions over their registered children
 * (PyTorch's nn.Module.forward), trained with DDP and reloaded from its
 * checkpoint. The PyTorch it mirrors:
 *
 *     class Block(nn.Module):
 *         def __init__(self, cin, cout, stride):
 *             self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); self.bn1 = nn.BatchNorm2d(cout)
 *             self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False);     self.bn2 = nn.BatchNorm2d(cout)
 *             self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
 *                             if stride != 1 or cin != cout else None
 *         def forward(self, x):
 *             y = F.relu(self.bn1(self.conv1(x)))
 *             y = self.bn2(self.conv2(y))
 *             return F.relu(y + (self.shortcut(x) if self.shortcut else x))
 *
 *     model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
 *                           Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
 *                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
 *
 * Every rank runs this program (tessera run -n 2 build/example_custom_resnet);
 * rank 0 evaluates, writes custom_resnet.ckpt, then builds a fresh model, loads
 * the checkpoint's weights into it and checks that it computes the same logits.
 *
 * usage: example_custom_resnet [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR]
 */
#include <tessera.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank = 0;
static ts_process_group *pg = NULL;

#define CHECK(call)                                                                             \
    do {                                                                                        \
        ts_status s_ = (call);                                                                  \
        if (s_ != TS_OK) {                                                                      \
            fprintf(stderr, "[rank %d] %s failed: %s\n", rank, #call, ts_last_error());         \
            if (pg) ts_pg_abort(pg, "example_custom_resnet failed");                            \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

/* ---- the residual block: forward is ordinary code over the block's children ---------------------- */
static ts_status block_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL, *sc = NULL, *sum = NULL;
    ts_status st = ts_module_call(self, "conv1", x, &a);              /* (N, cout, H/s, W/s) */
    if (st == TS_OK) st = ts_module_call(self, "bn1", a, &b);
    if (st == TS_OK) st = ts_relu(b, &c);
    if (st == TS_OK) st = ts_module_call(self, "conv2", c, &d);
    if (st == TS_OK) st = ts_module_call(self, "bn2", d, &e);
    if (st == TS_OK && ts_module_child(self, "shortcut"))             /* the shortcut, when shapes change */
        st = ts_module_call(self, "shortcut", x, &sc);
    if (st == TS_OK) st = ts_add(e, sc ? sc : x, &sum);
    if (st == TS_OK) st = ts_relu(sum, out);
    ts_tensor *tmp[] = {a, b, c, d, e, sc, sum};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    return st;
}

/* conv3x3/1x1 without bias, then BatchNorm2d, registered as `conv` and `bn` on m. */
static ts_status add_conv_bn(ts_module *m, const char *conv, const char *bn, int64_t cin, int64_t cout, int k,
                             int stride, ts_rng *rng) {
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.stride[0] = p.stride[1] = stride;
    p.padding[0] = p.padding[1] = k / 2;
    ts_module *c = NULL;
    ts_status st = ts_nn_conv2d_new(cin, cout, k, k, p, false, rng, &c);
    if (st == TS_OK) st = ts_module_add_child(m, conv, c);
    if (st == TS_OK) st = ts_nn_batchnorm2d_new(cout, 1e-5f, 0.1f, true, true, &c);
    if (st == TS_OK) st = ts_module_add_child(m, bn, c);
    return st;
}

static ts_status block_new(int64_t cin, int64_t cout, int stride, ts_rng *rng, ts_module **out) {
    ts_module *m = NULL, *sc = NULL;
    ts_status st = ts_nn_module_new("Block", block_forward, NULL, NULL, &m);
    if (st == TS_OK) st = add_conv_bn(m, "conv1", "bn1", cin, cout, 3, stride, rng);
    if (st == TS_OK) st = add_conv_bn(m, "conv2", "bn2", cout, cout, 3, 1, rng);
    if (st == TS_OK && (stride != 1 || cin != cout)) {
        ts_module *conv = NULL, *bn = NULL;
        ts_conv2d_params p = TS_CONV2D_DEFAULT;
        p.stride[0] = p.stride[1] = stride;
        st = ts_nn_sequential_new(&sc);
        if (st == TS_OK) st = ts_nn_conv2d_new(cin, cout, 1, 1, p, false, rng, &conv);
        if (st == TS_OK) st = ts_nn_sequential_add(sc, NULL, conv);
        if (st == TS_OK) st = ts_nn_batchnorm2d_new(cout, 1e-5f, 0.1f, true, true, &bn);
        if (st == TS_OK) st = ts_nn_sequential_add(sc, NULL, bn);
        if (st == TS_OK) st = ts_module_add_child(m, "shortcut", sc);
        else ts_module_free(sc);
    }
    if (st != TS_OK) {
        ts_module_free(m);
        return st;
    }
    *out = m;
    return TS_OK;
}

/* The whole network: (N, 1, 28, 28) -> (N, 10). */
static ts_status model_new(ts_rng *rng, ts_module **out) {
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    ts_status st = ts_nn_sequential_new(&s);
#define ADD(call)                                                                       \
    do {                                                                                \
        if (st == TS_OK) st = (call);                                                   \
        if (st == TS_OK) st = ts_nn_sequential_add(s, NULL, c);                         \
    } while (0)
    ADD(ts_nn_conv2d_new(1, 16, 3, 3, p, false, rng, &c)); /* 0: (N, 16, 28, 28) */
    ADD(ts_nn_batchnorm2d_new(16, 1e-5f, 0.1f, true, true, &c));
    ADD(ts_nn_relu_new(&c));
    ADD(block_new(16, 16, 1, rng, &c)); /* 3 */
    ADD(block_new(16, 32, 2, rng, &c)); /* 4: (N, 32, 14, 14) */
    ADD(block_new(32, 64, 2, rng, &c)); /* 5: (N, 64, 7, 7) */
    ADD(ts_nn_global_avgpool2d_new(&c));
    ADD(ts_nn_flatten_new(&c));
    ADD(ts_nn_linear_new(64, 10, true, rng, &c)); /* 8: (N, 10) */
#undef ADD
    if (st != TS_OK) {
        ts_module_free(s);
        return st;
    }
    *out = s;
    return TS_OK;
}

/* Loads the checkpoint's model weights (ts_weights_read) into a fresh model; its logits on x must equal `want`'s. */
static int reload_and_compare(const char *path, const ts_tensor *x, const ts_tensor *want) {
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    ts_module *fresh = NULL;
    ts_tensor *got = NULL;
    ts_rng rng;
    ts_rng_seed(&rng, 12345); /* other initial weights: the checkpoint must replace them all */
    CHECK(ts_weights_read(path, &sd, NULL));
    CHECK(model_new(&rng, &fresh));
    CHECK(ts_module_load_state_dict(fresh, &sd, true));
    ts_module_train(fresh, false);
    bool prev = ts_grad_set_enabled(false);
    CHECK(ts_module_forward(fresh, x, &got));
    ts_grad_set_enabled(prev);
    const float *a = ts_tensor_data(got), *b = ts_tensor_data((ts_tensor *)want);
    double worst = 0;
    for (int64_t i = 0; i < ts_tensor_numel(got); i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    printf("reloaded %s: %d tensors, logits of a test batch differ by at most %g\n", path, sd.n, worst);
    ts_tensor_release(got);
    ts_module_free(fresh);
    ts_tensor_list_clear(&sd);
    return worst == 0 ? 0 : 1;
}

static ts_status report(const ts_train_event *ev, void *user) {
    (void)user;
    if (ev->rank == 0 && ev->kind == TS_TRAIN_EPOCH_END && ev->eval)
        printf("epoch %lld: loss %.4f, test accuracy %.2f%%\n", (long long)ev->epoch + 1, ev->mean_loss,
               100.0 * ev->eval->accuracy);
    fflush(stdout);
    return TS_OK;
}

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist", *ckpt = "custom_resnet.ckpt";
    long epochs = 1, max_steps = 0, batch = 32;
    double lr = 0.05;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--data")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--epochs")) epochs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-steps")) max_steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--checkpoint")) ckpt = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR] "
                            "[--checkpoint PATH]\n", argv[0]);
            return 2;
        }
    }
    /* one DDP rank of the job the launcher started (or a world of one) */
    ts_dist_env env;
    bool in_job = false;
    CHECK(ts_dist_env_detect(&env, &in_job));
    if (in_job) {
        ts_pg_options po = TS_PG_OPTIONS_INIT;
        CHECK(ts_pg_new(&po, &pg));
        rank = ts_pg_rank(pg);
    }
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = dir;
    d.batch_size = batch;
    d.rank = rank;
    d.world_size = pg ? ts_pg_size(pg) : 1;
    ts_batch_source *train = NULL, *test = NULL;
    CHECK(ts_data_open(&d, &train, rank == 0 ? &test : NULL));

    ts_rng rng;
    ts_rng_seed(&rng, 42);
    ts_module *model = NULL;
    CHECK(model_new(&rng, &model));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = pg ? TS_STRATEGY_DDP : TS_STRATEGY_NONE;
    so.pg = pg;
    ts_strategy *s = NULL;
    CHECK(ts_strategy_new(model, &so, &s));
    if (rank == 0)
        printf("custom ResNet: %lld parameters, %d rank(s)\n", (long long)ts_module_num_parameters(ts_strategy_model(s)),
               ts_strategy_world_size(s));

    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt = NULL;
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    CHECK(ts_optimizer_by_name("sgd", &params, lr, 0.9, 5e-4, &opt));
    int64_t nb = ts_batch_source_num_batches(train, 0);
    ts_lr_schedule sched;
    CHECK(ts_lr_schedule_by_name("cosine", lr, max_steps ? max_steps : epochs * nb, nb, &sched));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = epochs;
    to.max_steps = max_steps;
    to.schedule = &sched;
    to.eval = test;
    to.checkpoint = ckpt;
    to.callback = report;
    to.batch_size = batch;
    ts_trainer *t = NULL;
    CHECK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result r;
    CHECK(ts_trainer_run(t, &r));
    int rc = 0;
    if (rank == 0) {
        printf("done: %lld steps, test accuracy %.2f%%\n", (long long)r.steps, 100.0 * r.eval.accuracy);
        /* the checkpoint loads back: a fresh model computes the trained model's logits */
        ts_batch b;
        ts_tensor *want = NULL;
        CHECK(ts_batch_source_seek(test, 0, 0));
        CHECK(ts_batch_source_next(test, &b));
        ts_module_train(ts_strategy_model(s), false);
        bool prev = ts_grad_set_enabled(false);
        CHECK(ts_module_forward(ts_strategy_model(s), b.x, &want));
        ts_grad_set_enabled(prev);
        rc = reload_and_compare(ckpt, b.x, want);
        ts_tensor_release(want);
    }
    if (pg) CHECK(ts_barrier(pg, NULL));
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    ts_pg_free(pg);
    return rc;
}
