/*
 * ops/cpu/winograd.c — 3x3 stride-1 convolutions by Winograd's minimal
 * filtering (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
 * 2015): F(2x2, 3x3), 16 multiplies per 2x2 output tile and channel pair
 * instead of 36, and F(4x4, 3x3), 36 per 4x4 tile instead of 144.
 *
 * With the transforms (d an (m+2)^2 input tile, g a 3x3 filter, Y an m x m output tile)
 *
 *   V = B^T d B,   U = G g G^T,   Y = A^T (sum_c U[k,c] .* V[c]) A
 *
 * the sum over channels is, for each of the nx = (m+2)^2 transformed positions xi,
 * a matrix product M[xi] (K, P) = U[xi] (K, C) @ V[xi] (C, P) over the P tiles of
 * a chunk of images; that is where the time goes, in sgemm. All three passes
 * of training use it:
 *
 *   forward      out = conv(x, w)
 *   input grad   gx  = conv(pad(gout, 2 - p), w rotated by 180 degrees with
 *                      K and C swapped): the transposed conv of stride 1 is a conv
 *   weight grad  Y = A^T M A is linear in U, so dL/dU[k,c] = sum_tiles
 *                (A dY A^T)[k] .* V[c] — per xi a product dU[xi] (K, C) +=
 *                Yh[xi] (K, P) @ V[xi]^T (P, C) — and gw = G^T dU G
 *
 * Layout per chunk (whole images, at least WINO_TILES tiles, at least one chunk
 * per thread): V [nx][C][P], M or Yh [nx][K][P], U and dU [nx][K][C]. Input
 * planes are copied into a zero-bordered plane first so every tile load is in
 * bounds. The transforms work a tile at a time in scalar code: at the planes of
 * a ResNet (2x2 .. 28x28) a row holds too few tiles to vectorise over (tried:
 * slower).
 *
 * Threads: chunks run one per thread (each its own scratch, its sgemms on the
 * calling thread) when there are enough of them; otherwise chunks run in turn,
 * the transforms split over channels and each batch of nx products split by
 * the blas kernel. The weight gradient sums into one dU per thread, added in
 * thread order at the end.
 */
#include "tensor/tensor.h"
#include "device/k_blas.h"
#include "ops/cpu/winograd.h"

#include <omp.h>
#include <string.h>

#define NXMAX 36             /* transformed elements per tile: 16 (F(2x2, 3x3)) or 36 (F(4x4, 3x3)) */
#define WINO_TILES 256       /* a chunk holds whole images, at least this many tiles (or all of them) */
#define WINO_MIN_CHANNELS 16 /* AUTO: below this many input or output channels, im2col */

/* The 16 matrices of V, M, Yh, U and dU lie xs(n) floats apart for n-float matrices: 16 more than n, so
 * that when n is a multiple of 1024 (512x512 filters, 16384-float chunks) the 16 streams a tile's
 * transform reads or writes don't all fall in one cache set (4 KiB apart: 16 misses per tile). */
#define WINO_SKEW 16
static inline int64_t xs(int64_t n) { return n + WINO_SKEW; }

bool ts__cpu_wino_ok(const ts_conv2d_geom *g) {
    ts_conv_algo a = ts_get_conv_algo();
    if (a == TS_CONV_IM2COL || ts_get_matmul_precision() != TS_F32) return false;
    if (g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->dh != 1 || g->dw != 1 || g->groups != 1)
        return false;
    if (g->ph > 2 || g->pw > 2 || g->OH < 1 || g->OW < 1 || g->N < 1) return false;
    if (a == TS_CONV_AUTO && (g->C < WINO_MIN_CHANNELS || g->K < WINO_MIN_CHANNELS)) return false;
    return true;
}

/* One convolution as run: x (N, Ci, H, W) -> (N, Co, OH, OW), 3x3, stride 1, padding (ph, pw), in
 * m x m output tiles (m + 2 square input tiles; nx = (m + 2)^2 products). */
typedef struct wino_plan {
    int64_t N, Ci, H, W, Co, OH, OW, ph, pw;
    int m, nx;
    int64_t TH, TW, tpi; /* tiles down, across, per image */
    int64_t PH, PW;      /* the zero-bordered input plane */
    int64_t nb, nchunks; /* images per chunk */
    bool par;            /* chunks one per thread */
    int nthr;
} wino_plan;

/* F(4x4, 3x3) (36 products per 16 outputs) under WINOGRAD where the output plane holds a whole 4x4 tile,
 * the batch still gives each product WINO4_MIN_TILES columns and both convs' channels are
 * WINO4_MIN_CHANNELS or more; else F(2x2, 3x3) (16 per 4): on a 2x2 plane a 4x4 tile is mostly padding,
 * products of a few columns are all packing, and with few channels F(4x4)'s heavier transforms cost more
 * than its products save (the reference CNN's 32->64 conv: 2440 against 2580 images/s). ResNet-18 at
 * 64x64 input, one thread: 101 -> 108 images/s; at 112x112 36.3 -> 39.6. AUTO stays with F(2x2): F(4x4)
 * rounds ~5x worse (~5e-6 of the largest value per conv), and through ResNet-18's batchnorms that moved
 * the absolute sum of a bias gradient by 1e-3 of torchvision's (tests/test_zoo.c's limit) in a -O1 build. */
#define WINO4_MIN_TILES 64
#define WINO4_MIN_CHANNELS 64
static wino_plan wino_plan_of(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t OH, int64_t OW,
                              int64_t ph, int64_t pw) {
    wino_plan q = {.N = N, .Ci = Ci, .H = H, .W = W, .Co = Co, .OH = OH, .OW = OW, .ph = ph, .pw = pw};
    const int64_t tiles4 = N * ((OH + 3) / 4) * ((OW + 3) / 4);
    const ts_conv_algo a = ts_get_conv_algo();
    const bool fits4 = OH >= 4 && OW >= 4;
    if (a == TS_CONV_WINOGRAD_F2)
        q.m = 2;
    else if (a == TS_CONV_WINOGRAD_F4)
        q.m = fits4 ? 4 : 2;
    else if (a == TS_CONV_WINOGRAD)
        q.m = fits4 && tiles4 >= WINO4_MIN_TILES && TS_MIN(Ci, Co) >= WINO4_MIN_CHANNELS ? 4 : 2;
    else /* AUTO: F(2x2) only (see above) */
        q.m = 2;
    q.nx = (q.m + 2) * (q.m + 2);
    q.TH = (OH + q.m - 1) / q.m;
    q.TW = (OW + q.m - 1) / q.m;
    q.tpi = q.TH * q.TW;
    q.PH = q.m * q.TH + 2;
    q.PW = q.m * q.TW + 2;
    q.nthr = omp_get_max_threads();
    q.nb = TS_MIN(N, (WINO_TILES + q.tpi - 1) / q.tpi);
    if (q.nthr > 1 && N >= q.nthr) q.nb = TS_MIN(q.nb, (N + q.nthr - 1) / q.nthr); /* a chunk per thread */
    q.nchunks = (N + q.nb - 1) / q.nb;
    /* one chunk per thread only when that balances: a multiple of the threads, or many chunks */
    q.par = q.nthr > 1 && q.nchunks >= q.nthr && (q.nchunks % q.nthr == 0 || q.nchunks >= 4 * q.nthr);
    return q;
}

/* A thread's transform scratch: the padded plane, then the even/odd row combinations of wino2_in_channel. */
static int64_t wino_pad_plane(const wino_plan *q) { return q->PH * q->PW; }
static int64_t wino_pad_size(const wino_plan *q) { return wino_pad_plane(q) + 8 * (q->TW + 1); }

/* ---- F(2x2, 3x3) transforms, and the zero-bordered plane both tile sizes read --------------------- */

/* pad: (PH, PW) = xp: (H, W) placed at (ph, pw), zeros around */
static void wino_pad(const wino_plan *q, const float *xp, float *pad) {
    const int64_t rows = TS_MIN(q->H, q->PH - q->ph), cols = TS_MIN(q->W, q->PW - q->pw);
    memset(pad, 0, sizeof(float) * (size_t)(q->ph * q->PW));
    for (int64_t r = 0; r < rows; r++) {
        float *d = pad + (r + q->ph) * q->PW;
        for (int64_t s = 0; s < q->pw; s++) d[s] = 0.0f;
        memcpy(d + q->pw, xp + r * q->W, sizeof(float) * (size_t)cols);
        for (int64_t s = q->pw + cols; s < q->PW; s++) d[s] = 0.0f;
    }
    memset(pad + (q->ph + rows) * q->PW, 0, sizeof(float) * (size_t)((q->PH - q->ph - rows) * q->PW));
}

/* V[xi][c][p] = (B^T d B)[xi] for the tiles of channel c of the chunk's images (x: image n0's plane 0);
 * P tiles per chunk, xi stride Ci P. B^T's rows: (1 0 -1 0) (0 1 1 0) (0 -1 1 0) (0 1 0 -1). The row
 * combinations (B^T d) of a row of tiles are made for the whole padded row at once, split into even and
 * odd columns (e, o: 4 x (TW + 1) each) so that the column combinations are unit-stride loops over the
 * tiles: column 2 tx + j of the tile is e[tx], o[tx], e[tx + 1], o[tx + 1] for j = 0..3. */
static void wino2_in_channel(const wino_plan *q, const float *x, int64_t m, int64_t c, float *pad, float *V) {
    const int64_t P = m * q->tpi, vs = xs(q->Ci * P), TW = q->TW, TE = TW + 1;
    float *e = pad + wino_pad_plane(q), *o = e + 4 * TE;
    for (int64_t i = 0; i < m; i++) {
        wino_pad(q, x + (i * q->Ci + c) * q->H * q->W, pad);
        for (int64_t ty = 0; ty < q->TH; ty++) {
            const float *r0 = pad + 2 * ty * q->PW, *r1 = r0 + q->PW, *r2 = r1 + q->PW, *r3 = r2 + q->PW;
            for (int64_t j = 0; j < TE; j++) { /* B^T d: combine rows */
                const int64_t s = 2 * j;
                e[0 * TE + j] = r0[s] - r2[s];
                e[1 * TE + j] = r1[s] + r2[s];
                e[2 * TE + j] = r2[s] - r1[s];
                e[3 * TE + j] = r1[s] - r3[s];
                o[0 * TE + j] = r0[s + 1] - r2[s + 1];
                o[1 * TE + j] = r1[s + 1] + r2[s + 1];
                o[2 * TE + j] = r2[s + 1] - r1[s + 1];
                o[3 * TE + j] = r1[s + 1] - r3[s + 1];
            }
            float *dst = V + c * P + i * q->tpi + ty * TW;
            for (int r = 0; r < 4; r++) { /* (B^T d) B: combine columns */
                const float *er = e + r * TE, *od = o + r * TE;
                float *v0 = dst + (4 * r + 0) * vs, *v1 = dst + (4 * r + 1) * vs;
                float *v2 = dst + (4 * r + 2) * vs, *v3 = dst + (4 * r + 3) * vs;
                for (int64_t tx = 0; tx < TW; tx++) {
                    v0[tx] = er[tx] - er[tx + 1];
                    v1[tx] = od[tx] + er[tx + 1];
                    v2[tx] = er[tx + 1] - od[tx];
                    v3[tx] = od[tx] - od[tx + 1];
                }
            }
        }
    }
}

/* Output rows 2 ty, 2 ty + 1 of one plane from tile row mt (xi stride ms) = A^T M A + bias; A^T's rows:
 * (1 1 1 0) (0 1 -1 -1). nx: tiles whose two columns are both inside the plane; a last half tile
 * (odd OW) and a missing second row (odd OH) are clipped. */
static void wino2_out_row(const float *mt, int64_t ms, int64_t TW, int64_t nx, int64_t OW, bool row1, float bias,
                         float *y0, float *y1) {
#define WINO_OUT_TILE(tx)                                                                                      \
    float t0[4], t1[4];                                                                                        \
    for (int j = 0; j < 4; j++) {                                                                              \
        const float m0 = mt[(0 + j) * ms + (tx)], m1 = mt[(4 + j) * ms + (tx)];                                \
        const float m2 = mt[(8 + j) * ms + (tx)], m3 = mt[(12 + j) * ms + (tx)];                               \
        t0[j] = m0 + m1 + m2;                                                                                  \
        t1[j] = m1 - m2 - m3;                                                                                  \
    }
    if (row1)
        for (int64_t tx = 0; tx < nx; tx++) {
            WINO_OUT_TILE(tx)
            y0[2 * tx] = t0[0] + t0[1] + t0[2] + bias;
            y0[2 * tx + 1] = t0[1] - t0[2] - t0[3] + bias;
            y1[2 * tx] = t1[0] + t1[1] + t1[2] + bias;
            y1[2 * tx + 1] = t1[1] - t1[2] - t1[3] + bias;
        }
    else
        for (int64_t tx = 0; tx < nx; tx++) {
            WINO_OUT_TILE(tx)
            (void)t1;
            y0[2 * tx] = t0[0] + t0[1] + t0[2] + bias;
            y0[2 * tx + 1] = t0[1] - t0[2] - t0[3] + bias;
        }
    for (int64_t tx = nx; tx < TW; tx++) { /* the half tile at an odd OW */
        WINO_OUT_TILE(tx)
        const int64_t s = 2 * tx;
        y0[s] = t0[0] + t0[1] + t0[2] + bias;
        if (s + 1 < OW) y0[s + 1] = t0[1] - t0[2] - t0[3] + bias;
        if (row1) {
            y1[s] = t1[0] + t1[1] + t1[2] + bias;
            if (s + 1 < OW) y1[s + 1] = t1[1] - t1[2] - t1[3] + bias;
        }
    }
#undef WINO_OUT_TILE
}

/* out planes of channel k (out: image n0's plane 0) from M[.][k] */
static void wino2_out_channel(const wino_plan *q, const float *M, int64_t m, int64_t k, float bias, float *out) {
    const int64_t P = m * q->tpi, ms = xs(q->Co * P);
    for (int64_t i = 0; i < m; i++) {
        float *o = out + (i * q->Co + k) * q->OH * q->OW;
        const float *mk = M + k * P + i * q->tpi;
        for (int64_t ty = 0; ty < q->TH; ty++) {
            float *y0 = o + 2 * ty * q->OW;
            wino2_out_row(mk + ty * q->TW, ms, q->TW, q->OW / 2, q->OW, 2 * ty + 1 < q->OH, bias, y0, y0 + q->OW);
        }
    }
}

/* Yh[xi][k][p] = (A dY A^T)[xi] for the 2x2 output-gradient tiles of channel k (go: image n0's plane 0;
 * outside the plane dY is 0). A's rows: (1 0) (1 1) (1 -1) (0 -1): with the tile (a b; c d), A dY's rows
 * are (a b) (a+c b+d) (a-c b-d) (-c -d), and each row (u v) becomes (u, u+v, u-v, -v). */
static void wino2_gout_row(float a, float b, float c, float d, float *ot, int64_t ys) {
    const float t[4][2] = {{a, b}, {a + c, b + d}, {a - c, b - d}, {-c, -d}};
    for (int r = 0; r < 4; r++) {
        ot[(4 * r + 0) * ys] = t[r][0];
        ot[(4 * r + 1) * ys] = t[r][0] + t[r][1];
        ot[(4 * r + 2) * ys] = t[r][0] - t[r][1];
        ot[(4 * r + 3) * ys] = -t[r][1];
    }
}

static void wino2_gout_channel(const wino_plan *q, const float *go, int64_t m, int64_t k, float *Yh) {
    const int64_t P = m * q->tpi, ys = xs(q->Co * P), nx = q->OW / 2;
    for (int64_t i = 0; i < m; i++) {
        const float *g = go + (i * q->Co + k) * q->OH * q->OW;
        for (int64_t ty = 0; ty < q->TH; ty++) {
            const float *g0 = g + 2 * ty * q->OW, *g1 = g0 + q->OW;
            const bool row1 = 2 * ty + 1 < q->OH;
            float *ot = Yh + k * P + i * q->tpi + ty * q->TW;
            if (row1)
                for (int64_t tx = 0; tx < nx; tx++) {
                    const float a = g0[2 * tx], b = g0[2 * tx + 1], c = g1[2 * tx], d = g1[2 * tx + 1];
                    wino2_gout_row(a, b, c, d, ot + tx, ys);
                }
            else
                for (int64_t tx = 0; tx < nx; tx++) wino2_gout_row(g0[2 * tx], g0[2 * tx + 1], 0.0f, 0.0f, ot + tx, ys);
            if (nx < q->TW) /* the half tile at an odd OW */
                wino2_gout_row(g0[2 * nx], 0.0f, row1 ? g1[2 * nx] : 0.0f, 0.0f, ot + nx, ys);
        }
    }
}

/* u = G g G^T for a 3x3 filter g (row-major; rot: read it rotated by 180 degrees). G's rows:
 * (1 0 0) (1/2 1/2 1/2) (1/2 -1/2 1/2) (0 0 1). u[xi] goes to u[xi * us]. */
static inline void wino2_filter(const float *g, bool rot, float *u, int64_t us) {
    float f[3][3], t[4][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) f[i][j] = rot ? g[(2 - i) * 3 + (2 - j)] : g[i * 3 + j];
    for (int j = 0; j < 3; j++) {
        t[0][j] = f[0][j];
        t[1][j] = 0.5f * (f[0][j] + f[1][j] + f[2][j]);
        t[2][j] = 0.5f * (f[0][j] - f[1][j] + f[2][j]);
        t[3][j] = f[2][j];
    }
    for (int r = 0; r < 4; r++) {
        u[(4 * r + 0) * us] = t[r][0];
        u[(4 * r + 1) * us] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
        u[(4 * r + 2) * us] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
        u[(4 * r + 3) * us] = t[r][2];
    }
}

/* g (3x3) = G^T du G for du[xi] at du[xi * ds]: the filter gradient from the transformed one. */
static void wino2_filter_grad(const float *du, int64_t ds, float *g) {
    float s[3][4];
    for (int j = 0; j < 4; j++) {
        const float u0 = du[j * ds], u1 = du[(4 + j) * ds], u2 = du[(8 + j) * ds], u3 = du[(12 + j) * ds];
        s[0][j] = u0 + 0.5f * (u1 + u2);
        s[1][j] = 0.5f * (u1 - u2);
        s[2][j] = 0.5f * (u1 + u2) + u3;
    }
    for (int i = 0; i < 3; i++) {
        g[i * 3 + 0] = s[i][0] + 0.5f * (s[i][1] + s[i][2]);
        g[i * 3 + 1] = 0.5f * (s[i][1] - s[i][2]);
        g[i * 3 + 2] = 0.5f * (s[i][1] + s[i][2]) + s[i][3];
    }
}

/* ---- F(4x4, 3x3) ---------------------------------------------------------------------------------------
 * Lavin & Gray's matrices for m = 4 (points 0, +-1, +-2, infinity), written out term by term:
 *   B^T d: (4 d0 - 5 d2 + d4, -4 (d1 + d2) + d3 + d4, 4 (d1 - d2) - d3 + d4, 2 (d3 - d1) - d2 + d4,
 *           2 (d1 - d3) - d2 + d4, 4 d1 - 5 d3 + d5)
 *   G g:   (g0 / 4, -(g0 + g1 + g2) / 6, -(g0 - g1 + g2) / 6, g0 / 24 + g1 / 12 + g2 / 6,
 *           g0 / 24 - g1 / 12 + g2 / 6, g2)
 *   A^T v: (v0 + v1 + v2 + v3 + v4, v1 - v2 + 2 (v3 - v4), v1 + v2 + 4 (v3 + v4), v1 - v2 + 8 (v3 - v4) + v5)
 * and their transposes for the gradients. Tiles are 6x6 (36 products) for 4x4 outputs. */

static inline void wt4_in(float d0, float d1, float d2, float d3, float d4, float d5, float *v, int64_t vs) {
    v[0 * vs] = 4.0f * d0 - 5.0f * d2 + d4;
    v[1 * vs] = d3 + d4 - 4.0f * (d1 + d2);
    v[2 * vs] = d4 - d3 + 4.0f * (d1 - d2);
    v[3 * vs] = d4 - d2 + 2.0f * (d3 - d1);
    v[4 * vs] = d4 - d2 + 2.0f * (d1 - d3);
    v[5 * vs] = 4.0f * d1 - 5.0f * d3 + d5;
}

static inline void wt4_out(const float *v, int64_t vs, float *y) {
    const float v0 = v[0], v1 = v[vs], v2 = v[2 * vs], v3 = v[3 * vs], v4 = v[4 * vs], v5 = v[5 * vs];
    const float s12 = v1 + v2, d12 = v1 - v2, s34 = v3 + v4, d34 = v3 - v4;
    y[0] = v0 + s12 + s34;
    y[1] = d12 + 2.0f * d34;
    y[2] = s12 + 4.0f * s34;
    y[3] = d12 + 8.0f * d34 + v5;
}

/* v (6, stride vs) = A y (4): the transpose of wt4_out */
static inline void wt4_gout(float y0, float y1, float y2, float y3, float *v, int64_t vs) {
    const float e = y0 + y2, o = y1 + y3, e4 = y0 + 4.0f * y2, o8 = 2.0f * y1 + 8.0f * y3;
    v[0 * vs] = y0;
    v[1 * vs] = e + o;
    v[2 * vs] = e - o;
    v[3 * vs] = e4 + o8;
    v[4 * vs] = e4 - o8;
    v[5 * vs] = y3;
}

static inline void wt4_filter(float g0, float g1, float g2, float *u, int64_t us) {
    const float a = (g0 + g2) / 6.0f, b = g1 / 6.0f, c = g0 / 24.0f + g2 / 6.0f, d = g1 / 12.0f;
    u[0 * us] = 0.25f * g0;
    u[1 * us] = -a - b;
    u[2 * us] = b - a;
    u[3 * us] = c + d;
    u[4 * us] = c - d;
    u[5 * us] = g2;
}

/* g (3) = G^T u (6, stride us): the transpose of wt4_filter */
static inline void wt4_filter_grad(const float *u, int64_t us, float *g) {
    const float u0 = u[0], u1 = u[us], u2 = u[2 * us], u3 = u[3 * us], u4 = u[4 * us], u5 = u[5 * us];
    g[0] = 0.25f * u0 - (u1 + u2) / 6.0f + (u3 + u4) / 24.0f;
    g[1] = (u2 - u1) / 6.0f + (u3 - u4) / 12.0f;
    g[2] = (u3 + u4 - u1 - u2) / 6.0f + u5;
}

/* V[xi][c][p] = (B^T d B)[xi], 6x6 tiles d of channel c's zero-bordered planes */
static void wino4_in_channel(const wino_plan *q, const float *x, int64_t m, int64_t c, float *pad, float *V) {
    const int64_t P = m * q->tpi, vs = xs(q->Ci * P), PW = q->PW;
    for (int64_t i = 0; i < m; i++) {
        wino_pad(q, x + (i * q->Ci + c) * q->H * q->W, pad);
        for (int64_t ty = 0; ty < q->TH; ty++) {
            float *o = V + c * P + i * q->tpi + ty * q->TW;
            for (int64_t tx = 0; tx < q->TW; tx++) {
                const float *d = pad + 4 * ty * PW + 4 * tx;
                float t[6][6]; /* t[a][j] = (B^T d)[a][j]: columns first */
                for (int j = 0; j < 6; j++)
                    wt4_in(d[j], d[PW + j], d[2 * PW + j], d[3 * PW + j], d[4 * PW + j], d[5 * PW + j], &t[0][j], 6);
                for (int a = 0; a < 6; a++) /* then along each row: V[a][b] */
                    wt4_in(t[a][0], t[a][1], t[a][2], t[a][3], t[a][4], t[a][5], o + (6 * a) * vs + tx, vs);
            }
        }
    }
}

/* out planes of channel k = A^T M[.][k] A + bias, 4x4 tiles clipped at the plane's edges */
static void wino4_out_channel(const wino_plan *q, const float *M, int64_t m, int64_t k, float bias, float *out) {
    const int64_t P = m * q->tpi, ms = xs(q->Co * P), OW = q->OW;
    for (int64_t i = 0; i < m; i++) {
        float *o = out + (i * q->Co + k) * q->OH * OW;
        const float *mk = M + k * P + i * q->tpi;
        for (int64_t ty = 0; ty < q->TH; ty++) {
            const int rows = (int)TS_MIN(4, q->OH - 4 * ty);
            for (int64_t tx = 0; tx < q->TW; tx++) {
                const float *mt = mk + ty * q->TW + tx;
                const int cols = (int)TS_MIN(4, OW - 4 * tx);
                float t[4][6], y[4]; /* t[r][b] = (A^T M)[r][b]: down the columns first */
                for (int b = 0; b < 6; b++) {
                    wt4_out(mt + b * ms, 6 * ms, y);
                    for (int r = 0; r < 4; r++) t[r][b] = y[r];
                }
                for (int r = 0; r < rows; r++) { /* then along each row */
                    wt4_out(t[r], 1, y);
                    float *yr = o + (4 * ty + r) * OW + 4 * tx;
                    if (cols == 4) {
                        yr[0] = y[0] + bias;
                        yr[1] = y[1] + bias;
                        yr[2] = y[2] + bias;
                        yr[3] = y[3] + bias;
                    } else {
                        for (int j = 0; j < cols; j++) yr[j] = y[j] + bias;
                    }
                }
            }
        }
    }
}

/* Yh[xi][k][p] = (A dY A^T)[xi] for 4x4 output-gradient tiles of channel k (zeros outside the plane) */
static void wino4_gout_channel(const wino_plan *q, const float *go, int64_t m, int64_t k, float *Yh) {
    const int64_t P = m * q->tpi, ys = xs(q->Co * P), OW = q->OW;
    for (int64_t i = 0; i < m; i++) {
        const float *g = go + (i * q->Co + k) * q->OH * OW;
        for (int64_t ty = 0; ty < q->TH; ty++) {
            const int rows = (int)TS_MIN(4, q->OH - 4 * ty);
            float *ot = Yh + k * P + i * q->tpi + ty * q->TW;
            for (int64_t tx = 0; tx < q->TW; tx++) {
                const int cols = (int)TS_MIN(4, OW - 4 * tx);
                float y[4][4], t[4][6]; /* the tile, then t[r][b] = (dY A^T)[r][b]: along the rows first */
                for (int r = 0; r < 4; r++)
                    for (int j = 0; j < 4; j++) y[r][j] = r < rows && j < cols ? g[(4 * ty + r) * OW + 4 * tx + j] : 0.0f;
                for (int r = 0; r < 4; r++) wt4_gout(y[r][0], y[r][1], y[r][2], y[r][3], t[r], 1);
                for (int b = 0; b < 6; b++) /* then down the columns: Yh[a][b] */
                    wt4_gout(t[0][b], t[1][b], t[2][b], t[3][b], ot + b * ys + tx, 6 * ys);
            }
        }
    }
}

/* u = G g G^T (6x6) for a 3x3 filter g (rot: rotated by 180 degrees); u[xi] at u[xi * us] */
static inline void wino4_filter(const float *g, bool rot, float *u, int64_t us) {
    float f[3][3], t[6][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) f[i][j] = rot ? g[(2 - i) * 3 + (2 - j)] : g[i * 3 + j];
    for (int j = 0; j < 3; j++) wt4_filter(f[0][j], f[1][j], f[2][j], &t[0][j], 3); /* down the columns */
    for (int a = 0; a < 6; a++) wt4_filter(t[a][0], t[a][1], t[a][2], u + 6 * a * us, us); /* along the rows */
}

/* g (3x3) = G^T du G for du[xi] at du[xi * ds] */
static void wino4_filter_grad(const float *du, int64_t ds, float *g) {
    float t[6][3], r[3];
    for (int a = 0; a < 6; a++) { /* along the rows */
        wt4_filter_grad(du + 6 * a * ds, ds, r);
        for (int j = 0; j < 3; j++) t[a][j] = r[j];
    }
    for (int j = 0; j < 3; j++) { /* down the columns */
        wt4_filter_grad(&t[0][j], 3, r);
        for (int i = 0; i < 3; i++) g[i * 3 + j] = r[i];
    }
}

/* ---- drivers --------------------------------------------------------------------------------------- */


/* A chunk's work: images n0 .. n0 + m, P tiles. */
typedef struct wino_chunk {
    int64_t n0, m, P;
} wino_chunk;

static wino_chunk wino_chunk_at(const wino_plan *q, int64_t ch) {
    wino_chunk c;
    c.n0 = ch * q->nb;
    c.m = TS_MIN(q->nb, q->N - c.n0);
    c.P = c.m * q->tpi;
    return c;
}

/* Transforms x's channels of chunk c into V: split over the threads when split (chunks in turn), each
 * thread with its own pad plane from pads; else on this thread with pads[0]. */
static void wino_in_chunk(const wino_plan *q, const float *x, wino_chunk c, float *pads, float *V, bool split) {
    const float *xc = x + c.n0 * q->Ci * q->H * q->W;
#pragma omp parallel for schedule(static) if (split)
    for (int64_t ch = 0; ch < q->Ci; ch++)
        (q->m == 4 ? wino4_in_channel : wino2_in_channel)(q, xc, c.m, ch,
                                                          pads + (split ? omp_get_thread_num() : 0) * wino_pad_size(q), V);
}

static void wino_out_chunk(const wino_plan *q, const float *M, wino_chunk c, const float *bias, float *out,
                           bool split) {
    float *oc = out + c.n0 * q->Co * q->OH * q->OW;
#pragma omp parallel for schedule(static) if (split)
    for (int64_t k = 0; k < q->Co; k++)
        (q->m == 4 ? wino4_out_channel : wino2_out_channel)(q, M, c.m, k, bias ? bias[k] : 0.0f, oc);
}

static void wino_gout_chunk(const wino_plan *q, const float *go, wino_chunk c, float *Yh, bool split) {
    const float *gc = go + c.n0 * q->Co * q->OH * q->OW;
#pragma omp parallel for schedule(static) if (split)
    for (int64_t k = 0; k < q->Co; k++) (q->m == 4 ? wino4_gout_channel : wino2_gout_channel)(q, gc, c.m, k, Yh);
}

/* The 16 products of a chunk: C[xi] = A[xi] op B[xi] (+ beta C[xi]), A at xi * as, B at xi * bs. */
static ts_status wino_gemms(ts_device *dev, int nx, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                            int64_t as, const float *B, int64_t ldb, int64_t bs, float beta, float *C, int64_t ldc,
                            int64_t cs) {
    int64_t aoff[NXMAX], boff[NXMAX];
    for (int i = 0; i < nx; i++) {
        aoff[i] = i * as;
        boff[i] = i * bs;
    }
    return dev->k_blas->sgemm_batched(dev, false, tb, M, N, K, 1.0f, A, lda, aoff, B, ldb, boff, beta, C, ldc, cs,
                                      nx);
}

/* One chunk of a conv: out = A^T (U @ V) A + bias. s: this chunk's slot (V, then M); pads: pad planes. */
static void wino_conv_chunk(const wino_plan *q, ts_device *dev, const float *x, const float *U, const float *bias,
                            float *out, int64_t ch, float *s, float *pads, bool split) {
    const wino_chunk c = wino_chunk_at(q, ch);
    float *V = s, *M = s + q->nx * xs(q->Ci * c.P);
    wino_in_chunk(q, x, c, pads, V, split);
    /* M[xi]: (Co, P) = U[xi]: (Co, Ci) @ V[xi]: (Ci, P); sizes always fit, so the status is TS_OK */
    (void)wino_gemms(dev, q->nx, false, q->Co, c.P, q->Ci, U, q->Ci, xs(q->Co * q->Ci), V, c.P, xs(q->Ci * c.P), 0.0f, M,
                     c.P, xs(q->Co * c.P));
    wino_out_chunk(q, M, c, bias, out, split);
}

/* out (N, Co, OH, OW) = conv of x (N, Ci, H, W) by the transformed filters U [16][Co][Ci], + bias. */
static ts_status wino_conv(const wino_plan *q, ts_device *dev, const float *x, const float *U, const float *bias,
                           float *out) {
    const int64_t Pb = q->nb * q->tpi, slot = q->nx * (xs(q->Ci * Pb) + xs(q->Co * Pb)), padsz = wino_pad_size(q);
    const int nslots = q->par ? q->nthr : 1;
    ts_tensor *buf = NULL;
    TS_TRY(ts__scratch_f32(dev, nslots * slot + q->nthr * padsz, &buf));
    float *slots = ts__f32(buf), *pads = slots + nslots * slot;
    if (q->par) {
#pragma omp parallel
        {
            const int t = omp_get_thread_num();
#pragma omp for schedule(static)
            for (int64_t ch = 0; ch < q->nchunks; ch++)
                wino_conv_chunk(q, dev, x, U, bias, out, ch, slots + t * slot, pads + t * padsz, false);
        }
    } else {
        for (int64_t ch = 0; ch < q->nchunks; ch++)
            wino_conv_chunk(q, dev, x, U, bias, out, ch, slots, pads, q->nthr > 1);
    }
    ts_tensor_release(buf);
    return TS_OK;
}

/* U [nx][Co][Ci]: q's transformed filters. w: (K, C, 3, 3). transposed: the input gradient's conv (Co = C,
 * Ci = K, each filter rotated by 180 degrees; k innermost, so each xi's row is written in order), else
 * the forward conv's (Co = K, Ci = C). The loops are spelled out per tile size so that the transform is
 * inlined into them (through a function pointer it was not: twice the time). */
#define WINO_FILTER_LOOPS(filter)                                                                              \
    do {                                                                                                       \
        if (transposed) {                                                                                      \
            _Pragma("omp parallel for schedule(static) if (K * C >= 4096)") for (int64_t c = 0; c < C; c++)   \
                for (int64_t k = 0; k < K; k++) filter(w + (k * C + c) * 9, true, U + c * K + k, us);        \
        } else {                                                                                               \
            _Pragma("omp parallel for schedule(static) if (K * C >= 4096)") for (int64_t k = 0; k < K; k++)   \
                for (int64_t c = 0; c < C; c++) filter(w + (k * C + c) * 9, false, U + k * C + c, us);       \
        }                                                                                                      \
    } while (0)

static void wino_filters(const wino_plan *q, const float *w, int64_t K, int64_t C, bool transposed, float *U) {
    const int64_t us = xs(K * C);
    if (q->m == 4)
        WINO_FILTER_LOOPS(wino4_filter);
    else
        WINO_FILTER_LOOPS(wino2_filter);
}
#undef WINO_FILTER_LOOPS

ts_status ts__cpu_wino_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                              const ts_tensor *b) {
    ts_device *dev = x->storage->device;
    const wino_plan q = wino_plan_of(g->N, g->C, g->H, g->W, g->K, g->OH, g->OW, g->ph, g->pw);
    ts_tensor *ut = NULL;
    TS_TRY(ts__scratch_f32(dev, q.nx * xs(g->K * g->C), &ut));
    wino_filters(&q, ts__f32(w), g->K, g->C, false, ts__f32(ut));
    ts_status st = wino_conv(&q, dev, ts__f32(x), ts__f32(ut), b ? ts__f32(b) : NULL, ts__f32(out));
    ts_tensor_release(ut);
    return st;
}

/* One chunk of the weight gradient: dU += Yh @ V^T. s: the slot (V, Yh, then dU). */
static void wino_wgrad_chunk(const wino_plan *q, ts_device *dev, const float *x, const float *go, int64_t ch,
                             float *s, float *dU, float *pads, bool split) {
    const wino_chunk c = wino_chunk_at(q, ch);
    float *V = s, *Yh = s + q->nx * xs(q->Ci * c.P);
    wino_in_chunk(q, x, c, pads, V, split);
    wino_gout_chunk(q, go, c, Yh, split);
    /* dU[xi]: (Co, Ci) += Yh[xi]: (Co, P) @ V[xi]^T: (P, Ci) */
    (void)wino_gemms(dev, q->nx, true, q->Co, q->Ci, c.P, Yh, c.P, xs(q->Co * c.P), V, c.P, xs(q->Ci * c.P), 1.0f, dU,
                     q->Ci, xs(q->Co * q->Ci));
}

static ts_status wino_wgrad(const wino_plan *q, ts_device *dev, const float *x, const float *go, float *gw) {
    const int64_t Pb = q->nb * q->tpi, UN = q->nx * xs(q->Co * q->Ci), padsz = wino_pad_size(q);
    const int64_t slot = q->nx * (xs(q->Ci * Pb) + xs(q->Co * Pb)) + UN;
    const int nslots = q->par ? q->nthr : 1;
    ts_tensor *buf = NULL;
    TS_TRY(ts__scratch_f32(dev, nslots * slot + q->nthr * padsz, &buf));
    float *slots = ts__f32(buf), *pads = slots + nslots * slot;
    for (int t = 0; t < nslots; t++) memset(slots + t * slot + slot - UN, 0, sizeof(float) * (size_t)UN);
    if (q->par) {
#pragma omp parallel
        {
            const int t = omp_get_thread_num();
            float *s = slots + t * slot;
#pragma omp for schedule(static)
            for (int64_t ch = 0; ch < q->nchunks; ch++)
                wino_wgrad_chunk(q, dev, x, go, ch, s, s + slot - UN, pads + t * padsz, false);
        }
    } else {
        for (int64_t ch = 0; ch < q->nchunks; ch++)
            wino_wgrad_chunk(q, dev, x, go, ch, slots, slots + slot - UN, pads, q->nthr > 1);
    }
    float *dU = slots + slot - UN;
    for (int t = 1; t < nslots; t++) { /* thread order: the same sums every run */
        const float *o = slots + t * slot + slot - UN;
        for (int64_t i = 0; i < UN; i++) dU[i] += o[i];
    }
    const int64_t KC = q->Co * q->Ci;
#pragma omp parallel for schedule(static) if (KC >= 4096)
    for (int64_t i = 0; i < KC; i++) {
        if (q->m == 4)
            wino4_filter_grad(dU + i, xs(KC), gw + i * 9);
        else
            wino2_filter_grad(dU + i, xs(KC), gw + i * 9);
    }
    ts_tensor_release(buf);
    return TS_OK;
}

ts_status ts__cpu_wino_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                       const ts_tensor *w, ts_tensor *gx, ts_tensor *gw) {
    ts_device *dev = x->storage->device;
    const float *go = ts__f32(gout);
    if (gx) { /* the transposed conv: gout (N, K, OH, OW) -> gx (N, C, H, W), padding 2 - p */
        const wino_plan q = wino_plan_of(g->N, g->K, g->OH, g->OW, g->C, g->H, g->W, 2 - g->ph, 2 - g->pw);
        ts_tensor *ut = NULL;
        TS_TRY(ts__scratch_f32(dev, q.nx * xs(g->K * g->C), &ut));
        wino_filters(&q, ts__f32(w), g->K, g->C, true, ts__f32(ut));
        ts_status st = wino_conv(&q, dev, go, ts__f32(ut), NULL, ts__f32(gx));
        ts_tensor_release(ut);
        TS_TRY(st);
    }
    if (gw) {
        const wino_plan q = wino_plan_of(g->N, g->C, g->H, g->W, g->K, g->OH, g->OW, g->ph, g->pw);
        TS_TRY(wino_wgrad(&q, dev, ts__f32(x), go, ts__f32(gw)));
    }
    return TS_OK;
}
