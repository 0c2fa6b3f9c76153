/*
 * torchvision's evaluation transform, Resize(int(S / 0.875)) + CenterCrop(S) + ToTensor + Normalize, against
 * torchvision itself on 20 images of varied sizes and aspect ratios (tests/eval_transform_ref.py writes them,
 * PNG, JPEG and gray, and torchvision's output for S = 224 and, for the smaller ones, S = 32):
 * ts_image_resize_center_crop_normalize, ts_data_preprocess (`tessera predict`) and the evaluation pipeline
 * (center_crop, what `tessera train/eval` score image folders with) must give torchvision's pixels exactly
 * and its floats within float32 rounding. Prints the figures, and those of the one-pass approximation
 * (ts_center_crop_roi + ts_image_crop_resize_normalize) and of torchvision's tensor path (antialias=True,
 * transforms.v2) for comparison. Skips (77) without Python, torchvision and PIL.
 */
#include "test_util.h"

#include <sys/wait.h>

#define MAX_IMAGES 64
#define FLOAT_TOL 1e-6 /* |ours - torchvision's| in normalised units: float32 rounding of values up to ~2.7 */

static const float mean01[3] = {0.485f, 0.456f, 0.406f}, std01[3] = {0.229f, 0.224f, 0.225f};
static float mean_px[3], std_px[3];

typedef struct ref_image {
    char path[512];
    int S;
} ref_image;
static ref_image refs[MAX_IMAGES];
static int nrefs;
static int skipped;

static bool read_all(const char *path, void *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    bool ok = f && fread(buf, 1, n, f) == n && fgetc(f) == EOF;
    if (f) fclose(f);
    return ok;
}

/* The pixel level of a normalised value of channel c. */
static int level(float v, int c) { return (int)lround((double)v * std_px[c] + mean_px[c]); }

typedef struct stats {
    double max_abs, sum_abs;
    int64_t n, px_diff, max_level;
} stats;

static void compare(stats *s, const float *ours, const float *ref, int S) {
    for (int c = 0; c < 3; c++)
        for (int64_t i = 0; i < (int64_t)S * S; i++) {
            double d = fabs((double)ours[c * S * S + i] - ref[c * S * S + i]);
            s->max_abs = d > s->max_abs ? d : s->max_abs;
            s->sum_abs += d;
            s->n++;
            int64_t dl = llabs((long long)(level(ours[c * S * S + i], c) - level(ref[c * S * S + i], c)));
            s->px_diff += dl != 0;
            s->max_level = dl > s->max_level ? dl : s->max_level;
        }
}

static void print_stats(const char *what, const stats *s) {
    printf("  %-44s max |d| %.3g, mean |d| %.3g (normalised); %lld of %lld values at another pixel level, "
           "at most %lld\n",
           what, s->max_abs, s->sum_abs / (double)(s->n ? s->n : 1), (long long)s->px_diff, (long long)s->n,
           (long long)s->max_level);
}

static void test_against_torchvision(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "PY=$(bash '%s/find_python.sh' numpy torch torchvision PIL) || exit 77; \"$PY\" '%s/eval_transform_ref.py' "
             "'%s'",
             TS_TEST_DIR, TS_TEST_DIR, tu_tmpdir());
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (rc == 77 || rc == 127) {
        skipped = 1;
        return;
    }
    CHECK(rc == 0);
    char list[400];
    snprintf(list, sizeof list, "%s/list.txt", tu_tmpdir());
    FILE *f = fopen(list, "r");
    CHECK(f != NULL);
    if (!f) return;
    while (nrefs < MAX_IMAGES && fscanf(f, "%511s %d", refs[nrefs].path, &refs[nrefs].S) == 2) nrefs++;
    fclose(f);
    CHECK(nrefs >= 20);

    stats ours = {0}, old = {0}, pre = {0}, tv2 = {0};
    int images = 0;
    for (int i = 0; i < nrefs; i++) {
        const int S = refs[i].S, R = (int)(S / 0.875);
        const size_t n = (size_t)3 * S * S;
        float *ref = malloc(n * sizeof *ref), *out = malloc(n * sizeof *out), *o2 = malloc(n * sizeof *o2);
        uint8_t *v2 = malloc(n);
        char p[600];
        snprintf(p, sizeof p, "%.511s.%d.f32", refs[i].path, S);
        CHECK(read_all(p, ref, n * sizeof *ref));
        snprintf(p, sizeof p, "%.511s.%d.tv2", refs[i].path, S);
        CHECK(read_all(p, v2, n));
        ts_image im = TS_IMAGE_INIT;
        CHECK_OK(ts_image_read(refs[i].path, TS_COLOR_RGB, &im));
        if (im.data) {
            images += S == 224;
            stats one = {0};
            CHECK_OK(ts_image_resize_center_crop_normalize(&im, R, S, S, mean_px, std_px, out));
            compare(&one, out, ref, S);
            if (one.px_diff) fprintf(stderr, "  %s at %d: %lld values differ\n", refs[i].path, S, (long long)one.px_diff);
            compare(&ours, out, ref, S);
            if (S == 224) { /* tessera predict's preprocessing */
                CHECK_OK(ts_data_preprocess(&im, S, o2));
                compare(&pre, o2, ref, S);
            }
            /* the one-pass approximation this replaced */
            ts_roi roi = ts_center_crop_roi(im.width, im.height, S, S, 0.875f);
            CHECK_OK(ts_image_crop_resize_normalize(&im, &roi, S, S, false, mean_px, std_px, o2));
            compare(&old, o2, ref, S);
            /* torchvision's tensor path (antialias=True), as pixels */
            for (int c = 0; c < 3; c++)
                for (int k = 0; k < S * S; k++) o2[c * S * S + k] = ((float)v2[k * 3 + c] - mean_px[c]) / std_px[c];
            compare(&tv2, out, o2, S);
        }
        ts_image_free(&im);
        free(ref);
        free(out);
        free(o2);
        free(v2);
    }
    printf("torchvision's Resize(int(S/0.875)) + CenterCrop(S) on %d images (%d at S = 224, %d at S = 32):\n", nrefs,
           images, nrefs - images);
    print_stats("ts_image_resize_center_crop_normalize:", &ours);
    print_stats("ts_data_preprocess (S = 224):", &pre);
    print_stats("the one-pass window resize (before):", &old);
    print_stats("vs torchvision's tensor path (v2, antialias):", &tv2);
    CHECK(ours.n > 0 && ours.px_diff == 0 && ours.max_abs <= FLOAT_TOL);
    CHECK(pre.n > 0 && pre.px_diff == 0 && pre.max_abs <= FLOAT_TOL);
}

/* The evaluation pipeline (center_crop 0.875, what ts_data_open's evaluation source runs) over the same files. */
static void test_pipeline_center_crop(void) {
    if (skipped || nrefs == 0) return;
    char list[400];
    snprintf(list, sizeof list, "%s/pipe.txt", tu_tmpdir());
    FILE *f = fopen(list, "w");
    int n = 0;
    for (int i = 0; i < nrefs; i++)
        if (refs[i].S == 224) fprintf(f, "%s %d\n", refs[i].path, n++);
    fclose(f);
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_list = list;
    o.batch_size = n;
    o.num_threads = 2;
    o.color = TS_COLOR_RGB;
    o.out_width = o.out_height = 224;
    o.center_crop = 0.875f;
    for (int c = 0; c < 3; c++) o.mean[c] = mean_px[c], o.std[c] = std_px[c];
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(&o, &p));
    if (!p) return;
    ts_tensor *x = NULL, *y = NULL;
    ts_batch_info bi;
    CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
    stats s = {0};
    const size_t per = (size_t)3 * 224 * 224;
    float *ref = malloc(per * sizeof *ref);
    for (int64_t r = 0; x && r < bi.size; r++) {
        int64_t lab = ((const int64_t *)ts_tensor_data(y))[r];
        for (int i = 0, k = 0; i < nrefs; i++) {
            if (refs[i].S != 224) continue;
            if (k++ != lab) continue;
            char p2[600];
            snprintf(p2, sizeof p2, "%.511s.224.f32", refs[i].path);
            CHECK(read_all(p2, ref, per * sizeof *ref));
            compare(&s, ts_tensor_data_f32(x) + r * per, ref, 224);
        }
    }
    free(ref);
    print_stats("the pipeline's center_crop (S = 224):", &s);
    CHECK(s.n == (int64_t)n * (int64_t)per && s.px_diff == 0 && s.max_abs <= FLOAT_TOL);
    ts_pipeline_free(p);
}

/* Sizes and edge cases without Python: torchvision's Resize(int) output size; a crop larger than the resized
 * image is zero-padded ((crop - size) // 2 before); no resize when the shorter side is already the size. */
static void test_sizes_and_padding(void) {
    int w, h;
    ts_resize_shorter_side(500, 375, 256, &w, &h);
    CHECK(w == 341 && h == 256); /* int(256 * 500 / 375) = 341 */
    ts_resize_shorter_side(375, 500, 256, &w, &h);
    CHECK(w == 256 && h == 341);
    ts_resize_shorter_side(300, 300, 36, &w, &h);
    CHECK(w == 36 && h == 36);
    /* a 4 x 2 image, resize 2 (no change: the shorter side is 2), crop 3 x 3: one zero row below (pad
     * (3 - 2) // 2 = 0 above), columns round((4 - 3) / 2) = round(0.5) = 0 (ties to even) */
    uint8_t px[8] = {10, 20, 30, 40, 50, 60, 70, 80};
    ts_image im = {px, 4, 2, 1, 0};
    float zero[1] = {0}, one[1] = {1}, out[9];
    CHECK_OK(ts_image_resize_center_crop_normalize(&im, 2, 3, 3, zero, one, out));
    const float want[9] = {10, 20, 30, 50, 60, 70, 0, 0, 0};
    for (int i = 0; i < 9; i++) CHECK(out[i] == want[i]);
    CHECK_STATUS(ts_image_resize_center_crop_normalize(&im, 0, 3, 3, zero, one, out), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_image_resize_center_crop_normalize(NULL, 2, 3, 3, zero, one, out), TS_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    for (int c = 0; c < 3; c++) {
        mean_px[c] = mean01[c] * 255.0f;
        std_px[c] = std01[c] * 255.0f;
    }
    static const tu_test tests[] = {T(test_sizes_and_padding), T(test_against_torchvision),
                                    T(test_pipeline_center_crop)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    if (rc == 0 && skipped) {
        printf("no Python with torch, torchvision and PIL (tests/find_python.sh): the comparison was skipped\n");
        return 77;
    }
    return rc;
}
