/*
 * tests/test_train_seq.c — the trainer with a sequence model (tessera/train.h): logits (B, T, V) against
 * labels (B, T) are scored over every position — the training loss equals the cross-entropy of the
 * flattened rows, evaluation counts positions —, tokens are counted in events and results, and eval_every
 * evaluates during an epoch (TS_TRAIN_EVAL events, the run's result from the last one). The model is a
 * bigram table (embedding -> linear) on a source whose next token is a fixed function of the current one,
 * so training must drive the loss far down.
 */
#include "test_util.h"

enum { V = 11, D = 8, B = 4, T = 6, NB = 5 };

static int64_t next_token(int64_t t) { return (3 * t + 1) % V; }

/* ---- a token source: NB batches an epoch; row r of batch i starts at token (7 i + 3 r + epoch) % V -------- */
typedef struct tok_src {
    int64_t epoch, next;
    ts_tensor *x, *y;
    int64_t idx[B];
} tok_src;

static int64_t ts_nb(void *impl, int64_t e) { (void)impl, (void)e; return NB; }
static int64_t ts_ns(void *impl) { (void)impl; return NB * B; }
static ts_status ts_sk(void *impl, int64_t e, int64_t b) {
    tok_src *s = impl;
    s->epoch = e;
    s->next = b;
    return TS_OK;
}
static ts_status ts_nx(void *impl, ts_batch *out) {
    tok_src *s = impl;
    if (s->next >= NB) return TS_OK;
    int64_t *x = ts_tensor_data(s->x), *y = ts_tensor_data(s->y);
    for (int r = 0; r < B; r++) {
        int64_t t = (7 * s->next + 3 * r + s->epoch) % V;
        for (int p = 0; p < T; p++) {
            x[r * T + p] = t;
            y[r * T + p] = t = next_token(t);
        }
        s->idx[r] = s->next * B + r;
    }
    *out = (ts_batch){s->x, s->y, B, B, s->epoch, s->next, s->idx, 0};
    s->next++;
    return TS_OK;
}
static void ts_free_src(void *impl) {
    tok_src *s = impl;
    ts_tensor_release(s->x);
    ts_tensor_release(s->y);
    free(s);
}
static int64_t ts_nc(void *impl) { (void)impl; return V; }
static const ts_batch_source_ops tok_ops = {ts_nb, ts_ns, ts_sk, ts_nx, NULL, ts_free_src, ts_nc, NULL};

static ts_batch_source *token_source(void) {
    tok_src *s = calloc(1, sizeof *s);
    int64_t shape[2] = {B, T};
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 2, shape, &s->x));
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 2, shape, &s->y));
    ts_batch_source *src = NULL;
    CHECK_OK(ts_batch_source_new(&tok_ops, s, &src));
    return src;
}

/* ---- the model: tokens (B, T) -> embedding (B, T, D) -> linear over the last dimension -> (B, T, V) ---------- */
static ts_status bigram_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *e = NULL, *rows = NULL, *l = NULL;
    int64_t nb = ts_tensor_shape(x)[0], nt = ts_tensor_shape(x)[1], two[2] = {nb * nt, D}, three[3] = {nb, nt, V};
    ts_status st = ts_module_call(self, "emb", x, &e);
    if (st == TS_OK) st = ts_reshape(e, 2, two, &rows);
    if (st == TS_OK) st = ts_module_call(self, "head", rows, &l);
    if (st == TS_OK) st = ts_reshape(l, 3, three, out);
    ts_tensor_release(l);
    ts_tensor_release(rows);
    ts_tensor_release(e);
    return st;
}

static ts_module *bigram_model(void) {
    ts_rng rng;
    ts_rng_seed(&rng, 5);
    ts_module *m = NULL, *emb = NULL, *head = NULL;
    CHECK_OK(ts_nn_module_new("Bigram", bigram_forward, NULL, NULL, &m));
    CHECK_OK(ts_nn_embedding_new(V, D, &rng, &emb));
    CHECK_OK(ts_nn_linear_new(D, V, true, &rng, &head));
    CHECK_OK(ts_module_add_child(m, "emb", emb));
    CHECK_OK(ts_module_add_child(m, "head", head));
    return m;
}

/* The mean cross-entropy of every position of the source's first `batches` batches, computed here. */
static double reference_loss(ts_module *m, ts_batch_source *src, int batches) {
    CHECK_OK(ts_batch_source_seek(src, 0, 0));
    double sum = 0.0;
    for (int bi = 0; bi < batches; bi++) {
        ts_batch b;
        CHECK_OK(ts_batch_source_next(src, &b));
        bool prev = ts_grad_set_enabled(false);
        ts_tensor *logits = NULL;
        CHECK_OK(ts_module_forward(m, b.x, &logits));
        ts_grad_set_enabled(prev);
        CHECK(ts_tensor_ndim(logits) == 3 && ts_tensor_shape(logits)[2] == V);
        const float *p = ts_tensor_data_f32(logits);
        const int64_t *y = ts_tensor_data(b.y);
        for (int i = 0; i < B * T; i++) {
            double mx = p[i * V], se = 0.0;
            for (int k = 1; k < V; k++) mx = p[i * V + k] > mx ? p[i * V + k] : mx;
            for (int k = 0; k < V; k++) se += exp(p[i * V + k] - mx);
            sum += log(se) + mx - p[i * V + y[i]];
        }
        ts_tensor_release(logits);
    }
    return sum / (batches * B * T);
}

/* The strategy's loss of a sequence batch is the mean over every position. */
static void test_sequence_loss(void) {
    ts_batch_source *src = token_source();
    ts_module *m = bigram_model();
    double want = reference_loss(m, src, 1);
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    ts_strategy *s = NULL;
    CHECK_OK(ts_strategy_new(m, &so, &s));
    ts_batch b;
    CHECK_OK(ts_batch_source_seek(src, 0, 0));
    CHECK_OK(ts_batch_source_next(src, &b));
    float loss = 0.0f;
    CHECK_OK(ts_strategy_forward_backward(s, b.x, b.y, 0.0f, &loss));
    CHECK_NEAR(loss, want, 1e-5);
    /* labels that fit neither (B) nor (B, T) are a shape error, not a wrong loss */
    int64_t bad_shape[2] = {B, T - 1};
    ts_tensor *bad = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 2, bad_shape, &bad));
    CHECK(ts_strategy_forward_backward(s, b.x, bad, 0.0f, &loss) != TS_OK);
    ts_tensor_release(bad);
    ts_strategy_free(s);
    ts_batch_source_free(src);
}

typedef struct seen {
    int evals, steps;
    int64_t eval_steps[8], last_tokens;
    double first_loss, eval_loss;
} seen;

static ts_status on_event(const ts_train_event *ev, void *user) {
    seen *s = user;
    if (ev->kind == TS_TRAIN_STEP) {
        if (s->steps++ == 0) s->first_loss = ev->loss;
        s->last_tokens = ev->epoch_tokens;
    } else if (ev->kind == TS_TRAIN_EVAL) {
        CHECK(ev->eval != NULL);
        if (s->evals < 8) s->eval_steps[s->evals] = ev->step;
        s->evals++;
        if (ev->eval) s->eval_loss = ev->eval->loss;
    }
    return TS_OK;
}

/* eval_every: evaluations at steps K, 2K, ... of the run (not only at epoch ends), the counted tokens, and a
 * bigram table that learns its task. */
static void test_trainer_tokens_and_eval_every(void) {
    ts_batch_source *train = token_source(), *val = token_source();
    ts_module *m = bigram_model();
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    ts_strategy *s = NULL;
    CHECK_OK(ts_strategy_new(m, &so, &s));
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ts_strategy_model(s), &params));
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_optimizer_by_name("adamw", &params, 0.05, 0.9, 0.0, &opt));
    seen sn = {0};
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 6;
    to.eval = val;
    to.eval_every = 4;
    to.callback = on_event;
    to.user = &sn;
    ts_trainer *t = NULL;
    CHECK_OK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result r;
    CHECK_OK(ts_trainer_run(t, &r));
    CHECK(r.steps == 6 * NB);
    CHECK(r.tokens == r.steps * B * T);
    CHECK(r.tokens_per_second > 0);
    CHECK(sn.last_tokens == NB * B * T); /* the last epoch's, over its steps */
    CHECK(sn.evals == 6 * NB / 4);
    for (int i = 0; i < sn.evals && i < 8; i++) CHECK(sn.eval_steps[i] == 4 * (i + 1));
    CHECK(r.eval.samples == NB * B * T); /* every position of the evaluation source */
    CHECK_NEAR(r.eval.loss, reference_loss(ts_strategy_module(s), val, NB), 1e-5);
    CHECK(r.eval.loss < 0.25 * sn.first_loss); /* the next token is a function of this one: learnt */
    CHECK(r.eval.accuracy > 0.9);
    ts_trainer_opts bad = to;
    bad.eval_every = -1;
    ts_trainer *t2 = NULL;
    CHECK_STATUS(ts_trainer_new(s, opt, train, &bad, &t2), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("eval_every");
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(val);
}

int main(int argc, char **argv) {
    ts_set_num_threads(1);
    static const tu_test tests[] = {T(test_sequence_loss), T(test_trainer_tokens_and_eval_every)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
