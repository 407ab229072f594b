// The collectives the context-parallel ops share (src/distributed/context_parallel_*.cpp): gathers
// and sums over a c10d group, and the header exchange that checks every rank's arguments before
// any work, so that a bad argument on one rank raises an error on every rank instead of leaving
// the others waiting in a collective.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "phasor/distributed.h"

namespace phasor::cp::detail {

// Every rank's copy of `t` (same shape on every rank), in rank order.
std::vector<at::Tensor> allgather(const distributed::ProcessGroupPtr& group, const at::Tensor& t);

// The sum over the ranks, in place; `t` must be contiguous.
void allreduce_sum(const distributed::ProcessGroupPtr& group, at::Tensor& t);

// Every rank sends `fields` (the same count on every rank) and its local error (empty: none);
// returns every rank's fields. When a rank has an error, every rank throws a c10::Error: that rank
// its own message, the others a copy of it prefixed with the rank ("rank r refused its arguments:
// ..."), so that the error names the argument on every rank.
std::vector<std::vector<std::int64_t>> exchange_header(const distributed::ProcessGroupPtr& group,
                                                       const std::vector<std::int64_t>& fields,
                                                       const std::string& error);

// A field of the header that must agree across ranks: its index in `fields`, the argument it
// belongs to and what to call it in the message.
struct AgreedField {
  std::size_t index;
  const char* argument;
  const char* what;
};

// After exchange_header: throws the same c10::Error on every rank when a field differs between
// ranks ("<op>: argument '<argument>': expected the same <what> on every rank, got x on rank 0 and
// y on rank r").
void check_agreement(const std::string& op, const std::vector<std::vector<std::int64_t>>& all,
                     const std::vector<AgreedField>& agreed);

// Header values: an arbitrary 64-bit fingerprint of global cu_seqlens offsets (-1: none), and the
// bits of an optional double (-1: none).
std::int64_t fingerprint(const std::vector<std::int64_t>* offsets);
std::int64_t double_bits(c10::optional<double> x);

// The message of what `f` throws (c10::Error without its backtrace), or empty when it returns.
std::string error_of(const std::function<void()>& f);

}  // namespace phasor::cp::detail
