// A reader of the files Python's torch.save writes (zip format, the default since torch 1.6), for
// `phasor op --in`: the saved object — a dict of named tensors — with its tensors, read from any
// bytes with bounds checks everywhere.
//
// phasor reads these files itself rather than through LibTorch's torch::jit::pickle_load, which
// is not safe on untrusted bytes (tests/fuzz/op_inputs_fuzz found each of these in LibTorch
// 1.13): it copies past the end of the input for a malformed zip directory, allocates whatever a
// pickle's length fields and memo indices claim (4 GiB and 30 GB for files of a few hundred
// bytes), gives a storage the byte size the pickle claims over a shorter record (tensors that
// reach past their memory), throws std::out_of_range, corrupts its heap on some malformed pickles
// and leaks on malformed archives.
//
// The format: a zip archive of stored (uncompressed) entries under one folder — <folder>/data.pkl,
// the pickle (protocol 2) of the object; <folder>/data/<key>, the bytes of each storage; and
// <folder>/version. The pickle subset understood is what torch.save writes for dicts, lists and
// tuples of tensors, strings, numbers, booleans and None: tensors are
// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks) over
// persistent storages ('storage', torch.<Type>Storage, key, location, numel).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace phasor::cli {

// A value of the saved object.
struct PtValue {
  enum class Kind : std::uint8_t {
    none,
    boolean,
    integer,
    real,
    string,
    tuple,
    list,
    dict,
    tensor
  };
  Kind kind = Kind::none;
  bool boolean = false;
  std::int64_t integer = 0;
  double real = 0;
  std::string string;
  std::vector<PtValue> items;                        // tuple, list
  std::vector<std::pair<PtValue, PtValue>> entries;  // dict, in order
  at::Tensor tensor;

  // "a dict", "a tensor", … for messages.
  std::string kind_name() const;
};

// `s` for a message: bytes outside printable ASCII as \xNN (a NUL would cut the message short).
std::string printable(const std::string& s);

// The object saved in `bytes`. Anything that is not such a file, or outside the subset above,
// raises std::runtime_error saying what and where ("entry 'archive/data/0': CRC-32 mismatch",
// "pickle byte 57: unsupported opcode 0x63 (GLOBAL os.system)"); memory use is bounded by a small
// multiple of the file's size whatever it claims.
PtValue read_pt_file(const std::vector<char>& bytes);

}  // namespace phasor::cli
