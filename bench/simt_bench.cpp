// The emulated GPU's costs.
//  BM_FiberSwitch             one switch between two Boost.Context fibers, as the emulator is built
//                             (fcontext by default, ucontext with -DPHASOR_EMULATOR_UCONTEXT=ON)
//  BM_FcontextJump            one raw jump_fcontext (the assembly switch under Boost's fcontext)
//  BM_UcontextSwap            one raw swapcontext (what Boost's ucontext build calls; glibc's
//                             saves and restores the signal mask with a system call each time)
//  BM_EmulatedSyncthreads     one syncthreads of one thread, in a block of `threads`
//  BM_EmulatedShuffle         one shfl_xor_sync of one thread
//  BM_EmulatedScan, BM_CpuScan  a representative kernel: the block scan with a prefix callback over
//                             tiles (tests/simt_kernels.cu) against std::partial_sum, per item;
//                             checks:1 with the emulator's checks, checks:0 without
// items_per_second is switches, thread-barriers, thread-shuffles or scanned items per second.
#include <benchmark/benchmark.h>
#include <ucontext.h>

#include <boost/context/detail/fcontext.hpp>
#include <boost/context/fiber.hpp>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "phasor/emulator.h"
#include "simt_kernels.h"

namespace {

namespace emu = phasor::emulated::simt_test;

void BM_FiberSwitch(benchmark::State& state) {
  namespace ctx = boost::context;
  bool stop = false;
  ctx::fiber other([&](ctx::fiber&& back) {
    while (!stop) back = std::move(back).resume();
    return std::move(back);
  });
  for (auto _ : state) other = std::move(other).resume();  // there and back: two switches
  stop = true;
  other = std::move(other).resume();
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_FiberSwitch);

void BM_FcontextJump(benchmark::State& state) {
  namespace detail = boost::context::detail;
  std::vector<char> stack(64 * 1024);
  auto entry = [](detail::transfer_t from) {
    for (;;) from = detail::jump_fcontext(from.fctx, nullptr);
  };
  detail::fcontext_t other =
      detail::make_fcontext(stack.data() + stack.size(), stack.size(), entry);
  for (auto _ : state) other = detail::jump_fcontext(other, nullptr).fctx;
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_FcontextJump);

ucontext_t g_main_context, g_other_context;
void ucontext_entry() {
  for (;;) swapcontext(&g_other_context, &g_main_context);
}
void BM_UcontextSwap(benchmark::State& state) {
  std::vector<char> stack(64 * 1024);
  getcontext(&g_other_context);
  g_other_context.uc_stack.ss_sp = stack.data();
  g_other_context.uc_stack.ss_size = stack.size();
  g_other_context.uc_link = nullptr;
  makecontext(&g_other_context, ucontext_entry, 0);
  for (auto _ : state) swapcontext(&g_main_context, &g_other_context);
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_UcontextSwap);

void BM_EmulatedSyncthreads(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0)), iterations = 64;
  std::vector<int> out(threads);
  for (auto _ : state) emu::barrier_loop(out.data(), threads, iterations);
  state.SetItemsProcessed(state.iterations() * threads * iterations);
}
BENCHMARK(BM_EmulatedSyncthreads)->ArgName("threads")->Arg(32)->Arg(256)->Arg(1024);

void BM_EmulatedShuffle(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0)), iterations = 64;
  std::vector<int> out(threads);
  for (auto _ : state) emu::shuffle_loop(out.data(), threads, iterations);
  state.SetItemsProcessed(state.iterations() * threads * iterations);
}
BENCHMARK(BM_EmulatedShuffle)->ArgName("threads")->Arg(32)->Arg(256)->Arg(1024);

std::vector<int> scan_input(std::int64_t n) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  std::vector<int> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = dist(rng);
  return x;
}

void BM_EmulatedScan(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  phasor::emulator::Options options;
  const bool checks = state.range(1) != 0;
  options.check_races = options.check_uninitialized_shared = options.check_bounds = checks;
  phasor::emulator::ScopedOptions scoped(options);
  const std::vector<int> x = scan_input(n);
  std::vector<int> inclusive(x.size()), exclusive(x.size());
  for (auto _ : state) {
    emu::scan_tiles(x.data(), inclusive.data(), exclusive.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(inclusive.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
// T: items (a multiple of the 512-item tile); the smoke run (scripts/test.sh) picks T:1024.
BENCHMARK(BM_EmulatedScan)->ArgNames({"T", "checks"})->ArgsProduct({{1024, 16384}, {1, 0}});

void BM_CpuScan(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const std::vector<int> x = scan_input(n);
  std::vector<int> inclusive(x.size()), exclusive(x.size());
  for (auto _ : state) {
    // The kernel's two scans: inclusive, then exclusive (the inclusive one shifted).
    std::partial_sum(x.begin(), x.end(), inclusive.begin());
    exclusive[0] = 0;
    std::copy(inclusive.begin(), inclusive.end() - 1, exclusive.begin() + 1);
    benchmark::DoNotOptimize(inclusive.data());
    benchmark::DoNotOptimize(exclusive.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_CpuScan)->ArgName("T")->Arg(1024)->Arg(16384);

}  // namespace

BENCHMARK_MAIN();
