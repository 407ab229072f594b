#include "phasor/testing/gpu_gtest.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

namespace phasor::testing {
namespace {

// The worst relative RMS errors measured by the GPU tests, per (kernel, comparison, dtype).
class ErrorRecord {
 public:
  static ErrorRecord& instance() {
    static ErrorRecord record;
    return record;
  }
  void add(const std::string& key, double error) {
    std::lock_guard<std::mutex> lock(mutex_);
    double& worst = worst_[key];
    worst = std::max(worst, error);
  }
  void print() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, error] : worst_)
      std::printf("[phasor-gpu-error] %s worst relative RMS %.3e\n", key.c_str(), error);
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, double> worst_;
};

// Prints the record when the tests of a binary have run.
struct ErrorRecordPrinter : ::testing::Environment {
  void TearDown() override { ErrorRecord::instance().print(); }
};
// Registered once per test binary that links this file (record_error, below, pulls it in).
::testing::Environment* const error_record_printer =
    ::testing::AddGlobalTestEnvironment(new ErrorRecordPrinter);

}  // namespace

std::vector<Device> gpu_devices() {
  return {Device::emulated, Device::cuda};
}

std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return to_string(info.param);
}

std::vector<DType> gpu_test_dtypes() {
  return {DType::float64, DType::float32, DType::bfloat16, DType::float16};
}

void record_error(const std::string& key, double error) {
  ErrorRecord::instance().add(key, error);
}

double reference_tolerance(DType dtype) {
  return dtype == DType::float64 ? 1e-12 : 1e-5;
}

double unit_roundoff(DType dtype) {
  return dtype == DType::bfloat16 ? 0x1p-8 : 0x1p-11;
}

void expect_close_to_reference(const Tensor& gpu, const Tensor& reference, DType dtype,
                               const std::string& key) {
  const double error = rel_rms(gpu, reference);
  record_error(key + " vs reference " + to_string(dtype), error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(error, reference_tolerance(dtype))
      << key << " (" << to_string(dtype) << "): relative RMS error against the reference";
}

void expect_as_accurate_as_cpu(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                               DType dtype, const std::string& key) {
  const double gpu_error = rel_rms(gpu, reference), cpu_error = rel_rms(cpu, reference);
  record_error(key + " vs reference " + to_string(dtype), gpu_error);
  record_error(key + " (cpu kernel) vs reference " + to_string(dtype), cpu_error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(gpu_error, 2 * cpu_error + 1e-6)
      << key << " (" << to_string(dtype) << "): GPU relative RMS error " << gpu_error
      << " against the CPU kernel's " << cpu_error;
}

void expect_tensor_core_accuracy(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                                 DType dtype, const std::string& key, double roundoffs) {
  const double gpu_error = rel_rms(gpu, reference), cpu_error = rel_rms(cpu, reference);
  record_error(key + " vs reference " + to_string(dtype), gpu_error);
  record_error(key + " (cpu kernel) vs reference " + to_string(dtype), cpu_error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(gpu_error, 2 * cpu_error + roundoffs * unit_roundoff(dtype))
      << key << " (" << to_string(dtype) << "): GPU relative RMS error " << gpu_error
      << " against the CPU kernel's " << cpu_error << " + " << roundoffs << " unit roundoffs of "
      << unit_roundoff(dtype);
}

void expect_gpu_result(const Tensor& gpu, const Tensor& cpu, const Tensor& reference, DType dtype,
                       const std::string& key, const GpuArithmetic& arithmetic) {
  if (dtype == DType::float64 || dtype == DType::float32) {
    expect_close_to_reference(gpu, reference, dtype, key);
    const double error = rel_rms(gpu, cpu);
    record_error(key + " vs cpu kernel " + to_string(dtype), error);
    EXPECT_LE(error, reference_tolerance(dtype)) << key << " against the CPU kernel";
  } else if (arithmetic.tensor_cores) {
    expect_tensor_core_accuracy(gpu, cpu, reference, dtype, key, arithmetic.roundoffs);
  } else {
    expect_as_accurate_as_cpu(gpu, cpu, reference, dtype, key);
  }
}

NamedTensors fields_of(const Tensor& result) {
  return {{"result", &result}};
}

NamedTensors fields_of(const std::vector<Tensor>& result) {
  NamedTensors fields;
  for (std::size_t i = 0; i < result.size(); ++i)
    fields.emplace_back("output " + std::to_string(i), &result[i]);
  return fields;
}

void expect_gpu_results(const NamedTensors& gpu, const NamedTensors& cpu,
                        const NamedTensors& reference, DType dtype, const std::string& kernel,
                        const GpuArithmetic& arithmetic) {
  ASSERT_EQ(gpu.size(), reference.size()) << kernel;
  ASSERT_EQ(cpu.size(), reference.size()) << kernel;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const std::string& name = reference[i].first;
    ASSERT_EQ(gpu[i].first, name) << kernel;
    ASSERT_EQ(cpu[i].first, name) << kernel;
    if (!reference[i].second->defined()) continue;
    GpuArithmetic rule = arithmetic;
    for (const auto& [field, roundoffs] : arithmetic.cancelling)
      if (field == name) rule.roundoffs = roundoffs;
    expect_gpu_result(*gpu[i].second, *cpu[i].second, *reference[i].second, dtype,
                      kernel + " " + name, rule);
  }
}

}  // namespace phasor::testing
