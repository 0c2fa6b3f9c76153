/*
 * examples/train_fashion_mnist.c — the smallest complete use of libtessera:
 * open Fashion-MNIST as batch sources, build the reference CNN, train it with
 * SGD for MAX_STEPS steps (at most one epoch) and report the test accuracy.
 * The loop is PyTorch's first tutorial:
 *
 *     for x, y in DataLoader(train_set, batch_size=64, shuffle=True):
 *         loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
 *
 * with ts_train_step doing the last line; ts_evaluate runs the test set in eval
 * mode without a graph. (ts_trainer runs this loop with epochs, a learning-rate
 * schedule, checkpoints and resume: examples/ddp_train.c.) Every call returns a
 * ts_status; ts_last_error() says why one failed.
 *
 * usage: example_train_fashion_mnist [DATA_DIR] [MAX_STEPS]
 *   DATA_DIR holds the IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte.gz)
 *   or an image folder with one sub-folder per class (tessera data export).
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        ts_status s_ = (call);                                                                   \
        if (s_ != TS_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, ts_last_error(), ts_status_name(s_)); \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

int main(int argc, char **argv) {
    ts_data_opts d = TS_DATA_OPTS_INIT; /* batches of 64, shuffled; the test set in batches of 1000 */
    d.path = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    d.seed = 42;
    long max_steps = argc > 2 ? atol(argv[2]) : 300;
    ts_batch_source *train, *test;
    CHECK(ts_data_open(&d, &train, &test));

    /* the model on the CPU: the strategy NONE, which owns it from here on */
    ts_rng rng;
    ts_rng_seed(&rng, 42);
    ts_module *model;
    CHECK(ts_model_reference_cnn(&rng, &model));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    ts_strategy *s;
    CHECK(ts_strategy_new(model, &so, &s));

    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    ts_optimizer *opt;
    CHECK(ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt)); /* lr, momentum, weight decay */

    ts_strategy_train(s, true);
    for (long step = 0; step < max_steps; step++) {
        ts_batch b; /* b.x (64, 1, 28, 28) and b.y (64), borrowed from the source */
        CHECK(ts_batch_source_next(train, &b));
        if (!b.x) break; /* end of the epoch */
        float loss;
        CHECK(ts_train_step(s, opt, b.x, b.y, 0.0f, &loss)); /* forward, loss, backward, step, zero_grad */
        if (step % 100 == 0) printf("step %4ld  loss %.4f\n", step, loss);
    }

    ts_eval_result ev; /* eval mode (BatchNorm uses running statistics), no graph */
    CHECK(ts_evaluate(ts_strategy_module(s), test, &ev));
    printf("test accuracy %.2f%% (%lld images, mean loss %.4f)\n", 100.0 * ev.accuracy, (long long)ev.samples,
           ev.loss);

    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    return 0;
}
