// Element types and conversions of the wholemem CUDA kernels: the first
// part of the NVRTC translation unit (source.rs puts it before
// kernels.cu; NVRTC sees no #include). With WM_HOST_TEST defined it also
// compiles as plain C++ on the host, where the PTX-only pieces (bit casts
// and the f16 conversions) have host equivalents, so a unit test can check
// the conversion rules against the CPU kernels (cuda/host_check.rs).

typedef unsigned char wm_u8;
typedef unsigned short wm_u16;
typedef unsigned int wm_u32;
typedef unsigned long long wm_u64;
typedef signed char wm_i8;
typedef short wm_i16;
typedef int wm_i32;
typedef long long wm_i64;

// Storage types of the two 16-bit floats: the bits, nothing else.
struct wm_f16 {
    wm_u16 bits;
};
struct wm_bf16 {
    wm_u16 bits;
};

// ------------------------------------------- bit casts and f16 (PTX)
#ifndef WM_HOST_TEST

__device__ __forceinline__ wm_u32 wm_f32_bits(float f) {
    wm_u32 r;
    asm("mov.b32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float wm_bits_f32(wm_u32 b) {
    float r;
    asm("mov.b32 %0, %1;" : "=f"(r) : "r"(b));
    return r;
}
__device__ __forceinline__ wm_u64 wm_f64_bits(double d) {
    wm_u64 r;
    asm("mov.b64 %0, %1;" : "=l"(r) : "d"(d));
    return r;
}
__device__ __forceinline__ double wm_bits_f64(wm_u64 b) {
    double r;
    asm("mov.b64 %0, %1;" : "=d"(r) : "l"(b));
    return r;
}

// f16 -> f32 and f16 -> f64 are exact.
__device__ __forceinline__ float wm_f16_to_f32(wm_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ double wm_f16_to_f64(wm_u16 h) {
    double d;
    asm("cvt.f64.f16 %0, %1;" : "=d"(d) : "h"(h));
    return d;
}
// f32 -> f16, round to nearest even, subnormals kept, overflow to infinity.
__device__ __forceinline__ wm_u16 wm_f32_to_f16(float f) {
    wm_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
// The host stand-ins (g++ or clang: _Float16 rounds to nearest even too).
inline wm_u32 wm_f32_bits(float f) {
    wm_u32 r;
    __builtin_memcpy(&r, &f, 4);
    return r;
}
inline float wm_bits_f32(wm_u32 b) {
    float r;
    __builtin_memcpy(&r, &b, 4);
    return r;
}
inline wm_u64 wm_f64_bits(double d) {
    wm_u64 r;
    __builtin_memcpy(&r, &d, 8);
    return r;
}
inline double wm_bits_f64(wm_u64 b) {
    double r;
    __builtin_memcpy(&r, &b, 8);
    return r;
}
inline float wm_f16_to_f32(wm_u16 h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
inline double wm_f16_to_f64(wm_u16 h) { return (double)wm_f16_to_f32(h); }
inline wm_u16 wm_f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    wm_u16 h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
#endif

// ------------------------------------------------------------ NaN, exact
//
// The hardware conversions above give a canonical NaN; the CPU path (x86
// F16C and SSE, and half's software fallbacks) keeps the sign and the
// leading payload bits and sets the quiet bit. These wrappers do the
// latter by hand and leave every other value to the hardware.

__device__ __forceinline__ double wm_f32_to_f64(float f) {
    const wm_u32 x = wm_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return wm_bits_f64(((wm_u64)(x & 0x80000000u) << 32) | 0x7FF8000000000000ull | ((wm_u64)(x & 0x007FFFFFu) << 29));
    }
    return (double)f;
}
__device__ __forceinline__ float wm_f64_to_f32(double d) {
    const wm_u64 x = wm_f64_bits(d);
    if ((x & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) {
        return wm_bits_f32((wm_u32)((x >> 32) & 0x80000000u) | 0x7FC00000u | (wm_u32)((x >> 29) & 0x007FFFFFu));
    }
    return (float)d;
}
__device__ __forceinline__ float wm_f16_to_f32_exact(wm_u16 h) {
    const wm_u32 x = (wm_u32)h;
    if ((x & 0x7FFFu) > 0x7C00u) {
        return wm_bits_f32(((x & 0x8000u) << 16) | 0x7FC00000u | ((x & 0x03FFu) << 13));
    }
    return wm_f16_to_f32(h);
}
__device__ __forceinline__ double wm_f16_to_f64_exact(wm_u16 h) {
    const wm_u64 x = (wm_u64)h;
    if ((x & 0x7FFFu) > 0x7C00u) {
        return wm_bits_f64(((x & 0x8000u) << 48) | 0x7FF8000000000000ull | ((x & 0x03FFu) << 42));
    }
    return wm_f16_to_f64(h);
}
__device__ __forceinline__ wm_u16 wm_f32_to_f16_exact(float f) {
    const wm_u32 x = wm_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (wm_u16)(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x03FFu));
    }
    return wm_f32_to_f16(f);
}
// f64 -> f16 rounds through f32 (two roundings), which is what `half`
// computes on x86-64 with F16C (every x86 host of a CUDA GPU):
// `f16::from_f64(v)` is `f32_to_f16_f16c(v as f32)` there.
__device__ __forceinline__ wm_u16 wm_f64_to_f16(double d) {
    return wm_f32_to_f16_exact(wm_f64_to_f32(d));
}

// ------------------------------------------------------ bf16 (bit exact)

// bf16 -> f32: the bits shifted up; a NaN gets its quiet bit, as in half.
__device__ __forceinline__ float wm_bf16_to_f32(wm_u16 b) {
    wm_u32 x = (wm_u32)b;
    if ((x & 0x7FFFu) > 0x7F80u) {
        x |= 0x0040u;
    }
    return wm_bits_f32(x << 16);
}
// bf16 -> f64: exact; a NaN keeps sign and payload and gets its quiet bit,
// as in half's `bf16_to_f64` (spelled out: the hardware f32 -> f64
// conversion does not promise NaN payloads).
__device__ __forceinline__ double wm_bf16_to_f64(wm_u16 b) {
    const wm_u64 x = (wm_u64)b;
    if ((x & 0x7FFFu) > 0x7F80u) {
        return wm_bits_f64(((x & 0x8000u) << 48) | 0x7FF8000000000000ull | ((x & 0x7Fu) << 45));
    }
    return (double)wm_bf16_to_f32(b); // exact: not a NaN
}
// f32 -> bf16, round to nearest even: half's `f32_to_bf16`, line for line
// (keeps NaN payloads the way half does, which cvt.rn.bf16.f32 would not).
__device__ __forceinline__ wm_u16 wm_f32_to_bf16(float f) {
    const wm_u32 x = wm_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (wm_u16)((x >> 16) | 0x0040u);
    }
    const wm_u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (wm_u16)((x >> 16) + 1u);
    }
    return (wm_u16)(x >> 16);
}
// f64 -> bf16: half's `f64_to_bf16`, line for line. It rounds to nearest
// even on the upper 32 bits of the double (the lower 32 mantissa bits do
// not count as sticky bits), so it is not always the correctly rounded
// result, but it is exactly what the CPU path computes on every host.
__device__ __forceinline__ wm_u16 wm_f64_to_bf16(double d) {
    const wm_u64 val = wm_f64_bits(d);
    const wm_u32 x = (wm_u32)(val >> 32);
    const wm_u32 sign = x & 0x80000000u;
    const wm_u32 exp = x & 0x7FF00000u;
    wm_u32 man = x & 0x000FFFFFu;
    if (exp == 0x7FF00000u) {
        const wm_u32 nan_bit = (man == 0u && (wm_u32)val == 0u) ? 0u : 0x0040u;
        return (wm_u16)((sign >> 16) | 0x7F80u | nan_bit | (man >> 13));
    }
    const wm_u32 half_sign = sign >> 16;
    const int half_exp = (int)(exp >> 20) - 1023 + 127;
    if (half_exp >= 0xFF) {
        return (wm_u16)(half_sign | 0x7F80u);
    }
    if (half_exp <= 0) {
        if (7 - half_exp > 21) {
            return (wm_u16)half_sign;
        }
        man |= 0x00100000u;
        wm_u32 half_man = man >> (14 - half_exp);
        const wm_u32 round_bit = 1u << (13 - half_exp);
        if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
            half_man += 1u;
        }
        return (wm_u16)(half_sign | half_man);
    }
    const wm_u32 bits = half_sign | ((wm_u32)half_exp << 7) | (man >> 13);
    const wm_u32 round_bit = 0x00001000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        return (wm_u16)(bits + 1u);
    }
    return (wm_u16)bits;
}

// ----------------------------------------------------- the conversion rule
//
// As `floats::<S, D>` in kernel.rs: through f64 when either side is f64,
// else through f32. Integers: widen to i64, then narrow (C++ two's
// complement truncation, which NVRTC implements as Rust's `as` does).

template <typename T> struct WmFloat;
template <> struct WmFloat<float> {
    static const bool wide = false;
    static __device__ __forceinline__ float to32(float v) { return v; }
    static __device__ __forceinline__ float from32(float v) { return v; }
    static __device__ __forceinline__ double to64(float v) { return wm_f32_to_f64(v); }
    static __device__ __forceinline__ float from64(double v) { return wm_f64_to_f32(v); }
};
template <> struct WmFloat<double> {
    static const bool wide = true;
    static __device__ __forceinline__ float to32(double v) { return wm_f64_to_f32(v); }
    static __device__ __forceinline__ double from32(float v) { return wm_f32_to_f64(v); }
    static __device__ __forceinline__ double to64(double v) { return v; }
    static __device__ __forceinline__ double from64(double v) { return v; }
};
template <> struct WmFloat<wm_f16> {
    static const bool wide = false;
    static __device__ __forceinline__ float to32(wm_f16 v) { return wm_f16_to_f32_exact(v.bits); }
    static __device__ __forceinline__ wm_f16 from32(float v) {
        wm_f16 r;
        r.bits = wm_f32_to_f16_exact(v);
        return r;
    }
    static __device__ __forceinline__ double to64(wm_f16 v) { return wm_f16_to_f64_exact(v.bits); }
    static __device__ __forceinline__ wm_f16 from64(double v) {
        wm_f16 r;
        r.bits = wm_f64_to_f16(v);
        return r;
    }
};
template <> struct WmFloat<wm_bf16> {
    static const bool wide = false;
    static __device__ __forceinline__ float to32(wm_bf16 v) { return wm_bf16_to_f32(v.bits); }
    static __device__ __forceinline__ wm_bf16 from32(float v) {
        wm_bf16 r;
        r.bits = wm_f32_to_bf16(v);
        return r;
    }
    static __device__ __forceinline__ double to64(wm_bf16 v) { return wm_bf16_to_f64(v.bits); }
    static __device__ __forceinline__ wm_bf16 from64(double v) {
        wm_bf16 r;
        r.bits = wm_f64_to_bf16(v);
        return r;
    }
};

template <typename T> struct WmIsFloat {
    static const bool value = false;
};
template <> struct WmIsFloat<float> {
    static const bool value = true;
};
template <> struct WmIsFloat<double> {
    static const bool value = true;
};
template <> struct WmIsFloat<wm_f16> {
    static const bool value = true;
};
template <> struct WmIsFloat<wm_bf16> {
    static const bool value = true;
};

template <typename S, typename D, bool SF = WmIsFloat<S>::value, bool DF = WmIsFloat<D>::value> struct WmConvert;
template <typename S, typename D> struct WmConvert<S, D, true, true> {
    static __device__ __forceinline__ D run(S v) {
        if (WmFloat<S>::wide || WmFloat<D>::wide) {
            return WmFloat<D>::from64(WmFloat<S>::to64(v));
        }
        return WmFloat<D>::from32(WmFloat<S>::to32(v));
    }
};
template <typename S, typename D> struct WmConvert<S, D, false, false> {
    static __device__ __forceinline__ D run(S v) { return (D)(wm_i64)v; }
};
// The same type: the bits, unchanged (NaN payloads and all), as the CPU's copy.
template <typename T> struct WmConvert<T, T, true, true> {
    static __device__ __forceinline__ T run(T v) { return v; }
};
template <typename T> struct WmConvert<T, T, false, false> {
    static __device__ __forceinline__ T run(T v) { return v; }
};
// Floating <-> integer has no specialisation on purpose: instantiating one
// is a compile error, as DType::check_conversion refuses it on the host.

