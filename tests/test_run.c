/*
 * tests/test_run.c — a training run described as data (tessera/run.h):
 * ts_run_config_check's message for each bad field, the names of the config's
 * enums and back, the precision applied in one place, ts_run_open + ts_run_train
 * end to end on Fashion-MNIST (the schedule spanning max_steps), resume taking
 * the model from the checkpoint (bit for bit; a disagreeing model refused
 * naming both), and the checkpoint's model read and written
 * (ts_checkpoint_model_load / _save), and a module of the caller's (config.module) trained in place.
 */
#include "test_util.h"

#include <unistd.h>

#define FMNIST "/usr/share/datasets/fashion-mnist"

static bool have_data(void) { return access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) == 0; }

/* A config whose data exists (the test's folder, so the checks do not need the data set). */
static ts_run_config base(void) {
    ts_run_config c = TS_RUN_CONFIG_INIT;
    c.data = tu_tmpdir();
    return c;
}

/* check(c) fails with `want`, its message mentioning `needle`. */
static void expect_bad(const ts_run_config *c, ts_status want, const char *needle) {
    CHECK_STATUS(ts_run_config_check(c), want);
    CHECK_ERR_MENTIONS(needle);
}

static void test_check_defaults(void) {
    ts_run_config c = base();
    CHECK_OK(ts_run_config_check(&c));
    CHECK(c.model == NULL && c.epochs == 4 && c.batch_size == 64 && c.lr == 0.05 && c.optimizer == TS_OPTIMIZER_SGD &&
          c.lr_schedule == TS_LR_COSINE && c.precision == TS_PRECISION_FP32 && c.loss_scale == 65536.0 &&
          c.accum_steps == 1 && c.nproc == 1 && c.micro_batches == 8 && c.pp_schedule == TS_PP_1F1B &&
          c.backend == TS_RUN_BACKEND_AUTO && c.strategy == TS_STRATEGY_NONE && c.data_threads == 2);
    ts_run_config z = {0};
    expect_bad(&z, TS_ERR_INVALID_ARG, "TS_RUN_CONFIG_INIT");
    CHECK_STATUS(ts_run_config_check(NULL), TS_ERR_INVALID_ARG);
}

static void test_check_values(void) {
    ts_run_config c = base();
    c.model = "resnet9000";
    expect_bad(&c, TS_ERR_INVALID_ARG, "unknown model 'resnet9000' (expected one of cnn, mlp, resnet18");
    c = base(), c.model = "cnn", c.image_size = 64;
    expect_bad(&c, TS_ERR_INVALID_ARG, "image_size 64: model cnn takes 28x28 images only");
    c = base(), c.epochs = 0;
    expect_bad(&c, TS_ERR_INVALID_ARG, "epochs 0: expected a value in [1, 1e+06]");
    c = base(), c.batch_size = -3;
    expect_bad(&c, TS_ERR_INVALID_ARG, "batch_size -3");
    c = base(), c.lr = NAN;
    expect_bad(&c, TS_ERR_INVALID_ARG, "lr nan");
    c = base(), c.accum_steps = 0;
    expect_bad(&c, TS_ERR_INVALID_ARG, "accum_steps 0");
    c = base(), c.momentum = 1.5;
    expect_bad(&c, TS_ERR_INVALID_ARG, "momentum 1.5");
    c = base(), c.loss_scale = 0;
    expect_bad(&c, TS_ERR_INVALID_ARG, "loss_scale 0");
    c = base(), c.nproc = 0;
    expect_bad(&c, TS_ERR_INVALID_ARG, "nproc 0");
    c = base(), c.data = "/no/such/dir";
    expect_bad(&c, TS_ERR_IO, "data /no/such/dir: No such file");
    c = base(), c.init_exclude = "fc";
    expect_bad(&c, TS_ERR_INVALID_ARG, "init_exclude goes with init_from");
}

static void test_check_enums(void) {
    ts_run_config c = base();
    c.optimizer = (ts_optimizer_kind)7;
    expect_bad(&c, TS_ERR_INVALID_ARG, "optimizer 7: expected sgd or adamw");
    c = base(), c.lr_schedule = (ts_lr_kind)9;
    expect_bad(&c, TS_ERR_INVALID_ARG, "lr_schedule 9: expected none, step or cosine");
    c = base(), c.precision = TS_PRECISION_COUNT;
    expect_bad(&c, TS_ERR_INVALID_ARG, "precision 3: expected fp32, bf16 or fp16");
    c = base(), c.strategy = TS_STRATEGY_COUNT;
    expect_bad(&c, TS_ERR_INVALID_ARG, "strategy 6: expected none, ddp, data, model, pipeline or tile");
    c = base(), c.conv_algo = (ts_conv_algo)-1;
    expect_bad(&c, TS_ERR_INVALID_ARG, "conv_algo -1: expected auto, im2col");
    c = base(), c.pp_schedule = (ts_pp_schedule)2;
    expect_bad(&c, TS_ERR_INVALID_ARG, "pp_schedule 2: expected gpipe or 1f1b");
    c = base(), c.decode = (ts_decode_device)2;
    expect_bad(&c, TS_ERR_INVALID_ARG, "decode 2: expected cpu or mixed");
    c = base(), c.backend = TS_RUN_BACKEND_COUNT;
    expect_bad(&c, TS_ERR_INVALID_ARG, "backend 4: expected auto, builtin, mpi or nccl");
    c = base(), c.ddp_comm = TS_PRECISION_FP16;
    expect_bad(&c, TS_ERR_INVALID_ARG, "ddp_comm 2: expected fp32 or bf16");
}

static void test_check_combinations(void) {
    ts_run_config c = base();
    c.device = "cpu", c.devices = "cpu:0,cpu:1";
    expect_bad(&c, TS_ERR_INVALID_ARG, "device runs the model on one device per process, devices spreads it");
    c = base(), c.device = "cpu", c.strategy = TS_STRATEGY_DATA;
    expect_bad(&c, TS_ERR_INVALID_ARG, "device runs the model on one device per process; strategy data takes devices");
    c = base(), c.strategy = TS_STRATEGY_DDP;
    expect_bad(&c, TS_ERR_INVALID_ARG, "strategy ddp needs nproc N or a launcher");
    c = base(), c.strategy = TS_STRATEGY_DATA, c.nproc = 2;
    expect_bad(&c, TS_ERR_INVALID_ARG, "strategy data runs one process on several devices; it cannot be combined with nproc 2");
    c = base(), c.devices = "cpu:0", c.nproc = 2;
    expect_bad(&c, TS_ERR_INVALID_ARG, "devices goes with strategy data, model, pipeline or tile");
    c = base(), c.devices = "cpu:0,cpu:1";
    expect_bad(&c, TS_ERR_INVALID_ARG, "devices needs strategy (data, model, pipeline or tile)");
    c = base(), c.decode = TS_DECODE_MIXED;
    expect_bad(&c, TS_ERR_INVALID_ARG, "decode mixed decodes the training images on the GPU the model trains on");
    c = base(), c.precision = TS_PRECISION_FP16, c.strategy = TS_STRATEGY_PIPELINE;
    expect_bad(&c, TS_ERR_INVALID_ARG, "precision fp16 (loss scaling) is not available with strategy pipeline");
    c = base(), c.ddp_comm = TS_PRECISION_BF16, c.backend = TS_RUN_BACKEND_MPI;
    expect_bad(&c, TS_ERR_INVALID_ARG, "ddp_comm bf16 needs backend builtin or nccl");
    c = base(), c.backend = TS_RUN_BACKEND_NCCL;
    if (ts_pg_backend_available("nccl"))
        CHECK_OK(ts_run_config_check(&c));
    else
        expect_bad(&c, TS_ERR_UNSUPPORTED, "backend nccl: this Tessera was built without NCCL");
    /* nproc > 1 outside a launcher: valid, and the caller starts the processes */
    c = base(), c.nproc = 3;
    CHECK_OK(ts_run_config_check(&c));
    CHECK(ts_run_processes_to_start(&c) == 3);
    c.nproc = 1;
    CHECK(ts_run_processes_to_start(&c) == 0);
}

/* Every value's name parses back to it, in any case; other names are refused listing the known ones. */
static void test_names_round_trip(void) {
    for (int i = 0; i < TS_PRECISION_COUNT; i++) {
        ts_precision p = TS_PRECISION_COUNT;
        CHECK_OK(ts_precision_from_name(ts_precision_name((ts_precision)i), &p));
        CHECK(p == (ts_precision)i);
    }
    ts_precision p;
    CHECK_OK(ts_precision_from_name("BF16", &p));
    CHECK(p == TS_PRECISION_BF16 && ts_precision_dtype(p) == TS_BF16 && ts_precision_dtype(TS_PRECISION_FP16) == TS_F16);
    CHECK_STATUS(ts_precision_from_name("fp8", &p), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("unknown precision 'fp8' (expected fp32, bf16 or fp16)");
    CHECK(ts_precision_name(TS_PRECISION_COUNT) == NULL);
    for (int i = 0; i < TS_RUN_BACKEND_COUNT; i++) {
        ts_run_backend b = TS_RUN_BACKEND_COUNT;
        CHECK_OK(ts_run_backend_from_name(ts_run_backend_name((ts_run_backend)i), &b));
        CHECK(b == (ts_run_backend)i);
    }
    ts_run_backend b;
    CHECK_STATUS(ts_run_backend_from_name("gloo", &b), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("unknown backend 'gloo' (expected auto, builtin, mpi or nccl)");
    for (int i = 0; i < TS_OPTIMIZER_COUNT; i++) {
        ts_optimizer_kind k = TS_OPTIMIZER_COUNT;
        CHECK_OK(ts_optimizer_kind_from_name(ts_optimizer_kind_name((ts_optimizer_kind)i), &k));
        CHECK(k == (ts_optimizer_kind)i);
    }
    ts_optimizer_kind ok;
    CHECK_OK(ts_optimizer_kind_from_name("AdamW", &ok));
    CHECK(ok == TS_OPTIMIZER_ADAMW);
    CHECK_STATUS(ts_optimizer_kind_from_name("lion", &ok), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("unknown optimizer 'lion' (expected sgd or adamw)");
    for (int i = TS_LR_CONSTANT; i <= TS_LR_COSINE; i++) {
        ts_lr_kind k = (ts_lr_kind)-1;
        CHECK_OK(ts_lr_kind_from_name(ts_lr_kind_name((ts_lr_kind)i), &k));
        CHECK(k == (ts_lr_kind)i);
    }
    ts_lr_kind lk;
    CHECK_STATUS(ts_lr_kind_from_name("linear", &lk), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'linear' (expected none, step or cosine)");
    CHECK(ts_lr_kind_name((ts_lr_kind)3) == NULL && ts_optimizer_kind_name(TS_OPTIMIZER_COUNT) == NULL);
    /* the enums whose names live beside them */
    for (int i = TS_DECODE_CPU; i <= TS_DECODE_MIXED; i++) {
        ts_decode_device d = (ts_decode_device)-1;
        CHECK_OK(ts_decode_device_parse(ts_decode_device_name((ts_decode_device)i), &d));
        CHECK(d == (ts_decode_device)i);
    }
    CHECK(ts_decode_device_name((ts_decode_device)2) == NULL);
    for (int i = 0; i < TS_STRATEGY_COUNT; i++) {
        ts_strategy_kind k = TS_STRATEGY_COUNT;
        CHECK_OK(ts_strategy_kind_parse(ts_strategy_kind_name((ts_strategy_kind)i), &k));
        CHECK(k == (ts_strategy_kind)i);
    }
    for (int i = TS_CONV_AUTO; i <= TS_CONV_ONEDNN; i++) {
        ts_conv_algo a = (ts_conv_algo)-1;
        CHECK_OK(ts_conv_algo_parse(ts_conv_algo_name((ts_conv_algo)i), &a));
        CHECK(a == (ts_conv_algo)i);
    }
    for (int i = TS_PP_GPIPE; i <= TS_PP_1F1B; i++) {
        ts_pp_schedule s = (ts_pp_schedule)-1;
        CHECK_OK(ts_pp_schedule_parse(ts_pp_schedule_name((ts_pp_schedule)i), &s));
        CHECK(s == (ts_pp_schedule)i);
    }
}

/* Matmul precision and autocast set together (TS_AUTOCAST unset). */
static void test_precision_apply(void) {
    const char *env = getenv("TS_AUTOCAST");
    char saved[32] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("TS_AUTOCAST");
    CHECK_OK(ts_precision_apply(TS_PRECISION_BF16));
    CHECK(ts_get_matmul_precision() == TS_BF16 && ts_get_autocast() == TS_BF16);
    CHECK_OK(ts_precision_apply(TS_PRECISION_FP16));
    CHECK(ts_get_matmul_precision() == TS_F16 && ts_get_autocast() == TS_F32);
    setenv("TS_AUTOCAST", "bf16", 1); /* the environment decides autocast when set */
    CHECK_OK(ts_precision_apply(TS_PRECISION_FP32));
    CHECK(ts_get_matmul_precision() == TS_F32 && ts_get_autocast() == TS_F32);
    CHECK_STATUS(ts_precision_apply(TS_PRECISION_COUNT), TS_ERR_INVALID_ARG);
    if (saved[0]) setenv("TS_AUTOCAST", saved, 1);
    else unsetenv("TS_AUTOCAST");
    CHECK_OK(ts_set_autocast(TS_F32));
}

typedef struct events {
    int64_t steps;
    double last_lr;
} events;

static ts_status count_steps(const ts_train_event *ev, void *user) {
    events *e = user;
    if (ev->kind == TS_TRAIN_STEP) {
        e->steps++;
        e->last_lr = ev->lr;
    }
    return TS_OK;
}

/* A tiny run: the MLP, batches of 32, max_steps steps. */
static ts_run_config tiny(int64_t max_steps, events *ev) {
    ts_run_config c = TS_RUN_CONFIG_INIT;
    c.data = FMNIST;
    c.model = "mlp";
    c.batch_size = 32;
    c.seed = 3;
    c.max_steps = max_steps;
    c.threads = 2;
    c.callback = count_steps;
    c.user = ev;
    return c;
}

/* The model.* tensors of two checkpoints are byte for byte equal. */
static bool same_weights(const char *a, const char *b) {
    ts_tensor_list la = TS_TENSOR_LIST_INIT, lb = TS_TENSOR_LIST_INIT;
    bool same = ts_weights_read(a, &la, NULL) == TS_OK && ts_weights_read(b, &lb, NULL) == TS_OK && la.n == lb.n && la.n > 0;
    for (int i = 0; same && i < la.n; i++)
        same = strcmp(la.names[i], lb.names[i]) == 0 && ts_tensor_nbytes(la.tensors[i]) == ts_tensor_nbytes(lb.tensors[i]) &&
               memcmp(ts_tensor_data(la.tensors[i]), ts_tensor_data(lb.tensors[i]), ts_tensor_nbytes(la.tensors[i])) == 0;
    ts_tensor_list_clear(&la);
    ts_tensor_list_clear(&lb);
    return same;
}

static void test_run_end_to_end(void) {
    if (!have_data()) {
        fprintf(stderr, "skip: no %s\n", FMNIST);
        return;
    }
    char dir[512], straight[512], mid[600], resumed[512];
    snprintf(dir, sizeof dir, "%s/run_dir", tu_tmpdir());
    snprintf(straight, sizeof straight, "%s/run_straight.ckpt", tu_tmpdir());
    snprintf(mid, sizeof mid, "%s/step-000000000003.ckpt", dir);
    snprintf(resumed, sizeof resumed, "%s/run_resumed.ckpt", tu_tmpdir());
    events ev = {0};
    ts_run_config c = tiny(6, &ev);
    c.checkpoint = straight;
    c.checkpoint_dir = dir;
    c.checkpoint_every = 3;
    ts_run *run = NULL;
    CHECK_OK(ts_run_open(&c, &run));
    if (!run) return;
    CHECK(ts_run_rank(run) == 0 && ts_run_world_size(run) == 1 && ts_run_process_group(run) == NULL);
    CHECK(ts_run_steps_per_epoch(run) == 1875 && ts_run_total_steps(run) == 6); /* max_steps is the run's length */
    CHECK(ts_run_resumed(run, NULL) == NULL && !ts_run_initialised(run));
    CHECK(strcmp(ts_run_config_of(run)->model, "mlp") == 0 && ts_run_config_of(run)->num_classes == 10);
    CHECK(ts_strategy_kind_of(ts_run_strategy(run)) == TS_STRATEGY_NONE && ts_run_eval_source(run) != NULL);
    ts_train_result r;
    CHECK_OK(ts_run_train(run, &r));
    CHECK(r.steps == 6 && ev.steps == 6 && r.eval.samples == 10000 && r.skipped_samples == 0);
    /* cosine over the 6 steps (torch's CosineAnnealingLR, T_max = 6) at the last one, step 5 */
    CHECK_NEAR(ev.last_lr, 0.05 * (1 + cos(acos(-1.0) * 5 / 6)) / 2, 1e-12);
    ts_run_free(run);

    /* resume from the middle without naming the model: the checkpoint's, and the same end bit for bit */
    events ev2 = {0};
    ts_run_config rc = tiny(6, &ev2);
    rc.model = NULL;
    rc.seed = 99; /* the checkpoint's seed wins */
    rc.resume = mid;
    rc.checkpoint = resumed;
    run = NULL;
    CHECK_OK(ts_run_open(&rc, &run));
    if (!run) return;
    ts_train_checkpoint_info info;
    CHECK(ts_run_resumed(run, &info) != NULL && info.step == 3 && info.num_classes == 10 && info.height == 28);
    CHECK(strcmp(ts_run_config_of(run)->model, "mlp") == 0 && ts_run_config_of(run)->seed == 3);
    CHECK_OK(ts_run_train(run, &r));
    CHECK(r.steps == 6 && ev2.steps == 3);
    ts_run_free(run);
    CHECK(same_weights(straight, resumed));

    /* a model or class count that disagrees with the checkpoint is refused, naming both */
    rc.model = "cnn";
    CHECK_STATUS(ts_run_open(&rc, &run), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("resume: ");
    CHECK_ERR_MENTIONS("this is a mlp checkpoint; the model is cnn");
    CHECK(run == NULL);
    rc.model = NULL;
    rc.num_classes = 12;
    CHECK_STATUS(ts_run_open(&rc, &run), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("num_classes 12:");
    CHECK_ERR_MENTIONS("was written with 10 classes");
}

/* Without max_steps the schedule spans the epochs; fewer max_steps shorten it. */
static void test_run_schedule_length(void) {
    if (!have_data()) return;
    events ev = {0};
    ts_run_config c = tiny(0, &ev);
    c.epochs = 2;
    c.accum_steps = 2;
    ts_run *run = NULL;
    CHECK_OK(ts_run_open(&c, &run));
    CHECK(ts_run_steps_per_epoch(run) == 938 && ts_run_total_steps(run) == 2 * 938); /* ceil(1875 / 2) */
    ts_run_free(run);
    c.max_steps = 5000; /* more than the epochs': the epochs decide */
    CHECK_OK(ts_run_open(&c, &run));
    CHECK(ts_run_total_steps(run) == 2 * 938);
    ts_run_free(run);
    c.data = "/no/such/dir"; /* ts_run_open checks the config first */
    CHECK_STATUS(ts_run_open(&c, &run), TS_ERR_IO);
    CHECK_ERR_MENTIONS("data /no/such/dir");
}

/* The checkpoint's model: read (name, classes, input, weights), and written with class names. */
static void test_checkpoint_model(void) {
    ts_rng rng;
    ts_rng_seed(&rng, 1);
    ts_module *m = NULL;
    CHECK_OK(ts_model_new("mlp", 4, &rng, &m));
    char path[512], path2[512];
    snprintf(path, sizeof path, "%s/model.ckpt", tu_tmpdir());
    snprintf(path2, sizeof path2, "%s/model2.ckpt", tu_tmpdir());
    char *names[4] = {"ant", "bee", "cat", "dog"};
    ts_checkpoint_model_info info = {0};
    snprintf(info.model, sizeof info.model, "mlp");
    info.num_classes = 4;
    info.class_names = names;
    info.num_class_names = 4;
    CHECK_OK(ts_checkpoint_model_save(path, m, &info));
    ts_module *back = NULL;
    ts_checkpoint_model_info got;
    CHECK_OK(ts_checkpoint_model_load(path, NULL, &back, &got));
    CHECK(strcmp(got.model, "mlp") == 0 && got.num_classes == 4 && got.image_size == 0 && got.channels == 1 &&
          got.height == 28 && got.width == 28 && got.num_class_names == 4);
    char buf[32];
    CHECK(strcmp(ts_checkpoint_class_name(&got, 2, buf, sizeof buf), "cat") == 0);
    CHECK(strcmp(ts_checkpoint_class_name(&got, 7, buf, sizeof buf), "class 7") == 0);
    /* the weights are the saved model's */
    int64_t xs[4] = {2, 1, 28, 28};
    ts_tensor *x = tu_rand(&rng, 4, xs, -1, 1, false), *y0 = NULL, *y1 = NULL;
    ts_module_train(m, false);
    CHECK_OK(ts_module_forward(m, x, &y0));
    CHECK_OK(ts_module_forward(back, x, &y1));
    CHECK(y0 && y1 && ts_tensor_numel(y1) == 8 && memcmp(ts_tensor_data(y0), ts_tensor_data(y1), 8 * sizeof(float)) == 0);
    ts_tensor_release(x);
    ts_tensor_release(y0);
    ts_tensor_release(y1);
    ts_checkpoint_model_info_clear(&got);
    CHECK(got.class_names == NULL && got.num_class_names == 0);
    /* another model name is refused naming both; the info alone needs no model */
    ts_module *none = NULL;
    CHECK_STATUS(ts_checkpoint_model_load(path, "cnn", &none, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("this is a mlp checkpoint; the model is cnn");
    CHECK(none == NULL);
    CHECK_OK(ts_checkpoint_model_load(path, "mlp", NULL, &got));
    CHECK(got.num_classes == 4);
    ts_checkpoint_model_info_clear(&got);
    /* a checkpoint without the model's name: the caller names it */
    ts_ckpt *ck = ts_ckpt_new();
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    CHECK_OK(ts_ckpt_add_tensors(ck, "model.", &sd));
    CHECK_OK(ts_ckpt_save(ck, path2));
    CHECK_STATUS(ts_checkpoint_model_load(path2, NULL, NULL, &got), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("records no model name");
    CHECK_OK(ts_checkpoint_model_load(path2, "mlp", &none, &got));
    CHECK(got.num_classes == 4); /* the output layer's rows */
    ts_checkpoint_model_info_clear(&got);
    ts_module_free(none);
    ts_tensor_list_clear(&sd);
    ts_ckpt_free(ck);
    ts_module_free(back);
    ts_module_free(m);
}

/* The field table: every field found by its name and its flag, set from text as the command and
 * tessera.train set it, with bad names and values refused naming the field and leaving the config as it was. */
static void test_fields_set(void) {
    int n = 0;
    const ts_run_field *f = ts_run_fields(&n);
    CHECK(n >= 40);
    for (int i = 0; i < n; i++) {
        CHECK(ts_run_field_find(f[i].name) == &f[i] && ts_run_field_find(f[i].flag) == &f[i]);
        CHECK(f[i].help && *f[i].help);
        CHECK(f[i].offset + sizeof(int) <= sizeof(ts_run_config));
    }
    CHECK(ts_run_field_find("image-size") == ts_run_field_find("image_size"));
    CHECK(ts_run_field_find("schedule") == ts_run_field_find("pp_schedule"));
    CHECK(ts_run_field_find("callback") == NULL && ts_run_field_find("size") == NULL);

    ts_run_config c = base();
    CHECK_OK(ts_run_config_set(&c, "image-size", "64"));
    CHECK_OK(ts_run_config_set(&c, "model", "resnet18"));
    CHECK_OK(ts_run_config_set(&c, "lr", "0.125"));
    CHECK_OK(ts_run_config_set(&c, "sync_bn", "true"));
    CHECK_OK(ts_run_config_set(&c, "precision", "BF16"));
    CHECK_OK(ts_run_config_set(&c, "schedule", "gpipe"));
    CHECK_OK(ts_run_config_set(&c, "ddp_comm", "bf16"));
    CHECK(c.image_size == 64 && strcmp(c.model, "resnet18") == 0 && c.lr == 0.125 && c.sync_bn &&
          c.precision == TS_PRECISION_BF16 && c.pp_schedule == TS_PP_GPIPE && c.ddp_comm == TS_PRECISION_BF16);
    CHECK_OK(ts_run_config_set(&c, "sync-bn", "0"));
    CHECK(!c.sync_bn);
    CHECK_OK(ts_run_config_check(&c));

    ts_run_config before = c;
    CHECK_STATUS(ts_run_config_set(&c, "imagesize", "64"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("unknown field 'imagesize'");
    CHECK_STATUS(ts_run_config_set(&c, "epochs", "0"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("epochs 0: expected a value in [1, 1e+06]");
    CHECK_STATUS(ts_run_config_set(&c, "batch_size", "32.5"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("batch_size: expected an integer, got '32.5'");
    CHECK_STATUS(ts_run_config_set(&c, "lr", "nan"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("lr: expected a number");
    CHECK_STATUS(ts_run_config_set(&c, "sync_bn", "yes"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("sync_bn: expected true or false, got 'yes'");
    CHECK_STATUS(ts_run_config_set(&c, "ddp_comm", "fp16"), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ddp_comm: unknown value 'fp16' (expected fp32 or bf16)");
    CHECK_STATUS(ts_run_config_set(&c, "data", ""), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("data: expected a non-empty value");
    CHECK(memcmp(&before, &c, sizeof c) == 0);
}


/* A forward of the test's own: Flatten, then the child "fc" (a Linear from 784). */
static ts_status flat_fc_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *f = NULL;
    ts_status st = ts_flatten(x, 1, &f);
    if (st == TS_OK) st = ts_module_call(self, "fc", f, out);
    ts_tensor_release(f);
    return st;
}

/* config.module: the zoo's MLP built from the run's seed, handed to the run, trains to the same weights bit for
 * bit as model "mlp" — in place (the module's own tensors are the trained ones) —; checkpoints record its type
 * name; resuming loads a checkpoint into it (the same end bit for bit), and one of a module of another name is
 * refused naming both. */
static void test_run_module(void) {
    if (!have_data()) return;
    char zoo_ck[512], mod_ck[512], dir[512], mid[600], resumed[512];
    snprintf(zoo_ck, sizeof zoo_ck, "%s/mod_zoo.ckpt", tu_tmpdir());
    snprintf(mod_ck, sizeof mod_ck, "%s/mod_module.ckpt", tu_tmpdir());
    snprintf(dir, sizeof dir, "%s/mod_dir", tu_tmpdir());
    snprintf(mid, sizeof mid, "%s/step-000000000002.ckpt", dir);
    snprintf(resumed, sizeof resumed, "%s/mod_resumed.ckpt", tu_tmpdir());
    events ev = {0};
    ts_run_config c = tiny(4, &ev);
    c.checkpoint = zoo_ck;
    ts_run *run = NULL;
    ts_train_result r;
    CHECK_OK(ts_run_open(&c, &run));
    CHECK_OK(ts_run_train(run, &r));
    ts_run_free(run);

    ts_rng rng;
    ts_rng_seed(&rng, 3); /* what the run draws model "mlp" from (seed 3) */
    ts_module *m = NULL;
    CHECK_OK(ts_model_new("mlp", 10, &rng, &m));
    if (!m) return;
    ts_tensor *w = ts_module_param(ts_module_child(m, "1"), "weight");
    float w0 = ts_tensor_data_f32(w)[0];
    events ev2 = {0};
    ts_run_config mc = tiny(4, &ev2);
    mc.model = NULL;
    mc.module = m;
    mc.checkpoint = mod_ck;
    mc.checkpoint_dir = dir;
    mc.checkpoint_every = 2;
    CHECK_OK(ts_run_open(&mc, &run));
    if (!run) return;
    CHECK(strcmp(ts_run_config_of(run)->model, "Sequential") == 0 && ts_run_config_of(run)->num_classes == 10);
    CHECK_OK(ts_run_train(run, &r));
    ts_run_free(run);
    CHECK(r.steps == 4 && ev2.steps == 4);
    CHECK(same_weights(zoo_ck, mod_ck)); /* the zoo's run and the module's: the same weights */
    ts_tensor_list saved = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_weights_read(mod_ck, &saved, NULL));
    ts_tensor *sw = ts_tensor_list_find(&saved, "1.weight");
    CHECK(sw && ts_tensor_data_f32(w)[0] != w0 && ts_tensor_data_f32(w)[0] == ts_tensor_data_f32(sw)[0]);
    ts_tensor_list_clear(&saved);

    /* resuming into a fresh module of the same name: the checkpoint's weights, the same end */
    ts_module *m2 = NULL;
    CHECK_OK(ts_model_new("mlp", 10, NULL, &m2));
    mc.module = m2;
    mc.checkpoint_dir = NULL;
    mc.resume = mid;
    mc.checkpoint = resumed;
    CHECK_OK(ts_run_open(&mc, &run));
    CHECK(ts_run_resumed(run, NULL) != NULL);
    CHECK_OK(ts_run_train(run, &r));
    ts_run_free(run);
    CHECK(same_weights(mod_ck, resumed));

    /* a module of another name: refused, naming both */
    ts_module *other = NULL, *fc = NULL;
    CHECK_OK(ts_nn_module_new("FlatFC", flat_fc_forward, NULL, NULL, &other));
    CHECK_OK(ts_nn_linear_new(784, 10, true, NULL, &fc));
    CHECK_OK(ts_module_add_child(other, "fc", fc));
    mc.module = other;
    CHECK_STATUS(ts_run_open(&mc, &run), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("Sequential");
    CHECK_ERR_MENTIONS("FlatFC");
    CHECK(run == NULL);
    /* and trained afresh it runs, recording its own name */
    mc.resume = NULL;
    mc.checkpoint = NULL;
    CHECK_OK(ts_run_open(&mc, &run));
    CHECK(run && strcmp(ts_run_config_of(run)->model, "FlatFC") == 0);
    CHECK_OK(ts_run_train(run, &r));
    ts_run_free(run);
    CHECK(r.steps == 4 && isfinite(r.final_loss));
    ts_module_free(other);
    ts_module_free(m2);
    ts_module_free(m);
}

int main(int argc, char **argv) {
    ts_set_num_threads(2);
    static const tu_test tests[] = {
        T(test_check_defaults), T(test_check_values), T(test_check_enums), T(test_check_combinations),
        T(test_names_round_trip), T(test_fields_set), T(test_precision_apply), T(test_checkpoint_model), T(test_run_schedule_length),
        T(test_run_end_to_end), T(test_run_module),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
