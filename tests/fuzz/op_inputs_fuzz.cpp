// Fuzz target: the input reader of `phasor op` (src/cli/op_inputs.h): the bytes of a torch.save
// file → the dict of named tensors (torch::pickle_load, then phasor's checks of its keys and
// tensors) → the op's forward and, with `do`, backward pass through the LibTorch layer.
//
// Input layout: byte 0 picks the op (gla, gated_delta_rule, forgetting_attn) and the
// implementation, byte 1 the flags (output_final_state, use_qk_l2norm, interleaved rotary layout,
// a scale, a window, the chunk size, and bit 7: forge the entries' CRC-32s, so that mutated
// entries reach the pickle and tensor checks instead of failing the zip's checksum); the rest is
// the file. The seed corpus holds files written by Python's torch.save behind such two bytes
// (tests/fuzz/make_op_inputs_corpus.py).
//
// Every input must end in results or a clear error — InputError (phasor op's own checks),
// c10::Error (LibTorch's unpickler, the LibTorch layer's argument checks) or phasor::Error (the
// core) with a message — never another exception, a crash or a sanitizer report. A file claiming
// a huge tensor (a storage or a shape of 10^12 elements) must be refused before anything that
// large is allocated (libFuzzer's -malloc_limit_mb, by default -rss_limit_mb, reports any single
// allocation above it).
#include <ATen/Parallel.h>

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/op_inputs.h"

namespace {

std::uint64_t little_endian(const std::vector<char>& b, std::size_t at, int width) {
  std::uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i)
    v = v << 8 | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

// Best effort, as a forger would: every central-directory entry's CRC-32 set to that of the bytes
// its local header points at.
void forge_crcs(std::vector<char>& b) {
  for (std::size_t at = 0; at + 46 <= b.size(); ++at) {
    if (std::memcmp(&b[at], "PK\1\2", 4) != 0) continue;
    const std::uint64_t size = little_endian(b, at + 24, 4), local = little_endian(b, at + 42, 4);
    if (local > b.size() || b.size() - local < 30) continue;
    const std::uint64_t data =
        local + 30 + little_endian(b, local + 26, 2) + little_endian(b, local + 28, 2);
    if (data > b.size() || b.size() - data < size) continue;
    const uLong crc =
        crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(b.data() + data), size);
    for (int i = 0; i < 4; ++i) b[at + 16 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  }
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "op_inputs_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// phasor's errors (InputError, phasor::Error) say what was expected; LibTorch's say something.
void check_message(const char* kind, const std::string& what, bool phasor_form) {
  if (phasor_form ? what.find("expected") == std::string::npos : what.empty())
    finding(std::string("a ") + kind + " that does not say what was expected: '" + what + "'");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  phasor::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace phasor::cli;
  if (size < 2) return 0;
  static constexpr phasor::Op kOps[] = {phasor::Op::gla, phasor::Op::gated_delta_rule,
                                        phasor::Op::forgetting_attn};
  const phasor::Op op = kOps[data[0] % 3];
  OpSettings settings;
  settings.impl = static_cast<phasor::Impl>(data[0] / 3 % 3);
  const std::uint8_t flags = data[1];
  settings.output_final_state = (flags & 1) && op != phasor::Op::forgetting_attn;
  settings.use_qk_l2norm = (flags & 2) && op == phasor::Op::gated_delta_rule;
  settings.rotary_layout =
      (flags & 4) ? phasor::RotaryLayout::interleaved : phasor::RotaryLayout::half_split;
  if (flags & 8) settings.scale = 0.25;
  if ((flags & 16) && op == phasor::Op::forgetting_attn) settings.window_size = 2;
  settings.chunk_size = (flags & 32) ? 2 : (flags & 64) ? 16 : 64;
  std::vector<char> bytes(data + 2, data + size);
  if (flags & 128) forge_crcs(bytes);
  try {
    const auto outputs = run_on_inputs(op, settings, read_inputs(bytes, op, "fuzz.pt"), "fuzz.pt");
    if (outputs.empty() || outputs.front().first != "o") finding("results without 'o'");
  } catch (const InputError& e) {
    check_message("phasor op input error", e.what(), true);
  } catch (const phasor::Error& e) {
    check_message("phasor::Error", e.what(), true);
  } catch (const c10::Error& e) {
    check_message("c10::Error", e.what_without_backtrace(), false);
  } catch (const std::exception& e) {
    finding(std::string("an exception of another type: ") + e.what());
  }
  return 0;
}
