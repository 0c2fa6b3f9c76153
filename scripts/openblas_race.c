/*
 * scripts/openblas_race.c — OpenBLAS 0.3.21 (Debian's OpenMP build) computes
 * wrong sgemm results when threads of an OpenMP team call it concurrently while
 * openblas_set_num_threads toggles its thread count: set_num_threads frees and
 * reallocates OpenBLAS's per-thread buffers under the feet of the sgemm another
 * thread of the team runs. This is the pattern conv2d's backward had (each
 * thread runs its images' gemms; src/ops/cpu/blas.c used to set the count to 1
 * inside the region); it gave a wrong conv gradient in about 1 step of 60 with
 * two threads. Not part of the build:
 *
 *   cc -O2 scripts/openblas_race.c -o /tmp/openblas_race -fopenmp \
 *      -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp \
 *      -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas
 *   /tmp/openblas_race 300 set     # toggles the count inside the region: some iterations differ
 *   /tmp/openblas_race 300         # leaves it alone (what Tessera does now): none differ
 * (Run two or three at once on a 2-core machine: the race needs preemption.)
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
#define NI 32
int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 300;
    int toggle = argc > 2 && strcmp(argv[2], "set") == 0;
    const int K = 64, CKK = 288, OHW = 196;
    float *W = malloc(4 * K * CKK), *G = malloc(4 * NI * K * OHW), *X = malloc(4 * NI * CKK * OHW);
    for (int i = 0; i < K * CKK; i++) W[i] = rand() / (float)RAND_MAX - .5f;
    for (int i = 0; i < NI * K * OHW; i++) G[i] = rand() / (float)RAND_MAX - .5f;
    for (int i = 0; i < NI * CKK * OHW; i++) X[i] = rand() / (float)RAND_MAX - .5f;
    float *ref = NULL, *out = malloc(4 * NI * CKK * OHW), *gw[2]; gw[0] = malloc(4*K*CKK); gw[1] = malloc(4*K*CKK);
    float *refw = NULL; int bad = 0;
    omp_set_num_threads(2);
    for (int it = 0; it < iters; it++) {
#pragma omp parallel
        {
            int t = omp_get_thread_num();
            memset(gw[t], 0, 4 * K * CKK);
#pragma omp for schedule(static)
            for (int n = 0; n < NI; n++) {
                if (toggle && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, CKK, OHW, 1, G + n*K*OHW, OHW, X + n*CKK*OHW, OHW, 1, gw[t], CKK);
                if (toggle && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, OHW, K, 1, W, CKK, G + n*K*OHW, OHW, 0, out + n*CKK*OHW, OHW);
            }
        }
        for (int i = 0; i < K*CKK; i++) gw[0][i] += gw[1][i];
        if (!ref) { ref = malloc(4*NI*CKK*OHW); memcpy(ref, out, 4*NI*CKK*OHW); refw = malloc(4*K*CKK); memcpy(refw, gw[0], 4*K*CKK); }
        else { if (memcmp(ref, out, 4*NI*CKK*OHW)) { bad++; printf("iter %d: gx differs\n", it); } if (memcmp(refw, gw[0], 4*K*CKK)) { bad++; printf("iter %d: gw differs\n", it);} }
        openblas_set_num_threads(2);
        float *D = calloc(3136 * 128, 4), *E = calloc(64*128, 4);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 128, 3136, 1, D, 3136, D, 128, 0, E, 128); free(E);
        free(D);
    }
    printf("%d bad in %d\n", bad, iters);
}
