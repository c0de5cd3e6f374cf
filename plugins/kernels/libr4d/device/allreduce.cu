// libr4d device P2P collectives: all_reduce (one-shot and two-shot) and all_gather over buffers that
// every rank exports by IPC handle and every peer maps (collectives/device_p2p.py sets them up).
// HIP-flavoured C++ compiled at run time by nvrtc (or hiprtc); no headers.
//
// A rank's region (one device allocation, exported; RAD_P2P_* offsets in bytes):
//   [ control: RAD_P2P_CTRL_BYTES ][ slot 0: slot_bytes ][ slot 1: slot_bytes ]
//   control = READY[world][block] u64 | DONE[world][block] u64 | EPOCH[block] u64 | ARRIVE u32 | ERROR u32
// READY[p][b] / DONE[p][b] in rank r's control are written by peer p's block b (a system-scope release
// store over NVLink) and polled by rank r's block b (a system-scope acquire load of local memory).
//
// Epochs. Each launch of any kernel here is one epoch e on every rank (every rank launches the same
// sequence). The counter lives on the card, so a captured graph replays without any reset: block b
// reads EPOCH[b] + 1 and writes it into every EPOCH[i] with i = b (mod gridDim.x), so all
// RAD_P2P_MAX_BLOCKS words advance by one per launch whatever the grid, and no word is read and
// written by two blocks. Flags hold tags (epoch, step) that only grow, so a wait is `>= tag`. Launch e uses slot
// e & 1; a slot is written again at e + 2, after this rank has seen every peer's flag of e + 1, which
// a peer stores only after its launch e has completed: no rank overwrites bytes a peer still reads.
//
// Grids are the same on every rank for the same call (the host computes them from the sizes), and
// block b only ever waits for the peers' block b, so blocks never wait for blocks of their own card.
//
// Host-staged form (compiled with -DRAD_P2P_HOST_MAPPED=1; collectives/device_peers.py): on cards
// without P2P, every rank's region (control flags and slots) lives in POSIX shared memory that every
// card maps (cuMemHostRegister, DEVICEMAP); peers.base[] are those mapped addresses and the same
// kernels move the bytes over PCIe. Memory ordering there: the PTX model's system-scope release /
// acquire holds for mapped host memory as for peer memory, but the card's L2 may hold lines of system
// memory that another card rewrote over PCIe, so in that form every slot load is ld.global.cv (drop
// a cached system-memory line, fetch again) and every thread fences at system scope
// (__threadfence_system) before the barrier that precedes a flag's release store. The words only
// this card touches (EPOCH, ARRIVE, ERROR, with their atomics) are at peers.local, a small device
// allocation, in either form (peers.local = peers.base[rank] in the P2P form): no atomic ever
// operates on mapped host memory.
//
// Sums are in rank order, ((x_0 + x_1) + x_2) + ..., in f32, rounded once to the output type:
// every rank holds the same bits, whichever form ran.

#define RAD_P2P_MAX_WORLD 8
#define RAD_P2P_MAX_BLOCKS 512
#define RAD_P2P_THREADS 512
#define RAD_P2P_READY_OFF 0
#define RAD_P2P_DONE_OFF 32768
#define RAD_P2P_EPOCH_OFF 65536
#define RAD_P2P_ARRIVE_OFF 69632
#define RAD_P2P_ERROR_OFF 69636
#define RAD_P2P_CTRL_BYTES 131072
#define RAD_P2P_STEP_BYTES 65536
#define RAD_P2P_TAG_STEP_BITS 20

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#if defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__) || defined(__HIP_PLATFORM_AMD__)
#define RAD_HIP 1
#endif

// Every rank's region base, own included; passed by value.
// `local`: this card's own EPOCH / ARRIVE / ERROR words (the same offsets, in device memory). 72 bytes.
struct RadP2PPeers { u64 base[RAD_P2P_MAX_WORLD]; u64 local; };

// ---- memory ordering: system scope ------------------------------------------------------------
__device__ __forceinline__ u64 rad_ld_acquire_sys(const u64* p) {
#ifdef RAD_HIP
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ void rad_st_release_sys(u64* p, u64 v) {
#ifdef RAD_HIP
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
#endif
}

__device__ __forceinline__ u64 rad_now_ns() {
#ifdef RAD_HIP
    return wall_clock64() * 10ull;   // 100 MHz constant clock on CDNA (not checked on a card)
#else
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

// A peer's bytes: bypass L1 (.cg), they change under this kernel from one epoch to the next.
// Host-staged: .cv, which also drops a cached line of system memory (see the top of this file).
#ifdef RAD_P2P_HOST_MAPPED
#define RAD_LD_PEER_COP "cv"
#else
#define RAD_LD_PEER_COP "cg"
#endif
__device__ __forceinline__ uint4 rad_ld_peer(const uint4* p) {
    uint4 v;
#ifdef RAD_HIP
    const u32* w = (const u32*)p;
    v.x = __builtin_nontemporal_load(w); v.y = __builtin_nontemporal_load(w + 1);
    v.z = __builtin_nontemporal_load(w + 2); v.w = __builtin_nontemporal_load(w + 3);
#else
    asm volatile("ld.global." RAD_LD_PEER_COP ".v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
}

__device__ __forceinline__ float rad_ld_peer(const float* p) {
#ifdef RAD_HIP
    return __builtin_nontemporal_load(p);
#else
    float v;
    asm volatile("ld.global." RAD_LD_PEER_COP ".f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#endif
}

__device__ __forceinline__ u16 rad_ld_peer(const u16* p) {
#ifdef RAD_HIP
    return __builtin_nontemporal_load(p);
#else
    u16 v;
    asm volatile("ld.global." RAD_LD_PEER_COP ".u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
#endif
}

// Host-staged: a slot of this rank's own is system memory that peers write too, so every load that
// may touch a slot takes the peer path (x and y are device memory; .cv there costs nothing extra).
template <typename V> __device__ __forceinline__ V rad_ld(const V* p, bool peer) {
#ifdef RAD_P2P_HOST_MAPPED
    return rad_ld_peer(p);
#else
    return peer ? rad_ld_peer(p) : *p;
#endif
}

// ---- element types: f32 and bf16 (u16 bits), f32 arithmetic ------------------------------------
__device__ __forceinline__ float rad_to_f32(float v) { return v; }
__device__ __forceinline__ float rad_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }
__device__ __forceinline__ void rad_from_f32(float& out, float v) { out = v; }
__device__ __forceinline__ void rad_from_f32(u16& out, float v) {   // round to nearest even
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { out = (u16)((u >> 16) | 0x40u); return; }   // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    out = (u16)(u >> 16);
}

template <typename T> union RadPack {
    enum { E = 16 / sizeof(T) };
    uint4 v;
    T e[16 / sizeof(T)];
};

// ---- the pieces of a message --------------------------------------------------------------------
// Part idx of `parts` of [0, total): whole 16-byte packs, the last part takes the rest.
__device__ __forceinline__ void rad_piece(u64 total, u32 parts, u32 idx, u32 E, u64& lo, u64& hi) {
    u64 packs = (total + E - 1) / E;
    u64 per = (packs + parts - 1) / parts * E;
    lo = (u64)idx * per;
    if (lo > total) lo = total;
    hi = lo + per;
    if (hi > total) hi = total;
}

// ---- flags, epochs, the end of the link-gate hold -------------------------------------------------
// A flag's value: the epoch in the high bits, the step + 1 in the low RAD_P2P_TAG_STEP_BITS, so flags
// only grow, within an epoch and from one epoch to the next, whatever kernel stored them.
__device__ __forceinline__ u64 rad_tag(u64 e, u32 s) { return (e << RAD_P2P_TAG_STEP_BITS) + s + 1; }

__device__ __forceinline__ u64 rad_epoch(u64 local) {
    __shared__ u64 epoch;
    u64* words = (u64*)(local + RAD_P2P_EPOCH_OFF);
    if (threadIdx.x == 0) epoch = words[blockIdx.x] + 1;
    __syncthreads();
    u64 e = epoch;
    for (u64 i = blockIdx.x + (u64)threadIdx.x * gridDim.x; i < RAD_P2P_MAX_BLOCKS; i += (u64)blockDim.x * gridDim.x)
        words[i] = e;
    return e;
}

// After every thread of the block has written what the flag announces: one release store per peer
// into that peer's control region (READY or DONE, row = this rank, column = this block).
__device__ __forceinline__ void rad_signal(const RadP2PPeers& peers, u32 flag_off, int rank, int world, u64 tag) {
#ifdef RAD_P2P_HOST_MAPPED
    __threadfence_system();   // this thread's stores to mapped host memory, out of the card's L2
#endif
    __syncthreads();
    int t = threadIdx.x;
    if (t < world && t != rank)
        rad_st_release_sys((u64*)(peers.base[t] + flag_off) + (u64)rank * RAD_P2P_MAX_BLOCKS + blockIdx.x, tag);
}

// Thread p polls peer p's flag for this block in this rank's own control region; the block then
// passes a barrier. A wait longer than timeout_ns sets ERROR and gives up (the host reports it).
__device__ __forceinline__ void rad_wait(const RadP2PPeers& peers, int rank, u32 flag_off, int world, u64 tag,
                                         u64 timeout_ns) {
    int t = threadIdx.x;
    if (t < world && t != rank) {
        const u64* word = (const u64*)(peers.base[rank] + flag_off) + (u64)t * RAD_P2P_MAX_BLOCKS + blockIdx.x;
        volatile u32* error = (volatile u32*)(peers.local + RAD_P2P_ERROR_OFF);
        if (rad_ld_acquire_sys(word) < tag && !*error) {
            u64 start = rad_now_ns();
            u32 spins = 0;
            while (rad_ld_acquire_sys(word) < tag) {
                if ((++spins & 1023u) == 0 && (rad_now_ns() - start > timeout_ns || *error)) {
                    atomicExch((u32*)error, 1u);
                    break;
                }
            }
        }
    }
    __syncthreads();
}

// Once every block has read its last peer byte: the last block to arrive resets the counter and,
// colour 2, stores 0 into the mapped host gate word (system scope). linger_ns keeps that block
// running afterwards (a stand-in for a fused epilogue; the card tests use it, the engine passes 0).
__device__ __forceinline__ void rad_finish(u64 local, u64 gate, u64 linger_ns) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* arrive = (u32*)(local + RAD_P2P_ARRIVE_OFF);
        if (atomicAdd(arrive, 1u) == gridDim.x - 1) {
            atomicExch(arrive, 0u);
            if (gate) rad_st_release_sys((u64*)gate, 0ull);
            if (linger_ns) {
                u64 start = rad_now_ns();
                while (rad_now_ns() - start < linger_ns) {}
            }
        }
    }
}

// ---- moving and summing [0, n) elements of a piece ------------------------------------------------
template <typename T>
__device__ __forceinline__ void rad_copy(T* dst, const T* src, u64 n, bool src_peer) {
    const u32 E = RadPack<T>::E;
    u64 packs = n / E;
    for (u64 k = threadIdx.x; k < packs; k += blockDim.x)
        ((uint4*)dst)[k] = rad_ld((const uint4*)src + k, src_peer);
    for (u64 i = packs * E + threadIdx.x; i < n; i += blockDim.x)
        dst[i] = rad_ld(src + i, src_peer);
}

// out[i] (and out2[i] when given) = rank-order sum of src[0..world)[i]; src[rank] is local, the
// others are a peer's when peers_remote.
template <typename T>
__device__ __forceinline__ void rad_sum(T* out, T* out2, const T* const* src, int world, int rank,
                                        bool peers_remote, u64 n) {
    const u32 E = RadPack<T>::E;
    u64 packs = n / E;
    for (u64 k = threadIdx.x; k < packs; k += blockDim.x) {
        RadPack<T> in[RAD_P2P_MAX_WORLD];
#pragma unroll
        for (int p = 0; p < RAD_P2P_MAX_WORLD; ++p)
            if (p < world) in[p].v = rad_ld((const uint4*)src[p] + k, peers_remote && p != rank);
        float acc[RadPack<T>::E];
#pragma unroll
        for (u32 j = 0; j < E; ++j) acc[j] = rad_to_f32(in[0].e[j]);
#pragma unroll
        for (int p = 1; p < RAD_P2P_MAX_WORLD; ++p)
            if (p < world) {
#pragma unroll
                for (u32 j = 0; j < E; ++j) acc[j] = acc[j] + rad_to_f32(in[p].e[j]);
            }
        RadPack<T> res;
#pragma unroll
        for (u32 j = 0; j < E; ++j) rad_from_f32(res.e[j], acc[j]);
        ((uint4*)out)[k] = res.v;
        if (out2) ((uint4*)out2)[k] = res.v;
    }
    for (u64 i = packs * E + threadIdx.x; i < n; i += blockDim.x) {
        float acc = rad_to_f32(rad_ld(src[0] + i, peers_remote && rank != 0));
        for (int p = 1; p < world; ++p) acc = acc + rad_to_f32(rad_ld(src[p] + i, peers_remote && p != rank));
        T res;
        rad_from_f32(res, acc);
        out[i] = res;
        if (out2) out2[i] = res;
    }
}

// ---- the collectives ------------------------------------------------------------------------------
// One-shot: block b publishes its piece of x into this rank's slot, tells every peer, waits for
// every peer's piece b, and sums piece b of every slot (its own x for itself) in rank order.
template <typename T>
__device__ __forceinline__ void rad_all_reduce_one_shot(const RadP2PPeers& peers, const T* x, T* y, u64 count,
                                                        int rank, int world, u64 slot_bytes, u64 gate,
                                                        u64 timeout_ns, u64 linger_ns) {
    const u64 own = peers.base[rank];
    const u64 e = rad_epoch(peers.local);
    const u64 slot = RAD_P2P_CTRL_BYTES + (e & 1) * slot_bytes;
    u64 lo, hi;
    rad_piece(count, gridDim.x, blockIdx.x, RadPack<T>::E, lo, hi);
    rad_copy((T*)(own + slot) + lo, x + lo, hi - lo, false);
    rad_signal(peers, RAD_P2P_READY_OFF, rank, world, rad_tag(e, 0));
    rad_wait(peers, rank, RAD_P2P_READY_OFF, world, rad_tag(e, 0), timeout_ns);
    const T* src[RAD_P2P_MAX_WORLD];
    for (int p = 0; p < RAD_P2P_MAX_WORLD; ++p)
        src[p] = p == rank ? x + lo : p < world ? (const T*)(peers.base[p] + slot) + lo : 0;
    rad_sum(y + lo, (T*)0, src, world, rank, true, hi - lo);
    rad_finish(peers.local, gate, linger_ns);
}

// Two-shot: chunk c = part c of `world` of the message, at offset c * stride. Block b owns part b
// of every chunk, and walks it in steps of RAD_P2P_STEP_BYTES (the same count of steps on every rank).
//   1. push: step s of piece b of chunk p of x goes into peer p's slot at p's inbox for this rank
//      (offset rank * stride + its offset in chunk p); then READY (tag e, s) to every peer.
//   2. reduce: once every peer's READY (e, s), step s of this rank's chunk = rank-order sum of the
//      inboxes (local) and x's own chunk, into y and into this rank's slot at rank * stride; DONE (e, s).
//   3. gather: once every peer's DONE (e, s), read step s of peer p's reduced chunk into y.
// Software-pipelined: step s + 1 is pushed before step s is reduced, and step s - 1 gathered after,
// so the links carry writes and reads while the block adds. Each rank moves 2 (N-1)/N of the
// message over the links (half written, half read) and copies nothing extra: the peers write the
// inboxes themselves.
template <typename T>
__device__ __forceinline__ void rad_all_reduce_two_shot(const RadP2PPeers& peers, const T* x, T* y, u64 count,
                                                        int rank, int world, u64 slot_bytes, u64 gate,
                                                        u64 timeout_ns, u64 linger_ns) {
    const u32 E = RadPack<T>::E;
    const u64 own = peers.base[rank];
    const u64 e = rad_epoch(peers.local);
    const u64 slot = RAD_P2P_CTRL_BYTES + (e & 1) * slot_bytes;
    const u64 step = RAD_P2P_STEP_BYTES / sizeof(T);
    u64 first, stride, lo0, hi0;
    rad_piece(count, world, 0, E, first, stride);   // stride = the length of every chunk but the last
    rad_piece(stride, gridDim.x, blockIdx.x, E, lo0, hi0);
    const u32 steps = hi0 > lo0 ? (u32)((hi0 - lo0 + step - 1) / step) : 1u;   // chunk 0's piece is the longest
    // [lo, hi) of step s of this block's piece of chunk c, relative to the chunk's start
    auto range = [&](int c, u32 s, u64& clo, u64& lo, u64& hi) {
        u64 chi, plo, phi;
        rad_piece(count, world, c, E, clo, chi);
        rad_piece(chi - clo, gridDim.x, blockIdx.x, E, plo, phi);
        lo = plo + (u64)s * step;
        if (lo > phi) lo = phi;
        hi = lo + step < phi ? lo + step : phi;
    };
    auto push = [&](u32 s) {
        for (int p = 0; p < world; ++p) {
            if (p == rank) continue;
            u64 clo, lo, hi;
            range(p, s, clo, lo, hi);
            rad_copy((T*)(peers.base[p] + slot) + (u64)rank * stride + lo, x + clo + lo, hi - lo, false);
        }
        rad_signal(peers, RAD_P2P_READY_OFF, rank, world, rad_tag(e, s));
    };
    auto gather = [&](u32 s) {
        rad_wait(peers, rank, RAD_P2P_DONE_OFF, world, rad_tag(e, s), timeout_ns);
        for (int p = 0; p < world; ++p) {
            if (p == rank) continue;
            u64 clo, lo, hi;
            range(p, s, clo, lo, hi);
            rad_copy(y + clo + lo, (const T*)(peers.base[p] + slot) + (u64)p * stride + lo, hi - lo, true);
        }
    };
    push(0);
    for (u32 s = 0; s < steps; ++s) {
        if (s + 1 < steps) push(s + 1);
        rad_wait(peers, rank, RAD_P2P_READY_OFF, world, rad_tag(e, s), timeout_ns);
        u64 clo, lo, hi;
        range(rank, s, clo, lo, hi);
        const T* src[RAD_P2P_MAX_WORLD];
        for (int p = 0; p < RAD_P2P_MAX_WORLD; ++p)
            src[p] = p == rank ? x + clo + lo : p < world ? (const T*)(own + slot) + (u64)p * stride + lo : 0;
        rad_sum(y + clo + lo, (T*)(own + slot) + (u64)rank * stride + lo, src, world, rank, false, hi - lo);
        rad_signal(peers, RAD_P2P_DONE_OFF, rank, world, rad_tag(e, s));
        if (s > 0) gather(s - 1);
    }
    gather(steps - 1);
    rad_finish(peers.local, gate, linger_ns);
}

// all_gather: x is (m, n) on every rank, y is (m, world * n): y[:, p*n:(p+1)*n] = rank p's x. Block b
// publishes its piece of x (flattened) into this rank's slot and reads piece b of every peer's.
template <typename T>
__device__ __forceinline__ void rad_all_gather(const RadP2PPeers& peers, const T* x, T* y, u64 m, u64 n,
                                               int rank, int world, u64 slot_bytes, u64 gate,
                                               u64 timeout_ns, u64 linger_ns) {
    const u32 E = RadPack<T>::E;
    const u64 own = peers.base[rank];
    const u64 e = rad_epoch(peers.local);
    const u64 slot = RAD_P2P_CTRL_BYTES + (e & 1) * slot_bytes;
    const u64 count = m * n, row = (u64)world * n;
    u64 lo, hi;
    rad_piece(count, gridDim.x, blockIdx.x, E, lo, hi);
    rad_copy((T*)(own + slot) + lo, x + lo, hi - lo, false);
    rad_signal(peers, RAD_P2P_READY_OFF, rank, world, rad_tag(e, 0));
    rad_wait(peers, rank, RAD_P2P_READY_OFF, world, rad_tag(e, 0), timeout_ns);
    for (int p = 0; p < world; ++p) {
        const T* src = p == rank ? x : (const T*)(peers.base[p] + slot);
        const bool peer = p != rank;
        if (n % E == 0) {   // a pack never straddles two rows
            for (u64 k = lo + (u64)threadIdx.x * E; k < hi; k += (u64)blockDim.x * E) {
                u64 i = k / n, j = k - i * n;
                *(uint4*)(y + i * row + (u64)p * n + j) = rad_ld((const uint4*)(src + k), peer);
            }
        } else {
            for (u64 k = lo + threadIdx.x; k < hi; k += blockDim.x) {
                u64 i = k / n, j = k - i * n;
                y[i * row + (u64)p * n + j] = rad_ld(src + k, peer);
            }
        }
    }
    rad_finish(peers.local, gate, linger_ns);
}

// ---- the entry points -----------------------------------------------------------------------------
#define RAD_P2P_REDUCE_ENTRY(NAME, FORM, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(RAD_P2P_THREADS, 2)                                         \
    NAME(RadP2PPeers peers, const T* x, T* y, u64 count, int rank, int world, u64 slot_bytes, u64 gate,      \
         u64 timeout_ns, u64 linger_ns) {                                                                    \
        FORM<T>(peers, x, y, count, rank, world, slot_bytes, gate, timeout_ns, linger_ns);                   \
    }

RAD_P2P_REDUCE_ENTRY(rad_all_reduce_one_shot_f32, rad_all_reduce_one_shot, float)
RAD_P2P_REDUCE_ENTRY(rad_all_reduce_one_shot_bf16, rad_all_reduce_one_shot, u16)
RAD_P2P_REDUCE_ENTRY(rad_all_reduce_two_shot_f32, rad_all_reduce_two_shot, float)
RAD_P2P_REDUCE_ENTRY(rad_all_reduce_two_shot_bf16, rad_all_reduce_two_shot, u16)

#define RAD_P2P_GATHER_ENTRY(NAME, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(RAD_P2P_THREADS, 2)                                         \
    NAME(RadP2PPeers peers, const T* x, T* y, u64 m, u64 n, int rank, int world, u64 slot_bytes, u64 gate,   \
         u64 timeout_ns, u64 linger_ns) {                                                                    \
        rad_all_gather<T>(peers, x, y, m, n, rank, world, slot_bytes, gate, timeout_ns, linger_ns);          \
    }

RAD_P2P_GATHER_ENTRY(rad_all_gather_b32, float)   // any 4-byte element (f32, i32, ...)
RAD_P2P_GATHER_ENTRY(rad_all_gather_b16, u16)     // any 2-byte element (bf16, f16, ...)
