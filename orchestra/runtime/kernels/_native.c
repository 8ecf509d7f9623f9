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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define ORCH_THREADS 1
#else
#define ORCH_THREADS 0
#endif

/* The threads one call may use (set_threads; 1 by default). */
static int max_threads = 1;
/* Below this many multiply-adds a call stays on the calling thread. The calling thread
 * starts on the first part at once and the pool's threads take the others as they wake, so
 * a split costs about one futex wake; below this a layer is done before a worker is up
 * (measured on a 2-vCPU VM). An activation element counts as 8. */
#define PARALLEL_MIN_WORK (1 << 18)
/* A call is cut into up to this many parts per thread, taken in turn by whichever thread is
 * free: a late-waking worker then costs at most one part. */
#define PARTS_PER_THREAD 4
#define MAX_PARTS 64

#if ORCH_THREADS
#include <time.h>
/* The pool: up to 15 threads started on the first call that splits. One call uses it at a
 * time; a call that finds it busy (another Python thread's, the GIL being released) runs its
 * parts itself. Parts are taken with an atomic counter by the caller (which starts at once)
 * and by whichever threads are awake. Between calls a thread spins for POOL_SPIN_NS (a
 * model's calls come back to back: waking a sleeping thread costs tens of microseconds on a
 * VM, more than a small layer takes) and then sleeps on a condition variable, so an idle
 * pool takes no CPU. The caller spins as long for the last part before it sleeps too. After
 * a fork the child has none of the threads: the pool is rebuilt empty there (pthread_atfork). */
#define POOL_SPIN_NS 150000L
#define POOL_NO_PARTS (1 << 30) /* ``next`` between calls: a late taker finds nothing */
static struct {
    pthread_mutex_t busy;   /* held by the call using the pool */
    pthread_mutex_t mu;     /* guards sleepers, caller_waits and the waits on the two conditions */
    pthread_cond_t work_cv; /* a new call: gen changed */
    pthread_cond_t done_cv; /* the last part of the call is done */
    void *(*fn)(void *);    /* the call's, set before gen is (atomics below) */
    char *args;
    size_t arg_size;
    int nparts, next, done; /* atomic */
    unsigned long gen;      /* atomic */
    int sleepers, caller_waits, nthreads;
    int resting; /* atomic: set by pool_rest, cleared by the next call: spinners sleep now */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          NULL, NULL, 0, 0, POOL_NO_PARTS, 0, 0, 0, 0, 0, 0};

static long pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until *p != v (returns 1) or POOL_SPIN_NS pass or pool_rest is called (returns 0). */
static int pool_spin_ne_ul(const unsigned long *p, unsigned long v) {
    const long end = pool_now_ns() + POOL_SPIN_NS;
    for (int i = 1;; i++) {
        if (__atomic_load_n(p, __ATOMIC_ACQUIRE) != v) return 1;
        pool_relax();
        if ((i & 63) == 0 && (pool_now_ns() > end || __atomic_load_n(&pool.resting, __ATOMIC_RELAXED))) return 0;
    }
}

/* Takes and runs parts of the current call until none is left. */
static void pool_take_parts(void) {
    for (;;) {
        const int k = __atomic_fetch_add(&pool.next, 1, __ATOMIC_ACQ_REL);
        const int n = __atomic_load_n(&pool.nparts, __ATOMIC_ACQUIRE);
        if (k >= n) return;
        pool.fn(pool.args + (size_t)k * pool.arg_size);
        if (__atomic_add_fetch(&pool.done, 1, __ATOMIC_ACQ_REL) == n) {
            pthread_mutex_lock(&pool.mu);
            if (pool.caller_waits) pthread_cond_signal(&pool.done_cv);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

static void *pool_worker(void *unused) {
    (void)unused;
    unsigned long seen = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE);
    for (;;) {
        if (!pool_spin_ne_ul(&pool.gen, seen)) {
            pthread_mutex_lock(&pool.mu);
            while (__atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE) == seen) {
                pool.sleepers++;
                pthread_cond_wait(&pool.work_cv, &pool.mu);
                pool.sleepers--;
            }
            pthread_mutex_unlock(&pool.mu);
        }
        seen = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE);
        pool_take_parts();
    }
    return NULL;
}

static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work_cv, NULL);
    pthread_cond_init(&pool.done_cv, NULL);
    pool.nthreads = pool.sleepers = pool.caller_waits = 0;
    pool.nparts = pool.done = 0;
    pool.next = POOL_NO_PARTS;
}

/* Starts threads until the pool has ``want`` (called holding pool.busy); how many it has. */
static int pool_grow(int want) {
    static int atfork_set = 0;
    if (!atfork_set) {
        if (pthread_atfork(NULL, NULL, pool_after_fork_in_child) != 0) return 0;
        atfork_set = 1;
    }
    while (pool.nthreads < want) {
        pthread_t t;
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) != 0) break;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        const int rc = pthread_create(&t, &attr, pool_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.nthreads++;
    }
    return pool.nthreads;
}
#endif

/* Runs fn(args + k * arg_size) for every k < n (n <= MAX_PARTS): on the calling thread and,
 * when the pool is free, on its threads too; returns once every part is done. */
static void run_parts(void *(*fn)(void *), void *args, size_t arg_size, int n) {
#if ORCH_THREADS
    if (n > 1 && max_threads > 1 && pthread_mutex_trylock(&pool.busy) == 0) {
        if (pool_grow(max_threads - 1) > 0) {
            __atomic_store_n(&pool.resting, 0, __ATOMIC_RELAXED);
            pool.fn = fn;
            pool.args = (char *)args;
            pool.arg_size = arg_size;
            __atomic_store_n(&pool.nparts, n, __ATOMIC_RELEASE);
            __atomic_store_n(&pool.done, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&pool.next, 0, __ATOMIC_RELEASE);
            __atomic_add_fetch(&pool.gen, 1, __ATOMIC_ACQ_REL);
            pthread_mutex_lock(&pool.mu);
            if (pool.sleepers) pthread_cond_broadcast(&pool.work_cv);
            pthread_mutex_unlock(&pool.mu);
            pool_take_parts();
            if (__atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) < n) {
                const long end = pool_now_ns() + POOL_SPIN_NS;
                for (int i = 1; __atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) < n; i++) {
                    pool_relax();
                    if ((i & 63) == 0 && pool_now_ns() > end) {
                        pthread_mutex_lock(&pool.mu);
                        pool.caller_waits = 1;
                        while (__atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) < n)
                            pthread_cond_wait(&pool.done_cv, &pool.mu);
                        pool.caller_waits = 0;
                        pthread_mutex_unlock(&pool.mu);
                        break;
                    }
                }
            }
            /* late takers of this call find nothing from here on */
            __atomic_store_n(&pool.next, POOL_NO_PARTS, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&pool.busy);
            return;
        }
        pthread_mutex_unlock(&pool.busy);
    }
#endif
    for (int k = 0; k < n; k++) fn((char *)args + k * arg_size);
}

/* How many parts to split ``work`` units of ``items`` independent items into. */
static int parts_for(Py_ssize_t work, Py_ssize_t items) {
    int n = max_threads > 16 ? 16 : max_threads;
    if (work < PARALLEL_MIN_WORK) n = 1;
    if (n > 1) n *= PARTS_PER_THREAD;
    if (items < n) n = (int)(items > 0 ? items : 1);
    return n;
}

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
/* copies of the kernels per instruction set (AVX-512, AVX2 + FMA, baseline), picked at load */
#define ORCH_X86_DISPATCH 1
#include <immintrin.h>
/* one copy of the loop per instruction set, picked once by the loader (ifunc) */
#define ORCH_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ORCH_CLONES
#endif


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
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

/* The activations on one GCC vector (VT floats, VI the matching ints), for the loops below
 * and for the GEMM tiles that apply them in registers: silu as described above; hardswish
 * and relu exactly as act_hardswish / act_relu compute them (bit for bit). Always inlined:
 * a 64-byte vector passed by value out of an AVX-512 function would go through memory.
 * VEC_EXP: the select, exp's parts and silu in GCC vector code (silu_vec_); VEC_ACTS: the
 * rest, over silu_ (see silu_16 below), its functions marked ATTR. */
#define VEC_EXP(SUF, VT, VI)                                                                                         \
    static inline __attribute__((always_inline)) VT vsel_##SUF(VI m, VT a, VT b) {                                   \
        return (VT)((m & (VI)a) | (~m & (VI)b));                                                                     \
    }                                                                                                                \
    /* exp(t) = 2^k p for t already clamped: k = round(t / ln2) (into *k), p = exp(r) */                           \
    static inline __attribute__((always_inline)) VT exp_parts_##SUF(VT t, VI *k) {                                   \
        const VT zero = {0};                                                                                         \
        const VT km = t * 1.44269504088896341f + 12582912.0f;                                                        \
        const VT kf = km - 12582912.0f;                                                                              \
        VT r = t - kf * 0.693359375f;                                                                                \
        r = r - kf * -2.12194440e-4f;                                                                                \
        VT p = zero + 1.0f / 5040.0f;                                                                                \
        p = p * r + 1.0f / 720.0f;                                                                                   \
        p = p * r + 1.0f / 120.0f;                                                                                   \
        p = p * r + 1.0f / 24.0f;                                                                                    \
        p = p * r + 1.0f / 6.0f;                                                                                     \
        p = p * r + 0.5f;                                                                                            \
        p = p * r + 1.0f;                                                                                            \
        p = p * r + 1.0f;                                                                                            \
        *k = (VI)km - 0x4B400000;                                                                                    \
        return p;                                                                                                    \
    }                                                                                                                \
    static inline __attribute__((always_inline)) VT silu_vec_##SUF(VT v) {                                           \
        const VT zero = {0};                                                                                         \
        VT t = -v;                                                                                                   \
        t = vsel_##SUF(t < zero - 87.0f, zero - 87.0f, t);                                                           \
        t = vsel_##SUF(t > zero + 88.7228394f, zero + 88.7228394f, t);                                               \
        VI k;                                                                                                        \
        const VT p = exp_parts_##SUF(t, &k);                                                                         \
        const VI bits = (VI)((k + 126) << 23);                                                                       \
        const VT e = p * (VT)bits * 2.0f;                                                                            \
        const VT res = v / (e + 1.0f);                                                                               \
        return vsel_##SUF(-v > zero + 88.7228394f, v * 0.0f, res);                                                   \
    }
#define VEC_ACTS(SUF, VT, VI, ATTR)                                                                                  \
    ATTR static inline __attribute__((always_inline)) VT hardswish_##SUF(VT v) {                                     \
        const VT zero = {0};                                                                                         \
        VT c = v + 3.0f;                                                                                             \
        c = vsel_##SUF(c < zero, zero, c);                                                                           \
        c = vsel_##SUF(c > zero + 6.0f, zero + 6.0f, c);                                                             \
        return v * c / 6.0f;                                                                                         \
    }                                                                                                                \
    ATTR static inline __attribute__((always_inline)) VT relu_##SUF(VT v) {                                          \
        const VT zero = {0};                                                                                         \
        return vsel_##SUF(v < zero, zero, v);                                                                        \
    }                                                                                                                \
    ATTR static inline __attribute__((always_inline)) VT act_##SUF(VT v, int act) {                                  \
        switch (act) {                                                                                               \
        case 1:                                                                                                      \
            return relu_##SUF(v);                                                                                    \
        case 2:                                                                                                      \
            return hardswish_##SUF(v);                                                                               \
        case 3:                                                                                                      \
            return silu_##SUF(v);                                                                                    \
        default:                                                                                                     \
            return v;                                                                                                \
        }                                                                                                            \
    }

VEC_EXP(16, vf16, vi16)
VEC_EXP(8, v8f, vi8)

static inline __attribute__((always_inline)) v8f silu_8(v8f v) { return silu_vec_8(v); }
#ifdef ORCH_X86_DISPATCH
#define ORCH_V4 __attribute__((target("arch=x86-64-v4")))
/* exp_parts_16 on AVX-512 registers: exp(r) for t = k ln2 + r already clamped, k (a whole
 * float) into *kf; the same operations, so the same bits */
ORCH_V4 static inline __attribute__((always_inline)) __m512 exp_parts_x16(__m512 t, __m512 *kf_out) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 kf = _mm512_sub_ps(_mm512_fmadd_ps(t, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693359375f), t);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    *kf_out = kf;
    return p;
}
/* silu_vec_16's operations in AVX-512 instructions, bit for bit (checked over all 2^32
 * inputs), about 1.35x faster: the clamp at -87 is one max (the second operand where
 * either is NaN, so NaN passes), 2^k scales by scalef (not built in the exponent bits), the
 * upper clamp goes (its lanes are replaced by x * 0 as before, by a masked multiply). Only
 * the AVX-512 copies (target x86-64-v4) use the 16-wide functions. */
ORCH_V4 static inline __attribute__((always_inline)) vf16 silu_16(vf16 v) {
    const __m512 x = (__m512)v, nx = (__m512)(-v);
    __m512 kf;
    const __m512 p = exp_parts_x16(_mm512_max_ps(_mm512_set1_ps(-87.0f), nx), &kf);
    const __m512 res = _mm512_div_ps(x, _mm512_add_ps(_mm512_scalef_ps(p, kf), _mm512_set1_ps(1.0f)));
    const __mmask16 over = _mm512_cmp_ps_mask(nx, _mm512_set1_ps(88.7228394f), _CMP_GT_OQ);
    return (vf16)_mm512_mask_mul_ps(res, over, x, _mm512_setzero_ps());
}
#else
#define ORCH_V4
static inline __attribute__((always_inline)) vf16 silu_16(vf16 v) { return silu_vec_16(v); }
#endif
VEC_ACTS(16, vf16, vi16, ORCH_V4)
VEC_ACTS(8, v8f, vi8, )

/* exp(t), down into float32's subnormals: t clamped to [-104, 88.72], k = round(t / ln2)
 * split as k1 + k2 (both >= -75), the result p * 2^k1 * 2^k2, so the last product alone
 * rounds into a subnormal (or to 0 below ~-103.3); NaN stays NaN. The same reduction and
 * polynomial as silu's (about 1-2 ulp for normal results).
 * gelu(x) = x Phi(x) (approximate "none"), float32, the fit _elementwise.py documents and its
 * numpy path computes, operation for operation (exp by this exp: within an ulp or two of
 * numpy's): h = |x / 2|, v = 1 / (1 / h + 2K), g = G(v) - 2 h^2, out = x / 2 + h - v e^g. */
#define VEC_EXP_WIDE(SUF, VT, VI)                                                                                    \
    static inline __attribute__((always_inline)) VT exp_wide_vec_##SUF(VT t) {                                       \
        const VT zero = {0};                                                                                         \
        t = vsel_##SUF(t < zero - 104.0f, zero - 104.0f, t);                                                         \
        t = vsel_##SUF(t > zero + 88.7228394f, zero + 88.7228394f, t);                                               \
        VI k;                                                                                                        \
        const VT p = exp_parts_##SUF(t, &k);                                                                         \
        const VI k1 = k >> 1, k2 = k - k1;                                                                           \
        const VT s1 = (VT)((k1 + 127) << 23), s2 = (VT)((k2 + 127) << 23);                                           \
        return p * s1 * s2;                                                                                          \
    }
#define VEC_GELU(SUF, VT, ATTR)                                                                                      \
    ATTR static inline __attribute__((always_inline)) VT gelu_##SUF(VT x) {                                          \
        const VT zero = {0};                                                                                         \
        VT h = x * 0.5f;                                                                                             \
        h = vsel_##SUF(h < zero, -h, h);                                                                             \
        VT v = (zero + 1.0f) / h;                                                                                    \
        v = v + 0.54f;                                                                                               \
        v = (zero + 1.0f) / v;                                                                                       \
        VT g = v * -0.0017205046768785824f;                                                                          \
        g = (g + 0.010069450530973684f) * v;                                                                         \
        g = (g + -0.0171442958970123f) * v;                                                                          \
        g = (g + -0.0026227422978653014f) * v;                                                                       \
        g = (g + 0.008187478222535955f) * v;                                                                         \
        g = (g + 0.08201428691474494f) * v;                                                                          \
        g = (g + 0.010790471420860023f) * v;                                                                         \
        g = (g + -1.0557681357219344f) * v;                                                                          \
        VT sq = h * -2.0f;                                                                                           \
        sq = sq * h;                                                                                                 \
        g = g + sq;                                                                                                  \
        g = exp_wide_##SUF(g) * v;                                                                                   \
        VT out = x * 0.5f;                                                                                           \
        out = out + h;                                                                                               \
        return out - g;                                                                                              \
    }

VEC_EXP_WIDE(16, vf16, vi16)
VEC_EXP_WIDE(8, v8f, vi8)

static inline __attribute__((always_inline)) v8f exp_wide_8(v8f t) { return exp_wide_vec_8(t); }
#ifdef ORCH_X86_DISPATCH
/* exp_wide_vec_16 in AVX-512 instructions, bit for bit (checked over all 2^32 inputs of
 * gelu), as silu_16 above: the clamps are a max and a min (the second operand where either
 * is NaN), and p * 2^k is one scalef, which rounds once into a subnormal as p * 2^k1 * 2^k2
 * does. gelu about 1.35x faster. */
ORCH_V4 static inline __attribute__((always_inline)) vf16 exp_wide_16(vf16 tv) {
    __m512 t = _mm512_max_ps(_mm512_set1_ps(-104.0f), (__m512)tv);
    t = _mm512_min_ps(_mm512_set1_ps(88.7228394f), t);
    __m512 kf;
    const __m512 p = exp_parts_x16(t, &kf);
    return (vf16)_mm512_scalef_ps(p, kf);
}
#else
static inline __attribute__((always_inline)) vf16 exp_wide_16(vf16 t) { return exp_wide_vec_16(t); }
#endif
VEC_GELU(16, vf16, ORCH_V4)
VEC_GELU(8, v8f, )

/* out[i] = silu(x[i] + b) / gelu(x[i]) for i < n, VW floats at a time (out may be x; b =
 * -0.0f adds nothing, -0.0 included). The tail runs through the same vector code
 * (zero-padded), so an element's result does not depend on where it sits. One copy per
 * instruction set, picked when the module loads (spans_pick): 16-wide with AVX-512, 8-wide
 * elsewhere (16-wide code in the AVX2 build spilled: 3.5x slower). */
/* The body of a span: v = EXPR(v) over x[:n] into out, VW floats at a time, the tail padded. */
#define SPAN_BODY(VT, VW, EXPR)                                                                                      \
    Py_ssize_t i = 0;                                                                                                \
    for (; i + VW <= n; i += VW) {                                                                                   \
        VT v;                                                                                                        \
        __builtin_memcpy(&v, x + i, sizeof v);                                                                       \
        v = EXPR;                                                                                                    \
        __builtin_memcpy(out + i, &v, sizeof v);                                                                     \
    }                                                                                                                \
    if (i < n) {                                                                                                     \
        float buf[VW] = {0};                                                                                         \
        __builtin_memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));                                               \
        VT v;                                                                                                        \
        __builtin_memcpy(&v, buf, sizeof v);                                                                         \
        v = EXPR;                                                                                                    \
        __builtin_memcpy(buf, &v, sizeof v);                                                                         \
        __builtin_memcpy(out + i, buf, (size_t)(n - i) * sizeof(float));                                            \
    }

#define VEC_SPANS(NAME, ATTR, SUF, VT, VW)                                                                           \
    ATTR static void silu_span_##NAME(const float *x, float *out, Py_ssize_t n, float b) {                           \
        SPAN_BODY(VT, VW, silu_##SUF(v + b))                                                                         \
    }                                                                                                                \
    ATTR static void gelu_span_##NAME(const float *restrict x, float *restrict out, Py_ssize_t n) {                  \
        SPAN_BODY(VT, VW, gelu_##SUF(v))                                                                             \
    }

VEC_SPANS(8, , 8, v8f, 8)
#ifdef ORCH_X86_DISPATCH
VEC_SPANS(v4, __attribute__((target("arch=x86-64-v4"))), 16, vf16, 16)
VEC_SPANS(v3, __attribute__((target("arch=x86-64-v3"))), 8, v8f, 8)
#endif

static void (*silu_span)(const float *, float *, Py_ssize_t, float) = silu_span_8;
static void (*gelu_span)(const float *restrict, float *restrict, Py_ssize_t) = gelu_span_8;

static void spans_pick(int level) {
#ifdef ORCH_X86_DISPATCH
    if (level == 4) {
        silu_span = silu_span_v4;
        gelu_span = gelu_span_v4;
    } else if (level == 3) {
        silu_span = silu_span_v3;
        gelu_span = gelu_span_v3;
    }
#else
    (void)level;
#endif
}

static void gelu_loop(const float *restrict x, float *restrict out, Py_ssize_t n) { gelu_span(x, out, n); }

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
 * an 8-column output tile is one unaligned 8-float load. pad_band makes rows [p0, p0 + nrows)
 * of it, in a band of hb rows per phase (band row r holds padded row p0 + r): all of them
 * (pad_plane: p0 = 0, nrows = hb = hp), or what one part of a call split by output rows reads,
 * made by that part. */
ORCH_CLONES
static void pad_band(const float *restrict plane, float *restrict scratch, Py_ssize_t h, Py_ssize_t wd,
                     Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t hb, Py_ssize_t row, Py_ssize_t p0,
                     Py_ssize_t nrows) {
    const Py_ssize_t phase = hb * row;
    for (Py_ssize_t rr = 0; rr < nrows; rr++) {
        const Py_ssize_t y = p0 + rr - ph; /* the image row */
        if (y < 0 || y >= h) {
            for (Py_ssize_t bb = 0; bb < sw; bb++) /* a padding row: zeros in every phase */
                __builtin_memset(scratch + bb * phase + rr * row, 0, (size_t)row * sizeof(float));
            continue;
        }
        for (Py_ssize_t bb = 0; bb < sw; bb++) { /* each phase's cells left and right of the image's columns */
            float *restrict r = scratch + bb * phase + rr * row;
            const Py_ssize_t q0 = bb >= pw ? 0 : (pw - bb + sw - 1) / sw, q1 = (wd + pw - bb + sw - 1) / sw;
            for (Py_ssize_t q = 0; q < q0; q++) r[q] = 0.0f;
            for (Py_ssize_t q = q1 > q0 ? q1 : q0; q < row; q++) r[q] = 0.0f;
        }
        const float *restrict src = plane + y * wd;
        float *restrict dst = scratch + rr * row;
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

static void pad_plane(const float *restrict plane, float *restrict scratch, Py_ssize_t h, Py_ssize_t wd,
                      Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t hp, Py_ssize_t row) {
    pad_band(plane, scratch, h, wd, sw, ph, pw, hp, row, 0, hp);
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
            Py_ssize_t base[TS] = {0}, dst[TS], m[TS]; /* (base[0] is always set: nt >= 1) */
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

/* ``b`` holds at least ``count`` int8 (count >= 0) */
static int need_i8(const Py_buffer *b, Py_ssize_t count, const char *what) {
    if (count < 0 || b->len < count) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, fewer int8 than the %zd its sizes reach", what, b->len,
                     count);
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
    const vi8 lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const vi8 s01 = {0, 1, 8, 9, 4, 5, 12, 13}, s23 = {2, 3, 10, 11, 6, 7, 14, 15};
    const vi8 p0 = {0, 1, 2, 3, 8, 9, 10, 11}, p1 = {4, 5, 6, 7, 12, 13, 14, 15};
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

/* relu or hardswish over 8 vectors (relu_8 / hardswish_8: the same float32 operations as
 * act_inplace, bit for bit); silu is applied after the strip is stored (silu_span). */
static inline __attribute__((always_inline)) void act8(v8f r[8], int act) {
    if (act == ACT_RELU)
        for (int k = 0; k < 8; k++) r[k] = relu_8(r[k]);
    else if (act == ACT_HARDSWISH)
        for (int k = 0; k < 8; k++) r[k] = hardswish_8(r[k]);
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

/* whether two buffers share a byte (defined with the products) */
static int overlaps(const Py_buffer *a, const Py_buffer *b);

/* Releases a call's buffers (the bias only when it was taken) and returns None, or NULL
 * when the call failed (its exception set). */
static PyObject *release_call(int ok, int have_bias, Py_buffer *b, Py_buffer *x, Py_buffer *w, Py_buffer *out) {
    if (have_bias) PyBuffer_Release(b);
    PyBuffer_Release(x);
    PyBuffer_Release(w);
    PyBuffer_Release(out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* A share of one convolution call: images x groups [i0, i1), with its own scratch. */
typedef struct {
    const float *x, *w, *bias;
    float *out, *scratch;
    const Py_ssize_t *toff, *koff; /* koff: where conv_tiles / conv_flat read (NULL: grouped_group computes) */
    Py_ssize_t i0, i1, c_, h, wd, o_, g_, cg, og, taps, sh, sw, ph, pw, ho, wo, hp, row, plane_len;
    int act;
    const dw_geom *dwg; /* depthwise (cg == og == 1): its sizes; scratch is then depthwise_part's */
    int flat;           /* with koff: conv_flat computes (row has no slack), else conv_tiles */
    int band;           /* conv_rows_part: pads its own band of hp rows (per phase) into scratch first */
    Py_ssize_t reach;   /* with band: (kh - 1) dh + 1, the padded rows one output row reads */
} conv_job;

static void conv_tiles(const float *scratch, const Py_ssize_t *koff, const float *wg, const float *bg, float *og_out,
                       Py_ssize_t K, Py_ssize_t og, Py_ssize_t sh, Py_ssize_t row, Py_ssize_t ho, Py_ssize_t wo,
                       Py_ssize_t r0, Py_ssize_t r1, int act);
static void conv_flat(const float *scratch, const Py_ssize_t *koff, const float *wg, const float *bg, float *og_out,
                      Py_ssize_t K, Py_ssize_t og, Py_ssize_t row, Py_ssize_t ho, Py_ssize_t wo, int act);
static Py_ssize_t gemm_nr; /* the product tiles' width (set with them when the module loads) */

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
        const float *wg = j->w + g * j->og * j->cg * j->taps, *bg = j->bias ? j->bias + g * j->og : NULL;
        if (j->koff && j->flat) {
            conv_flat(j->scratch, j->koff, wg, bg, dst, j->cg * j->taps, j->og, j->row, j->ho, j->wo, j->act);
        } else if (j->koff) {
            conv_tiles(j->scratch, j->koff, wg, bg, dst, j->cg * j->taps, j->og, j->sh, j->row, j->ho, j->wo, 0, j->ho,
                       j->act);
        } else {
            grouped_group(j->scratch, j->plane_len, wg, bg, dst, j->toff, j->taps, j->cg, j->og, j->sh, j->ho, j->wo,
                          j->row);
            if (j->act != ACT_NONE) act_inplace(dst, j->og * j->ho * j->wo, j->act); /* while it is in cache */
        }
    }
    return NULL;
}

/* A share of a one-image, one-group convolution (a network's stem: 3 input channels): output
 * rows [i0, i1) of every output channel. With ``band`` it first pads the input rows those
 * outputs read into its own scratch (so the padding is split over the threads too, each core
 * writing what it then reads); otherwise the caller padded the planes whole before any part ran
 * (out lies on x). (conv_part's split is by image and group: one part here.) */
static void *conv_rows_part(void *arg) {
    const conv_job *j = (const conv_job *)arg;
    if (j->band) { /* its own rows of the padded planes, then its outputs from them */
        if (j->i1 <= j->i0) return NULL;
        const Py_ssize_t p0 = j->i0 * j->sh, nrows = (j->i1 - j->i0 - 1) * j->sh + j->reach;
        for (Py_ssize_t ci = 0; ci < j->cg; ci++)
            pad_band(j->x + ci * j->h * j->wd, j->scratch + ci * j->plane_len, j->h, j->wd, j->sw, j->ph, j->pw, j->hp,
                     j->row, p0, nrows);
        conv_tiles(j->scratch, j->koff, j->w, j->bias, j->out + j->i0 * j->wo, j->cg * j->taps, j->og, j->sh, j->row,
                   j->ho, j->wo, 0, j->i1 - j->i0, j->act);
        return NULL;
    }
    conv_tiles(j->scratch, j->koff, j->w, j->bias, j->out, j->cg * j->taps, j->og, j->sh, j->row, j->ho, j->wo, j->i0,
               j->i1, j->act);
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
    /* out may overlap x where the call reads x whole (into the padded planes of its scratch)
     * before it writes any output: one image of one group, not depthwise (conv_part pads its
     * one item's planes first, and a call split by rows pads them before any part runs).
     * Elsewhere an item's planes are padded after another item's outputs were written, and
     * the caller must copy x aside (conv_reads_input_first in _conv.py says which). */
    if (ok && (overlaps(&w, &out) || (have_bias && overlaps(&b, &out)) ||
               (overlaps(&x, &out) && !(n_ == 1 && g_ == 1 && !(cg == 1 && og == 1))))) {
        PyErr_SetString(PyExc_ValueError, "conv_f32: out overlaps the weight, the bias, or an input it reads late");
        ok = 0;
    }
    float *scratch = NULL, *scratch_mem = NULL;
    Py_ssize_t *toff = NULL;
    /* How a non-depthwise call computes: rows wide enough go through conv_tiles (at most a
     * quarter of a row's last tile wasted); narrower ones at stride 1 through conv_flat
     * (tiles over the padded planes' flat positions, rows without the 8-float slack);
     * the rest through grouped_group's 8-column tiles */
    const int tiles = ok && !(cg == 1 && og == 1) && (wo + gemm_nr - 1) / gemm_nr * gemm_nr * 3 <= 4 * wo;
    const int flat = ok && !tiles && !(cg == 1 && og == 1) && sh == 1 && sw == 1;
    const Py_ssize_t hp = h + 2 * ph, row = flat ? wd + 2 * pw : (wd + 2 * pw + sw - 1) / sw + 8,
                     plane_len = sw * hp * row;
    const Py_ssize_t taps = kh * kw;
    /* depthwise: strips of output rows whose padded input fits DW_STRIP_FLOATS (one row at least) */
    const int depthwise = ok && cg == 1 && og == 1;
    /* a depthwise call is split in blocks of 8 channels (its vectors' width: a part of fewer
     * channels leaves lanes idle and transposes its rows again for them) */
    const int nparts = ok ? parts_for(prod4(n_, o_ * cg, ho * wo, taps), depthwise ? (n_ * g_ + 7) / 8 : n_ * g_) : 1;
    dw_geom dwg = {c_, h, wd, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, wd + 2 * pw, 1, 0};
    /* + 64 + kw dw: conv_tiles reads a run of gemm_nr (<= 32) floats from each tap's first,
     * past a plane's last row by up to gemm_nr - 8; conv_flat's last tile reads its garbage
     * positions past the last plane by up to gemm_nr + (kw - 1) dw */
    Py_ssize_t part_floats = cg * plane_len + 64 + (ok ? kw * dw : 0);
    /* One image of one group with tile rows: split by output rows, in parts of at most
     * band_out rows. Each part pads the rows it reads itself (a band of hb rows per phase) so
     * they are made in parallel, by the core that reads them; where out overlaps x (a call
     * that reads x whole before it writes) they are padded first, once, by the caller. */
    const int row_parts = ok && tiles && n_ == 1 && g_ == 1 ? parts_for(prod4(o_, cg, ho * wo, taps), ho) : 1;
    const int band = row_parts > 1 && !overlaps(&x, &out);
    const Py_ssize_t band_out = row_parts > 1 ? (ho + row_parts - 1) / row_parts : ho;
    const Py_ssize_t hb = band ? (band_out - 1) * sh + (kh - 1) * dh + 1 : hp, plane_b = sw * hb * row;
    int alloc_parts = nparts;
    if (band) {
        part_floats = cg * plane_b + 64 + kw * dw;
        alloc_parts = row_parts;
    }
    if (ok && depthwise) {
        const Py_ssize_t reach = (kh - 1) * dh + 1, fit = DW_STRIP_FLOATS / (16 * dwg.wp);
        dwg.strip = fit > reach ? (fit - reach) / sh + 1 : 1;
        if (dwg.strip > ho) dwg.strip = ho > 0 ? ho : 1;
        dwg.rows_in = (dwg.strip - 1) * sh + reach;
        part_floats = dw_scratch_floats(&dwg);
    }
    if (ok) {
        Py_ssize_t floats;
        if (part_floats < 0 || __builtin_mul_overflow(part_floats + 16, (Py_ssize_t)alloc_parts, &floats) ||
            floats > ((Py_ssize_t)1 << 40)) {
            PyErr_SetString(PyExc_ValueError, "conv_f32: scratch too large");
            ok = 0;
        } else {
            /* each part's share starts 64-byte aligned */
            part_floats = (part_floats + 15) & ~(Py_ssize_t)15;
            scratch_mem = PyMem_RawMalloc((size_t)(alloc_parts * part_floats + 16) * sizeof(float));
            scratch = scratch_mem ? (float *)(((uintptr_t)scratch_mem + 63) & ~(uintptr_t)63) : NULL;
            toff = PyMem_RawMalloc((size_t)(kh * kw) * (size_t)(cg + 1) * sizeof(Py_ssize_t)); /* toff, then koff */
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
        /* wide enough output rows go through conv_tiles (at most a quarter of its columns
         * wasted in a row's last tile); narrow ones through grouped_group's 8-column tiles */
        Py_ssize_t *koff = toff + taps; /* B's row (ci, tap) of conv_tiles' / conv_flat's product */
        if (band) /* the same taps, over a band of hb rows per phase */
            for (Py_ssize_t ci = 0; ci < cg; ci++)
                for (Py_ssize_t i = 0; i < kh; i++)
                    for (Py_ssize_t jj = 0; jj < kw; jj++)
                        koff[ci * taps + i * kw + jj] = ci * plane_b + ((jj * dw) % sw) * hb * row + i * dh * row +
                                                        (jj * dw) / sw;
        else if (tiles || flat)
            for (Py_ssize_t ci = 0; ci < cg; ci++)
                for (Py_ssize_t t = 0; t < taps; t++) koff[ci * taps + t] = ci * plane_len + toff[t];
        conv_job jobs[MAX_PARTS];
        if (row_parts > 1) {
            if (!band)
                for (Py_ssize_t ci = 0; ci < cg; ci++)
                    pad_plane((const float *)x.buf + ci * h * wd, scratch + ci * plane_len, h, wd, sw, ph, pw, hp, row);
            for (int k = 0; k < row_parts; k++) {
                conv_job j = {(const float *)x.buf, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL,
                              (float *)out.buf, band ? scratch + k * part_floats : scratch, toff, koff,
                              ho * k / row_parts, ho * (k + 1) / row_parts, c_, h, wd, o_, g_, cg, og, taps, sh, sw,
                              ph, pw, ho, wo, band ? hb : hp, row, band ? plane_b : plane_len, act, NULL, 0, band,
                              (kh - 1) * dh + 1};
                jobs[k] = j;
            }
            Py_BEGIN_ALLOW_THREADS
            run_parts(conv_rows_part, jobs, sizeof jobs[0], row_parts);
            Py_END_ALLOW_THREADS
        }
        const Py_ssize_t items = row_parts > 1 ? 0 : n_ * g_;
        for (int k = 0; k < nparts && items; k++) {
            Py_ssize_t i0 = items * k / nparts, i1 = items * (k + 1) / nparts;
            if (depthwise) { /* whole blocks of 8 channels (of the flattened image x channel index) */
                i0 = k == 0 ? 0 : (((items + 7) / 8) * k / nparts) * 8;
                i1 = k + 1 == nparts ? items : (((items + 7) / 8) * (k + 1) / nparts) * 8;
                if (i1 > items) i1 = items;
                if (i0 > i1) i0 = i1;
            }
            conv_job j = {(const float *)x.buf, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL,
                          (float *)out.buf, scratch + k * part_floats, toff, tiles || flat ? koff : NULL, i0,
                          i1, c_, h, wd, o_, g_, cg, og, taps, sh, sw, ph, pw, ho, wo, hp, row,
                          plane_len, act, depthwise ? &dwg : NULL, flat};
            jobs[k] = j;
        }
        if (items) {
            Py_BEGIN_ALLOW_THREADS
            run_parts(conv_part, jobs, sizeof jobs[0], nparts);
            Py_END_ALLOW_THREADS
        }
    }
    PyMem_RawFree(toff);
    PyMem_RawFree(scratch_mem);
    return release_call(ok, have_bias, &b, &x, &w, &out);
}

typedef void (*unary_loop)(const float *restrict, float *restrict, Py_ssize_t);

/* Where part k of an elementwise run of n floats split in nparts starts (n for k == nparts):
 * on 16-float boundaries, so every part but the last is whole vectors. */
static inline Py_ssize_t run_start(Py_ssize_t n, int k, int nparts) {
    return k >= nparts ? n : (n * k / nparts) & ~(Py_ssize_t)15;
}

/* Where part k of nparts of n rows (or tiles) starts: proportional, unrounded (a run of
 * elements takes run_start's multiples of 16 instead) */
static inline Py_ssize_t part_start(Py_ssize_t n, int k, int nparts) {
    return k >= nparts ? n : n * k / nparts;
}

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
        unary_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            const Py_ssize_t a = run_start(n, k, nparts), e = run_start(n, k + 1, nparts);
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

/* The 8 lanes of v added in order. */
static inline float lanes_sum(v8f v) {
    float acc = 0.0f;
    for (int q = 0; q < 8; q++) acc += v[q];
    return acc;
}

/* ---- out = a + b (then relu), float32 elementwise: a residual connection ---- */

typedef struct {
    const float *a, *b;
    float *out;
    Py_ssize_t n;
    int relu;
} add_job;

/* (out may be a or b: each element is read before it is written) */
ORCH_CLONES
static void add_loop(const float *a, const float *b, float *out, Py_ssize_t n, int relu) {
    if (relu) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const float v = a[i] + b[i];
            out[i] = v < 0.0f ? 0.0f : v; /* relu_out's clip: NaN and -0.0 stay */
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    }
}

static void *add_part(void *arg) {
    const add_job *j = (const add_job *)arg;
    if (j->n > 0) add_loop(j->a, j->b, j->out, j->n, j->relu);
    return NULL;
}

static PyObject *py_add_f32(PyObject *self, PyObject *args) {
    Py_buffer a, b, out;
    Py_ssize_t n;
    int relu = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*n|p", &a, &b, &out, &n, &relu)) return NULL;
    int ok = need(&a, n, "a") && need(&b, n, "b") && need(&out, n, "out");
    if (ok && ((a.buf != out.buf && overlaps(&a, &out)) || (b.buf != out.buf && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "add_f32: out overlaps an operand without being it");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(n * 8, n / 4096);
        add_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            const Py_ssize_t s0 = run_start(n, k, nparts), e = run_start(n, k + 1, nparts);
            add_job j = {(const float *)a.buf + s0, (const float *)b.buf + s0, (float *)out.buf + s0, e - s0, relu};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(add_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- channels-last scale: out[n, p, c] = x[n, p, c] * s[n, c] (squeeze-and-excite's
 * excitation applied to NHWC data), split over the rows (n, p) ---- */
typedef struct {
    const float *x, *s;
    float *out;
    Py_ssize_t P, C, r0, r1;
} mulrows_job;

/* (out may be x: each element is read before it is written) */
ORCH_CLONES
static void mul_rows_loop(const float *x, const float *s, float *out, Py_ssize_t C) {
    for (Py_ssize_t c = 0; c < C; c++) out[c] = x[c] * s[c];
}

static void *mulrows_part(void *arg) {
    const mulrows_job *j = (const mulrows_job *)arg;
    for (Py_ssize_t r = j->r0; r < j->r1; r++)
        mul_rows_loop(j->x + r * j->C, j->s + (r / j->P) * j->C, j->out + r * j->C, j->C);
    return NULL;
}

static PyObject *py_mul_rows_f32(PyObject *self, PyObject *args) {
    Py_buffer x, sc, out;
    Py_ssize_t n_, p_, c_;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*nnn", &x, &sc, &out, &n_, &p_, &c_)) return NULL;
    const Py_ssize_t lim = (Py_ssize_t)1 << 31;
    int ok = 1;
    if (n_ < 1 || p_ < 1 || c_ < 1 || n_ > lim || p_ > lim || c_ > lim || prod4(n_, p_, c_, 1) < 0 ||
        prod4(n_, p_, c_, 1) > ((Py_ssize_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "mul_rows_f32: inconsistent sizes");
        ok = 0;
    }
    ok = ok && need(&x, prod4(n_, p_, c_, 1), "x") && need(&sc, prod4(n_, c_, 1, 1), "s") &&
         need(&out, prod4(n_, p_, c_, 1), "out");
    if (ok && ((x.buf != out.buf && overlaps(&x, &out)) || overlaps(&sc, &out))) {
        PyErr_SetString(PyExc_ValueError, "mul_rows_f32: out overlaps s, or x without being it");
        ok = 0;
    }
    if (ok) {
        const Py_ssize_t rows = n_ * p_;
        const int nparts = parts_for(rows * c_ * 8, rows);
        mulrows_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            mulrows_job j = {(const float *)x.buf, (const float *)sc.buf, (float *)out.buf, p_, c_,
                             part_start(rows, k, nparts), part_start(rows, k + 1, nparts)};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(mulrows_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 (qs8) steps of XNNPACK-quantized programs: the integer products run as float32
 * products of centred values (exact while every partial sum stays below 2^24: the caller
 * splits longer dot products into parts), then one pass requantizes; and the float32 <->
 * qs8 converts. The arithmetic is XNNPACK's "fp32" requantization and convert, operation for
 * operation: (float) of the int32 accumulator (bias included), times the float32 scale,
 * clamped, rounded half to even, plus the zero point. ---- */
typedef struct {
    const float *acc, *scale;
    const int32_t *bias;
    int8_t *out;
    Py_ssize_t parts, rows, n, r0, r1;
    float lo, hi;
    int zp;
} requant_job;

ORCH_CLONES
static void requant_row(const float *acc, Py_ssize_t stride, Py_ssize_t parts, const int32_t *bias,
                        const float *scale, int8_t *out, Py_ssize_t n, float lo, float hi, int zp) {
    double t[256]; /* the row's sums, a block of channels at a time (exact: integers far below 2^53) */
    for (Py_ssize_t c0 = 0; c0 < n; c0 += 256) {
        const Py_ssize_t m = n - c0 < 256 ? n - c0 : 256;
        if (bias)
            for (Py_ssize_t c = 0; c < m; c++) t[c] = (double)bias[c0 + c] + (double)acc[c0 + c];
        else
            for (Py_ssize_t c = 0; c < m; c++) t[c] = (double)acc[c0 + c];
        for (Py_ssize_t p = 1; p < parts; p++)
            for (Py_ssize_t c = 0; c < m; c++) t[c] += (double)acc[p * stride + c0 + c];
        for (Py_ssize_t c = 0; c < m; c++) {
            /* the int32 accumulator to float (one rounding), times the scale */
            float v = (float)t[c] * scale[c0 + c];
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            out[c0 + c] = (int8_t)((int)__builtin_rintf(v) + zp);
        }
    }
}

static void *requant_part(void *arg) {
    const requant_job *j = (const requant_job *)arg;
    const Py_ssize_t stride = j->rows * j->n;
    for (Py_ssize_t r = j->r0; r < j->r1; r++)
        requant_row(j->acc + r * j->n, stride, j->parts, j->bias, j->scale, j->out + r * j->n, j->n, j->lo, j->hi,
                    j->zp);
    return NULL;
}

static PyObject *py_requant_qs8(PyObject *self, PyObject *args) {
    Py_buffer acc, sc, out, b = {0};
    PyObject *bias_obj;
    Py_ssize_t parts, rows, n_;
    float lo, hi;
    int zp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Oy*w*nnnffi", &acc, &bias_obj, &sc, &out, &parts, &rows, &n_, &lo, &hi, &zp))
        return NULL;
    const int have_bias = bias_obj != Py_None;
    int ok = !have_bias || PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) == 0;
    if (ok && (parts < 1 || rows < 1 || n_ < 1 || parts > 4096 || prod4(parts, rows, n_, 1) < 0 ||
               prod4(parts, rows, n_, 1) > ((Py_ssize_t)1 << 40) || !(lo <= hi) || zp < -128 || zp > 127)) {
        PyErr_SetString(PyExc_ValueError, "requant_qs8: inconsistent sizes or bounds");
        ok = 0;
    }
    ok = ok && need(&acc, prod4(parts, rows, n_, 1), "acc") && need(&sc, n_, "scale") &&
         (!have_bias || need(&b, n_, "bias"));
    ok = ok && need_i8(&out, rows * n_, "out");
    if (ok && (overlaps(&acc, &out) || overlaps(&sc, &out) || (have_bias && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "requant_qs8: out overlaps an operand");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(rows * n_ * 4, rows);
        requant_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            requant_job j = {(const float *)acc.buf, (const float *)sc.buf, have_bias ? (const int32_t *)b.buf : NULL,
                             (int8_t *)out.buf, parts, rows, n_, part_start(rows, k, nparts),
                             part_start(rows, k + 1, nparts), lo, hi, zp};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(requant_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&acc);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (have_bias && b.obj) PyBuffer_Release(&b);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* float32 -> qs8: x * inv_scale clamped to [lo, hi] (the int8 range less the zero point),
 * rounded half to even, plus the zero point; qs8 -> float32: (q - zp) * scale. */
ORCH_CLONES
static void quantize_span(const float *x, int8_t *out, Py_ssize_t n, float inv, float lo, float hi, int zp) {
    for (Py_ssize_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[i] = (int8_t)((int)__builtin_rintf(v) + zp);
    }
}

ORCH_CLONES
static void dequantize_span(const int8_t *q, float *out, Py_ssize_t n, int zp, float scale) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = (float)((int)q[i] - zp) * scale;
}

static PyObject *py_quantize_qs8(PyObject *self, PyObject *args) {
    Py_buffer x, out;
    Py_ssize_t n;
    float inv, lo, hi;
    int zp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nfffi", &x, &out, &n, &inv, &lo, &hi, &zp)) return NULL;
    int ok = 1;
    if (n < 0 || !(lo <= hi) || zp < -128 || zp > 127) {
        PyErr_SetString(PyExc_ValueError, "quantize_qs8: inconsistent sizes or bounds");
        ok = 0;
    }
    ok = ok && need(&x, n, "x");
    ok = ok && need_i8(&out, n, "out");
    if (ok && overlaps(&x, &out)) {
        PyErr_SetString(PyExc_ValueError, "quantize_qs8: out overlaps x");
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        quantize_span((const float *)x.buf, (int8_t *)out.buf, n, inv, lo, hi, zp);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_dequantize_qs8(PyObject *self, PyObject *args) {
    Py_buffer q, out;
    Py_ssize_t n;
    int zp;
    float scale;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nif", &q, &out, &n, &zp, &scale)) return NULL;
    int ok = 1;
    if (n < 0 || zp < -128 || zp > 127) {
        PyErr_SetString(PyExc_ValueError, "dequantize_qs8: inconsistent sizes or zero point");
        ok = 0;
    }
    ok = ok && need_i8(&q, n, "q");
    ok = ok && need(&out, n, "out");
    if (ok && overlaps(&q, &out)) {
        PyErr_SetString(PyExc_ValueError, "dequantize_qs8: out overlaps q");
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        dequantize_span((const int8_t *)q.buf, (float *)out.buf, n, zp, scale);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&q);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 linear layers over few rows (classifiers, squeeze-excite's 1x1 convolutions on a
 * 1x1 map): out[r, j] = requant(bias[j] + sum_k (x[r, k] - zx) * w[j, k]) with int32 sums,
 * the int8 filter read once, as stored ((n, k) rows), split over the output channels. Such
 * products read every weight once for a row or two: as int8 that is a quarter of the bytes
 * of the float32 copies the many-row path multiplies. ---- */
typedef struct {
    const int16_t *xc;
    const int8_t *w;
    const int32_t *bias;
    const float *scale;
    int8_t *out;
    Py_ssize_t rows, k, n, j0, j1;
    float lo, hi;
    int zp;
} qdot_job;

ORCH_CLONES
static int32_t dot_i16_i8(const int16_t *restrict a, const int8_t *restrict b, Py_ssize_t k) {
    int32_t s = 0; /* exact: the caller bounds k so that no sum leaves int32 */
    for (Py_ssize_t i = 0; i < k; i++) s += (int32_t)a[i] * (int32_t)(int16_t)b[i];
    return s;
}

static void *qdot_part(void *arg) {
    const qdot_job *j = (const qdot_job *)arg;
    for (Py_ssize_t c = j->j0; c < j->j1; c++) {
        const int8_t *wr = j->w + c * j->k;
        for (Py_ssize_t r = 0; r < j->rows; r++) {
            const double a = (double)dot_i16_i8(j->xc + r * j->k, wr, j->k) + (j->bias ? (double)j->bias[c] : 0.0);
            float v = (float)a * j->scale[c]; /* as requant_qs8 */
            v = v < j->lo ? j->lo : v;
            v = v > j->hi ? j->hi : v;
            j->out[r * j->n + c] = (int8_t)((int)__builtin_rintf(v) + j->zp);
        }
    }
    return NULL;
}

/* the largest k whose sums of (x - zx) * w (|x - zx| <= 255, |w| <= 128) stay in int32 */
#define QDOT_MAX_K 65536

static PyObject *py_qs8_rows_dot(PyObject *self, PyObject *args) {
    Py_buffer x, w, sc, out, b = {0};
    PyObject *bias_obj;
    Py_ssize_t rows, k_, n_;
    int zx, zp;
    float lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iy*Oy*w*nnnffi", &x, &zx, &w, &bias_obj, &sc, &out, &rows, &k_, &n_, &lo, &hi,
                          &zp))
        return NULL;
    const int have_bias = bias_obj != Py_None;
    int ok = !have_bias || PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) == 0;
    if (ok && (rows < 1 || rows > 64 || k_ < 1 || k_ > QDOT_MAX_K || n_ < 1 || n_ > ((Py_ssize_t)1 << 24) ||
               !(lo <= hi) || zp < -128 || zp > 127 || zx < -128 || zx > 127)) {
        PyErr_SetString(PyExc_ValueError, "qs8_rows_dot: inconsistent sizes, bounds or zero points");
        ok = 0;
    }
    ok = ok && need_i8(&x, rows * k_, "x") && need_i8(&w, n_ * k_, "w") && need_i8(&out, rows * n_, "out");
    ok = ok && need(&sc, n_, "scale") && (!have_bias || need(&b, n_, "bias"));
    if (ok && (overlaps(&x, &out) || overlaps(&w, &out) || overlaps(&sc, &out) ||
               (have_bias && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "qs8_rows_dot: out overlaps an operand");
        ok = 0;
    }
    int16_t *xc = NULL;
    if (ok && !(xc = (int16_t *)malloc((size_t)(rows * k_) * sizeof(int16_t)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const int8_t *xs = (const int8_t *)x.buf;
        for (Py_ssize_t i = 0; i < rows * k_; i++) xc[i] = (int16_t)(xs[i] - zx);
        const int nparts = parts_for(rows * k_ * n_, n_);
        qdot_job jobs[MAX_PARTS];
        for (int p = 0; p < nparts; p++) {
            qdot_job j = {xc, (const int8_t *)w.buf, have_bias ? (const int32_t *)b.buf : NULL, (const float *)sc.buf,
                          (int8_t *)out.buf, rows, k_, n_, run_start(n_, p, nparts), run_start(n_, p + 1, nparts),
                          lo, hi, zp};
            jobs[p] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(qdot_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    free(xc);
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (have_bias && b.obj) PyBuffer_Release(&b);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 products of many rows (1x1 and im2col convolutions, fully-connected layers over
 * many rows): out[r, j] = requant(corr[j] + sum_k xu[r, k] * w[j, k]) where xu = x ^ 0x80 (x +
 * 128 as uint8) and corr[j] = bias[j] - (128 + zx) * sum_k w[j, k], made by the caller: the
 * sum equals bias[j] + sum_k (x[r, k] - zx) * w[j, k] modulo 2^32, and is that sum where the
 * caller bounds k and the bias so that it fits int32 (then bit-equal to requant_qs8 over exact
 * sums). The filter is packed once by the caller as [ceil(n / 16)][k4][16][4] int8 (k4 =
 * ceil(k / 4), zero-padded): four consecutive k of 16 output channels in 64 bytes, what one
 * vpdpbusd multiplies by four bytes of a row. Each call first writes the rows as uint8 into
 * the caller's scratch xu ((rows, 4 k4), zero-padded). AVX-512 VNNI where the CPU has it
 * (QS8_GEMM_VNNI; the int8 path takes the float32 products elsewhere), a plain loop otherwise. ---- */
typedef struct {
    Py_ssize_t H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo;
    int zx;
} qconv_geo;

/* an int8 convolution's geometry: every size at least 1 (paddings 0) and at most 2^24, so
 * that no product of four of them leaves Py_ssize_t */
static int qgeo_ok(Py_ssize_t nn, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh,
                   Py_ssize_t sw, Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t Ho,
                   Py_ssize_t Wo) {
    const Py_ssize_t lim = (Py_ssize_t)1 << 24, v[] = {nn, H, W, C, kh, kw, sh, sw, dh, dw, Ho, Wo};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 1 || v[i] > lim) return 0;
    return pt >= 0 && pl >= 0 && pt <= lim && pl <= lim;
}

typedef struct {
    const int8_t *x;
    uint8_t *xu;
    const int8_t *wp;
    const int32_t *corr;
    const float *scale;
    int8_t *out;
    Py_ssize_t k, k4, n, r0, r1;
    float lo, hi;
    int zp;
    const qconv_geo *geo; /* NULL: the rows of x as they are; else x is an NHWC image and row r the patch of output pixel r */
    /* grouped convolutions (goc > 0): a row holds every group's patch tap by tap, (kh, kw, C);
     * output channel c (group c / goc) reads the gk4 words of its group's gic channels, tap by
     * tap; goc is 8 or a multiple of 16, gic a multiple of 4 */
    Py_ssize_t gic, goc, gk4;
} qgemm_job;

/* Row r's k raw int8 bytes into u: the rows of x, or (geo) the patch of output pixel r of a
 * convolution (groups 1) in (kh, kw, C) order, taps outside the image holding the zero point */
static void qgemm_gather(const qgemm_job *j, Py_ssize_t r, int8_t *u) {
    const qconv_geo *g = j->geo;
    if (!g) {
        memcpy(u, j->x + r * j->k, (size_t)j->k);
        return;
    }
    const Py_ssize_t ox = r % g->Wo, oy = (r / g->Wo) % g->Ho, nn = r / (g->Wo * g->Ho), C = g->C;
    const int8_t *img = j->x + nn * g->H * g->W * C;
    const Py_ssize_t y0 = oy * g->sh - g->pt, x0 = ox * g->sw - g->pl;
    const int whole_row = x0 >= 0 && x0 + (g->kw - 1) * g->dw < g->W && g->dw == 1;
    for (Py_ssize_t i = 0; i < g->kh; i++) {
        int8_t *t = u + i * g->kw * C;
        const Py_ssize_t iy = y0 + i * g->dh;
        if (iy < 0 || iy >= g->H) {
            memset(t, g->zx, (size_t)(g->kw * C));
        } else if (whole_row) { /* the row's taps are one run of x */
            memcpy(t, img + (iy * g->W + x0) * C, (size_t)(g->kw * C));
        } else {
            for (Py_ssize_t jj = 0; jj < g->kw; jj++) {
                const Py_ssize_t ix = x0 + jj * g->dw;
                if (ix < 0 || ix >= g->W)
                    memset(t + jj * C, g->zx, (size_t)C);
                else
                    memcpy(t + jj * C, img + (iy * g->W + ix) * C, (size_t)C);
            }
        }
    }
}

static void qgemm_rows_plain(const qgemm_job *j) {
    const Py_ssize_t k4 = j->k4, kp = 4 * k4, n = j->n, nb = (n + 15) / 16;
    for (Py_ssize_t r = j->r0; r < j->r1; r++) { /* the part's rows as uint8, zero-padded to kp */
        uint8_t *u = j->xu + r * kp;
        qgemm_gather(j, r, (int8_t *)u);
        for (Py_ssize_t i = 0; i < j->k; i++) u[i] ^= 0x80u;
        for (Py_ssize_t i = j->k; i < kp; i++) u[i] = 0;
    }
    if (j->goc) {
        const Py_ssize_t tw = j->gic / 4, cw = j->geo->C / 4; /* words per tap of a group, of all groups */
        for (Py_ssize_t r = j->r0; r < j->r1; r++) {
            const uint8_t *xr = j->xu + r * kp;
            for (Py_ssize_t c = 0; c < n; c++) {
                const int8_t *wb = j->wp + (c / 16) * j->gk4 * 64 + 4 * (c % 16);
                const Py_ssize_t gw = (c / j->goc) * tw;
                uint32_t acc = 0;
                for (Py_ssize_t q = 0; q < j->gk4; q++) {
                    const uint8_t *xw = xr + 4 * ((q / tw) * cw + gw + q % tw);
                    for (int t = 0; t < 4; t++) acc += (uint32_t)((int32_t)xw[t] * (int32_t)wb[64 * q + t]);
                }
                float v = (float)(int32_t)(acc + (uint32_t)j->corr[c]) * j->scale[c];
                v = v < j->lo ? j->lo : v;
                v = v > j->hi ? j->hi : v;
                j->out[r * n + c] = (int8_t)((int)__builtin_rintf(v) + j->zp);
            }
        }
        return;
    }
    for (Py_ssize_t r = j->r0; r < j->r1; r++) {
        const uint8_t *xr = j->xu + r * kp;
        for (Py_ssize_t b = 0; b < nb; b++) {
            const int8_t *wb = j->wp + b * k4 * 64;
            uint32_t acc[16] = {0}; /* modulo 2^32 (see above) */
            for (Py_ssize_t q = 0; q < k4; q++)
                for (int l = 0; l < 16; l++)
                    for (int t = 0; t < 4; t++)
                        acc[l] += (uint32_t)((int32_t)xr[4 * q + t] * (int32_t)wb[64 * q + 4 * l + t]);
            for (int l = 0; l < 16 && 16 * b + l < n; l++) {
                const Py_ssize_t c = 16 * b + l;
                float v = (float)(int32_t)(acc[l] + (uint32_t)j->corr[c]) * j->scale[c];
                v = v < j->lo ? j->lo : v;
                v = v > j->hi ? j->hi : v;
                j->out[r * n + c] = (int8_t)((int)__builtin_rintf(v) + j->zp);
            }
        }
    }
}

#ifdef ORCH_X86_DISPATCH
typedef int32_t qg_word __attribute__((may_alias, aligned(1)));

/* requantizes 16 channels' sums plus corr (the lanes of m) into out: XNNPACK's fp32
 * requantization, shared by the int8 products and the depthwise kernel */
__attribute__((target("arch=x86-64-v4"))) static inline void qgemm_store(
    __m512i acc, __m512i corr, __m512 scale, int8_t *out, __mmask16 m, __m512 lo, __m512 hi, __m512i zp) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, corr)), scale);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), zp); /* rint: the default rounding mode */
    _mm_mask_storeu_epi8(out, m, _mm512_cvtepi32_epi8(q));
}

static inline __mmask16 qgemm_mask(Py_ssize_t cnt) {
    return cnt >= 16 ? (__mmask16)0xFFFF : cnt <= 0 ? (__mmask16)0 : (__mmask16)((1u << cnt) - 1);
}

/* grouped: 4 rows x 16 output channels (two groups of 8, or part of one group) per tile;
 * each row's word for a lane is its group's, the two groups' words blended when goc is 8 */
__attribute__((target("arch=x86-64-v4,avx512vnni"))) static inline __attribute__((always_inline)) void
qgconv_block_vnni(const qgemm_job *j, Py_ssize_t b, const int PAIR) {
    const Py_ssize_t kp = 4 * j->k4, n = j->n, tw = j->gic / 4, cw = j->geo->C / 4, c0 = 16 * b;
    /* (an odd group count's last block holds one group: its other lanes, never stored, read
     * that group too rather than past the row) */
    const Py_ssize_t gw0 = (c0 / j->goc) * tw, gw1 = PAIR && c0 + 8 < n ? gw0 + tw : gw0;
    const int8_t *wb = j->wp + b * j->gk4 * 64;
    const __mmask16 m = qgemm_mask(n - c0);
    const __m512i corr = _mm512_maskz_loadu_epi32(m, j->corr + c0);
    const __m512 sc = _mm512_maskz_loadu_ps(m, j->scale + c0);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const __m512i zp = _mm512_set1_epi32(j->zp);
    for (Py_ssize_t r = j->r0; r < j->r1; r += 4) {
        const Py_ssize_t mr = j->r1 - r < 4 ? j->r1 - r : 4;
        const qg_word *x0 = (const qg_word *)(j->xu + r * kp);
        const qg_word *x1 = mr > 1 ? x0 + j->k4 : x0, *x2 = mr > 2 ? x0 + 2 * j->k4 : x0, *x3 = mr > 3 ? x0 + 3 * j->k4 : x0;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        Py_ssize_t tap = 0, h = 0;
        for (Py_ssize_t q = 0; q < j->gk4; q++) {
            const __m512i wv = _mm512_loadu_si512(wb + 64 * q);
            const Py_ssize_t o = tap + h;
#define QG_WORD(X) (PAIR ? _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_set1_epi32(X[o + gw0]),              \
                                                   _mm512_set1_epi32(X[o + gw1]))                                   \
                         : _mm512_set1_epi32(X[o + gw0]))
            a0 = _mm512_dpbusd_epi32(a0, QG_WORD(x0), wv);
            a1 = _mm512_dpbusd_epi32(a1, QG_WORD(x1), wv);
            a2 = _mm512_dpbusd_epi32(a2, QG_WORD(x2), wv);
            a3 = _mm512_dpbusd_epi32(a3, QG_WORD(x3), wv);
#undef QG_WORD
            if (++h == tw) {
                h = 0;
                tap += cw;
            }
        }
        const __m512i acc[4] = {a0, a1, a2, a3};
        for (Py_ssize_t i = 0; i < mr; i++) qgemm_store(acc[i], corr, sc, j->out + (r + i) * n + c0, m, lo, hi, zp);
    }
}

/* 4 rows x 32 output channels per tile (8 accumulators), k four bytes at a time; a pair of
 * channel blocks at a time over all the part's rows (its filter, correction and scale stay
 * in cache and registers) */
__attribute__((target("arch=x86-64-v4,avx512vnni"))) static void qgemm_rows_vnni(const qgemm_job *j) {
    const Py_ssize_t k4 = j->k4, kp = 4 * k4, n = j->n, nb = (n + 15) / 16, k = j->k;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (Py_ssize_t r = j->r0; r < j->r1; r++) { /* the part's rows as uint8, zero-padded to kp */
        uint8_t *u = j->xu + r * kp;
        const int8_t *xr = j->x + r * k;
        if (j->geo) { /* the patch, gathered in place, then made uint8 there */
            qgemm_gather(j, r, (int8_t *)u);
            xr = (const int8_t *)u;
        }
        for (Py_ssize_t i = 0; i < kp; i += 64) {
            const Py_ssize_t have = k - i, room = kp - i;
            const __mmask64 mk = have >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << have) - 1;
            const __mmask64 mu = room >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << room) - 1;
            const __m512i v = _mm512_maskz_mov_epi8(mk, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, xr + i), flip));
            _mm512_mask_storeu_epi8(u + i, mu, v);
        }
    }
    if (j->goc) {
        for (Py_ssize_t b = 0; b < nb; b++) {
            if (j->goc == 8)
                qgconv_block_vnni(j, b, 1);
            else
                qgconv_block_vnni(j, b, 0);
        }
        return;
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const __m512i zp = _mm512_set1_epi32(j->zp);
    for (Py_ssize_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        const int8_t *w0 = j->wp + b * k4 * 64, *w1 = two ? w0 + k4 * 64 : w0;
        const Py_ssize_t c0 = 16 * b, c1 = c0 + 16;
        const __mmask16 m0 = qgemm_mask(n - c0), m1 = two ? qgemm_mask(n - c1) : 0;
        const __m512i corr0 = _mm512_maskz_loadu_epi32(m0, j->corr + c0), corr1 = _mm512_maskz_loadu_epi32(m1, j->corr + c1);
        const __m512 sc0 = _mm512_maskz_loadu_ps(m0, j->scale + c0), sc1 = _mm512_maskz_loadu_ps(m1, j->scale + c1);
        for (Py_ssize_t r = j->r0; r < j->r1; r += 4) {
            const Py_ssize_t mr = j->r1 - r < 4 ? j->r1 - r : 4;
            const qg_word *x0 = (const qg_word *)(j->xu + r * kp);
            const qg_word *x1 = mr > 1 ? x0 + k4 : x0, *x2 = mr > 2 ? x0 + 2 * k4 : x0, *x3 = mr > 3 ? x0 + 3 * k4 : x0;
            __m512i a00 = _mm512_setzero_si512(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                    a31 = a00;
            for (Py_ssize_t q = 0; q < k4; q++) {
                const __m512i wa = _mm512_loadu_si512(w0 + 64 * q), wb = _mm512_loadu_si512(w1 + 64 * q);
                __m512i v = _mm512_set1_epi32(x0[q]);
                a00 = _mm512_dpbusd_epi32(a00, v, wa);
                a01 = _mm512_dpbusd_epi32(a01, v, wb);
                v = _mm512_set1_epi32(x1[q]);
                a10 = _mm512_dpbusd_epi32(a10, v, wa);
                a11 = _mm512_dpbusd_epi32(a11, v, wb);
                v = _mm512_set1_epi32(x2[q]);
                a20 = _mm512_dpbusd_epi32(a20, v, wa);
                a21 = _mm512_dpbusd_epi32(a21, v, wb);
                v = _mm512_set1_epi32(x3[q]);
                a30 = _mm512_dpbusd_epi32(a30, v, wa);
                a31 = _mm512_dpbusd_epi32(a31, v, wb);
            }
            const __m512i acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
            for (Py_ssize_t i = 0; i < mr; i++) {
                int8_t *o = j->out + (r + i) * n;
                qgemm_store(acc[i][0], corr0, sc0, o + c0, m0, lo, hi, zp);
                if (two) qgemm_store(acc[i][1], corr1, sc1, o + c1, m1, lo, hi, zp);
            }
        }
    }
}
/* requantizes 8 channels' sums (the first cnt) into o: qgemm_store's math on AVX2 (no byte
 * narrowing store there: through an int32 row) */
__attribute__((target("arch=x86-64-v3"))) static inline void qrequant8_v3(__m256i sums, const float *scale, float lo,
                                                                         float hi, int zp, int8_t *o, Py_ssize_t cnt) {
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_loadu_ps(scale));
    f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
    int32_t q[8];
    _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(f)); /* rint: the default rounding mode */
    for (Py_ssize_t l = 0; l < cnt; l++) o[l] = (int8_t)(q[l] + zp);
}

/* AVX2 without VNNI: each row as int16 (x + 128) in the caller's scratch (twice the bytes: a
 * gathered patch lands in the row's upper half first), four of a row's values broadcast as
 * int16 and multiplied with four channels' four int8 weights sign-extended to int16 by
 * vpmaddwd (exact int32 sums of pairs), the pairs joined at the end; 2 rows x 16 channels per
 * tile (8 accumulators, the 16 registers' worth). */
__attribute__((target("arch=x86-64-v3"))) static inline void qgemm_store_avx2(const qgemm_job *j, __m256i a0, __m256i a1,
                                                                            __m256i a2, __m256i a3, const int32_t *corr,
                                                                            const float *scale, int8_t *o, Py_ssize_t cnt) {
    /* pair sums of channels 0-3 / 4-7 / 8-11 / 12-15 -> channels 0-7, 8-15 in order */
    const __m256i h0 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0, a1), 0xD8);
    const __m256i h1 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a2, a3), 0xD8);
    const __m256i s0 = _mm256_add_epi32(h0, _mm256_loadu_si256((const __m256i *)corr));
    qrequant8_v3(s0, scale, j->lo, j->hi, j->zp, o, cnt < 8 ? cnt : 8);
    if (cnt > 8)
        qrequant8_v3(_mm256_add_epi32(h1, _mm256_loadu_si256((const __m256i *)(corr + 8))), scale + 8, j->lo, j->hi,
                     j->zp, o + 8, cnt - 8);
}

__attribute__((target("arch=x86-64-v3"))) static void qgemm_rows_avx2(const qgemm_job *j) {
    const Py_ssize_t k4 = j->k4, kp = 4 * k4, n = j->n, nb = (n + 15) / 16, k = j->k;
    for (Py_ssize_t r = j->r0; r < j->r1; r++) { /* the part's rows as int16 x + 128, zero-padded to kp */
        int16_t *row = (int16_t *)(j->xu + 2 * r * kp);
        const int8_t *xr = j->x + r * k;
        if (j->geo) { /* gathered into the row's upper half, widened from the front (never ahead of it) */
            qgemm_gather(j, r, (int8_t *)row + kp);
            xr = (const int8_t *)row + kp;
        }
        for (Py_ssize_t i = 0; i < k; i++) row[i] = (int16_t)((uint8_t)xr[i] ^ 0x80u);
        for (Py_ssize_t i = k; i < kp; i++) row[i] = 0;
    }
    const int grouped = j->goc != 0;
    const Py_ssize_t tw = grouped ? j->gic / 4 : 0, cw = grouped ? j->geo->C / 4 : 0, kq = grouped ? j->gk4 : k4;
    for (Py_ssize_t b = 0; b < nb; b++) {
        const Py_ssize_t c0 = 16 * b, cnt = n - c0 < 16 ? n - c0 : 16;
        const int8_t *wb = j->wp + b * kq * 64;
        int32_t corr[16] = {0};
        float scale[16] = {0};
        memcpy(corr, j->corr + c0, (size_t)cnt * sizeof(int32_t));
        memcpy(scale, j->scale + c0, (size_t)cnt * sizeof(float));
        /* grouped: the words of lanes 0-7 and 8-15 (two groups of 8, or one group) */
        const Py_ssize_t gw0 = grouped ? (c0 / j->goc) * tw : 0;
        const Py_ssize_t gw1 = grouped && j->goc == 8 && c0 + 8 < n ? gw0 + tw : gw0;
        for (Py_ssize_t r = j->r0; r < j->r1; r += 2) {
            const int two = r + 1 < j->r1;
            const int16_t *x0 = (const int16_t *)(j->xu + 2 * r * kp), *x1 = two ? x0 + kp : x0;
            __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                    a13 = a00;
            Py_ssize_t tap = 0, h = 0;
            for (Py_ssize_t q = 0; q < kq; q++) {
                const int8_t *wq = wb + 64 * q;
                const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wq));
                const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wq + 16)));
                const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wq + 32)));
                const __m256i w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wq + 48)));
                const Py_ssize_t o0 = grouped ? 4 * (tap + h + gw0) : 4 * q, o1 = grouped ? 4 * (tap + h + gw1) : 4 * q;
                int64_t v;
                memcpy(&v, x0 + o0, 8);
                __m256i a = _mm256_set1_epi64x(v);
                a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(a, w0));
                a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(a, w1));
                if (o1 != o0) {
                    memcpy(&v, x0 + o1, 8);
                    a = _mm256_set1_epi64x(v);
                }
                a02 = _mm256_add_epi32(a02, _mm256_madd_epi16(a, w2));
                a03 = _mm256_add_epi32(a03, _mm256_madd_epi16(a, w3));
                memcpy(&v, x1 + o0, 8);
                a = _mm256_set1_epi64x(v);
                a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(a, w0));
                a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(a, w1));
                if (o1 != o0) {
                    memcpy(&v, x1 + o1, 8);
                    a = _mm256_set1_epi64x(v);
                }
                a12 = _mm256_add_epi32(a12, _mm256_madd_epi16(a, w2));
                a13 = _mm256_add_epi32(a13, _mm256_madd_epi16(a, w3));
                if (grouped && ++h == tw) {
                    h = 0;
                    tap += cw;
                }
            }
            qgemm_store_avx2(j, a00, a01, a02, a03, corr, scale, j->out + r * n + c0, cnt);
            if (two) qgemm_store_avx2(j, a10, a11, a12, a13, corr, scale, j->out + (r + 1) * n + c0, cnt);
        }
    }
}
#endif

static void (*qgemm_rows)(const qgemm_job *) = qgemm_rows_plain;
static int qgemm_vnni = 0, qgemm_avx2 = 0;
static Py_ssize_t qgemm_xu_bytes = 1; /* bytes of xu per row element: 2 for the AVX2 copy's int16 rows */

static void *qgemm_part(void *arg) {
    qgemm_rows((const qgemm_job *)arg);
    return NULL;
}

/* checks the buffers of a qs8_gemm / qs8_conv call (x holds x_count int8) and runs it */
static int qgemm_call(const char *name, Py_buffer *x, Py_buffer *xu, Py_buffer *wp, Py_buffer *corr, Py_buffer *sc,
                      Py_buffer *out, Py_ssize_t rows, Py_ssize_t k_, Py_ssize_t n_, float lo, float hi, int zp,
                      const qconv_geo *geo, Py_ssize_t x_count, Py_ssize_t gic, Py_ssize_t goc) {
    if (rows < 1 || rows > ((Py_ssize_t)1 << 30) || k_ < 1 || k_ > QDOT_MAX_K || n_ < 1 || n_ > ((Py_ssize_t)1 << 24) ||
        !(lo <= hi) || zp < -128 || zp > 127) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes, bounds or zero point", name);
        return 0;
    }
    const Py_ssize_t k4 = (k_ + 3) / 4, nb = (n_ + 15) / 16;
    const Py_ssize_t gk4 = goc ? geo->kh * geo->kw * gic / 4 : 0; /* a group's words (the caller checked gic % 4) */
    if (!(need_i8(x, x_count, "x") && need_i8(xu, rows * 4 * k4 * qgemm_xu_bytes, "xu") && need_i8(wp, nb * (goc ? gk4 : k4) * 64, "w") &&
          need_i8(out, rows * n_, "out") && need(corr, n_, "corr") && need(sc, n_, "scale")))
        return 0;
    if (overlaps(xu, x) || overlaps(xu, wp) || overlaps(xu, corr) || overlaps(xu, sc) || overlaps(xu, out) ||
        overlaps(out, x) || overlaps(out, wp) || overlaps(out, corr) || overlaps(out, sc)) {
        PyErr_Format(PyExc_ValueError, "%s: xu or out overlaps an operand", name);
        return 0;
    }
    const Py_ssize_t tiles = (rows + 3) / 4;
    const int nparts = parts_for(rows * k_ * n_, tiles);
    qgemm_job jobs[MAX_PARTS];
    for (int p = 0; p < nparts; p++) {
        qgemm_job j = {(const int8_t *)x->buf, (uint8_t *)xu->buf, (const int8_t *)wp->buf, (const int32_t *)corr->buf,
                       (const float *)sc->buf, (int8_t *)out->buf, k_, k4, n_, 4 * part_start(tiles, p, nparts),
                       4 * part_start(tiles, p + 1, nparts), lo, hi, zp, geo, gic, goc, gk4};
        if (j.r1 > rows) j.r1 = rows;
        jobs[p] = j;
    }
    Py_BEGIN_ALLOW_THREADS
    run_parts(qgemm_part, jobs, sizeof jobs[0], nparts);
    Py_END_ALLOW_THREADS
    return 1;
}

static PyObject *qgemm_release(int ok, Py_buffer *x, Py_buffer *xu, Py_buffer *wp, Py_buffer *corr, Py_buffer *sc,
                               Py_buffer *out) {
    PyBuffer_Release(x);
    PyBuffer_Release(xu);
    PyBuffer_Release(wp);
    PyBuffer_Release(corr);
    PyBuffer_Release(sc);
    PyBuffer_Release(out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_qs8_gemm(PyObject *self, PyObject *args) {
    Py_buffer x, xu, wp, corr, sc, out;
    Py_ssize_t rows, k_, n_;
    int zp;
    float lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*y*y*w*nnnffi", &x, &xu, &wp, &corr, &sc, &out, &rows, &k_, &n_, &lo, &hi, &zp))
        return NULL;
    const Py_ssize_t x_count = rows >= 0 && k_ >= 0 ? prod4(rows, k_, 1, 1) : -1;
    const int ok = qgemm_call("qs8_gemm", &x, &xu, &wp, &corr, &sc, &out, rows, k_, n_, lo, hi, zp, NULL, x_count, 0, 0);
    return qgemm_release(ok, &x, &xu, &wp, &corr, &sc, &out);
}

static PyObject *py_qs8_conv(PyObject *self, PyObject *args) {
    Py_buffer x, xu, wp, corr, sc, out;
    Py_ssize_t nn, n_;
    qconv_geo g;
    int zp;
    float lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*y*y*w*nnnnnnnnnnnnnnniffi", &x, &xu, &wp, &corr, &sc, &out, &nn, &g.H, &g.W,
                          &g.C, &g.kh, &g.kw, &g.sh, &g.sw, &g.pt, &g.pl, &g.dh, &g.dw, &g.Ho, &g.Wo, &n_, &g.zx, &lo,
                          &hi, &zp))
        return NULL;
    int ok = 1;
    if (!qgeo_ok(nn, g.H, g.W, g.C, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.Ho, g.Wo) || g.zx < -128 ||
        g.zx > 127) {
        PyErr_SetString(PyExc_ValueError, "qs8_conv: inconsistent geometry or zero point");
        ok = 0;
    }
    ok = ok && qgemm_call("qs8_conv", &x, &xu, &wp, &corr, &sc, &out, prod4(nn, g.Ho, g.Wo, 1),
                          prod4(g.kh, g.kw, g.C, 1), n_, lo, hi, zp, &g, prod4(nn, g.H, g.W, g.C), 0, 0);
    return qgemm_release(ok, &x, &xu, &wp, &corr, &sc, &out);
}

static PyObject *py_qs8_gconv(PyObject *self, PyObject *args) {
    Py_buffer x, xu, wp, corr, sc, out;
    Py_ssize_t nn, groups, goc;
    qconv_geo g;
    int zp;
    float lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*y*y*w*nnnnnnnnnnnnnnnniffi", &x, &xu, &wp, &corr, &sc, &out, &nn, &g.H, &g.W,
                          &g.C, &g.kh, &g.kw, &g.sh, &g.sw, &g.pt, &g.pl, &g.dh, &g.dw, &g.Ho, &g.Wo, &groups, &goc,
                          &g.zx, &lo, &hi, &zp))
        return NULL;
    int ok = 1;
    if (!qgeo_ok(nn, g.H, g.W, g.C, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.Ho, g.Wo) || g.zx < -128 ||
        g.zx > 127 || groups < 1 ||
        groups > g.C || g.C % groups || (g.C / groups) % 4 || !(goc == 8 || (goc >= 16 && goc % 16 == 0)) ||
        goc > ((Py_ssize_t)1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "qs8_gconv: inconsistent geometry, groups or zero point (input channels "
                                          "per group a multiple of 4; output channels per group 8 or a multiple of 16)");
        ok = 0;
    }
    ok = ok && qgemm_call("qs8_gconv", &x, &xu, &wp, &corr, &sc, &out, prod4(nn, g.Ho, g.Wo, 1),
                          prod4(g.kh, g.kw, g.C, 1), prod4(groups, goc, 1, 1), lo, hi, zp, &g, prod4(nn, g.H, g.W, g.C),
                          g.C / groups, goc);
    return qgemm_release(ok, &x, &xu, &wp, &corr, &sc, &out);
}

/* qs8_gemm's operands from an int8 filter w (n, k), read once: the filter packed as the kernel reads it
 * (element [b, q, l, t] = w[16 b + l, 4 q + t], 0 past the ends) and the per-channel correction
 * corr[j] = bias[j] + zc * sum_k w[j, k] taken modulo 2^32 as the kernel's sums are (zc = -(128 + zx): the
 * rows enter as x ^ 0x80 = x + 128, so the zero point and the 128 come out through it). */
static PyObject *py_qs8_pack_gemm(PyObject *self, PyObject *args) {
    Py_buffer w, wp, corr, b;
    PyObject *bias_obj;
    Py_ssize_t n_, k_;
    int zc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnOiw*w*", &w, &n_, &k_, &bias_obj, &zc, &wp, &corr)) return NULL;
    int have_bias = bias_obj != Py_None, ok = 1;
    if (have_bias && PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_bias = 0;
    }
    const Py_ssize_t k4 = (k_ + 3) / 4, nb = (n_ + 15) / 16;
    if (ok && (n_ < 1 || n_ > ((Py_ssize_t)1 << 24) || k_ < 1 || k_ > QDOT_MAX_K || zc < -255 || zc > 0)) {
        PyErr_SetString(PyExc_ValueError, "qs8_pack_gemm: sizes or zero point out of range");
        ok = 0;
    }
    ok = ok && need_i8(&w, prod4(n_, k_, 1, 1), "w") && need_i8(&wp, prod4(nb, k4, 64, 1), "packed") &&
         need(&corr, n_, "corr") && (!have_bias || need(&b, n_, "bias"));
    if (ok && (overlaps(&wp, &w) || overlaps(&corr, &w) || overlaps(&corr, &wp) ||
               (have_bias && (overlaps(&wp, &b) || overlaps(&corr, &b))))) {
        PyErr_SetString(PyExc_ValueError, "qs8_pack_gemm: an output overlaps an operand");
        ok = 0;
    }
    if (ok) {
        const int8_t *src = (const int8_t *)w.buf;
        int8_t *dst = (int8_t *)wp.buf;
        int32_t *cr = (int32_t *)corr.buf;
        const int32_t *bias = have_bias ? (const int32_t *)b.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        const Py_ssize_t kw = k_ / 4; /* whole words of a row */
        for (Py_ssize_t bb = 0; bb < nb; bb++) {
            Py_ssize_t q0 = 0;
#ifdef __SSE2__
            /* a block of 16 whole rows: 4 words of 4 rows at a time, a 4 x 4 transpose of words */
            if (bb * 16 + 16 <= n_)
                for (; q0 + 4 <= kw; q0 += 4)
                    for (Py_ssize_t g = 0; g < 4; g++) {
                        const int8_t *r = src + (bb * 16 + 4 * g) * k_ + q0 * 4;
                        const __m128i a = _mm_loadu_si128((const __m128i *)r);
                        const __m128i b1 = _mm_loadu_si128((const __m128i *)(r + k_));
                        const __m128i c1 = _mm_loadu_si128((const __m128i *)(r + 2 * k_));
                        const __m128i d1 = _mm_loadu_si128((const __m128i *)(r + 3 * k_));
                        const __m128i ab0 = _mm_unpacklo_epi32(a, b1), ab1 = _mm_unpackhi_epi32(a, b1);
                        const __m128i cd0 = _mm_unpacklo_epi32(c1, d1), cd1 = _mm_unpackhi_epi32(c1, d1);
                        int8_t *o = dst + ((bb * k4 + q0) * 16 + 4 * g) * 4;
                        _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi64(ab0, cd0));
                        _mm_storeu_si128((__m128i *)(o + 64), _mm_unpackhi_epi64(ab0, cd0));
                        _mm_storeu_si128((__m128i *)(o + 128), _mm_unpacklo_epi64(ab1, cd1));
                        _mm_storeu_si128((__m128i *)(o + 192), _mm_unpackhi_epi64(ab1, cd1));
                    }
#endif
            for (Py_ssize_t q = q0; q < k4; q++)
                for (Py_ssize_t l = 0; l < 16; l++) {
                    const Py_ssize_t j = bb * 16 + l;
                    int8_t *d = dst + ((bb * k4 + q) * 16 + l) * 4;
                    if (j < n_ && q < kw) {
                        memcpy(d, src + j * k_ + q * 4, 4);
                    } else {
                        memset(d, 0, 4);
                        for (Py_ssize_t t = 0; j < n_ && q * 4 + t < k_; t++) d[t] = src[j * k_ + q * 4 + t];
                    }
                }
        }
        for (Py_ssize_t j = 0; j < n_; j++) {
            const int8_t *row = src + j * k_;
            int32_t sum = 0; /* |sum| <= 128 k <= 2^23 */
            for (Py_ssize_t q = 0; q < k_; q++) sum += row[q];
            /* |zc sum| <= 255 * 2^23: int64 holds it with the bias; the kernel's sums wrap at 2^32 */
            const int64_t c = (bias ? (int64_t)bias[j] : 0) + (int64_t)zc * sum;
            cr[j] = (int32_t)(uint32_t)(uint64_t)c;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&wp);
    PyBuffer_Release(&corr);
    if (have_bias) PyBuffer_Release(&b);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 depthwise convolution (depth multiplier 1), NHWC: out[n, oy, ox, c] =
 * requant(bias[c] + sum over the taps inside the image of (x[n, iy, ix, c] - zx) * w[i, j, c]),
 * iy = oy sh - pt + i dh, ix = ox sw - pl + j dw; taps outside read the zero point, i.e. add
 * nothing. The sums run in float32 over the int8 values (exact while kh kw <= 514: every
 * partial sum is an integer below 2^24, the caller's bound), then join the int32 bias as
 * int32 (the caller bounds it) before XNNPACK's requantization: bit-equal to requant_qs8 over
 * exact sums. One pass from int8 to int8, a row of output pixels at a time. ---- */
typedef struct {
    const int8_t *x;
    const float *w; /* (kh kw, C) */
    const int32_t *bias;
    const float *scale;
    int8_t *out;
    float *acc; /* C accumulators of the part's own */
    Py_ssize_t H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, r0, r1; /* rows: n Ho + oy */
    float lo, hi;
    int zx, zp;
} qdw_job;

/* one row of output pixels (r = n Ho + oy), each a pass per tap over its channels */
ORCH_CLONES
static void qdw_row(const qdw_job *j, Py_ssize_t r) {
    const Py_ssize_t C = j->C, nn = r / j->Ho, oy = r % j->Ho;
    const int8_t *img = j->x + nn * j->H * j->W * C;
    int8_t *orow = j->out + r * j->Wo * C;
    float *restrict acc = j->acc;
    const float zx = (float)j->zx, lo = j->lo, hi = j->hi;
    const int32_t *restrict bias = j->bias;
    const float *restrict scale = j->scale;
    for (Py_ssize_t ox = 0; ox < j->Wo; ox++) {
        for (Py_ssize_t c = 0; c < C; c++) acc[c] = 0.0f;
        for (Py_ssize_t i = 0; i < j->kh; i++) {
            const Py_ssize_t iy = oy * j->sh - j->pt + i * j->dh;
            if (iy < 0 || iy >= j->H) continue;
            for (Py_ssize_t jj = 0; jj < j->kw; jj++) {
                const Py_ssize_t ix = ox * j->sw - j->pl + jj * j->dw;
                if (ix < 0 || ix >= j->W) continue;
                const int8_t *restrict xp = img + (iy * j->W + ix) * C;
                const float *restrict wp = j->w + (i * j->kw + jj) * C;
                for (Py_ssize_t c = 0; c < C; c++) acc[c] += ((float)xp[c] - zx) * wp[c];
            }
        }
        int8_t *restrict o = orow + ox * C;
        for (Py_ssize_t c = 0; c < C; c++) {
            float v = (float)((int32_t)acc[c] + (bias ? bias[c] : 0)) * scale[c];
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            o[c] = (int8_t)((int)__builtin_rintf(v) + j->zp);
        }
    }
}

#ifdef ORCH_X86_DISPATCH
/* Output pixel ox's taps inside the image: their offsets into the image row block and the filter */
static Py_ssize_t qdw_taps(const qdw_job *j, Py_ssize_t oy, Py_ssize_t ox, Py_ssize_t *xo, Py_ssize_t *wo) {
    Py_ssize_t nt = 0;
    for (Py_ssize_t i = 0; i < j->kh; i++) {
        const Py_ssize_t iy = oy * j->sh - j->pt + i * j->dh;
        if (iy < 0 || iy >= j->H) continue;
        for (Py_ssize_t jj = 0; jj < j->kw; jj++) {
            const Py_ssize_t ix = ox * j->sw - j->pl + jj * j->dw;
            if (ix < 0 || ix >= j->W) continue;
            xo[nt] = (iy * j->W + ix) * j->C;
            wo[nt++] = (i * j->kw + jj) * j->C;
        }
    }
    return nt;
}

/* requantizes one vector of channels c.. of output pixel o (mask m) */
__attribute__((target("arch=x86-64-v4"))) static inline void qdw_store_v4(const qdw_job *j, __m512 a, Py_ssize_t c,
                                                                         __mmask16 m, int8_t *o) {
    const __m512i bias = j->bias ? _mm512_maskz_loadu_epi32(m, j->bias + c) : _mm512_setzero_si512();
    /* the float sums are integers: exact as int32 */
    qgemm_store(_mm512_cvtps_epi32(a), bias, _mm512_maskz_loadu_ps(m, j->scale + c), o + c, m, _mm512_set1_ps(j->lo),
                _mm512_set1_ps(j->hi), _mm512_set1_epi32(j->zp));
}

__attribute__((target("arch=x86-64-v4"))) static inline __m512 qdw_load_v4(const int8_t *p, __mmask16 m, __m512 zx) {
    return _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p))), zx);
}

/* QDW_PX output pixels of one row whose taps are all inside, one vector of channels at a
 * time: each input column a tap row reads converted once into registers (a window) and
 * used by every tap and pixel that reads it; KW, SW, DW constants (one copy each) */
#define QDW_PX 4
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void qdw_block_v4(
    const qdw_job *j, const int8_t *x0, const Py_ssize_t *roff, const Py_ssize_t *ri, Py_ssize_t nr, int8_t *o,
    const int KW, const int SW, const int DW) {
    const Py_ssize_t C = j->C;
    const __m512 zx = _mm512_set1_ps((float)j->zx);
    for (Py_ssize_t c = 0; c < C; c += 16) {
        const __mmask16 m = qgemm_mask(C - c);
        __m512 a[QDW_PX];
        for (int p = 0; p < QDW_PX; p++) a[p] = _mm512_setzero_ps();
        for (Py_ssize_t r = 0; r < nr; r++) {
            const int8_t *xr = x0 + roff[r] + c;
            const float *wr = j->w + ri[r] * KW * C + c;
            __m512 win[(QDW_PX - 1) * SW + (KW - 1) * DW + 1];
            for (int q = 0; q < (QDW_PX - 1) * SW + (KW - 1) * DW + 1; q++) win[q] = qdw_load_v4(xr + q * C, m, zx);
            for (int jj = 0; jj < KW; jj++) {
                const __m512 wv = _mm512_maskz_loadu_ps(m, wr + jj * C);
                for (int p = 0; p < QDW_PX; p++) a[p] = _mm512_fmadd_ps(win[p * SW + jj * DW], wv, a[p]);
            }
        }
        for (int p = 0; p < QDW_PX; p++) qdw_store_v4(j, a[p], c, m, o + p * C);
    }
}

/* one output pixel, any geometry: its own tap list, a vector of channels at a time */
__attribute__((target("arch=x86-64-v4"))) static void qdw_pixel_v4(const qdw_job *j, const int8_t *img, Py_ssize_t oy,
                                                                   Py_ssize_t ox, int8_t *o) {
    Py_ssize_t xo[514], wo[514]; /* kh kw <= 514 */
    const Py_ssize_t nt = qdw_taps(j, oy, ox, xo, wo), C = j->C;
    const __m512 zx = _mm512_set1_ps((float)j->zx);
    for (Py_ssize_t c = 0; c < C; c += 16) {
        const __mmask16 m = qgemm_mask(C - c);
        __m512 a = _mm512_setzero_ps();
        for (Py_ssize_t t = 0; t < nt; t++)
            a = _mm512_fmadd_ps(qdw_load_v4(img + xo[t] + c, m, zx), _mm512_maskz_loadu_ps(m, j->w + wo[t] + c), a);
        qdw_store_v4(j, a, c, m, o);
    }
}

/* one output row: blocks of QDW_PX pixels whose taps are all inside (3x3 and 5x5 at strides 1
 * and 2), single pixels elsewhere; one copy per instruction set */
#define QDW_ROW(NAME, ATTR)                                                                                           \
    ATTR static void qdw_row_##NAME(const qdw_job *j, Py_ssize_t r) {                                              \
        const Py_ssize_t C = j->C, nn = r / j->Ho, oy = r % j->Ho;                                                   \
        const int8_t *img = j->x + nn * j->H * j->W * C;                                                             \
        int8_t *orow = j->out + r * j->Wo * C;                                                                       \
        const int kind = j->dw != 1 ? 0 : j->kw == 3 ? (j->sw == 1 ? 1 : j->sw == 2 ? 2 : 0)                         \
                                         : j->kw == 5 ? (j->sw == 1 ? 3 : j->sw == 2 ? 4 : 0) : 0;                   \
        /* the columns whose every tap is inside: ox in [in0, in1) */                                                \
        Py_ssize_t in0 = j->pl > 0 ? (j->pl + j->sw - 1) / j->sw : 0;                                                \
        Py_ssize_t in1 = j->W - 1 + j->pl - (j->kw - 1) * j->dw; /* ox sw <= this */                                 \
        in1 = in1 < 0 ? 0 : in1 / j->sw + 1;                                                                         \
        if (in1 > j->Wo) in1 = j->Wo;                                                                                \
        if (in0 > in1) in0 = in1;                                                                                    \
        Py_ssize_t roff[514], ri[514], nr = 0; /* the tap rows inside: their image rows' offsets, their index */     \
        for (Py_ssize_t i = 0; i < j->kh; i++) {                                                                     \
            const Py_ssize_t iy = oy * j->sh - j->pt + i * j->dh;                                                    \
            if (iy >= 0 && iy < j->H) {                                                                              \
                roff[nr] = iy * j->W * C;                                                                            \
                ri[nr++] = i;                                                                                        \
            }                                                                                                        \
        }                                                                                                            \
        for (Py_ssize_t ox = 0; ox < j->Wo;) {                                                                       \
            if (kind && ox >= in0 && in1 - ox >= QDW_PX) {                                                           \
                const int8_t *x0 = img + (ox * j->sw - j->pl) * C;                                                   \
                int8_t *o = orow + ox * C;                                                                           \
                switch (kind) {                                                                                      \
                case 1: qdw_block_##NAME(j, x0, roff, ri, nr, o, 3, 1, 1); break;                                    \
                case 2: qdw_block_##NAME(j, x0, roff, ri, nr, o, 3, 2, 1); break;                                    \
                case 3: qdw_block_##NAME(j, x0, roff, ri, nr, o, 5, 1, 1); break;                                    \
                default: qdw_block_##NAME(j, x0, roff, ri, nr, o, 5, 2, 1); break;                                   \
                }                                                                                                    \
                ox += QDW_PX;                                                                                        \
            } else {                                                                                                 \
                qdw_pixel_##NAME(j, img, oy, ox, orow + ox * C);                                                     \
                ox++;                                                                                                \
            }                                                                                                        \
        }                                                                                                            \
    }

QDW_ROW(v4, __attribute__((target("arch=x86-64-v4"))))

/* AVX2: 8 channels a vector, channel counts a multiple of 8 (others take the plain copy) */
__attribute__((target("arch=x86-64-v3"))) static inline void qdw_store_v3(const qdw_job *j, __m256 a, Py_ssize_t c,
                                                                         int8_t *o) {
    __m256i t = _mm256_cvtps_epi32(a); /* an integer: exact */
    if (j->bias) t = _mm256_add_epi32(t, _mm256_loadu_si256((const __m256i *)(j->bias + c)));
    qrequant8_v3(t, j->scale + c, j->lo, j->hi, j->zp, o + c, 8);
}

__attribute__((target("arch=x86-64-v3"))) static inline __m256 qdw_load_v3(const int8_t *p, __m256 zx) {
    return _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))), zx);
}

__attribute__((target("arch=x86-64-v3"))) static inline __attribute__((always_inline)) void qdw_block_v3(
    const qdw_job *j, const int8_t *x0, const Py_ssize_t *roff, const Py_ssize_t *ri, Py_ssize_t nr, int8_t *o,
    const int KW, const int SW, const int DW) {
    const Py_ssize_t C = j->C;
    const __m256 zx = _mm256_set1_ps((float)j->zx);
    for (Py_ssize_t c = 0; c < C; c += 8) {
        __m256 a[QDW_PX];
        for (int p = 0; p < QDW_PX; p++) a[p] = _mm256_setzero_ps();
        for (Py_ssize_t r = 0; r < nr; r++) {
            const int8_t *xr = x0 + roff[r] + c;
            const float *wr = j->w + ri[r] * KW * C + c;
            __m256 win[(QDW_PX - 1) * SW + (KW - 1) * DW + 1];
            for (int q = 0; q < (QDW_PX - 1) * SW + (KW - 1) * DW + 1; q++) win[q] = qdw_load_v3(xr + q * C, zx);
            for (int jj = 0; jj < KW; jj++) {
                const __m256 wv = _mm256_loadu_ps(wr + jj * C);
                for (int p = 0; p < QDW_PX; p++) a[p] = _mm256_fmadd_ps(win[p * SW + jj * DW], wv, a[p]);
            }
        }
        for (int p = 0; p < QDW_PX; p++) qdw_store_v3(j, a[p], c, o + p * C);
    }
}

__attribute__((target("arch=x86-64-v3"))) static void qdw_pixel_v3(const qdw_job *j, const int8_t *img, Py_ssize_t oy,
                                                                   Py_ssize_t ox, int8_t *o) {
    Py_ssize_t xo[514], wo[514]; /* kh kw <= 514 */
    const Py_ssize_t nt = qdw_taps(j, oy, ox, xo, wo), C = j->C;
    const __m256 zx = _mm256_set1_ps((float)j->zx);
    for (Py_ssize_t c = 0; c < C; c += 8) {
        __m256 a = _mm256_setzero_ps();
        for (Py_ssize_t t = 0; t < nt; t++)
            a = _mm256_fmadd_ps(qdw_load_v3(img + xo[t] + c, zx), _mm256_loadu_ps(j->w + wo[t] + c), a);
        qdw_store_v3(j, a, c, o);
    }
}

QDW_ROW(v3, __attribute__((target("arch=x86-64-v3"))))
#endif

static void (*qdw_rows)(const qdw_job *, Py_ssize_t) = qdw_row;
static void (*qdw_rows8)(const qdw_job *, Py_ssize_t) = qdw_row; /* channel counts a multiple of 8 */
static int qdw_avx512 = 0, qdw_avx2 = 0;

static void *qdw_part(void *arg) {
    const qdw_job *j = (const qdw_job *)arg;
    void (*row)(const qdw_job *, Py_ssize_t) = j->C % 8 == 0 ? qdw_rows8 : qdw_rows;
    for (Py_ssize_t r = j->r0; r < j->r1; r++) row(j, r);
    return NULL;
}

static PyObject *py_dwconv_qs8(PyObject *self, PyObject *args) {
    Py_buffer x, w, sc, out, b = {0};
    PyObject *bias_obj;
    Py_ssize_t nn;
    qdw_job g;
    memset(&g, 0, sizeof g);
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Oy*w*nnnnnnnnnnnnnniffi", &x, &w, &bias_obj, &sc, &out, &nn, &g.H, &g.W, &g.C,
                          &g.kh, &g.kw, &g.sh, &g.sw, &g.pt, &g.pl, &g.dh, &g.dw, &g.Ho, &g.Wo, &g.zx, &g.lo, &g.hi,
                          &g.zp))
        return NULL;
    const int have_bias = bias_obj != Py_None;
    int ok = !have_bias || PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) == 0;
    if (ok && (!qgeo_ok(nn, g.H, g.W, g.C, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.Ho, g.Wo) ||
               g.kh * g.kw > 514 || g.zx < -128 || g.zx > 127 ||
               g.zp < -128 || g.zp > 127 || !(g.lo <= g.hi))) {
        PyErr_SetString(PyExc_ValueError, "dwconv_qs8: inconsistent geometry, bounds or zero points");
        ok = 0;
    }
    const Py_ssize_t taps = ok ? g.kh * g.kw : 0;
    ok = ok && need_i8(&x, prod4(nn, g.H, g.W, g.C), "x") && need(&w, prod4(taps, g.C, 1, 1), "w") &&
         need(&sc, g.C, "scale") && need_i8(&out, prod4(nn, g.Ho, g.Wo, g.C), "out") &&
         (!have_bias || need(&b, g.C, "bias"));
    if (ok && (overlaps(&out, &x) || overlaps(&out, &w) || overlaps(&out, &sc) || (have_bias && overlaps(&out, &b)))) {
        PyErr_SetString(PyExc_ValueError, "dwconv_qs8: out overlaps an operand");
        ok = 0;
    }
    const Py_ssize_t rows = ok ? nn * g.Ho : 0;
    const int nparts = ok ? parts_for(prod4(rows, g.Wo, g.C, taps), rows) : 1;
    float *accs = NULL;
    if (ok && !(accs = (float *)malloc((size_t)nparts * (size_t)g.C * sizeof(float)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        g.x = (const int8_t *)x.buf;
        g.w = (const float *)w.buf;
        g.bias = have_bias ? (const int32_t *)b.buf : NULL;
        g.scale = (const float *)sc.buf;
        g.out = (int8_t *)out.buf;
        qdw_job jobs[MAX_PARTS];
        for (int p = 0; p < nparts; p++) {
            jobs[p] = g;
            jobs[p].acc = accs + (size_t)p * (size_t)g.C;
            jobs[p].r0 = part_start(rows, p, nparts);
            jobs[p].r1 = part_start(rows, p + 1, nparts);
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(qdw_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    free(accs);
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (have_bias && b.obj) PyBuffer_Release(&b);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- byte lookup: out[i] = table[x[i]] for n bytes (a quantized value's elementwise float
 * island as one table; backends/xnnpack). AVX-512 VBMI: 64 bytes per four permutes. ---- */
typedef struct {
    const uint8_t *x, *table;
    uint8_t *out;
    Py_ssize_t i0, i1;
} lut_job;

static void lut_span(const uint8_t *x, const uint8_t *table, uint8_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = table[x[i]];
}

#ifdef ORCH_X86_DISPATCH
__attribute__((target("arch=x86-64-v4,avx512vbmi"))) static void lut_span_vbmi(const uint8_t *x, const uint8_t *table,
                                                                             uint8_t *out, Py_ssize_t n) {
    const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
    const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
    for (Py_ssize_t i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - i)) - 1;
        const __m512i v = _mm512_maskz_loadu_epi8(m, x + i);
        const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1); /* entries 0..127 by the low 7 bits */
        const __m512i hi = _mm512_permutex2var_epi8(t2, v, t3); /* 128..255 */
        _mm512_mask_storeu_epi8(out + i, m, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
}
#endif

static void (*lut_run)(const uint8_t *, const uint8_t *, uint8_t *, Py_ssize_t) = lut_span;
static int lut_vbmi = 0;

static void *lut_part(void *arg) {
    const lut_job *j = (const lut_job *)arg;
    lut_run(j->x + j->i0, j->table, j->out + j->i0, j->i1 - j->i0);
    return NULL;
}

static PyObject *py_lut_u8(PyObject *self, PyObject *args) {
    Py_buffer x, out, t;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*ny*", &x, &out, &n, &t)) return NULL;
    int ok = need_i8(&x, n, "x") && need_i8(&out, n, "out") && need_i8(&t, 256, "table");
    if (ok && (overlaps(&out, &t) || (overlaps(&out, &x) && out.buf != x.buf))) {
        PyErr_SetString(PyExc_ValueError, "lut_u8: out overlaps the table, or x other than exactly");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(n * 2, n / 16384);
        lut_job jobs[MAX_PARTS];
        for (int p = 0; p < nparts; p++) {
            lut_job j = {(const uint8_t *)x.buf, (const uint8_t *)t.buf, (uint8_t *)out.buf, run_start(n, p, nparts),
                         run_start(n, p + 1, nparts)};
            jobs[p] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(lut_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    PyBuffer_Release(&t);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 Multiply: out[n, p, c] = requant((a[n, p, c] - za) * (b[n, pb, c] - zb)) with pb = p
 * (same shapes) or 0 (b one value per image and channel: squeeze-excite's gate); the
 * product of two centred int8 values is exact in float32 (|.| <= 65025), then XNNPACK's
 * requantization with the one scale. ---- */
typedef struct {
    const int8_t *a, *b;
    int8_t *out;
    Py_ssize_t P, C, bP, r0, r1;
    int za, zb, zp;
    float scale, lo, hi;
} mulq_job;

ORCH_CLONES
static void mulq_row(const int8_t *restrict a, const int8_t *restrict b, int8_t *restrict out, Py_ssize_t C, int za,
                     int zb, float scale, float lo, float hi, int zp) {
    for (Py_ssize_t c = 0; c < C; c++) {
        float v = (float)(((int)a[c] - za) * ((int)b[c] - zb)) * scale;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[c] = (int8_t)((int)__builtin_rintf(v) + zp);
    }
}

#ifdef ORCH_X86_DISPATCH
/* mulq_row 16 lanes at a time (the clones' loops are 8 wide: GCC prefers 256-bit vectors) */
__attribute__((target("arch=x86-64-v4"))) static void mulq_row_v4(const int8_t *a, const int8_t *b, int8_t *out,
                                                                  Py_ssize_t C, int za, int zb, float scale, float lo,
                                                                  float hi, int zp) {
    const __m512i vza = _mm512_set1_epi32(za), vzb = _mm512_set1_epi32(zb), vzp = _mm512_set1_epi32(zp);
    const __m512 vs = _mm512_set1_ps(scale), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    for (Py_ssize_t c = 0; c < C; c += 16) {
        const __mmask16 m = qgemm_mask(C - c);
        const __m512i x = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, a + c)), vza);
        const __m512i y = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b + c)), vzb);
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(x, y)), vs);
        v = _mm512_min_ps(_mm512_max_ps(v, vlo), vhi);
        _mm_mask_storeu_epi8(out + c, m, _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(v), vzp)));
    }
}
#endif

static void (*mulq_rows)(const int8_t *, const int8_t *, int8_t *, Py_ssize_t, int, int, float, float, float, int) =
    mulq_row;

static void *mulq_part(void *arg) {
    const mulq_job *j = (const mulq_job *)arg;
    if (j->bP == j->P) { /* same shapes: the part's rows are one run of each operand */
        const Py_ssize_t o = j->r0 * j->C;
        mulq_rows(j->a + o, j->b + o, j->out + o, (j->r1 - j->r0) * j->C, j->za, j->zb, j->scale, j->lo, j->hi, j->zp);
        return NULL;
    }
    for (Py_ssize_t r = j->r0; r < j->r1; r++) {
        const Py_ssize_t n = r / j->P, p = r % j->P;
        const int8_t *b = j->b + (n * j->bP + (j->bP == 1 ? 0 : p)) * j->C;
        mulq_rows(j->a + r * j->C, b, j->out + r * j->C, j->C, j->za, j->zb, j->scale, j->lo, j->hi, j->zp);
    }
    return NULL;
}

static PyObject *py_mul_qs8(PyObject *self, PyObject *args) {
    Py_buffer a, b, out;
    Py_ssize_t n_, p_, c_, bp;
    int za, zb, zp;
    float scale, lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iy*iw*nnnnfffi", &a, &za, &b, &zb, &out, &n_, &p_, &c_, &bp, &scale, &lo, &hi,
                          &zp))
        return NULL;
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    int ok = 1;
    if (n_ < 1 || p_ < 1 || c_ < 1 || (bp != 1 && bp != p_) || prod4(n_, p_, c_, 1) < 0 || prod4(n_, p_, c_, 1) > lim ||
        !(lo <= hi) || za < -128 || za > 127 || zb < -128 || zb > 127 || zp < -128 || zp > 127) {
        PyErr_SetString(PyExc_ValueError, "mul_qs8: inconsistent sizes, bounds or zero points");
        ok = 0;
    }
    ok = ok && need_i8(&a, n_ * p_ * c_, "a") && need_i8(&b, n_ * bp * c_, "b") &&
         need_i8(&out, n_ * p_ * c_, "out");
    if (ok && ((a.buf != out.buf && overlaps(&a, &out)) || overlaps(&b, &out))) {
        PyErr_SetString(PyExc_ValueError, "mul_qs8: out overlaps b, or a without being it");
        ok = 0;
    }
    if (ok) {
        const Py_ssize_t rows = n_ * p_;
        const int nparts = parts_for(rows * c_ * 2, rows);
        mulq_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            mulq_job j = {(const int8_t *)a.buf, (const int8_t *)b.buf, (int8_t *)out.buf, p_, c_, bp,
                          part_start(rows, k, nparts), part_start(rows, k + 1, nparts), za, zb, zp, scale, lo, hi};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(mulq_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 global average pooling, XNNPACK's qs8 mean: int32 sums of the raw values per
 * image and channel, then (float) sum * s + yzp (two float32 roundings: no fused
 * multiply-add), rounded half to even, clamped to [lo, hi] (the output's int8 bounds). ---- */
typedef struct {
    const int8_t *x;
    int8_t *out;
    Py_ssize_t P, C, n0, n1;
    float s, yzp, lo, hi;
} gapq_job;

ORCH_CLONES
static void gapq_add_row(const int8_t *restrict row, int32_t *restrict t, Py_ssize_t m) {
    for (Py_ssize_t c = 0; c < m; c++) t[c] += row[c];
}

__attribute__((optimize("fp-contract=off")))
static void gapq_finish(const int32_t *t, int8_t *out, Py_ssize_t C, float s, float yzp, float lo, float hi) {
    for (Py_ssize_t c = 0; c < C; c++) {
        volatile float m = (float)t[c] * s; /* rounded to float32 before the add, as XNNPACK */
        float v = __builtin_rintf(m + yzp);
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[c] = (int8_t)(int)v;
    }
}

static void *gapq_part(void *arg) {
    const gapq_job *j = (const gapq_job *)arg;
    int32_t t[512];
    for (Py_ssize_t n = j->n0; n < j->n1; n++)
        for (Py_ssize_t c0 = 0; c0 < j->C; c0 += 512) { /* a block of channels at a time */
            const Py_ssize_t m = j->C - c0 < 512 ? j->C - c0 : 512;
            const int8_t *x = j->x + n * j->P * j->C + c0;
            for (Py_ssize_t c = 0; c < m; c++) t[c] = 0;
            for (Py_ssize_t p = 0; p < j->P; p++) gapq_add_row(x + p * j->C, t, m);
            gapq_finish(t, j->out + n * j->C + c0, m, j->s, j->yzp, j->lo, j->hi);
        }
    return NULL;
}

static PyObject *py_gap_qs8(PyObject *self, PyObject *args) {
    Py_buffer x, out;
    Py_ssize_t n_, p_, c_;
    float s, yzp, lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nnnffff", &x, &out, &n_, &p_, &c_, &s, &yzp, &lo, &hi)) return NULL;
    int ok = 1;
    if (n_ < 1 || p_ < 1 || c_ < 1 || p_ > ((Py_ssize_t)1 << 24) || prod4(n_, p_, c_, 1) < 0 ||
        prod4(n_, p_, c_, 1) > ((Py_ssize_t)1 << 40) || !(lo <= hi)) {
        PyErr_SetString(PyExc_ValueError, "gap_qs8: inconsistent sizes or bounds");
        ok = 0;
    }
    ok = ok && need_i8(&x, n_ * p_ * c_, "x") && need_i8(&out, n_ * c_, "out");
    if (ok && overlaps(&x, &out)) {
        PyErr_SetString(PyExc_ValueError, "gap_qs8: out overlaps x");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(n_ * p_ * c_, n_);
        gapq_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            gapq_job j = {(const int8_t *)x.buf, (int8_t *)out.buf, p_, c_, n_ * k / nparts, n_ * (k + 1) / nparts,
                          s, yzp, lo, hi};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(gapq_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- int8 Add of one shape, XNNPACK's fixed-point qs8 add: ((bias + a * a_mul + b * b_mul)
 * >> shift) + zp clamped to [lo, hi]; every sum fits int32 (multipliers < 2^21) and the shift
 * is arithmetic (GCC's, as numpy's). ---- */
typedef struct {
    const int8_t *a, *b;
    int8_t *out;
    Py_ssize_t s0, s1;
    int32_t am, bm, bias;
    int shift, zp, lo, hi;
} addq_job;

ORCH_CLONES
static void addq_span(const int8_t *restrict a, const int8_t *restrict b, int8_t *out, Py_ssize_t n, int32_t am,
                      int32_t bm, int32_t bias, int shift, int zp, int lo, int hi) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v = ((bias + (int32_t)a[i] * am + (int32_t)b[i] * bm) >> shift) + zp;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[i] = (int8_t)v;
    }
}

static void *addq_part(void *arg) {
    const addq_job *j = (const addq_job *)arg;
    addq_span(j->a + j->s0, j->b + j->s0, j->out + j->s0, j->s1 - j->s0, j->am, j->bm, j->bias, j->shift, j->zp, j->lo,
              j->hi);
    return NULL;
}

static PyObject *py_add_qs8(PyObject *self, PyObject *args) {
    Py_buffer a, b, out;
    Py_ssize_t n;
    int am, bm, bias, shift, zp, lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*niiiiiii", &a, &b, &out, &n, &am, &bm, &bias, &shift, &zp, &lo, &hi))
        return NULL;
    int ok = 1;
    if (n < 0 || am <= -(1 << 21) || am >= (1 << 21) || bm <= -(1 << 21) || bm >= (1 << 21) || shift < 1 ||
        shift > 31 || bias < -(1 << 30) || bias > (1 << 30) || zp < -128 || zp > 127 || lo < -128 || hi > 127 ||
        lo > hi) {
        PyErr_SetString(PyExc_ValueError, "add_qs8: inconsistent size, multipliers, shift or bounds");
        ok = 0;
    }
    ok = ok && need_i8(&a, n, "a") && need_i8(&b, n, "b") && need_i8(&out, n, "out");
    if (ok && ((a.buf != out.buf && overlaps(&a, &out)) || (b.buf != out.buf && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "add_qs8: out overlaps a or b without being it");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(n, n / 4096);
        addq_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            addq_job j = {(const int8_t *)a.buf, (const int8_t *)b.buf, (int8_t *)out.buf, run_start(n, k, nparts),
                          run_start(n, k + 1, nparts), am, bm, bias, shift, zp, lo, hi};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(addq_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- layer norm over the last dim, float32: out = (x - mean) * rstd * w + b per row, with
 * mean and rstd = 1 / sqrt(var + eps) (the biased variance) written per row ---- */
typedef struct {
    const float *x, *w, *b;
    float *out, *mean, *rstd;
    Py_ssize_t d, r0, r1;
    float eps;
} ln_job;

ORCH_CLONES
static float plane_sum(const float *restrict x, Py_ssize_t n); /* (the global average pool's) */

ORCH_CLONES
static void ln_rows(const ln_job *j) {
    const Py_ssize_t d = j->d;
    const float inv_d = 1.0f / (float)d;
    for (Py_ssize_t r = j->r0; r < j->r1; r++) {
        const float *x = j->x + r * d;
        float *o = j->out + r * d;
        const float mean = plane_sum(x, d) * inv_d;
        for (Py_ssize_t k = 0; k < d; k++) { /* the centred row, then its squares' mean */
            const float c = x[k] - mean;
            o[k] = c;
        }
        v8f q0 = {0}, q1 = {0};
        Py_ssize_t k = 0;
        for (; k + 16 <= d; k += 16) {
            v8f a0, a1;
            __builtin_memcpy(&a0, o + k, sizeof a0);
            __builtin_memcpy(&a1, o + k + 8, sizeof a1);
            q0 += a0 * a0;
            q1 += a1 * a1;
        }
        float var = lanes_sum(q0 + q1);
        for (; k < d; k++) var += o[k] * o[k];
        const float rstd = 1.0f / sqrtf(var * inv_d + j->eps);
        j->mean[r] = mean;
        j->rstd[r] = rstd;
        if (j->w && j->b)
            for (Py_ssize_t q = 0; q < d; q++) o[q] = o[q] * rstd * j->w[q] + j->b[q];
        else if (j->w)
            for (Py_ssize_t q = 0; q < d; q++) o[q] = o[q] * rstd * j->w[q];
        else if (j->b)
            for (Py_ssize_t q = 0; q < d; q++) o[q] = o[q] * rstd + j->b[q];
        else
            for (Py_ssize_t q = 0; q < d; q++) o[q] = o[q] * rstd;
    }
}

static void *ln_part(void *arg) {
    ln_rows((const ln_job *)arg);
    return NULL;
}

static PyObject *py_layer_norm_f32(PyObject *self, PyObject *args) {
    Py_buffer x, w, b, out, mean, rstd;
    PyObject *w_obj, *b_obj;
    Py_ssize_t rows, d;
    double eps;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*OOw*w*w*nnd", &x, &w_obj, &b_obj, &out, &mean, &rstd, &rows, &d, &eps)) return NULL;
    int have_w = 0, have_b = 0, ok = 1;
    if (w_obj != Py_None) {
        if (PyObject_GetBuffer(w_obj, &w, PyBUF_SIMPLE) < 0) ok = 0;
        else have_w = 1;
    }
    if (ok && b_obj != Py_None) {
        if (PyObject_GetBuffer(b_obj, &b, PyBUF_SIMPLE) < 0) ok = 0;
        else have_b = 1;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    if (ok && (rows < 1 || d < 1 || rows > lim || d > lim || prod4(rows, d, 1, 1) > lim)) {
        PyErr_SetString(PyExc_ValueError, "layer_norm_f32: inconsistent sizes");
        ok = 0;
    }
    ok = ok && need(&x, rows * d, "x") && need(&out, rows * d, "out") && need(&mean, rows, "mean") &&
         need(&rstd, rows, "rstd") && (!have_w || need(&w, d, "weight")) && (!have_b || need(&b, d, "bias"));
    if (ok && ((x.buf != out.buf && overlaps(&x, &out)) || overlaps(&mean, &out) || overlaps(&rstd, &out) ||
               overlaps(&mean, &x) || overlaps(&rstd, &x) || overlaps(&mean, &rstd) ||
               (have_w && overlaps(&w, &out)) || (have_b && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "layer_norm_f32: an output overlaps an operand or another output");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(rows * d * 8, rows);
        ln_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            ln_job j = {(const float *)x.buf, have_w ? (const float *)w.buf : NULL, have_b ? (const float *)b.buf : NULL,
                        (float *)out.buf, (float *)mean.buf, (float *)rstd.buf, d, rows * k / nparts,
                        rows * (k + 1) / nparts, (float)eps};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(ln_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    if (have_w) PyBuffer_Release(&w);
    if (have_b) PyBuffer_Release(&b);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    PyBuffer_Release(&mean);
    PyBuffer_Release(&rstd);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- softmax over the last dim, float32: per row m = max (NaN if any), e = exp(x - m),
 * out = e * (1 / sum(e)); exp as gelu's (within an ulp or two); a row with NaN or +inf gives
 * NaN, as the shifted formula does ---- */
typedef struct {
    const float *x;
    float *out;
    Py_ssize_t d, r0, r1;
} softmax_job;

ORCH_CLONES
static void softmax_rows(const softmax_job *j) {
    const Py_ssize_t d = j->d, d8 = d & ~(Py_ssize_t)7;
    for (Py_ssize_t r = j->r0; r < j->r1; r++) {
        const float *x = j->x + r * d;
        float *o = j->out + r * d;
        float m = x[0];
        {
            v8f mv = {0};
            for (int q = 0; q < 8; q++) mv[q] = x[0];
            for (Py_ssize_t k = 0; k < d8; k += 8) {
                v8f v;
                __builtin_memcpy(&v, x + k, sizeof v);
                mv = vsel_8((v > mv) | (v != v), v, mv); /* a NaN, once in a lane, stays */
            }
            for (int q = 0; q < 8; q++)
                if (mv[q] > m || mv[q] != mv[q]) m = mv[q];
            for (Py_ssize_t k = d8; k < d; k++)
                if (x[k] > m || x[k] != x[k]) m = x[k];
        }
        v8f sv = {0};
        for (Py_ssize_t k = 0; k < d8; k += 8) {
            v8f v;
            __builtin_memcpy(&v, x + k, sizeof v);
            const v8f e = exp_wide_8(v - m);
            __builtin_memcpy(o + k, &e, sizeof e);
            sv += e;
        }
        float sum = lanes_sum(sv);
        if (d8 < d) {
            v8f v = {0}, e;
            for (Py_ssize_t k = d8; k < d; k++) v[k - d8] = x[k] - m;
            e = exp_wide_8(v);
            for (Py_ssize_t k = d8; k < d; k++) {
                o[k] = e[k - d8];
                sum += e[k - d8];
            }
        }
        const float inv = 1.0f / sum;
        for (Py_ssize_t k = 0; k < d; k++) o[k] = o[k] * inv;
    }
}

static void *softmax_part(void *arg) {
    softmax_rows((const softmax_job *)arg);
    return NULL;
}

static PyObject *py_softmax_f32(PyObject *self, PyObject *args) {
    Py_buffer x, out;
    Py_ssize_t rows, d;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nn", &x, &out, &rows, &d)) return NULL;
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    int ok = rows >= 1 && d >= 1 && rows <= lim && d <= lim && prod4(rows, d, 1, 1) <= lim;
    if (!ok) PyErr_SetString(PyExc_ValueError, "softmax_f32: inconsistent sizes");
    ok = ok && need(&x, rows * d, "x") && need(&out, rows * d, "out");
    if (ok && x.buf != out.buf && overlaps(&x, &out)) {
        PyErr_SetString(PyExc_ValueError, "softmax_f32: out overlaps x without being x");
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(rows * d * 16, rows);
        softmax_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            softmax_job j = {(const float *)x.buf, (float *)out.buf, d, rows * k / nparts, rows * (k + 1) / nparts};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(softmax_part, jobs, sizeof jobs[0], nparts);
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

static PyObject *py_gelu_f32(PyObject *self, PyObject *args) {
    (void)self;
    return unary(args, gelu_loop, "gelu_f32");
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
        bias_act_job jobs[MAX_PARTS];
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

/* ---- matrix products: 1x1 convolutions and linear layers ----
 * A tile is 4 rows x NR columns of the result held in registers over the whole inner
 * dimension K: each step broadcasts one element of each of the 4 rows of A (a[r * ars +
 * k * aks]) against one NR-wide run of B's row k, then row and/or column bias and the
 * activation are applied before the tile is stored, so the result is written once. NR is
 * 32 with AVX-512 and 16 otherwise (the widest that stays in registers), picked when the
 * module loads (GEMM_COLUMNS); a run of columns short of NR is read from a zero-padded
 * copy (a panel). With AVX-512, conv1x1_f32 also has a 48-column tile for small maps, and
 * the products and conv_f32's gather tiles take 8 rows per tile where 8 are left (the same
 * operations per output: the same bits as 4 at a time).
 *   conv1x1_f32: out[n] (M x P) = w (M x K) . x[n] (K x P): A = w, B = the input planes.
 *   linear_f32:  out (T x N) = x (T x K) . wt (K x N): A = x, B = the transposed weight
 *                (the plan keeps a C-contiguous copy of it). */
#define TILE_FN_ROWS(NAME, ATTR, VT, VW, SUF, NV, MR, BROW_T, BROW)                                                   \
    ATTR static void NAME(const float *restrict a, Py_ssize_t ars, Py_ssize_t aks, const float *restrict b,           \
                          BROW_T, Py_ssize_t K, const float *restrict rbias, const float *restrict rscale,            \
                          const float *restrict cbias, float *restrict out, Py_ssize_t ldo, Py_ssize_t ncols,          \
                          Py_ssize_t nrows, int act) {                                                                 \
        VT acc[MR][NV];                                                                                               \
        const float *ar[MR]; /* rows past nrows read the last one again (never past A's end) */                       \
        for (int r = 0; r < MR; r++) {                                                                                \
            ar[r] = a + (r < nrows ? r : nrows - 1) * ars;                                                            \
            for (int v = 0; v < NV; v++) acc[r][v] = (VT){0};                                                         \
        }                                                                                                             \
        for (Py_ssize_t k = 0; k < K; k++) {                                                                          \
            VT xv[NV];                                                                                                \
            for (int v = 0; v < NV; v++) __builtin_memcpy(&xv[v], BROW + v * VW, sizeof xv[v]);                       \
            for (int r = 0; r < MR; r++) {                                                                            \
                const float w = ar[r][k * aks];                                                                       \
                for (int v = 0; v < NV; v++) acc[r][v] += w * xv[v];                                                  \
            }                                                                                                         \
        }                                                                                                             \
        VT cv[NV];                                                                                                    \
        for (int v = 0; v < NV; v++) {                                                                                \
            cv[v] = (VT){0};                                                                                          \
            if (cbias) __builtin_memcpy(&cv[v], cbias + v * VW, sizeof cv[v]);                                        \
        }                                                                                                             \
        for (Py_ssize_t r = 0; r < nrows; r++) {                                                                      \
            const float rb = rbias ? rbias[r] : 0.0f;                                                                 \
            VT ov[NV];                                                                                                \
            if (rscale) {                                                                                             \
                const float rs = rscale[r];                                                                           \
                for (int v = 0; v < NV; v++) ov[v] = act_##SUF(acc[r][v] * rs + rb + cv[v], act);                     \
            } else {                                                                                                  \
                for (int v = 0; v < NV; v++) ov[v] = act_##SUF(acc[r][v] + rb + cv[v], act);                          \
            }                                                                                                         \
            if (ncols == NV * VW) {                                                                                   \
                for (int v = 0; v < NV; v++) __builtin_memcpy(out + r * ldo + v * VW, &ov[v], sizeof ov[v]);          \
            } else {                                                                                                  \
                float tmp[NV * VW];                                                                                   \
                for (int v = 0; v < NV; v++) __builtin_memcpy(tmp + v * VW, &ov[v], sizeof ov[v]);                    \
                __builtin_memcpy(out + r * ldo, tmp, (size_t)ncols * sizeof(float));                                  \
            }                                                                                                         \
        }                                                                                                             \
    }

#define TILE_FN(NAME, ATTR, VT, VW, SUF, NV, BROW_T, BROW) TILE_FN_ROWS(NAME, ATTR, VT, VW, SUF, NV, 4, BROW_T, BROW)
#define GEMM_TILE(NAME, ATTR, VT, VW, SUF) TILE_FN(NAME, ATTR, VT, VW, SUF, 2, Py_ssize_t ldb, b + k * ldb)
/* The same tile with B's row k at b + koff[k]: a convolution's taps read in place from its
 * padded input planes (an implicit im2col; the row's NR-wide run must be readable). */
#define GATHER_TILE(NAME, ATTR, VT, VW, SUF) TILE_FN(NAME, ATTR, VT, VW, SUF, 2, const Py_ssize_t *restrict koff, b + koff[k])

typedef void (*gemm_tile_fn)(const float *restrict, Py_ssize_t, Py_ssize_t, const float *restrict, Py_ssize_t,
                             Py_ssize_t, const float *restrict, const float *restrict, const float *restrict,
                             float *restrict, Py_ssize_t, Py_ssize_t, Py_ssize_t, int);

typedef void (*gather_tile_fn)(const float *restrict, Py_ssize_t, Py_ssize_t, const float *restrict,
                               const Py_ssize_t *restrict, Py_ssize_t, const float *restrict, const float *restrict,
                               const float *restrict, float *restrict, Py_ssize_t, Py_ssize_t, Py_ssize_t, int);

GEMM_TILE(gemm_tile_8, , v8f, 8, 8)
GATHER_TILE(gather_tile_8, , v8f, 8, 8)
/* 4 x NR/2 (one vector per row): linear_f32's column blocks at most half the tile wide (a
 * layer of 16 outputs, a last block of 8 of 72), where the full tile would compute as many
 * zero columns as real ones. Each output the same operations in the same order: the same
 * bits as the full tile. */
TILE_FN(gemm_half_8, , v8f, 8, 8, 1, Py_ssize_t ldb, b + k * ldb)
#ifdef ORCH_X86_DISPATCH
GEMM_TILE(gemm_tile_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16)
TILE_FN(gemm_half_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16, 1, Py_ssize_t ldb, b + k * ldb)
TILE_FN(gemm_half_v3, __attribute__((target("arch=x86-64-v3"))), v8f, 8, 8, 1, Py_ssize_t ldb, b + k * ldb)
/* 4 x 48 with AVX-512 (12 accumulators of 32 registers): conv1x1_f32's blocks where 48 columns
 * waste less than 32 (a 7x7 map: 48 + 1 rather than 32 + 32) */
TILE_FN(gemm_tile3_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16, 3, Py_ssize_t ldb, b + k * ldb)
/* 8 x 32 and 8 x 16 with AVX-512 (16 / 8 accumulators of 32 registers): the products' tiles,
 * each B run loaded once per 8 rows, and 8 independent sums in flight in the 16-wide one (4
 * left its multiply-adds waiting on each other: 1x1 convolutions of 16 channels) */
TILE_FN_ROWS(gemm_tile8_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16, 2, 8, Py_ssize_t ldb, b + k * ldb)
TILE_FN_ROWS(gemm_half8_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16, 1, 8, Py_ssize_t ldb, b + k * ldb)
GEMM_TILE(gemm_tile_v3, __attribute__((target("arch=x86-64-v3"))), v8f, 8, 8)
GATHER_TILE(gather_tile_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16)
TILE_FN_ROWS(gather_tile8_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16, 16, 2, 8, const Py_ssize_t *restrict koff,
             b + koff[k])
GATHER_TILE(gather_tile_v3, __attribute__((target("arch=x86-64-v3"))), v8f, 8, 8)
#endif

static gemm_tile_fn gemm_tile = gemm_tile_8;
static gemm_tile_fn gemm_tile3 = NULL; /* 4 x 48, where the CPU has AVX-512 */
static gemm_tile_fn gemm_half = gemm_half_8; /* 4 x gemm_nr / 2 */
static gemm_tile_fn gemm_tile8 = NULL, gemm_half8 = NULL; /* 8-row tiles, where the CPU has AVX-512 */
static gather_tile_fn gather_tile = gather_tile_8;
static gather_tile_fn gather_tile8 = NULL; /* 8 rows, where the CPU has AVX-512 */
static Py_ssize_t gemm_nr = 16;

/* The rows the next tile takes of ``left``: 8 where there is an 8-row tile and 8 are left,
 * else up to 4. */
static inline Py_ssize_t tile_rows(int have8, Py_ssize_t left) { return have8 && left >= 8 ? 8 : left < 4 ? left : 4; }

/* The instruction set the dispatched kernels use: 4 (AVX-512), 3 (AVX2 + FMA) or 0 (the
 * baseline), the best this CPU has, or lower where ORCHESTRA_NATIVE_ISA says "v3" or
 * "baseline" (how the tests run the copies this CPU would not pick). */
static int isa_level(void) {
#ifdef ORCH_X86_DISPATCH
    __builtin_cpu_init();
    int level = 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq"))
        level = 4;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        level = 3;
    const char *want = getenv("ORCHESTRA_NATIVE_ISA");
    if (want && strcmp(want, "v3") == 0 && level > 3) level = 3;
    if (want && strcmp(want, "baseline") == 0) level = 0;
    return level;
#else
    return 0;
#endif
}

static void gemm_pick(int level) {
#ifdef ORCH_X86_DISPATCH
    if (level == 4) {
        gemm_tile = gemm_tile_v4;
        gemm_tile3 = gemm_tile3_v4;
        gemm_half = gemm_half_v4;
        gemm_tile8 = gemm_tile8_v4;
        gemm_half8 = gemm_half8_v4;
        gather_tile = gather_tile_v4;
        gather_tile8 = gather_tile8_v4;
        gemm_nr = 32;
    } else if (level == 3) {
        gemm_tile = gemm_tile_v3;
        gemm_half = gemm_half_v3;
        gather_tile = gather_tile_v3;
        gemm_nr = 16;
    }
#else
    (void)level;
#endif
}

/* Output rows [r0, r1) of one group of a convolution of one image as a product with 4 x NR
 * gather tiles: out (og x ho*wo) = w (og x K) . the taps, B's row k = (ci, tap) read at
 * koff[k] in the padded planes (pad_plane) from the row's first input: every NR-wide run of a
 * row of outputs is one tile per 4 output channels, bias and activation applied before its
 * store. Each output is computed the same way whichever rows a part takes. */
static void conv_tiles(const float *scratch, const Py_ssize_t *koff, const float *wg, const float *bg, float *og_out,
                       Py_ssize_t K, Py_ssize_t og, Py_ssize_t sh, Py_ssize_t row, Py_ssize_t ho, Py_ssize_t wo,
                       Py_ssize_t r0, Py_ssize_t r1, int act) {
    const Py_ssize_t plane = ho * wo, nr = gemm_nr;
    for (Py_ssize_t oy = r0; oy < r1; oy++)
        for (Py_ssize_t ox = 0; ox < wo; ox += nr) {
            const Py_ssize_t ncols = wo - ox < nr ? wo - ox : nr;
            const float *b = scratch + oy * sh * row + ox;
            for (Py_ssize_t o0 = 0, rows; o0 < og; o0 += rows) {
                rows = tile_rows(gather_tile8 != NULL, og - o0);
                (rows == 8 ? gather_tile8 : gather_tile)(wg + o0 * K, K, 1, b, koff, K, bg ? bg + o0 : NULL, NULL, NULL,
                                                         og_out + o0 * plane + oy * wo + ox, plane, ncols, rows, act);
            }
        }
}

/* One group of a stride-1 convolution of one image with narrow output rows, as a product
 * over the padded planes' flat positions: output (oy, ox) reads its taps at oy * row + ox +
 * koff[k] (planes padded without the 8-float slack: row = the padded width), so a run of NR
 * consecutive positions is one 4 x NR gather tile per 4 output channels, bias and activation
 * applied; the positions past a row's last output (the padding columns) are computed and
 * dropped. Stored through a small buffer, row by row. */
static void conv_flat(const float *scratch, const Py_ssize_t *koff, const float *wg, const float *bg, float *og_out,
                      Py_ssize_t K, Py_ssize_t og, Py_ssize_t row, Py_ssize_t ho, Py_ssize_t wo, int act) {
    const Py_ssize_t nr = gemm_nr, plane = ho * wo, span = (ho - 1) * row + wo;
    float tmp[8 * 32] __attribute__((aligned(64)));
    for (Py_ssize_t f0 = 0; f0 < span; f0 += nr) {
        const Py_ssize_t ncols = span - f0 < nr ? span - f0 : nr;
        for (Py_ssize_t o0 = 0, rows; o0 < og; o0 += rows) {
            rows = tile_rows(gather_tile8 != NULL, og - o0);
            (rows == 8 ? gather_tile8 : gather_tile)(wg + o0 * K, K, 1, scratch + f0, koff, K, bg ? bg + o0 : NULL, NULL, NULL,
                                                     tmp, nr, ncols, rows, act);
            for (Py_ssize_t q = 0; q < rows; q++) {
                float *dst = og_out + (o0 + q) * plane;
                Py_ssize_t oy = f0 / row, ox = f0 - oy * row, f = f0;
                while (f < f0 + ncols) {
                    if (ox >= wo) { /* a padding column: on to the next row */
                        f += row - ox;
                        oy++;
                        ox = 0;
                        continue;
                    }
                    Py_ssize_t m = wo - ox;
                    if (m > f0 + ncols - f) m = f0 + ncols - f;
                    memcpy(dst + oy * wo + ox, tmp + q * nr + (f - f0), (size_t)m * sizeof(float));
                    f += m;
                    ox += m;
                }
            }
        }
    }
}

/* Rows of the result one item of a call computes (items are split across threads). */
#define GEMM_ROWS 64
/* conv1x1_f32 computes a last block of at most this many columns (past whole blocks) as
 * matrix-vector products */
#define GEMM_REM_COLS 8

/* A share of one product call (conv1x1_f32 or linear_f32): items [i0, i1), as gemm_part and
 * linear_part count them; ``failed`` is set when its panel could not be allocated. */
typedef struct {
    const float *x, *w, *bias;
    float *out;
    Py_ssize_t m_, k_, p_, nb, nm; /* conv1x1: out (M x P) per image, nb pixel and nm row blocks */
    Py_ssize_t t_, n_, nbc, nrb, wstride; /* linear: T x N per product, column/row blocks, B's stride */
    Py_ssize_t i0, i1;
    int act, failed, trans; /* trans: linear's w is B transposed, (N x K) rows */
    Py_ssize_t cw;          /* conv1x1: its column blocks' width, gemm_nr or 48 (gemm_tile3) */
    const float *scale;     /* conv1x1: a scale per output channel (applied before the bias), or NULL */
} product_job;

/* Runs fn over ``items`` split in ``nparts`` shares of the job ``proto`` (the GIL released);
 * 0 (MemoryError set) when a share could not get its panel. */
static int run_product(void *(*fn)(void *), const product_job *proto, Py_ssize_t items, int nparts) {
    product_job jobs[MAX_PARTS];
    for (int k = 0; k < nparts; k++) {
        jobs[k] = *proto;
        jobs[k].i0 = items * k / nparts;
        jobs[k].i1 = items * (k + 1) / nparts;
    }
    Py_BEGIN_ALLOW_THREADS
    run_parts(fn, jobs, sizeof jobs[0], nparts);
    Py_END_ALLOW_THREADS
    for (int k = 0; k < nparts; k++)
        if (jobs[k].failed) {
            PyErr_NoMemory();
            return 0;
        }
    return 1;
}

ORCH_CLONES
static void gemv_rows(const float *restrict x, const float *restrict w, const float *restrict bias,
                      const float *restrict scale, float *restrict out, Py_ssize_t K, Py_ssize_t c0, Py_ssize_t nc,
                      int act);

/* The columns conv1x1_f32 computes for P pixels in blocks of w (see gemm_part). */
static Py_ssize_t col_cost(Py_ssize_t P, Py_ssize_t w) {
    const Py_ssize_t r = P % w;
    return P / w * w + (r == 0 ? 0 : r <= GEMM_REM_COLS && r < P ? 3 * r : w);
}

/* conv1x1_f32's items: image it / (nb * nm), pixel block (it / nm) % nb (cw pixels), output
 * channels (it % nm) * GEMM_ROWS onwards; a last block of at most GEMM_REM_COLS pixels (past
 * whole blocks) as one matrix-vector product per pixel. */
static void *gemm_part(void *arg) {
    product_job *j = (product_job *)arg;
    const Py_ssize_t nr = j->cw, K = j->k_, P = j->p_, M = j->m_;
    const gemm_tile_fn tile = nr == 48 ? gemm_tile3 : gemm_tile, tile8 = nr == 48 ? NULL : gemm_tile8;
    float *panel = NULL;
    Py_ssize_t panel_of = -1; /* the (image, pixel block) the panel holds */
    for (Py_ssize_t it = j->i0; it < j->i1; it++) {
        const Py_ssize_t blk = it / j->nm, n = blk / j->nb, p0 = (blk % j->nb) * nr;
        const Py_ssize_t m0 = (it % j->nm) * GEMM_ROWS, m1 = M - m0 < GEMM_ROWS ? M : m0 + GEMM_ROWS;
        const Py_ssize_t nc = P - p0 < nr ? P - p0 : nr;
        if (nc <= GEMM_REM_COLS && nc < P) {
            /* a few columns past the last whole block (a 14x14 map's 196 = 6 x 32 + 4): one
             * matrix-vector product per column, rather than a tile computing nr of them */
            if (!panel && !(panel = PyMem_RawMalloc((size_t)(K * nr) * sizeof(float)))) {
                j->failed = 1;
                return NULL;
            }
            float col[GEMM_ROWS];
            for (Py_ssize_t q = 0; q < nc; q++) {
                const float *src = j->x + n * K * P + p0 + q;
                for (Py_ssize_t k = 0; k < K; k++) panel[k] = src[k * P];
                gemv_rows(panel, j->w + m0 * K, j->bias ? j->bias + m0 : NULL, j->scale ? j->scale + m0 : NULL, col, K,
                          0, m1 - m0, j->act);
                float *dst = j->out + n * M * P + m0 * P + p0 + q;
                for (Py_ssize_t i = 0; i < m1 - m0; i++) dst[i * P] = col[i];
            }
            panel_of = -1;
            continue;
        }
        if (blk != panel_of) {
            /* the block's K rows copied into one contiguous panel (zero-padded past P): rows
             * of the planes themselves sit P floats apart, which for many P puts them in a
             * few cache sets (a 4 KB stride halved a product's speed) */
            if (!panel && !(panel = PyMem_RawMalloc((size_t)(K * nr) * sizeof(float)))) {
                j->failed = 1;
                return NULL;
            }
            const float *src = j->x + n * K * P + p0;
            for (Py_ssize_t k = 0; k < K; k++) {
                float *row = panel + k * nr;
                __builtin_memcpy(row, src + k * P, (size_t)nc * sizeof(float));
                for (Py_ssize_t q = nc; q < nr; q++) row[q] = 0.0f;
            }
            panel_of = blk;
        }
        float *ob = j->out + n * M * P + p0;
        for (Py_ssize_t o0 = m0, rows; o0 < m1; o0 += rows) {
            rows = tile_rows(tile8 != NULL, m1 - o0);
            (rows == 8 ? tile8 : tile)(j->w + o0 * K, K, 1, panel, nr, K, j->bias ? j->bias + o0 : NULL,
                                       j->scale ? j->scale + o0 : NULL, NULL, ob + o0 * P, P, nc, rows, j->act);
        }
    }
    PyMem_RawFree(panel);
    return NULL;
}

/* A product of fewer than GEMV_ROWS rows is a matrix-vector product per row: each part
 * takes blocks of GEMV_COLS columns and streams B's rows through them once (the 4-row tiles
 * would compute padding and copy B into panels for nothing). */
#define GEMV_ROWS 4
#define GEMV_COLS 512
#define GEMV_PREFETCH_FLOATS ((Py_ssize_t)1 << 18) /* 1 MB of float32 weights */

ORCH_CLONES
static void gemv_cols(const float *restrict x, const float *restrict wt, const float *restrict bias,
                      float *restrict out, Py_ssize_t K, Py_ssize_t N, Py_ssize_t c0, Py_ssize_t nc, int act) {
    float acc[GEMV_COLS] __attribute__((aligned(64)));
    for (Py_ssize_t q = 0; q < nc; q++) acc[q] = 0.0f;
    Py_ssize_t k = 0;
    for (; k + 4 <= K; k += 4) { /* four rows of B per pass over acc */
        const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
        const float *restrict r0 = wt + k * N + c0, *restrict r1 = r0 + N, *restrict r2 = r1 + N, *restrict r3 = r2 + N;
        for (Py_ssize_t q = 0; q < nc; q++) acc[q] += x0 * r0[q] + x1 * r1[q] + x2 * r2[q] + x3 * r3[q];
    }
    for (; k < K; k++) {
        const float xv = x[k];
        const float *restrict row = wt + k * N + c0;
        for (Py_ssize_t q = 0; q < nc; q++) acc[q] += xv * row[q];
    }
    if (bias)
        for (Py_ssize_t q = 0; q < nc; q++) acc[q] += bias[c0 + q];
    if (act != ACT_NONE) act_inplace(acc, nc, act);
    __builtin_memcpy(out + c0, acc, (size_t)nc * sizeof(float));
}

/* gemv_cols with B given transposed, as W (N x K) rows: out[n] = act(bias[n] + W[n, :] . x)
 * for n in [c0, c0 + nc), each a dot product of two contiguous rows: 2 x 8 partial sums per
 * row, four rows at a time (each load of x feeds four of them), then the last K % 16 in order.
 * With ``scale``: act(scale[n] * (W[n, :] . x) + bias[n]). */
ORCH_CLONES
static void gemv_rows(const float *restrict x, const float *restrict w, const float *restrict bias,
                      const float *restrict scale, float *restrict out, Py_ssize_t K, Py_ssize_t c0, Py_ssize_t nc,
                      int act) {
    const Py_ssize_t k16 = K & ~(Py_ssize_t)15;
    /* Weights of GEMV_PREFETCH_FLOATS and more (a classifier's) come from memory: each
     * execute reads them once, after the rest of the network has been through the caches.
     * The hardware's prefetch barely starts on rows of a few KB, so the next 4 rows' line
     * at the same place is asked for (into L2) while these are summed: 1 x 576 x 1024 from
     * memory 0.63x the time, 1 x 1024 x 1000 0.73x. From cache the extra instructions cost
     * 0-16 % (1 x 1280 x 1000 the most), so smaller weights, likely still in cache, go
     * without. */
    const int pf = nc * K >= GEMV_PREFETCH_FLOATS;
    Py_ssize_t n = c0;
    for (; n + 4 <= c0 + nc; n += 4) {
        const float *restrict wr[4] = {w + n * K, w + (n + 1) * K, w + (n + 2) * K, w + (n + 3) * K};
        const Py_ssize_t ahead = pf && n + 8 <= c0 + nc ? 4 * K : 0;
        v8f s[4][2] = {{{0}}};
        for (Py_ssize_t k = 0; k < k16; k += 16) {
            v8f b0, b1;
            __builtin_memcpy(&b0, x + k, sizeof b0);
            __builtin_memcpy(&b1, x + k + 8, sizeof b1);
            if (ahead)
                for (int r = 0; r < 4; r++) __builtin_prefetch(wr[r] + k + ahead, 0, 2);
            for (int r = 0; r < 4; r++) {
                v8f a0, a1;
                __builtin_memcpy(&a0, wr[r] + k, sizeof a0);
                __builtin_memcpy(&a1, wr[r] + k + 8, sizeof a1);
                s[r][0] += a0 * b0;
                s[r][1] += a1 * b1;
            }
        }
        for (int r = 0; r < 4; r++) {
            float acc = lanes_sum(s[r][0] + s[r][1]);
            for (Py_ssize_t k = k16; k < K; k++) acc += wr[r][k] * x[k];
            out[n + r] = scale ? acc * scale[n + r] + (bias ? bias[n + r] : 0.0f) : bias ? acc + bias[n + r] : acc;
        }
    }
    for (; n < c0 + nc; n++) { /* the last rows, one at a time, the same sums */
        const float *restrict wr = w + n * K;
        v8f s0 = {0}, s1 = {0};
        for (Py_ssize_t k = 0; k < k16; k += 16) {
            v8f a0, a1, b0, b1;
            __builtin_memcpy(&a0, wr + k, sizeof a0);
            __builtin_memcpy(&a1, wr + k + 8, sizeof a1);
            __builtin_memcpy(&b0, x + k, sizeof b0);
            __builtin_memcpy(&b1, x + k + 8, sizeof b1);
            s0 += a0 * b0;
            s1 += a1 * b1;
        }
        float acc = lanes_sum(s0 + s1);
        for (Py_ssize_t k = k16; k < K; k++) acc += wr[k] * x[k];
        out[n] = scale ? acc * scale[n] + (bias ? bias[n] : 0.0f) : bias ? acc + bias[n] : acc;
    }
    if (act != ACT_NONE) act_inplace(out + c0, nc, act);
}

/* whether two buffers share a byte */
static int overlaps(const Py_buffer *a, const Py_buffer *b) {
    return (const char *)a->buf < (const char *)b->buf + b->len && (const char *)b->buf < (const char *)a->buf + a->len;
}

static PyObject *py_conv1x1_f32(PyObject *self, PyObject *args) {
    Py_buffer x, w, b, out, sc;
    PyObject *bias_obj, *scale_obj = Py_None;
    Py_ssize_t n_, k_, p_, m_;
    int act = ACT_NONE;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnn|iO", &x, &w, &bias_obj, &out, &n_, &k_, &p_, &m_, &act, &scale_obj))
        return NULL;
    int have_bias = bias_obj != Py_None, have_scale = scale_obj != Py_None, ok = 1;
    if (have_bias && PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_bias = 0;
    }
    if (ok && have_scale && PyObject_GetBuffer(scale_obj, &sc, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_scale = 0;
    } else if (!ok) {
        have_scale = 0;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 24;
    if (ok && (act < ACT_NONE || act > ACT_SILU || n_ < 1 || k_ < 1 || p_ < 1 || m_ < 1 || n_ > lim || k_ > lim ||
               p_ > lim || m_ > lim || prod4(n_, k_ + m_, p_, 1) > ((Py_ssize_t)1 << 40))) {
        PyErr_SetString(PyExc_ValueError, "conv1x1_f32: inconsistent sizes or unknown activation");
        ok = 0;
    }
    ok = ok && need(&x, prod4(n_, k_, p_, 1), "x") && need(&w, prod4(m_, k_, 1, 1), "weight") &&
         need(&out, prod4(n_, m_, p_, 1), "out") && (!have_bias || need(&b, m_, "bias")) &&
         (!have_scale || need(&sc, m_, "scale"));
    if (ok && (overlaps(&x, &out) || overlaps(&w, &out) || (have_bias && overlaps(&b, &out)) ||
               (have_scale && overlaps(&sc, &out)))) {
        PyErr_SetString(PyExc_ValueError, "conv1x1_f32: out overlaps an operand");
        ok = 0;
    }
    if (ok) {
        /* blocks of 48 columns where they compute fewer (a last block of at most
         * GEMM_REM_COLS columns costs about 3 each, as matrix-vector products) */
        const Py_ssize_t cw = gemm_tile3 && col_cost(p_, 48) * 20 < col_cost(p_, gemm_nr) * 19 ? 48 : gemm_nr;
        const Py_ssize_t nb = (p_ + cw - 1) / cw, nm = (m_ + GEMM_ROWS - 1) / GEMM_ROWS, items = n_ * nb * nm;
        const int nparts = parts_for(prod4(n_, m_, k_, p_), items);
        product_job proto = {(const float *)x.buf, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL,
                             (float *)out.buf, m_, k_, p_, nb, nm, 0, 0, 0, 0, 0, 0, 0, act, 0, 0};
        proto.cw = cw;
        proto.scale = have_scale ? (const float *)sc.buf : NULL;
        ok = run_product(gemm_part, &proto, items, nparts);
    }
    if (have_scale) PyBuffer_Release(&sc);
    return release_call(ok, have_bias, &b, &x, &w, &out);
}

/* A column block of B taken from W = B's transpose (N x K rows, ld floats apart): panel[k *
 * nr + q] = w[q * ld + k] for q < nc, 0 for nc <= q < nr. 8 x 8 blocks are transposed in
 * registers (eight rows in, three rounds of shuffles, eight columns out), so W is read a row
 * at a time and the panel written a row at a time; the edges element by element. */
typedef int v8si __attribute__((vector_size(32)));
ORCH_CLONES
static void pack_panel_t(const float *restrict w, Py_ssize_t ld, Py_ssize_t K, Py_ssize_t nc, Py_ssize_t nr,
                         float *restrict panel) {
    const Py_ssize_t q8 = nc & ~(Py_ssize_t)7, k8 = K & ~(Py_ssize_t)7;
    const v8si lo32 = {0, 8, 1, 9, 4, 12, 5, 13}, hi32 = {2, 10, 3, 11, 6, 14, 7, 15};
    const v8si lo64 = {0, 1, 8, 9, 4, 5, 12, 13}, hi64 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8si lo128 = {0, 1, 2, 3, 8, 9, 10, 11}, hi128 = {4, 5, 6, 7, 12, 13, 14, 15};
    for (Py_ssize_t q0 = 0; q0 < q8; q0 += 8) {
        for (Py_ssize_t k0 = 0; k0 < k8; k0 += 8) {
            v8f r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) __builtin_memcpy(&r[i], w + (q0 + i) * ld + k0, sizeof r[i]);
            for (int i = 0; i < 8; i += 2) {
                t[i] = __builtin_shuffle(r[i], r[i + 1], lo32);
                t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi32);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = __builtin_shuffle(t[i], t[i + 2], lo64);
                u[i + 1] = __builtin_shuffle(t[i], t[i + 2], hi64);
                u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], lo64);
                u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi64);
            }
            for (int i = 0; i < 4; i++) {
                const v8f c0 = __builtin_shuffle(u[i], u[i + 4], lo128), c1 = __builtin_shuffle(u[i], u[i + 4], hi128);
                __builtin_memcpy(panel + (k0 + i) * nr + q0, &c0, sizeof c0);
                __builtin_memcpy(panel + (k0 + i + 4) * nr + q0, &c1, sizeof c1);
            }
        }
        for (Py_ssize_t k = k8; k < K; k++)
            for (Py_ssize_t q = q0; q < q0 + 8; q++) panel[k * nr + q] = w[q * ld + k];
    }
    for (Py_ssize_t k = 0; k < K; k++) {
        float *row = panel + k * nr;
        for (Py_ssize_t q = q8; q < nc; q++) row[q] = w[q * ld + k];
        for (Py_ssize_t q = nc; q < nr; q++) row[q] = 0.0f;
    }
}

/* linear_f32's items: product it / (nrb * nbc), column block (it / nrb) % nbc (NR columns),
 * rows block it % nrb (GEMM_ROWS rows): consecutive items share a column block, so its
 * panel is packed once for all the rows. */
static void *linear_part(void *arg) {
    product_job *j = (product_job *)arg;
    const Py_ssize_t nr = gemm_nr, K = j->k_, N = j->n_, T = j->t_;
    if (T < GEMV_ROWS) { /* items: product it / nbc, column block (it % nbc) * GEMV_COLS */
        for (Py_ssize_t it = j->i0; it < j->i1; it++) {
            const Py_ssize_t bi = it / j->nbc, c0 = (it % j->nbc) * GEMV_COLS;
            const Py_ssize_t nc = N - c0 < GEMV_COLS ? N - c0 : GEMV_COLS;
            for (Py_ssize_t t = 0; t < T; t++) {
                if (j->trans)
                    gemv_rows(j->x + (bi * T + t) * K, j->w + bi * j->wstride, j->bias, NULL, j->out + (bi * T + t) * N, K,
                              c0, nc, j->act);
                else
                    gemv_cols(j->x + (bi * T + t) * K, j->w + bi * j->wstride, j->bias, j->out + (bi * T + t) * N, K,
                              N, c0, nc, j->act);
            }
        }
        return NULL;
    }
    float *panel = NULL;
    Py_ssize_t panel_of = -1; /* the (product, column block) the panel holds */
    float cb[32] = {0};
    for (Py_ssize_t it = j->i0; it < j->i1; it++) {
        const Py_ssize_t bi = it / (j->nrb * j->nbc), cblk = (it / j->nrb) % j->nbc;
        const Py_ssize_t r0 = (it % j->nrb) * GEMM_ROWS, n0 = cblk * nr;
        const Py_ssize_t r1 = T - r0 < GEMM_ROWS ? T : r0 + GEMM_ROWS, nc = N - n0 < nr ? N - n0 : nr;
        const float *cbias = j->bias ? j->bias + n0 : NULL;
        const Py_ssize_t key = bi * j->nbc + cblk;
        if (key != panel_of) { /* the column block's K rows into one contiguous panel (see gemm_part) */
            if (!panel && !(panel = PyMem_RawMalloc((size_t)(K * nr) * sizeof(float)))) {
                j->failed = 1;
                return NULL;
            }
            if (j->trans) { /* B's columns n0.. are W's rows: transposed into the panel */
                pack_panel_t(j->w + bi * j->wstride + n0 * K, K, K, nc, nr, panel);
            } else {
                const float *src = j->w + bi * j->wstride + n0;
                for (Py_ssize_t k = 0; k < K; k++) {
                    float *row = panel + k * nr;
                    __builtin_memcpy(row, src + k * N, (size_t)nc * sizeof(float));
                    for (Py_ssize_t q = nc; q < nr; q++) row[q] = 0.0f;
                }
            }
            panel_of = key;
        }
        if (nc < nr && cbias) {
            for (Py_ssize_t q = 0; q < nr; q++) cb[q] = q < nc ? cbias[q] : 0.0f;
            cbias = cb;
        }
        const float *xb = j->x + bi * T * K;
        float *ob = j->out + bi * T * N;
        const gemm_tile_fn tile = 2 * nc <= nr ? gemm_half : gemm_tile;
        const gemm_tile_fn tile8 = 2 * nc <= nr ? gemm_half8 : gemm_tile8;
        for (Py_ssize_t t0 = r0, rows; t0 < r1; t0 += rows) {
            rows = tile_rows(tile8 != NULL, r1 - t0);
            (rows == 8 ? tile8 : tile)(xb + t0 * K, K, 1, panel, nr, K, NULL, NULL, cbias, ob + t0 * N + n0, N, nc, rows, j->act);
        }
    }
    PyMem_RawFree(panel);
    return NULL;
}

static PyObject *py_linear_f32(PyObject *self, PyObject *args) {
    Py_buffer x, wt, b, out;
    PyObject *bias_obj;
    Py_ssize_t nb_, t_, k_, n_;
    int batched_w = 0, act = ACT_NONE, trans = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnn|pip", &x, &wt, &bias_obj, &out, &nb_, &t_, &k_, &n_, &batched_w, &act,
                          &trans))
        return NULL;
    int have_bias = bias_obj != Py_None, ok = 1;
    if (have_bias && PyObject_GetBuffer(bias_obj, &b, PyBUF_SIMPLE) < 0) {
        ok = 0;
        have_bias = 0;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 24;
    if (ok && (act < ACT_NONE || act > ACT_SILU || nb_ < 1 || t_ < 1 || k_ < 1 || n_ < 1 || nb_ > lim || t_ > lim ||
               k_ > lim || n_ > lim || prod4(nb_, t_ + k_, k_ + n_, 1) > ((Py_ssize_t)1 << 40))) {
        PyErr_SetString(PyExc_ValueError, "linear_f32: inconsistent sizes or unknown activation");
        ok = 0;
    }
    ok = ok && need(&x, prod4(nb_, t_, k_, 1), "x") && need(&wt, prod4(batched_w ? nb_ : 1, k_, n_, 1), "weight") &&
         need(&out, prod4(nb_, t_, n_, 1), "out") && (!have_bias || need(&b, n_, "bias"));
    if (ok && (overlaps(&x, &out) || overlaps(&wt, &out) || (have_bias && overlaps(&b, &out)))) {
        PyErr_SetString(PyExc_ValueError, "linear_f32: out overlaps an operand");
        ok = 0;
    }
    if (ok) {
        const int gemv = t_ < GEMV_ROWS;
        const Py_ssize_t nbc = gemv ? (n_ + GEMV_COLS - 1) / GEMV_COLS : (n_ + gemm_nr - 1) / gemm_nr;
        const Py_ssize_t nrb = gemv ? 1 : (t_ + GEMM_ROWS - 1) / GEMM_ROWS;
        const Py_ssize_t items = nb_ * nrb * nbc;
        const int nparts = parts_for(prod4(nb_, t_, k_, n_), items);
        const product_job proto = {(const float *)x.buf, (const float *)wt.buf, have_bias ? (const float *)b.buf : NULL,
                                   (float *)out.buf, 0, k_, 0, 0, 0, t_, n_, nbc, nrb, batched_w ? k_ * n_ : 0, 0, 0,
                                   act, 0, trans};
        ok = run_product(linear_part, &proto, items, nparts);
    }
    return release_call(ok, have_bias, &b, &x, &wt, &out);
}

/* ---- per-plane steps of squeeze-and-excite: a plane's sum (global average pooling) and a
 * plane scaled by one number (the excitation) ---- */

/* x[:n]'s sum: 4 x 8 partial sums (then 8 at a time), the 8 lanes added in order, then the
 * last n % 8 */
ORCH_CLONES
static float plane_sum(const float *restrict x, Py_ssize_t n) {
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    Py_ssize_t k = 0;
    for (; k + 32 <= n; k += 32) {
        v8f a0, a1, a2, a3;
        __builtin_memcpy(&a0, x + k, sizeof a0);
        __builtin_memcpy(&a1, x + k + 8, sizeof a1);
        __builtin_memcpy(&a2, x + k + 16, sizeof a2);
        __builtin_memcpy(&a3, x + k + 24, sizeof a3);
        s0 += a0;
        s1 += a1;
        s2 += a2;
        s3 += a3;
    }
    for (; k + 8 <= n; k += 8) {
        v8f a0;
        __builtin_memcpy(&a0, x + k, sizeof a0);
        s0 += a0;
    }
    float acc = lanes_sum((s0 + s1) + (s2 + s3));
    for (; k < n; k++) acc += x[k];
    return acc;
}

ORCH_CLONES
/* out = x * s; returns 1 when every product is finite (its exponent bits not all ones) */
ORCH_CLONES
static int scale_plane(const float *x, float s, float *out, Py_ssize_t n) {
    uint32_t nonfinite = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const float v = x[k] * s;
        uint32_t u;
        __builtin_memcpy(&u, &v, sizeof u);
        nonfinite |= (u & 0x7f800000u) == 0x7f800000u;
        out[k] = v;
    }
    return !nonfinite;
}

/* A share of one planes call: planes [i0, i1); ``s`` NULL: sums into out[i], else
 * out[i, :] = x[i, :] * s[i] (``finite``: whether every product of the share was). */
typedef struct {
    const float *x, *s;
    float *out;
    Py_ssize_t inner, i0, i1;
    int finite;
} planes_job;

static void *planes_part(void *arg) {
    planes_job *j = (planes_job *)arg;
    int finite = 1;
    for (Py_ssize_t i = j->i0; i < j->i1; i++) {
        if (j->s)
            finite &= scale_plane(j->x + i * j->inner, j->s[i], j->out + i * j->inner, j->inner);
        else
            j->out[i] = plane_sum(j->x + i * j->inner, j->inner);
    }
    j->finite = finite;
    return NULL;
}

static PyObject *planes(PyObject *args, int scale, const char *name) {
    Py_buffer x, s, out;
    Py_ssize_t planes_, inner;
    int ok, finite = 1;
    if (scale) {
        if (!PyArg_ParseTuple(args, "y*y*w*nn", &x, &s, &out, &planes_, &inner)) return NULL;
    } else {
        if (!PyArg_ParseTuple(args, "y*w*nn", &x, &out, &planes_, &inner)) return NULL;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    ok = planes_ >= 0 && inner >= 0 && planes_ <= lim && inner <= lim && prod4(planes_, inner, 1, 1) <= lim;
    if (!ok) PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes", name);
    ok = ok && need(&x, prod4(planes_, inner, 1, 1), "x") &&
         need(&out, scale ? prod4(planes_, inner, 1, 1) : planes_, "out") && (!scale || need(&s, planes_, "s"));
    if (ok && ((x.buf != out.buf && overlaps(&x, &out)) || (scale && overlaps(&s, &out)))) {
        PyErr_Format(PyExc_ValueError, "%s: out overlaps an operand (other than being x)", name);
        ok = 0;
    }
    if (ok) {
        const int nparts = parts_for(prod4(planes_, inner, 2, 1), planes_);
        planes_job jobs[MAX_PARTS];
        for (int k = 0; k < nparts; k++) {
            planes_job j = {(const float *)x.buf, scale ? (const float *)s.buf : NULL, (float *)out.buf, inner,
                            planes_ * k / nparts, planes_ * (k + 1) / nparts, 1};
            jobs[k] = j;
        }
        Py_BEGIN_ALLOW_THREADS
        run_parts(planes_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
        for (int k = 0; k < nparts; k++) finite &= jobs[k].finite;
    }
    if (scale) PyBuffer_Release(&s);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    if (scale) return PyBool_FromLong(finite);
    Py_RETURN_NONE;
}

/* Whether every one of the first n float32 of x is positive and finite (a NaN is not): a quantized
 * value's scales, checked once at load. */
static PyObject *py_positive_finite_f32(PyObject *self, PyObject *args) {
    Py_buffer x;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &x, &n)) return NULL;
    if (!need(&x, n, "x")) {
        PyBuffer_Release(&x);
        return NULL;
    }
    int ok = 1;
    const char *p = (const char *)x.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + i * (Py_ssize_t)sizeof v, sizeof v);
        ok &= (v > 0.0f) & (v < INFINITY);
    }
    PyBuffer_Release(&x);
    return PyBool_FromLong(ok);
}

/* XNNPACK's per-channel requantization scale of an int8 convolution or linear layer, in float32 one
 * operation at a time (as numpy's float32 arrays compute it): out[c] = (fs[c] * in_scale) / out_scale. */
__attribute__((optimize("fp-contract=off"))) static PyObject *py_qs8_requant_scale(PyObject *self, PyObject *args) {
    Py_buffer fs, out;
    Py_ssize_t n;
    float in_scale, out_scale;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nffw*", &fs, &n, &in_scale, &out_scale, &out)) return NULL;
    int ok = need(&fs, n, "filter scales") && need(&out, n, "out");
    if (ok && overlaps(&fs, &out)) {
        PyErr_SetString(PyExc_ValueError, "qs8_requant_scale: out overlaps the filter scales");
        ok = 0;
    }
    if (ok) {
        const char *src = (const char *)fs.buf;
        char *dst = (char *)out.buf;
        for (Py_ssize_t c = 0; c < n; c++) {
            float v;
            memcpy(&v, src + c * (Py_ssize_t)sizeof v, sizeof v);
            v = v * in_scale; /* float32 (no contraction: fp-contract is off) */
            v = v / out_scale;
            memcpy(dst + c * (Py_ssize_t)sizeof v, &v, sizeof v);
        }
    }
    PyBuffer_Release(&fs);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- arena placement of buffers with lifetimes (load time) ----
 * Buffer i (nbytes[i], live from node position first[i] to last[i], both included) gets an offset
 * in one arena such that two buffers whose lifetimes overlap never overlap in memory. Buffers are
 * placed largest first (ties: lower index first), each at the lowest offset, a multiple of
 * ``align``, that fits between the buffers placed before it whose lifetimes overlap its own
 * (first fit over them sorted by offset): the XNNPACK compiler's _layout, whose Python form
 * (_place_python) gives the same offsets. */
typedef struct {
    Py_ssize_t nbytes;
    Py_ssize_t index;
} place_key;

static int place_key_cmp(const void *a, const void *b) {
    const place_key *x = a, *y = b;
    if (x->nbytes != y->nbytes) return x->nbytes > y->nbytes ? -1 : 1; /* larger first */
    return x->index < y->index ? -1 : (x->index > y->index);
}

typedef struct {
    Py_ssize_t off, end;
} place_span;

static int place_span_cmp(const void *a, const void *b) {
    const place_span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/* the items of ``list``, a list of n ints each >= lo, into out; 0 with an exception set where it is not */
static int place_ints(PyObject *list, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t *out, const char *what) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != n) {
        PyErr_Format(PyExc_ValueError, "arena_place: %s must be a list of %zd ints", what, n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(list, i));
        if (v == -1 && PyErr_Occurred()) return 0;
        if (v < lo) {
            PyErr_Format(PyExc_ValueError, "arena_place: %s[%zd] is %zd (below %zd)", what, i, v, lo);
            return 0;
        }
        out[i] = v;
    }
    return 1;
}

static PyObject *py_arena_place(PyObject *self, PyObject *args) {
    PyObject *nb_obj, *first_obj, *last_obj;
    Py_ssize_t align;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!n", &PyList_Type, &nb_obj, &PyList_Type, &first_obj, &PyList_Type, &last_obj,
                          &align))
        return NULL;
    if (align < 1 || align > (1 << 20) || (align & (align - 1))) {
        PyErr_SetString(PyExc_ValueError, "arena_place: align must be a power of two up to 2**20");
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(nb_obj);
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "arena_place: too many buffers");
        return NULL;
    }
    PyObject *result = NULL, *offs = NULL;
    Py_ssize_t *nbytes = NULL, *first = NULL, *last = NULL, *start = NULL, *fill = NULL, *off = NULL, *end = NULL;
    int32_t *alive = NULL, *seen = NULL, *near = NULL;
    place_key *order = NULL;
    place_span *busy = NULL;
    const Py_ssize_t cells = n ? n : 1;
    nbytes = PyMem_Malloc(cells * sizeof *nbytes);
    first = PyMem_Malloc(cells * sizeof *first);
    last = PyMem_Malloc(cells * sizeof *last);
    off = PyMem_Malloc(cells * sizeof *off);
    end = PyMem_Malloc(cells * sizeof *end);
    order = PyMem_Malloc(cells * sizeof *order);
    busy = PyMem_Malloc(cells * sizeof *busy);
    seen = PyMem_Malloc(cells * sizeof *seen);
    near = PyMem_Malloc(cells * sizeof *near);
    if (!nbytes || !first || !last || !off || !end || !order || !busy || !seen || !near) {
        PyErr_NoMemory();
        goto done;
    }
    if (!place_ints(nb_obj, n, 0, nbytes, "nbytes") || !place_ints(first_obj, n, 0, first, "first") ||
        !place_ints(last_obj, n, 0, last, "last"))
        goto done;
    /* node positions 0..npos-1; each position's list of the placed buffers live there, in one flat
     * array (the lifetimes' total length) */
    Py_ssize_t npos = 0, total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (last[i] < first[i]) {
            PyErr_Format(PyExc_ValueError, "arena_place: buffer %zd's lifetime ends (%zd) before it starts (%zd)", i,
                         last[i], first[i]);
            goto done;
        }
        if (last[i] >= PY_SSIZE_T_MAX / 2 || nbytes[i] > PY_SSIZE_T_MAX / 4) {
            PyErr_Format(PyExc_ValueError, "arena_place: buffer %zd is out of range", i);
            goto done;
        }
        if (last[i] + 1 > npos) npos = last[i] + 1;
        total += last[i] - first[i] + 1;
        if (total >= INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "arena_place: the lifetimes are too long");
            goto done;
        }
    }
    start = PyMem_Calloc((size_t)npos + 1, sizeof *start);
    fill = PyMem_Calloc((size_t)npos + 1, sizeof *fill);
    alive = PyMem_Malloc((size_t)(total ? total : 1) * sizeof *alive);
    if (!start || !fill || !alive) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t t = first[i]; t <= last[i]; t++) start[t + 1]++;
    for (Py_ssize_t t = 0; t < npos; t++) start[t + 1] += start[t];
    for (Py_ssize_t i = 0; i < n; i++) {
        order[i].nbytes = nbytes[i];
        order[i].index = i;
        seen[i] = -1;
    }
    qsort(order, (size_t)n, sizeof *order, place_key_cmp);
    Py_ssize_t arena = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const Py_ssize_t i = order[k].index;
        const Py_ssize_t size = (nbytes[i] + align - 1) / align * align;
        Py_ssize_t m = 0;
        for (Py_ssize_t t = first[i]; t <= last[i]; t++)
            for (Py_ssize_t q = 0; q < fill[t]; q++) {
                const int32_t j = alive[start[t] + q];
                if (seen[j] != (int32_t)k) {
                    seen[j] = (int32_t)k;
                    near[m++] = j;
                }
            }
        for (Py_ssize_t q = 0; q < m; q++) {
            busy[q].off = off[near[q]];
            busy[q].end = end[near[q]];
        }
        qsort(busy, (size_t)m, sizeof *busy, place_span_cmp);
        Py_ssize_t o = 0;
        for (Py_ssize_t q = 0; q < m; q++) {
            if (o + size <= busy[q].off) break;
            if (busy[q].end > o) o = busy[q].end;
        }
        if (o > PY_SSIZE_T_MAX / 2 - size) {
            PyErr_SetString(PyExc_OverflowError, "arena_place: the arena's size overflows");
            goto done;
        }
        off[i] = o;
        end[i] = o + size;
        if (end[i] > arena) arena = end[i];
        for (Py_ssize_t t = first[i]; t <= last[i]; t++) alive[start[t] + fill[t]++] = (int32_t)i;
    }
    offs = PyList_New(n);
    if (!offs) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(off[i]);
        if (!v) goto done;
        PyList_SET_ITEM(offs, i, v);
    }
    result = Py_BuildValue("(On)", offs, arena);
done:
    Py_XDECREF(offs);
    PyMem_Free(nbytes);
    PyMem_Free(first);
    PyMem_Free(last);
    PyMem_Free(off);
    PyMem_Free(end);
    PyMem_Free(order);
    PyMem_Free(busy);
    PyMem_Free(seen);
    PyMem_Free(near);
    PyMem_Free(start);
    PyMem_Free(fill);
    PyMem_Free(alive);
    return result;
}

/* Takes ``obj``'s buffer as a 1-d C-contiguous float32 vector ("f": native float32) of ``n`` elements (n < 0:
 * any length, set to its length): 1 when it is one, 0 when it is not (no exception: the caller computes with
 * numpy), -1 with an exception when ``obj`` exports no buffer at all. */
static int f32_vector(PyObject *obj, Py_buffer *b, Py_ssize_t *n) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        // not C-contiguous (numpy says so with a ValueError, other exporters a BufferError)
        if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
        PyErr_Clear();
        return 0;
    }
    if (b->ndim == 1 && b->format && strcmp(b->format, "f") == 0 && (*n < 0 || b->shape[0] == *n)) {
        if (*n < 0) *n = b->shape[0];
        return 1;
    }
    PyBuffer_Release(b);
    return 0;
}

/* An inference batch norm's per-channel scale and shift for folding into the convolution before it,
 * in float64 as numpy computes them from float32 vectors (each operation rounded on its own: no
 * contraction into fused multiply-adds): scale = gamma * (1 / sqrt(var + eps)), shift = (b - mean) * scale
 * + beta (gamma, beta, b: 1, 0, 0 where None), each then rounded to float32; whether every scale and shift is
 * finite; None (nothing written) where an operand is not a 1-d C-contiguous float32 vector of var's length.
 * (The checks are here, not in the Python caller: a load folds a batch norm per convolution, and the
 * caller's attribute checks were most of a call.) */
__attribute__((optimize("fp-contract=off"))) static PyObject *py_bn_fold_f32(PyObject *self, PyObject *const *args,
                                                                              Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "bn_fold_f32 takes 8 arguments");
        return NULL;
    }
    const double eps = PyFloat_AsDouble(args[5]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    /* var, mean, gamma, beta, bias (each taken in turn; None where absent), then scale and shift */
    static const int order[7] = {0, 1, 2, 3, 4, 6, 7};
    Py_buffer b[7];
    int have[7] = {0, 0, 0, 0, 0, 0, 0}, state = 1;
    Py_ssize_t n_ = -1;
    for (int i = 0; i < 7 && state == 1; i++) {
        PyObject *o = args[order[i]];
        if (o == Py_None && i >= 2 && i <= 4) continue;
        state = f32_vector(o, &b[i], &n_);
        have[i] = state == 1;
    }
    PyObject *result = NULL;
    if (state == 1 && n_ >= 0) {
        int overlap = overlaps(&b[5], &b[6]);
        for (int i = 0; i < 5; i++) overlap |= have[i] && (overlaps(&b[5], &b[i]) || overlaps(&b[6], &b[i]));
        if (overlap) {
            PyErr_SetString(PyExc_ValueError, "bn_fold_f32: scale or shift overlaps an operand");
        } else if (b[5].readonly || b[6].readonly) {
            PyErr_SetString(PyExc_ValueError, "bn_fold_f32: scale or shift is read-only");
        } else {
            const float *v = (const float *)b[0].buf, *m = (const float *)b[1].buf;
            const float *g = have[2] ? (const float *)b[2].buf : NULL, *be = have[3] ? (const float *)b[3].buf : NULL;
            const float *bi = have[4] ? (const float *)b[4].buf : NULL;
            float *sc = (float *)b[5].buf, *sh = (float *)b[6].buf;
            int finite = 1;
            for (Py_ssize_t c = 0; c < n_; c++) {
                double scale = 1.0 / sqrt((double)v[c] + eps);
                if (g) scale = (double)g[c] * scale;
                double shift = bi ? (double)bi[c] - (double)m[c] : -(double)m[c];
                shift = shift * scale;
                if (be) shift = shift + (double)be[c];
                sc[c] = (float)scale;
                sh[c] = (float)shift;
                finite &= isfinite(sh[c]) && isfinite(sc[c]);
            }
            result = PyBool_FromLong(finite);
        }
    } else if (state == 0) {
        result = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 7; i++)
        if (have[i]) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *py_scale_planes_f32(PyObject *self, PyObject *args) {
    (void)self;
    return planes(args, 1, "scale_planes_f32");
}

static PyObject *py_plane_sums_f32(PyObject *self, PyObject *args) {
    (void)self;
    return planes(args, 0, "plane_sums_f32");
}

/* ---- squeeze-and-excite in one call (a plan's fused step) ----
 * s = each plane's mean; t1 = w1 . s + b1; t2 = ops1(t1); t3 = w2 . t2 + b2; g = ops2(t3);
 * out = x * g (plane by plane). Each result is written to its own buffer in that order, as
 * the six steps it replaces wrote them (a later one may sit on an earlier one's memory, or on
 * x's: x is read again for the product after g is written, as the last step read it); the
 * next result is computed from a private copy of the previous one. ops: (code, a, b) float32
 * triples applied in order, each in float32 as the elementwise kernels compute it. */
enum { SE_ADD = 1, SE_MUL = 2, SE_DIV = 3, SE_CLAMP = 4, SE_SIGMOID = 5, SE_MULX = 6, SE_CODES = 6 };

static void se_apply(float *restrict v, const float *restrict v0, Py_ssize_t n, const float *ops, Py_ssize_t nops) {
    for (Py_ssize_t i = 0; i < nops; i++) {
        const int code = (int)ops[3 * i];
        const float a = ops[3 * i + 1], b = ops[3 * i + 2];
        for (Py_ssize_t j = 0; j < n; j++) {
            float t = v[j];
            switch (code) {
            case SE_ADD: t = t + a; break;
            case SE_MUL: t = t * a; break;
            case SE_DIV: t = t / a; break;
            case SE_CLAMP: /* a NaN bound: none on that side; a NaN value stays NaN */
                if (a == a && t < a) t = a;
                if (b == b && t > b) t = b;
                break;
            case SE_SIGMOID: t = 1.0f / (1.0f + expf(-t)); break;
            default: t = v0[j] * t; break; /* SE_MULX: times the vector the ops started from */
            }
            v[j] = t;
        }
    }
}

/* A share of se_dense: rows [r0, r1) of every image. */
typedef struct {
    const float *s, *w, *b;
    float *out;
    Py_ssize_t N, C, R, r0, r1;
} se_dense_job;

static void *se_dense_part(void *arg) {
    const se_dense_job *j = (const se_dense_job *)arg;
    for (Py_ssize_t n = 0; n < j->N; n++)
        gemv_rows(j->s + n * j->C, j->w, j->b, NULL, j->out + n * j->R, j->C, j->r0, j->r1 - j->r0, ACT_NONE);
    return NULL;
}

/* How many parts a squeeze-and-excite phase of ``work`` units over ``items`` takes: one per
 * thread from 2^14 (its phases are small and its weights usually come from memory: split
 * lower than the big kernels, one share per thread) */
static int se_parts(Py_ssize_t work, Py_ssize_t items) {
    int n = max_threads > 16 ? 16 : max_threads;
    if (work < ((Py_ssize_t)1 << 14)) n = 1;
    if (items < n) n = (int)(items > 0 ? items : 1);
    return n;
}

/* out[n, r] = b[r] + w[r, :] . s[n, :] for n < N, r < R (w: R x C), as gemv_rows sums, the
 * rows split over the pool (each row's sum the same whichever part computes it) */
static void se_dense(const float *s, const float *w, const float *b, float *out, Py_ssize_t N, Py_ssize_t C,
                     Py_ssize_t R) {
    se_dense_job jobs[MAX_PARTS];
    const int nparts = se_parts(N * R * C, R);
    for (int k = 0; k < nparts; k++) {
        se_dense_job j = {s, w, b, out, N, C, R, R * k / nparts, R * (k + 1) / nparts};
        jobs[k] = j;
    }
    run_parts(se_dense_part, jobs, sizeof jobs[0], nparts);
}

static int se_ops_ok(const Py_buffer *ops, const char *what) {
    const float *o = (const float *)ops->buf;
    const Py_ssize_t n = ops->len / (Py_ssize_t)sizeof(float);
    if (n % 3) goto bad;
    for (Py_ssize_t i = 0; i < n; i += 3)
        if (!(o[i] >= 1.0f && o[i] <= (float)SE_CODES && o[i] == (float)(int)o[i])) goto bad;
    return 1;
bad:
    PyErr_Format(PyExc_ValueError, "se_f32: %s is not a list of (code, a, b) float32 triples", what);
    return 0;
}

static PyObject *py_se_f32(PyObject *self, PyObject *args) {
    Py_buffer x, out, s, t1, t2, t3, g, w1, b1, w2, b2, o1, o2;
    Py_ssize_t n_, c_, r_, hw;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*w*w*w*w*w*y*y*y*y*y*y*nnnn", &x, &out, &s, &t1, &t2, &t3, &g, &w1, &b1, &w2, &b2,
                          &o1, &o2, &n_, &c_, &r_, &hw))
        return NULL;
    Py_buffer *all[] = {&x, &out, &s, &t1, &t2, &t3, &g, &w1, &b1, &w2, &b2, &o1, &o2};
    const Py_ssize_t lim = (Py_ssize_t)1 << 24;
    int ok = n_ >= 1 && c_ >= 1 && r_ >= 1 && hw >= 1 && n_ <= lim && c_ <= lim && r_ <= lim && hw <= lim &&
             prod4(n_, c_, hw, 1) <= ((Py_ssize_t)1 << 40) && prod4(r_, c_, 1, 1) <= ((Py_ssize_t)1 << 40);
    if (!ok) PyErr_SetString(PyExc_ValueError, "se_f32: inconsistent sizes");
    const Py_ssize_t nc = ok ? n_ * c_ : 0, nr = ok ? n_ * r_ : 0;
    ok = ok && need(&x, prod4(n_, c_, hw, 1), "x") && need(&out, prod4(n_, c_, hw, 1), "out") && need(&s, nc, "s") &&
         need(&t1, nr, "t1") && need(&t2, nr, "t2") && need(&t3, nc, "t3") && need(&g, nc, "g") &&
         need(&w1, r_ * c_, "w1") && need(&b1, r_, "b1") && need(&w2, c_ * r_, "w2") && need(&b2, c_, "b2") &&
         se_ops_ok(&o1, "ops1") && se_ops_ok(&o2, "ops2");
    if (ok && x.buf != out.buf && overlaps(&x, &out)) {
        PyErr_SetString(PyExc_ValueError, "se_f32: out overlaps x (other than being x)");
        ok = 0;
    }
    float *v = NULL;
    if (ok && !(v = PyMem_RawMalloc((size_t)(3 * nc + 2 * nr) * sizeof(float)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        float *vs = v, *vt1 = vs + nc, *vt2 = vt1 + nr, *vt3 = vt2 + nr, *vg = vt3 + nc;
        const float *xb = (const float *)x.buf;
        const int nparts = se_parts(nc * hw, nc);
        planes_job jobs[MAX_PARTS];
        Py_BEGIN_ALLOW_THREADS
        for (int k = 0; k < nparts; k++) {
            planes_job j = {xb, NULL, vs, hw, nc * k / nparts, nc * (k + 1) / nparts};
            jobs[k] = j;
        }
        run_parts(planes_part, jobs, sizeof jobs[0], nparts);
        for (Py_ssize_t i = 0; i < nc; i++) vs[i] = vs[i] / (float)hw;
        memcpy(s.buf, vs, (size_t)nc * sizeof(float));
        se_dense(vs, (const float *)w1.buf, (const float *)b1.buf, vt1, n_, c_, r_);
        memcpy(t1.buf, vt1, (size_t)nr * sizeof(float));
        memcpy(vt2, vt1, (size_t)nr * sizeof(float));
        se_apply(vt2, vt1, nr, (const float *)o1.buf, o1.len / (Py_ssize_t)(3 * sizeof(float)));
        memcpy(t2.buf, vt2, (size_t)nr * sizeof(float));
        se_dense(vt2, (const float *)w2.buf, (const float *)b2.buf, vt3, n_, r_, c_);
        memcpy(t3.buf, vt3, (size_t)nc * sizeof(float));
        memcpy(vg, vt3, (size_t)nc * sizeof(float));
        se_apply(vg, vt3, nc, (const float *)o2.buf, o2.len / (Py_ssize_t)(3 * sizeof(float)));
        memcpy(g.buf, vg, (size_t)nc * sizeof(float));
        for (int k = 0; k < nparts; k++) {
            planes_job j = {xb, vg, (float *)out.buf, hw, nc * k / nparts, nc * (k + 1) / nparts};
            jobs[k] = j;
        }
        run_parts(planes_part, jobs, sizeof jobs[0], nparts);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(v);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) PyBuffer_Release(all[i]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- channels-last (NHWC) convolutions: depthwise (dwconv_nhwc_f32) and grouped
 * (gconv_nhwc_f32) ----
 * Both compute NHWC float32 data as it is (the NCHW kernels above would need it transposed
 * there and back). An output row is computed in tiles of PX pixels x a block of channels
 * (depthwise: 16 channels, one AVX-512 vector or two AVX2 ones, 8 in the baseline copy;
 * grouped: 8 or 16 output channels, of one group or two, each input value broadcast against a
 * weight row), the sums in registers: bias, then the taps in row-major order (grouped: each
 * tap's input channels in order), then clamp(v, lo, hi) = v < lo ? lo : (v > hi ? hi : v)
 * (NaN passes), then the activation (the vector relu / hardswish / silu above), then stored.
 * Taps on rows outside the image are skipped; a tile whose taps all fall inside the image's
 * columns reads x with no check, the others (a row's first and last) read a row of zeros in
 * place of each tap outside (it adds 0 * w: nothing, for a finite weight, as torch's zero
 * padding computes it). A row's last tile computes pixels past its end (not stored; a short
 * one computes 3 PX / 4 or PX / 2). Every output is computed the same way whichever part,
 * chunk, tile or lane it falls in (a depthwise call's last block of channels overlaps the one
 * before it rather than read past the pixel), so the result does not depend on the thread
 * count.
 * A call is cut into items, an output row of one chunk of the channels, chunk-major (a part
 * takes consecutive rows of a chunk). A call has one chunk unless it has too few rows for the
 * threads' parts (small maps, many channels): then one a part, cut on 16-channel units
 * (depthwise; the last chunk takes the last C % 16, the boundaries put where out's rows are
 * 64-byte aligned, so two parts do not write one cache line) or whole groups. A part computes
 * its rows in strips (NHWC_STRIP_BYTES), block by block over a strip's rows. One copy per
 * instruction set, picked when the module loads (nhwc_pick): AVX-512, AVX2 + FMA, baseline.
 * Measured on one Zen 4 core (AVX-512) against conv_f32 on the same data as NCHW, both 64-byte
 * aligned: depthwise on MobileNetV3 / EfficientNet-B0 shapes 1.2-1.9x as fast (56x56x72 3x3:
 * 82 us vs 99; 7x7x1152 5x5: 42 vs 58; 112x112x16 3x3 / 2: 21 vs 40), grouped on RegNetX-200MF's
 * (8 channels a group) as fast at stride 1 on 56x56 and 28x28 and up to 2.3x as fast on the
 * small maps and at stride 2 (7x7x368: 40 us vs 64). The AVX2 copies trail conv_f32's on some
 * stride-1 shapes (depthwise 3x3 at 56x56: 56x56x72 113 us vs 98; grouped 56x56x24 156 vs 143,
 * and 16 or 24 channels a group by 7-11 %) and match or beat it on the rest. x at a 16-byte
 * offset costs the in-place loads up to 15 %. */

/* A part computes its rows in strips, a block of channels (or a group or two) at a time over
 * a strip's rows, so the block's input rows and weights are reused from L1 across its rows;
 * the strip's input rows (all channels) fit this many bytes, so the next block finds them in
 * L2 (block by block over a whole 112x112 map read x from memory once a block). */
#define NHWC_STRIP_BYTES (256 * 1024)

/* The sizes of an NHWC call, shared by its parts. */
typedef struct {
    const float *x, *w, *bias; /* w and bias as the kernel reads them: padded copies where needed */
    const float *zeros;        /* max(16, 2 gic) zeros: the input of a tap outside the image (two groups) */
    float *out;
    Py_ssize_t n_, h, wd, ho, wo, kh, kw, sh, sw, pt, pl, dh, dw;
    Py_ssize_t cx, cy;         /* channels of an input pixel, of an output pixel */
    Py_ssize_t gic, goc, gocp; /* grouped: per group; gocp = goc rounded up to 8 (the weights' rows) */
    int padded;                /* depthwise, C < a block: one block, its lanes past C zero (ring, weights, bias) */
    int ring;                  /* depthwise: the input read through the ring (else in place) */
    Py_ssize_t ntiles, ta, tb; /* tiles a row; grouped: [ta, tb) have every tap inside the image's columns */
    Py_ssize_t wpad, rsz;      /* depthwise: pixels of a ring slot (every tap of every tile), slots */
    Py_ssize_t units, nchunks; /* the chunks: units (16 channels / a group) in nchunks */
    Py_ssize_t strip;          /* output rows a part computes block by block (their input in L2) */
    Py_ssize_t shift;          /* depthwise: the chunks' boundaries past 16-channel multiples */
    Py_ssize_t idx;            /* Py_ssize_t of a part's index block (2 kh + rsz, rounded up to 8) */
    Py_ssize_t scr;            /* depthwise: floats of a part's scratch (the block's weights, the ring; x 16) */
    float lo, hi;
    int clamp_lo, clamp_hi; /* lo > -inf, hi < inf */
    int act;
} nhwc_geom;

/* A share of an NHWC call: items [i0, i1) (chunk it / (N Ho), output row it % (N Ho)). */
typedef struct {
    const nhwc_geom *g;
    Py_ssize_t *idx; /* kh each: an output row's taps (kernel rows i inside the image), their rows' offsets (in
                      * x, grouped; in the ring, depthwise); then (depthwise) the ring's slots' image rows */
    float *scr;      /* depthwise: the part's scratch, 64-byte aligned */
    Py_ssize_t i0, i1;
} nhwc_job;

/* clamp(v, lo, hi) = v < lo ? lo : (v > hi ? hi : v) (NaN passes): each side only where its
 * bound can act (lo > -inf, hi < inf; the other side's select leaves every v as it is), the
 * bound broadcast there (not held in a register through the tiles' loops) */
#define NHWC_CLAMP(SUF, VT)                                                                                          \
    static inline __attribute__((always_inline)) VT nhwc_clamp_##SUF(const nhwc_geom *g, VT v) {                     \
        const VT zero = {0};                                                                                         \
        if (g->clamp_hi) v = vsel_##SUF(v > zero + g->hi, zero + g->hi, v);                                          \
        if (g->clamp_lo) v = vsel_##SUF(v < zero + g->lo, zero + g->lo, v);                                          \
        return v;                                                                                                    \
    }
NHWC_CLAMP(16, vf16)
NHWC_CLAMP(8, v8f)

/* Chunk k's input channels [*ca, *cb). */
static void nhwc_chunk(const nhwc_geom *g, int grouped, Py_ssize_t k, Py_ssize_t *ca, Py_ssize_t *cb) {
    const Py_ssize_t u0 = g->units * k / g->nchunks, u1 = g->units * (k + 1) / g->nchunks;
    if (grouped) {
        *ca = u0 * g->gic;
        *cb = u1 * g->gic;
    } else {
        *ca = k == 0 ? 0 : 16 * u0 + g->shift;
        *cb = k + 1 == g->nchunks ? g->cx : 16 * u1 + g->shift;
    }
}

/* The kernel rows output row (n, oy) reads (the ones inside the image, in order) into the
 * job's taps, their image rows' offsets in x into its offsets; returns how many. */
static Py_ssize_t nhwc_rows(const nhwc_job *j, Py_ssize_t n, Py_ssize_t oy) {
    const nhwc_geom *g = j->g;
    Py_ssize_t *tap = j->idx, *xo = tap + g->kh;
    const Py_ssize_t y0 = oy * g->sh - g->pt;
    Py_ssize_t nv = 0;
    for (Py_ssize_t i = 0; i < g->kh; i++) {
        const Py_ssize_t iy = y0 + i * g->dh;
        if (iy >= 0 && iy < g->h) {
            tap[nv] = i;
            xo[nv++] = ((n * g->h + iy) * g->wd) * g->cx;
        }
    }
    return nv;
}

/* The depthwise kernel for one instruction set: blocks of NV vectors VT of VW floats (VTA:
 * aligned), tiles of PX pixels. WIN: a row's inputs in a window of registers, each loaded once
 * for the pixels and taps that read it (a vector of the block at a time), else loaded where
 * used; SPEC: the common kernel widths and strides (3 and 5, stride 1 and 2) as constants, else
 * only the loops. A part computes a strip a block at a time, the block's weights packed into
 * its scratch ([taps][block]). The input is read in place, or through the scratch's ring of
 * rsz = (kh - 1) dh + 1 slots (image row iy copied into slot iy % rsz once a block and strip,
 * ``wpad`` pixels of a block each, the padding pixels, and the lanes past C, zero) where C is a
 * multiple of 128 (x's pixels, C floats apart, then put a tile's loads in 8 cache sets of L1 or
 * fewer: C = 1152 ran at two thirds of the speed, C = 256 at half) or smaller than a block.
 * dwn_in: the input vector v of a tile's pixel ``pix`` (from the tile's first tap): MODE 0 from
 * the ring row at xp; MODE 1 from x's row at xp (at the block's channel), image column
 * ix0 + pix; MODE 2 the same, zeros outside the image.
 * dwn_tile: NP (PX, 3 PX / 4 or PX / 2) pixels (npx stored) x a block of one output row: row r
 * of its taps at xs + so[r] (ring: xs the ring at the tile, so[r] the slot; in place: xs x at
 * the block's channel, so[r] the image row), the weights of kernel row tap[r] at wb + tap[r] kw
 * bw, ``o`` the first pixel's output (nl channels stored). KW, SW, DW: the kernel width, stride
 * and dilation as constants, or 0: g's. dwn_row: one output row's tiles; dwn_part: a part's
 * items. */
#define DWN_FNS(NAME, ATTR, VT, VTA, VW, SUF, PX, NV, WIN, SPEC)                                                     \
    ATTR static inline __attribute__((always_inline)) VT dwn_in_##NAME(const nhwc_geom *g, const float *xp,          \
                                                                         Py_ssize_t pix, int v, Py_ssize_t ix0,      \
                                                                         const int MODE) {                           \
        if (MODE == 0) return *(const VTA *)(xp + pix * VW * NV + v * VW);                                           \
        const Py_ssize_t ix = ix0 + pix;                                                                             \
        const float *src = MODE == 1 || (ix >= 0 && ix < g->wd) ? xp + ix * g->cx : g->zeros;                        \
        VT r;                                                                                                        \
        __builtin_memcpy(&r, src + v * VW, sizeof r);                                                                \
        return r;                                                                                                    \
    }                                                                                                                \
    ATTR static inline __attribute__((always_inline)) void dwn_tile_##NAME(                                          \
        const nhwc_geom *g, const float *restrict xs, const Py_ssize_t *so, const Py_ssize_t *tap, Py_ssize_t nv,    \
        Py_ssize_t ix0, const float *restrict wb, const float *restrict bv, const Py_ssize_t KW,                     \
        const Py_ssize_t SW, const Py_ssize_t DW, const int NP, const int MODE, float *restrict o, Py_ssize_t npx,   \
        Py_ssize_t nl) {                                                                                             \
        const Py_ssize_t kw = KW ? KW : g->kw, sw = SW ? SW : g->sw, dw = DW ? DW : g->dw, bw = VW * NV;             \
        VT acc[PX][NV];                                                                                              \
        for (int v = 0; v < NV; v++) {                                                                               \
            VT b;                                                                                                    \
            __builtin_memcpy(&b, bv + v * VW, sizeof b);                                                             \
            for (int p = 0; p < NP; p++) acc[p][v] = b;                                                              \
        }                                                                                                            \
        for (Py_ssize_t r = 0; r < nv; r++) {                                                                        \
            const float *restrict xp = xs + so[r];                                                                   \
            const float *restrict wp = wb + tap[r] * kw * bw;                                                        \
            if (KW && WIN) {                                                                                         \
                /* a channel vector at a time, the row's inputs in registers (pixel p, tap jj at p SW + jj DW),      \
                 * each loaded where a tap first reads it (so fewer are live at once) */                             \
                for (int v = 0; v < NV; v++) {                                                                       \
                    VT win[(PX - 1) * 2 + 5];                                                                        \
                    const float *at = MODE == 1 ? xp + ix0 * g->cx + v * VW : xp; /* x's row, one base register */   \
                    if (MODE == 1) __asm__("" : "+r"(at));                                                           \
                    _Pragma("GCC unroll 8") for (int jj = 0; jj < KW; jj++) {                                        \
                        for (int p = 0; p < NP; p++) {                                                               \
                            const int q = p * SW + jj * DW;                                                          \
                            if (dwn_first_use(q, jj, NP, SW, DW))                                                    \
                                win[q] = MODE == 1 ? dwn_ld_##NAME(at + q * g->cx)                                   \
                                                   : dwn_in_##NAME(g, xp, q, v, ix0, MODE);                          \
                        }                                                                                            \
                        const VT wv = *(const VTA *)(wp + jj * bw + v * VW);                                         \
                        for (int p = 0; p < NP; p++) acc[p][v] += wv * win[p * SW + jj * DW];                        \
                    }                                                                                                \
                }                                                                                                    \
            } else {                                                                                                 \
                /* each input vector loaded where it is used (folded into its multiply-add) */                       \
                _Pragma("GCC unroll 8") for (Py_ssize_t jj = 0; jj < kw; jj++) {                                     \
                    VT wv[NV];                                                                                       \
                    for (int v = 0; v < NV; v++) wv[v] = *(const VTA *)(wp + jj * bw + v * VW);                      \
                    for (int p = 0; p < NP; p++)                                                                     \
                        for (int v = 0; v < NV; v++)                                                                 \
                            acc[p][v] += wv[v] * dwn_in_##NAME(g, xp, p * sw + jj * dw, v, ix0, MODE);               \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        for (int p = 0; p < NP; p++)                                                                                 \
            for (int v = 0; v < NV; v++) acc[p][v] = nhwc_clamp_##SUF(g, acc[p][v]);                                 \
        if (g->act == ACT_SILU) { /* out of line (one copy, not one a tile), through t (acc stays in registers) */   \
            VT t[PX * NV];                                                                                           \
            for (int i = 0; i < NP * NV; i++) t[i] = acc[i / NV][i % NV];                                            \
            dwn_silu_##NAME(t, NP * NV);                                                                             \
            for (int i = 0; i < NP * NV; i++) acc[i / NV][i % NV] = t[i];                                            \
        } else if (g->act != ACT_NONE)                                                                               \
            for (int p = 0; p < NP; p++)                                                                             \
                for (int v = 0; v < NV; v++) acc[p][v] = act_##SUF(acc[p][v], g->act);                               \
        if (nl == bw && npx == NP) {                                                                                 \
            for (int p = 0; p < NP; p++) __builtin_memcpy(o + p * g->cy, &acc[p], sizeof acc[p]);                    \
        } else if (nl == bw) {                                                                                       \
            for (Py_ssize_t p = 0; p < npx; p++) __builtin_memcpy(o + p * g->cy, &acc[p], sizeof acc[p]);            \
        } else {                                                                                                     \
            for (Py_ssize_t p = 0; p < npx; p++)                                                                     \
                __builtin_memcpy(o + p * g->cy, &acc[p], (size_t)nl * sizeof(float));                                \
        }                                                                                                            \
    }                                                                                                                \
    /* NP (PX, or 3 PX / 4 or PX / 2 for a row's short last tile) for a tile of npx pixels */                        \
    ATTR static inline __attribute__((always_inline)) void dwn_tile_at_##NAME(                                       \
        const nhwc_geom *g, const float *xs, const Py_ssize_t *so, const Py_ssize_t *tap, Py_ssize_t nv,             \
        Py_ssize_t ix0, const float *wb, const float *bv, const Py_ssize_t KW, const Py_ssize_t SW,                  \
        const Py_ssize_t DW, const int MODE, float *o, Py_ssize_t npx, Py_ssize_t nl) {                              \
        if (npx <= PX / 2)                                                                                           \
            dwn_tile_##NAME(g, xs, so, tap, nv, ix0, wb, bv, KW, SW, DW, PX / 2, MODE, o, npx, nl);                  \
        else if (npx <= PX * 3 / 4)                                                                                  \
            dwn_tile_##NAME(g, xs, so, tap, nv, ix0, wb, bv, KW, SW, DW, PX * 3 / 4, MODE, o, npx, nl);              \
        else                                                                                                         \
            dwn_tile_##NAME(g, xs, so, tap, nv, ix0, wb, bv, KW, SW, DW, PX, MODE, o, npx, nl);                      \
    }                                                                                                                \
    ATTR static inline __attribute__((always_inline)) void dwn_row_##NAME(                                           \
        const nhwc_geom *g, const float *ring, const float *xc, const Py_ssize_t *so, const Py_ssize_t *tap,         \
        Py_ssize_t nv, const float *wb, const float *bv, float *restrict o, Py_ssize_t nl, const Py_ssize_t KW,      \
        const Py_ssize_t SW, const Py_ssize_t DW) {                                                                  \
        for (Py_ssize_t t = 0; t < g->ntiles; t++) {                                                                 \
            const Py_ssize_t ox0 = t * PX, npx = g->wo - ox0 < PX ? g->wo - ox0 : PX, ix0 = ox0 * g->sw - g->pl;     \
            float *ot = o + ox0 * g->cy;                                                                             \
            if (ring)                                                                                                \
                dwn_tile_at_##NAME(g, ring + ox0 * g->sw * VW * NV, so, tap, nv, 0, wb, bv, KW, SW, DW, 0, ot, npx,  \
                                   nl);                                                                              \
            else if (t >= g->ta && t < g->tb)                                                                        \
                dwn_tile_at_##NAME(g, xc, so, tap, nv, ix0, wb, bv, KW, SW, DW, 1, ot, npx, nl);                     \
            else                                                                                                     \
                dwn_tile_at_##NAME(g, xc, so, tap, nv, ix0, wb, bv, KW, SW, DW, 2, ot, npx, nl);                     \
        }                                                                                                            \
    }                                                                                                                \
    ATTR static void dwn_part_##NAME(const nhwc_job *j) {                                                            \
        const nhwc_geom *g = j->g;                                                                                   \
        const Py_ssize_t rows = g->n_ * g->ho, kh = g->kh, kw = g->kw, sw = g->sw, dw = g->dw, cx = g->cx;           \
        const Py_ssize_t taps = kh * kw, bw = VW * NV, slot = g->wpad * bw, rsz = g->rsz;                            \
        const Py_ssize_t ncopy = g->wpad - g->pl < g->wd ? g->wpad - g->pl : g->wd; /* image pixels a slot holds */  \
        float *wb = j->scr, *ring = g->ring ? wb + taps * bw : NULL;                                                 \
        Py_ssize_t *tap = j->idx, *so = tap + kh, *have = so + kh;                                                   \
        /* the weights' lanes past C and the ring's padding pixels and lanes: zero for the whole call */             \
        memset(j->scr, 0, (size_t)(taps * bw + (ring ? rsz * slot : 0)) * sizeof(float));                            \
        for (Py_ssize_t it = j->i0; it < j->i1;) {                                                                   \
            /* a strip of the part's rows of one chunk and image, block by block */                                  \
            const Py_ssize_t k = it / rows, n = (it % rows) / g->ho, oy0 = it % g->ho;                               \
            Py_ssize_t run = j->i1 - it < g->ho - oy0 ? j->i1 - it : g->ho - oy0;                                    \
            if (run > g->strip) run = g->strip;                                                                      \
            Py_ssize_t ca, cb;                                                                                       \
            nhwc_chunk(g, 0, k, &ca, &cb);                                                                           \
            for (Py_ssize_t c0 = ca; c0 < cb; c0 += bw) {                                                            \
                /* the last block ends at the chunk's end, overlapping the one before (padded: one block) */         \
                const Py_ssize_t c = g->padded || c0 + bw <= cb ? c0 : cb - bw, nl = g->padded ? cx : bw;            \
                for (Py_ssize_t t = 0; t < taps; t++) {                                                              \
                    if (g->padded)                                                                                   \
                        memcpy(wb + t * bw, g->w + t * cx, (size_t)cx * sizeof(float));                              \
                    else                                                                                             \
                        for (int v = 0; v < NV; v++)                                                                 \
                            *(VTA *)(wb + t * bw + v * VW) = dwn_ld_##NAME(g->w + t * cx + c + v * VW);              \
                }                                                                                                    \
                for (Py_ssize_t q = 0; ring && q < rsz; q++) have[q] = -1;                                           \
                for (Py_ssize_t oy = oy0; oy < oy0 + run; oy++) {                                                    \
                    /* the kernel rows inside the image, their image rows (in the ring: their slots) */              \
                    const Py_ssize_t y0 = oy * g->sh - g->pt;                                                        \
                    Py_ssize_t nv = 0;                                                                               \
                    for (Py_ssize_t i = 0; i < kh; i++) {                                                            \
                        const Py_ssize_t iy = y0 + i * g->dh;                                                        \
                        if (iy < 0 || iy >= g->h) continue;                                                          \
                        tap[nv] = i;                                                                                 \
                        if (!ring) {                                                                                 \
                            so[nv++] = ((n * g->h + iy) * g->wd) * cx;                                               \
                            continue;                                                                                \
                        }                                                                                            \
                        const Py_ssize_t q = iy % rsz;                                                               \
                        if (have[q] != iy) {                                                                         \
                            const float *src = g->x + ((n * g->h + iy) * g->wd) * cx + c;                            \
                            float *dst = ring + q * slot + g->pl * bw;                                               \
                            if (g->padded)                                                                           \
                                for (Py_ssize_t ix = 0; ix < ncopy; ix++)                                            \
                                    memcpy(dst + ix * bw, src + ix * cx, (size_t)cx * sizeof(float));                \
                            else                                                                                     \
                                for (Py_ssize_t ix = 0; ix < ncopy; ix++)                                            \
                                    for (int v = 0; v < NV; v++)                                                     \
                                        *(VTA *)(dst + ix * bw + v * VW) = dwn_ld_##NAME(src + ix * cx + v * VW);    \
                            have[q] = iy;                                                                            \
                        }                                                                                            \
                        so[nv++] = q * slot;                                                                         \
                    }                                                                                                \
                    float *o = g->out + ((n * g->ho + oy) * g->wo) * g->cy + c;                                      \
                    const float *bv = g->bias + c, *xc = g->x + c;                                                   \
                    if (SPEC && kw == 3 && sw == 1 && dw == 1)                                                       \
                        dwn_row_##NAME(g, ring, xc, so, tap, nv, wb, bv, o, nl, 3, 1, 1);                            \
                    else if (SPEC && kw == 3 && sw == 2 && dw == 1)                                                  \
                        dwn_row_##NAME(g, ring, xc, so, tap, nv, wb, bv, o, nl, 3, 2, 1);                            \
                    else if (SPEC && kw == 5 && sw == 1 && dw == 1)                                                  \
                        dwn_row_##NAME(g, ring, xc, so, tap, nv, wb, bv, o, nl, 5, 1, 1);                            \
                    else if (SPEC && kw == 5 && sw == 2 && dw == 1)                                                  \
                        dwn_row_##NAME(g, ring, xc, so, tap, nv, wb, bv, o, nl, 5, 2, 1);                            \
                    else                                                                                             \
                        dwn_row_##NAME(g, ring, xc, so, tap, nv, wb, bv, o, nl, 0, 0, 0);                            \
                }                                                                                                    \
            }                                                                                                        \
            it += run;                                                                                               \
        }                                                                                                            \
    }

/* The grouped kernel for one instruction set: tiles of NP (PX, 3 PX / 4 or PX / 2) pixels x
 * NG NB 8-wide vectors of output channels (NG groups x NB vectors of a group, NBMAX at most:
 * two groups of 8 output channels, or 16 channels of one), each input value broadcast against
 * a weight row (a multiply-add with its load folded in). SPEC: gic = 8 as a constant (its loop
 * unrolled). gwn_tile: row r of its taps is image row xg + xo[r] (xg: x at the first group's
 * first input channel), the tile's first tap at image column ix0; ``wg`` the first group's
 * weights at the vectors' first output channel ((kh, kw, gic, gocp) from there, the next
 * group's kh kw gic gocp floats on), ``bv`` its bias (the next group's gocp on), ``o`` the
 * first pixel's output (the next group's goc on; nl channels of a group stored). GIC: gic as a
 * constant, or 0. EDGE: some taps fall outside the image's columns (they read g->zeros). */
#define GWN_FNS(NAME, ATTR, PX, NBMAX, SPEC)                                                                         \
    ATTR static inline __attribute__((always_inline)) void gwn_tile_##NAME(                                          \
        const nhwc_geom *g, const float *restrict xg, const Py_ssize_t *xo, const Py_ssize_t *tap, Py_ssize_t nv,    \
        Py_ssize_t ix0, const float *restrict wg, const float *restrict bv, const Py_ssize_t GIC, const int NG,      \
        const int NB, const int NP, const int EDGE, float *restrict o, Py_ssize_t npx, Py_ssize_t nl) {              \
        const Py_ssize_t gic = GIC ? GIC : g->gic, gocp = g->gocp, kw = g->kw, cx = g->cx, wd = g->wd;               \
        const Py_ssize_t sw = g->sw, dw = g->dw, trow = kw * gic * gocp, gw = g->kh * trow;                          \
        v8f acc[PX][NBMAX];                                                                                          \
        for (int v = 0; v < NG * NB; v++) {                                                                          \
            v8f b;                                                                                                   \
            __builtin_memcpy(&b, bv + (v / NB) * gocp + 8 * (v % NB), sizeof b);                                     \
            for (int p = 0; p < NP; p++) acc[p][v] = b;                                                              \
        }                                                                                                            \
        for (Py_ssize_t r = 0; r < nv; r++) {                                                                        \
            const float *restrict xr = xg + xo[r];                                                                   \
            const float *restrict wp = wg + tap[r] * trow;                                                           \
            for (Py_ssize_t jj = 0; jj < kw; jj++) {                                                                 \
                const float *restrict wj = wp + jj * gic * gocp;                                                     \
                const float *xp[PX]; /* pixel p's input at this tap */                                               \
                for (int p = 0; p < NP; p++) {                                                                       \
                    const Py_ssize_t ix = ix0 + p * sw + jj * dw;                                                    \
                    xp[p] = !EDGE || (ix >= 0 && ix < wd) ? xr + ix * cx : g->zeros;                                 \
                }                                                                                                    \
                _Pragma("GCC unroll 8") for (Py_ssize_t ic = 0; ic < gic; ic++) {                                    \
                    v8f wv[NBMAX];                                                                                   \
                    for (int v = 0; v < NG * NB; v++)                                                                \
                        __builtin_memcpy(&wv[v], wj + (v / NB) * gw + ic * gocp + 8 * (v % NB), sizeof wv[v]);       \
                    for (int p = 0; p < NP; p++)                                                                     \
                        for (int v = 0; v < NG * NB; v++) acc[p][v] += xp[p][(v / NB) * gic + ic] * wv[v];           \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        for (int p = 0; p < NP; p++)                                                                                 \
            for (int v = 0; v < NG * NB; v++) acc[p][v] = nhwc_clamp_8(g, acc[p][v]);                                \
        if (g->act == ACT_SILU) { /* out of line, through a copy (acc stays in registers) */                         \
            v8f t[PX * NBMAX];                                                                                       \
            for (int i = 0; i < NP * NG * NB; i++) t[i] = acc[i / (NG * NB)][i % (NG * NB)];                         \
            gwn_silu_##NAME(t, NP * NG * NB);                                                                        \
            for (int i = 0; i < NP * NG * NB; i++) acc[i / (NG * NB)][i % (NG * NB)] = t[i];                         \
        } else if (g->act != ACT_NONE) {                                                                             \
            for (int p = 0; p < NP; p++)                                                                             \
                for (int v = 0; v < NG * NB; v++) acc[p][v] = act_8(acc[p][v], g->act);                              \
        }                                                                                                            \
        for (Py_ssize_t p = 0; p < npx; p++)                                                                         \
            for (int v = 0; v < NG * NB; v++) {                                                                      \
                const Py_ssize_t m = nl - 8 * (v % NB);                                                              \
                float *dst = o + p * g->cy + (v / NB) * g->goc + 8 * (v % NB);                                       \
                if (m >= 8)                                                                                          \
                    __builtin_memcpy(dst, &acc[p][v], sizeof acc[p][v]);                                             \
                else if (m > 0)                                                                                      \
                    __builtin_memcpy(dst, &acc[p][v], (size_t)m * sizeof(float));                                    \
            }                                                                                                        \
    }                                                                                                                \
    /* NP for a tile of npx pixels */                                                                                \
    ATTR static inline __attribute__((always_inline)) void gwn_tile_at_##NAME(                                       \
        const nhwc_geom *g, const float *xg, const Py_ssize_t *xo, const Py_ssize_t *tap, Py_ssize_t nv,             \
        Py_ssize_t ix0, const float *wg, const float *bv, const Py_ssize_t GIC, const int NG, const int NB,          \
        const int EDGE, float *o, Py_ssize_t npx, Py_ssize_t nl) {                                                   \
        if (npx <= PX / 2)                                                                                           \
            gwn_tile_##NAME(g, xg, xo, tap, nv, ix0, wg, bv, GIC, NG, NB, PX / 2, EDGE, o, npx, nl);                 \
        else if (npx <= PX * 3 / 4)                                                                                  \
            gwn_tile_##NAME(g, xg, xo, tap, nv, ix0, wg, bv, GIC, NG, NB, PX * 3 / 4, EDGE, o, npx, nl);             \
        else                                                                                                         \
            gwn_tile_##NAME(g, xg, xo, tap, nv, ix0, wg, bv, GIC, NG, NB, PX, EDGE, o, npx, nl);                     \
    }                                                                                                                \
    /* one output row's tiles of groups grp (NG of them), output vectors from ob */                                  \
    ATTR static inline __attribute__((always_inline)) void gwn_row_##NAME(                                           \
        const nhwc_job *j, Py_ssize_t nv, Py_ssize_t grp, Py_ssize_t ob, float *restrict o, Py_ssize_t nl,           \
        const Py_ssize_t GIC, const int NG, const int NB) {                                                          \
        const nhwc_geom *g = j->g;                                                                                   \
        const Py_ssize_t *tap = j->idx, *xo = tap + g->kh;                                                           \
        const float *xg = g->x + grp * g->gic;                                                                       \
        const float *wg = g->w + grp * g->kh * g->kw * g->gic * g->gocp + ob, *bv = g->bias + grp * g->gocp + ob;    \
        for (Py_ssize_t t = 0; t < g->ntiles; t++) {                                                                 \
            const Py_ssize_t ox0 = t * PX, npx = g->wo - ox0 < PX ? g->wo - ox0 : PX, ix0 = ox0 * g->sw - g->pl;     \
            float *ot = o + ox0 * g->cy;                                                                             \
            if (t >= g->ta && t < g->tb)                                                                             \
                gwn_tile_at_##NAME(g, xg, xo, tap, nv, ix0, wg, bv, GIC, NG, NB, 0, ot, npx, nl);                    \
            else                                                                                                     \
                gwn_tile_at_##NAME(g, xg, xo, tap, nv, ix0, wg, bv, GIC, NG, NB, 1, ot, npx, nl);                    \
        }                                                                                                            \
    }                                                                                                                \
    /* groups [grp, grp + NG) (output vectors of 8 channels from ob, NB at a time) */                                \
    ATTR static inline __attribute__((always_inline)) void gwn_rowv_##NAME(                                          \
        const nhwc_job *j, Py_ssize_t nv, Py_ssize_t grp, Py_ssize_t ob, float *restrict o, const int NG,            \
        const int NB) {                                                                                              \
        const nhwc_geom *g = j->g;                                                                                   \
        if (SPEC && g->gic == 8)                                                                                     \
            gwn_row_##NAME(j, nv, grp, ob, o + ob, g->goc - ob, 8, NG, NB);                                          \
        else                                                                                                         \
            gwn_row_##NAME(j, nv, grp, ob, o + ob, g->goc - ob, 0, NG, NB);                                          \
    }                                                                                                                \
    ATTR static void gwn_part_##NAME(const nhwc_job *j) {                                                            \
        const nhwc_geom *g = j->g;                                                                                   \
        const Py_ssize_t rows = g->n_ * g->ho, gic = g->gic;                                                         \
        for (Py_ssize_t it = j->i0; it < j->i1;) {                                                                   \
            /* a strip of the part's rows of one chunk and image, a group (or two) at a time */                      \
            const Py_ssize_t k = it / rows, n = (it % rows) / g->ho, oy0 = it % g->ho;                               \
            Py_ssize_t run = j->i1 - it < g->ho - oy0 ? j->i1 - it : g->ho - oy0;                                    \
            if (run > g->strip) run = g->strip;                                                                      \
            Py_ssize_t ca, cb;                                                                                       \
            nhwc_chunk(g, 1, k, &ca, &cb);                                                                           \
            const Py_ssize_t g1 = cb / gic;                                                                          \
            for (Py_ssize_t grp = ca / gic; grp < g1;) {                                                             \
                /* two groups of 8 output channels at a time, or one's vectors 16 then 8 channels at a time */       \
                const int pair = NBMAX > 1 && g->gocp == 8 && grp + 1 < g1;                                          \
                for (Py_ssize_t oy = oy0; oy < oy0 + run; oy++) {                                                    \
                    const Py_ssize_t nv = nhwc_rows(j, n, oy);                                                       \
                    float *o = g->out + ((n * g->ho + oy) * g->wo) * g->cy + grp * g->goc;                           \
                    if (pair) {                                                                                      \
                        gwn_rowv_##NAME(j, nv, grp, 0, o, 2, 1);                                                     \
                        continue;                                                                                    \
                    }                                                                                                \
                    Py_ssize_t ob = 0;                                                                               \
                    if (NBMAX > 1)                                                                                   \
                        for (; ob + 16 <= g->gocp; ob += 16) gwn_rowv_##NAME(j, nv, grp, ob, o, 1, 2);               \
                    for (; ob < g->gocp; ob += 8) gwn_rowv_##NAME(j, nv, grp, ob, o, 1, 1);                          \
                }                                                                                                    \
                grp += pair ? 2 : 1;                                                                                 \
            }                                                                                                        \
            it += run;                                                                                               \
        }                                                                                                            \
    }

/* Whether window element q (a tile's pixel p, tap jj at q = p SW + jj DW) is first read at tap
 * jj: no earlier tap reads it (constants where the kernel's tiles call it: folded away) */
static inline __attribute__((always_inline)) int dwn_first_use(int q, int jj, int np, Py_ssize_t sw, Py_ssize_t dw) {
    for (int j = 0; j < jj; j++)
        for (int p = 0; p < np; p++)
            if (p * sw + j * dw == q) return 0;
    return 1;
}

/* A vector from anywhere (x's pixels, the weights: unaligned) */
#define DWN_LD(NAME, ATTR, VT)                                                                                       \
    ATTR static inline __attribute__((always_inline)) VT dwn_ld_##NAME(const float *p) {                             \
        VT v;                                                                                                        \
        __builtin_memcpy(&v, p, sizeof v);                                                                           \
        return v;                                                                                                    \
    }
/* silu over n vectors in place (the tiles' accumulators, out of line) */
#define NHWC_SILU(NAME, ATTR, VT, SUF)                                                                               \
    ATTR static __attribute__((noinline)) void NAME(VT *v, int n) {                                                  \
        for (int i = 0; i < n; i++) v[i] = silu_##SUF(v[i]);                                                         \
    }
typedef float vf16a __attribute__((vector_size(64), may_alias));
DWN_LD(8, , v8f)
NHWC_SILU(dwn_silu_8, , v8f, 8)
NHWC_SILU(gwn_silu_8, , v8f, 8)
DWN_FNS(8, , v8f, v8fa, 8, 8, 4, 1, 1, 0)
GWN_FNS(8, , 4, 1, 0)
#ifdef ORCH_X86_DISPATCH
DWN_LD(v4, __attribute__((target("arch=x86-64-v4"))), vf16)
NHWC_SILU(dwn_silu_v4, __attribute__((target("arch=x86-64-v4"))), vf16, 16)
NHWC_SILU(gwn_silu_v4, __attribute__((target("arch=x86-64-v4"))), v8f, 8)
DWN_FNS(v4, __attribute__((target("arch=x86-64-v4"))), vf16, vf16a, 16, 16, 8, 1, 1, 1)
GWN_FNS(v4, __attribute__((target("arch=x86-64-v4"))), 8, 2, 1)
DWN_LD(v3, __attribute__((target("arch=x86-64-v3"))), v8f)
NHWC_SILU(dwn_silu_v3, __attribute__((target("arch=x86-64-v3"))), v8f, 8)
NHWC_SILU(gwn_silu_v3, __attribute__((target("arch=x86-64-v3"))), v8f, 8)
DWN_FNS(v3, __attribute__((target("arch=x86-64-v3"))), v8f, v8fa, 8, 8, 4, 2, 1, 1)
GWN_FNS(v3, __attribute__((target("arch=x86-64-v3"))), 8, 1, 1)
#endif

/* The copies this CPU runs (nhwc_pick): the part functions, the depthwise kernel's block of
 * channels, both kernels' pixels a tile and the depthwise ring's use. */
static void (*dwn_part)(const nhwc_job *) = dwn_part_8;
static void (*gwn_part)(const nhwc_job *) = gwn_part_8;
static Py_ssize_t dwn_bw = 8, dwn_px = 4, gwn_px = 4;
static int dwn_ring_edges = 1; /* maps with many edge tiles through the ring (see nhwc_call) */

static void nhwc_pick(int level) {
#ifdef ORCH_X86_DISPATCH
    if (level == 4) {
        dwn_part = dwn_part_v4;
        gwn_part = gwn_part_v4;
        dwn_bw = 16;
        dwn_px = 8;
        gwn_px = 8;
        dwn_ring_edges = 0;
    } else if (level == 3) {
        dwn_part = dwn_part_v3;
        gwn_part = gwn_part_v3;
        dwn_bw = 16; /* two vectors of 8 */
        dwn_px = 4;
        gwn_px = 8;
    }
#else
    (void)level;
#endif
}

static void *dwn_run(void *arg) {
    dwn_part((const nhwc_job *)arg);
    return NULL;
}

static void *gwn_run(void *arg) {
    gwn_part((const nhwc_job *)arg);
    return NULL;
}

/* The shared part of dwconv_nhwc_f32 and gconv_nhwc_f32 once the arguments are checked (g's
 * sizes, x and out set): w and bias as given (bias NULL: none; grouped: w packed here to rows
 * of gocp floats where goc is not a multiple of 8, the bias padded to the kernel's rows); the
 * tiles, the chunks, the split and the parts' scratch; runs the parts with the GIL released.
 * 0 (the exception set) on failure. */
static int nhwc_call(nhwc_geom *g, const float *w, const float *bias, int grouped, const char *name) {
    if (g->n_ == 0 || g->ho == 0 || g->wo == 0) return 1;
    const Py_ssize_t taps = g->kh * g->kw, px = grouped ? gwn_px : dwn_px, vw = dwn_bw; /* (vw: a block) */
    const Py_ssize_t groups = grouped ? g->cx / g->gic : 0, big = (Py_ssize_t)1 << 40;
    g->padded = !grouped && g->cx < vw;
    g->ntiles = (g->wo + px - 1) / px;
    /* the tiles [ta, tb) have every tap of their PX pixels inside the image's columns */
    const Py_ssize_t step = px * g->sw, reach = g->wd - 1 + g->pl - (px - 1) * g->sw - (g->kw - 1) * g->dw;
    g->ta = (g->pl + step - 1) / step;
    if (g->ta > g->ntiles) g->ta = g->ntiles;
    g->tb = reach < 0 ? 0 : reach / step + 1;
    if (g->tb > g->ntiles) g->tb = g->ntiles;
    if (g->tb < g->ta) g->tb = g->ta;
    /* depthwise through the ring where C is smaller than a block, or C's pixels step 8 cache
     * sets of 64 or fewer (C a multiple of 128), or (the AVX2 and baseline copies) a quarter of
     * a row's tiles or more have taps outside the image (their selects spill there: 14x14x576
     * 5x5 ran 15 % faster through the ring, 112x112x32 3x3 8 % slower): a slot holds every tap
     * of every tile, (kh - 1) dh + 1 slots a row's taps */
    g->ring = !grouped && (g->padded || g->cx % 128 == 0 ||
                           (dwn_ring_edges && 4 * (g->ntiles - (g->tb - g->ta)) >= g->ntiles));
    g->wpad = g->ring ? (g->ntiles * px - 1) * g->sw + (g->kw - 1) * g->dw + 1 : 0;
    g->rsz = g->ring ? (g->kh - 1) * g->dh + 1 : 0;
    /* strips of output rows whose input rows fit NHWC_STRIP_BYTES (one row at least) */
    const Py_ssize_t in_row = prod4(g->wd, g->cx, (Py_ssize_t)sizeof(float), 1);
    const Py_ssize_t fit = in_row > 0 && in_row <= NHWC_STRIP_BYTES ? NHWC_STRIP_BYTES / in_row : 1;
    const Py_ssize_t reach_rows = (g->kh - 1) * g->dh + 1;
    g->strip = fit > reach_rows ? (fit - reach_rows) / g->sh + 1 : 1;
    /* the chunks: one, or one a part where the rows are too few for the threads' parts */
    g->units = grouped ? groups : (g->cx >= 16 ? g->cx / 16 : 1);
    const Py_ssize_t rows = g->n_ * g->ho;
    const Py_ssize_t work = prod4(rows * g->wo, g->cy, taps, grouped ? g->gic : 1);
    const int want = parts_for(work, (Py_ssize_t)1 << 30);
    g->nchunks = 1;
    g->shift = 0;
    if (want > 1 && rows < 4 * (Py_ssize_t)want) {
        if (!grouped && g->cx % 16 == 0 && ((uintptr_t)g->out & 3) == 0) {
            /* boundaries where out's rows are 64-byte aligned (whole 16 units left: C - shift >= 16) */
            const Py_ssize_t s = (Py_ssize_t)((16 - ((uintptr_t)g->out >> 2) % 16) % 16);
            if (g->cx - s >= 16) {
                g->shift = s;
                g->units = (g->cx - s) / 16;
            }
        }
        g->nchunks = g->units < want ? g->units : want;
    }
    const Py_ssize_t items = rows * g->nchunks;
    const int nparts = parts_for(work, items);
    g->idx = (2 * g->kh + g->rsz + 7) & ~(Py_ssize_t)7;
    /* a depthwise part's scratch: the block's weights and the ring, in 64-byte lines */
    const Py_ssize_t ring = prod4(g->rsz, g->wpad, vw, 1);
    g->scr = ring < 0 || ring > big ? -1 : grouped ? 0 : (ring + taps * vw + 15) & ~(Py_ssize_t)15;
    /* grouped: the weights' rows, gocp floats, zero-padded where goc is not a multiple of 8 */
    const Py_ssize_t wrows = groups * taps * g->gic; /* rows of goc floats */
    const int pack = grouped && g->gocp != g->goc;
    const Py_ssize_t nbias = (grouped ? groups * g->gocp : g->cx) + 16, nzeros = 2 * g->gic > 16 ? 2 * g->gic : 16;
    Py_ssize_t floats = g->scr < 0 ? -1 : prod4(g->scr, nparts, 1, 1);
    if (floats >= 0 && pack) floats += prod4(wrows, g->gocp, 1, 1);
    if (floats >= 0) floats += nbias + nzeros + 64;
    if (floats < 0 || floats > big) {
        PyErr_Format(PyExc_ValueError, "%s: scratch too large", name);
        return 0;
    }
    float *mem = PyMem_RawMalloc((size_t)floats * sizeof(float));
    Py_ssize_t *idx = PyMem_RawMalloc((size_t)(g->idx * nparts) * sizeof(Py_ssize_t) + 64);
    if (!mem || !idx) {
        PyMem_RawFree(mem);
        PyMem_RawFree(idx);
        PyErr_NoMemory();
        return 0;
    }
    /* (each part's index block and scratch in its own cache lines) */
    Py_ssize_t *idx0 = (Py_ssize_t *)(((uintptr_t)idx + 63) & ~(uintptr_t)63);
    float *scr = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63), *bpad = scr + g->scr * nparts;
    float *zeros = bpad + nbias, *wpk = zeros + nzeros;
    nhwc_job jobs[MAX_PARTS];
    for (int k = 0; k < nparts; k++) {
        nhwc_job jb = {g, idx0 + g->idx * k, scr + g->scr * k, items * k / nparts, items * (k + 1) / nparts};
        jobs[k] = jb;
    }
    Py_BEGIN_ALLOW_THREADS
    /* the bias, zero-padded to the weights' rows (zeros without one) */
    memset(bpad, 0, (size_t)(nbias + nzeros) * sizeof(float));
    if (bias && grouped) {
        for (Py_ssize_t q = 0; q < groups; q++)
            memcpy(bpad + q * g->gocp, bias + q * g->goc, (size_t)g->goc * sizeof(float));
    } else if (bias) {
        memcpy(bpad, bias, (size_t)g->cx * sizeof(float));
    }
    g->bias = bpad;
    g->zeros = zeros;
    g->w = w;
    if (pack) {
        for (Py_ssize_t r = 0; r < wrows; r++) {
            memcpy(wpk + r * g->gocp, w + r * g->goc, (size_t)g->goc * sizeof(float));
            memset(wpk + r * g->gocp + g->goc, 0, (size_t)(g->gocp - g->goc) * sizeof(float));
        }
        g->w = wpk;
    }
    run_parts(grouped ? gwn_run : dwn_run, jobs, sizeof jobs[0], nparts);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(mem);
    PyMem_RawFree(idx);
    return 1;
}

/* Takes the bias (None: none) and checks what both NHWC calls share: the activation, the
 * sizes (each at most 2^24, their products at most 2^40), that x, w, bias and out hold what
 * the sizes reach and that out overlaps none of them. */
static int nhwc_check(const char *name, nhwc_geom *g, PyObject *bias_obj, Py_buffer *x, Py_buffer *w, Py_buffer *b,
                      Py_buffer *out, int *have_bias, Py_ssize_t wcount, int act, double lo, double hi) {
    *have_bias = 0;
    if (bias_obj != Py_None) {
        if (PyObject_GetBuffer(bias_obj, b, PyBUF_SIMPLE) < 0) return 0;
        *have_bias = 1;
    }
    const Py_ssize_t lim = (Py_ssize_t)1 << 24, big = (Py_ssize_t)1 << 40;
    const Py_ssize_t sz[] = {g->h, g->wd, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->cx, g->cy};
    int ok = act >= ACT_NONE && act <= ACT_SILU && g->n_ >= 0 && g->ho >= 0 && g->wo >= 0 && g->pt >= 0 &&
             g->pl >= 0 && g->n_ <= lim && g->ho <= lim && g->wo <= lim && g->pt <= lim && g->pl <= lim;
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) ok = ok && sz[i] >= 1 && sz[i] <= lim;
    ok = ok && wcount >= 0 && wcount <= big && prod4(g->n_, g->h, g->wd, g->cx) <= big &&
         prod4(g->n_, g->ho, g->wo, g->cy) <= big && prod4(g->ho, g->wo, g->kh, g->kw) <= big;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes or unknown activation", name);
        return 0;
    }
    if (!(need(x, prod4(g->n_, g->h, g->wd, g->cx), "x") && need(w, wcount, "weight") &&
          need(out, prod4(g->n_, g->ho, g->wo, g->cy), "out") && (!*have_bias || need(b, g->cy, "bias"))))
        return 0;
    if (overlaps(x, out) || overlaps(w, out) || (*have_bias && overlaps(b, out))) {
        PyErr_Format(PyExc_ValueError, "%s: out overlaps an operand", name);
        return 0;
    }
    g->x = (const float *)x->buf;
    g->out = (float *)out->buf;
    g->lo = (float)lo;
    g->hi = (float)hi;
    g->clamp_lo = !(g->lo == -INFINITY); /* (a NaN bound selects nothing either way) */
    g->clamp_hi = !(g->hi == INFINITY);
    g->act = act;
    return 1;
}

static PyObject *py_dwconv_nhwc_f32(PyObject *self, PyObject *args) {
    Py_buffer x, w, b, out;
    PyObject *bias_obj;
    nhwc_geom g;
    memset(&g, 0, sizeof g);
    Py_ssize_t c_;
    double lo, hi;
    int act, have_bias = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnnnnnnnnnnnnddi", &x, &w, &bias_obj, &out, &g.n_, &g.h, &g.wd, &c_, &g.kh,
                          &g.kw, &g.sh, &g.sw, &g.pt, &g.pl, &g.dh, &g.dw, &g.ho, &g.wo, &lo, &hi, &act))
        return NULL;
    g.cx = g.cy = c_;
    g.gic = g.goc = g.gocp = 1;
    int ok = nhwc_check("dwconv_nhwc_f32", &g, bias_obj, &x, &w, &b, &out, &have_bias, prod4(g.kh, g.kw, c_, 1),
                        act, lo, hi);
    ok = ok && nhwc_call(&g, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL, 0, "dwconv_nhwc_f32");
    return release_call(ok, have_bias, &b, &x, &w, &out);
}

static PyObject *py_gconv_nhwc_f32(PyObject *self, PyObject *args) {
    Py_buffer x, w, b, out;
    PyObject *bias_obj;
    nhwc_geom g;
    memset(&g, 0, sizeof g);
    Py_ssize_t groups;
    double lo, hi;
    int act, have_bias = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnnnnnnnnnnnnnnddi", &x, &w, &bias_obj, &out, &g.n_, &g.h, &g.wd, &groups,
                          &g.gic, &g.goc, &g.kh, &g.kw, &g.sh, &g.sw, &g.pt, &g.pl, &g.dh, &g.dw, &g.ho, &g.wo, &lo,
                          &hi, &act))
        return NULL;
    const Py_ssize_t lim = (Py_ssize_t)1 << 24;
    const int sizes_ok = groups >= 1 && groups <= lim && g.gic >= 1 && g.gic <= lim && g.goc >= 1 && g.goc <= lim;
    /* (channels past 2^24 fail nhwc_check) */
    g.cx = sizes_ok ? groups * g.gic : 0;
    g.cy = sizes_ok ? groups * g.goc : 0;
    g.gocp = sizes_ok ? (g.goc + 7) / 8 * 8 : 0;
    const Py_ssize_t kk = g.kh >= 1 && g.kw >= 1 && g.kh <= lim && g.kw <= lim ? g.kh * g.kw : -1;
    int ok = nhwc_check("gconv_nhwc_f32", &g, bias_obj, &x, &w, &b, &out, &have_bias,
                        sizes_ok ? prod4(groups, kk, g.gic, g.goc) : -1, act, lo, hi);
    ok = ok && nhwc_call(&g, (const float *)w.buf, have_bias ? (const float *)b.buf : NULL, 1, "gconv_nhwc_f32");
    return release_call(ok, have_bias, &b, &x, &w, &out);
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

/* Sends the pool's spinning threads to sleep now rather than when their spin ends (the
 * next call that splits wakes them): between a model's executes, so that a thread waiting
 * to run (the process's event loop) finds a CPU free instead of preempting the caller. */
static PyObject *py_pool_rest(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if ORCH_THREADS
    __atomic_store_n(&pool.resting, 1, __ATOMIC_RELAXED);
#endif
    Py_RETURN_NONE;
}

static PyObject *py_get_threads(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(max_threads);
}

/* The int8 kernels' copies for this CPU (level: isa_level's): AVX-512 depthwise convolutions
 * and multiplies, VNNI products, VBMI lookups; the plain copies elsewhere. */
static void int8_pick(int level) {
#ifdef ORCH_X86_DISPATCH
    if (level >= 3) {
        qgemm_rows = qgemm_rows_avx2;
        qgemm_avx2 = 1;
        qgemm_xu_bytes = 2;
        qdw_rows8 = qdw_row_v3;
        qdw_avx2 = 1;
    }
    if (level != 4) return;
    qdw_rows = qdw_rows8 = qdw_row_v4;
    qdw_avx512 = 1;
    qdw_avx2 = 0;
    mulq_rows = mulq_row_v4;
    if (__builtin_cpu_supports("avx512vnni")) {
        qgemm_rows = qgemm_rows_vnni;
        qgemm_vnni = 1;
        qgemm_avx2 = 0;
        qgemm_xu_bytes = 1;
    }
    if (__builtin_cpu_supports("avx512vbmi")) {
        lut_run = lut_span_vbmi;
        lut_vbmi = 1;
    }
#else
    (void)level;
#endif
}

/* ---- a permuted copy of 4-byte elements (a transpose: NCHW <-> NHWC, attention's heads) ----
 * out (contiguous, row-major over sizes[0..m)) = the elements of x at sum(i_k * istr[k]): the
 * caller gives the permutation as m dims, size-1 dims dropped and dims adjacent in both orders
 * merged (orchestra.runtime.kernels.permute_geometry). numpy copies such a view an element or a
 * short run at a time (5 GB/s on an RGB image's NCHW -> NHWC); here the output is written in
 * whole runs: copied runs where the last dim is contiguous in x too, else 16 x 16 tiles of the
 * two dims that are contiguous in x and in out. Moves bits: any 4-byte dtype. */
#define PERM_MAX_DIMS 8
#define PERM_TILE 16

/* out[a * B + b] = x[a + b * xstr] for B (2-4) rows of x: an image's channels interleaved into
 * its pixels (NCHW -> NHWC of RGB); the fixed B lets the compiler interleave vectors */
#define PERM_SMALL(B_)                                                                                              \
    for (Py_ssize_t a = 0; a < A; a++)                                                                              \
        for (int b = 0; b < (B_); b++) out[a * (B_) + b] = x[a + b * xstr];
ORCH_CLONES
static void perm_small(const uint32_t *restrict x, uint32_t *restrict out, Py_ssize_t A, Py_ssize_t B, Py_ssize_t xstr) {
    if (B == 2) { PERM_SMALL(2) }
    else if (B == 3) { PERM_SMALL(3) }
    else { PERM_SMALL(4) }
}

ORCH_CLONES
static void perm_tiles(const uint32_t *restrict x, uint32_t *restrict out, Py_ssize_t A, Py_ssize_t B, Py_ssize_t ostr,
                       Py_ssize_t xstr) {
    /* out[a * ostr + b] = x[a + b * xstr] for a < A, b < B */
    for (Py_ssize_t a0 = 0; a0 < A; a0 += PERM_TILE) {
        const Py_ssize_t amax = A - a0 < PERM_TILE ? A - a0 : PERM_TILE;
        for (Py_ssize_t b0 = 0; b0 < B; b0 += PERM_TILE) {
            const Py_ssize_t bmax = B - b0 < PERM_TILE ? B - b0 : PERM_TILE;
            for (Py_ssize_t a = 0; a < amax; a++) {
                uint32_t *restrict o = out + (a0 + a) * ostr + b0;
                const uint32_t *restrict s = x + a0 + a + b0 * xstr;
                for (Py_ssize_t b = 0; b < bmax; b++) o[b] = s[b * xstr];
            }
        }
    }
}

/* An odometer over the dims other than the last (and j): a run, a tile block or a strided
 * row of out per position. */
static void perm_copy(const uint32_t *x, uint32_t *out, int m, const Py_ssize_t *size, const Py_ssize_t *istr) {
    Py_ssize_t ostr[PERM_MAX_DIMS], pos[PERM_MAX_DIMS] = {0};
    ostr[m - 1] = 1;
    for (int k = m - 2; k >= 0; k--) ostr[k] = ostr[k + 1] * size[k + 1];
    const int last = m - 1;
    int j = -1; /* the dim contiguous in x, when it is not out's last */
    if (istr[last] != 1)
        for (int k = 0; k < last; k++)
            if (istr[k] == 1) j = k;
    /* the dims the odometer walks: all but last (and j) */
    for (;;) {
        Py_ssize_t xo = 0, oo = 0;
        for (int k = 0; k < last; k++) {
            xo += pos[k] * istr[k];
            oo += pos[k] * ostr[k];
        }
        if (istr[last] == 1) {
            memcpy(out + oo, x + xo, (size_t)size[last] * sizeof(uint32_t));
        } else if (j >= 0 && size[last] >= 2 && size[last] <= 4 && ostr[j] == size[last]) {
            perm_small(x + xo, out + oo, size[j], size[last], istr[last]);
        } else if (j >= 0) {
            perm_tiles(x + xo, out + oo, size[j], size[last], ostr[j], istr[last]);
        } else {
            const Py_ssize_t n = size[last], st = istr[last];
            for (Py_ssize_t i = 0; i < n; i++) out[oo + i] = x[xo + i * st];
        }
        int k = last - 1;
        for (; k >= 0; k--) {
            if (k == j) continue;
            if (++pos[k] < size[k]) break;
            pos[k] = 0;
        }
        if (k < 0) return;
    }
}

static PyObject *py_permute_4b(PyObject *self, PyObject *args) {
    Py_buffer x, out, geo;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*", &x, &out, &geo)) return NULL;
    Py_ssize_t size[PERM_MAX_DIMS], istr[PERM_MAX_DIMS];
    const Py_ssize_t ng = geo.len / (Py_ssize_t)sizeof(int64_t);
    const int m = (int)(ng / 2);
    int ok = geo.len % (Py_ssize_t)(2 * sizeof(int64_t)) == 0 && m >= 1 && m <= PERM_MAX_DIMS;
    Py_ssize_t total = 1, reach = 1;
    if (ok) {
        const int64_t *g = (const int64_t *)geo.buf;
        const Py_ssize_t lim = (Py_ssize_t)1 << 40;
        for (int k = 0; k < m && ok; k++) {
            size[k] = (Py_ssize_t)g[k];
            istr[k] = (Py_ssize_t)g[m + k];
            Py_ssize_t span;
            ok = size[k] >= 1 && size[k] <= lim && istr[k] >= 0 && istr[k] <= lim &&
                 !__builtin_mul_overflow(total, size[k], &total) && total <= lim &&
                 !__builtin_mul_overflow(size[k] - 1, istr[k], &span) && !__builtin_add_overflow(reach, span, &reach) &&
                 reach <= lim;
        }
    }
    if (!ok) PyErr_SetString(PyExc_ValueError, "permute_4b: geometry is not 1 to 8 sizes >= 1 and strides >= 0");
    else if (out.len != total * 4 || x.len / 4 < reach) {
        PyErr_Format(PyExc_ValueError, "permute_4b: out holds %zd bytes and x %zd: the sizes need %zd and reach %zd",
                     out.len, x.len, total * 4, reach * 4);
        ok = 0;
    } else if (overlaps(&x, &out)) {
        PyErr_SetString(PyExc_ValueError, "permute_4b: out overlaps x");
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        perm_copy((const uint32_t *)x.buf, (uint32_t *)out.buf, m, size, istr);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    PyBuffer_Release(&geo);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bias_act_f32", py_bias_act_f32, METH_VARARGS,
     "bias_act_f32(out, bias|None, N, C, inner, act): out[n, c, :] = act(out[n, c, :] + bias[c]) in place, "
     "float32 (act: 0 none, 1 relu, 2 hardswish, 3 silu)."},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): threads one call may use (1 to 16)."},
    {"pool_rest", py_pool_rest, METH_NOARGS, "pool_rest(): the pool's spinning threads sleep now (until the next call that splits)."},
    {"get_threads", py_get_threads, METH_NOARGS, "get_threads(): threads one call may use."},
    {"conv_f32", py_conv_f32, METH_VARARGS,
     "conv_f32(x, w, bias|None, out, N, C, H, W, O, groups, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo[, act]): "
     "NCHW float32 grouped (depthwise included) 2-d convolution into out (C-contiguous buffers), "
     "then act (0 none, 1 relu, 2 hardswish, 3 silu)."},
    {"conv1x1_f32", py_conv1x1_f32, METH_VARARGS,
     "conv1x1_f32(x, w, bias|None, out, N, K, P, M[, act, scale|None]): out[n, m, :] = act(bias[m] + sum_k "
     "w[m, k] * x[n, k, :]) for x (N, K, P), w (M, K) and out (N, M, P), float32, C-contiguous, out not "
     "overlapping x; with scale (M): act(scale[m] * sum_k w[m, k] * x[n, k, :] + bias[m]) (a batch norm folded "
     "without a scaled copy of w)."},
    {"linear_f32", py_linear_f32, METH_VARARGS,
     "linear_f32(x, wt, bias|None, out, B, T, K, N[, batched_w, act, trans]): out[b, t, :] = act(bias + sum_k "
     "x[b, t, k] * wt[k, :]) for x (B, T, K), wt (K, N) (trans: wt given as its transpose, (N, K); batched_w: one "
     "per product, wt[b]) and out (B, T, N), float32, "
     "C-contiguous, out overlapping no operand."},
    {"silu_f32", py_silu_f32, METH_VARARGS, "silu_f32(x, out, n): out[:n] = silu(x[:n]), float32; out may be x."},
    {"layer_norm_f32", py_layer_norm_f32, METH_VARARGS,
     "layer_norm_f32(x, weight|None, bias|None, out, mean, rstd, rows, d, eps): layer norm of x's rows of d float32: "
     "out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(biased variance + eps), mean and rstd per row; out "
     "may be x."},
    {"softmax_f32", py_softmax_f32, METH_VARARGS,
     "softmax_f32(x, out, rows, d): softmax of x's rows of d float32 (shifted by each row's max; NaN or +inf in a "
     "row: NaN); out may be x."},
    {"add_f32", py_add_f32, METH_VARARGS,
     "add_f32(a, b, out, n[, relu]): out[:n] = a[:n] + b[:n] (then relu, NaN and -0.0 kept), float32; out may be a "
     "or b."},
    {"requant_qs8", py_requant_qs8, METH_VARARGS,
     "requant_qs8(acc, bias|None, scale, out, parts, rows, n, lo, hi, zp): out[r, c] (int8) = rint(clamp((float)"
     "(bias[c] + sum_p acc[p, r, c]) * scale[c], lo, hi)) + zp, XNNPACK's fp32 requantization of integer "
     "accumulators held as float32 (parts, rows, n), bias int32 (n), scale float32 (n); lo, hi: the output "
     "range less zp."},
    {"qs8_rows_dot", py_qs8_rows_dot, METH_VARARGS,
     "qs8_rows_dot(x, zx, w, bias|None, scale, out, rows, k, n, lo, hi, zp): out[r, j] (int8) = rint(clamp((float)"
     "(bias[j] + sum_k (x[r, k] - zx) * w[j, k]) * scale[j], lo, hi)) + zp for int8 x (rows, k) and w (n, k), "
     "int32 sums (k <= 65536, rows <= 64), bias int32 (n), scale float32 (n); lo, hi: the output range less zp."},
    {"qs8_gemm", py_qs8_gemm, METH_VARARGS,
     "qs8_gemm(x, xu, w, corr, scale, out, rows, k, n, lo, hi, zp): out[r, j] (int8) = rint(clamp((float)(int32)"
     "(corr[j] + sum_k (x[r, k] ^ 0x80) * w[j, k] mod 2^32) * scale[j], lo, hi)) + zp for int8 x (rows, k), w packed "
     "(ceil(n / 16), ceil(k / 4), 16, 4) int8, corr int32 (n), scale float32 (n), k <= 65536; xu: scratch of rows * 4 "
     "ceil(k / 4) bytes (the rows as uint8); lo, hi: the output range less zp. AVX-512 VNNI where QS8_GEMM_VNNI."},
    {"qs8_pack_gemm", py_qs8_pack_gemm, METH_VARARGS,
     "qs8_pack_gemm(w, n, k, bias|None, zc, packed, corr): the int8 filter w (n, k) packed as qs8_gemm reads it "
     "((ceil(n / 16), ceil(k / 4), 16, 4), 0-padded) into packed, and corr[j] (int32) = bias[j] + zc * sum_k w[j, k] "
     "mod 2^32 (bias int32 (n); zc = -(128 + the rows' zero point), -255..0)."},
    {"qs8_conv", py_qs8_conv, METH_VARARGS,
     "qs8_conv(x, xu, w, corr, scale, out, N, H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, n, zx, lo, hi, zp): "
     "qs8_gemm over the patches of an int8 NHWC convolution (groups 1): row r = output pixel (N, Ho, Wo), its k = "
     "kh kw C values in (kh, kw, C) order, taps outside x (N, H, W, C) read as zx; out (N, Ho, Wo, n)."},
    {"dwconv_qs8", py_dwconv_qs8, METH_VARARGS,
     "dwconv_qs8(x, w, bias|None, scale, out, N, H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, zx, lo, hi, zp): "
     "int8 NHWC depthwise convolution (depth multiplier 1) of x (N, H, W, C) with w (kh, kw, C) float32 (the int8 "
     "filter's values) into out (N, Ho, Wo, C) int8 = rint(clamp((float)(bias[c] + sum over the taps inside x of "
     "(x - zx) * w) * scale[c], lo, hi)) + zp; kh kw <= 514, bias int32 (C), scale float32 (C); lo, hi: the output "
     "range less zp."},
    {"lut_u8", py_lut_u8, METH_VARARGS,
     "lut_u8(x, out, n, table): out[i] = table[x[i]] for n bytes (uint8 indices into a 256-byte table); out may be "
     "x, and overlaps nothing else."},
    {"qs8_gconv", py_qs8_gconv, METH_VARARGS,
     "qs8_gconv(x, xu, w, corr, scale, out, N, H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, groups, goc, zx, lo, "
     "hi, zp): qs8_conv of a grouped convolution: output channel j (group j / goc) sums over its group's kh kw gic "
     "values (gic = C / groups, a multiple of 4; goc 8 or a multiple of 16), w packed as qs8_gemm's for (groups goc, "
     "kh kw gic) in (kh, kw, gic) order; xu: rows * kh kw C bytes; out (N, Ho, Wo, groups goc)."},
    {"mul_qs8", py_mul_qs8, METH_VARARGS,
     "mul_qs8(a, za, b, zb, out, N, P, C, bP, scale, lo, hi, zp): out[n, p, c] (int8) = rint(clamp((float)((a[n, p, c] "
     "- za) * (b[n, p or 0, c] - zb)) * scale, lo, hi)) + zp for int8 a (N, P, C) and b (N, bP, C), bP = P or 1; "
     "lo, hi: the output range less zp; out may be a."},
    {"add_qs8", py_add_qs8, METH_VARARGS,
     "add_qs8(a, b, out, n, a_mul, b_mul, bias, shift, zp, lo, hi): out[:n] (int8) = clamp(((bias + a * a_mul + b * "
     "b_mul) >> shift) + zp, lo, hi), XNNPACK's fixed-point qs8 add of int8 a and b (multipliers < 2^21); out may be a "
     "or b."},
    {"gap_qs8", py_gap_qs8, METH_VARARGS,
     "gap_qs8(x, out, N, P, C, s, yzp, lo, hi): out[n, c] (int8) = clamp(rint((float)(sum_p x[n, p, c]) * s + yzp), "
     "lo, hi) for int8 x (N, P, C), int32 sums, two float32 roundings (XNNPACK's qs8 mean; P <= 2^24)."},
    {"quantize_qs8", py_quantize_qs8, METH_VARARGS,
     "quantize_qs8(x, out, n, inv_scale, lo, hi, zp): out[:n] (int8) = rint(clamp(x[:n] * inv_scale, lo, hi)) + zp, "
     "XNNPACK's float32 -> qs8 convert; out overlaps no operand."},
    {"dequantize_qs8", py_dequantize_qs8, METH_VARARGS,
     "dequantize_qs8(q, out, n, zp, scale): out[:n] (float32) = (q[:n] - zp) * scale; out overlaps no operand."},
    {"mul_rows_f32", py_mul_rows_f32, METH_VARARGS,
     "mul_rows_f32(x, s, out, N, P, C): out[n, p, c] = x[n, p, c] * s[n, c] for x (N, P, C) float32 (channels-last "
     "data scaled per image and channel); out may be x, and overlaps no other operand."},
    {"positive_finite_f32", py_positive_finite_f32, METH_VARARGS,
     "positive_finite_f32(x, n) -> bool: whether each of the first n float32 of x is positive and finite."},
    {"qs8_requant_scale", py_qs8_requant_scale, METH_VARARGS,
     "qs8_requant_scale(filter_scales, n, in_scale, out_scale, out): out[c] = (filter_scales[c] * in_scale) / "
     "out_scale for n float32, each operation rounded to float32."},
    {"arena_place", py_arena_place, METH_VARARGS,
     "arena_place(nbytes, first, last, align) -> (offsets, arena): offsets (a list of ints, one per buffer) in one "
     "arena such that buffers whose lifetimes [first, last] (node positions) overlap never overlap in memory: "
     "largest first (ties: lower index), each at the lowest multiple of align that fits between the overlapping "
     "buffers placed before it; arena: the end of the last byte used."},
    {"bn_fold_f32", (PyCFunction)(void (*)(void))py_bn_fold_f32, METH_FASTCALL,
     "bn_fold_f32(var, mean, gamma|None, beta|None, bias|None, eps, scale, shift) -> bool | None: an inference "
     "batch norm's float32 vectors folded into scale = gamma * (1 / sqrt(var + eps)) and shift = (bias - mean) * "
     "scale + beta, computed in float64 one operation at a time (as numpy does) and rounded to float32; whether every "
     "scale and shift is finite; None (nothing written) where an operand is not a 1-d C-contiguous float32 vector "
     "of var's length."},
    {"permute_4b", py_permute_4b, METH_VARARGS,
     "permute_4b(x, out, geo): out (contiguous) = x's 4-byte elements at sum(i_k * stride_k) in row-major order "
     "of the sizes; geo: int64 [sizes..., strides...] of 1 to 8 dims (see kernels.permute_geometry)."},
    {"scale_planes_f32", py_scale_planes_f32, METH_VARARGS,
     "scale_planes_f32(x, s, out, planes, inner) -> bool: out[i, :] = x[i, :] * s[i] for planes of inner float32; "
     "out may be x. True when every product is finite."},
    {"plane_sums_f32", py_plane_sums_f32, METH_VARARGS,
     "plane_sums_f32(x, out, planes, inner): out[i] = sum(x[i, :]) for planes of inner float32."},
    {"se_f32", py_se_f32, METH_VARARGS,
     "se_f32(x, out, s, t1, t2, t3, g, w1, b1, w2, b2, ops1, ops2, N, C, R, HW): squeeze-and-excite of x (N, C, HW) "
     "float32: s = plane means, t1 = w1 (R, C) . s + b1, t2 = ops1(t1), t3 = w2 (C, R) . t2 + b2, g = ops2(t3), "
     "out = x * g per plane, each written in that order; ops: (code, a, b) float32 triples (1 add a, 2 mul a, 3 "
     "div a, 4 clamp a..b (NaN: no bound), 5 sigmoid, 6 times the vector the ops started from); out is x or does "
     "not overlap it."},
    {"gelu_f32", py_gelu_f32, METH_VARARGS,
     "gelu_f32(x, out, n): out[:n] = gelu(x[:n]) (approximate 'none'), float32; out may be x."},
    {"hardswish_f32", py_hardswish_f32, METH_VARARGS,
     "hardswish_f32(x, out, n): out[:n] = hardswish(x[:n]), float32; out may be x."},
    {"dwconv_nhwc_f32", py_dwconv_nhwc_f32, METH_VARARGS,
     "dwconv_nhwc_f32(x, w, bias|None, out, N, H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, lo, hi, act): "
     "NHWC float32 depthwise 2-d convolution (depth multiplier 1) of x (N, H, W, C) with w (kh, kw, C) into out "
     "(N, Ho, Wo, C): out[n, oy, ox, c] = act(clamp(bias[c] + sum of x[n, iy, ix, c] * w[i, j, c] over the taps "
     "(i, j), row-major, iy = oy sh - pt + i dh, ix = ox sw - pl + j dw, inside the image (outside: zero "
     "padding), lo, hi)), clamp(v) = v < lo ? lo : (v > hi ? hi : v) (NaN passes), act 0 none, 1 relu, "
     "2 hardswish, 3 silu; C-contiguous buffers, out overlapping no operand."},
    {"gconv_nhwc_f32", py_gconv_nhwc_f32, METH_VARARGS,
     "gconv_nhwc_f32(x, w, bias|None, out, N, H, W, groups, gic, goc, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, lo, "
     "hi, act): NHWC float32 grouped 2-d convolution of x (N, H, W, groups * gic) with w packed (groups, kh, kw, "
     "gic, goc) into out (N, Ho, Wo, groups * goc): out[n, oy, ox, g goc + o] = act(clamp(bias[g goc + o] + sum "
     "of x[n, iy, ix, g gic + ic] * w[g, i, j, ic, o] over the taps inside the image (as dwconv_nhwc_f32) and "
     "ic < gic, lo, hi)); C-contiguous buffers, out overlapping no operand."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "orchestra's compiled kernels.", -1, methods,
                                     NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    const int level = isa_level();
    gemm_pick(level);
    spans_pick(level);
    nhwc_pick(level);
    int8_pick(level);
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "GEMM_COLUMNS", (long)gemm_nr) < 0 ||
              PyModule_AddIntConstant(m, "ISA_LEVEL", level) < 0 ||
              PyModule_AddIntConstant(m, "QS8_GEMM_VNNI", qgemm_vnni) < 0 ||
              PyModule_AddIntConstant(m, "QS8_GEMM_AVX2", qgemm_avx2) < 0 ||
              PyModule_AddIntConstant(m, "QS8_GEMM_XU_BYTES", (long)qgemm_xu_bytes) < 0 ||
              PyModule_AddIntConstant(m, "DWCONV_QS8_AVX512", qdw_avx512) < 0 ||
              PyModule_AddIntConstant(m, "DWCONV_QS8_AVX2", qdw_avx2) < 0 ||
              PyModule_AddIntConstant(m, "LUT_U8_VBMI", lut_vbmi) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
