#include "gemm_ceiling.h"

#include "common/eigen.h"  // first: see there

#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace phasor::bench {
namespace {
constexpr int kSize = 512;        // of the square product
constexpr double kSeconds = 0.3;  // timed per thread
}  // namespace

double gemm_ceiling_gflops(int threads) {
  static std::mutex mutex;
  static std::map<int, double> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = measured.find(threads); found != measured.end()) return found->second;
  std::vector<double> rates(static_cast<std::size_t>(threads), 0.0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&rates, t] {
      const Eigen::MatrixXf a = Eigen::MatrixXf::Random(kSize, kSize),
                            b = Eigen::MatrixXf::Random(kSize, kSize);
      Eigen::MatrixXf c(kSize, kSize);
      c.noalias() = a * b;  // warm-up: packing buffers, caches
      const auto start = std::chrono::steady_clock::now();
      std::int64_t products = 0;
      double elapsed = 0;
      do {
        c.noalias() = a * b;
        ++products;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < kSeconds);
      rates[static_cast<std::size_t>(t)] =
          2.0 * kSize * kSize * kSize * static_cast<double>(products) / elapsed / 1e9;
      volatile float sink = c(0, 0);  // the products are used
      (void)sink;
    });
  for (std::thread& t : pool) t.join();
  double total = 0;
  for (double r : rates) total += r;
  measured[threads] = total;
  return total;
}

}  // namespace phasor::bench
