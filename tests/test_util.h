// Test support: an owning host tensor, random inputs, and error measures.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "phasor/common.h"

namespace phasor::testing {

// An owning, contiguous host tensor of any phasor dtype, values accessed as double.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::vector<std::int64_t> shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype) {
    bytes_.assign(static_cast<std::size_t>(numel()) * element_size(dtype_), 0);
  }
  static Tensor zeros(std::vector<std::int64_t> shape, DType dtype = DType::float64) {
    return Tensor(std::move(shape), dtype);
  }
  static Tensor from(const std::vector<std::int64_t>& shape, const std::vector<double>& values,
                     DType dtype = DType::float64) {
    Tensor t(shape, dtype);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, values[static_cast<std::size_t>(i)]);
    return t;
  }
  bool defined() const { return !shape_.empty() || !bytes_.empty(); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
  }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }

  double at(std::int64_t i) const {
    const auto* p = bytes_.data();
    switch (dtype_) {
      case DType::float32:
        return reinterpret_cast<const float*>(p)[i];
      case DType::float64:
        return reinterpret_cast<const double*>(p)[i];
      case DType::int32:
        return reinterpret_cast<const std::int32_t*>(p)[i];
      case DType::int64:
        return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
      case DType::bfloat16:
        return reinterpret_cast<const bfloat16*>(p)[i].to_float();
      case DType::float16:
        return reinterpret_cast<const float16*>(p)[i].to_float();
    }
    return 0;
  }
  void set(std::int64_t i, double v) {
    auto* p = bytes_.data();
    switch (dtype_) {
      case DType::float32:
        reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
        break;
      case DType::float64:
        reinterpret_cast<double*>(p)[i] = v;
        break;
      case DType::int32:
        reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
        break;
      case DType::int64:
        reinterpret_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
        break;
      case DType::bfloat16:  // double → float → bfloat16: two roundings, as torch's .to() does
        reinterpret_cast<bfloat16*>(p)[i] = bfloat16::from_float(static_cast<float>(v));
        break;
      case DType::float16:
        reinterpret_cast<float16*>(p)[i] = float16::from_float(static_cast<float>(v));
        break;
    }
  }
  Tensor to(DType dtype) const {
    Tensor t(shape_, dtype);
    for (std::int64_t i = 0; i < numel(); ++i) t.set(i, at(i));
    return t;
  }
  std::vector<double> values() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = at(i);
    return out;
  }
  void fill(double v) {
    for (std::int64_t i = 0; i < numel(); ++i) set(i, v);
  }
  bool bit_equal(const Tensor& o) const {
    return dtype_ == o.dtype_ && shape_ == o.shape_ && bytes_ == o.bytes_;
  }

  // A contiguous view; an undefined Tensor gives an undefined view.
  TensorView view() const {
    if (!defined()) return {};
    TensorView v;
    v.data = const_cast<unsigned char*>(bytes_.data());
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    std::int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.sizes[static_cast<std::size_t>(d)] = shape_[static_cast<std::size_t>(d)];
      v.strides[static_cast<std::size_t>(d)] = stride;
      stride *= shape_[static_cast<std::size_t>(d)];
    }
    return v;
  }

 private:
  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::float64;
  std::vector<unsigned char> bytes_;
};

inline Tensor randn(const std::vector<std::int64_t>& shape, std::mt19937_64& rng,
                    double stddev = 1.0, DType dtype = DType::float64) {
  Tensor t(shape, dtype);
  std::normal_distribution<double> dist(0.0, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

inline Tensor uniform(const std::vector<std::int64_t>& shape, std::mt19937_64& rng, double lo,
                      double hi, DType dtype = DType::float64) {
  Tensor t(shape, dtype);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

// log(sigmoid(x)) with x ~ N(mean, stddev): realistic log forget gates (≤ 0).
inline Tensor log_sigmoid_gates(const std::vector<std::int64_t>& shape, std::mt19937_64& rng,
                                double mean = 2.0, double stddev = 1.0,
                                DType dtype = DType::float64) {
  Tensor t(shape, dtype);
  std::normal_distribution<double> dist(mean, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double x = dist(rng);
    t.set(i, -std::log1p(std::exp(-x)));
  }
  return t;
}

inline Tensor cu_seqlens(const std::vector<std::int64_t>& lengths, DType dtype = DType::int32) {
  Tensor t({static_cast<std::int64_t>(lengths.size()) + 1}, dtype);
  std::int64_t acc = 0;
  t.set(0, 0);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    acc += lengths[i];
    t.set(static_cast<std::int64_t>(i) + 1, static_cast<double>(acc));
  }
  return t;
}

// sqrt(Σ(a − b)² / Σ b²); 0 when both are exactly zero. b is the trusted value.
inline double rel_rms(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.numel() && i < b.numel(); ++i) {
    const double d = a.at(i) - b.at(i);
    num += d * d;
    den += b.at(i) * b.at(i);
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel() && i < b.numel(); ++i)
    m = std::max(m, std::fabs(a.at(i) - b.at(i)));
  return m;
}

inline bool all_finite(const Tensor& a) {
  for (std::int64_t i = 0; i < a.numel(); ++i)
    if (!std::isfinite(a.at(i))) return false;
  return true;
}

// Σ a·b over all elements.
inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.at(i) * b.at(i);
  return s;
}

// EXPECT that `actual` matches the trusted `expected` to relative RMS ≤ tol, naming the quantity.
#define PHASOR_EXPECT_CLOSE(actual, expected, tol, what)                                      \
  do {                                                                                        \
    const double phasor_err_ = ::phasor::testing::rel_rms((actual), (expected));              \
    EXPECT_TRUE(::phasor::testing::all_finite(actual)) << (what) << " has non-finite values"; \
    EXPECT_LE(phasor_err_, (tol)) << (what) << ": relative RMS error " << phasor_err_;        \
  } while (0)

// Runs `fn` and expects a phasor::Error whose message contains every one of `fragments`.
template <class F>
void expect_error(F&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected a phasor::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* f : fragments)
      EXPECT_NE(what.find(f), std::string::npos) << "message '" << what << "' lacks '" << f << "'";
  }
}

// A copy of `x` at a chosen alignment: on a 64-byte boundary (the recurrent forward then keeps the
// state in it, in place) or one element off it (it keeps an owned copy and stores at the end).
struct AlignedCopy {
  std::vector<unsigned char> storage;
  TensorView view;
  AlignedCopy(const Tensor& x, bool aligned) {
    const std::size_t size = static_cast<std::size_t>(x.numel()) * element_size(x.dtype());
    storage.resize(size + 128);
    auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t offset = (64 - address % 64) % 64 + (aligned ? 0 : element_size(x.dtype()));
    view = x.view();
    view.data = storage.data() + offset;
    std::memcpy(view.data, x.view().data, size);
  }
  Tensor tensor() const {
    Tensor t(std::vector<std::int64_t>(view.sizes.begin(), view.sizes.begin() + view.rank),
             view.dtype);
    std::memcpy(t.view().data, view.data,
                static_cast<std::size_t>(t.numel()) * element_size(t.dtype()));
    return t;
  }
};

// Every tensor of `results` equal, bit for bit, to the first (`label(i)` names result i).
template <class Label>
void expect_all_bit_equal(const std::vector<Tensor>& results, Label&& label) {
  for (std::size_t i = 1; i < results.size(); ++i)
    EXPECT_TRUE(results[i].bit_equal(results[0])) << label(i) << " differs from " << label(0);
}

// The in-place decoding tests' four runs of one dtype and K (aligned or misaligned state buffer,
// final_state aliasing initial_state or separate): outputs and states of run i against run 0.
inline void expect_in_place_runs_bit_equal(const std::vector<Tensor>& outputs,
                                           const std::vector<Tensor>& states, DType dtype,
                                           std::int64_t K) {
  const auto mode = [&](std::size_t i) {
    return std::string(to_string(dtype)) + " K = " + std::to_string(K) +
           (i % 2 == 0 ? " aligned" : " misaligned") + (i < 2 ? " aliased" : " separate");
  };
  expect_all_bit_equal(outputs, [&](std::size_t i) { return "o, " + mode(i); });
  expect_all_bit_equal(states, [&](std::size_t i) { return "state, " + mode(i); });
}

}  // namespace phasor::testing
