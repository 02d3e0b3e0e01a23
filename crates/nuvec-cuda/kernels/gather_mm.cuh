// Products of matrices picked by index (gather_mm; fast/gather_mm.rs): output i is
// a[lhs[i]] @ b[rhs[i]], a [Ba, M, K] and b [Bb, K, N] read with K contiguous (b as W [Bb, N, K],
// a mixture of experts' stacked weights), so the picked matrices are read in place, never copied.
//  - gather_gemv_m{M} (gm_gemv): few rows in all (decoding through experts). Block row y is
//    output i, on which gemv_rows (matmul.cuh) runs as for one product.
//  - gather_runs (gm_runs), then gather_mm_tc (gm_tiles): many rows, on tensor cores. Rows of
//    the output (row r of the [L·M, N] result belongs to index r / M) that use the same matrix
//    of b form runs, long when the indices are sorted (mlx-lm sorts them from 64 up);
//    gather_runs cuts the runs into tiles of at most BM rows and lists them, and each block of
//    gather_mm_tc takes tiles of BM × BN outputs, gathering its rows of a as it stages them. Unsorted indices give short runs: correct, only slower.
// Indices are 32-bit, signed or not (`flags` bit 0: lhs unsigned, bit 1: rhs unsigned); they
// wrap once when negative and are clamped into the stack, as take's.
#pragma once
#include "matmul.cuh"

// Warps of gather_mm_tc's blocks; its tile shape is a template (fast/gather_mm.rs).
#define GM_WARPS 8
#define GM_RUN_THREADS 1024
// Consecutive rows each gather_runs thread takes per pass.
#define GM_RUN_ROWS 8

__device__ __forceinline__ i64 gm_pick(const u32* idx, i64 i, bool is_unsigned, i64 n) {
  u32 raw = idx[i];
  i64 j = is_unsigned ? (i64)raw : (i64)(i32)raw;
  if (j < 0) j += n;
  return j < 0 ? 0 : (j >= n ? n - 1 : j);
}

// Output i = blockIdx.y: M rows of a[lhs[i]] (rows lda apart, stack stride sa) against
// b[rhs[i]] as W [N, K] (rows ldw apart, stack stride sb), into out's M × N block i.
template <typename T, int M>
__device__ __forceinline__ void gm_gemv(const T* a, const T* w, T* out, const u32* lhs, const u32* rhs, int flags,
                                            i64 ba, i64 bb, u64 n, u64 k, u64 lda, u64 sa, u64 ldw, u64 sb) {
  const u64 i = blockIdx.y;
  const i64 ia = gm_pick(lhs, i, flags & 1, ba), ib = gm_pick(rhs, i, flags & 2, bb);
  gemv_rows<T, M, PRO_NONE>(a + ia * sa, nullptr, 0, 0.0f, w + ib * sb, out + i * M * n, n, k, lda, ldw, n, nullptr,
                            0.0f);
}

// Lists the tiles of rows = L·M output rows, at most bm rows each: tiles[2t] = the first row of
// tile t, tiles[2t+1] = its matrix of b; tiles[2·count] = rows (the last tile's end); count into
// *count. gather_qmm's kernels (quantized_matmul.cuh) take tiles of 8 rows. One block:
// each thread walks GM_RUN_ROWS consecutive rows, then the block scans the threads' results
// (the last run's start, carried from thread to thread, and the tiles found).
__device__ __forceinline__ void gm_runs(const u32* rhs, int flags, i64 bb, i64 rows, int m, int bm, int* tiles,
                                        int* count) {
  __shared__ i64 run_at[GM_RUN_THREADS];
  __shared__ int found[GM_RUN_THREADS];
  __shared__ i64 carry_run;
  __shared__ int carry_tiles;
  const int t = threadIdx.x;
  if (t == 0) {
    carry_run = 0;
    carry_tiles = 0;
  }
  const bool us = flags & 2;
  for (i64 base = 0; base < rows; base += (i64)GM_RUN_THREADS * GM_RUN_ROWS) {
    __syncthreads();
    const i64 r0 = base + (i64)t * GM_RUN_ROWS;
    // Pass 1: where this thread's last run starts (-1: none starts here) and its tile starts,
    // counting only those that a run start decides; the BM cuts need the run's start.
    i64 last = -1;
    i64 prev = r0 > 0 && r0 < rows ? gm_pick(rhs, (r0 - 1) / m, us, bb) : -1;
    for (int j = 0; j < GM_RUN_ROWS && r0 + j < rows; ++j) {
      i64 e = gm_pick(rhs, (r0 + j) / m, us, bb);
      if (r0 + j == 0 || e != prev) last = r0 + j;
      prev = e;
    }
    run_at[t] = last;
    __syncthreads();
    // Inclusive max-scan of the run starts (Hillis-Steele; rows grow with t).
    for (int d = 1; d < GM_RUN_THREADS; d <<= 1) {
      i64 v = t >= d ? run_at[t - d] : -1;
      __syncthreads();
      if (v > run_at[t]) run_at[t] = v;
      __syncthreads();
    }
    // The run in force when this thread's rows begin.
    i64 run = t > 0 ? run_at[t - 1] : -1;
    if (run < 0) run = carry_run;
    int n = 0;
    prev = r0 > 0 && r0 < rows ? gm_pick(rhs, (r0 - 1) / m, us, bb) : -1;
    for (int j = 0; j < GM_RUN_ROWS && r0 + j < rows; ++j) {
      i64 r = r0 + j, e = gm_pick(rhs, r / m, us, bb);
      if (r == 0 || e != prev) run = r;
      prev = e;
      n += (r == run || (r - run) % bm == 0);
    }
    found[t] = n;
    __syncthreads();
    for (int d = 1; d < GM_RUN_THREADS; d <<= 1) {
      int v = t >= d ? found[t - d] : 0;
      __syncthreads();
      found[t] += v;
      __syncthreads();
    }
    // Pass 2: write the tiles at their slots.
    int slot = carry_tiles + found[t] - n;
    run = t > 0 ? run_at[t - 1] : -1;
    if (run < 0) run = carry_run;
    prev = r0 > 0 && r0 < rows ? gm_pick(rhs, (r0 - 1) / m, us, bb) : -1;
    for (int j = 0; j < GM_RUN_ROWS && r0 + j < rows; ++j) {
      i64 r = r0 + j, e = gm_pick(rhs, r / m, us, bb);
      if (r == 0 || e != prev) run = r;
      prev = e;
      if (r == run || (r - run) % bm == 0) {
        tiles[2 * slot] = (int)r;
        tiles[2 * slot + 1] = (int)e;
        ++slot;
      }
    }
    __syncthreads();
    if (t == GM_RUN_THREADS - 1) {
      if (run_at[t] >= 0) carry_run = run_at[t];
      carry_tiles += found[t];
    }
  }
  __syncthreads();
  if (t == 0) {
    tiles[2 * carry_tiles] = (int)rows;
    *count = carry_tiles;
  }
}

// One tile of BM rows × BN columns per pass: 8 warps, BM / 32 along the rows, each a 32-row ×
// BN·BM/256-column slice; a STAGES-deep cp.async ring over K in steps of BK (in dynamic shared
// memory). Rows outside the tile and columns past N stage as zeros; K % 8 == 0.
template <typename T, int BM, int BN, int BK, int STAGES>
__device__ __forceinline__ void gm_tiles(const T* a, const T* w, T* out, const u32* lhs, const int* tiles,
                                         const int* count, int flags, i64 ba, int m, int n, int k, i64 lda, i64 sa,
                                         i64 ldw, i64 sb) {
  constexpr int ROW = BK * 2 + 16;  // staged row bytes: the pad spreads ldmatrix's rows over the banks
  constexpr int WM = BM / 32, WN = GM_WARPS / WM, WT = BN / WN, NJ = WT / 16;
  constexpr int CH = BK / 8, AJ = BM * CH / (GM_WARPS * 32), BJ = BN * CH / (GM_WARPS * 32);
  static_assert(WM * WN == GM_WARPS && NJ >= 1 && AJ >= 1 && BJ >= 1, "tile shape");
  extern __shared__ __align__(128) unsigned char gm_smem[];
  const u32 base = (u32)__cvta_generic_to_shared(gm_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / WN, wn = warp % WN;
  const int n_tiles = (n + BN - 1) / BN, kt = (k + BK - 1) / BK;
  const i64 items = (i64)(*count) * n_tiles;
  for (i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = (int)(item / n_tiles), n0 = (int)(item % n_tiles) * BN;
    const int r0 = tiles[2 * tile], r1 = tiles[2 * tile + 2], e = tiles[2 * tile + 1];
    const T* we = w + (i64)e * sb;
    // The rows of a and of W this thread stages (chunk tid + 256 j of each tile).
    const T* arow[AJ];
    const T* brow[BJ];
    bool a_ok[AJ], b_ok[BJ];
#pragma unroll
    for (int j = 0; j < AJ; ++j) {
      const int ar = r0 + (tid + j * GM_WARPS * 32) / CH;
      a_ok[j] = ar < r1;
      arow[j] = a + (a_ok[j] ? gm_pick(lhs, ar / m, flags & 1, ba) * sa + (i64)(ar % m) * lda : 0);
    }
#pragma unroll
    for (int j = 0; j < BJ; ++j) {
      const int col = n0 + (tid + j * GM_WARPS * 32) / CH;
      b_ok[j] = col < n;
      brow[j] = we + (b_ok[j] ? (i64)col * ldw : 0);
    }
    // Chunk tid + 256 j of each row's BK columns from step kk, zeros where !ok or past K.
    auto stage_rows = [&](u32 dst, auto& row, auto& ok, int kk) {
#pragma unroll
      for (int j = 0; j < (int)(sizeof(ok) / sizeof(ok[0])); ++j) {
        const int ch = tid + j * GM_WARPS * 32, r = ch / CH, cc = ch % CH, c = kk * BK + cc * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + r * ROW + cc * 16),
                     "l"(row[j] + (c < k ? c : 0)), "r"(ok[j] && c < k ? 16 : 0)
                     : "memory");
      }
    };
    auto stage = [&](int s, int kk) {
      const u32 sa_ = base + s * (BM + BN) * ROW;
      stage_rows(sa_, arow, a_ok, kk);
      stage_rows(sa_ + BM * ROW, brow, b_ok, kk);
    };
    float acc[2][2 * NJ][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2 * NJ; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < kt) stage(s, s);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int kk = 0; kk < kt; ++kk) {
      asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
      __syncthreads();
      // The slot the previous step read is free: fill it STAGES - 1 steps ahead.
      if (kk + STAGES - 1 < kt) stage((kk + STAGES - 1) % STAGES, kk + STAGES - 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      const u32 sa_ = base + (kk % STAGES) * (BM + BN) * ROW, sb_ = sa_ + BM * ROW;
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks) {
        u32 af[2][4], bf[NJ][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          ldsm_x4(af[i], sa_ + (wm * 32 + i * 16 + (lane & 15)) * ROW + (ks * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          ldsm_x4(bf[j], sb_ + (wn * WT + j * 16 + (lane & 7) + (lane >> 4) * 8) * ROW +
                             (ks * 16 + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            mma_m16n8k16<T>(acc[i][2 * j], af[i], bf[j][0], bf[j][1]);
            mma_m16n8k16<T>(acc[i][2 * j + 1], af[i], bf[j][2], bf[j][3]);
          }
      }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();  // the next tile restages every slot
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + wm * 32 + i * 16 + (lane >> 2) + h * 8;
        if (r >= r1) continue;
#pragma unroll
        for (int j = 0; j < 2 * NJ; ++j) {
          const int col = n0 + wn * WT + j * 8 + (lane & 3) * 2;
          if (col < n)
            *reinterpret_cast<u32*>(out + (i64)r * n + col) = pack_half2<T>(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
  }
}
