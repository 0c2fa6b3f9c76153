/*
 * examples/train_fashion_mnist.c — the smallest complete use of libtessera:
 * load Fashion-MNIST, build the reference CNN, train one epoch with SGD and
 * report test accuracy. Every call returns a ts_status; ts_last_error() says why
 * one failed.
 *
 * usage: example_train_fashion_mnist [DATA_DIR] [MAX_STEPS]
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        ts_status s_ = (call);                                                           \
        if (s_ != TS_OK) {                                                               \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, ts_last_error(), ts_status_name(s_)); \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    long max_steps = argc > 2 ? atol(argv[2]) : 300;

    ts_dataset *train, *test;
    CHECK(ts_dataset_load_mnist(dir, "train", &train));
    CHECK(ts_dataset_load_mnist(dir, "test", &test));

    ts_rng rng;
    ts_rng_seed(&rng, 42);
    ts_module *model;
    CHECK(ts_model_reference_cnn(&rng, &model));

    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(model, &params));
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.weight_decay = 5e-4f;
    ts_optimizer *opt;
    CHECK(ts_optim_sgd_new(&params, &cfg, &opt));

    ts_loader_opts lo = TS_LOADER_OPTS_INIT; /* batch 64, shuffled */
    lo.seed = 42;
    ts_loader *loader;
    CHECK(ts_loader_new(train, &lo, &loader));
    CHECK(ts_loader_set_epoch(loader, 0, 0));

    ts_module_train(model, true);
    ts_tensor *x, *y; /* borrowed from the loader */
    for (long step = 0; step < max_steps; step++) {
        CHECK(ts_loader_next(loader, &x, &y));
        if (!x) break; /* end of the epoch */
        ts_tensor *logits, *loss;
        CHECK(ts_module_forward(model, x, &logits));
        CHECK(ts_cross_entropy(logits, y, 0.0f, &loss));
        CHECK(ts_backward(loss, NULL, false));
        CHECK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        if (step % 100 == 0) printf("step %4ld  loss %.4f\n", step, ts_tensor_item(loss, 0));
        ts_tensor_release(logits); /* frees the graph */
        ts_tensor_release(loss);
    }

    /* evaluate: eval mode (BatchNorm uses running statistics), no graph */
    ts_module_train(model, false);
    bool prev = ts_grad_set_enabled(false);
    ts_loader_opts eo = TS_LOADER_OPTS_INIT;
    eo.batch_size = 1000;
    eo.shuffle = false;
    ts_loader *eval;
    CHECK(ts_loader_new(test, &eo, &eval));
    long correct = 0, total = 0;
    for (;;) {
        CHECK(ts_loader_next(eval, &x, &y));
        if (!x) break;
        ts_tensor *logits;
        CHECK(ts_module_forward(model, x, &logits));
        const float *p = ts_tensor_data_f32(logits);
        const int64_t *label = ts_tensor_data(y);
        for (int64_t i = 0; i < ts_tensor_dim(logits, 0); i++, total++) {
            int best = 0;
            for (int k = 1; k < 10; k++)
                if (p[i * 10 + k] > p[i * 10 + best]) best = k;
            correct += best == label[i];
        }
        ts_tensor_release(logits);
    }
    ts_grad_set_enabled(prev);
    printf("test accuracy %.2f%% (%ld images)\n", 100.0 * (double)correct / (double)total, total);

    ts_loader_free(eval);
    ts_loader_free(loader);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_module_free(model);
    ts_dataset_free(train);
    ts_dataset_free(test);
    return 0;
}
