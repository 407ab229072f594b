// The context-parallel ops' shared collectives (src/distributed/collectives.h).
#include "distributed/collectives.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

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
