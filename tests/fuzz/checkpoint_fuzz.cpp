// Fuzz target: the checkpoint reader of the task harness (phasor/tasks/train.h):
// verify_checkpoint, checkpoint_tensors, and load_model for the checkpoints that pass and hold a
// small model.
//
// Input layout: byte 0 is the mode, the rest the data.
//   mode even: the data is the whole file, as is — the header's two CRC-32s refuse almost every
//              mutation, so this exercises the header checks (magic, version, lengths, sizes);
//   mode odd:  the data is a payload, written behind a header with its real length and both
//              checksums recomputed — what a forged file looks like — so that mutations reach the
//              bounds-checked entry parser and the checks of the contents (entries, configs,
//              history, the model's parameters and AdamW's state).
// The seed corpus holds checkpoints written by train() (tests/fuzz/make_checkpoint_corpus.sh),
// in both modes.
//
// Every input must end in success or a phasor::Error naming the file and the problem — never
// another exception, a crash, a sanitizer report or an allocation beyond the file's size
// (libFuzzer's -malloc_limit_mb, by default -rss_limit_mb, reports any single allocation above
// it).
#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "phasor/common.h"
#include "phasor/tasks/train.h"

namespace {

std::string g_path;  // the file each input is written to (one per process)

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "checkpoint_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void put_le(std::string& bytes, std::size_t at, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i)
    bytes[at + static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
}

std::uint32_t crc32_of(const char* data, std::size_t size) {
  return static_cast<std::uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data), size));
}

// A format-2 header (train.cpp) for `payload`, with its real length and checksums.
std::string with_header(const std::string& payload) {
  std::string bytes(32, '\0');
  bytes.replace(0, 8, "PHSRCKPT");
  put_le(bytes, 8, 2, 4);
  put_le(bytes, 16, payload.size(), 8);
  put_le(bytes, 24, crc32_of(payload.data(), payload.size()), 4);
  put_le(bytes, 28, crc32_of(bytes.data(), 28), 4);
  return bytes + payload;
}

void check_message(const std::string& what) {
  if (what.find("argument '") == std::string::npos || what.find("expected") == std::string::npos ||
      what.find(g_path) == std::string::npos)
    finding("a phasor::Error that does not name the argument, the expectation and the file: " +
            what);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  phasor::set_num_threads(1);
  g_path = "/tmp/phasor_checkpoint_fuzz." + std::to_string(getpid()) + ".ckpt";
  std::atexit([] { std::remove(g_path.c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  {
    std::ofstream out(g_path, std::ios::binary | std::ios::trunc);
    const std::string bytes = data[0] % 2 ? with_header(rest) : rest;
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) finding("cannot write " + g_path);
  }
  try {
    const phasor::tasks::CheckpointInfo info = phasor::tasks::verify_checkpoint(g_path);
    if (info.step < 0 || info.step > info.train_config.steps)
      finding("a verified checkpoint with step " + std::to_string(info.step) + " of " +
              std::to_string(info.train_config.steps));
    const auto tensors = phasor::tasks::checkpoint_tensors(g_path);
    if (!tensors.count("step")) finding("a verified checkpoint without a 'step' tensor");
    // Loading into the model the checkpoint describes, when that model is small.
    const phasor::tasks::ModelConfig& m = info.model_config;
    if (m.vocab_size * m.hidden_size <= (1 << 14) && m.num_layers <= 2 && m.hidden_size <= 64) {
      torch::manual_seed(0);
      phasor::tasks::LanguageModel model = phasor::tasks::load_model(g_path);
      if (model->config().vocab_size != m.vocab_size)
        finding("load_model built another model than the checkpoint's config");
    }
  } catch (const phasor::Error& e) {
    check_message(e.what());
  } catch (const std::exception& e) {
    finding(std::string("an exception other than phasor::Error: ") + e.what());
  }
  return 0;
}
