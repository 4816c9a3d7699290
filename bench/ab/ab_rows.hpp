// The rows of the alternating comparison (scripts/ab_compare.sh): the key benchmark shapes of
// the performance ledger (docs/ledger.md), shared by both sides of the harness. A row is one
// call; its amount of work is flops (prefill, backward: GFLOP/s against the FMA peak) or
// bytes of K and V read (decode: GB/s against a streaming read), counted the same way on
// both sides.
#pragma once

#include <cstdint>

namespace ab {

// Sparse / SparseBackward: topk_attention() (DeepSeek Sparse Attention) and its backward, q_len
// queries (the last of kv_len) each over `topk` keys it sees, drawn from a fixed seed.
enum class Kind { Prefill, Decode, Backward, Sparse, SparseBackward };
enum class Storage { F32, Bf16, F16, Q8_0, Q4_0 };
enum class Products { Exact, Bf16, Int8 };  // Options::products of the row
enum class MaskKind { Full, Causal, Window };

struct Row {
  const char* name;
  Kind kind;
  Storage kv;  // K and V storage (Q, O f32)
  MaskKind mask;
  long heads, kv_heads, q_len, kv_len, dim;
  Products products;
  int threads;
  long topk = 0;  // Sparse rows: keys a query
};

// Window: causal & SlidingWindow{255, 0}. Shapes keep one call between 10 and 200 ms on one
// core of the CPUs seen, and decode's K/V (256-537 MB a side) beyond any last-level cache.
inline constexpr Row kRows[] = {
    {"prefill f32 full d128 L2048 H4", Kind::Prefill, Storage::F32, MaskKind::Full, 4, 4, 2048,
     2048, 128, Products::Exact, 1},
    {"prefill f32 causal d128 L2048 H8", Kind::Prefill, Storage::F32, MaskKind::Causal, 8, 8, 2048,
     2048, 128, Products::Exact, 1},
    {"prefill f32 window256 d128 L8192 H4", Kind::Prefill, Storage::F32, MaskKind::Window, 4, 4,
     8192, 8192, 128, Products::Exact, 1},
    {"prefill f32 GQA 16/4 causal d128 L1024", Kind::Prefill, Storage::F32, MaskKind::Causal, 16, 4,
     1024, 1024, 128, Products::Exact, 1},
    {"prefill bf16-products causal d128 L2048 H8", Kind::Prefill, Storage::F32, MaskKind::Causal, 8,
     8, 2048, 2048, 128, Products::Bf16, 1},
    {"short queries 16 over 8192, causal d128 H8", Kind::Prefill, Storage::F32, MaskKind::Causal, 8,
     8, 16, 8192, 128, Products::Exact, 1},
    {"decode f32 MHA Lk16K H32 d128", Kind::Decode, Storage::F32, MaskKind::Causal, 32, 32, 1,
     16384, 128, Products::Exact, 1},
    {"decode f16 MHA Lk32K H32 d128", Kind::Decode, Storage::F16, MaskKind::Causal, 32, 32, 1,
     32768, 128, Products::Exact, 1},
    {"decode bf16 MHA Lk32K H32 d128", Kind::Decode, Storage::Bf16, MaskKind::Causal, 32, 32, 1,
     32768, 128, Products::Exact, 1},
    {"decode f16 GQA 32/8 Lk32K d128", Kind::Decode, Storage::F16, MaskKind::Causal, 32, 8, 1,
     32768, 128, Products::Exact, 1},
    {"decode q8_0 MHA Lk32K H32 d128", Kind::Decode, Storage::Q8_0, MaskKind::Causal, 32, 32, 1,
     32768, 128, Products::Exact, 1},
    {"decode bf16 MHA Lk32K H32 d128, 2 threads", Kind::Decode, Storage::Bf16, MaskKind::Causal, 32,
     32, 1, 32768, 128, Products::Exact, 2},
    {"backward f32 causal d128 L1024 H4", Kind::Backward, Storage::F32, MaskKind::Causal, 4, 4,
     1024, 1024, 128, Products::Exact, 1},
    {"backward f32 MQA 8/1 causal d128 L2048", Kind::Backward, Storage::F32, MaskKind::Causal, 8, 1,
     2048, 2048, 128, Products::Exact, 1},
    {"backward f32 MQA 8/1 causal d128 L2048, 2 threads", Kind::Backward, Storage::F32,
     MaskKind::Causal, 8, 1, 2048, 2048, 128, Products::Exact, 2},
    // Quantized decode, exact and with Products::Int8 (int8 queries, integer K.Q products).
    {"decode q8_0 MHA Lk32K H32 d128, int8 products", Kind::Decode, Storage::Q8_0, MaskKind::Causal,
     32, 32, 1, 32768, 128, Products::Int8, 1},
    {"decode q8_0 GQA 32/8 Lk32K d128", Kind::Decode, Storage::Q8_0, MaskKind::Causal, 32, 8, 1,
     32768, 128, Products::Exact, 1},
    {"decode q8_0 GQA 32/8 Lk32K d128, int8 products", Kind::Decode, Storage::Q8_0,
     MaskKind::Causal, 32, 8, 1, 32768, 128, Products::Int8, 1},
    {"decode q4_0 MHA Lk32K H32 d128", Kind::Decode, Storage::Q4_0, MaskKind::Causal, 32, 32, 1,
     32768, 128, Products::Exact, 1},
    {"decode q4_0 MHA Lk32K H32 d128, int8 products", Kind::Decode, Storage::Q4_0, MaskKind::Causal,
     32, 32, 1, 32768, 128, Products::Int8, 1},
    // DeepSeek Sparse Attention: 16 heads over one KV head, each query over 1024 of its keys.
    {"dsa f32 16 heads over 1, 512 queries over 4096, top 1024, d128", Kind::Sparse, Storage::F32,
     MaskKind::Causal, 16, 1, 512, 4096, 128, Products::Exact, 1, 1024},
    {"dsa backward f32 16 heads over 1, 512 queries over 4096, top 1024, d128",
     Kind::SparseBackward, Storage::F32, MaskKind::Causal, 16, 1, 512, 4096, 128, Products::Exact,
     1, 1024},
};
inline constexpr int kRowCount = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));

// The work of a row: flops (Prefill, Backward) or bytes of K and V (Decode).
inline double work_of(const Row& r) {
  const double pairs =
      r.mask == MaskKind::Full ? double(r.q_len) * double(r.kv_len)
      : r.mask == MaskKind::Window
          ? double(r.q_len) * 256.0
          : double(r.q_len) * double(r.kv_len) - double(r.q_len) * double(r.q_len - 1) / 2.0;
  if (r.kind == Kind::Sparse || r.kind == Kind::SparseBackward) {  // selected pairs
    const double sparse = 4.0 * double(r.q_len) * double(r.topk) * double(r.dim) * double(r.heads);
    return r.kind == Kind::Sparse ? sparse : 2.5 * sparse;  // counted as the dense backward
  }
  const double forward = 4.0 * pairs * double(r.dim) * double(r.heads);  // QK^T and PV
  if (r.kind == Kind::Prefill) return forward;
  if (r.kind == Kind::Backward) return 2.5 * forward;  // dP, dV, dK, dQ and S again
  const double per_value = r.kv == Storage::F32    ? 4.0
                           : r.kv == Storage::Q8_0 ? 34.0 / 32.0
                           : r.kv == Storage::Q4_0 ? 18.0 / 32.0
                                                   : 2.0;
  return 2.0 * double(r.kv_len) * double(r.kv_heads) * double(r.dim) * per_value;
}

}  // namespace ab

// One side of the harness: ab_side.cpp compiled against one tree's headers, its namespace
// renamed (-Dattnkit=attnkit_<side>) and its entry points named by AB_SIDE.
#define AB_CAT2(a, b) a##b
#define AB_CAT(a, b) AB_CAT2(a, b)
#define AB_DECLARE_SIDE(side)                                  \
  void AB_CAT(side, _setup)(int row);  /* buffers, untimed */  \
  double AB_CAT(side, _call)(int row); /* one call: seconds */ \
  void AB_CAT(side, _teardown)();                              \
  bool AB_CAT(side, _supports)(int row); /* this tree has what the row needs */
AB_DECLARE_SIDE(ab_a)
AB_DECLARE_SIDE(ab_b)
