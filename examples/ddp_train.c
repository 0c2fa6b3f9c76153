/*
 * examples/ddp_train.c — data-parallel training on Fashion-MNIST, the C
 * version of PyTorch's DistributedDataParallel recipe:
 *
 *     dist.init_process_group(init_method="env://")
 *     model = DDP(make_cnn())
 *     sampler = DistributedSampler(train_set)         # this rank's share
 *     for epoch in range(epochs):
 *         sampler.set_epoch(epoch)                     # a new shuffle each epoch
 *         for x, y in DataLoader(train_set, batch_size, sampler=sampler): ...
 *     dist.destroy_process_group()
 *
 * Every rank runs this program; the process group comes from the environment
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so launch it with
 *     tessera run -n 2 build/example_ddp_train
 * or by hand, one shell per rank:
 *     RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/example_ddp_train &
 *     RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/example_ddp_train
 * Rank 0 prints the loss of its batches and, at the end, the test accuracy.
 *
 * usage: example_ddp_train [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR] [--seed S]
 *   --batch is per rank (the global batch is B * world size); --max-steps caps
 *   the steps of each epoch (0: the whole epoch).
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        ts_status s_ = (call);                                                                         \
        if (s_ != TS_OK) {                                                                             \
            fprintf(stderr, "[rank %d] %s failed: %s (%s)\n", rank, #call, ts_last_error(), ts_status_name(s_)); \
            return 1;                                                                                  \
        }                                                                                              \
    } while (0)

/* Test accuracy in percent (eval mode, no graph). */
static ts_status evaluate(ts_module *model, ts_dataset *test, double *acc) {
    ts_module_train(model, false);
    bool prev = ts_grad_set_enabled(false);
    ts_loader_opts eo = TS_LOADER_OPTS_INIT;
    eo.batch_size = 1000;
    eo.shuffle = false;
    ts_loader *eval = NULL;
    ts_status st = ts_loader_new(test, &eo, &eval);
    long correct = 0, total = 0;
    while (st == TS_OK) {
        ts_tensor *x, *y, *logits = NULL;
        st = ts_loader_next(eval, &x, &y);
        if (st != TS_OK || !x) break;
        st = ts_module_forward(model, x, &logits);
        if (st != TS_OK) break;
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
    ts_loader_free(eval);
    ts_grad_set_enabled(prev);
    ts_module_train(model, true);
    *acc = total ? 100.0 * (double)correct / (double)total : 0.0;
    return st;
}

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    long epochs = 2, max_steps = 0, batch = 64;
    double lr = 0.05;
    unsigned long long seed = 42;
    int rank = -1; /* for CHECK messages until the group exists */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: %s [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR] [--seed S]\n",
                    argv[0]);
            return 2;
        }
        if (!strcmp(a, "--data")) dir = v;
        else if (!strcmp(a, "--epochs")) epochs = atol(v);
        else if (!strcmp(a, "--max-steps")) max_steps = atol(v);
        else if (!strcmp(a, "--batch")) batch = atol(v);
        else if (!strcmp(a, "--lr")) lr = atof(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (epochs < 1 || batch < 1 || max_steps < 0) {
        fprintf(stderr, "--epochs and --batch must be >= 1, --max-steps >= 0\n");
        return 2;
    }

    /* dist.init_process_group(init_method="env://") */
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    po.init_method = "env://";
    ts_process_group *pg;
    CHECK(ts_pg_new(&po, &pg));
    rank = ts_pg_rank(pg);
    int world = ts_pg_size(pg);
    if (rank == 0) printf("world size %d, backend %s\n", world, ts_pg_backend_name(pg));

    ts_dataset *train, *test;
    CHECK(ts_dataset_load_mnist(dir, "train", &train));
    CHECK(ts_dataset_load_mnist(dir, "test", &test));

    /* the same model on every rank: DDP broadcasts rank 0's weights anyway */
    ts_rng rng;
    ts_rng_seed(&rng, seed);
    ts_module *model;
    CHECK(ts_model_reference_cnn(&rng, &model));
    ts_ddp *ddp;
    CHECK(ts_ddp_new(model, pg, NULL, &ddp));

    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(model, &params));
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = (float)lr;
    cfg.momentum = 0.9f;
    cfg.weight_decay = 5e-4f;
    ts_optimizer *opt;
    CHECK(ts_optim_sgd_new(&params, &cfg, &opt));

    /* DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed) */
    ts_dist_sampler sampler;
    CHECK(ts_dist_sampler_init(&sampler, ts_dataset_size(train), world, rank, true, seed, false));
    int64_t per_rank = ts_dist_sampler_len(&sampler);
    int64_t *idx = malloc(sizeof *idx * (size_t)(per_rank ? per_rank : 1));
    if (!idx) return 1;

    /* DataLoader(train_set, batch_size=batch, sampler=sampler): the loader walks our indices in order */
    ts_loader_opts lo = TS_LOADER_OPTS_INIT;
    lo.batch_size = batch;
    lo.shuffle = false;
    ts_loader *loader;
    CHECK(ts_loader_new(train, &lo, &loader));

    ts_module_train(model, true);
    double t0 = ts_time_now();
    for (long epoch = 0; epoch < epochs; epoch++) {
        ts_dist_sampler_set_epoch(&sampler, epoch); /* a new shuffle each epoch, the same on every rank */
        CHECK(ts_dist_sampler_indices(&sampler, idx));
        CHECK(ts_loader_set_indices(loader, idx, per_rank, 0));
        /* every rank has the same number of batches (the sampler pads) */
        int64_t nbatches = ts_loader_num_batches(loader);
        if (max_steps > 0 && nbatches > max_steps) nbatches = max_steps;
        double loss_sum = 0;
        for (int64_t b = 0; b < nbatches; b++) {
            ts_tensor *x, *y, *logits, *loss; /* x, y borrowed from the loader */
            CHECK(ts_loader_next(loader, &x, &y));
            if (!x) break; /* (not reached: nbatches is the loader's count) */
            CHECK(ts_ddp_forward(ddp, x, &logits));
            CHECK(ts_cross_entropy(logits, y, 0.0f, &loss));
            CHECK(ts_backward(loss, NULL, false)); /* gradients averaged over the ranks here */
            CHECK(ts_ddp_sync_status(ddp));
            CHECK(ts_optimizer_step(opt));
            ts_optimizer_zero_grad(opt);
            double l = ts_tensor_item(loss, 0);
            loss_sum += l;
            if (rank == 0 && b % 50 == 0) printf("epoch %ld step %4lld  loss %.4f\n", epoch, (long long)b, l);
            ts_tensor_release(logits);
            ts_tensor_release(loss);
        }
        if (rank == 0)
            printf("epoch %ld: %lld steps of %ld x %d samples, mean loss (rank 0) %.4f, %.1fs\n", epoch,
                   (long long)nbatches, batch, world, loss_sum / (double)(nbatches ? nbatches : 1),
                   ts_time_now() - t0);
    }

    /* the replicas are identical: rank 0 evaluates */
    if (rank == 0) {
        double acc;
        CHECK(evaluate(model, test, &acc));
        printf("test accuracy %.2f%% (rank 0 of %d)\n", acc, world);
    }

    CHECK(ts_barrier(pg, NULL)); /* the others wait for rank 0's evaluation */
    free(idx);
    ts_loader_free(loader);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_ddp_free(ddp);
    ts_module_free(model);
    ts_dataset_free(train);
    ts_dataset_free(test);
    ts_pg_free(pg); /* dist.destroy_process_group() */
    return 0;
}
