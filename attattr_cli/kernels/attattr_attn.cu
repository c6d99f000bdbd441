// Fused attention forward and attention-attribution kernels for attattr.
//
// Self-attention attribution (Hao et al., AAAI 2021) of one layer is
//     Attr = A * (G V^T),   A = softmax(Q K^T * scale + mask)
// with G the quadrature-weighted sum of dF/dO over the integration steps.  These
// kernels never store A: it is recomputed tile by tile from Q, K and the row
// log-sum-exp (flash-attention style), and only the requested outputs are written.
//
// This file includes CUDA headers only (no torch / ATen / c10), so that
// `nvcc -c` works on a machine with a CPU build of PyTorch.  The C++ binding
// (attattr_ops.cpp) calls the extern "C" launchers at the end of the file.
//
// Layout conventions (all sizes and strides in elements):
//   q, g        [B, H, n_q, d]  any strides for B, H, rows; last dim contiguous
//   k, v        [B, H, n_k, d]  idem
//   mask        [B, n_k] float additive key-padding mask (batch stride may be 0), or null
//   o           [B, H, n_q, d]  (strides given)
//   stats       [B, H, n_q, 2]  float, contiguous: per row (m, l) with m the max of the
//               scaled, masked scores and l = sum_j exp(s_j - m), so p_j = exp(s_j - m) / l;
//               (-inf, 0) for a row with no allowed key (its p and o are 0).  Kept as a
//               pair, not as lse = m + log l: with a finfo.min padding mask a fully padded
//               row has m ~ -3.4e38, where m + log l rounds back to m.
//   maps        [B, H, n_q, n_k] float, contiguous (optional)
//   head_sum    [B, n_q, n_k]   float, contiguous
//   head_max    [B, H]          float, contiguous
//   workspace   [B, G, n_q, n_k] float: per head group partial head sums (G > 1 only)
//   partials    [B, H, tiles]   float: per (head, score tile) maxima, reduced to head_max
// causal: key j is allowed for query i iff j <= i + (n_k - n_q) (bottom-right
// aligned, as flash-attention; the usual lower triangle when n_q == n_k).
//
// Kernel structure (simple over clever, see kernels/README.md):
//   * 256 threads per block arranged 16 x 16; a 64 x 64 (query x key) score tile;
//     each thread owns rows ty + 16 i and columns tx + 16 j (i, j < 4).
//   * The attribution grid is (key tile, query tile, batch x head group): each block
//     loops over the heads of its group; with more than one group the head sum goes
//     through a workspace and a second pass adds the groups in a fixed order.  No float
//     atomics anywhere, so every output is bit-for-bit reproducible.
//   * __launch_bounds__(256, 2): at most 128 registers per thread, two blocks per SM as
//     far as registers go (without the hint ptxas capped one kernel at 64 and spilled).
//   * Operand tiles are staged in shared memory as float with a +1 row pad
//     (bank-conflict free for the access pattern), zero-filled past n and d.
//   * Two paths for the 64 x 64 tile products (Q K^T, G V^T; the forward's Q K^T):
//     - the fp32 path: plain FMAs on the CUDA cores, each thread its own 4 x 4 entries;
//       the only path for float32 inputs and the reference for the other;
//     - the tensor-core path (MMA = true; float16 / bfloat16 inputs, the default for them,
//       ATTATTR_TENSOR_CORES=0 turns it off): each warp computes a 16 x 32 part of the
//       tile with mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32 (fp32
//       accumulation; the products of two half values are exact in fp32), writes it to a
//       shared [64][65] float tile, and every thread reads its 4 x 4 entries back, so the
//       rest of the kernel is the same for both paths.  The fragments are built exactly as
//       the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type"
//       documents; the CPU emulation (tests/test_kernels.py) models the instruction with
//       that layout, so a fragment bug fails on the CPU.
//     The forward's P V product (WITH_O) takes the same path: on tensor cores each warp keeps
//     a 16 x D/2 part of O in mma accumulators across the key tiles; P (float, in [0, 1]) is
//     split into two half parts, p = hi + lo (hi the half rounding of p, lo that of the
//     rest), so P V is two mma per step and P carries 16 (bfloat16) or 22 (float16)
//     significant bits instead of 8 or 11: the row rescaling by exp(m_old - m_new) and the
//     final 1 / l go through shared memory (the accumulator rows are not the thread's own).
//   * bfloat16 q, k, v with a float32 G (the engine's bf16 scoring: the integral is summed
//     in float32) on the tensor-core path (SPLIT_G): G is staged as float and each of its
//     values split into three bfloat16 parts, g = hi + mid + lo exactly (8 + 8 + 8 of
//     float's 24 significant bits), so G V^T is three mma per tile step, each product exact,
//     as accurate as the fp32 path without rounding G to bfloat16.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

namespace attattr {
namespace {

constexpr int kThreads = 256;
constexpr int kTY = 16;             // thread grid is kTY x kTY
constexpr int kBM = 64;             // query rows per tile
constexpr int kBN = 64;             // key columns per tile
constexpr int kRows = kBM / kTY;    // rows per thread
constexpr int kCols = kBN / kTY;    // columns per thread
constexpr int kMaxHeadDim = 128;
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocksPerSM = 2;
// The attribution grid aims at this many blocks per SM before it splits the heads.
constexpr int kTargetBlocksPerSM = 2;

struct Strides {
  long long b, h, n;
};

// ---------------------------------------------------------------- conversions
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return x;
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

// ------------------------------------------------------------------ reductions
// Reduce over the 16 lanes that share a row (tid = ty * 16 + tx; the xor offsets
// 8, 4, 2, 1 only flip tx bits, so they never leave the row group).
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
  for (int off = kTY / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int off = kTY / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// ------------------------------------------------------------------ tile helpers
// dst[r][c] (row pitch D + 1) = src[row0 + r][c] as float, zero past n_rows or d.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const T* __restrict__ src,
                                          long long row_stride, int row0, int n_rows, int d) {
  for (int idx = threadIdx.x; idx < ROWS * D; idx += kThreads) {
    const int r = idx / D;
    const int c = idx - r * D;
    const int row = row0 + r;
    float val = 0.f;
    if (row < n_rows && c < d) val = to_float<T>(src[(long long)row * row_stride + c]);
    dst[r * (D + 1) + c] = val;
  }
}

// s[i][j] = sum_c A[ty + 16 i][c] * B[tx + 16 j][c]  for the 64 x 64 tile.
template <int D>
__device__ __forceinline__ void tile_dots(float (&s)[kRows][kCols], const float* __restrict__ a,
                                          const float* __restrict__ b, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) s[i][j] = 0.f;
#pragma unroll 8
  for (int c = 0; c < D; ++c) {
    float av[kRows], bv[kCols];
#pragma unroll
    for (int i = 0; i < kRows; ++i) av[i] = a[(ty + kTY * i) * (D + 1) + c];
#pragma unroll
    for (int j = 0; j < kCols; ++j) bv[j] = b[(tx + kTY * j) * (D + 1) + c];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < kCols; ++j) s[i][j] = fmaf(av[i], bv[j], s[i][j]);
  }
}

// ---------------------------------------------------------------- tensor cores
template <typename T>
struct is_bf16 {
  static constexpr bool value = false;
};
template <>
struct is_bf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

template <typename T>
__device__ __forceinline__ uint32_t half_bits(T x);
template <>
__device__ __forceinline__ uint32_t half_bits<__half>(__half x) { return __half_as_ushort(x); }
template <>
__device__ __forceinline__ uint32_t half_bits<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat16_as_ushort(x);
}

// Two half values in one .b32 register: `lo` in the low 16 bits (the lower-indexed
// element of the fragment, "elements low to high" in the PTX ISA).  The staged floats came
// from T inputs, so the conversion back is exact.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return half_bits<T>(from_float<T>(lo)) | (half_bits<T>(from_float<T>(hi)) << 16);
}

// d += A B for one m16n8k16 tile held by the warp: a (4 regs), b (2 regs), d (4 floats) in
// the PTX ISA's fragment layout for .f16 / .bf16 with .f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
  if constexpr (is_bf16<T>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // not reached: the library is built for sm_80 and newer only
#endif
#elif defined(ATTATTR_EMU_MMA)
  attattr_emu_mma<T>(d, a, b);  // the CPU emulation's model of the warp-wide instruction
#endif
}

// The 8 fragment values x (in the A register order below) as PARTS half parts, x = p[0] +
// p[1] + ... : each part the T rounding of what the previous ones leave (exact in float).
template <typename T, int PARTS>
__device__ __forceinline__ void split_fragment(float (&x)[8], uint32_t (&parts)[PARTS][4]) {
#pragma unroll
  for (int p = 0; p < PARTS; ++p) {
    float rounded[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      rounded[e] = to_float<T>(from_float<T>(x[e]));
      x[e] -= rounded[e];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) parts[p][r] = pack2<T>(rounded[2 * r], rounded[2 * r + 1]);
  }
}

// c[r][j] (row pitch kBN + 1) = sum_k A[r][k] * B[j][k] for the 64 x 64 tile on tensor cores.
// Warp w computes rows 16 (w % 4) .. +16 and columns 32 (w / 4) .. +32: one A fragment
// and four m16n8 tiles per step of 16 along D.  With groupID g = lane / 4 and t = lane % 4:
//   A (row major, 16 x 16): reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..),
//                           reg 3 = (g+8, 2t+8..)
//   B (col major, 16 x 8, B[k][n] = b_tile[n][k]): reg 0 = (k 2t..2t+1, n g), reg 1 = k + 8
//   C / D (16 x 8 floats): d0, d1 = (g, 2t..2t+1), d2, d3 = (g+8, 2t..2t+1)
//   SPLIT_A (T = bfloat16, A holds float values): A = hi + mid + lo, three mma per tile step.
template <typename T, int D, bool SPLIT_A = false>
__device__ __forceinline__ void tile_dots_mma(float* __restrict__ c, const float* __restrict__ a,
                                              const float* __restrict__ b, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int grp = lane >> 2, tig = lane & 3;
  const int r0 = 16 * (warp & 3), c0 = 32 * (warp >> 2);
  float acc[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll 2
  for (int k0 = 0; k0 < D; k0 += 16) {
    const float* ar = a + (r0 + grp) * (D + 1) + k0 + 2 * tig;
    const float* ar8 = ar + 8 * (D + 1);
    if constexpr (SPLIT_A) {
      // Fragment element order as below; each float x = hi + mid + lo, every part a
      // bfloat16 (the residual of rounding to 8 bits is exact in float).
      float x[8] = {ar[0], ar[1], ar8[0], ar8[1], ar[8], ar[9], ar8[8], ar8[9]};
      uint32_t parts[3][4];
      split_fragment<T, 3>(x, parts);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float* br = b + (c0 + 8 * nt + grp) * (D + 1) + k0 + 2 * tig;
        const uint32_t fb[2] = {pack2<T>(br[0], br[1]), pack2<T>(br[8], br[9])};
        // the smallest part first
        mma_m16n8k16<T>(acc[nt], parts[2], fb);
        mma_m16n8k16<T>(acc[nt], parts[1], fb);
        mma_m16n8k16<T>(acc[nt], parts[0], fb);
      }
    } else {
      const uint32_t fa[4] = {pack2<T>(ar[0], ar[1]), pack2<T>(ar8[0], ar8[1]),
                              pack2<T>(ar[8], ar[9]), pack2<T>(ar8[8], ar8[9])};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float* br = b + (c0 + 8 * nt + grp) * (D + 1) + k0 + 2 * tig;
        const uint32_t fb[2] = {pack2<T>(br[0], br[1]), pack2<T>(br[8], br[9])};
        mma_m16n8k16<T>(acc[nt], fa, fb);
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    float* out = c + (r0 + grp) * (kBN + 1) + c0 + 8 * nt + 2 * tig;
    out[0] = acc[nt][0];
    out[1] = acc[nt][1];
    out[8 * (kBN + 1)] = acc[nt][2];
    out[8 * (kBN + 1) + 1] = acc[nt][3];
  }
}

// s = the 64 x 64 tile of A B^T in the fp32 path's ownership (rows ty + 16 i, columns
// tx + 16 j), on tensor cores through the shared tile c (MMA) or with FMAs.  With MMA it
// contains a __syncthreads, so it must be reached by the whole block.
template <typename T, int D, bool MMA, bool SPLIT_A = false>
__device__ __forceinline__ void tile_product(float (&s)[kRows][kCols], const float* __restrict__ a,
                                             const float* __restrict__ b, float* __restrict__ c,
                                             int tid, int ty, int tx) {
  if constexpr (MMA) {
    tile_dots_mma<T, D, SPLIT_A>(c, a, b, tid);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < kCols; ++j) s[i][j] = c[(ty + kTY * i) * (kBN + 1) + tx + kTY * j];
  } else {
    tile_dots<D>(s, a, b, ty, tx);
  }
}

// acc += P V on tensor cores for one key tile: P = p (row pitch kBN + 1, 64 x 64 floats),
// V = vt (row pitch D + 1, 64 keys x D).  Warp w owns O rows 16 (w % 4) .. +16 and columns
// (w / 4) D / 2 .. + D / 2: D / 16 m16n8 tiles, acc[nt] in the C / D layout of
// tile_dots_mma.  A is P (row major: A[r][k] = p[r][k]), B[k][n] = vt[k][n] (k the key).
// Each P fragment is split into two half parts (hi + lo), the smaller first.
template <typename T, int D>
__device__ __forceinline__ void pv_mma(float (&acc)[D / 16][4], const float* __restrict__ p,
                                       const float* __restrict__ vt, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int grp = lane >> 2, tig = lane & 3;
  const int r0 = 16 * (warp & 3), c0 = (D / 2) * (warp >> 2);
#pragma unroll
  for (int k0 = 0; k0 < kBN; k0 += 16) {
    const float* pr = p + (r0 + grp) * (kBN + 1) + k0 + 2 * tig;
    const float* pr8 = pr + 8 * (kBN + 1);
    float x[8] = {pr[0], pr[1], pr8[0], pr8[1], pr[8], pr[9], pr8[8], pr8[9]};
    uint32_t parts[2][4];
    split_fragment<T, 2>(x, parts);
    const float* vk = vt + (k0 + 2 * tig) * (D + 1) + c0 + grp;
#pragma unroll
    for (int nt = 0; nt < D / 16; ++nt) {
      const float* vc = vk + 8 * nt;
      const uint32_t fb[2] = {pack2<T>(vc[0], vc[D + 1]), pack2<T>(vc[8 * (D + 1)], vc[9 * (D + 1)])};
      mma_m16n8k16<T>(acc[nt], parts[1], fb);
      mma_m16n8k16<T>(acc[nt], parts[0], fb);
    }
  }
}

template <typename T>
constexpr bool is_half_type() {
  return sizeof(T) == 2;
}

// Last key index + 1 that any row of the query tile starting at q0 may attend to.
__device__ __forceinline__ int causal_key_end(int q0, int n_q, int n_k) {
  const int last_row = min(q0 + kBM, n_q) - 1;
  const long long end = (long long)last_row + (n_k - n_q) + 1;
  return (int)max(0LL, min((long long)n_k, end));
}

// -------------------------------------------------------------- forward kernel
// One block per (query tile, head, batch).  Online softmax over key tiles; writes
// the row statistics (m, l), and O = softmax(.) V when WITH_O.
template <typename T, int D, bool WITH_O, bool MMA>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
attn_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                const float* __restrict__ mask, T* __restrict__ o, float* __restrict__ stats,
                int H, int n_q, int n_k, int d, float scale, int causal, Strides sq, Strides sk,
                Strides sv, Strides so, long long mask_sb) {
  constexpr int kDPer = D / kTY;  // output columns per thread
  extern __shared__ float smem[];
  float* s_q = smem;                    // [kBM][D + 1]
  float* s_kv = s_q + kBM * (D + 1);    // [kBN][D + 1]  K, then V
  float* s_p = s_kv + kBN * (D + 1);    // [kBM][kBN + 1] (WITH_O or MMA): P, scores of MMA
  // WITH_O and MMA: the rows' alpha, then their l, in s_p's pad column (kBN), which P never
  // uses (no more shared memory: 2 blocks per SM at D = 128 on an A100 too)
  constexpr bool kPvMma = WITH_O && MMA;

  const int tid = threadIdx.x;
  const int ty = tid / kTY;
  const int tx = tid % kTY;
  const int q0 = blockIdx.x * kBM;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int causal_off = n_k - n_q;

  const T* qb = q + b * sq.b + h * sq.h;
  const T* kb = k + b * sk.b + h * sk.h;
  const T* vb = v + b * sv.b + h * sv.h;
  const float* mb = mask != nullptr ? mask + b * mask_sb : nullptr;

  load_tile<T, D, kBM>(s_q, qb, sq.n, q0, n_q, d);

  float m[kRows], l[kRows];
  float acc[kRows][kDPer];
  float acc_tc[kPvMma ? D / 16 : 1][4];  // the tensor-core P V accumulators (pv_mma)
#pragma unroll
  for (int nt = 0; nt < (kPvMma ? D / 16 : 1); ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_tc[nt][e] = 0.f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int e = 0; e < kDPer; ++e) acc[i][e] = 0.f;
  }

  const int k_end = causal ? causal_key_end(q0, n_q, n_k) : n_k;
  for (int k0 = 0; k0 < k_end; k0 += kBN) {
    __syncthreads();  // previous tile's readers of s_kv / s_p are done; s_q is visible
    load_tile<T, D, kBN>(s_kv, kb, sk.n, k0, n_k, d);
    __syncthreads();

    float s[kRows][kCols];
    tile_product<T, D, MMA>(s, s_q, s_kv, s_p, tid, ty, tx);

    float bias[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = k0 + tx + kTY * j;
      bias[j] = (c < n_k && mb != nullptr) ? mb[c] : 0.f;
    }

#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = q0 + ty + kTY * i;
      float tmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int c = k0 + tx + kTY * j;
        const bool ok = c < n_k && (!causal || c <= r + causal_off);
        s[i][j] = ok ? s[i][j] * scale + bias[j] : -INFINITY;
        tmax = fmaxf(tmax, s[i][j]);
      }
      tmax = row_max16(tmax);
      const float m_new = fmaxf(m[i], tmax);
      float alpha = 1.f;
      float psum = 0.f;
      if (m_new == -INFINITY) {
        // Nothing allowed so far in this row: keep l = 0, acc = 0.
#pragma unroll
        for (int j = 0; j < kCols; ++j) s[i][j] = 0.f;
      } else {
        alpha = expf(m[i] - m_new);  // m[i] == -inf gives 0
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          s[i][j] = expf(s[i][j] - m_new);  // -inf gives 0
          psum += s[i][j];
        }
      }
      psum = row_sum16(psum);
      l[i] = l[i] * alpha + psum;
      m[i] = m_new;
      if (WITH_O) {
        if constexpr (kPvMma) {
          if (tx == 0) s_p[(ty + kTY * i) * (kBN + 1) + kBN] = alpha;
        } else {
#pragma unroll
          for (int e = 0; e < kDPer; ++e) acc[i][e] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < kCols; ++j) s_p[(ty + kTY * i) * (kBN + 1) + tx + kTY * j] = s[i][j];
      }
    }

    if (WITH_O) {
      __syncthreads();  // everyone is done with K in s_kv; s_p is complete
      load_tile<T, D, kBN>(s_kv, vb, sv.n, k0, n_k, d);
      __syncthreads();
      if constexpr (kPvMma) {
        const int lane = tid & 31;
        const int row = 16 * ((tid >> 5) & 3) + (lane >> 2);
        const float al0 = s_p[row * (kBN + 1) + kBN], al8 = s_p[(row + 8) * (kBN + 1) + kBN];
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt) {
          acc_tc[nt][0] *= al0;
          acc_tc[nt][1] *= al0;
          acc_tc[nt][2] *= al8;
          acc_tc[nt][3] *= al8;
        }
        pv_mma<T, D>(acc_tc, s_p, s_kv, tid);
      } else {
#pragma unroll 4
      for (int c = 0; c < kBN; ++c) {
        float pv[kRows];
#pragma unroll
        for (int i = 0; i < kRows; ++i) pv[i] = s_p[(ty + kTY * i) * (kBN + 1) + c];
#pragma unroll
        for (int e = 0; e < kDPer; ++e) {
          const float vv = s_kv[c * (D + 1) + tx + kTY * e];
#pragma unroll
          for (int i = 0; i < kRows; ++i) acc[i][e] = fmaf(pv[i], vv, acc[i][e]);
        }
      }
      }
    }
  }

  if constexpr (kPvMma) {
    // O from the accumulators: rows r0 + grp (+ 8), columns c0 + 8 nt + 2 tig (+ 1); the
    // rows' l through shared memory (the pad column, once every warp has read its alphas).
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (tx == 0) s_p[(ty + kTY * i) * (kBN + 1) + kBN] = l[i];
    __syncthreads();
    const int lane = tid & 31, grp = lane >> 2, tig = lane & 3;
    const int r0 = 16 * ((tid >> 5) & 3) + grp, c0 = (D / 2) * (tid >> 7) + 2 * tig;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = q0 + r0 + 8 * half;
      if (r >= n_q) continue;
      const float row_l = s_p[(r0 + 8 * half) * (kBN + 1) + kBN];
      const float inv = row_l > 0.f ? 1.f / row_l : 0.f;
      T* orow = o + b * so.b + h * so.h + (long long)r * so.n;
#pragma unroll
      for (int nt = 0; nt < D / 16; ++nt) {
        const int dd = c0 + 8 * nt;
        if (dd < d) orow[dd] = from_float<T>(acc_tc[nt][2 * half] * inv);
        if (dd + 1 < d) orow[dd + 1] = from_float<T>(acc_tc[nt][2 * half + 1] * inv);
      }
    }
  }

  float* stats_bh = stats + ((long long)b * H + h) * n_q * 2;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = q0 + ty + kTY * i;
    if (r >= n_q) continue;
    const bool any = l[i] > 0.f;
    if (WITH_O && !kPvMma) {
      const float inv = any ? 1.f / l[i] : 0.f;
      T* orow = o + b * so.b + h * so.h + (long long)r * so.n;
#pragma unroll
      for (int e = 0; e < kDPer; ++e) {
        const int dd = tx + kTY * e;
        if (dd < d) orow[dd] = from_float<T>(acc[i][e] * inv);
      }
    }
    if (tx == 0) {
      stats_bh[2 * r] = m[i];
      stats_bh[2 * r + 1] = l[i];
    }
  }
}

// ---------------------------------------------------------- attribution kernel
// Grid (key tile, query tile, batch * groups); block z = b * groups + group handles the
// heads [group * heads_per_group, min(H, (group + 1) * heads_per_group)).  For each head:
//   p_ij  = exp(s_ij * scale + mask_j - m_i) / l_i   (0 where causally excluded)
//   a_ij  = p_ij * (g_i . v_j)
// maps (optional) are written once per element.  The group's head sum is accumulated in
// registers and written once to sum_out + blockIdx.z * n_q * n_k: head_sum itself when
// there is one group, else the workspace that head_sum_reduce_kernel adds up.  Each
// head's maximum over the tile goes to partials[(b * H + h) * tiles + tile], reduced by
// head_max_reduce_kernel.  No atomics: every output is deterministic.
// SPLIT_G: g is float32 beside bfloat16 q, k, v (tensor cores only, see the top).
// Per-key sums (col_out not null; sum_out then unused, maps null): instead of its head-sum
// tile the block writes, per key column of the tile, the group's attribution summed over the
// tile's query rows, and over its rows r >= read_from, to
// col_out[((blockIdx.z * gridDim.y + blockIdx.y) * 2 + {0, 1}) * n_k + column]; the sources'
// quantity sum_i sum_h a_ij without any n_q x n_k array (key_sum_reduce_kernel adds them).
template <typename T, int D, bool MMA, bool SPLIT_G,
          typename TG = typename std::conditional<SPLIT_G, float, T>::type>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
attr_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
            const TG* __restrict__ g, const float* __restrict__ mask, const float* __restrict__ stats,
            float* __restrict__ maps, float* __restrict__ sum_out, float* __restrict__ partials,
            float* __restrict__ col_out, int read_from,
            int H, int heads_per_group, int n_q, int n_k, int d, float scale, int causal,
            Strides sq, Strides sk, Strides sv, Strides sg, long long mask_sb) {
  extern __shared__ float smem[];
  float* s_a = smem;                  // [kBM][D + 1]  Q, then G
  float* s_b = s_a + kBM * (D + 1);   // [kBN][D + 1]  K, then V
  float* s_red = s_b + kBN * (D + 1); // [kWarps]      per-warp maxima
  float* s_c = s_red + kWarps;        // [kBM][kBN + 1] tensor-core products (MMA only)

  const int tid = threadIdx.x;
  const int ty = tid / kTY;
  const int tx = tid % kTY;
  const int k0 = blockIdx.x * kBN;
  const int q0 = blockIdx.y * kBM;
  const int groups = (H + heads_per_group - 1) / heads_per_group;
  const int b = blockIdx.z / groups;
  const int h_begin = (blockIdx.z - b * groups) * heads_per_group;
  const int h_end = min(H, h_begin + heads_per_group);
  const long long tiles = (long long)gridDim.x * gridDim.y;
  const long long tile = (long long)blockIdx.y * gridDim.x + blockIdx.x;
  const int causal_off = n_k - n_q;
  // The whole tile lies right of the causal diagonal: every a_ij is 0.
  const bool skip = causal && k0 >= causal_key_end(q0, n_q, n_k);

  const float* mb = mask != nullptr ? mask + b * mask_sb : nullptr;
  float bias[kCols];
  bool col_ok[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int c = k0 + tx + kTY * j;
    col_ok[j] = c < n_k;
    bias[j] = (col_ok[j] && mb != nullptr) ? mb[c] : 0.f;
  }

  float hsum[kRows][kCols];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) hsum[i][j] = 0.f;

  for (int h = h_begin; h < h_end; ++h) {
    float a[kRows][kCols];
    if (!skip) {  // uniform over the block, so the barriers inside are safe
      __syncthreads();  // previous head's readers of s_a / s_b are done
      load_tile<T, D, kBM>(s_a, q + b * sq.b + h * sq.h, sq.n, q0, n_q, d);
      load_tile<T, D, kBN>(s_b, k + b * sk.b + h * sk.h, sk.n, k0, n_k, d);
      __syncthreads();
      float s[kRows][kCols];
      tile_product<T, D, MMA>(s, s_a, s_b, s_c, tid, ty, tx);
      __syncthreads();
      load_tile<TG, D, kBM>(s_a, g + b * sg.b + h * sg.h, sg.n, q0, n_q, d);
      load_tile<T, D, kBN>(s_b, v + b * sv.b + h * sv.h, sv.n, k0, n_k, d);
      __syncthreads();
      tile_product<T, D, MMA, SPLIT_G>(a, s_a, s_b, s_c, tid, ty, tx);  // a = G V^T for now

      const float* stats_bh = stats + ((long long)b * H + h) * n_q * 2;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = q0 + ty + kTY * i;
        // A row without any allowed key (l == 0) or past n_q gets p = exp(-inf) * 0 = 0.
        float row_m = INFINITY, row_inv_l = 0.f;
        if (r < n_q) {
          const float row_l = stats_bh[2 * r + 1];
          if (row_l > 0.f) {
            row_m = stats_bh[2 * r];
            row_inv_l = 1.f / row_l;
          }
        }
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          const int c = k0 + tx + kTY * j;
          const bool allowed = !causal || c <= r + causal_off;
          const float p = allowed ? expf(s[i][j] * scale + bias[j] - row_m) * row_inv_l : 0.f;
          a[i][j] *= p;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < kCols; ++j) a[i][j] = 0.f;
    }

    float local_max = -INFINITY;
    float* maps_bh = maps != nullptr ? maps + ((long long)b * H + h) * n_q * n_k : nullptr;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = q0 + ty + kTY * i;
      if (r >= n_q) continue;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        if (!col_ok[j]) continue;
        const int c = k0 + tx + kTY * j;
        local_max = fmaxf(local_max, a[i][j]);
        hsum[i][j] += a[i][j];
        if (maps_bh != nullptr) maps_bh[(long long)r * n_k + c] = a[i][j];
      }
    }
    // Block maximum: warps, then thread 0 over the warps (fixed order).
    local_max = warp_max(local_max);
    __syncthreads();  // thread 0 has read the previous head's s_red
    if ((tid & 31) == 0) s_red[tid / 32] = local_max;
    __syncthreads();
    if (tid == 0) {
      float block_max = s_red[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) block_max = fmaxf(block_max, s_red[w]);
      partials[((long long)b * H + h) * tiles + tile] = block_max;
    }
  }

  if (col_out != nullptr) {  // uniform over the block
    __syncthreads();  // the head loop's readers of s_a / s_b are done
    float* s_all = s_a;   // [kTY][kBN]: per thread row ty, the column sums of its rows
    float* s_read = s_b;  // [kTY][kBN]: the same over the rows r >= read_from
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      float all = 0.f, read = 0.f;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = q0 + ty + kTY * i;
        if (r >= n_q) continue;
        all += hsum[i][j];
        if (r >= read_from) read += hsum[i][j];
      }
      s_all[ty * kBN + tx + kTY * j] = all;
      s_read[ty * kBN + tx + kTY * j] = read;
    }
    __syncthreads();
    if (tid < kBN) {
      float all = 0.f, read = 0.f;
      for (int y = 0; y < kTY; ++y) {  // fixed order: deterministic
        all += s_all[y * kBN + tid];
        read += s_read[y * kBN + tid];
      }
      const int c = k0 + tid;
      if (c < n_k) {
        float* out = col_out + ((long long)blockIdx.z * gridDim.y + blockIdx.y) * 2 * n_k;
        out[c] = all;
        out[n_k + c] = read;
      }
    }
    return;
  }

  float* sum_b = sum_out + (long long)blockIdx.z * n_q * n_k;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = q0 + ty + kTY * i;
    if (r >= n_q) continue;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      if (!col_ok[j]) continue;
      sum_b[(long long)r * n_k + k0 + tx + kTY * j] = hsum[i][j];
    }
  }
}

// Second pass, head groups > 1: head_sum[b, e] = sum over g of workspace[b, g, e], in the
// order g = 0, 1, ... (deterministic).
__global__ void head_sum_reduce_kernel(const float* __restrict__ workspace,
                                       float* __restrict__ head_sum, int B, int groups,
                                       long long per_item) {
  const long long total = (long long)B * per_item;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long b = idx / per_item;
    const long long e = idx - b * per_item;
    const float* src = workspace + b * groups * per_item + e;
    float acc = 0.f;
    for (int grp = 0; grp < groups; ++grp) acc += src[grp * per_item];
    head_sum[idx] = acc;
  }
}

// Second pass of the per-key sums: key_sums[b, w, c] = sum over p of
// col_out[((b * parts + p) * 2 + w) * n_k + c], p = group * q_tiles + query tile, in the
// order p = 0, 1, ... (deterministic); w = 0 all query rows, w = 1 rows >= read_from.
__global__ void key_sum_reduce_kernel(const float* __restrict__ col_out,
                                      float* __restrict__ key_sums, int B, int parts, int n_k) {
  const long long total = (long long)B * 2 * n_k;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long b = idx / (2LL * n_k);
    const long long rest = idx - b * 2LL * n_k;  // w * n_k + c
    const float* src = col_out + b * parts * 2LL * n_k + rest;
    float acc = 0.f;
    for (int part = 0; part < parts; ++part) acc += src[part * 2LL * n_k];
    key_sums[idx] = acc;
  }
}

// head_max[bh] = max over the tiles of partials[bh, tile]; one warp per (b, h).
__global__ void head_max_reduce_kernel(const float* __restrict__ partials,
                                       float* __restrict__ head_max, long long BH,
                                       long long tiles) {
  const long long bh = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  float best = -INFINITY;
  if (bh < BH) {
    for (long long t = lane; t < tiles; t += 32) best = fmaxf(best, partials[bh * tiles + t]);
  }
  best = warp_max(best);  // every lane of the block takes part (the shuffle needs them all)
  if (bh < BH && lane == 0) head_max[bh] = best;
}

// Heads per group for the attribution grid: split the heads only as far as needed to give
// every SM kTargetBlocksPerSM blocks (the workspace of the split stays a few MB).
inline int attr_heads_per_group(int B, int H, int n_q, int n_k, int sms) {
  const long long base = (long long)((n_k + kBN - 1) / kBN) * ((n_q + kBM - 1) / kBM) * B;
  const long long target = (long long)kTargetBlocksPerSM * (sms > 0 ? sms : 1);
  long long groups = (target + base - 1) / base;
  groups = groups < 1 ? 1 : (groups > H ? H : groups);
  const long long max_groups = 65535 / B;  // grid z = B * groups
  if (groups > max_groups) groups = max_groups < 1 ? 1 : max_groups;
  return (int)((H + groups - 1) / groups);
}

// ------------------------------------------------------------------ launchers
inline Strides make_strides(const long long* s) { return Strides{s[0], s[1], s[2]}; }

template <typename T, int D, bool MMA>
cudaError_t launch_forward(const void* q, const void* k, const void* v, const float* mask, void* o,
                           float* stats, int B, int H, int n_q, int n_k, int d,
                           const long long* q_str, const long long* k_str,
                           const long long* v_str, const long long* o_str, long long mask_sb,
                           float scale, int causal, cudaStream_t stream) {
  const bool with_o = o != nullptr;
  const size_t smem = sizeof(float) * ((size_t)(kBM + kBN) * (D + 1) +
                                       (with_o || MMA ? (size_t)kBM * (kBN + 1) : 0));
  const Strides zero{0, 0, 0};
  const Strides so = with_o ? make_strides(o_str) : zero;
  const dim3 grid((n_q + kBM - 1) / kBM, H, B);
  auto kern = with_o ? attn_fwd_kernel<T, D, true, MMA> : attn_fwd_kernel<T, D, false, MMA>;
  if (smem > kDefaultSmem) {
    cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  kern<<<grid, kThreads, smem, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), mask,
      static_cast<T*>(o), stats, H, n_q, n_k, d, scale, causal, make_strides(q_str),
      make_strides(k_str), make_strides(v_str), so, mask_sb);
  return cudaGetLastError();
}

template <typename T, int D, bool MMA, bool SPLIT_G>
cudaError_t launch_attr(const void* q, const void* k, const void* v, const void* g,
                        const float* mask, const float* stats, float* maps, float* head_sum,
                        float* head_max, float* workspace, float* partials, float* col_out,
                        float* key_sums, int read_from, int heads_per_group,
                        int B, int H, int n_q, int n_k, int d, const long long* q_str,
                        const long long* k_str, const long long* v_str, const long long* g_str,
                        long long mask_sb, float scale, int causal, cudaStream_t stream) {
  const int groups = (H + heads_per_group - 1) / heads_per_group;
  const size_t smem = sizeof(float) * ((size_t)(kBM + kBN) * (D + 1) + kWarps +
                                       (MMA ? (size_t)kBM * (kBN + 1) : 0));
  using TG = typename std::conditional<SPLIT_G, float, T>::type;
  auto kern = attr_kernel<T, D, MMA, SPLIT_G>;
  cudaError_t err;
  if (smem > kDefaultSmem) {
    err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((n_k + kBN - 1) / kBN, (n_q + kBM - 1) / kBM, B * groups);
  const bool key_mode = col_out != nullptr;
  float* sum_out = key_mode ? nullptr : (groups > 1 ? workspace : head_sum);
  kern<<<grid, kThreads, smem, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<const TG*>(g), mask, stats, key_mode ? nullptr : maps, sum_out, partials,
      col_out, read_from, H, heads_per_group, n_q,
      n_k, d, scale, causal, make_strides(q_str), make_strides(k_str), make_strides(v_str),
      make_strides(g_str), mask_sb);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  const long long per_item = (long long)n_q * n_k;
  if (key_mode) {
    const long long blocks = ((long long)B * 2 * n_k + kThreads - 1) / kThreads;
    key_sum_reduce_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(
        col_out, key_sums, B, (int)(groups * grid.y), n_k);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  } else if (groups > 1) {
    const long long blocks = ((long long)B * per_item + kThreads - 1) / kThreads;
    head_sum_reduce_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(
        workspace, head_sum, B, groups, per_item);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const long long BH = (long long)B * H;
  const long long tiles = (long long)grid.x * grid.y;
  head_max_reduce_kernel<<<(unsigned)((BH + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      partials, head_max, BH, tiles);
  return cudaGetLastError();
}

// Shape checks shared by both entry points; the binding checks as well.
inline bool bad_sizes(int B, int H, int n_q, int n_k, int d) {
  return B <= 0 || H <= 0 || n_q <= 0 || n_k <= 0 || d <= 0 || d > kMaxHeadDim || B > 65535 ||
         H > 65535 || (n_q + kBM - 1) / kBM > 65535;
}

template <typename T>
cudaError_t dispatch_forward(int d, const void* q, const void* k, const void* v,
                             const float* mask, void* o, float* stats, int B, int H, int n_q,
                             int n_k, const long long* q_str, const long long* k_str,
                             const long long* v_str, const long long* o_str, long long mask_sb,
                             float scale, int causal, int tensor_cores, cudaStream_t stream) {
#define ATTATTR_FWD(DD, MMA)                                                                 \
  return launch_forward<T, DD, MMA>(q, k, v, mask, o, stats, B, H, n_q, n_k, d, q_str, k_str, \
                                    v_str, o_str, mask_sb, scale, causal, stream)
  if constexpr (is_half_type<T>()) {
    if (tensor_cores) {
      if (d <= 32) ATTATTR_FWD(32, true);
      if (d <= 64) ATTATTR_FWD(64, true);
      if (d <= 96) ATTATTR_FWD(96, true);
      ATTATTR_FWD(128, true);
    }
  }
  if (d <= 32) ATTATTR_FWD(32, false);
  if (d <= 64) ATTATTR_FWD(64, false);
  if (d <= 96) ATTATTR_FWD(96, false);
  ATTATTR_FWD(128, false);
#undef ATTATTR_FWD
}

template <typename T>
cudaError_t dispatch_attr(int d, const void* q, const void* k, const void* v, const void* g,
                          const float* mask, const float* stats, float* maps, float* head_sum,
                          float* head_max, float* workspace, float* partials, float* col_out,
                          float* key_sums, int read_from, int heads_per_group, int B, int H,
                          int n_q, int n_k,
                          const long long* q_str, const long long* k_str, const long long* v_str,
                          const long long* g_str, long long mask_sb, float scale, int causal,
                          int tensor_cores, bool split_g, cudaStream_t stream) {
#define ATTATTR_ATTR(DD, MMA, SPLIT)                                                          \
  return launch_attr<T, DD, MMA, SPLIT>(q, k, v, g, mask, stats, maps, head_sum, head_max,    \
                                        workspace, partials, col_out, key_sums, read_from,    \
                                        heads_per_group, B, H, n_q, n_k,                      \
                                        d, q_str, k_str, v_str, g_str, mask_sb, scale, causal, \
                                        stream)
  if constexpr (is_bf16<T>::value) {
    if (split_g) {  // float32 G: the caller checked tensor_cores
      if (d <= 32) ATTATTR_ATTR(32, true, true);
      if (d <= 64) ATTATTR_ATTR(64, true, true);
      if (d <= 96) ATTATTR_ATTR(96, true, true);
      ATTATTR_ATTR(128, true, true);
    }
  }
  if constexpr (is_half_type<T>()) {
    if (tensor_cores) {
      if (d <= 32) ATTATTR_ATTR(32, true, false);
      if (d <= 64) ATTATTR_ATTR(64, true, false);
      if (d <= 96) ATTATTR_ATTR(96, true, false);
      ATTATTR_ATTR(128, true, false);
    }
  }
  if (d <= 32) ATTATTR_ATTR(32, false, false);
  if (d <= 64) ATTATTR_ATTR(64, false, false);
  if (d <= 96) ATTATTR_ATTR(96, false, false);
  ATTATTR_ATTR(128, false, false);
#undef ATTATTR_ATTR
}

}  // namespace
}  // namespace attattr

// ------------------------------------------------------------- C entry points
// dtype: 0 = float32, 1 = float16, 2 = bfloat16.  Strides are {batch, head, row}
// in elements (the last dimension must be contiguous).  stream is a cudaStream_t.
// tensor_cores: nonzero runs float16 / bfloat16 inputs on the tensor-core path (mma.sync),
// 0 on the fp32 CUDA-core path; float32 inputs always take the fp32 path.
// Return 0 on success, else a cudaError_t value (see attattr_error_string).

extern "C" int attattr_attn_forward(int dtype, const void* q, const void* k, const void* v,
                                    const float* mask, void* o, float* stats, int B, int H,
                                    int n_q, int n_k, int d, const long long* q_str,
                                    const long long* k_str, const long long* v_str,
                                    const long long* o_str, long long mask_sb, float scale,
                                    int causal, int tensor_cores, void* stream) {
  using namespace attattr;
  if (bad_sizes(B, H, n_q, n_k, d) || stats == nullptr) return (int)cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0:
      return (int)dispatch_forward<float>(d, q, k, v, mask, o, stats, B, H, n_q, n_k, q_str, k_str,
                                          v_str, o_str, mask_sb, scale, causal, tensor_cores, st);
    case 1:
      return (int)dispatch_forward<__half>(d, q, k, v, mask, o, stats, B, H, n_q, n_k, q_str, k_str,
                                           v_str, o_str, mask_sb, scale, causal, tensor_cores, st);
    case 2:
      return (int)dispatch_forward<__nv_bfloat16>(d, q, k, v, mask, o, stats, B, H, n_q, n_k, q_str,
                                                  k_str, v_str, o_str, mask_sb, scale, causal,
                                                  tensor_cores, st);
    default:
      return (int)cudaErrorInvalidValue;
  }
}

// The attribution launch plan for B x H heads of n_q x n_k on a GPU with `sms`
// multiprocessors (sms <= 0: ask the current device).  Sets the heads per block
// (heads_per_group), the float32 workspace size (B * groups * n_q * n_k when the heads are
// split into more than one group, else 0) and the size of the partial maxima
// (B * H * tiles); the caller allocates both and passes them to attattr_attr_from_grad.
// The grid is (ceil(n_k / 64), ceil(n_q / 64), B * groups).
extern "C" int attattr_attr_plan(int B, int H, int n_q, int n_k, int sms, int* heads_per_group,
                                 long long* workspace_floats, long long* partial_floats) {
  using namespace attattr;
  if (B <= 0 || H <= 0 || n_q <= 0 || n_k <= 0 || heads_per_group == nullptr ||
      workspace_floats == nullptr || partial_floats == nullptr)
    return (int)cudaErrorInvalidValue;
  if (sms <= 0) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return (int)err;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return (int)err;
  }
  const int hpg = attr_heads_per_group(B, H, n_q, n_k, sms);
  const long long groups = (H + hpg - 1) / hpg;
  const long long tiles = (long long)((n_k + kBN - 1) / kBN) * ((n_q + kBM - 1) / kBM);
  *heads_per_group = hpg;
  *workspace_floats = groups > 1 ? (long long)B * groups * n_q * n_k : 0;
  *partial_floats = (long long)B * H * tiles;
  return 0;
}

namespace attattr {
namespace {
// The attribution entry points' shared body (see attattr_attr_from_grad below).
int attr_entry(int dtype, int g_dtype, const void* q, const void* k, const void* v, const void* g,
               const float* mask, const float* stats, float* maps, float* head_sum,
               float* head_max, float* workspace, float* partials, float* col_out,
               float* key_sums, int read_from, int heads_per_group, int B, int H, int n_q,
               int n_k, int d, const long long* q_str, const long long* k_str,
               const long long* v_str, const long long* g_str, long long mask_sb, float scale,
               int causal, int tensor_cores, void* stream) {
  if (bad_sizes(B, H, n_q, n_k, d) || stats == nullptr || head_max == nullptr ||
      partials == nullptr || heads_per_group < 1)
    return (int)cudaErrorInvalidValue;
  const long long groups = (H + heads_per_group - 1) / heads_per_group;
  if (col_out == nullptr &&
      (head_sum == nullptr || (groups > 1 && workspace == nullptr)))
    return (int)cudaErrorInvalidValue;
  if (col_out != nullptr && key_sums == nullptr) return (int)cudaErrorInvalidValue;
  if ((long long)B * groups > 65535) return (int)cudaErrorInvalidValue;
  // g has q's dtype, or is float32 beside bfloat16 q, k, v on the tensor-core path.
  const bool split_g = dtype == 2 && g_dtype == 0;
  if (g_dtype != dtype && !(split_g && tensor_cores)) return (int)cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define ATTATTR_DISPATCH(TT, SPLIT)                                                           \
  return (int)dispatch_attr<TT>(d, q, k, v, g, mask, stats, maps, head_sum, head_max,         \
                                workspace, partials, col_out, key_sums, read_from,            \
                                heads_per_group, B, H, n_q, n_k, q_str, k_str, v_str, g_str,  \
                                mask_sb, scale, causal, tensor_cores, SPLIT, st)
  switch (dtype) {
    case 0:
      ATTATTR_DISPATCH(float, false);
    case 1:
      ATTATTR_DISPATCH(__half, false);
    case 2:
      ATTATTR_DISPATCH(__nv_bfloat16, split_g);
    default:
      return (int)cudaErrorInvalidValue;
  }
#undef ATTATTR_DISPATCH
}
}  // namespace
}  // namespace attattr

// stats must come from attattr_attn_forward on the same q, k, mask, scale, causal.
// g_dtype: g's dtype code, dtype's own, or 0 (float32) with dtype 2 (bfloat16) and
// tensor_cores (the split path); anything else is cudaErrorInvalidValue.
// maps may be null; head_sum and head_max are always written.  heads_per_group, workspace
// and partials as given by attattr_attr_plan (workspace may be null when it asked for 0).
extern "C" int attattr_attr_from_grad(int dtype, int g_dtype, const void* q, const void* k,
                                      const void* v, const void* g, const float* mask,
                                      const float* stats,
                                      float* maps, float* head_sum, float* head_max,
                                      float* workspace, float* partials, int heads_per_group,
                                      int B, int H, int n_q, int n_k, int d,
                                      const long long* q_str, const long long* k_str,
                                      const long long* v_str, const long long* g_str,
                                      long long mask_sb, float scale, int causal,
                                      int tensor_cores, void* stream) {
  return attattr::attr_entry(dtype, g_dtype, q, k, v, g, mask, stats, maps, head_sum, head_max,
                             workspace, partials, nullptr, nullptr, 0, heads_per_group, B, H,
                             n_q, n_k, d, q_str, k_str, v_str, g_str, mask_sb, scale, causal,
                             tensor_cores, stream);
}

// The per-key sums of the attribution (the sources' quantity), no n_q x n_k array:
// key_sums [B, 2, n_k] float32, [b, 0, j] = sum_h sum_i a_ij and [b, 1, j] the same over the
// query rows i >= read_from (read_from >= n_q: zeros); head_max [B, H] as above.
// col_partials: B * groups * ceil(n_q / 64) * 2 * n_k floats of scratch, groups =
// ceil(H / heads_per_group) from attattr_attr_plan (whose workspace is not needed here).
extern "C" int attattr_attr_key_sums(int dtype, int g_dtype, const void* q, const void* k,
                                     const void* v, const void* g, const float* mask,
                                     const float* stats, float* key_sums, float* head_max,
                                     float* col_partials, float* partials, int read_from,
                                     int heads_per_group, int B, int H, int n_q, int n_k, int d,
                                     const long long* q_str, const long long* k_str,
                                     const long long* v_str, const long long* g_str,
                                     long long mask_sb, float scale, int causal,
                                     int tensor_cores, void* stream) {
  if (col_partials == nullptr) return (int)cudaErrorInvalidValue;
  return attattr::attr_entry(dtype, g_dtype, q, k, v, g, mask, stats, nullptr, nullptr,
                             head_max, nullptr, partials, col_partials, key_sums, read_from,
                             heads_per_group, B, H, n_q, n_k, d, q_str, k_str, v_str, g_str,
                             mask_sb, scale, causal, tensor_cores, stream);
}

extern "C" const char* attattr_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
