/* orchestra's compiled kernels: the few steps of real models that numpy can't do at speed.
 *
 * Built as the optional extension module orchestra.runtime.kernels._native (setup.py); where
 * it could not be built (no C compiler when orchestra was installed) every kernel has a numpy
 * path and orchestra.runtime.kernels.NATIVE_KERNELS is False.
 *
 * The functions take Python buffers (no numpy C API, so the build needs no numpy headers) and
 * trust nothing: the caller (_conv.py) checks shapes, dtypes and contiguity, and every
 * function here checks again that each buffer holds the elements its sizes reach before it
 * touches memory. The computation runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define ORCH_THREADS 1
#else
#define ORCH_THREADS 0
#endif

/* The threads one call may use (set_threads; 1 by default). Threads are started per call and
 * joined before it returns, so nothing lingers across calls or forks. */
static int max_threads = 1;
/* Below this many multiply-adds a call stays on the calling thread: starting and joining a
 * thread per call costs more than splitting smaller work gains (measured on a 2-vCPU VM:
 * at 2^20 MobileNetV3's depthwise layers got slower on two threads; at 2^23 they stay on one
 * and EfficientNet's largest layers gain). An activation element counts as 8. */
#define PARALLEL_MIN_WORK (1 << 23)

/* Runs fn(arg_k) for k < n (n <= 16), on the calling thread and n - 1 started threads; where
 * a thread can't be started its part runs on the calling thread. */
static void run_parts(void *(*fn)(void *), void *args, size_t arg_size, int n) {
#if ORCH_THREADS
    pthread_t tid[16];
    int started[16] = {0};
    for (int k = 1; k < n; k++) started[k] = pthread_create(&tid[k], NULL, fn, (char *)args + k * arg_size) == 0;
    fn(args);
    for (int k = 1; k < n; k++) {
        if (started[k])
            pthread_join(tid[k], NULL);
        else
            fn((char *)args + k * arg_size);
    }
#else
    for (int k = 0; k < n; k++) fn((char *)args + k * arg_size);
#endif
}

/* How many parts to split ``work`` units of ``items`` independent items into. */
static int parts_for(Py_ssize_t work, Py_ssize_t items) {
    int n = max_threads;
    if (n > 16) n = 16;
    if (work < PARALLEL_MIN_WORK) n = 1;
    if (items < n) n = (int)(items > 0 ? items : 1);
    return n;
}

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
/* one copy of the loop per instruction set, picked once by the loader (ifunc) */
#define ORCH_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ORCH_CLONES
#endif

typedef float v8f __attribute__((vector_size(32)));

/* Output tiles of one plane are runs of 8 output columns of one row; TILES of them are
 * accumulated at once, so the multiply-adds of one tap are independent of each other. */
#define TILES 4

/* silu(x) = x / (1 + exp(-x)) over 16 floats at a time (GCC vector types; the baseline build
 * splits them into SSE halves). exp(t) for t clamped to [-87, 88.72]: t = k ln2 + r,
 * |r| <= ln2 / 2, exp(r) by its degree-7 Taylor polynomial (truncation < 6e-9 relative), times
 * 2^k built in the exponent bits (as 2^(k-1) * 2, so k = 128 near the top does not overflow
 * them); k is rounded by adding 1.5 * 2^23 and read from that float's bits (no float -> int
 * conversion). About 1-2 ulp; no libm call. Where exp(-x) overflows float32 (x < -88.72) the
 * result is x * 0 (-0.0, and NaN for -inf), as x / inf is in torch; NaN stays NaN. The clamps
 * and that case are bit selects, so the compiler keeps one straight chain (written as
 * ternaries it split the chain into per-case copies: three divisions per vector). */
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

static inline vf16 vsel16(vi16 m, vf16 a, vf16 b) { return (vf16)((m & (vi16)a) | (~m & (vi16)b)); }

static inline vf16 silu16(vf16 v) {
    const vf16 zero = {0};
    vf16 t = -v;
    t = vsel16(t < zero - 87.0f, zero - 87.0f, t);
    t = vsel16(t > zero + 88.7228394f, zero + 88.7228394f, t);
    const vf16 km = t * 1.44269504088896341f + 12582912.0f;
    const vf16 kf = km - 12582912.0f;
    vf16 r = t - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    vf16 p = zero + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vi16 bits = (vi16)(((vi16)km - 0x4B400000 + 126) << 23);
    const vf16 e = p * (vf16)bits * 2.0f;
    const vf16 res = v / (e + 1.0f);
    return vsel16(-v > zero + 88.7228394f, v * 0.0f, res);
}

/* out[i] = silu(x[i] + b) for i < n (b = -0.0f adds nothing, -0.0 included); out may be x.
 * The tail runs through the same vector code (zero-padded), so an element's result does
 * not depend on where it sits. */
ORCH_CLONES
static void silu_span(const float *x, float *out, Py_ssize_t n, float b) {
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf16 v;
        __builtin_memcpy(&v, x + i, sizeof v);
        v = silu16(v + b);
        __builtin_memcpy(out + i, &v, sizeof v);
    }
    if (i < n) {
        float buf[16] = {0};
        __builtin_memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        vf16 v;
        __builtin_memcpy(&v, buf, sizeof v);
        v = silu16(v + b);
        __builtin_memcpy(buf, &v, sizeof v);
        __builtin_memcpy(out + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

/* hardswish(x) = x * min(max(x + 3, 0), 6) / 6 (NaN propagates), in that order. */
static inline float act_hardswish(float v) {
    float c = v + 3.0f;
    c = c < 0.0f ? 0.0f : c;
    c = c > 6.0f ? 6.0f : c;
    return v * c / 6.0f;
}

/* relu(x) = max(x, 0): NaN and -0.0 pass through, as numpy's clip gives them. */
static inline float act_relu(float v) { return v < 0.0f ? 0.0f : v; }

/* Activations a convolution may end with (conv_f32's and bias_act_f32's ``act``). */
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_HARDSWISH = 2, ACT_SILU = 3 };

/* p[i] = act(p[i] + b) for i < n (the bias added first, as a separate add would). */
ORCH_CLONES
static void bias_act(float *restrict p, float b, Py_ssize_t n, int act) {
    switch (act) {
    case ACT_RELU:
        for (Py_ssize_t i = 0; i < n; i++) p[i] = act_relu(p[i] + b);
        break;
    case ACT_HARDSWISH:
        for (Py_ssize_t i = 0; i < n; i++) p[i] = act_hardswish(p[i] + b);
        break;
    case ACT_SILU:
        silu_span(p, p, n, b);
        break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) p[i] += b;
    }
}

/* p[i] = act(p[i]) for i < n. */
ORCH_CLONES
static void act_inplace(float *restrict p, Py_ssize_t n, int act) {
    switch (act) {
    case ACT_RELU:
        for (Py_ssize_t i = 0; i < n; i++) p[i] = act_relu(p[i]);
        break;
    case ACT_HARDSWISH:
        for (Py_ssize_t i = 0; i < n; i++) p[i] = act_hardswish(p[i]);
        break;
    case ACT_SILU:
        silu_span(p, p, n, -0.0f);
        break;
    default:
        break;
    }
}

/* out[i] = act(x[i]) (no bias); ``out`` may be ``x``. */
ORCH_CLONES
static void silu_loop(const float *restrict x, float *restrict out, Py_ssize_t n) {
    silu_span(x, out, n, -0.0f);
}

ORCH_CLONES
static void hardswish_loop(const float *restrict x, float *restrict out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = act_hardswish(x[i]);
}

/* The padded-plane scratch: ``plane`` (h x wd) zero-padded by ph rows and pw columns and
 * split into its ``sw`` column phases (phase b holds padded columns b, b + sw, ...), each
 * ``hp`` rows of ``row`` floats (the phase's width plus at least 8 zeros), so every tap of
 * an 8-column output tile is one unaligned 8-float load. */
ORCH_CLONES
static void pad_plane(const float *restrict plane, float *restrict scratch, Py_ssize_t h, Py_ssize_t wd,
                      Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t hp, Py_ssize_t row) {
    const Py_ssize_t phase = hp * row;
    /* zeros: the padding rows whole, and in the image rows each phase's cells left and right
     * of the image's columns */
    for (Py_ssize_t bb = 0; bb < sw; bb++) {
        float *restrict ph0 = scratch + bb * phase;
        for (Py_ssize_t k = 0; k < ph * row; k++) ph0[k] = 0.0f;
        for (Py_ssize_t k = (h + ph) * row; k < hp * row; k++) ph0[k] = 0.0f;
        /* image columns of phase bb: q in [q0, q1) */
        const Py_ssize_t q0 = bb >= pw ? 0 : (pw - bb + sw - 1) / sw;
        const Py_ssize_t q1 = (wd + pw - bb + sw - 1) / sw; /* first q with q * sw + bb >= wd + pw */
        for (Py_ssize_t y = ph; y < h + ph; y++) {
            float *restrict r = ph0 + y * row;
            for (Py_ssize_t q = 0; q < q0; q++) r[q] = 0.0f;
            for (Py_ssize_t q = q1 > q0 ? q1 : q0; q < row; q++) r[q] = 0.0f;
        }
    }
    for (Py_ssize_t y = 0; y < h; y++) {
        const float *restrict src = plane + y * wd;
        float *restrict dst = scratch + (y + ph) * row;
        if (sw == 1) {
            for (Py_ssize_t xx = 0; xx < wd; xx++) dst[pw + xx] = src[xx];
        } else if (sw == 2) {
            /* padded column px = xx + pw goes to phase px & 1, cell px >> 1 */
            float *restrict e = dst + (pw & 1) * phase, *restrict o = dst + ((pw + 1) & 1) * phase;
            const Py_ssize_t e0 = pw >> 1, o0 = (pw + 1) >> 1, half = wd >> 1;
            for (Py_ssize_t q = 0; q < half; q++) {
                e[e0 + q] = src[2 * q];
                o[o0 + q] = src[2 * q + 1];
            }
            if (wd & 1) e[e0 + half] = src[wd - 1];
        } else {
            for (Py_ssize_t bb = 0; bb < sw; bb++) { /* padded column px = q * sw + bb */
                Py_ssize_t q = 0, xx = bb - pw;
                if (xx < 0) {
                    q = (-xx + sw - 1) / sw;
                    xx += q * sw;
                }
                float *restrict d = dst + bb * phase;
                for (; xx < wd; xx += sw, q++) d[q] = src[xx];
            }
        }
    }
}

/* Output channels computed at once by the grouped kernel: each input load feeds OB of them. */
#define OB 4
#define TS 2

/* One group of a grouped 2-d convolution of one image: ``og`` output channels, each the sum
 * over the group's ``cg`` input planes (padded scratches, ``plane_len`` floats apart) of their
 * taps. OB output channels x TS 8-column tiles are accumulated at once, so each input load
 * feeds OB multiply-adds. ``wg`` is the group's weight (og, cg, taps); ``bg`` its bias or NULL. */
ORCH_CLONES
static void grouped_group(const float *restrict scratch, Py_ssize_t plane_len, const float *restrict wg,
                          const float *restrict bg, float *restrict og_out, const Py_ssize_t *restrict toff,
                          Py_ssize_t taps, Py_ssize_t cg, Py_ssize_t og, Py_ssize_t sh, Py_ssize_t ho, Py_ssize_t wo,
                          Py_ssize_t row) {
    const Py_ssize_t chunks = (wo + 7) / 8;
    const Py_ssize_t ntiles = ho * chunks;
    const Py_ssize_t ystep = sh * row;
    const Py_ssize_t plane_out = ho * wo;
    for (Py_ssize_t o0 = 0; o0 < og; o0 += OB) {
        const Py_ssize_t nob = og - o0 < OB ? og - o0 : OB;
        Py_ssize_t oy = 0, cx = 0;
        for (Py_ssize_t t0 = 0; t0 < ntiles; t0 += TS) {
            const Py_ssize_t nt = ntiles - t0 < TS ? ntiles - t0 : TS;
            v8f acc[OB][TS];
            Py_ssize_t base[TS], dst[TS], m[TS];
            for (Py_ssize_t k = 0; k < TS; k++) {
                if (k < nt) {
                    base[k] = oy * ystep + cx * 8;
                    dst[k] = oy * wo + cx * 8;
                    m[k] = wo - cx * 8;
                    if (++cx == chunks) {
                        cx = 0;
                        oy++;
                    }
                } else {
                    base[k] = base[0];
                    dst[k] = 0;
                    m[k] = 0;
                }
            }
            for (Py_ssize_t q = 0; q < OB; q++) {
                const float b = (q < nob && bg) ? bg[o0 + q] : 0.0f;
                for (Py_ssize_t k = 0; k < TS; k++) acc[q][k] = (v8f){b, b, b, b, b, b, b, b};
            }
            for (Py_ssize_t ci = 0; ci < cg; ci++) {
                const float *restrict sc = scratch + ci * plane_len;
                for (Py_ssize_t tap = 0; tap < taps; tap++) {
                    float wv[OB];
                    for (Py_ssize_t q = 0; q < OB; q++)
                        wv[q] = q < nob ? wg[((o0 + q) * cg + ci) * taps + tap] : 0.0f;
                    const float *restrict p = sc + toff[tap];
                    for (Py_ssize_t k = 0; k < TS; k++) {
                        v8f v;
                        __builtin_memcpy(&v, p + base[k], sizeof v);
                        for (Py_ssize_t q = 0; q < OB; q++) acc[q][k] += wv[q] * v;
                    }
                }
            }
            for (Py_ssize_t q = 0; q < nob; q++) {
                float *restrict op = og_out + (o0 + q) * plane_out;
                for (Py_ssize_t k = 0; k < nt; k++) {
                    if (m[k] >= 8) {
                        __builtin_memcpy(op + dst[k], &acc[q][k], sizeof acc[q][k]);
                    } else {
                        float tmp[8];
                        __builtin_memcpy(tmp, &acc[q][k], sizeof tmp);
                        for (Py_ssize_t r = 0; r < m[k]; r++) op[dst[k] + r] = tmp[r];
                    }
                }
            }
        }
    }
}

/* a * b * c * d, or -1 when it does not fit a Py_ssize_t */
static Py_ssize_t prod4(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t d) {
    Py_ssize_t r;
    if (a < 0 || b < 0 || c < 0 || d < 0 || __builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r) ||
        __builtin_mul_overflow(r, d, &r))
        return -1;
    return r;
}

/* ``b`` holds at least ``count`` float32 (count >= 0) */
static int need(const Py_buffer *b, Py_ssize_t count, const char *what) {
    if (count < 0 || b->len / (Py_ssize_t)sizeof(float) < count) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, fewer than the %zd float32 its sizes reach", what,
                     b->len, count);
        return 0;
    }
    return 1;
}

/* Depthwise convolution (groups == channels, one output channel per input channel), NCHW in
 * and out, computed channels-last inside: a block of up to 16 channels of one image is
 * transposed, a strip of rows at a time, into a zero-padded scratch [rows][wp][L] (L = 16, or 8
 * for a block of at most 8 channels; wp = the padded width), so each tap of each output pixel
 * is one aligned 8-float multiply-add per 8 channels, with no column tails at any width,
 * stride or dilation. Outputs are computed 8 pixels (flat over the strip's rows) x 8 channels
 * at a time and go from the accumulators, activated (relu, hardswish; silu runs silu_span
 * over them just after), through one 8x8 transpose into the channels' planes. Every output
 * element is bias + its taps in (row, column) order, the same operations wherever its channel
 * sits in a block, so the result does not depend on how the channels are split over threads.
 * Measured on one Zen 4 core (GMAC/s, old plane-at-a-time kernel -> this): 1152ch 7x7 k5
 * 5.4 -> 25, 144ch 56x56 k3 14 -> 20, 96ch 112x112 k3 s2 7.2 -> 11.5. */

typedef int32_t v8i __attribute__((vector_size(32)));
/* 8 floats at a 32-byte aligned address of the depthwise scratch (aligned loads and stores:
 * the x86-64-v3 clone's generic tuning splits unaligned 32-byte ones in two) */
typedef float v8fa __attribute__((vector_size(32), may_alias));

/* Scratch floats one strip of a depthwise call may fill: rows of the padded input, all
 * channels of a block, kept in L2 while the strip's taps read them. */
#define DW_STRIP_FLOATS (24 * 1024)
/* Output pixels computed at once: each tap's weights are loaded once for 8 pixels, whose 8
 * channels' results are then one 8x8 transpose away from 8 runs of 8 floats in the planes. */
#define DW_PX 8

/* In-place transpose of the 8x8 block r[row][col]. */
static inline __attribute__((always_inline)) void transpose8(v8f r[8]) {
    const v8i lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const v8i s01 = {0, 1, 8, 9, 4, 5, 12, 13}, s23 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i p0 = {0, 1, 2, 3, 8, 9, 10, 11}, p1 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8f t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = __builtin_shuffle(r[2 * k], r[2 * k + 1], lo);
        t[2 * k + 1] = __builtin_shuffle(r[2 * k], r[2 * k + 1], hi);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = __builtin_shuffle(t[4 * k], t[4 * k + 2], s01);
        u[4 * k + 1] = __builtin_shuffle(t[4 * k], t[4 * k + 2], s23);
        u[4 * k + 2] = __builtin_shuffle(t[4 * k + 1], t[4 * k + 3], s01);
        u[4 * k + 3] = __builtin_shuffle(t[4 * k + 1], t[4 * k + 3], s23);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = __builtin_shuffle(u[k], u[k + 4], p0);
        r[k + 4] = __builtin_shuffle(u[k], u[k + 4], p1);
    }
}

/* The sizes of a depthwise call, shared by its parts. */
typedef struct {
    Py_ssize_t c_, h, wd, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw;
    Py_ssize_t wp;      /* padded width: wd + 2 pw */
    Py_ssize_t strip;   /* output rows per strip */
    Py_ssize_t rows_in; /* padded input rows a full strip reads: (strip - 1) sh + (kh - 1) dh + 1 */
} dw_geom;

/* The floats of one part's depthwise scratch beyond its 64-byte alignment: the strip's
 * padded input, the block's weights (taps x 16) and bias (16). -1 on overflow. */
static Py_ssize_t dw_scratch_floats(const dw_geom *g) {
    Py_ssize_t a, r;
    if (__builtin_mul_overflow(g->rows_in, g->wp, &a) || __builtin_mul_overflow(a, (Py_ssize_t)16, &a) ||
        __builtin_mul_overflow(g->kh, g->kw, &r) || __builtin_mul_overflow(r, (Py_ssize_t)16, &r) ||
        __builtin_add_overflow(r, a, &r) || __builtin_add_overflow(r, (Py_ssize_t)16, &r))
        return -1;
    return r;
}

/* v = (m & a) | (~m & b) lane by lane */
static inline __attribute__((always_inline)) v8f vsel8(v8i m, v8f a, v8f b) {
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
}

/* relu or hardswish over 8 vectors, the same float32 operations as act_inplace (bit for bit) */
static inline __attribute__((always_inline)) void act8(v8f r[8], int act) {
    const v8f zero = {0};
    switch (act) {
    case ACT_RELU:
        for (int k = 0; k < 8; k++) r[k] = vsel8(r[k] < zero, zero, r[k]);
        break;
    case ACT_HARDSWISH:
        for (int k = 0; k < 8; k++) {
            v8f c = r[k] + 3.0f;
            c = vsel8(c < zero, zero, c);
            c = vsel8(c > zero + 6.0f, zero + 6.0f, c);
            r[k] = r[k] * c / 6.0f;
        }
        break;
    default:
        break;
    }
}

/* DW_PX = 8 output pixels of 8 channels (lanes 8 hh ... of the block's L): in[p] is the
 * padded input at pixel p's top-left tap. Their sums, activated, are written to the channels'
 * planes: channel k's 8 (or ``npx`` < 8) pixels at dst[k] + at, for the block's nch channels. */
static inline __attribute__((always_inline)) void dw_pixels(const float *const in[DW_PX], const float *restrict wb,
                                                            const float *restrict bv, const dw_geom *g,
                                                            const Py_ssize_t kh, const Py_ssize_t kw,
                                                            const Py_ssize_t L, int hh, int act,
                                                            float *const *dst, Py_ssize_t at, Py_ssize_t npx,
                                                            Py_ssize_t nch) {
    const Py_ssize_t rstep = g->dh * g->wp * L, cstep = g->dw * L;
    v8f acc[DW_PX];
    for (int p = 0; p < DW_PX; p++) acc[p] = *(const v8fa *)(bv + 8 * hh);
    const float *wt = wb + 8 * hh;
    for (Py_ssize_t i = 0; i < kh; i++) {
        Py_ssize_t q = i * rstep + 8 * hh;
        for (Py_ssize_t jj = 0; jj < kw; jj++, q += cstep, wt += L) {
            v8f wv;
            wv = *(const v8fa *)wt;
            for (int p = 0; p < DW_PX; p++) {
                acc[p] += wv * *(const v8fa *)(in[p] + q);
            }
        }
    }
    act8(acc, act);
    transpose8(acc);
    if (npx == 8 && nch == 8) {
        for (int k = 0; k < 8; k++) __builtin_memcpy(dst[k] + at, &acc[k], sizeof(v8f));
    } else {
        for (Py_ssize_t k = 0; k < nch; k++) __builtin_memcpy(dst[k] + at, &acc[k], (size_t)npx * sizeof(float));
    }
}

/* One block of nc <= 8 nv channels (c0 ...) of image n, strip by strip. ``s`` is the part's
 * 64-byte aligned scratch (dw_scratch_floats), its padding cells already zero for this nv. */
static inline __attribute__((always_inline)) void dw_block(const float *restrict x, const float *restrict w,
                                                           const float *restrict bias, float *restrict out,
                                                           float *restrict s, const dw_geom *g, Py_ssize_t n,
                                                           Py_ssize_t c0, Py_ssize_t nc, int act, const Py_ssize_t kh,
                                                           const Py_ssize_t kw, const int nv) {
    const Py_ssize_t L = 8 * nv, hw = g->h * g->wd, plane_out = g->ho * g->wo, taps = g->kh * g->kw;
    const Py_ssize_t wp = g->wp, wd = g->wd, wo = g->wo, row = wp * L;
    float *restrict si = s;                        /* [rows_in][wp][L] */
    float *restrict wb = si + g->rows_in * row;    /* [taps][L] */
    float *restrict bv = wb + taps * 16;           /* [L] */
    /* lanes past the block compute its last channel again, into nothing */
    const float *src[16], *wr[16];
    float *dst[16];
    for (Py_ssize_t l = 0; l < L; l++) {
        const Py_ssize_t c = c0 + (l < nc ? l : nc - 1);
        src[l] = x + (n * g->c_ + c) * hw;
        dst[l] = out + (n * g->c_ + c) * plane_out;
        wr[l] = w + c * taps;
        bv[l] = bias ? bias[c] : 0.0f;
    }
    /* the block's weights, [taps][L]: 8 taps x 8 channels at a time */
    Py_ssize_t t0 = 0;
    for (; t0 + 8 <= taps; t0 += 8)
        for (int hh = 0; hh < nv; hh++) {
            v8f rv[8];
            for (int k = 0; k < 8; k++) __builtin_memcpy(&rv[k], wr[8 * hh + k] + t0, sizeof(v8f));
            transpose8(rv);
            for (int k = 0; k < 8; k++) *(v8fa *)(wb + (t0 + k) * L + 8 * hh) = rv[k];
        }
    for (; t0 < taps; t0++)
        for (Py_ssize_t l = 0; l < L; l++) wb[t0 * L + l] = wr[l][t0];
    const int one_strip = g->strip >= g->ho;
    for (Py_ssize_t oy0 = 0; oy0 < g->ho; oy0 += g->strip) {
        const Py_ssize_t r = g->ho - oy0 < g->strip ? g->ho - oy0 : g->strip;
        const Py_ssize_t nrows = (r - 1) * g->sh + (g->kh - 1) * g->dh + 1;
        const Py_ssize_t y0 = oy0 * g->sh - g->ph; /* the image row of scratch row 0 */
        const Py_ssize_t ya = y0 < 0 ? 0 : y0, yb = y0 + nrows < g->h ? y0 + nrows : g->h;
        if (!one_strip) /* padding rows of this strip: scratch rows that held image rows before */
            for (Py_ssize_t rr = 0; rr < nrows; rr++)
                if (y0 + rr < 0 || y0 + rr >= g->h) __builtin_memset(si + rr * row, 0, (size_t)row * sizeof(float));
        /* image rows [ya, yb) into the scratch, 8 pixels (flat over the rows) x 8 channels at a time */
        if (ya < yb) {
            Py_ssize_t f = ya * wd;
            const Py_ssize_t f1 = yb * wd;
            float *d = si + ((ya - y0) * wp + g->pw) * L; /* the next pixel's cell */
            Py_ssize_t xx = 0;
            for (; f + 8 <= f1; f += 8) {
                float *dk[8];
                for (int k = 0; k < 8; k++) {
                    dk[k] = d;
                    d += L;
                    if (++xx == wd) {
                        xx = 0;
                        d += (wp - wd) * L;
                    }
                }
                for (int hh = 0; hh < nv; hh++) {
                    v8f rv[8];
                    for (int k = 0; k < 8; k++) __builtin_memcpy(&rv[k], src[8 * hh + k] + f, sizeof(v8f));
                    transpose8(rv);
                    for (int k = 0; k < 8; k++) *(v8fa *)(dk[k] + 8 * hh) = rv[k];
                }
            }
            for (; f < f1; f++) {
                for (Py_ssize_t l = 0; l < L; l++) d[l] = src[l][f];
                d += L;
                if (++xx == wd) {
                    xx = 0;
                    d += (wp - wd) * L;
                }
            }
        }
        /* the strip's outputs, DW_PX pixels (flat over its rows) at a time, written to the
         * planes at pixels oy0 wo + f ...; the last group's pixels past the strip repeat its
         * last pixel and are not written */
        const Py_ssize_t npix = r * wo;
        const float *rb = si; /* the row of output row oy0 + oyl */
        Py_ssize_t ox = 0;
        for (Py_ssize_t f = 0; f < npix; f += DW_PX) {
            const float *in[DW_PX];
            for (int p = 0; p < DW_PX; p++) {
                in[p] = rb + ox * g->sw * L;
                if (f + p + 1 < npix && ++ox == wo) {
                    ox = 0;
                    rb += g->sh * row;
                }
            }
            const Py_ssize_t npx = npix - f < DW_PX ? npix - f : DW_PX;
            for (int hh = 0; hh < nv; hh++)
                dw_pixels(in, wb, bv, g, kh, kw, L, hh, act == ACT_SILU ? ACT_NONE : act, dst + 8 * hh,
                          oy0 * wo + f, npx, nc - 8 * hh < 8 ? nc - 8 * hh : 8);
        }
        /* silu over what was just written, while in cache: the block's planes are one run
         * when the strip is the whole plane */
        if (act == ACT_SILU && one_strip)
            silu_span(dst[0], dst[0], nc * plane_out, -0.0f);
        else if (act == ACT_SILU)
            for (Py_ssize_t l = 0; l < nc; l++) silu_span(dst[l] + oy0 * wo, dst[l] + oy0 * wo, npix, -0.0f);
    }
}

/* Items (image x channel) [i0, i1) of a depthwise call, in blocks of up to 16 channels of one
 * image (8 where at most 8 are left); ``s`` is the part's 64-byte aligned scratch. */
ORCH_CLONES
static void depthwise_part(const float *restrict x, const float *restrict w, const float *restrict bias,
                           float *restrict out, float *restrict s, const dw_geom *g, Py_ssize_t i0, Py_ssize_t i1,
                           int act) {
    int zeroed_for = 0; /* the L whose padding cells the scratch holds zero */
    for (Py_ssize_t it = i0; it < i1;) {
        const Py_ssize_t n = it / g->c_, c0 = it % g->c_;
        Py_ssize_t nc = g->c_ - c0;
        if (i1 - it < nc) nc = i1 - it;
        if (nc > 16) nc = 16;
        const int nv = nc > 8 ? 2 : 1;
        if (zeroed_for != 8 * nv) {
            __builtin_memset(s, 0, (size_t)(g->rows_in * g->wp * 8 * nv) * sizeof(float));
            zeroed_for = 8 * nv;
        }
        /* the common kernel sizes get their tap loops unrolled */
        if (g->kh == 3 && g->kw == 3) {
            if (nv == 2)
                dw_block(x, w, bias, out, s, g, n, c0, nc, act, 3, 3, 2);
            else
                dw_block(x, w, bias, out, s, g, n, c0, nc, act, 3, 3, 1);
        } else if (g->kh == 5 && g->kw == 5) {
            if (nv == 2)
                dw_block(x, w, bias, out, s, g, n, c0, nc, act, 5, 5, 2);
            else
                dw_block(x, w, bias, out, s, g, n, c0, nc, act, 5, 5, 1);
        } else if (nv == 2) {
            dw_block(x, w, bias, out, s, g, n, c0, nc, act, g->kh, g->kw, 2);
        } else {
            dw_block(x, w, bias, out, s, g, n, c0, nc, act, g->kh, g->kw, 1);
        }
        it += nc;
    }
}

/* A share of one convolution call: images x groups [i0, i1), with its own scratch. */
typedef struct {
    const float *x, *w, *bias;
    float *out, *scratch;
    const Py_ssize_t *toff;
    Py_ssize_t i0, i1, c_, h, wd, o_, g_, cg, og, taps, sh, sw, ph, pw, ho, wo, hp, row, plane_len;
    int act;
    const dw_geom *dwg; /* depthwise (cg == og == 1): its sizes; scratch is then depthwise_part's */
} conv_job;

static void *conv_part(void *arg) {
    const conv_job *j = (const conv_job *)arg;
    if (j->dwg) {
        depthwise_part(j->x, j->w, j->bias, j->out, j->scratch, j->dwg, j->i0, j->i1, j->act);
        return NULL;
    }
    for (Py_ssize_t it = j->i0; it < j->i1; it++) {
        const Py_ssize_t n = it / j->g_, g = it % j->g_;
        for (Py_ssize_t ci = 0; ci < j->cg; ci++)
            pad_plane(j->x + ((n * j->c_) + g * j->cg + ci) * j->h * j->wd, j->scratch + ci * j->plane_len, j->h,
                      j->wd, j->sw, j->ph, j->pw, j->hp, j->row);
        float *dst = j->out + (n * j->o_ + g * j->og) * j->ho * j->wo;
        grouped_group(j->scratch, j->plane_len, j->w + g * j->og * j->cg * j->taps, j->bias ? j->bias + g * j->og : NULL,
                      dst, j->toff, j->taps, j->cg, j->og, j->sh, j->ho, j->wo, j->row);
        if (j->act != ACT_NONE) act_inplace(dst, j->og * j->ho * j->wo, j->act); /* while it is in cache */
    }
    return NULL;
}

static PyObject *py_conv_f32(PyObject *self, PyObject *args) {
    Py_buffer x, w, b, out;
    PyObject *bias_obj;
    Py_ssize_t n_, c_, h, wd, o_, g_, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
    int act = ACT_NONE;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnnnnnnnnnnnnnn|i", &x, &w, &bias_obj, &out, &n_, &c_, &h, &wd, &o_, &g_,
                          &kh, &kw, &sh, &sw, &ph, &pw, &dh, &dw, &ho, &wo, &act))
        return NULL;
    if (act < ACT_NONE || act > ACT_SILU) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&w);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "conv_f32: unknown activation %d", act);
        return NULL;
    }
    int have_bias = bias_obj != Py_None;
    int ok = 1;
    if (have_bias && PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_bias = 0;
    }
    /* every size small enough that no index below overflows (2^24 per dimension, 2^40 in all) */
    const Py_ssize_t lim = (Py_ssize_t)1 << 24;
    if (ok && (n_ < 0 || c_ < 0 || n_ > lim || c_ > lim || o_ < 0 || o_ > lim || g_ < 1 || g_ > lim || c_ % g_ ||
               o_ % g_ || h < 1 || wd < 1 || h > lim || wd > lim || kh < 1 || kw < 1 || kh > lim || kw > lim ||
               sh < 1 || sw < 1 || sh > lim || sw > lim || ph < 0 || pw < 0 || ph > lim || pw > lim || dh < 1 ||
               dw < 1 || dh > lim || dw > lim || ho < 0 || wo < 0 || h + 2 * ph - dh * (kh - 1) - 1 < 0 ||
               wd + 2 * pw - dw * (kw - 1) - 1 < 0 || ho > (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1 ||
               wo > (wd + 2 * pw - dw * (kw - 1) - 1) / sw + 1 ||
               prod4(n_ + 1, c_ + o_, h + 2 * ph, wd + 2 * pw + 8 * sw) > ((Py_ssize_t)1 << 40) ||
               prod4(o_, c_ / (g_ ? g_ : 1), kh, kw) > ((Py_ssize_t)1 << 40))) {
        PyErr_SetString(PyExc_ValueError, "conv_f32: inconsistent sizes");
        ok = 0;
    }
    const Py_ssize_t cg = ok ? c_ / g_ : 0, og = ok ? o_ / g_ : 0;
    ok = ok && need(&x, prod4(n_, c_, h, wd), "x") && need(&w, prod4(o_, cg, kh, kw), "weight") &&
         need(&out, prod4(n_, o_, ho, wo), "out") && (!have_bias || need(&b, o_, "bias"));
    float *scratch = NULL, *scratch_mem = NULL;
    Py_ssize_t *toff = NULL;
    const Py_ssize_t hp = h + 2 * ph, row = (wd + 2 * pw + sw - 1) / sw + 8, plane_len = sw * hp * row;
    const Py_ssize_t taps = kh * kw;
    const int nparts = ok ? parts_for(prod4(n_, o_ * cg, ho * wo, taps), n_ * g_) : 1;
    /* depthwise: strips of output rows whose padded input fits DW_STRIP_FLOATS (one row at least) */
    const int depthwise = cg == 1 && og == 1;
    dw_geom dwg = {c_, h, wd, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, wd + 2 * pw, 1, 0};
    Py_ssize_t part_floats = cg * plane_len;
    if (ok && depthwise) {
        const Py_ssize_t reach = (kh - 1) * dh + 1, fit = DW_STRIP_FLOATS / (16 * dwg.wp);
        dwg.strip = fit > reach ? (fit - reach) / sh + 1 : 1;
        if (dwg.strip > ho) dwg.strip = ho > 0 ? ho : 1;
        dwg.rows_in = (dwg.strip - 1) * sh + reach;
        part_floats = dw_scratch_floats(&dwg);
    }
    if (ok) {
        Py_ssize_t floats;
        if (part_floats < 0 || __builtin_mul_overflow(part_floats + 16, (Py_ssize_t)nparts, &floats) ||
            floats > ((Py_ssize_t)1 << 40)) {
            PyErr_SetString(PyExc_ValueError, "conv_f32: scratch too large");
            ok = 0;
        } else {
            /* each part's share starts 64-byte aligned */
            part_floats = (part_floats + 15) & ~(Py_ssize_t)15;
            scratch_mem = PyMem_RawMalloc((size_t)(nparts * part_floats + 16) * sizeof(float));
            scratch = scratch_mem ? (float *)(((uintptr_t)scratch_mem + 63) & ~(uintptr_t)63) : NULL;
            toff = PyMem_RawMalloc((size_t)(kh * kw) * sizeof(Py_ssize_t));
            if (!scratch || !toff) {
                PyErr_NoMemory();
                ok = 0;
            }
        }
    }
    if (ok) {
        for (Py_ssize_t i = 0; i < kh; i++)
            for (Py_ssize_t j = 0; j < kw; j++)
                toff[i * kw + j] = ((j * dw) % sw) * hp * row + i * dh * row + (j * dw) / sw;
        conv_job jobs[16];
        const Py_ssize_t items = n_ * g_;
        for (int k = 0; k < nparts; k++) {
            conv_job j = {(const float *)x.buf, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL,
                          (float *)out.buf, scratch + k * part_floats, toff, items * k / nparts,
                          items * (k + 1) / nparts, c_, h, wd, o_, g_, cg, og, taps, sh, sw, ph, pw, ho, wo, hp, row,
                          plane_len, act, depthwise ? &dwg : NULL};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(conv_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(toff);
    PyMem_RawFree(scratch_mem);
    if (have_bias) PyBuffer_Release(&b);
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

typedef void (*unary_loop)(const float *restrict, float *restrict, Py_ssize_t);

typedef struct {
    unary_loop loop;
    const float *x;
    float *out;
    Py_ssize_t n;
} unary_job;

static void *unary_part(void *arg) {
    const unary_job *j = (const unary_job *)arg;
    if (j->n > 0) j->loop(j->x, j->out, j->n);
    return NULL;
}

static PyObject *unary(PyObject *args, unary_loop loop, const char *name) {
    Py_buffer x, out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*w*n", &x, &out, &n)) return NULL;
    int ok = need(&x, n, "x") && need(&out, n, "out");
    if (ok && x.buf != out.buf && (const char *)x.buf < (const char *)out.buf + out.len &&
        (const char *)out.buf < (const char *)x.buf + x.len) {
        PyErr_Format(PyExc_ValueError, "%s: out overlaps x without being x", name);
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(n * 8, n / 4096);
        unary_job jobs[16];
        for (int k = 0; k < nparts; k++) {
            /* parts start on 16-float boundaries (whole vectors for every part but the last) */
            const Py_ssize_t a = (n * k / nparts) & ~(Py_ssize_t)15, e = k + 1 == nparts ? n : (n * (k + 1) / nparts) & ~(Py_ssize_t)15;
            unary_job j = {loop, (const float *)x.buf + a, (float *)out.buf + a, e - a};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(unary_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_silu_f32(PyObject *self, PyObject *args) {
    (void)self;
    return unary(args, silu_loop, "silu_f32");
}

static PyObject *py_hardswish_f32(PyObject *self, PyObject *args) {
    (void)self;
    return unary(args, hardswish_loop, "hardswish_f32");
}

/* A share of one bias_act_f32 call: planes [i0, i1). */
typedef struct {
    float *p;
    const float *bias;
    Py_ssize_t i0, i1, c_, inner;
    int act;
} bias_act_job;

static void *bias_act_part(void *arg) {
    const bias_act_job *j = (const bias_act_job *)arg;
    for (Py_ssize_t it = j->i0; it < j->i1; it++) {
        float *p = j->p + it * j->inner;
        if (j->bias)
            bias_act(p, j->bias[it % j->c_], j->inner, j->act);
        else
            act_inplace(p, j->inner, j->act);
    }
    return NULL;
}

static PyObject *py_bias_act_f32(PyObject *self, PyObject *args) {
    Py_buffer out, b;
    PyObject *bias_obj;
    Py_ssize_t n_, c_, inner;
    int act;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*Onnni", &out, &bias_obj, &n_, &c_, &inner, &act)) return NULL;
    int have_bias = bias_obj != Py_None, ok = 1;
    if (have_bias && PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_bias = 0;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    if (ok && (act < ACT_NONE || act > ACT_SILU || n_ < 0 || c_ < 0 || inner < 0 || n_ > lim || c_ > lim ||
               inner > lim || prod4(n_, c_, inner, 1) > lim)) {
        PyErr_SetString(PyExc_ValueError, "bias_act_f32: inconsistent sizes or unknown activation");
        ok = 0;
    }
    ok = ok && need(&out, prod4(n_, c_, inner, 1), "out") && (!have_bias || need(&b, c_, "bias"));
    if (ok) {
        const Py_ssize_t items = n_ * c_;
        const int nparts = parts_for(items * inner * 8, items);
        bias_act_job jobs[16];
        for (int k = 0; k < nparts; k++) {
            bias_act_job j = {(float *)out.buf, have_bias ? (const float *)b.buf : NULL, items * k / nparts,
                              items * (k + 1) / nparts, c_, inner, act};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(bias_act_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    if (have_bias) PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 1 || n > 16) {
        PyErr_Format(PyExc_ValueError, "set_threads: %d threads (1 to 16)", n);
        return NULL;
    }
    max_threads = ORCH_THREADS ? n : 1;
    Py_RETURN_NONE;
}

static PyObject *py_get_threads(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(max_threads);
}

static PyMethodDef methods[] = {
    {"bias_act_f32", py_bias_act_f32, METH_VARARGS,
     "bias_act_f32(out, bias|None, N, C, inner, act): out[n, c, :] = act(out[n, c, :] + bias[c]) in place, "
     "float32 (act: 0 none, 1 relu, 2 hardswish, 3 silu)."},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): threads one call may use (1 to 16)."},
    {"get_threads", py_get_threads, METH_NOARGS, "get_threads(): threads one call may use."},
    {"conv_f32", py_conv_f32, METH_VARARGS,
     "conv_f32(x, w, bias|None, out, N, C, H, W, O, groups, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo[, act]): "
     "NCHW float32 grouped (depthwise included) 2-d convolution into out (C-contiguous buffers), "
     "then act (0 none, 1 relu, 2 hardswish, 3 silu)."},
    {"silu_f32", py_silu_f32, METH_VARARGS, "silu_f32(x, out, n): out[:n] = silu(x[:n]), float32; out may be x."},
    {"hardswish_f32", py_hardswish_f32, METH_VARARGS,
     "hardswish_f32(x, out, n): out[:n] = hardswish(x[:n]), float32; out may be x."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "orchestra's compiled kernels.", -1, methods,
                                     NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
