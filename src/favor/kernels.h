// Internal: validated problems of the FAVOR+ ops and the kernels that solve them (reference in
// reference.cpp, optimized in kernels.cpp). api.cpp validates every argument before calling.
#pragma once

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "common/element_access.h"
#include "phasor/favor.h"

namespace phasor::detail::favor {

// The shapes shared by both problems: x (or q, k) [B, T, H, d], w [m, d] or [H, m, d].
struct Shape {
  Sequences sequences;
  std::int64_t H = 0, d = 0, m = 0;
  bool w_per_head = false;
  std::int64_t num_sequences() const { return sequences.size(); }
  // Offset of w[h, r, i] (h ignored when w is shared).
  std::int64_t w_offset(const TensorView& w, std::int64_t h, std::int64_t r, std::int64_t i) const {
    return w_per_head ? offset_of(w, h, r, i) : offset_of(w, r, i);
  }
};

struct FeatureProblem {
  Shape shape;
  TensorView x, w;
  FavorStabilizer stabilizer = FavorStabilizer::query;
};

struct AttentionProblem {
  Shape shape;
  TensorView q, k, v, w, cu_seqlens;
  std::int64_t V = 0;
  bool causal = false;
  double input_scale = 1.0;  // s = scale^{1/2}: q̂ = s·q, k̂ = s·k
  std::int64_t chunk_size = 64;
  Impl impl = Impl::chunk;  // the GLA kernel the causal path runs (chunk or recurrent)
};

void random_matrix(FavorMatrixKind kind, std::uint64_t seed, const TensorView& w);

void reference_features_forward(const FeatureProblem& p, const TensorView& phi);
void reference_features_backward(const FeatureProblem& p, const TensorView& d_phi,
                                 const TensorView& dx, const TensorView& dw);
void features_forward(const FeatureProblem& p, const TensorView& phi);
void features_backward(const FeatureProblem& p, const TensorView& d_phi, const TensorView& dx,
                       const TensorView& dw);

void reference_attention_forward(const AttentionProblem& p, const TensorView& o);
void reference_attention_backward(const AttentionProblem& p, const TensorView& d_o,
                                  const FavorAttentionGrads& grads);
void attention_forward(const AttentionProblem& p, const TensorView& o);
void attention_backward(const AttentionProblem& p, const TensorView& d_o,
                        const FavorAttentionGrads& grads);

}  // namespace phasor::detail::favor
