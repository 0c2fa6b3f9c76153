/* TileParallel (src/parallel/tile.c): a tiled stack equals the untiled one — output, loss,
 * input gradient, every parameter gradient and the BatchNorm running statistics — for
 * conv geometries (kernel 3/5, stride 1/2, padding 0/1/2, dilation 1/2), max and average
 * pooling, odd heights, 1-4 tiles, batch 1 and 3, BatchNorm2d in training and eval mode,
 * bands that run out of rows, and the reference CNN (also over SGD steps); plus errors.
 * Four virtual CPU devices; the largest differences seen are printed at the end. */
#include "test_util.h"

#define TOL 1e-5

typedef struct worst_diffs {
    double out, loss, gx, gparam, buffers;
    int cases;
} worst_diffs;
static worst_diffs worst, total; /* this test's, all tests' */

/* Prints this test's largest differences and folds them into the total. */
static void report(const char *what) {
    printf("%-34s %4d cases: max abs diff output %.2g, loss %.2g, input grad %.2g, param grads %.2g, "
           "BN running stats %.2g\n",
           what, worst.cases, worst.out, worst.loss, worst.gx, worst.gparam, worst.buffers);
    total.out = fmax(total.out, worst.out);
    total.loss = fmax(total.loss, worst.loss);
    total.gx = fmax(total.gx, worst.gx);
    total.gparam = fmax(total.gparam, worst.gparam);
    total.buffers = fmax(total.buffers, worst.buffers);
    total.cases += worst.cases;
    memset(&worst, 0, sizeof worst);
}

static ts_device *dev(const char *name) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get(name, &d));
    return d;
}

static ts_device *tile_devs[4];

/* ---- building stacks from a small spec ------------------------------------------------------------- */
typedef enum { L_CONV, L_MAX, L_AVG, L_BN, L_RELU, L_FLAT, L_LIN, L_DROP } lkind;
typedef struct lspec {
    lkind kind;
    int cout, k, s, p, d; /* conv: out channels; pools: kernel, stride, padding, dilation; linear: out */
    bool ceil;            /* max pool ceil_mode; BN: affine and track_running_stats off */
} lspec;

static int64_t out_size(int64_t in, int k, int s, int p, int d, bool ceil) {
    int64_t num = in + 2 * p - (int64_t)d * (k - 1) - 1 + (ceil ? s - 1 : 0);
    int64_t o = num / s + 1;
    if (ceil && (o - 1) * s >= in + p) o--;
    return o;
}

/* A Sequential for (N, cin, H, W) inputs, initialised from seed. */
static ts_module *build(const lspec *sp, int nl, int cin, int64_t H, int64_t W, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *s = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    int64_t C = cin, flat = 0;
    for (int i = 0; i < nl; i++) {
        const lspec *l = &sp[i];
        ts_module *m = NULL;
        ts_conv2d_params cp = TS_CONV2D_DEFAULT;
        ts_pool2d_params pp;
        memset(&pp, 0, sizeof pp);
        switch (l->kind) {
        case L_CONV:
            cp.stride[0] = cp.stride[1] = l->s;
            cp.padding[0] = cp.padding[1] = l->p;
            cp.dilation[0] = cp.dilation[1] = l->d;
            CHECK_OK(ts_nn_conv2d_new(C, l->cout, l->k, l->k, cp, true, &r, &m));
            C = l->cout;
            H = out_size(H, l->k, l->s, l->p, l->d, false);
            W = out_size(W, l->k, l->s, l->p, l->d, false);
            break;
        case L_MAX:
        case L_AVG:
            pp.kernel[0] = pp.kernel[1] = l->k;
            pp.stride[0] = pp.stride[1] = l->s;
            pp.padding[0] = pp.padding[1] = l->p;
            pp.dilation[0] = pp.dilation[1] = l->d;
            pp.ceil_mode = l->ceil;
            CHECK_OK(l->kind == L_MAX ? ts_nn_maxpool2d_new(pp, &m) : ts_nn_avgpool2d_new(pp, &m));
            H = out_size(H, l->k, l->s, l->p, l->d, l->ceil);
            W = out_size(W, l->k, l->s, l->p, l->d, l->ceil);
            break;
        case L_BN:
            CHECK_OK(ts_nn_batchnorm2d_new(C, 1e-5f, l->k ? -1.0f : 0.1f, !l->ceil, !l->ceil, &m));
            break;
        case L_RELU: CHECK_OK(ts_nn_relu_new(&m)); break;
        case L_FLAT:
            CHECK_OK(ts_nn_flatten_new(&m));
            flat = C * H * W;
            break;
        case L_LIN:
            CHECK_OK(ts_nn_linear_new(flat, l->cout, true, &r, &m));
            flat = l->cout;
            break;
        case L_DROP: CHECK_OK(ts_nn_dropout_new(0.5f, NULL, &m)); break;
        }
        CHECK_OK(ts_nn_sequential_add(s, NULL, m));
    }
    return s;
}

/* ---- comparing a tiled model with the untiled one ------------------------------------------------------ */
static double in_centre = 0, in_scale = 1; /* the inputs: in_centre + in_scale U(-1, 1) */

static double max_diff(const ts_tensor *a, const ts_tensor *b) {
    if (!a || !b) return a == b ? 0 : INFINITY;
    if (ts_tensor_numel(a) != ts_tensor_numel(b)) return INFINITY;
    int64_t n = ts_tensor_numel(a);
    if (ts_tensor_dtype(a) != TS_F32) { /* num_batches_tracked */
        return ts_tensor_item(a, 0) == ts_tensor_item(b, 0) ? 0 : INFINITY;
    }
    float *pa = malloc(sizeof(float) * (size_t)(n ? n : 1)), *pb = malloc(sizeof(float) * (size_t)(n ? n : 1));
    CHECK_OK(ts_tensor_to_host(a, pa, sizeof(float) * (size_t)n));
    CHECK_OK(ts_tensor_to_host(b, pb, sizeof(float) * (size_t)n));
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)pa[i] - pb[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    free(pa);
    free(pb);
    return m;
}

static void note(double *slot, double v) {
    if (v > *slot) *slot = v;
}

/* One forward + loss + backward through ref (untiled, on "cpu") and tp (the wrapper), on the
 * same input; compares everything. ce: cross-entropy over 10 classes, else mean(out * r).
 * Returns the largest difference. */
static double compare_step(const char *label, ts_module *ref, ts_module *tp, int64_t N, int64_t C, int64_t H,
                           int64_t W, bool ce, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    int64_t shape[4] = {N, C, H, W};
    ts_tensor *x1 = tu_rand(&r, 4, shape, -1, 1, true), *x2 = NULL;
    for (int64_t i = 0; i < ts_tensor_numel(x1); i++) /* about in_centre, +-in_scale */
        ts_tensor_data_f32(x1)[i] = (float)(in_centre + in_scale * ts_tensor_data_f32(x1)[i]);
    CHECK_OK(ts_tensor_clone(x1, &x2));
    ts_tensor_set_requires_grad(x2, true);
    ts_tensor *o1 = NULL, *o2 = NULL, *l1 = NULL, *l2 = NULL, *y = NULL, *rw = NULL, *p1 = NULL, *p2 = NULL,
              *o2c = NULL;
    double worst_here = INFINITY;
    ts_status s1 = ts_module_forward(ref, x1, &o1), s2 = ts_module_forward(tp, x2, &o2);
    CHECK_OK(s1);
    CHECK_OK(s2);
    if (s1 != TS_OK || s2 != TS_OK) {
        fprintf(stderr, "  case %s\n", label);
        goto done;
    }
    CHECK(ts_tensor_ndim(o1) == ts_tensor_ndim(o2));
    for (int i = 0; i < ts_tensor_ndim(o1) && i < ts_tensor_ndim(o2); i++) CHECK(ts_tensor_dim(o1, i) == ts_tensor_dim(o2, i));
    /* the loss on the reference's device */
    CHECK_OK(ts_to_device(o2, ts_device_cpu(), &o2c));
    if (ce) {
        int64_t lab[16];
        for (int64_t i = 0; i < N; i++) lab[i] = (int64_t)ts_rng_below(&r, 10);
        CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &N, lab, &y));
        CHECK_OK(ts_cross_entropy(o1, y, 0.0f, &l1));
        CHECK_OK(ts_cross_entropy(o2c, y, 0.0f, &l2));
    } else {
        rw = tu_rand(&r, ts_tensor_ndim(o1), ts_tensor_shape(o1), -1, 1, false);
        CHECK_OK(ts_mul(o1, rw, &p1));
        CHECK_OK(ts_mul(o2c, rw, &p2));
        CHECK_OK(ts_mean(p1, &l1));
        CHECK_OK(ts_mean(p2, &l2));
    }
    CHECK_OK(ts_backward(l1, NULL, false));
    CHECK_OK(ts_backward(l2, NULL, false));

    double d_out = max_diff(o1, o2), d_loss = max_diff(l1, l2), d_gx = max_diff(ts_tensor_grad(x1), ts_tensor_grad(x2));
    double d_gp = 0, d_buf = 0;
    ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ref, &pa));
    CHECK_OK(ts_module_parameters(tp, &pb));
    CHECK(pa.n == pb.n);
    for (int i = 0; i < pa.n && i < pb.n; i++) {
        char want[128];
        snprintf(want, sizeof want, "module.%s", pa.names[i]);
        CHECK(strcmp(pb.names[i], want) == 0);
        double d = max_diff(ts_tensor_grad(pa.tensors[i]), ts_tensor_grad(pb.tensors[i]));
        if (d > TOL) fprintf(stderr, "  %s: grad of %s differs by %.3g\n", label, pa.names[i], d);
        note(&d_gp, d);
    }
    ts_tensor_list_clear(&pa);
    ts_tensor_list_clear(&pb);
    CHECK_OK(ts_module_buffers(ref, &pa));
    CHECK_OK(ts_module_buffers(tp, &pb));
    CHECK(pa.n == pb.n);
    for (int i = 0; i < pa.n && i < pb.n; i++) note(&d_buf, max_diff(pa.tensors[i], pb.tensors[i]));
    ts_tensor_list_clear(&pa);
    ts_tensor_list_clear(&pb);

    worst_here = fmax(fmax(fmax(d_out, d_loss), fmax(d_gx, d_gp)), d_buf);
    if (!(worst_here <= TOL))
        fprintf(stderr, "  %s: out %.3g loss %.3g gx %.3g gparam %.3g buffers %.3g\n", label, d_out, d_loss, d_gx,
                d_gp, d_buf);
    CHECK(worst_here <= TOL);
    note(&worst.out, d_out);
    note(&worst.loss, d_loss);
    note(&worst.gx, d_gx);
    note(&worst.gparam, d_gp);
    note(&worst.buffers, d_buf);
    worst.cases++;
done:
    ts_tensor_release(o1);
    ts_tensor_release(o2);
    ts_tensor_release(o2c);
    ts_tensor_release(l1);
    ts_tensor_release(l2);
    ts_tensor_release(y);
    ts_tensor_release(rw);
    ts_tensor_release(p1);
    ts_tensor_release(p2);
    ts_tensor_release(x1);
    ts_tensor_release(x2);
    return worst_here;
}

/* Builds the spec twice (same seed), wraps one copy over `tiles` devices and compares one step. */
static void compare_spec(const char *what, const lspec *sp, int nl, int64_t N, int cin, int64_t H, int64_t W,
                         int tiles, ts_device *outdev) {
    char label[160];
    snprintf(label, sizeof label, "%s, N %lld, H %lld, W %lld, %d tiles", what, (long long)N, (long long)H,
             (long long)W, tiles);
    uint64_t seed = (uint64_t)(H * 131 + W * 7 + tiles * 3 + N);
    ts_module *ref = build(sp, nl, cin, H, W, seed), *model = build(sp, nl, cin, H, W, seed), *tp = NULL;
    ts_status st = ts_nn_tile_parallel_new(model, tile_devs, tiles, outdev, &tp);
    CHECK_OK(st);
    if (st == TS_OK) compare_step(label, ref, tp, N, cin, H, W, false, seed + 1);
    ts_module_free(tp);
    ts_module_free(ref);
}

/* ---- tests ---------------------------------------------------------------------------------------------------- */
static const int64_t heights[4] = {13, 17, 28, 31};

/* Every (kernel, stride, padding, dilation) of {3,5} x {1,2} x {0,1,2} x {1,2} as the first conv
 * of conv-ReLU-conv(3, p 1), for each odd/even height and 2, 3, 4 tiles. */
static void test_conv_geometries(void) {
    int ks[2] = {3, 5}, ss[2] = {1, 2}, ps[3] = {0, 1, 2}, ds[2] = {1, 2}, count = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int si = 0; si < 2; si++)
            for (int pi = 0; pi < 3; pi++)
                for (int di = 0; di < 2; di++) {
                    lspec sp[3] = {{L_CONV, 3, ks[ki], ss[si], ps[pi], ds[di], false},
                                   {L_RELU, 0, 0, 0, 0, 0, false},
                                   {L_CONV, 4, 3, 1, 1, 1, false}};
                    char what[64];
                    snprintf(what, sizeof what, "conv k%d s%d p%d d%d", ks[ki], ss[si], ps[pi], ds[di]);
                    for (int hi = 0; hi < 4; hi++)
                        for (int tiles = 2; tiles <= 4; tiles++, count++)
                            compare_spec(what, sp, 3, count % 2 ? 3 : 1, 2, heights[hi], 10, tiles, ts_device_cpu());
                }
    report("conv geometries");
}

/* Max pooling 2/2, 3/2 (with and without padding), dilated and ceil_mode; average pooling. */
static void test_pooling(void) {
    const lspec pools[] = {
        {L_MAX, 0, 2, 2, 0, 1, false}, {L_MAX, 0, 3, 2, 0, 1, false}, {L_MAX, 0, 3, 2, 1, 1, false},
        {L_MAX, 0, 2, 2, 0, 1, true},  {L_MAX, 0, 3, 2, 1, 1, true},  {L_MAX, 0, 3, 1, 1, 2, false},
        {L_AVG, 0, 2, 2, 0, 1, false}, {L_AVG, 0, 3, 2, 1, 1, false},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        const lspec *pl = &pools[i];
        lspec sp[5] = {{L_CONV, 3, 3, 1, 1, 1, false}, {L_RELU, 0, 0, 0, 0, 0, false}, *pl,
                       {L_CONV, 4, 3, 1, 1, 1, false}, *pl};
        char what[80];
        snprintf(what, sizeof what, "%s k%d s%d p%d d%d%s", pl->kind == L_MAX ? "maxpool" : "avgpool", pl->k, pl->s,
                 pl->p, pl->d, pl->ceil ? " ceil" : "");
        for (int hi = 0; hi < 4; hi++)
            for (int tiles = 2; tiles <= 4; tiles++, count++)
                compare_spec(what, sp, 5, count % 2 ? 3 : 1, 1, heights[hi], 13, tiles, ts_device_cpu());
    }
    report("max/avg pooling");
}

/* BatchNorm2d in training mode: statistics over the whole image, running stats, backward. */
static void test_batchnorm(void) {
    const lspec sp[] = {{L_CONV, 4, 3, 1, 1, 1, false}, {L_BN, 0, 0, 0, 0, 0, false},
                        {L_RELU, 0, 0, 0, 0, 0, false}, {L_MAX, 0, 2, 2, 0, 1, false},
                        {L_CONV, 5, 5, 2, 2, 1, false}, {L_BN, 0, 0, 0, 0, 0, false},
                        {L_RELU, 0, 0, 0, 0, 0, false}, {L_CONV, 3, 3, 1, 1, 2, false}};
    int count = 0;
    for (int hi = 0; hi < 4; hi++)
        for (int tiles = 2; tiles <= 4; tiles++, count++)
            compare_spec("bn stack", sp, 8, count % 2 ? 3 : 1, 2, heights[hi], 11, tiles, ts_device_cpu());
    /* BN without affine/running stats (always batch statistics), and momentum None */
    const lspec sp2[] = {{L_CONV, 4, 3, 1, 0, 1, false}, {L_BN, 0, 0, 0, 0, 0, true}, {L_RELU, 0, 0, 0, 0, 0, false},
                         {L_CONV, 3, 3, 2, 1, 1, false}, {L_BN, 0, 1, 0, 0, 0, false}};
    for (int tiles = 2; tiles <= 4; tiles++) compare_spec("bn plain / cumulative", sp2, 5, 3, 1, 17, 9, tiles, NULL);
    report("BatchNorm2d (training)");
}

/* BatchNorm2d at |mean| / std = 1e4 (inputs 1000 +- 0.17, a BatchNorm first): the tiles' local means go to
 * the combination with their residuals (to ~48 bits), so the global statistics are one device's; with the
 * float local means alone they were up to 3e-5 apart, 3e-4 of the normalised output. */
static void test_batchnorm_far_mean(void) {
    const lspec sp[] = {{L_BN, 0, 0, 0, 0, 0, false}, {L_CONV, 3, 3, 1, 1, 1, false}, {L_RELU, 0, 0, 0, 0, 0, false},
                        {L_CONV, 2, 3, 2, 1, 1, false}, {L_BN, 0, 0, 0, 0, 0, false}};
    in_centre = 1000, in_scale = 0.17;
    for (int tiles = 2; tiles <= 4; tiles++) compare_spec("bn at mean 1000, std 0.1", sp, 5, 3, 2, 17, 9, tiles, NULL);
    in_centre = 0, in_scale = 1;
    report("BatchNorm2d at mean/std 1e4");
}

/* Eval mode (running statistics) after a few training forwards. */
static void test_batchnorm_eval(void) {
    const lspec sp[] = {{L_CONV, 4, 3, 1, 1, 1, false}, {L_BN, 0, 0, 0, 0, 0, false}, {L_RELU, 0, 0, 0, 0, 0, false},
                        {L_MAX, 0, 3, 2, 1, 1, false},  {L_CONV, 3, 3, 1, 1, 1, false}, {L_BN, 0, 0, 0, 0, 0, false}};
    ts_module *ref = build(sp, 6, 2, 17, 9, 5), *model = build(sp, 6, 2, 17, 9, 5), *tp = NULL;
    CHECK_OK(ts_nn_tile_parallel_new(model, tile_devs, 3, ts_device_cpu(), &tp));
    for (int step = 0; step < 3; step++) compare_step("bn train before eval", ref, tp, 3, 2, 17, 9, false, 40 + step);
    ts_module_train(ref, false);
    ts_module_train(tp, false);
    CHECK(!ts_module_is_training(ts_module_child(tp, "module.1")));
    compare_step("bn eval", ref, tp, 3, 2, 17, 9, false, 50);
    ts_module_free(tp);
    ts_module_free(ref);
    report("BatchNorm2d train, then eval");
}

/* Strided layers shrink the image below the number of tiles: bands run out of rows and
 * those tiles drop out; n = 1; the output on a virtual device; a stack with no head. */
static void test_shrinking_and_edges(void) {
    const lspec down[] = {{L_CONV, 3, 3, 2, 1, 1, false}, {L_RELU, 0, 0, 0, 0, 0, false},
                          {L_CONV, 3, 3, 2, 1, 1, false}, {L_BN, 0, 0, 0, 0, 0, false},
                          {L_CONV, 4, 3, 2, 1, 1, false}, {L_MAX, 0, 2, 2, 0, 1, false}};
    for (int tiles = 1; tiles <= 4; tiles++) compare_spec("13 -> 7 -> 4 -> 2 -> 1 rows", down, 6, 3, 1, 13, 13, tiles, ts_device_cpu());
    const lspec tiny[] = {{L_MAX, 0, 2, 2, 0, 1, false}, {L_CONV, 2, 3, 1, 1, 1, false}, {L_MAX, 0, 2, 2, 0, 1, false}};
    compare_spec("4 rows, 4 tiles -> 2 -> 1", tiny, 3, 3, 1, 4, 6, 4, ts_device_cpu());
    compare_spec("4 rows, 4 tiles, output on cpu:2", tiny, 3, 1, 1, 4, 6, 4, dev("cpu:2"));
    const lspec head[] = {{L_CONV, 3, 5, 1, 2, 1, false}, {L_RELU, 0, 0, 0, 0, 0, false},
                          {L_FLAT, 0, 0, 0, 0, 0, false}, {L_LIN, 6, 0, 0, 0, 0, false},
                          {L_RELU, 0, 0, 0, 0, 0, false}, {L_LIN, 10, 0, 0, 0, 0, false}};
    for (int tiles = 1; tiles <= 4; tiles++) compare_spec("conv + linear head", head, 6, 3, 1, 13, 7, tiles, dev("cpu:1"));
    /* tall kernels on thin bands: a tile's halo reaches past its neighbour */
    const lspec tall[] = {{L_CONV, 2, 5, 1, 4, 2, false}, {L_CONV, 2, 5, 1, 2, 2, false}};
    compare_spec("halo beyond the neighbour", tall, 2, 1, 1, 5, 5, 4, ts_device_cpu());
    report("shrinking bands, n=1, heads");
}

/* The reference CNN: one step compared, then SGD steps keep the models equal. */
static void test_reference_cnn(void) {
    for (int tiles = 2; tiles <= 4; tiles++) {
        ts_rng r1, r2;
        ts_rng_seed(&r1, 11);
        ts_rng_seed(&r2, 11);
        ts_module *ref = NULL, *model = NULL, *tp = NULL;
        CHECK_OK(ts_model_reference_cnn(&r1, &ref));
        CHECK_OK(ts_model_reference_cnn(&r2, &model));
        CHECK_OK(ts_nn_tile_parallel_new(model, tile_devs, tiles, ts_device_cpu(), &tp));
        ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_parameters(ref, &pa));
        CHECK_OK(ts_module_parameters(tp, &pb));
        ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
        cfg.lr = 0.01f;
        cfg.momentum = 0.9f;
        ts_optimizer *oa = NULL, *ob = NULL;
        CHECK_OK(ts_optim_sgd_new(&pa, &cfg, &oa));
        CHECK_OK(ts_optim_sgd_new(&pb, &cfg, &ob));
        for (int step = 0; step < 3; step++) {
            char label[64];
            snprintf(label, sizeof label, "reference CNN, %d tiles, step %d", tiles, step);
            compare_step(label, ref, tp, step == 1 ? 1 : 3, 1, 28, 28, true, 100 + (uint64_t)step);
            CHECK_OK(ts_optimizer_step(oa));
            CHECK_OK(ts_optimizer_step(ob));
            ts_optimizer_zero_grad(oa);
            ts_optimizer_zero_grad(ob);
        }
        double dp = 0;
        for (int i = 0; i < pa.n; i++) note(&dp, max_diff(pa.tensors[i], pb.tensors[i]));
        printf("reference CNN, %d tiles: parameters after 3 SGD steps differ by %.3g\n", tiles, dp);
        CHECK(dp <= TOL);
        ts_optimizer_free(oa);
        ts_optimizer_free(ob);
        ts_tensor_list_clear(&pa);
        ts_tensor_list_clear(&pb);
        ts_module_free(tp);
        ts_module_free(ref);
    }
    report("reference CNN (3 SGD steps)");
}

/* How far a tiled step may drift from one device, and why (checked against float64 with torch on the
 * reference CNN, Fashion-MNIST batches of 64, SGD lr 0.05 momentum 0.9, 3 steps): tiling changes only
 * summation orders (each tile's sgemm, BatchNorm's statistics combined over tiles), so the two runs differ
 * by float32 rounding; two things make that rounding visible.
 *  - conv1's weight gradient cancels: it is sum(gout x patch) over the images, gout is BatchNorm's input
 *    gradient, whose sum per channel is 0, and the patches share the images' constant background (-0.81
 *    after normalisation), so most of the sum cancels. Step 1's conv1 weight gradient (max 0.09) was 6.7e-6
 *    from float64 on one device, 5.5e-6 tiled, 6.7e-6 in torch float32: they differ from each other by
 *    5e-6 and every other tensor by < 5e-7.
 *  - ReLU and max-pool decisions: after step 1 the weights differ by 3e-7, and at step 2 the one-device
 *    weights put one BatchNorm output and two max-pool windows on the other side of a decision: float64
 *    at the one-device weights moves conv2's weight gradient by 3.1e-4 and conv1's by 1.0e-4 (float32 one
 *    device and torch float32 took the same turn; the tiled run did not, and stayed within 4e-7 of
 *    float64). That is the 1e-4 .. 6e-4 between tiled and one-device momentum buffers after 3 steps.
 * Neither is an error of tiling (the BatchNorm statistics over tiles are within 1e-8 of one device's).
 * This test holds one step on such a batch to the spread of the same computation in other orders: one
 * device on the batch with its images permuted three ways (the same gradient, summed otherwise), per tensor. */
static ts_tensor *background_batch(ts_rng *r, int64_t N) {
    ts_tensor *x = NULL;
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){N, 1, 28, 28}, &x));
    float *p = ts_tensor_data_f32(x);
    for (int64_t n = 0; n < N; n++) { /* background 0 -> -0.81, one bright rectangle (a garment) */
        const int64_t r0 = 2 + (int64_t)ts_rng_below(r, 8), r1 = 16 + (int64_t)ts_rng_below(r, 10);
        const int64_t c0 = 3 + (int64_t)ts_rng_below(r, 6), c1 = 18 + (int64_t)ts_rng_below(r, 8);
        for (int64_t i = 0; i < 28; i++)
            for (int64_t j = 0; j < 28; j++)
                p[(n * 28 + i) * 28 + j] = i >= r0 && i < r1 && j >= c0 && j < c1
                                               ? (float)((ts_rng_uniform(r) - 0.2860) / 0.3530)
                                               : (float)(-0.2860 / 0.3530);
    }
    return x;
}

/* the gradients of mean cross-entropy over (x, y) for params (zeroed first), concatenated */
static float *grads_of(ts_module *m, ts_tensor *x, ts_tensor *y, ts_tensor_list *params, int64_t nall) {
    float *g = calloc((size_t)nall, sizeof(float));
    ts_tensor *out = NULL, *loss = NULL;
    for (int i = 0; i < params->n; i++) ts_tensor_zero_grad(params->tensors[i]);
    CHECK_OK(ts_module_forward(m, x, &out));
    if (out) CHECK_OK(ts_cross_entropy(out, y, 0.0f, &loss));
    if (loss) CHECK_OK(ts_backward(loss, NULL, false));
    for (int i = 0, k = 0; loss && i < params->n; k += (int)ts_tensor_numel(params->tensors[i]), i++)
        CHECK_OK(ts_tensor_to_host(ts_tensor_grad(params->tensors[i]), g + k,
                                   sizeof(float) * (size_t)ts_tensor_numel(params->tensors[i])));
    ts_tensor_release(out);
    ts_tensor_release(loss);
    return g;
}

static void test_reference_cnn_rounding(void) {
    const int64_t N = 16;
    ts_rng r1, r2, rd;
    ts_rng_seed(&r1, 5), ts_rng_seed(&r2, 5), ts_rng_seed(&rd, 6);
    ts_module *ref = NULL, *model = NULL, *tp = NULL;
    CHECK_OK(ts_model_reference_cnn(&r1, &ref));
    CHECK_OK(ts_model_reference_cnn(&r2, &model));
    CHECK_OK(ts_nn_tile_parallel_new(model, tile_devs, 2, ts_device_cpu(), &tp));
    ts_tensor *x = background_batch(&rd, N), *y = NULL;
    int64_t lab[16];
    for (int64_t n = 0; n < N; n++) lab[n] = (int64_t)ts_rng_below(&rd, 10);
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &N, lab, &y));
    ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ref, &pa));
    CHECK_OK(ts_module_parameters(tp, &pb));
    int64_t nall = 0;
    for (int i = 0; i < pa.n; i++) nall += ts_tensor_numel(pa.tensors[i]);
    float *g1 = grads_of(ref, x, y, &pa, nall), *gt = grads_of(tp, x, y, &pb, nall);
    double *spread = calloc((size_t)nall, sizeof(double)), gmax = 0;
    for (int64_t j = 0; j < nall; j++) gmax = fmax(gmax, fabs((double)g1[j]));
    for (int64_t step = 3; step <= 7; step += 2) { /* images in the orders step n mod 16 */
        ts_tensor *xp = NULL, *yp = NULL;
        int64_t labp[16];
        CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){N, 1, 28, 28}, &xp));
        for (int64_t n = 0; n < N; n++) {
            memcpy(ts_tensor_data_f32(xp) + n * 784, ts_tensor_data_f32(x) + (step * n) % N * 784, sizeof(float) * 784);
            labp[n] = lab[(step * n) % N];
        }
        CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &N, labp, &yp));
        float *gp = grads_of(ref, xp, yp, &pa, nall);
        for (int64_t j = 0; j < nall; j++) spread[j] = fmax(spread[j], fabs((double)gp[j] - g1[j]));
        free(gp);
        ts_tensor_release(xp), ts_tensor_release(yp);
    }
    for (int i = 0, k = 0; i < pa.n; k += (int)ts_tensor_numel(pa.tensors[i]), i++) {
        double dt = 0, dp = 0, sc = 0;
        for (int64_t j = k; j < k + ts_tensor_numel(pa.tensors[i]); j++) {
            dt = fmax(dt, fabs((double)gt[j] - g1[j]));
            dp = fmax(dp, spread[j]);
            sc = fmax(sc, fabs((double)g1[j]));
        }
        printf("reference CNN, background images, 2 tiles: grad of %-9s max %.2g, tiled - one device %.2g, "
               "one device on permuted batches - one device %.2g\n",
               pa.names[i], sc, dt, dp);
        /* 1e-6 of the largest gradient: the conv biases before a BatchNorm have gradient 0 (rounding noise) */
        CHECK(dt <= 4 * dp + 1e-6 * gmax);
    }
    free(g1), free(gt), free(spread);
    ts_tensor_list_clear(&pa), ts_tensor_list_clear(&pb);
    ts_tensor_release(x), ts_tensor_release(y);
    ts_module_free(tp);
    ts_module_free(ref);
}

/* The wrapper: child "module", state-dict names, parameters on the output device, the tiles'
 * activations on their own devices, no graph under no-grad. */
static void test_wrapper(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *model = NULL, *tp = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &model));
    CHECK_OK(ts_nn_tile_parallel_new(model, tile_devs, 4, dev("cpu:3"), &tp));
    CHECK(strcmp(ts_module_type_name(tp), "TileParallel") == 0);
    CHECK(ts_module_child(tp, "module") == model);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(tp, &sd));
    CHECK(sd.n > 0 && strcmp(sd.names[0], "module.0.weight") == 0);
    for (int i = 0; i < sd.n; i++) CHECK(ts_tensor_device(sd.tensors[i]) == dev("cpu:3"));
    ts_tensor_list_clear(&sd);

    int64_t shape[4] = {2, 1, 28, 28};
    ts_tensor *x = tu_rand(&r, 4, shape, 0, 1, false), *y = NULL;
    size_t before[4];
    for (int t = 0; t < 4; t++) before[t] = ts_device_memory_allocated(tile_devs[t]);
    CHECK_OK(ts_module_forward(tp, x, &y));
    CHECK(y && ts_tensor_device(y) == dev("cpu:3") && ts_tensor_requires_grad(y));
    /* the graph keeps each tile's activations on its own device */
    for (int t = 0; t < 3; t++) CHECK(ts_device_memory_allocated(tile_devs[t]) > before[t]);
    ts_tensor_release(y);
    for (int t = 0; t < 3; t++) CHECK(ts_device_memory_allocated(tile_devs[t]) == before[t]);
    bool prev = ts_grad_set_enabled(false);
    CHECK_OK(ts_module_forward(tp, x, &y));
    CHECK(y && !ts_tensor_requires_grad(y));
    ts_grad_set_enabled(prev);
    ts_tensor_release(y);
    ts_tensor_release(x);
    ts_module_free(tp);
}

static void test_errors(void) {
    ts_module *m = NULL, *tp = NULL;
    /* a layer it cannot tile, named with its position */
    const lspec drop[] = {{L_CONV, 2, 3, 1, 1, 1, false}, {L_DROP, 0, 0, 0, 0, 0, false}, {L_FLAT, 0, 0, 0, 0, 0, false}};
    m = build(drop, 3, 1, 8, 8, 1);
    CHECK_STATUS(ts_nn_tile_parallel_new(m, tile_devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("layer '1' (Dropout) cannot be tiled");
    CHECK(tp == NULL);
    /* ... also after the head is fine */
    const lspec drop_head[] = {{L_CONV, 2, 3, 1, 1, 1, false}, {L_FLAT, 0, 0, 0, 0, 0, false},
                               {L_DROP, 0, 0, 0, 0, 0, false}};
    m = build(drop_head, 3, 1, 8, 8, 1);
    CHECK_OK(ts_nn_tile_parallel_new(m, tile_devs, 2, NULL, &tp));
    ts_module_free(tp);
    tp = NULL;
    /* a residual block */
    CHECK_OK(ts_nn_sequential_new(&m));
    ts_module *blk = NULL;
    CHECK_OK(ts_nn_residual_block_new(2, 2, 1, NULL, &blk));
    CHECK_OK(ts_nn_sequential_add(m, "res", blk));
    CHECK_STATUS(ts_nn_tile_parallel_new(m, tile_devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("'res'");
    /* not a Sequential */
    CHECK_OK(ts_nn_linear_new(3, 3, true, NULL, &m));
    CHECK_STATUS(ts_nn_tile_parallel_new(m, tile_devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("expected a Sequential");
    /* average pooling with ceil_mode */
    const lspec avgc[] = {{L_AVG, 0, 2, 2, 0, 1, true}};
    m = build(avgc, 1, 1, 8, 8, 1);
    CHECK_STATUS(ts_nn_tile_parallel_new(m, tile_devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("ceil_mode");
    /* bad arguments (the module is freed) */
    CHECK_OK(ts_nn_sequential_new(&m));
    CHECK_STATUS(ts_nn_tile_parallel_new(m, tile_devs, 0, NULL, &tp), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_nn_tile_parallel_new(NULL, tile_devs, 2, NULL, &tp), TS_ERR_INVALID_ARG);

    /* more tiles than rows */
    const lspec conv[] = {{L_CONV, 2, 3, 1, 1, 1, false}};
    m = build(conv, 1, 1, 3, 8, 1);
    CHECK_OK(ts_nn_tile_parallel_new(m, tile_devs, 4, NULL, &tp));
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){1, 1, 3, 8}, 0, 1, false), *y = NULL;
    CHECK_STATUS(ts_module_forward(tp, x, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("has 3 rows, fewer than the 4 tiles");
    CHECK(y == NULL);
    ts_tensor_release(x);
    /* wrong channel count: the layer is named */
    x = tu_rand(&r, 4, (int64_t[]){1, 2, 8, 8}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(tp, x, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("TileParallel: layer '0' (Conv2d)");
    ts_tensor_release(x);
    /* not an image */
    x = tu_rand(&r, 2, (int64_t[]){4, 8}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(tp, x, &y), TS_ERR_SHAPE);
    ts_tensor_release(x);
    ts_module_free(tp);
}

static void test_report(void) {
    printf("tile parallel vs untiled over %d cases: max abs diff output %.3g, loss %.3g, input grad %.3g, "
           "parameter grads %.3g, BN running stats %.3g (tolerance %.0e)\n",
           total.cases, total.out, total.loss, total.gx, total.gparam, total.buffers, TOL);
    CHECK(total.cases > 0);
}

int main(int argc, char **argv) {
    if (ts_set_cpu_device_count(4) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    const char *names[4] = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
    for (int t = 0; t < 4; t++) tile_devs[t] = dev(names[t]);
    static const tu_test tests[] = {T(test_conv_geometries), T(test_pooling),         T(test_batchnorm),
                                    T(test_batchnorm_eval), T(test_batchnorm_far_mean),  T(test_shrinking_and_edges), T(test_reference_cnn), T(test_reference_cnn_rounding),
                                    T(test_wrapper),         T(test_errors),          T(test_report)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
