/* A broadcast-ring reader's take in one C call (collectives/ring.py, which takes it from here when
 * libr4d is built and does the same in Python otherwise): whether the record is published, the slot's
 * copy and its keyed BLAKE2b check, `consumed` stored, and for a rank's plan its copies into the step
 * inputs and its feed (r4d_ring_take_p).
 *
 * A slot: [ mac: 32 B ][ seq: u64 ][ length: u64 ][ 16 B pad ][ payload: length bytes ], the mac being
 * keyed BLAKE2b-256 (RFC 7693, BLAKE2's own MAC mode: hashlib.blake2b(key=..., digest_size=32)) of
 * everything after it. Why C: in Python a rank's take is a slice copy, a hashlib object,
 * compare_digest, struct unpacks, a dozen byte copies and the feed's ints, each a CPython call paying
 * the cache misses a decode step leaves (~45 us of a plan's ~50 us delivery, docs/RUNTIME.md); here it
 * is one ctypes call (itself ~10 us of what is left on those caches).
 *
 * r4d_ring_take copies the slot out and checks the copy (the writer never touches a slot a reader has
 * not consumed, so a record that fails on the copy was torn or forged, and the copy is what the
 * reader uses). The writer stays Python's (hashlib): a C write measured no faster through ctypes
 * (bench/results/step_latency_host_2026-12-03.md). */

#include <stdint.h>
#include <string.h>

#define RING_MAC 32
#define RING_HEADER 64

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

/* the message words' order in each of the 12 rounds (rounds 10 and 11 repeat 0 and 1) */
static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

#define G(a, b, c, d, x, y)                  \
    do {                                     \
        a = a + b + (x); d = rotr64(d ^ a, 32); \
        c = c + d; b = rotr64(b ^ c, 24);       \
        a = a + b + (y); d = rotr64(d ^ a, 16); \
        c = c + d; b = rotr64(b ^ c, 63);       \
    } while (0)

/* one 128-byte block into the state h; `counted`: the bytes hashed so far, this block's included */
static void blake2b_compress(uint64_t h[8], const uint8_t block[128], uint64_t counted, int last) {
    uint64_t m[16], v[16];
    memcpy(m, block, 128); /* little-endian words: x86-64 and aarch64 as built here */
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= counted; /* the counter's high word stays 0: no record is 2**64 bytes */
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = blake2b_sigma[r];
        G(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
        G(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
        G(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
        G(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
        G(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
        G(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
        G(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
        G(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* keyed BLAKE2b of `n` bytes at `data` (key 1..64 bytes), its first `out_bytes` (<= 64) into out */
static void blake2b_keyed(uint8_t *out, int out_bytes, const uint8_t *key, int key_bytes, const uint8_t *data,
                          uint64_t n) {
    uint64_t h[8];
    uint8_t block[128];
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ ((uint64_t)key_bytes << 8) ^ (uint64_t)out_bytes;
    uint64_t counted = 0;
    memset(block, 0, sizeof block); /* the key, zero-padded, is the first block */
    memcpy(block, key, (size_t)key_bytes);
    counted = 128;
    blake2b_compress(h, block, counted, n == 0);
    while (n > 128) { /* every block but the last (which may be whole) */
        counted += 128;
        blake2b_compress(h, data, counted, 0);
        data += 128;
        n -= 128;
    }
    if (n > 0) {
        memset(block, 0, sizeof block);
        memcpy(block, data, (size_t)n);
        counted += n;
        blake2b_compress(h, block, counted, 1);
    }
    memcpy(out, h, (size_t)out_bytes);
}

/* The keyed BLAKE2b-256 of `n` bytes, for tests against hashlib; 0, or -1 for a key out of 1..64. */
int r4d_blake2b_keyed(uint8_t *out, const uint8_t *key, int64_t key_bytes, const uint8_t *data, int64_t n) {
    if (key_bytes < 1 || key_bytes > 64 || n < 0) return -1;
    blake2b_keyed(out, RING_MAC, key, (int)key_bytes, data, (uint64_t)n);
    return 0;
}

/* Slot -> into (at least RING_HEADER + capacity bytes), checked on the copy. Returns the payload's
 * length, or -1: the slot claims more than `capacity`, -2: the mac or the copied length does not
 * verify (forged or torn), -3: it verifies but holds another record than `seq` (*found: its seq),
 * -4: a key out of 1..64 bytes. */
int64_t r4d_ring_take(const uint8_t *slot, uint8_t *into, int64_t capacity, uint64_t seq, const uint8_t *key,
                      int64_t key_bytes, uint64_t *found) {
    if (key_bytes < 1 || key_bytes > 64) return -4;
    uint64_t length;
    memcpy(&length, slot + RING_MAC + 8, 8);
    if (length > (uint64_t)capacity) return -1;
    memcpy(into, slot, RING_HEADER + length);
    uint64_t copied_seq, copied_length;
    memcpy(&copied_seq, into + RING_MAC, 8);
    memcpy(&copied_length, into + RING_MAC + 8, 8);
    uint8_t mac[RING_MAC];
    blake2b_keyed(mac, RING_MAC, key, (int)key_bytes, into + RING_MAC, RING_HEADER - RING_MAC + length);
    uint8_t differ = 0;
    for (int i = 0; i < RING_MAC; i++) differ |= mac[i] ^ into[i];
    if (differ || copied_length != length) return -2;
    *found = copied_seq;
    if (copied_seq != seq) return -3;
    return (int64_t)length;
}

/* A reader's take of its next record in one call, with its arguments packed as u64 words (a call of
 * one pointer argument, the cheapest ctypes makes; collectives/ring.py's TAKE_* name them):
 *   slots, slot_count, slot_bytes    where slot 0 lies, how many, their bytes
 *   published, consumed              the ring's published word, this reader's consumed word
 *   next                             the record to take: advanced once it is taken
 *   into, capacity, key, key_bytes   r4d_ring_take's
 *   table                            0, or a table of copies (below)
 *   sampled                          tokens the step before sampled: the feed's sources are below it
 *   out: found                       the seq a slot held instead (-3)
 *   out: made                        0, or MADE_COPIES (the table's copies made), | MADE_FED (its feed too)
 * Returns the payload's length, r4d_ring_take's refusals, or -5: not published yet (nothing changed:
 * the caller waits, collectives/ring.py, and calls again). Once a record verifies, `consumed` is
 * stored (the slot is free again: everything after reads the copy).
 *
 * The table makes a rank's plan its step's inputs in the same call (generation/plan_record.py),
 * if the payload begins as the table says (a plan of the shape the table was made for: ranks take
 * step after step of one shape):
 *     [ prefix bytes (<= 24) ][ prefix: 3 words ][ count ][ ids ][ tokens ][ feed offset ]
 *     [ (target address, payload offset, bytes) x count ]
 * then, where `ids` is not 0 (the host executor's step inputs, int32), the plan's feed: ids[target]
 * = tokens[source] for each (target, source) pair at `feed offset` (the header's pairs count: its
 * targets, then its sources, int32 each), if every target is within the plan's ids (the header's
 * tokens) and every source below `sampled`; a feed outside them is left for the caller to refuse,
 * in its words (generation/feed.py). */
enum { TAKE_SLOTS, TAKE_SLOT_COUNT, TAKE_SLOT_BYTES, TAKE_PUBLISHED, TAKE_CONSUMED, TAKE_NEXT, TAKE_INTO,
       TAKE_CAPACITY, TAKE_KEY, TAKE_KEY_BYTES, TAKE_TABLE, TAKE_SAMPLED, TAKE_FOUND, TAKE_MADE };
enum { MADE_COPIES = 1, MADE_FED = 2 };
#define TABLE_COPIES 8 /* the table's words before its copies */
#define PLAN_TOKENS 4  /* a plan's header: its ids' count (u32) and its feed's pairs (u32) */
#define PLAN_PAIRS 16

static uint64_t made_from_table(const uint64_t *table, const uint8_t *payload, uint64_t length, uint64_t sampled) {
    uint64_t prefix = table[0], count = table[4];
    if (prefix > 24 || prefix > length || memcmp(payload, table + 1, prefix) != 0) return 0;
    const uint64_t *copy = table + TABLE_COPIES;
    for (uint64_t i = 0; i < count; i++)
        if (copy[3 * i + 1] + copy[3 * i + 2] > length) return 0; /* not all within: none */
    for (uint64_t i = 0; i < count; i++) memcpy((void *)copy[3 * i], payload + copy[3 * i + 1], copy[3 * i + 2]);
    int32_t *ids = (int32_t *)table[5];
    if (ids == 0 || length < PLAN_PAIRS + 4) return MADE_COPIES;
    uint32_t tokens, pairs;
    memcpy(&tokens, payload + PLAN_TOKENS, 4);
    memcpy(&pairs, payload + PLAN_PAIRS, 4);
    uint64_t at = table[7];
    if (at + 8 * (uint64_t)pairs > length) return MADE_COPIES;
    const uint8_t *targets = payload + at, *sources = targets + 4 * (uint64_t)pairs;
    int32_t target, source;
    for (uint32_t i = 0; i < pairs; i++) {
        memcpy(&target, targets + 4 * i, 4);
        memcpy(&source, sources + 4 * i, 4);
        if (target < 0 || (uint32_t)target >= tokens || source < 0 || (uint64_t)source >= sampled) return MADE_COPIES;
    }
    const int32_t *sampled_tokens = (const int32_t *)table[6];
    for (uint32_t i = 0; i < pairs; i++) {
        memcpy(&target, targets + 4 * i, 4);
        memcpy(&source, sources + 4 * i, 4);
        ids[target] = sampled_tokens[source];
    }
    return MADE_COPIES | MADE_FED;
}

int64_t r4d_ring_take_p(uint64_t *a) {
    uint64_t k = a[TAKE_NEXT];
    a[TAKE_MADE] = 0;
    if (__atomic_load_n((const uint64_t *)a[TAKE_PUBLISHED], __ATOMIC_ACQUIRE) < k) return -5;
    const uint8_t *slot = (const uint8_t *)a[TAKE_SLOTS] + ((k - 1) % a[TAKE_SLOT_COUNT]) * a[TAKE_SLOT_BYTES];
    uint8_t *into = (uint8_t *)a[TAKE_INTO];
    int64_t length = r4d_ring_take(slot, into, (int64_t)a[TAKE_CAPACITY], k, (const uint8_t *)a[TAKE_KEY],
                                   (int64_t)a[TAKE_KEY_BYTES], &a[TAKE_FOUND]);
    if (length < 0) return length;
    __atomic_store_n((uint64_t *)a[TAKE_CONSUMED], k, __ATOMIC_RELEASE); /* the copy verified: the slot is free */
    a[TAKE_NEXT] = k + 1;
    if (a[TAKE_TABLE] != 0)
        a[TAKE_MADE] = made_from_table((const uint64_t *)a[TAKE_TABLE], into + RING_HEADER, (uint64_t)length,
                                       a[TAKE_SAMPLED]);
    return length;
}
