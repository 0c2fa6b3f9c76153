/*
 * tests/test_layers.c — the source tree keeps its layering (docs/design.md):
 * a file under src/ includes internal headers only from its own layer or the
 * layers below it. Bottom up:
 *   core, device, tensor, autograd, ops/cpu (kernels), ops,
 *   nn = optim = data = io = pipeline, distributed = export, parallel = launch,
 *   train.
 * Public headers ("tessera/...") and includes relative to the file's own
 * folder are not checked. The tree is found from TS_TEST_DIR, the absolute
 * tests/ folder the build passes in (never __FILE__: ccache's base directory
 * makes that relative).
 */
#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>

static const struct {
    const char *dir;
    int rank;
} layers[] = {
    {"core", 0}, {"device", 1}, {"tensor", 2}, {"autograd", 3}, {"ops/cpu", 4}, {"ops/cuda", 4}, {"ops", 5},
    {"nn", 6},   {"optim", 6},  {"data", 6},   {"io", 6},       {"pipeline", 6}, {"distributed", 7},
    {"export", 7},   {"parallel", 8}, {"launch", 8}, {"train", 9},
};

/* The layer of a path relative to src/ (the longest matching folder), or -1. */
static int layer_of(const char *rel, const char **name) {
    int best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        size_t n = strlen(layers[i].dir);
        if (strncmp(rel, layers[i].dir, n) == 0 && rel[n] == '/' && n > best_len) {
            best = (int)i;
            best_len = n;
        }
    }
    if (best < 0) return -1;
    if (name) *name = layers[best].dir;
    return layers[best].rank;
}

static int files_checked, includes_checked;

static void check_file(const char *path, const char *rel) {
    const char *me_name = NULL;
    int me = layer_of(rel, &me_name);
    if (me < 0) { /* a folder the map does not place: put it in the table (and in docs/design.md) */
        fprintf(stderr, "src/%s: in no layer of tests/test_layers.c's table\n", rel);
        tu_failures++;
        return;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        tu_failures++;
        return;
    }
    files_checked++;
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '#') continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "include", 7) != 0) continue;
        const char *q = strchr(p, '"');
        if (!q) continue;
        char inc[512];
        size_t n = strcspn(q + 1, "\"");
        if (n >= sizeof inc) continue;
        memcpy(inc, q + 1, n);
        inc[n] = 0;
        const char *their_name = NULL;
        int their = layer_of(inc, &their_name);
        if (their < 0) continue; /* public header or one next to the file */
        includes_checked++;
        if (their > me) {
            tu_failures++;
            fprintf(stderr, "src/%s:%d: includes \"%s\": layer %s sits above %s\n", rel, lineno, inc, their_name,
                    me_name);
        }
    }
    fclose(f);
}

static void walk(const char *root, const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[1024], full[2048];
        snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (stat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            walk(root, sub);
        } else {
            size_t n = strlen(sub);
            if (n > 2 && (strcmp(sub + n - 2, ".c") == 0 || strcmp(sub + n - 2, ".h") == 0)) check_file(full, sub);
        }
    }
    closedir(d);
}

static void test_includes_go_down(void) {
    char root[1024];
    snprintf(root, sizeof root, "%s/../src", TS_TEST_DIR); /* CMake's absolute tests/ folder */
    walk(root, "");
    fprintf(stderr, "  %d files, %d internal includes checked\n", files_checked, includes_checked);
    CHECK(files_checked > 50);
}

TU_MAIN(T(test_includes_go_down))
