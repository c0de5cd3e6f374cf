// libr4d device collectives, the row family: all_reduce, and all_reduce + residual add + rmsnorm in
// one launch, on f32 activations, with f32 or bf16 on the wire. One module is compiled from
//     common.cu + allreduce.cu + allreduce_fused.cu        (collectives/device_p2p.py, module_source)
// so this file uses allreduce.cu's region layout, epochs, flags and bf16 rounding, and common.cu's
// r4d_row_squares: the order every rmsnorm of libr4d's device rows sums its squares in.
//
// What one launch of epoch e leaves, on every rank alike (the same bits everywhere):
//   out = wire(((v_0 + v_1) + v_2) + ...), the rank-order sum in f32 of v_r = wire(x_r), where wire()
//         is the identity on an f32 wire (allreduce.cu's one-shot's bits) and a round to bf16 (nearest
//         even) and back on a bf16 wire: every contribution and the sum each rounded once;
//   with a residual: residual = residual + out, then per row
//         y = (residual * (1 / sqrt(squares / n + eps))) * w, the squares summed as r4d_row_squares
//         does: r4d_rmsnorm_dev's bits (elementwise.cu), so the launch equals the chain
//         all_reduce -> r4d_add_dev -> r4d_rmsnorm_dev bit for bit.
//
// Units. A launch is cut in units: a row of n elements when there is a residual (the norm needs whole
// rows), else one piece per block (rad_piece, 8-element packs) of the m * n elements. Block b takes
// units b, b + G, ... (G = gridDim.x). Every rank launches the same grid and every block is resident
// at once (the host's grid is at most DeviceP2P.max_blocks), because a block spins on its peers.
//
// Two exchanges, chosen by the host per launch (`ll`):
//   LL (small messages): a contribution carries its flag. A word is 8 bytes: this epoch's flag in the
//     high 32 bits, 32 bits of payload (one f32, or two bf16, the lower element in the low half) in the
//     low. A rank stores its words straight into every peer's inbox for it (relaxed system-scope 8-byte
//     stores: a peer's 8-byte load sees all of a word or none of it) and polls its own inboxes until
//     every word it needs carries the flag: one crossing of the link, no separate flag, no barrier.
//     Sender s's inbox in a rank's slot e & 1 starts at s * words * 8; unit u's words start at word(u).
//   slot (larger messages): allreduce.cu's one-shot by units: a block copies its units' contributions
//     (wire type) into this rank's slot at their element offsets, stores READY into every peer, waits
//     for every peer's READY, then reads the peers' slots.
// A flag is rad_ll_flag(e): never 0 (memory never written), and different for e and e - 2 (the slot's
// last use). It repeats every 2^32 - 1 epochs: a word no launch has written for exactly a multiple of
// that many epochs (about six hours at 5 us an epoch) would be taken as current if polled before its
// new value lands. Slot reuse is allreduce.cu's argument: a rank writes a peer's inbox of slot e & 1
// again at e + 2 only after its launch e + 1 has received that peer's e + 1 words (every block of
// every kernel here waits for every peer), which the peer sends once its launch e has completed.
//
// The launch ends the link-gate hold (colour 2) once its blocks have read their last peer word, before
// the add's stores are needed by anyone and before the norm: a relaxed store, since the word tells the
// host only that the link is free, and publishes no data. On sm_90 every block also lets the next
// chained kernel launch early (griddepcontrol.launch_dependents); that kernel's own prologue still waits
// for this one to finish.

#define RAD_ROWS_PIECE 4096          // a plain all_reduce: elements of a block's piece (the host's grid)
#define RAD_ROWS_STAGE_FLOATS 8192   // a row up to this long is staged in shared memory for its norm

#define RAD_LL_HIGH 0xffffffff00000000ull

__device__ __forceinline__ u32 rad_ll_flag(u64 e) { return (u32)(e % 0xffffffffull) + 1u; }

__device__ __forceinline__ void rad_st_relaxed_sys(u64* p, u64 v) {
#ifdef RAD_HIP
    __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
#endif
}

__device__ __forceinline__ u64 rad_ld_relaxed_sys(const u64* p) {
#ifdef RAD_HIP
    return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#endif
}

// ---- the wire: f32 (one value a word) or bf16 (two) -------------------------------------------------
template <typename W> struct RadWire;

template <> struct RadWire<float> {
    enum { PER_WORD = 1 };
    static __device__ __forceinline__ float round(float v) { return v; }
    static __device__ __forceinline__ u32 pack(float a, float) { return __float_as_uint(a); }
    static __device__ __forceinline__ void unpack(u32 bits, float& a, float& b) {
        a = __uint_as_float(bits);
        b = 0.0f;
    }
};

template <> struct RadWire<u16> {
    enum { PER_WORD = 2 };
    static __device__ __forceinline__ float round(float v) {
        u16 h;
        rad_from_f32(h, v);
        return rad_to_f32(h);
    }
    static __device__ __forceinline__ u32 pack(float a, float b) {
        u16 ha, hb;
        rad_from_f32(ha, a);
        rad_from_f32(hb, b);
        return (u32)ha | ((u32)hb << 16);
    }
    static __device__ __forceinline__ void unpack(u32 bits, float& a, float& b) {
        a = rad_to_f32((u16)(bits & 0xffffu));
        b = rad_to_f32((u16)(bits >> 16));
    }
};

// ---- units --------------------------------------------------------------------------------------
struct RadUnits {
    u64 count, n, units;   // elements in all, a row's length, units in all
    bool rows;             // units are rows (a residual is given), else one piece per block
};

// Elements [lo, hi) of unit u, and its first LL word.
__device__ __forceinline__ void rad_unit(const RadUnits& U, u64 u, u32 per_word, u64& lo, u64& hi, u64& word) {
    if (U.rows) {
        lo = u * U.n;
        hi = lo + U.n;
        word = u * ((U.n + per_word - 1) / per_word);
    } else {
        rad_piece(U.count, gridDim.x, (u32)u, 8, lo, hi);
        word = lo / per_word;
    }
}

// A word already loaded (`v`) that does not carry `flag` yet: poll it until it does. Gives up after
// timeout_ns, setting ERROR, or at once when ERROR is already set (the host reports it; the launch's
// results are then wrong).
__device__ __forceinline__ u64 rad_ll_settle(const u64* word, u64 v, u64 flag, u64 local, u64 timeout_ns) {
    if ((v & RAD_LL_HIGH) == flag) return v;
    volatile u32* error = (volatile u32*)(local + RAD_P2P_ERROR_OFF);
    if (*error) return v;
    u64 start = rad_now_ns();
    u32 spins = 0;
    while (((v = rad_ld_relaxed_sys(word)) & RAD_LL_HIGH) != flag) {
        if ((++spins & 1023u) == 0 && (rad_now_ns() - start > timeout_ns || *error)) {
            atomicExch((u32*)error, 1u);
            break;
        }
    }
    return v;
}

// Every block has read its last peer word: the last to arrive (the only one, in a grid of one) ends the
// gate hold. ARRIVE is counted only where there is a gate and more than one block, and reset by the last.
__device__ __forceinline__ void rad_rows_finish(u64 local, u64 gate) {
    __syncthreads();
    if (threadIdx.x == 0 && gate) {
        bool last = true;
        if (gridDim.x > 1) {
            u32* arrive = (u32*)(local + RAD_P2P_ARRIVE_OFF);
            last = atomicAdd(arrive, 1u) == gridDim.x - 1;
            if (last) atomicExch(arrive, 0u);
        }
        if (last) rad_st_relaxed_sys((u64*)gate, 0ull);
    }
}

// out[i] = v; with a residual, residual[i] += v (and the new value staged for the norm)
__device__ __forceinline__ void rad_rows_store(float v, u64 i, u64 lo, float* out, float* residual, float* stage) {
    out[i] = v;
    if (residual) {
        float r = residual[i] + v;
        residual[i] = r;
        if (stage) stage[i - lo] = r;
    }
}

// A thread's words of a unit, RAD_ROWS_BATCH at a time (word k0 + j * blockDim.x), each loaded from
// every peer in rank order, all of one peer's loads in flight together.
#define RAD_ROWS_BATCH 4

template <typename W>
__device__ __forceinline__ void rad_rows(const RadP2PPeers& peers, const float* x, float* out, float* residual,
                                         const float* w, float* y, u64 m, u64 n, int rank, int world,
                                         u64 slot_bytes, u64 gate, u64 timeout_ns, float eps, int ll, u32 stage) {
#if !defined(RAD_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    extern __shared__ __align__(16) float rad_stage[];
    __shared__ float rad_scale;
    const u32 P = RadWire<W>::PER_WORD;
    RadUnits U;
    U.rows = residual != 0;
    U.count = m * n;
    U.n = n;
    U.units = U.rows ? m : gridDim.x;
    const u64 e = rad_epoch(peers.local);
    const u64 slot = RAD_P2P_CTRL_BYTES + (e & 1) * slot_bytes;
    const u64 words = U.rows ? m * ((n + P - 1) / P) : (U.count + P - 1) / P;   // one sender's inbox
    const u64 flag = (u64)rad_ll_flag(e) << 32;
    // the norm reads a row back from shared memory when the block takes only that row (host: `stage`)
    float* staged = (stage && U.rows && U.units <= gridDim.x) ? rad_stage : (float*)0;

    // 1. send: LL words (flag | payload) into every peer's inbox for this rank, or the payloads (u32
    //    words at the same indices) into this rank's own slot, then READY to every peer
    for (u64 u = blockIdx.x; u < U.units; u += gridDim.x) {
        u64 lo, hi, word;
        rad_unit(U, u, P, lo, hi, word);
        for (u64 k = threadIdx.x; k * P < hi - lo; k += blockDim.x) {
            const u64 i = lo + k * P;
            const u32 payload = RadWire<W>::pack(x[i], (P == 2 && i + 1 < hi) ? x[i + 1] : 0.0f);
            if (ll) {
                for (int p = 0; p < world; ++p)
                    if (p != rank)
                        rad_st_relaxed_sys((u64*)(peers.base[p] + slot) + (u64)rank * words + word + k, flag | payload);
            } else {
                ((u32*)(peers.base[rank] + slot))[word + k] = payload;
            }
        }
    }
    if (!ll) {
        rad_signal(peers, RAD_P2P_READY_OFF, rank, world, rad_tag(e, 0));
        rad_wait(peers, rank, RAD_P2P_READY_OFF, world, rad_tag(e, 0), timeout_ns);
    }

    // 2. receive, sum in rank order (rounded to the wire), out, and the residual add
    for (u64 u = blockIdx.x; u < U.units; u += gridDim.x) {
        u64 lo, hi, word;
        rad_unit(U, u, P, lo, hi, word);
        const u64 count = (hi - lo + P - 1) / P;   // this unit's words
        for (u64 k0 = 0; k0 < count; k0 += (u64)RAD_ROWS_BATCH * blockDim.x) {
            float acc_a[RAD_ROWS_BATCH], acc_b[RAD_ROWS_BATCH];
            for (int p = 0; p < world; ++p) {
                u64 got[RAD_ROWS_BATCH];
                if (p != rank) {
                    const u64* inbox = (const u64*)(peers.base[rank] + slot) + (u64)p * words + word;
                    const float* theirs = (const float*)(peers.base[p] + slot) + word;   // u32 payloads
#pragma unroll
                    for (int j = 0; j < RAD_ROWS_BATCH; ++j) {
                        const u64 k = k0 + (u64)j * blockDim.x + threadIdx.x;
                        got[j] = k >= count ? 0ull
                               : ll ? rad_ld_relaxed_sys(inbox + k)
                                    : (u64)__float_as_uint(rad_ld_peer(theirs + k));
                    }
                    if (ll) {
#pragma unroll
                        for (int j = 0; j < RAD_ROWS_BATCH; ++j) {
                            const u64 k = k0 + (u64)j * blockDim.x + threadIdx.x;
                            if (k < count) got[j] = rad_ll_settle(inbox + k, got[j], flag, peers.local, timeout_ns);
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < RAD_ROWS_BATCH; ++j) {
                    const u64 k = k0 + (u64)j * blockDim.x + threadIdx.x;
                    if (k >= count) continue;
                    float a, b;
                    if (p == rank) {   // this rank's own contribution, rounded as its peers receive it
                        const u64 i = lo + k * P;
                        RadWire<W>::unpack(RadWire<W>::pack(x[i], (P == 2 && i + 1 < hi) ? x[i + 1] : 0.0f), a, b);
                    } else {
                        RadWire<W>::unpack((u32)got[j], a, b);
                    }
                    acc_a[j] = p == 0 ? a : acc_a[j] + a;
                    acc_b[j] = p == 0 ? b : acc_b[j] + b;
                }
            }
#pragma unroll
            for (int j = 0; j < RAD_ROWS_BATCH; ++j) {
                const u64 k = k0 + (u64)j * blockDim.x + threadIdx.x;
                if (k >= count) continue;
                const u64 i = lo + k * P;
                rad_rows_store(RadWire<W>::round(acc_a[j]), i, lo, out, residual, staged);
                if (P == 2 && i + 1 < hi) rad_rows_store(RadWire<W>::round(acc_b[j]), i + 1, lo, out, residual, staged);
            }
        }
    }
    rad_rows_finish(peers.local, gate);
    if (!U.rows) return;

    // 3. the norm of every row this block took: one warp sums the squares in r4d_row_squares' order
    for (u64 u = blockIdx.x; u < U.units; u += gridDim.x) {
        const float* row = staged ? staged : residual + u * n;
        if (threadIdx.x < R4D_WARP) {
            const float squares = r4d_row_squares(row, (int)n);
            if (threadIdx.x == 0) rad_scale = 1.0f / sqrtf(squares / (float)(int)n + eps);
        }
        __syncthreads();
        const float scale = rad_scale;
        float* normed = y + u * n;
        for (u64 c = threadIdx.x; c < n; c += blockDim.x) normed[c] = (row[c] * scale) * w[c];
        __syncthreads();   // before the next row's scale is written
    }
}

// ---- the entry points: one a wire type. A plain all_reduce passes residual = w = y = 0, m = 1,
// n = count; the fused op passes its four operands (out = x: the chain leaves the sum in x).
#define RAD_ROWS_ENTRY(NAME, W)                                                                              \
    extern "C" __global__ void __launch_bounds__(RAD_P2P_THREADS, 2)                                         \
    NAME(RadP2PPeers peers, const float* x, float* out, float* residual, const float* w, float* y, u64 m,     \
         u64 n, int rank, int world, u64 slot_bytes, u64 gate, u64 timeout_ns, float eps, int ll, u32 stage) { \
        rad_rows<W>(peers, x, out, residual, w, y, m, n, rank, world, slot_bytes, gate, timeout_ns, eps, ll, stage); \
    }

RAD_ROWS_ENTRY(rad_all_reduce_rows_f32, float)   // f32 on the wire
RAD_ROWS_ENTRY(rad_all_reduce_rows_bf16, u16)    // bf16 on the wire (f32 activations)
