// phasor_testing's GoogleTest adapters for the GPU suites (as ggml's test-backend-ops checks every
// backend against the CPU): the devices to test, and the tolerance rules of the CPU-vs-GPU
// comparisons, with a record of the worst errors measured.
//
// Every CUDA kernel is tested on Device::emulated (always) and on Device::cuda (when the machine
// has a GPU; otherwise GoogleTest reports those instances as SKIPPED, never as passed).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasor/device.h"
#include "phasor/emulator.h"
#include "phasor/testing/device.h"
#include "phasor/testing/gtest.h"

namespace phasor::testing {

// The devices the CUDA kernels are tested on.
std::vector<Device> gpu_devices();
std::string device_param_name(const ::testing::TestParamInfo<Device>& info);
// The dtypes the GPU kernels are tested with.
std::vector<DType> gpu_test_dtypes();

// Skips (GTEST_SKIP) a test instance for Device::cuda on a machine without a GPU.
#define PHASOR_SKIP_WITHOUT_GPU(device)                                                     \
  do {                                                                                      \
    if ((device) == ::phasor::Device::cuda && ::phasor::cuda_device_count() == 0)           \
      GTEST_SKIP() << "no CUDA device on this machine: the same kernels are tested on the " \
                      "emulated GPU";                                                       \
  } while (0)

// ---- tolerances and the record of measured errors ----------------------------------------------

// Records the error under "<kernel> <comparison> <dtype>" (e.g. "fused_recurrent_gla dq vs
// reference float32"), keeping the worst per key. Every test binary that records errors prints
// them at exit, one line per key ("[phasor-gpu-error] <key> worst relative RMS <error>"): the
// README's table of CPU-vs-GPU errors is built from these lines.
void record_error(const std::string& key, double error);

// The tolerance of a GPU result against the float64 reference by dtype: float64 ≤ 1e-12 (the
// algorithm is exact), float32 ≤ 1e-5 (the CPU kernels' bound). 16-bit dtypes have no fixed
// bound: use expect_as_accurate_as_cpu.
double reference_tolerance(DType dtype);
// The unit roundoff of a 16-bit type: 2^−8 for bfloat16 (8 significant bits), 2^−11 for float16.
double unit_roundoff(DType dtype);

// `gpu` against the float64 reference `reference`, within reference_tolerance(dtype); records
// the error under `key`.
void expect_close_to_reference(const Tensor& gpu, const Tensor& reference, DType dtype,
                               const std::string& key);

// 16-bit inputs: the CPU kernel and the GPU kernel were fed the same rounded inputs, and
// `reference` is the float64 reference on those inputs. The GPU must be as accurate as the CPU:
// its relative RMS error at most twice the CPU kernel's own, plus 1e-6 (when the CPU's error is
// tiny). Records both errors under `key`.
void expect_as_accurate_as_cpu(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                               DType dtype, const std::string& key);

// 16-bit inputs through a tensor-core kernel, which rounds every operand of its matrix products to
// the 16-bit type (as fla's kernels do), where the CPU kernel computes in float32: the GPU's error
// against the reference (on the same rounded inputs) may exceed twice the CPU kernel's by twice
// the unit roundoff of the type — an output passes through up to two rounded products in series
// (e.g. a chunk's state, then the output computed from it; measured: ≤ 1.9 unit roundoffs). This
// matters for outputs stored in float32 (final states, dh0), whose CPU error is ~1e-7; a 16-bit
// output's own rounding dominates both kernels. Algorithmic errors are caught at float32 and
// float64, where the same kernels use exact FMA tiles. Records both errors.
// `roundoffs`: the allowance in unit roundoffs (2 by default; more for outputs whose terms cancel,
// stated where a test asks for it).
void expect_tensor_core_accuracy(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                                 DType dtype, const std::string& key, double roundoffs = 2);

// How a GPU kernel computes on 16-bit inputs: float32 FMA as the CPU kernel does, or tensor-core
// products of 16-bit operands (with an allowance of `roundoffs` unit roundoffs).
struct GpuArithmetic {
  bool tensor_cores = false;
  double roundoffs = 2;
  // Outputs whose terms cancel, with the allowance (in unit roundoffs) each gets instead.
  std::vector<std::pair<std::string, double>> cancelling = {};
};

// A GPU result against the CPU kernel's and the float64 reference's, all three computed from the
// same inputs rounded to `dtype`: float64 and float32 within reference_tolerance(dtype) of both;
// 16-bit inputs by expect_tensor_core_accuracy or expect_as_accurate_as_cpu. Records the errors
// under `key` ("<kernel> <output>").
void expect_gpu_result(const Tensor& gpu, const Tensor& cpu, const Tensor& reference, DType dtype,
                       const std::string& key, const GpuArithmetic& arithmetic = {});
// expect_gpu_result field by field, for every field the reference defines (the three lists name
// the same fields in the same order), under the key "<kernel> <field>".
void expect_gpu_results(const NamedTensors& gpu, const NamedTensors& cpu,
                        const NamedTensors& reference, DType dtype, const std::string& kernel,
                        const GpuArithmetic& arithmetic = {});

// ---- schedules of the emulated GPU --------------------------------------------------------------

// The orders of threads and blocks (emulator::parse_schedule syntax) that a kernel must give the
// same bits under: forward, reversed, and seeded random.
inline const std::vector<std::string> kSchedules = {"forward", "reverse",
                                                    "threads=random:3,blocks=random:4"};

// The named tensors of a result: its fields() (a struct of outputs), or the tensors themselves.
template <class Result>
NamedTensors fields_of(const Result& result) {
  return result.fields();
}
NamedTensors fields_of(const Tensor& result);
NamedTensors fields_of(const std::vector<Tensor>& result);

// Runs `run` under each schedule (on top of the current emulator options; the first is the
// baseline) and expects every result bit-identical to the first, field by field. The schedules
// exist on the emulated GPU only: on another device `run` runs twice (run-to-run determinism).
template <class Run>
void expect_bit_identical_under_schedules(Device device, const std::vector<std::string>& schedules,
                                          Run&& run) {
  using Result = std::decay_t<decltype(run())>;
  std::vector<Result> results;
  for (std::size_t i = 0; i < schedules.size(); ++i) {
    if (device != Device::emulated && i == 2) break;
    SCOPED_TRACE(schedules[i]);
    emulator::ScopedOptions options(emulator::parse_schedule(schedules[i], emulator::options()));
    results.push_back(run());
  }
  for (std::size_t i = 1; i < results.size(); ++i)
    expect_bit_equal(fields_of(results[i]), fields_of(results[0]),
                     "under schedule " + schedules[i] + " on " + to_string(device));
}

}  // namespace phasor::testing
