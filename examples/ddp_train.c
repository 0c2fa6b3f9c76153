/*
 * examples/ddp_train.c — data-parallel training on Fashion-MNIST with the
 * library's training loop, the C version of PyTorch's DDP recipe:
 *
 *     dist.init_process_group(init_method="env://")
 *     sampler = DistributedSampler(train_set)          # this rank's share
 *     model = DDP(make_cnn())
 *     for epoch in range(epochs):
 *         sampler.set_epoch(epoch)                      # a new shuffle each epoch
 *         for x, y in DataLoader(train_set, batch_size, sampler=sampler): step(x, y)
 *         if rank == 0: evaluate(); save()
 *
 * Every rank runs this program; the process group comes from the environment
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so launch it with
 *     tessera run -n 2 build/example_ddp_train
 * (or torchrun-style by hand, one shell per rank:
 *     RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/example_ddp_train &
 *     RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/example_ddp_train)
 * Rank 0 prints the loss, the test accuracy after every epoch and the checkpoint.
 *
 * usage: example_ddp_train [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR] [--seed S]
 *   --batch is per rank (the global batch is B * world size); --max-steps caps
 *   the optimizer steps of the whole run (0: no cap).
 *
 * Build it against an installed Tessera:
 *     cc ddp_train.c $(pkg-config --cflags --libs tessera) -o ddp_train
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        ts_status s_ = (call);                                                                          \
        if (s_ != TS_OK) {                                                                              \
            fprintf(stderr, "[rank %d] %s failed: %s\n", rank, #call, ts_last_error());                 \
            if (pg) ts_pg_abort(pg, "example_ddp_train failed"); /* the others fail fast, naming us */ \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)

/* Called on every rank after every step and epoch; rank 0 prints. */
static ts_status report(const ts_train_event *ev, void *user) {
    (void)user;
    if (ev->rank != 0) return TS_OK;
    if (ev->kind == TS_TRAIN_STEP && ev->step % 50 == 1)
        printf("epoch %lld step %4lld  loss %.4f  lr %.4f\n", (long long)ev->epoch, (long long)ev->step, ev->loss,
               ev->lr);
    if (ev->kind == TS_TRAIN_EPOCH_END && ev->eval)
        printf("epoch %lld: mean loss (rank 0) %.4f, test accuracy %.2f%%, %.0f images/s\n", (long long)ev->epoch,
               ev->mean_loss, 100.0 * ev->eval->accuracy, (double)ev->epoch_images / ev->epoch_seconds);
    if (ev->kind == TS_TRAIN_CHECKPOINT) printf("saved %s\n", ev->checkpoint);
    fflush(stdout);
    return TS_OK;
}

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    long epochs = 2, max_steps = 0, batch = 64;
    double lr = 0.05;
    unsigned long long seed = 42;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v || (strcmp(a, "--data") && strcmp(a, "--epochs") && strcmp(a, "--max-steps") && strcmp(a, "--batch") &&
                   strcmp(a, "--lr") && strcmp(a, "--seed"))) {
            fprintf(stderr, "usage: %s [--data DIR] [--epochs N] [--max-steps N] [--batch B] [--lr LR] [--seed S]\n",
                    argv[0]);
            return 2;
        }
        if (!strcmp(a, "--data")) dir = v;
        if (!strcmp(a, "--epochs")) epochs = atol(v);
        if (!strcmp(a, "--max-steps")) max_steps = atol(v);
        if (!strcmp(a, "--batch")) batch = atol(v);
        if (!strcmp(a, "--lr")) lr = atof(v);
        if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
    }
    int rank = -1;
    ts_process_group *pg = NULL;

    /* dist.init_process_group(init_method="env://") */
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    CHECK(ts_pg_new(&po, &pg));
    rank = ts_pg_rank(pg);

    /* this rank's share of the training set (DistributedSampler), and the test set */
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = dir;
    d.batch_size = batch;
    d.seed = seed;
    d.rank = rank;
    d.world_size = ts_pg_size(pg);
    ts_batch_source *train, *test;
    CHECK(ts_data_open(&d, &train, &test));

    /* DDP(model): rank 0's weights go to every rank; gradients are averaged during backward */
    ts_rng rng;
    ts_rng_seed(&rng, seed);
    ts_module *model;
    CHECK(ts_model_reference_cnn(&rng, &model));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_DDP;
    so.pg = pg;
    ts_strategy *ddp;
    CHECK(ts_strategy_new(model, &so, &ddp)); /* owns the model now */

    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt;
    CHECK(ts_module_parameters(ts_strategy_model(ddp), &params));
    CHECK(ts_optimizer_by_name("sgd", &params, lr, 0.9, 5e-4, &opt));
    int64_t steps_per_epoch = ts_batch_source_num_batches(train, 0);
    ts_lr_schedule cosine;
    CHECK(ts_lr_schedule_by_name("cosine", lr, epochs * steps_per_epoch, steps_per_epoch, &cosine));

    /* the loop: epochs, learning rate per step, rank 0 evaluates and checkpoints */
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = epochs;
    to.max_steps = max_steps;
    to.schedule = &cosine;
    to.eval = test;
    to.checkpoint = "ddp_train.ckpt";
    to.callback = report;
    to.seed = seed;
    to.batch_size = batch;
    ts_trainer *trainer;
    CHECK(ts_trainer_new(ddp, opt, train, &to, &trainer));
    ts_train_result r;
    CHECK(ts_trainer_run(trainer, &r));
    if (rank == 0)
        printf("done: %lld steps on %d ranks, test accuracy %.2f%%\n", (long long)r.steps, ts_pg_size(pg),
               100.0 * r.eval.accuracy);

    CHECK(ts_barrier(pg, NULL)); /* the others wait for rank 0's last evaluation */
    ts_trainer_free(trainer);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(ddp);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    ts_pg_free(pg); /* dist.destroy_process_group() */
    return 0;
}
