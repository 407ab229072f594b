// The context-parallel ops' shared collectives (src/distributed/collectives.h).
#include "distributed/collectives.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "torch/layer_util.h"

namespace phasor::cp::detail {

std::vector<at::Tensor> allgather(const distributed::ProcessGroupPtr& group, const at::Tensor& t) {
  std::vector<at::Tensor> inputs{t.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group->getSize(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  group->allgather(outputs, inputs)->wait();
  return outputs[0];
}

void allreduce_sum(const distributed::ProcessGroupPtr& group, at::Tensor& t) {
  std::vector<at::Tensor> tensors{t};
  group->allreduce(tensors)->wait();
}

namespace {
constexpr std::int64_t kMessageWords = 96;  // 768 bytes of a rank's error message

}  // namespace

std::vector<std::vector<std::int64_t>> exchange_header(const distributed::ProcessGroupPtr& group,
                                                       const std::vector<std::int64_t>& fields,
                                                       const std::string& error) {
  const auto nf = static_cast<std::int64_t>(fields.size());
  at::Tensor buffer = at::zeros({1 + nf + kMessageWords}, at::kLong);
  auto* p = buffer.data_ptr<std::int64_t>();
  p[0] = error.empty() ? 0 : 1;
  for (std::int64_t i = 0; i < nf; ++i) p[1 + i] = fields[static_cast<std::size_t>(i)];
  std::memcpy(p + 1 + nf, error.data(), std::min<std::size_t>(error.size(), kMessageWords * 8 - 1));
  const auto all = allgather(group, buffer);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto* q = all[r].data_ptr<std::int64_t>();
    if (q[0] != 0) {
      if (!error.empty()) TORCH_CHECK(false, error);
      char text[kMessageWords * 8];
      std::memcpy(text, q + 1 + nf, sizeof(text));
      text[sizeof(text) - 1] = '\0';
      TORCH_CHECK(false, "rank ", r, " refused its arguments: ", text);
    }
    out.emplace_back(q + 1, q + 1 + nf);
  }
  return out;
}

void check_agreement(const std::string& op, const std::vector<std::vector<std::int64_t>>& all,
                     const std::vector<AgreedField>& agreed) {
  for (const auto& f : agreed)
    for (std::size_t r = 1; r < all.size(); ++r)
      if (all[r][f.index] != all[0][f.index])
        torch_detail::fail(op, f.argument, std::string("the same ") + f.what + " on every rank",
                           std::to_string(all[0][f.index]) + " on rank 0 and " +
                               std::to_string(all[r][f.index]) + " on rank " + std::to_string(r));
}

std::int64_t fingerprint(const std::vector<std::int64_t>* offsets) {
  if (!offsets) return -1;
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the offsets
  for (auto x : *offsets) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ULL;
  return static_cast<std::int64_t>(h >> 1);  // ≥ 0: -1 stays "none"
}

std::int64_t double_bits(c10::optional<double> x) {
  if (!x) return -1;
  std::int64_t bits = 0;
  std::memcpy(&bits, &*x, sizeof(bits));
  return bits & 0x7fffffffffffffffLL;  // -1 stays "absent"
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace phasor::cp::detail
