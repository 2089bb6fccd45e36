/* Fused multi-head self-attention for MemAttend's tiny shapes (up to 64 tokens, heads of width 8),
 * forward and backward, one image and head at a time so that everything stays in registers / L1.
 * Vector lanes run over 8 queries at a time, so the softmax over keys needs no horizontal ops.
 * With torch ops the same work is six batched 25x8x25 matrix products, a softmax and four layout
 * copies per layer, each a pass over memory; here it is one pass. AVX2 + FMA (x86-64).
 *
 * Part of adjcap: adjcap/rerank/native.py compiles it with the system C compiler and calls it
 * through ctypes; adjcap/rerank/memattend_grad.py uses torch ops where that is not possible.
 * Deterministic: every sum runs in a fixed order.
 *
 * Layout (row-major float32). Image b has T tokens; its queries are its last TQ tokens.
 *   q row (b*TQ + i), head h: q[(b*TQ + i)*ldq + h*8 + e]     (already scaled by 1/sqrt(8))
 *   k, v row (b*T + j):       k[(b*T + j)*ldkv + h*8 + e]
 *   keep[b*T + j] != 0: token j of image b may be attended to (NULL: all may)
 *   o row (b*TQ + i):         o[(b*TQ + i)*ldo + h*8 + e]
 *   p (probabilities saved by the forward for the backward), in query blocks of 8 lanes:
 *     p[(((b*H + h)*G + g)*T + j)*8 + l] for query i = 8g + l, G = ceil(TQ / 8) (0 past TQ)
 *   backward: dout like o; dq like q (ld lddq); dk, dv like k, v (ld lddkv). Written, not added.
 * An image with no token to attend to gets zero output and zero gradients.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define E 8
#define MAXT 64

/* e^x for x <= 0: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], degree-6 Taylor polynomial
 * (relative error about 1e-7); x below -87 is clamped (e^-87 ~ 1.6e-38, still normal). */
static inline __m256 exp_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 fn = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.3888889e-3f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3333338e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1666668e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666667e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    const __m256i n = _mm256_cvtps_epi32(fn);
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

/* load rows x[l] (l < n, width 8, row stride ld) transposed: xt[e] lane l = x[l][e]; lanes >= n are 0 */
static inline void load_t(const float *x, long ld, int n, __m256 xt[E]) {
    float buf[E][8] __attribute__((aligned(32)));
    for (int e = 0; e < E; e++)
        for (int l = 0; l < 8; l++) buf[e][l] = l < n ? x[l * ld + e] : 0.0f;
    for (int e = 0; e < E; e++) xt[e] = _mm256_load_ps(buf[e]);
}

/* store xt transposed back into rows x[l] (l < n) */
static inline void store_t(const __m256 xt[E], float *x, long ld, int n) {
    float buf[E][8] __attribute__((aligned(32)));
    for (int e = 0; e < E; e++) _mm256_store_ps(buf[e], xt[e]);
    for (int l = 0; l < n; l++)
        for (int e = 0; e < E; e++) x[l * ld + e] = buf[e][l];
}

/* lane l: sum_e xt[e][l] * row[e] (xt = 8 rows transposed by load_t; two FMA chains) */
static inline __m256 lane_dot(const __m256 xt[E], const float *row) {
    __m256 a0 = _mm256_mul_ps(xt[0], _mm256_broadcast_ss(row));
    __m256 a1 = _mm256_mul_ps(xt[1], _mm256_broadcast_ss(row + 1));
    for (int e = 2; e < E; e += 2) {
        a0 = _mm256_fmadd_ps(xt[e], _mm256_broadcast_ss(row + e), a0);
        a1 = _mm256_fmadd_ps(xt[e + 1], _mm256_broadcast_ss(row + e + 1), a1);
    }
    return _mm256_add_ps(a0, a1);
}

static inline __m256 lanes_below(int n) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

int attn_fwd(int B, int T, int TQ, int H, const float *q, long ldq, const float *k, const float *v, long ldkv,
             const unsigned char *keep, float *o, long ldo, float *p) {
    if (T > MAXT || TQ > T || T < 1) return -1;
    const int G = (TQ + 7) / 8;
    __m256 s[MAXT];
    for (int b = 0; b < B; b++) {
        const unsigned char *kb = keep ? keep + (long)b * T : NULL;
        int any = 0;
        for (int j = 0; j < T; j++) any |= !kb || kb[j];
        for (int h = 0; h < H; h++) {
            const float *kh = k + (long)b * T * ldkv + h * E;
            const float *vh = v + (long)b * T * ldkv + h * E;
            for (int g = 0; g < G; g++) {
                const int nq = TQ - 8 * g < 8 ? TQ - 8 * g : 8;
                float *pg = p + (((long)b * H + h) * G + g) * T * 8;
                float *og = o + ((long)b * TQ + 8 * g) * ldo + h * E;
                __m256 ot[E];
                if (!any) {
                    for (int e = 0; e < E; e++) ot[e] = _mm256_setzero_ps();
                    store_t(ot, og, ldo, nq);
                    memset(pg, 0, sizeof(float) * T * 8);
                    continue;
                }
                __m256 qt[E];
                load_t(q + ((long)b * TQ + 8 * g) * ldq + h * E, ldq, nq, qt);
                /* scores s[j] (lanes = queries) and their max over the valid keys */
                __m256 mx = _mm256_set1_ps(-INFINITY);
                for (int j = 0; j < T; j++) {
                    s[j] = lane_dot(qt, kh + j * ldkv);
                    if (!kb || kb[j]) mx = _mm256_max_ps(mx, s[j]);
                }
                /* softmax over keys, elementwise across the 8 query lanes */
                __m256 sum = _mm256_setzero_ps();
                for (int j = 0; j < T; j++) {
                    s[j] = (!kb || kb[j]) ? exp_nonpos(_mm256_sub_ps(s[j], mx)) : _mm256_setzero_ps();
                    sum = _mm256_add_ps(sum, s[j]);
                }
                const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), sum), lanes_below(nq));
                /* O^T[e] = sum_j p[j] v[j][e] */
                for (int e = 0; e < E; e++) ot[e] = _mm256_setzero_ps();
                for (int j = 0; j < T; j++) {
                    const __m256 pj = _mm256_mul_ps(s[j], inv);
                    _mm256_storeu_ps(pg + j * 8, pj);
                    const float *vj = vh + j * ldkv;
                    for (int e = 0; e < E; e++) ot[e] = _mm256_fmadd_ps(pj, _mm256_broadcast_ss(vj + e), ot[e]);
                }
                store_t(ot, og, ldo, nq);
            }
        }
    }
    return 0;
}

int attn_bwd(int B, int T, int TQ, int H, const float *q, long ldq, const float *k, const float *v, long ldkv,
             const float *p, const float *dout, long lddo, float *dq, long lddq, float *dk, float *dv, long lddkv) {
    if (T > MAXT || TQ > T || T < 1) return -1;
    const int G = (TQ + 7) / 8;
    __m256 dkr[MAXT], dvr[MAXT];
    float ds[MAXT][8] __attribute__((aligned(32)));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *kh = k + (long)b * T * ldkv + h * E;
            const float *vh = v + (long)b * T * ldkv + h * E;
            for (int j = 0; j < T; j++) dkr[j] = dvr[j] = _mm256_setzero_ps();
            for (int g = 0; g < G; g++) {
                const int nq = TQ - 8 * g < 8 ? TQ - 8 * g : 8;
                const float *pg = p + (((long)b * H + h) * G + g) * T * 8;
                const float *qg = q + ((long)b * TQ + 8 * g) * ldq + h * E;
                const float *dog = dout + ((long)b * TQ + 8 * g) * lddo + h * E;
                __m256 dot_t[E];
                load_t(dog, lddo, nq, dot_t);
                /* dP[j] = dO V^T (lanes = queries); <P, dP> */
                __m256 dot = _mm256_setzero_ps();
                for (int j = 0; j < T; j++) {
                    const __m256 dp = lane_dot(dot_t, vh + j * ldkv);
                    _mm256_store_ps(ds[j], dp);
                    dot = _mm256_fmadd_ps(_mm256_loadu_ps(pg + j * 8), dp, dot);
                }
                /* dS = P (dP - <P, dP>); dQ^T[e] = sum_j dS[j] k[j][e] */
                __m256 dqt[E];
                for (int e = 0; e < E; e++) dqt[e] = _mm256_setzero_ps();
                for (int j = 0; j < T; j++) {
                    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(pg + j * 8), _mm256_sub_ps(_mm256_load_ps(ds[j]), dot));
                    _mm256_store_ps(ds[j], d);
                    const float *kj = kh + j * ldkv;
                    for (int e = 0; e < E; e++) dqt[e] = _mm256_fmadd_ps(d, _mm256_broadcast_ss(kj + e), dqt[e]);
                }
                store_t(dqt, dq + ((long)b * TQ + 8 * g) * lddq + h * E, lddq, nq);
                /* dK[j] += sum_l dS[j][l] q[l]; dV[j] += sum_l P[j][l] dO[l] (rows, lanes = e) */
                for (int l = 0; l < nq; l++) {
                    const __m256 ql = _mm256_loadu_ps(qg + l * ldq);
                    const __m256 dol = _mm256_loadu_ps(dog + l * lddo);
                    for (int j = 0; j < T; j++) {
                        dkr[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ds[j][l]), ql, dkr[j]);
                        dvr[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(pg + j * 8 + l), dol, dvr[j]);
                    }
                }
            }
            for (int j = 0; j < T; j++) {
                _mm256_storeu_ps(dk + ((long)b * T + j) * lddkv + h * E, dkr[j]);
                _mm256_storeu_ps(dv + ((long)b * T + j) * lddkv + h * E, dvr[j]);
            }
        }
    }
    return 0;
}

/* GELU (exact form, x Phi(x)) with the bias of the preceding linear layer fused in:
 *   forward:  z = x + bias[c] (stored, in place), g = z Phi(z)
 *   backward: dz = dg (Phi(z) + z phi(z))
 * Phi via erf, Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): for u >= 0,
 * erf(u) = 1 - (a1 s + a2 s^2 + a3 s^3 + a4 s^4 + a5 s^5) e^{-u^2}, s = 1 / (1 + p u); odd in u.
 * x, g, dg, dz: [rows, C] contiguous; C a multiple of 8. */
static inline void gelu_parts(__m256 z, __m256 *cdf, __m256 *pdf) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 u = _mm256_mul_ps(_mm256_andnot_ps(sign, z), _mm256_set1_ps(0.70710678118654752f));
    const __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), u, _mm256_set1_ps(1.0f)));
    __m256 y = _mm256_set1_ps(1.061405429f);
    y = _mm256_fmadd_ps(y, s, _mm256_set1_ps(-1.453152027f));
    y = _mm256_fmadd_ps(y, s, _mm256_set1_ps(1.421413741f));
    y = _mm256_fmadd_ps(y, s, _mm256_set1_ps(-0.284496736f));
    y = _mm256_fmadd_ps(y, s, _mm256_set1_ps(0.254829592f));
    y = _mm256_mul_ps(y, s);
    const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(u, u))); /* e^{-z^2/2} */
    const __m256 erf_abs = _mm256_fnmadd_ps(y, e, _mm256_set1_ps(1.0f));
    const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(sign, z)); /* odd */
    *cdf = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_add_ps(_mm256_set1_ps(1.0f), erf));
    *pdf = _mm256_mul_ps(e, _mm256_set1_ps(0.39894228040143268f));
}

int gelu_bias_fwd(long rows, int C, float *x, const float *bias, float *g) {
    if (C % 8) return -1;
    for (long r = 0; r < rows; r++)
        for (int c = 0; c < C; c += 8) {
            const __m256 z = _mm256_add_ps(_mm256_loadu_ps(x + r * C + c), _mm256_loadu_ps(bias + c));
            __m256 cdf, pdf;
            gelu_parts(z, &cdf, &pdf);
            _mm256_storeu_ps(x + r * C + c, z);
            _mm256_storeu_ps(g + r * C + c, _mm256_mul_ps(z, cdf));
        }
    return 0;
}

int gelu_bwd(long rows, int C, const float *dg, const float *z, float *dz) {
    if (C % 8) return -1;
    for (long i = 0; i < rows * C; i += 8) {
        const __m256 zz = _mm256_loadu_ps(z + i);
        __m256 cdf, pdf;
        gelu_parts(zz, &cdf, &pdf);
        _mm256_storeu_ps(dz + i, _mm256_mul_ps(_mm256_loadu_ps(dg + i), _mm256_fmadd_ps(zz, pdf, cdf)));
    }
    return 0;
}
