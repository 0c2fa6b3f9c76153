/*
 * tests/test_gpt_pipeline.c — a GPT (ts_model_gpt) under pipeline parallelism (--strategy pipeline) on virtual
 * CPU devices equals one device: the embedding on the first stage, the blocks split by count, ln_f and the tied
 * head on the last, the head's copy of transformer.wte whose gradient joins wte's after the backward.
 *  - 6 AdamW steps through the strategies (GPipe and 1F1B, 1, 2 and 3 stages, micro-batches that divide
 *    the batch and that do not, some targets ignore_index): every step's loss and, at the end, every
 *    parameter within 1e-5 of one device's (the micro-batches change only the order of summation);
 *  - the state dict's names are the one-device GPT's (no copy of the head, no pipeline prefix), so a
 *    checkpoint loads into a one-device model; the blocks sit on their stages' devices;
 *  - evaluation (the pipeline's forward) gives one device's logits; forward + ts_backward on the caller's
 *    thread (the copy of wte recorded by autograd) gives one device's gradients, wte's included;
 *  - errors: more stages than blocks, bad bounds, a failing stage, each named; a run after a failure.
 */
#include "test_util.h"

enum { L = 4, H = 2, C = 32, T = 16, V = 48, B = 6 };

static ts_device *devs[4];
static double worst_param, worst_loss; /* figures for the docs */

static ts_module *gpt(void) {
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = L, c.n_head = H, c.n_embd = C, c.seq_len = T, c.vocab_size = V;
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    return m;
}

/* Token windows (B, T) and next-token targets; with `ignore`, a few targets are ignore_index (-100),
 * all of sample 0's among them (a micro-batch of one sample counts nothing). */
static void batch(uint64_t seed, bool ignore, ts_tensor **x, ts_tensor **y) {
    int64_t shape[2] = {B, T}, tok[B * T], tgt[B * T];
    ts_rng r;
    ts_rng_seed(&r, seed);
    for (int i = 0; i < B * T; i++) tok[i] = (int64_t)(ts_rng_u32(&r) % V);
    for (int i = 0; i < B * T; i++) tgt[i] = (i % T == T - 1) ? tok[i] : tok[i + 1];
    for (int i = 0; ignore && i < B * T; i++)
        if (i < T || i % 7 == 3) tgt[i] = -100;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, shape, tok, x));
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, shape, tgt, y));
}

static ts_strategy *strategy(ts_strategy_kind kind, int nstages, const int *bounds, int micro, ts_pp_schedule sched) {
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = kind;
    if (kind == TS_STRATEGY_PIPELINE) {
        so.devices = devs;
        so.num_devices = nstages;
        so.bounds = bounds;
        so.micro_batches = micro;
        so.schedule = sched;
        so.sample_ndim = 1; /* as tessera train gives it: a GPT ignores it (split by blocks) */
        so.sample_shape[0] = T;
    }
    ts_strategy *s = NULL;
    CHECK_OK(ts_strategy_new(gpt(), &so, &s));
    return s;
}

static double max_diff(ts_tensor *a, ts_tensor *b) {
    double w = 0;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) w = fmax(w, fabs(ts_tensor_item(a, i) - ts_tensor_item(b, i)));
    return w;
}

/* Steps of AdamW on one device and through a pipeline: losses and parameters compared. */
static void check_training(int nstages, const int *bounds, int micro, ts_pp_schedule sched, bool ignore) {
    ts_strategy *one = strategy(TS_STRATEGY_NONE, 1, NULL, 1, sched);
    ts_strategy *pipe = strategy(TS_STRATEGY_PIPELINE, nstages, bounds, micro, sched);
    if (!one || !pipe) goto done;
    ts_tensor_list p1 = TS_TENSOR_LIST_INIT, p2 = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ts_strategy_model(one), &p1));
    CHECK_OK(ts_module_parameters(ts_strategy_model(pipe), &p2));
    CHECK(p1.n == p2.n && p1.n == 4 + 12 * L);
    ts_optimizer *o1 = NULL, *o2 = NULL;
    CHECK_OK(ts_optimizer_by_name("adamw", &p1, 1e-3, 0.0, 0.1, &o1));
    CHECK_OK(ts_optimizer_by_name("adamw", &p2, 1e-3, 0.0, 0.1, &o2));
    for (int step = 0; step < 6; step++) {
        ts_tensor *x = NULL, *y = NULL;
        batch(100 + (uint64_t)step, ignore, &x, &y);
        float l1 = 0, l2 = 0;
        CHECK_OK(ts_strategy_forward_backward(one, x, y, 0.0f, &l1));
        CHECK_OK(ts_strategy_forward_backward(pipe, x, y, 0.0f, &l2));
        CHECK_NEAR(l2, l1, 1e-5);
        worst_loss = fmax(worst_loss, fabs((double)l1 - l2));
        CHECK_OK(ts_optimizer_step(o1));
        CHECK_OK(ts_optimizer_step(o2));
        ts_optimizer_zero_grad(o1);
        ts_optimizer_zero_grad(o2);
        ts_tensor_release(x);
        ts_tensor_release(y);
    }
    double worst = 0;
    for (int k = 0; k < p1.n && k < p2.n; k++) {
        CHECK(strcmp(p1.names[k], p2.names[k]) == 0);
        worst = fmax(worst, max_diff(p1.tensors[k], p2.tensors[k]));
        CHECK(ts_tensor_grad(p2.tensors[k]) == NULL); /* zero_grad reached every one: no gradient elsewhere */
    }
    CHECK(worst <= 1e-5);
    worst_param = fmax(worst_param, worst);
    fprintf(stderr, "  %s, %d stages, %d micro-batches%s: 6 AdamW steps, parameters differ by at most %.3g\n",
            ts_pp_schedule_name(sched), nstages, micro, ignore ? ", ignored targets" : "", worst);
    ts_optimizer_free(o1);
    ts_optimizer_free(o2);
    ts_tensor_list_clear(&p1);
    ts_tensor_list_clear(&p2);
done:
    ts_strategy_free(one);
    ts_strategy_free(pipe);
}

static void test_gpipe_two_stages(void) { check_training(2, NULL, 3, TS_PP_GPIPE, false); }
static void test_1f1b_two_stages(void) { check_training(2, NULL, 4, TS_PP_1F1B, true); } /* pieces 2, 2, 2 */
static void test_1f1b_three_stages(void) { check_training(3, (const int[]){1, 3, 4}, 5, TS_PP_1F1B, false); }
static void test_gpipe_one_sample_micro_batches(void) { check_training(2, NULL, 6, TS_PP_GPIPE, true); }
/* one stage: the head's copy of wte lives on wte's own device, still a leaf of its own */
static void test_one_stage(void) { check_training(1, NULL, 2, TS_PP_GPIPE, false); }

/* The names and devices: the one-device GPT's state dict, the blocks on their stages. */
static void test_names_and_placement(void) {
    ts_strategy *pipe = strategy(TS_STRATEGY_PIPELINE, 2, NULL, 2, TS_PP_1F1B);
    ts_module *ref = gpt();
    if (!pipe || !ref) goto done;
    ts_tensor_list a = TS_TENSOR_LIST_INIT, b = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(ref, &a));
    CHECK_OK(ts_module_state_dict(ts_strategy_model(pipe), &b));
    CHECK(a.n == b.n);
    for (int k = 0; k < a.n && k < b.n; k++) CHECK(strcmp(a.names[k], b.names[k]) == 0);
    ts_module *m = ts_strategy_model(pipe);
    CHECK(ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.wte"), "weight")) == devs[0]);
    CHECK(ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.wpe"), "weight")) == devs[0]);
    CHECK(ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.h.1.mlp.c_fc"), "weight")) == devs[0]);
    CHECK(ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.h.2.ln_1"), "weight")) == devs[1]);
    CHECK(ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.ln_f"), "weight")) == devs[1]);
    ts_pp_stats st;
    CHECK_OK(ts_pp_get_stats(ts_strategy_module(pipe), &st));
    CHECK(st.stages == 2 && st.layers[0] == 2 && st.layers[1] == 2); /* blocks per stage */
    char desc[256];
    ts_strategy_describe(pipe, desc, sizeof desc);
    CHECK(strstr(desc, "cpu:0: 2 blocks, cpu:1: 2 blocks") != NULL);
    /* the state dict (tensors on the stages' devices) loads into a one-device GPT */
    CHECK_OK(ts_gpt_load_state_dict(ref, &b));
    ts_tensor_list_clear(&a);
    ts_tensor_list_clear(&b);
done:
    ts_module_free(ref);
    ts_strategy_free(pipe);
}

/* Evaluation through the pipeline's forward, and forward + ts_backward on the caller's thread. */
static void test_forward_and_autograd(void) {
    ts_module *ref = gpt();
    ts_strategy *pipe = strategy(TS_STRATEGY_PIPELINE, 3, NULL, 4, TS_PP_GPIPE);
    if (!pipe) goto done;
    ts_module *pm = ts_strategy_module(pipe);
    ts_tensor *x = NULL, *y = NULL, *a = NULL, *b = NULL;
    batch(7, false, &x, &y);
    bool prev = ts_grad_set_enabled(false);
    CHECK_OK(ts_module_forward(ref, x, &a));
    CHECK_OK(ts_module_forward(pm, x, &b));
    ts_grad_set_enabled(prev);
    CHECK(b && ts_tensor_ndim(b) == 3 && ts_tensor_dim(b, 2) == V && ts_tensor_device(b) == ts_device_cpu());
    if (a && b) CHECK(max_diff(a, b) <= 1e-5);
    ts_tensor_release(a);
    ts_tensor_release(b);
    a = b = NULL;
    /* grad on: autograd recorded across the stages, one backward on this thread */
    ts_tensor *l1 = NULL, *l2 = NULL, *f1 = NULL, *f2 = NULL, *y1 = NULL;
    int64_t rows = B * T, two[2] = {B * T, V};
    CHECK_OK(ts_reshape(y, 1, &rows, &y1));
    CHECK_OK(ts_module_forward(ref, x, &a));
    CHECK_OK(ts_module_forward(pm, x, &b));
    if (a && b) {
        CHECK_OK(ts_reshape(a, 2, two, &f1));
        CHECK_OK(ts_reshape(b, 2, two, &f2));
        CHECK_OK(ts_cross_entropy(f1, y1, 0.0f, &l1));
        CHECK_OK(ts_cross_entropy(f2, y1, 0.0f, &l2));
        CHECK_OK(ts_backward(l1, NULL, false));
        CHECK_OK(ts_backward(l2, NULL, false));
        ts_tensor_list g1 = TS_TENSOR_LIST_INIT, g2 = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_parameters(ref, &g1));
        CHECK_OK(ts_module_parameters(ts_strategy_model(pipe), &g2));
        double worst = 0;
        for (int k = 0; k < g1.n && k < g2.n; k++) {
            ts_tensor *ga = ts_tensor_grad(g1.tensors[k]), *gb = ts_tensor_grad(g2.tensors[k]);
            CHECK(ga && gb);
            if (ga && gb) worst = fmax(worst, max_diff(ga, gb));
        }
        CHECK(worst <= 1e-5);
        fprintf(stderr, "  forward + ts_backward through 3 stages: gradients differ by at most %.3g\n", worst);
        ts_tensor_list_clear(&g1);
        ts_tensor_list_clear(&g2);
    }
    ts_tensor_release(l1);
    ts_tensor_release(l2);
    ts_tensor_release(f1);
    ts_tensor_release(f2);
    ts_tensor_release(y1);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(x);
    ts_tensor_release(y);
done:
    ts_strategy_free(pipe);
    ts_module_free(ref);
}

static void test_errors(void) {
    ts_module *pp = NULL;
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = 2, c.n_head = H, c.n_embd = C, c.seq_len = T, c.vocab_size = V;
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    CHECK_STATUS(ts_nn_pipeline_parallel_new(m, devs, 3, NULL, 2, TS_PP_GPIPE, NULL, &pp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("3 stages but the GPT has only 2 blocks (each stage needs at least one)");
    CHECK(pp == NULL);
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    CHECK_STATUS(ts_nn_pipeline_parallel_new(m, devs, 2, (const int[]){1, 3}, 2, TS_PP_GPIPE, NULL, &pp),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("the bounds end at 3 but the GPT has 2 blocks");
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    CHECK_STATUS(ts_nn_pipeline_parallel_new(m, devs, 2, (const int[]){0, 2}, 2, TS_PP_GPIPE, NULL, &pp),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("stage 0 needs at least one block");
    /* a custom module that is neither a Sequential nor a GPT */
    ts_module *lin = NULL;
    CHECK_OK(ts_nn_linear_new(3, 3, true, &r, &lin));
    CHECK_STATUS(ts_nn_pipeline_parallel_new(lin, devs, 1, NULL, 2, TS_PP_GPIPE, NULL, &pp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("must be a Sequential or a GPT (got Linear)");
    /* a failing stage names the layer: token ids past the vocabulary reach wte on stage 0 */
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    CHECK_OK(ts_nn_pipeline_parallel_new(m, devs, 2, NULL, 2, TS_PP_1F1B, NULL, &pp));
    ts_tensor *x = NULL, *y = NULL;
    batch(3, false, &x, &y);
    ((int64_t *)ts_tensor_data(x))[5] = V + 4;
    float loss = 0;
    CHECK(ts_pp_train_step(pp, x, y, 0.0f, &loss) != TS_OK);
    CHECK_ERR_MENTIONS("stage 0 (cpu:0), forward of micro-batch 0: layer transformer.wte + wpe (GPT2Embedding)");
    ((int64_t *)ts_tensor_data(x))[5] = 1;
    CHECK_OK(ts_pp_train_step(pp, x, y, 0.0f, &loss)); /* and then runs */
    CHECK(isfinite(loss) && loss > 0);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(pp);
}

static void test_report(void) {
    fprintf(stderr, "  GPT pipeline vs one device: losses differ by at most %.3g, parameters after 6 AdamW steps "
            "by %.3g\n", worst_loss, worst_param);
    CHECK(worst_param <= 1e-5 && worst_loss <= 1e-5);
}

int main(int argc, char **argv) {
    ts_set_num_threads(1);
    if (ts_set_cpu_device_count(4) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    const char *names[4] = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
    for (int i = 0; i < 4; i++) CHECK_OK(ts_device_get(names[i], &devs[i]));
    static const tu_test tests[] = {T(test_gpipe_two_stages),
                                    T(test_1f1b_two_stages),
                                    T(test_1f1b_three_stages),
                                    T(test_gpipe_one_sample_micro_batches),
                                    T(test_one_stage),
                                    T(test_names_and_placement),
                                    T(test_forward_and_autograd),
                                    T(test_errors),
                                    T(test_report)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
