/*
 * tools/train_data.c — image folders and file lists as `tessera train` input.
 */
#include "train_data.h"

#include "cmd_data.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

bool train_data_is_images(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return false;
    if (S_ISREG(sb.st_mode)) return true;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/train-images-idx3-ubyte.gz", path);
    if (stat(buf, &sb) == 0) return false;
    snprintf(buf, sizeof buf, "%s/train-images-idx3-ubyte", path);
    if (stat(buf, &sb) == 0) return false;
    /* images need class sub-folders: a folder without any is taken for IDX (its error names the files) */
    DIR *d = opendir(path);
    bool sub = false;
    for (struct dirent *e; d && !sub && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(buf, sizeof buf, "%s/%s", path, e->d_name);
        sub = stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode);
    }
    if (d) closedir(d);
    return sub;
}

ts_status train_images_open(const char *path, int64_t batch_size, int64_t seed, int threads, int rank, int world,
                            bool want_test, ts_pipeline **pipe, ts_dataset **test) {
    char trainbuf[4096], testbuf[4096];
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    bool split = data_image_source(path, "train", &o.reader, trainbuf, sizeof trainbuf);
    o.reader.random_shuffle = true;
    o.reader.seed = seed;
    o.reader.shard_id = rank;
    o.reader.num_shards = world;
    o.reader.pad_last_batch = world > 1;
    o.batch_size = batch_size;
    o.num_threads = threads;
    o.color = TS_COLOR_GRAY;
    o.out_width = o.out_height = 28;
    o.mean[0] = TS_FASHION_MNIST_MEAN * 255.0f;
    o.std[0] = TS_FASHION_MNIST_STD * 255.0f;
    ts_status st = ts_pipeline_new(&o, pipe);
    if (st != TS_OK || !want_test) return st;
    ts_pipeline_opts t = o;
    t.reader.shard_id = 0;
    t.reader.num_shards = 1;
    if (split) {
        snprintf(testbuf, sizeof testbuf, "%s/test", path);
        struct stat sb;
        if (stat(testbuf, &sb) == 0 && S_ISDIR(sb.st_mode)) t.reader.file_root = testbuf;
    }
    st = ts_dataset_load_images(&t, test);
    if (st != TS_OK) {
        ts_pipeline_free(*pipe);
        *pipe = NULL;
    }
    return st;
}

int64_t train_batch_index(const ts_loader *loader, const ts_pipeline *pipe) {
    return pipe ? ts_pipeline_batch_index(pipe) : ts_loader_batch_index(loader);
}
