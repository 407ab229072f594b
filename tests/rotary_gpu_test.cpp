// The rotary ops' CUDA kernels (cuda/rotary/kernels.cu) against the CPU kernels and the float64
// reference, on every GPU device (Device::emulated always; Device::cuda when the machine has a
// GPU, otherwise SKIPPED): selective_rope_phases (forward and backward, ω per head and shared,
// with and without initial_phase, varlen batches with empty and one-token sequences, sequences
// longer than a tile, more than 32 columns, large increments, T = 65,536), rope_angles (offsets,
// varlen, large positions) and apply_rotary (both layouts, angles up to 10⁴ rad, θ broadcast over
// heads, strided x, in place), in float64, float32, bfloat16 and float16. Tolerances
// (gpu_gtest.h): float64 ≤ 1e-12 and float32 ≤ 1e-5 relative RMS against the reference (and
// float32 within 1e-5 of the CPU kernel); 16-bit inputs: at most twice the CPU kernel's own error
// on the same rounded inputs, + 1e-6. Also: decoding token by token equals the parallel forward,
// bit-identical results under two emulator schedules, and a bad cu_seqlens raises the CPU's message
// and writes nothing.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/rotary.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

// A GPU result against the CPU kernel's and the float64 reference's (all three computed from the
// same inputs, rounded to `dtype`), with the rules of phasor/testing/gpu_gtest.h; records the
// errors.
void compare(const Tensor& gpu, const Tensor& cpu, const Tensor& reference, DType dtype,
             const std::string& key) {
  testing::expect_gpu_result(gpu, cpu, reference, dtype, key);
}

// The schedules of the emulated GPU: reversed and seeded random orders of threads and blocks.
const std::vector<std::string> kSchedules = {"forward", "reverse", "random:1234"};

class RotaryGpu : public ::testing::TestWithParam<Device> {};

// ---------------------------------------------------------------------------------------------
// Selective RoPE phases.

struct PhaseInputs {
  Tensor phi, omega, initial_phase, cu, d_theta, d_final;  // float64 masters
  std::int64_t N = 0;
};

// B rows of T tokens, or (lengths) one packed row; H heads, R pairs.
PhaseInputs make_phases(std::uint64_t seed, std::int64_t B, std::int64_t T, std::int64_t H,
                        std::int64_t R, bool per_head, bool with_initial,
                        const std::vector<std::int64_t>& lengths = {}, double phi_std = 1.0) {
  std::mt19937_64 rng(seed);
  PhaseInputs in;
  const testing::Batch batch = testing::batch_of(B, T, lengths);
  B = batch.B, T = batch.T, in.N = batch.N;
  in.cu = batch.cu_seqlens;
  in.phi = testing::randn({B, T, H, R}, rng, phi_std);
  in.omega = per_head ? Tensor({H, R}, DType::float64) : Tensor({R}, DType::float64);
  std::uniform_real_distribution<double> temp(0.5, 2.0);
  for (std::int64_t i = 0; i < in.omega.numel(); ++i)
    in.omega.set(
        i, std::pow(10000.0, -static_cast<double>(i % R) / static_cast<double>(R)) * temp(rng));
  if (with_initial) in.initial_phase = testing::randn({in.N, H, R}, rng, 3.0);
  in.d_theta = testing::randn({B, T, H, R}, rng);
  in.d_final = testing::randn({in.N, H, R}, rng);
  return in;
}

struct PhaseOutputs {
  Tensor theta, final_phase, d_phi, d_omega, d_initial_phase;
  std::vector<Tensor> all() const {
    std::vector<Tensor> v = {theta, final_phase, d_phi, d_omega};
    if (d_initial_phase.defined()) v.push_back(d_initial_phase);
    return v;
  }
};

// Forward and backward of `impl` on `device`, inputs rounded to `dtype` (outputs in `dtype`).
PhaseOutputs run_phases(const PhaseInputs& in, DType dtype, Device device, Impl impl) {
  OnDevice on(device);
  const auto& s = in.phi.shape();
  auto input = [&](const Tensor& t) { return on.in(t, dtype); };
  const RotaryPhaseParams params{input(in.phi), input(in.omega), input(in.initial_phase),
                                 on.in(in.cu)};
  const TensorView theta = on.out(s, dtype), final_phase = on.out({in.N, s[2], s[3]}, dtype);
  selective_rope_phases_forward(params, impl, theta, final_phase);
  const TensorView d_phi = on.out(s, dtype), d_omega = on.out(in.omega.shape(), dtype);
  const TensorView d_init =
      in.initial_phase.defined() ? on.out(in.initial_phase.shape(), dtype) : TensorView{};
  selective_rope_phases_backward(params, impl, input(in.d_theta), input(in.d_final),
                                 {d_phi, d_omega, d_init});
  PhaseOutputs r;
  r.theta = on.to_host(theta);
  r.final_phase = on.to_host(final_phase);
  r.d_phi = on.to_host(d_phi);
  r.d_omega = on.to_host(d_omega);
  if (d_init.defined()) r.d_initial_phase = on.to_host(d_init);
  return r;
}

// The float64 reference on the inputs rounded to `dtype`.
PhaseOutputs reference_phases(const PhaseInputs& in, DType dtype) {
  PhaseInputs rounded = in;
  for (Tensor* t :
       {&rounded.phi, &rounded.omega, &rounded.initial_phase, &rounded.d_theta, &rounded.d_final})
    *t = t->rounded_to(dtype);
  return run_phases(rounded, DType::float64, Device::cpu, Impl::reference);
}

void compare_phases(const PhaseOutputs& gpu, const PhaseOutputs& cpu, const PhaseOutputs& ref,
                    DType dtype) {
  compare(gpu.theta, cpu.theta, ref.theta, dtype, "selective_rope_phases theta");
  compare(gpu.final_phase, cpu.final_phase, ref.final_phase, dtype,
          "selective_rope_phases final_phase");
  compare(gpu.d_phi, cpu.d_phi, ref.d_phi, dtype, "selective_rope_phases d_phi");
  compare(gpu.d_omega, cpu.d_omega, ref.d_omega, dtype, "selective_rope_phases d_omega");
  if (ref.d_initial_phase.defined())
    compare(gpu.d_initial_phase, cpu.d_initial_phase, ref.d_initial_phase, dtype,
            "selective_rope_phases d_initial_phase");
}

TEST_P(RotaryGpu, SelectivePhasesMatchCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  struct Case {
    const char* name;
    std::int64_t B, T, H, R;
    bool per_head, with_initial;
    std::vector<std::int64_t> lengths;
    double phi_std;
  };
  // Varlen with empty and one-token sequences and one longer than a 64-token tile; 15 columns
  // (fewer than a warp) and 42 (two column groups); large increments (phases in the hundreds).
  const std::vector<Case> cases = {
      {"varlen_omega_per_head", 1, 0, 3, 5, true, true, {7, 0, 1, 70, 0, 13}, 20.0},
      {"varlen_omega_shared", 1, 0, 3, 5, false, true, {0, 66, 1, 2}, 1.0},
      {"batch_42_columns", 2, 9, 2, 21, true, false, {}, 5.0},
      {"batch_shared_no_initial", 3, 1, 2, 3, false, false, {}, 1.0},
  };
  for (const Case& c : cases) {
    const PhaseInputs in =
        make_phases(7, c.B, c.T, c.H, c.R, c.per_head, c.with_initial, c.lengths, c.phi_std);
    for (DType dtype : testing::gpu_test_dtypes()) {
      SCOPED_TRACE(std::string(c.name) + " " + to_string(dtype));
      const PhaseOutputs ref = reference_phases(in, dtype);
      const PhaseOutputs cpu = run_phases(in, dtype, Device::cpu, Impl::chunk);
      const PhaseOutputs gpu = run_phases(in, dtype, device, Impl::chunk);
      compare_phases(gpu, cpu, ref, dtype);
    }
  }
}

// T = 65,536 in float32 (one head, four pairs: one block, 1,024 tiles): the double running sums on
// the GPU are as accurate as the CPU kernel's.
TEST_P(RotaryGpu, SelectivePhasesLongSequenceFloat32) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  PhaseInputs in = make_phases(5, 1, testing::long_sequence_length(), 1, 4, false, true);
  // Increments with a positive mean, as positions: the phase grows to ~6.5·10⁴.
  for (std::int64_t i = 0; i < in.phi.numel(); ++i) in.phi.set(i, 1.0 + 0.37 * in.phi.at(i));
  const PhaseOutputs ref = reference_phases(in, DType::float32);
  const PhaseOutputs cpu = run_phases(in, DType::float32, Device::cpu, Impl::chunk);
  const PhaseOutputs gpu = run_phases(in, DType::float32, device, Impl::chunk);
  compare_phases(gpu, cpu, ref, DType::float32);
  // The running sum itself, at the last token: as close to the float64 sum as the CPU's.
  EXPECT_LE(std::fabs(gpu.final_phase.at(0) - ref.final_phase.at(0)),
            std::fabs(cpu.final_phase.at(0) - ref.final_phase.at(0)) +
                1e-7 * std::fabs(ref.final_phase.at(0)));
}

// Decoding: T = 1 steps, each starting from the previous step's final phase (updated in place:
// final_phase aliases initial_phase), give the phases of the parallel forward.
TEST_P(RotaryGpu, SelectivePhasesDecodingEqualsParallelForward) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::int64_t B = 2, T = 9, H = 2, R = 3;
  const PhaseInputs in = make_phases(11, B, T, H, R, true, true);
  OnDevice on(device);
  const TensorView phi = on.in(in.phi), omega = on.in(in.omega);
  const TensorView theta = on.out({B, T, H, R}, DType::float64);
  const TensorView final_phase = on.out({B, H, R}, DType::float64);
  selective_rope_phases_forward({phi, omega, on.in(in.initial_phase), {}}, Impl::chunk, theta,
                                final_phase);
  const TensorView state = on.in(in.initial_phase);
  const TensorView stepped = on.out({B, T, H, R}, DType::float64);
  for (std::int64_t t = 0; t < T; ++t) {
    auto step = [&](TensorView v) {  // token t of a [B, T, H, R] view
      v.data = static_cast<double*>(v.data) + t * v.stride(1);
      v.sizes[1] = 1;
      return v;
    };
    selective_rope_phases_forward({step(phi), omega, state, {}}, Impl::recurrent, step(stepped),
                                  state);
  }
  PHASOR_EXPECT_CLOSE(on.to_host(stepped), on.to_host(theta), 1e-14, "decoded theta");
  PHASOR_EXPECT_CLOSE(on.to_host(state), on.to_host(final_phase), 1e-14, "decoded final phase");
}

// ---------------------------------------------------------------------------------------------
// RoPE angles.

TEST_P(RotaryGpu, RopeAnglesMatchCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Tensor cu = testing::cu_seqlens({3, 0, 1, 37, 0, 2});
  struct Case {
    const char* name;
    RopeAnglesParams params;
    const Tensor* cu;
  };
  // 35 pairs (two warps' worth of lanes), positions from 10⁴ (large angles), varlen restarts.
  const std::vector<Case> cases = {
      {"varlen_offset", {1, 43, 70, 500.0, 10000, {}}, &cu},
      {"batch_rows", {3, 6, 8, 10000.0, 2, {}}, nullptr},
      {"one_token", {1, 1, 6, 10.0, 0, {}}, nullptr},
  };
  for (const Case& c : cases)
    for (DType dtype : testing::gpu_test_dtypes()) {
      SCOPED_TRACE(std::string(c.name) + " " + to_string(dtype));
      const std::vector<std::int64_t> shape = {c.params.B, c.params.T, c.params.head_dim / 2};
      RopeAnglesParams host = c.params;
      if (c.cu != nullptr) host.cu_seqlens = c.cu->view();
      Tensor ref = Tensor::nans(shape, DType::float64), cpu = Tensor::nans(shape, dtype);
      rope_angles(host, Impl::reference, ref.view());
      rope_angles(host, Impl::chunk, cpu.view());
      OnDevice on(device);
      RopeAnglesParams params = c.params;
      if (c.cu != nullptr) params.cu_seqlens = on.in(*c.cu);
      const TensorView theta = on.out(shape, dtype);
      rope_angles(params, Impl::chunk, theta);
      compare(on.to_host(theta), cpu, ref, dtype, "rope_angles theta");
    }
}

// ---------------------------------------------------------------------------------------------
// apply_rotary.

struct ApplyOutputs {
  Tensor y, dx, d_theta;
};

// x: [B, T, H, K]; theta: [B, T, H, R], or [B, T, R] broadcast over the H heads by a zero stride;
// x_bhtk: x stored as [B, H, T, K] and viewed as [B, T, H, K].
ApplyOutputs run_apply(const Tensor& x, const Tensor& theta, const Tensor& dy, RotaryLayout layout,
                       DType dtype, Device device, Impl impl, std::int64_t H, bool broadcast,
                       bool x_bhtk) {
  OnDevice on(device);
  const Tensor xr = x.to(dtype), tr = theta.to(dtype), dyr = dy.to(dtype);
  const auto& ds = dy.shape();
  const std::int64_t B = ds[0], T = ds[1], K = ds[3], R = K / 2;
  TensorView xv = on.in(xr);
  if (x_bhtk)
    xv = TensorView::strided(xv.data, dtype, {B, T, H, K}, {H * T * K, K, T * K, 1}, device);
  TensorView tv = on.in(tr);
  if (broadcast) tv = TensorView::strided(tv.data, dtype, {B, T, H, R}, {T * R, R, 0, 1}, device);
  const TensorView y = on.out(ds, dtype), dx = on.out(ds, dtype), dth = on.out({B, T, H, R}, dtype);
  apply_rotary_forward(xv, tv, layout, impl, y);
  apply_rotary_backward(xv, tv, layout, impl, on.in(dyr), dx, dth);
  return {on.to_host(y), on.to_host(dx), on.to_host(dth)};
}

TEST_P(RotaryGpu, ApplyRotaryMatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  struct Case {
    const char* name;
    std::int64_t B, T, H, K;
    bool broadcast, x_bhtk;
  };
  // K = 70: 35 pairs cross a warp of lanes; K = 6 (3 pairs); θ shared by heads; strided x.
  const std::vector<Case> cases = {
      {"k70", 2, 9, 3, 70, false, false},
      {"k6_broadcast_strided", 2, 5, 3, 6, true, true},
      {"one_token", 1, 1, 1, 2, false, false},
  };
  std::mt19937_64 rng(6);
  for (const Case& c : cases) {
    Tensor x = testing::randn({c.B, c.T, c.H, c.K}, rng);
    for (std::int64_t i = 0; i < x.numel(); i += 7) x.set(i, x.at(i) * 1e3);
    const std::vector<std::int64_t> theta_shape =
        c.broadcast ? std::vector<std::int64_t>{c.B, c.T, c.K / 2}
                    : std::vector<std::int64_t>{c.B, c.T, c.H, c.K / 2};
    const Tensor theta = testing::uniform(theta_shape, rng, -1e4, 1e4);  // large angles
    const Tensor dy = testing::randn({c.B, c.T, c.H, c.K}, rng);
    for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved})
      for (DType dtype : testing::gpu_test_dtypes()) {
        SCOPED_TRACE(std::string(c.name) + " " + to_string(layout) + " " + to_string(dtype));
        // The reference on the rounded inputs (x as stored: [B, H, T, K] when x_bhtk).
        const ApplyOutputs ref =
            run_apply(x.to(dtype), theta.to(dtype), dy.to(dtype), layout, DType::float64,
                      Device::cpu, Impl::reference, c.H, c.broadcast, c.x_bhtk);
        const ApplyOutputs cpu = run_apply(x, theta, dy, layout, dtype, Device::cpu, Impl::chunk,
                                           c.H, c.broadcast, c.x_bhtk);
        const ApplyOutputs gpu =
            run_apply(x, theta, dy, layout, dtype, device, Impl::chunk, c.H, c.broadcast, c.x_bhtk);
        compare(gpu.y, cpu.y, ref.y, dtype, "apply_rotary y");
        compare(gpu.dx, cpu.dx, ref.dx, dtype, "apply_rotary dx");
        compare(gpu.d_theta, cpu.d_theta, ref.d_theta, dtype, "apply_rotary d_theta");
      }
  }
}

// Each argument its own dtype: the GPU computes what the CPU kernel computes, in the compute type
// of the main input (float32 for bfloat16 φ / x, float64 for float64 x).
TEST_P(RotaryGpu, MixedDtypes) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const PhaseInputs in = make_phases(9, 1, 0, 2, 5, true, true, {4, 0, 70}, 2.0);
  std::mt19937_64 rng(10);
  const Tensor x = testing::randn({2, 3, 2, 8}, rng),
               theta = testing::randn({2, 3, 2, 4}, rng, 9.0),
               dy = testing::randn({2, 3, 2, 8}, rng);
  for (DType x_dtype : {DType::bfloat16, DType::float64}) {
    SCOPED_TRACE(to_string(x_dtype));
    std::vector<std::vector<Tensor>> results;
    for (Device d : {Device::cpu, device}) {
      OnDevice on(d);
      const RotaryPhaseParams params{on.in(in.phi.to(x_dtype)), on.in(in.omega),
                                     on.in(in.initial_phase.to(DType::float16)), on.in(in.cu)};
      const auto& s = in.phi.shape();
      const TensorView th = on.out(s, DType::float32),
                       fin = on.out({in.N, s[2], s[3]}, DType::float64);
      selective_rope_phases_forward(params, Impl::chunk, th, fin);
      const TensorView d_phi = on.out(s, DType::float32),
                       d_omega = on.out(in.omega.shape(), DType::float32),
                       d_init = on.out({in.N, s[2], s[3]}, DType::float64);
      selective_rope_phases_backward(params, Impl::chunk, on.in(in.d_theta.to(DType::float16)),
                                     on.in(in.d_final.to(DType::float32)),
                                     {d_phi, d_omega, d_init});
      const TensorView xv = on.in(x.to(x_dtype)), tv = on.in(theta.to(DType::float32)),
                       y = on.out(x.shape(), DType::float32),
                       dx = on.out(x.shape(), DType::float64),
                       dth = on.out(theta.shape(), DType::float32);
      apply_rotary_forward(xv, tv, RotaryLayout::interleaved, Impl::chunk, y);
      apply_rotary_backward(xv, tv, RotaryLayout::interleaved, Impl::chunk,
                            on.in(dy.to(DType::bfloat16)), dx, dth);
      results.push_back({on.to_host(th), on.to_host(fin), on.to_host(d_phi), on.to_host(d_omega),
                         on.to_host(d_init), on.to_host(y), on.to_host(dx), on.to_host(dth)});
    }
    for (std::size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(testing::all_finite(results[1][i])) << "output " << i;
      EXPECT_LE(testing::rel_rms(results[1][i], results[0][i]), 1e-6) << "output " << i;
    }
  }
}

// In place (y is x itself): the same result as out of place.
TEST_P(RotaryGpu, ApplyRotaryInPlace) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(8);
  const Tensor x = testing::randn({2, 4, 3, 10}, rng, 1.0, DType::float32);
  const Tensor theta = testing::randn({2, 4, 3, 5}, rng, 3.0, DType::float32);
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    OnDevice on(device);
    const TensorView xv = on.in(x), tv = on.in(theta), y = on.out(x.shape(), DType::float32);
    apply_rotary_forward(xv, tv, layout, Impl::chunk, y);
    apply_rotary_forward(xv, tv, layout, Impl::chunk, xv);
    EXPECT_TRUE(on.to_host(xv).bit_equal(on.to_host(y))) << to_string(layout);
  }
}

// ---------------------------------------------------------------------------------------------
// Schedules and bad inputs.

TEST_P(RotaryGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const PhaseInputs in = make_phases(3, 1, 0, 2, 21, false, true, {0, 70, 1, 9}, 3.0);
  std::mt19937_64 rng(4);
  const Tensor x = testing::randn({2, 5, 3, 70}, rng), theta = testing::randn({2, 5, 3, 35}, rng),
               dy = testing::randn({2, 5, 3, 70}, rng);
  const Tensor cu = testing::cu_seqlens({2, 0, 3});
  testing::expect_bit_identical_under_schedules(device, kSchedules, [&] {
    const PhaseOutputs phases = run_phases(in, DType::float32, device, Impl::chunk);
    const ApplyOutputs applied = run_apply(x, theta, dy, RotaryLayout::interleaved, DType::float32,
                                           device, Impl::chunk, 3, false, false);
    OnDevice on(device);
    const TensorView angles = on.out({1, 5, 4}, DType::float32);
    rope_angles({1, 5, 8, 10000.0, 3, on.in(cu)}, Impl::chunk, angles);
    std::vector<Tensor> all = phases.all();
    for (const Tensor& t : {applied.y, applied.dx, applied.d_theta, on.to_host(angles)})
      all.push_back(t);
    return all;
  });
}

// A bad cu_seqlens: the CPU's message on the device, and no output written.
TEST_P(RotaryGpu, BadCuSeqlensGivesTheCpuErrorAndWritesNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(13);
  const Tensor phi = testing::randn({1, 6, 2, 3}, rng), omega = testing::randn({2, 3}, rng);
  for (const std::vector<double>& offsets :
       {std::vector<double>{0, 2, 5}, std::vector<double>{0, 4, 3, 6}, std::vector<double>{1, 6}}) {
    const Tensor cu =
        Tensor::from({static_cast<std::int64_t>(offsets.size())}, offsets, DType::int64);
    auto message = [](const std::function<void()>& f) {
      try {
        f();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    Tensor theta = Tensor::nans({1, 6, 2, 3}, DType::float64),
           angles = Tensor::nans({1, 6, 2}, DType::float64);
    const std::string cpu_phases = message([&] {
      selective_rope_phases_forward({phi.view(), omega.view(), {}, cu.view()}, Impl::chunk,
                                    theta.view());
    });
    const std::string cpu_angles = message([&] {
      rope_angles({1, 6, 4, 10000.0, 0, cu.view()}, Impl::chunk, angles.view());
    });
    EXPECT_NE(cpu_phases.find("cu_seqlens"), std::string::npos) << cpu_phases;
    OnDevice on(device);
    const TensorView dcu = on.in(cu), dtheta = on.out({1, 6, 2, 3}, DType::float64),
                     dangles = on.out({1, 6, 2}, DType::float64);
    EXPECT_EQ(
        message([&] {
          selective_rope_phases_forward({on.in(phi), on.in(omega), {}, dcu}, Impl::chunk, dtheta);
        }),
        cpu_phases);
    EXPECT_EQ(message([&] {
                rope_angles({1, 6, 4, 10000.0, 0, dcu}, Impl::chunk, dangles);
              }),
              cpu_angles);
    for (const Tensor& out : {on.to_host(dtheta), on.to_host(dangles)})
      for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_TRUE(std::isnan(out.at(i)));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, RotaryGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
