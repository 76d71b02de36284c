// Fused softmax attention with a per-key bias for the CPU, forward and backward.
//
//   out_i = sum_j p_ij v_j,   p_ij = exp(s_ij - lse_i),   s_ij = q_i . k_j + b_j
//
// (q already multiplied by the softmax scale).  Written for the small head dimensions
// of neural operators (4 to 64 channels), where PyTorch's flash kernel spends most of
// its time in passes over the score blocks rather than in the matrix products: here a
// block of QB queries and KB keys is scored, exponentiated and applied while it is in
// L1, with the accumulators in registers (QB and the channel count are template
// parameters so that the compiler keeps them there).
//
// Layouts (prepared by meshops/kernels/attention.py; BH = batch * heads, Nk = nt * KB,
// padded keys have bias -inf and zero k, v):
//   q    [BH, Nq, E]        queries (scaled)        E: any width (forward), M*W (backward)
//   kt   [BH, nt, E, KB]    keys, tile-transposed   (keys in SIMD lanes for the scores)
//   k    [BH, Nk, E]        keys, row-major          (backward only)
//   v    [BH, Nk, C]        values, row-major        C = CV * W
//   vt   [BH, nt, C, KB]    values, tile-transposed  (backward only)
//   bias [BH, Nk]           b_j (-inf: excluded key; exp gives exactly 0)
// W is the SIMD width of the scalar type (8 floats / 4 doubles with AVX2).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using at::vec::Vectorized;

#define MESHOPS_UNROLL _Pragma("GCC unroll 8")

namespace {

template <typename T>
using Vec = Vectorized<T>;

// Horizontal reductions through a stored copy: at::vec::vec_reduce_all's overloads
// differ between torch versions (2.11's rejected the lambda that 2.13 takes), and these
// run once per row and key block, not in the inner loop.
template <typename T>
inline T hmax(Vec<T> x) {
  alignas(64) T buf[Vec<T>::size()];
  x.store(buf);
  T m = buf[0];
  for (int i = 1; i < Vec<T>::size(); ++i) m = std::max(m, buf[i]);
  return m;
}

template <typename T>
inline T hsum(Vec<T> x) {
  alignas(64) T buf[Vec<T>::size()];
  x.store(buf);
  T s = buf[0];
  for (int i = 1; i < Vec<T>::size(); ++i) s += buf[i];
  return s;
}

template <typename T>
inline Vec<T> fast_exp(Vec<T> x) {
  // ATen's polynomial exp (what its flash kernel uses); exactly 0 for -inf.
  return x.exp_u20();
}

// Scores of QB queries against one key tile: S[r * KB + j] = qs[r] . kt[:, j] + bias[j]
// (bias may be null: no bias).  Updates the running maxima vmax unless it is null.
template <typename T, int QB>
inline void score_tile(const T* qs, const T* kt, const T* bias, T* S, int64_t E, int64_t KB,
                       Vec<T>* vmax) {
  using V = Vec<T>;
  constexpr int W = V::size();
  for (int64_t j = 0; j < KB; j += 2 * W) {
    V x[QB][2];
    const V b0 = bias != nullptr ? V::loadu(bias + j) : V(T(0));
    const V b1 = bias != nullptr ? V::loadu(bias + j + W) : V(T(0));
    MESHOPS_UNROLL for (int r = 0; r < QB; ++r) { x[r][0] = b0; x[r][1] = b1; }
    for (int64_t e = 0; e < E; ++e) {
      const V k0 = V::loadu(kt + e * KB + j), k1 = V::loadu(kt + e * KB + j + W);
      MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
        const V qq(qs[r * E + e]);
        x[r][0] = at::vec::fmadd(qq, k0, x[r][0]);
        x[r][1] = at::vec::fmadd(qq, k1, x[r][1]);
      }
    }
    MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
      x[r][0].store(S + r * KB + j);
      x[r][1].store(S + r * KB + j + W);
      if (vmax != nullptr)
        vmax[r] = at::vec::maximum(vmax[r], at::vec::maximum(x[r][0], x[r][1]));
    }
  }
}

// Copy QB query rows (the last real row repeated past nq) into a contiguous buffer.
template <typename T>
inline void gather_rows(const T* src, int64_t nq, int QB, int64_t width, T* dst) {
  for (int r = 0; r < QB; ++r) {
    const T* row = src + std::min<int64_t>(r, nq - 1) * width;
    std::copy(row, row + width, dst + r * width);
  }
}

// ------------------------------------------------------------------------- forward
// One task = G groups of QB queries of one bh.  The key tiles are the outer loop, so a
// tile is read from memory once per task and reused by all G groups from L1/L2 (with
// one group per task, streaming k and v for every QB queries made the kernel
// memory-bound).  Each group keeps its online-softmax state (running maximum m, sum
// l, accumulators) in a small buffer between tiles.
template <typename T, int QB, int CV>
void forward_kernel(const T* q, const T* kt, const T* v, const T* bias, T* out, T* lse,
                    int64_t BH, int64_t Nq, int64_t nt, int64_t KB, int64_t E) {
  using V = Vec<T>;
  constexpr int W = V::size();
  constexpr int G = 16;
  const int64_t C = CV * W, Nk = nt * KB, block = G * QB;
  const int64_t blocks = (Nq + block - 1) / block;
  const T ninf = -std::numeric_limits<T>::infinity();
  at::parallel_for(0, BH * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> S(QB * KB), qs(G * QB * E), state(G * QB * C), m(G * QB), l(G * QB);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / blocks, b0 = (t % blocks) * block;
      const int64_t groups = (std::min(block, Nq - b0) + QB - 1) / QB;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t i0 = b0 + g * QB;
        gather_rows(q + (bh * Nq + i0) * E, std::min<int64_t>(QB, Nq - i0), QB, E,
                    qs.data() + g * QB * E);
      }
      std::fill(state.begin(), state.end(), T(0));
      std::fill(m.begin(), m.end(), ninf);
      std::fill(l.begin(), l.end(), T(0));
      for (int64_t tile = 0; tile < nt; ++tile) {
        const T* ktile = kt + (bh * nt + tile) * E * KB;
        const T* btile = bias + bh * Nk + tile * KB;
        const T* vtile = v + (bh * Nk + tile * KB) * C;
        for (int64_t g = 0; g < groups; ++g) {
          T* mg = m.data() + g * QB;
          T* lg = l.data() + g * QB;
          T* sg = state.data() + g * QB * C;
          V vmax[QB];
          MESHOPS_UNROLL for (int r = 0; r < QB; ++r) vmax[r] = V(ninf);
          score_tile<T, QB>(qs.data() + g * QB * E, ktile, btile, S.data(), E, KB, vmax);
          V acc[QB][CV];
          // online softmax: rescale what was accumulated when the row maximum grows
          MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
            const T mnew = std::max(mg[r], hmax<T>(vmax[r]));
            const T alpha = mnew == ninf ? T(1) : std::exp(mg[r] - mnew);
            const V vm(mnew == ninf ? T(0) : mnew);
            T* s = S.data() + r * KB;
            V vs(T(0));
            for (int64_t j = 0; j < KB; j += W) {
              const V p = fast_exp<T>(V::loadu(s + j) - vm);
              p.store(s + j);
              vs = vs + p;
            }
            mg[r] = mnew;
            lg[r] = lg[r] * alpha + hsum<T>(vs);
            const V va(alpha);
            MESHOPS_UNROLL for (int c = 0; c < CV; ++c)
              acc[r][c] = V::loadu(sg + r * C + c * W) * va;
          }
          for (int64_t j = 0; j < KB; ++j) {
            V vv[CV];
            MESHOPS_UNROLL for (int c = 0; c < CV; ++c) vv[c] = V::loadu(vtile + j * C + c * W);
            MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
              const V p(S[r * KB + j]);
              MESHOPS_UNROLL for (int c = 0; c < CV; ++c)
                acc[r][c] = at::vec::fmadd(p, vv[c], acc[r][c]);
            }
          }
          MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
            MESHOPS_UNROLL for (int c = 0; c < CV; ++c) acc[r][c].store(sg + r * C + c * W);
          }
        }
      }
      for (int64_t i = b0; i < std::min(b0 + block, Nq); ++i) {
        const int64_t a = i - b0;
        T* o = out + (bh * Nq + i) * C;
        // l == 0: no key with finite bias (the caller rejects such rows); give 0, -inf
        const T inv = l[a] > T(0) ? T(1) / l[a] : T(0);
        for (int64_t c = 0; c < C; ++c) o[c] = state[a * C + c] * inv;
        lse[bh * Nq + i] = l[a] > T(0) ? m[a] + std::log(l[a]) : ninf;
      }
    }
  });
}

// ------------------------------------------------------------------------ backward
// One task = TG key tiles of one bh: it owns dk, dv, db of those keys and sweeps all
// queries, QB at a time, so each query row (q, dO) is read once per TG tiles; dq is
// accumulated in registers over the TG tiles, then into a per-thread buffer that is
// summed at the end.
template <typename T, int QB, int MV>
void backward_kernel(const T* q, const T* k, const T* kt, const T* v, const T* vt,
                     const T* bias, const T* dout, const T* lse, const T* delta, T* dq_threads,
                     T* dk, T* dv, T* db, int64_t BH, int64_t Nq, int64_t nt, int64_t KB,
                     int64_t TG, int64_t dq_slots) {
  using V = Vec<T>;
  constexpr int W = V::size();
  constexpr int64_t E = MV * W, C = MV * W;
  const int64_t Nk = nt * KB;
  const int64_t groups = (Nq + QB - 1) / QB;
  const int64_t tgroups = (nt + TG - 1) / TG;
  const T ninf = -std::numeric_limits<T>::infinity();
  at::parallel_for(0, BH * tgroups, 1, [&](int64_t begin, int64_t end) {
    // one task per bh (all its key tiles): tasks write disjoint dq rows, one buffer;
    // otherwise one buffer per thread, summed by the caller
    const int64_t slot = tgroups == 1 ? 0 : at::get_thread_num();
    TORCH_CHECK(slot < dq_slots, "meshops fused attention: thread ", slot,
                " outside the ", dq_slots, " dq buffers");
    T* dq = dq_threads + slot * BH * Nq * E;
    std::vector<T> P(QB * KB), dS(QB * KB), qs(QB * E), gs(QB * C);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / tgroups, tile0 = (t % tgroups) * TG;
      const int64_t tile1 = std::min(nt, tile0 + TG);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t i0 = g * QB, nq = std::min<int64_t>(QB, Nq - i0);
        gather_rows(q + (bh * Nq + i0) * E, nq, QB, E, qs.data());
        gather_rows(dout + (bh * Nq + i0) * C, nq, QB, C, gs.data());
        T L[QB], D[QB];
        MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
          L[r] = r < nq ? lse[bh * Nq + i0 + r] : ninf;
          D[r] = r < nq ? delta[bh * Nq + i0 + r] : T(0);
        }
        V dqa[QB][MV];
        MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
          MESHOPS_UNROLL for (int c = 0; c < MV; ++c) dqa[r][c] = V(T(0));
        }
        for (int64_t tile = tile0; tile < tile1; ++tile) {
          const int64_t j0 = tile * KB;
          const T* krows = k + (bh * Nk + j0) * E;
          T* dkrows = dk + (bh * Nk + j0) * E;
          T* dvrows = dv + (bh * Nk + j0) * C;
          T* dbrow = db + bh * Nk + j0;
          // P = exp(S - lse) and dP = dO . v (keys in lanes); rows past nq get P = 0
          score_tile<T, QB>(qs.data(), kt + (bh * nt + tile) * E * KB, bias + bh * Nk + j0,
                            P.data(), E, KB, nullptr);
          score_tile<T, QB>(gs.data(), vt + (bh * nt + tile) * C * KB, nullptr, dS.data(), C,
                            KB, nullptr);
          MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
            T* p = P.data() + r * KB;
            T* ds = dS.data() + r * KB;
            if (L[r] == ninf) {  // padding row or a row without keys: contributes nothing
              std::fill(p, p + KB, T(0));
              std::fill(ds, ds + KB, T(0));
              continue;
            }
            const V vL(L[r]), vD(D[r]);
            for (int64_t j = 0; j < KB; j += W) {
              const V pj = fast_exp<T>(V::loadu(p + j) - vL);
              pj.store(p + j);
              (pj * (V::loadu(ds + j) - vD)).store(ds + j);
            }
          }
          // channels in lanes: dv_j += sum_r P_rj dO_r; dk_j += sum_r dS_rj q_r;
          // db_j += sum_r dS_rj; dq_r += sum_j dS_rj k_j
          for (int64_t j = 0; j < KB; ++j) {
            V a[MV], b[MV];
            T dbj = T(0);
            MESHOPS_UNROLL for (int c = 0; c < MV; ++c) {
              a[c] = V::loadu(dvrows + j * C + c * W);
              b[c] = V::loadu(dkrows + j * E + c * W);
            }
            MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
              const V pr(P[r * KB + j]), sr(dS[r * KB + j]);
              dbj += dS[r * KB + j];
              MESHOPS_UNROLL for (int c = 0; c < MV; ++c) {
                a[c] = at::vec::fmadd(pr, V::loadu(gs.data() + r * C + c * W), a[c]);
                b[c] = at::vec::fmadd(sr, V::loadu(qs.data() + r * E + c * W), b[c]);
              }
            }
            MESHOPS_UNROLL for (int c = 0; c < MV; ++c) {
              a[c].store(dvrows + j * C + c * W);
              b[c].store(dkrows + j * E + c * W);
            }
            dbrow[j] += dbj;
          }
          for (int64_t j = 0; j < KB; ++j) {
            V kk[MV];
            MESHOPS_UNROLL for (int c = 0; c < MV; ++c) kk[c] = V::loadu(krows + j * E + c * W);
            MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
              const V sr(dS[r * KB + j]);
              MESHOPS_UNROLL for (int c = 0; c < MV; ++c)
                dqa[r][c] = at::vec::fmadd(sr, kk[c], dqa[r][c]);
            }
          }
        }
        MESHOPS_UNROLL for (int r = 0; r < QB; ++r) {
          if (r >= nq) continue;
          T* dqr = dq + (bh * Nq + i0 + r) * E;
          MESHOPS_UNROLL for (int c = 0; c < MV; ++c)
            (V::loadu(dqr + c * W) + dqa[r][c]).store(dqr + c * W);
        }
      }
    }
  });
}

template <typename T>
int64_t simd_width() {
  return Vec<T>::size();
}

// Calls run(QB, CV) with compile-time constants for a channel count of CV SIMD
// vectors: QB * CV accumulators stay within the 16 vector registers of AVX2.
template <typename F>
void dispatch_vectors(int64_t vectors, F&& run) {
  using std::integral_constant;
  switch (vectors) {
    case 1: run(integral_constant<int, 4>{}, integral_constant<int, 1>{}); break;
    case 2: run(integral_constant<int, 4>{}, integral_constant<int, 2>{}); break;
    case 4: run(integral_constant<int, 2>{}, integral_constant<int, 4>{}); break;
    case 8: run(integral_constant<int, 1>{}, integral_constant<int, 8>{}); break;
    default:
      TORCH_CHECK(false, "meshops fused attention: ", vectors,
                  " SIMD vectors per head; must be 1, 2, 4 or 8");
  }
}

void check_inputs(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    TORCH_CHECK(t.device().is_cpu(), "meshops fused attention: CPU tensors only");
    TORCH_CHECK(t.is_contiguous(), "meshops fused attention: contiguous tensors only");
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "meshops fused attention: mixed dtypes");
  }
}

}  // namespace

// Returns (out [BH, Nq, C], lse [BH, Nq]).
std::vector<at::Tensor> attention_forward(at::Tensor q, at::Tensor kt, at::Tensor v,
                                          at::Tensor bias) {
  check_inputs({q, kt, v, bias});
  const int64_t BH = q.size(0), Nq = q.size(1), E = q.size(2), nt = kt.size(1),
                KB = kt.size(3), C = v.size(2);
  auto out = at::empty({BH, Nq, C}, q.options());
  auto lse = at::empty({BH, Nq}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "meshops_attention_forward", [&] {
    using T = scalar_t;
    const int64_t W = simd_width<T>();
    TORCH_CHECK(C % W == 0 && KB % (2 * W) == 0, "meshops fused attention: bad padding");
    TORCH_CHECK(kt.size(2) == E && v.size(1) == nt * KB && bias.size(1) == nt * KB,
                "meshops fused attention: inconsistent shapes");
    auto run = [&](auto qb, auto cv) {
      forward_kernel<T, decltype(qb)::value, decltype(cv)::value>(
          q.data_ptr<T>(), kt.data_ptr<T>(), v.data_ptr<T>(), bias.data_ptr<T>(),
          out.data_ptr<T>(), lse.data_ptr<T>(), BH, Nq, nt, KB, E);
    };
    dispatch_vectors(C / W, run);
  });
  return {out, lse};
}

// Returns (dq [BH, Nq, M*W], dk [BH, Nk, M*W], dv [BH, Nk, M*W], db [BH, Nk]).
std::vector<at::Tensor> attention_backward(at::Tensor q, at::Tensor k, at::Tensor kt,
                                           at::Tensor v, at::Tensor vt, at::Tensor bias,
                                           at::Tensor dout, at::Tensor lse, at::Tensor delta) {
  check_inputs({q, k, kt, v, vt, bias, dout, lse, delta});
  const int64_t BH = q.size(0), Nq = q.size(1), M = q.size(2), nt = kt.size(1),
                KB = kt.size(3);
  const int64_t threads = at::get_num_threads();
  // as many key tiles per task as keeps >= 4 tasks per thread (up to 8 tiles)
  const int64_t tiles_per_task =
      std::max<int64_t>(1, std::min<int64_t>(8, BH * nt / (4 * threads)));
  const int64_t dq_slots = tiles_per_task >= nt ? 1 : threads;
  auto dq_threads = at::zeros({dq_slots, BH, Nq, M}, q.options());
  auto dk = at::zeros({BH, nt * KB, M}, q.options());
  auto dv = at::zeros({BH, nt * KB, M}, q.options());
  auto db = at::zeros({BH, nt * KB}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "meshops_attention_backward", [&] {
    using T = scalar_t;
    const int64_t W = simd_width<T>();
    TORCH_CHECK(M % W == 0 && KB % (2 * W) == 0, "meshops fused attention: bad padding");
    TORCH_CHECK(k.size(2) == M && v.size(2) == M && dout.size(2) == M,
                "meshops fused attention: q, k, v, dout must share the padded width");
    auto run = [&](auto qb, auto mv) {
      backward_kernel<T, decltype(qb)::value, decltype(mv)::value>(
          q.data_ptr<T>(), k.data_ptr<T>(), kt.data_ptr<T>(), v.data_ptr<T>(), vt.data_ptr<T>(),
          bias.data_ptr<T>(), dout.data_ptr<T>(), lse.data_ptr<T>(), delta.data_ptr<T>(),
          dq_threads.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), db.data_ptr<T>(), BH,
          Nq, nt, KB, tiles_per_task, dq_slots);
    };
    dispatch_vectors(M / W, run);
  });
  return {dq_slots == 1 ? dq_threads[0] : dq_threads.sum(0), dk, dv, db};
}

int64_t simd_width_float() { return simd_width<float>(); }
int64_t simd_width_double() { return simd_width<double>(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &attention_forward, "fused attention forward (out, lse)");
  m.def("backward", &attention_backward, "fused attention backward (dq, dk, dv, dbias)");
  m.def("simd_width_float", &simd_width_float);
  m.def("simd_width_double", &simd_width_double);
}
