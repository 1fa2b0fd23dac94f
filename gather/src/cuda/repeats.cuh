// The hash table that resolves repeated ids of a scatter on the device:
// "within one call the last occurrence of an id wins". source.rs puts this
// after convert.cuh (it uses its integer types) and before kernels.cu.
//
// `mark` inserts every id with its position: an open-addressing table of
// `capacity` slots (a power of two above the number of ids, so a probe
// always ends), keys claimed with a compare-and-swap, and each slot keeping
// the highest position of its key with an atomic maximum. `keep` then looks
// each id up: position i is kept when it is the highest. Both results are
// the same whatever order the threads run in (the maximum is commutative,
// and each key ends in exactly one slot), which is what makes the outcome
// deterministic. `cuda/repeats.rs` is the same algorithm in Rust, checked
// against the rule; with WM_HOST_TEST this file compiles as host C++
// (sequential stand-ins for the atomics) and a unit test checks it against
// that reference (cuda/host_check.rs).

// A slot no key has claimed. Ids are checked to be in range (>= 0) before
// they are inserted, so no id is ever this value.
#define WM_EMPTY_KEY 0xffffffffffffffffULL

#ifndef WM_HOST_TEST
__device__ __forceinline__ wm_u64 wm_atomic_cas_u64(wm_u64* at, wm_u64 expected, wm_u64 desired) {
    return atomicCAS(at, expected, desired);
}
__device__ __forceinline__ void wm_atomic_max_u32(wm_u32* at, wm_u32 v) {
    atomicMax(at, v);
}
#else
inline wm_u64 wm_atomic_cas_u64(wm_u64* at, wm_u64 expected, wm_u64 desired) {
    const wm_u64 old = *at;
    if (old == expected) {
        *at = desired;
    }
    return old;
}
inline void wm_atomic_max_u32(wm_u32* at, wm_u32 v) {
    if (*at < v) {
        *at = v;
    }
}
#endif

// The slot a key's probe starts at: the murmur3 64-bit finaliser, so ids
// that are close (the common case) spread over the table.
__device__ __forceinline__ wm_u64 wm_repeat_hash(wm_u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// Records position `i` of `key`: claims the key's slot (or finds it), then
// raises the slot's position to `i`.
__device__ __forceinline__ void wm_repeat_insert(wm_u64* keys, wm_u32* vals, wm_u64 mask, wm_u64 key, wm_u32 i) {
    wm_u64 s = wm_repeat_hash(key) & mask;
    for (;;) {
        const wm_u64 prev = wm_atomic_cas_u64(&keys[s], WM_EMPTY_KEY, key);
        if (prev == WM_EMPTY_KEY || prev == key) {
            wm_atomic_max_u32(&vals[s], i);
            return;
        }
        s = (s + 1u) & mask;
    }
}

// Whether position `i` is the highest recorded for `key` (after every
// insert has finished: a later launch). A key that was never inserted
// (cannot happen for an id in range) is kept nowhere.
__device__ __forceinline__ wm_u8 wm_repeat_is_last(const wm_u64* keys, const wm_u32* vals, wm_u64 mask, wm_u64 key, wm_u32 i) {
    wm_u64 s = wm_repeat_hash(key) & mask;
    for (wm_u64 probes = 0; probes <= mask; ++probes) {
        const wm_u64 k = keys[s];
        if (k == key) {
            return vals[s] == i ? 1u : 0u;
        }
        if (k == WM_EMPTY_KEY) {
            return 0u;
        }
        s = (s + 1u) & mask;
    }
    return 0u;
}
