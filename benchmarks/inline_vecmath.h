/* Branch-free inline float32 math: range reduction, polynomial, selects as bit operations
 * (a `?:` arm computed only for the select becomes a branch under GCC's default
 * -ftrapping-math, and the loop does not vectorise). The contender to glibc's libmvec in
 * benchmarks/vector_math.py, not used by generated code (docs/backends.md has the figures).
 * vm_<f>(x) computes <f>f(x); needs <math.h> and <stdint.h>. Polynomials: exp, log and
 * tanh's small-argument one are Cephes'; erf's were fitted (minimax by reweighted least
 * squares) on [0, 1] in x^2 and on [1, 4] against erfcx; sin and cos reduce in double
 * precision, exactly for every float (no table lookup: GCC's AMD tuning does not vectorise
 * gathers), and evaluate Taylor polynomials in double. */
#define VM_INLINE static inline __attribute__((always_inline))
typedef union { float f; uint32_t u; } vm_f32_bits;
typedef union { double d; uint64_t u; } vm_f64_bits;
VM_INLINE uint32_t vm_bits(float x) { vm_f32_bits b; b.f = x; return b.u; }
VM_INLINE float vm_float(uint32_t u) { vm_f32_bits b; b.u = u; return b.f; }
VM_INLINE uint64_t vm_bits64(double x) { vm_f64_bits b; b.d = x; return b.u; }
/* 2^k for k in [-126, 127] */
VM_INLINE float vm_pow2(int32_t k) { return vm_float((uint32_t)(k + 127) << 23); }
/* c ? a : b as bit operations: with -ftrapping-math (GCC's default) a `?:` whose operand is
 * computed only for it becomes a branch, and the loop around it does not vectorise */
VM_INLINE float vm_select(int c, float a, float b) {
    const uint32_t mask = -(uint32_t)(c != 0);
    return vm_float((vm_bits(a) & mask) | (vm_bits(b) & ~mask));
}
VM_INLINE double vm_select64(int64_t c, double a, double b) { /* c is 0 or 1 */
    const uint64_t mask = -(uint64_t)c;
    vm_f64_bits r;
    r.u = (vm_bits64(a) & mask) | (vm_bits64(b) & ~mask);
    return r.d;
}
/* x 2/pi = q + t, q mod 4 exact, |t| <= 5/8 (t to ~2^-100), with no table lookup (GCC's
 * AMD tuning does not vectorise gathers): x = a 2^g, g in {0, 1, 27, 53, 79}, a an integer
 * below 2^49 when g > 0, and a ((2^g 2/pi) mod 4) has the fraction and q mod 4 of x 2/pi;
 * the constant is three doubles, products are split exactly with fma */
typedef struct { double r; int64_t q; } vm_quadrant;
VM_INLINE vm_quadrant vm_reduce_pi2(float x) {
    const int32_t e = (int32_t)((vm_bits(x) >> 23) & 0xffu) - 150; /* x = m 2^e, m < 2^24 */
    const int32_t g =
        e >= 79 ? 79 :
        e >= 53 ? 53 :
        e >= 27 ? 27 :
        e >= 1 ? 1 :
        0;
    const double hi =
        e >= 79 ? 0x1.d5f47d4d37703p+1 :
        e >= 53 ? 0x1.529fc2757d1f5p+1 :
        e >= 27 ? 0x1.b9391054a7f0ap+1 :
        e >= 1 ? 0x1.45f306dc9c883p+0 :
        0x1.45f306dc9c883p-1;
    const double mid =
        e >= 79 ? 0x1.b6295993c4390p-53 :
        e >= 53 ? 0x1.a6ee06db14acdp-54 :
        e >= 27 ? -0x1.505c1596447e5p-54 :
        e >= 1 ? -0x1.6b01ec5417056p-54 :
        -0x1.6b01ec5417056p-55;
    const double lo =
        e >= 79 ? 0x1.07f9458eaf7afp-107 :
        e >= 53 ? -0x1.8778df7c035d4p-108 :
        e >= 27 ? 0x1.b14acc9e21c82p-108 :
        e >= 1 ? -0x1.6447e493ad4cep-108 :
        -0x1.6447e493ad4cep-109;
    const double a = (double)(x * vm_pow2(-g));
    const double p1 = a * hi, e1 = fma(a, hi, -p1), p2 = a * mid, e2 = fma(a, mid, -p2);
    const double shift1 = p1 + 0x1.8p52, f1 = p1 - (shift1 - 0x1.8p52); /* exact */
    const double s = f1 + e1, v = s - f1, s_err = (f1 - (s - v)) + (e1 - v); /* two-sum */
    const double shift2 = s + 0x1.8p52, f2 = s - (shift2 - 0x1.8p52);
    vm_quadrant result;
    result.q = (int64_t)((vm_bits64(shift1) + vm_bits64(shift2)) & 3u);
    result.r = ((f2 + p2) + (s_err + e2 + a * lo)) * 0x1.921fb54442d18p0;
    return result;
}
/* sin(r) (odd) and cos(r) (even) for |r| <= 1: Taylor in double, error < 2^-36 */
VM_INLINE double vm_sin_poly(double r) {
    const double z = r * r;
    return r + r * z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880
                        + z * (-1.0 / 39916800 + z * (1.0 / 6227020800.0))))));
}
VM_INLINE double vm_cos_poly(double r) {
    const double z = r * r;
    return 1.0 + z * (-0.5 + z * (1.0 / 24 + z * (-1.0 / 720 + z * (1.0 / 40320
                      + z * (-1.0 / 3628800 + z * (1.0 / 479001600.0))))));
}
/* sin(x + q0 pi/2) */
VM_INLINE float vm_sin_quadrant(float x, int64_t q0) {
    const vm_quadrant p = vm_reduce_pi2(x);
    const int64_t q = p.q + q0;
    const double s = vm_sin_poly(p.r), c = vm_cos_poly(p.r);
    const double y = vm_select64(q & 1, c, s);
    const float value = (float)vm_select64((q >> 1) & 1, -y, y), nan = x - x; /* inf, NaN */
    return vm_select(fabsf(x) <= 3.40282347e38f, value, nan);
}
VM_INLINE float vm_cos(float x) { return vm_sin_quadrant(x, 1); }
/* x = k ln2 + r, |r| <= ln2/2 (Cody-Waite); x is clamped where exp is 0 or inf, NaN passes */
typedef struct { float r; int32_t k; } vm_exp_parts;
VM_INLINE vm_exp_parts vm_exp_reduce(float x) {
    const float above = vm_select(x < -104.0f, -104.0f, x);
    const float c = vm_select(above > 89.0f, 89.0f, above);
    const float t = c * 1.44269504088896341f + 12582912.0f; /* 0x1.8p23 rounds to integer */
    const float n = t - 12582912.0f;
    vm_exp_parts p;
    p.r = c - n * 0.693359375f - n * -2.12194440e-4f;
    p.k = (int32_t)(vm_bits(t) - 0x4b400000u);
    return p;
}
/* e^r - 1 for |r| <= ln2/2 (Cephes) */
VM_INLINE float vm_expm1_poly(float r) {
    const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                      + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    return p * r * r + r;
}
VM_INLINE float vm_exp(float x) {
    /* 2^k in two normal factors: a denormal or infinite result is rounded once */
    const vm_exp_parts p = vm_exp_reduce(x);
    const int32_t k1 = p.k >> 1;
    return (vm_expm1_poly(p.r) + 1.0f) * vm_pow2(k1) * vm_pow2(p.k - k1);
}
VM_INLINE float vm_erf(float x) {
    /* |x| < 1: x + x P(x^2); above: 1 - exp(-x^2) Q(|x|), Q ~ erfcx on [1, 4] (erf rounds
     * to 1 beyond 3.92), exp(-c^2) = exp(-h) (1 - l) with c^2 = h + l exactly */
    const float a = fabsf(x), z = x * x;
    const float p = ((((((-9.68013592e-6f * z + 1.12705442e-4f) * z - 8.48471129e-4f) * z
                        + 5.22107491e-3f) * z - 2.68654451e-2f) * z + 1.12837829e-1f) * z
                     - 3.76126379e-1f) * z + 1.28379167e-1f;
    const float c = vm_select(a > 4.0f, 4.0f, a), h = c * c, t = c - 2.5f;
    const float q = ((((((((-2.79942760e-5f * t - 5.77789069e-5f) * t - 1.36206261e-4f) * t
                          + 2.23673822e-4f) * t - 6.49166876e-4f) * t + 2.52070511e-3f) * t
                       - 8.00019316e-3f) * t + 2.49295328e-2f) * t - 7.43493810e-2f) * t
                    + 2.10806340e-1f;
    const float erfc = vm_exp(-h) * (1.0f - fmaf(c, c, -h)) * q;
    const float small = fmaf(x, p, x), large = copysignf(1.0f - erfc, x);
    return vm_select(a < 1.0f, small, large);
}
VM_INLINE float vm_expm1(float x) {
    const vm_exp_parts p = vm_exp_reduce(x);
    const float q = vm_expm1_poly(p.r);
    const int32_t k1 = p.k >> 1;
    const float s1 = vm_pow2(k1), s2 = vm_pow2(p.k - k1), s = s1 * s2;
    /* 2^k (q + 1) - 1: 2^k - 1 is exact for |k| <= 24, and 2^128 overflows alone */
    const float small = s * q + (s - 1.0f), large = (q + 1.0f) * s1 * s2 - 1.0f;
    const float y = vm_select(p.k == 0, q, vm_select(p.k > 64, large, small));
    return vm_select(x == 0.0f, x, y); /* keeps -0 */
}
VM_INLINE float vm_log(float x) {
    /* x = 2^e m, m in [sqrt(1/2), sqrt(2)); log(m) by Cephes' polynomial in f = m - 1 */
    const int tiny = x < 1.17549435e-38f; /* denormal: scale by 2^23 first */
    const float scaled = x * 8388608.0f;
    const uint32_t u = vm_bits(vm_select(tiny, scaled, x));
    const float m = vm_float((u & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    const int low = m < 0.707106781186547524f;
    const int32_t e = (int32_t)((u >> 23) & 0xffu) - (tiny ? 149 : 126) - low;
    const float f_low = m + m - 1.0f, f_high = m - 1.0f;
    const float f = vm_select(low, f_low, f_high), z = f * f, fe = (float)e;
    const float p = (((((((7.0376836292e-2f * f - 1.1514610310e-1f) * f + 1.1676998740e-1f) * f
                        - 1.2420140846e-1f) * f + 1.4249322787e-1f) * f - 1.6668057665e-1f) * f
                      + 2.0000714765e-1f) * f - 2.4999993993e-1f) * f + 3.3333331174e-1f;
    const float y = p * f * z + -2.12194440e-4f * fe - 0.5f * z;
    const float r = f + y + 0.693359375f * fe;
    const float special = vm_select(x == 0.0f, -INFINITY, vm_select(x < 0.0f, NAN, x));
    return vm_select((x > 0.0f) & (x <= 3.40282347e38f), r, special); /* x: +inf, NaN */
}
VM_INLINE float vm_log1p(float x) {
    /* log(u) for u = 1 + x rounded, plus the first-order correction of that rounding */
    const float u = 1.0f + x;
    const float r = vm_log(u) + (x - (u - 1.0f)) / u;
    const int infinite = x > 3.40282347e38f, tiny = u == 1.0f; /* tiny: keeps -0 */
    return vm_select(x == -1.0f, -INFINITY, vm_select(infinite | tiny, x, r));
}
VM_INLINE float vm_sigmoid(float x) {
    /* stable: exp of a non-positive number only */
    const float e = vm_exp(-fabsf(x));
    return vm_select(x >= 0.0f, 1.0f, e) / (1.0f + e);
}
VM_INLINE float vm_sin(float x) {
    const float y = vm_sin_quadrant(x, 0);
    return vm_select(x == 0.0f, x, y); /* keeps -0 */
}
VM_INLINE float vm_softplus(float x) {
    return vm_select(x > 0.0f, x, 0.0f) + vm_log1p(vm_exp(-fabsf(x)));
}
VM_INLINE float vm_tanh(float x) {
    /* |x| < 0.625: odd polynomial (Cephes); above: expm1(2|x|) / (expm1(2|x|) + 2) */
    const float a = fabsf(x);
    const float c = vm_select(a > 10.0f, 10.0f, a); /* tanh(10) rounds to 1 */
    const float z = x * x;
    const float p = (((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                     + 1.33314422036e-1f) * z - 3.33332819422e-1f;
    const float em = vm_expm1(c + c);
    const float small = p * z * a + a, large = em / (em + 2.0f);
    return copysignf(vm_select(a < 0.625f, small, large), x);
}
