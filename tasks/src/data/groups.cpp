// Permutation groups S2, A3, S3, S5 and the group word-problem generator.
#include <algorithm>
#include <map>
#include <numeric>

#include "data/util.h"

namespace phasor::tasks {

using detail::fail;

const char* to_string(Group group) {
  switch (group) {
    case Group::S2:
      return "S2";
    case Group::A3:
      return "A3";
    case Group::S3:
      return "S3";
    case Group::S5:
      return "S5";
  }
  return "?";
}

Group group_from_string(const std::string& name) {
  for (Group g : {Group::S2, Group::A3, Group::S3, Group::S5})
    if (name == to_string(g)) return g;
  fail("group_from_string", "name", "one of S2, A3, S3, S5", "'" + name + "'");
}

namespace {

// Sign of a permutation: (−1)^(number of inversions).
bool is_even(const std::vector<int>& p) {
  int inversions = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    for (std::size_t j = i + 1; j < p.size(); ++j) inversions += p[i] > p[j] ? 1 : 0;
  return inversions % 2 == 0;
}

}  // namespace

PermutationGroup::PermutationGroup(Group group) : group_(group) {
  degree_ = group == Group::S2 ? 2 : group == Group::S5 ? 5 : 3;
  const bool even_only = group == Group::A3;
  // std::next_permutation visits the permutations in lexicographic order starting from the
  // identity; this fixes the ids (documented in the header).
  std::vector<int> p(static_cast<std::size_t>(degree_));
  std::iota(p.begin(), p.end(), 0);
  do {
    if (!even_only || is_even(p)) elements_.push_back(p);
  } while (std::next_permutation(p.begin(), p.end()));

  std::map<std::vector<int>, std::int64_t> id;
  for (std::size_t i = 0; i < elements_.size(); ++i)
    id.emplace(elements_[i], static_cast<std::int64_t>(i));
  const std::int64_t n = order();
  table_.resize(static_cast<std::size_t>(n * n));
  inverse_.resize(static_cast<std::size_t>(n));
  std::vector<int> ab(static_cast<std::size_t>(degree_));
  for (std::int64_t a = 0; a < n; ++a) {
    const std::vector<int>& pa = element(a);
    for (std::int64_t b = 0; b < n; ++b) {
      const std::vector<int>& pb = element(b);
      // a·b applies a first, then b: (a·b)[i] = b[a[i]].
      for (std::size_t i = 0; i < ab.size(); ++i) ab[i] = pb[static_cast<std::size_t>(pa[i])];
      const std::int64_t c = id.at(ab);  // closure: the product is again an element
      table_[static_cast<std::size_t>(a * n + b)] = c;
      if (c == 0) inverse_[static_cast<std::size_t>(a)] = b;
    }
  }
}

const PermutationGroup& PermutationGroup::get(Group group) {
  // Function-local statics: built once, thread-safe initialisation (C++11).
  static const PermutationGroup s2(Group::S2), a3(Group::A3), s3(Group::S3), s5(Group::S5);
  switch (group) {
    case Group::S2:
      return s2;
    case Group::A3:
      return a3;
    case Group::S3:
      return s3;
    case Group::S5:
      return s5;
  }
  fail("PermutationGroup::get", "group", "S2, A3, S3 or S5",
       std::to_string(static_cast<int>(group)));
}

std::int64_t WordProblemConfig::vocab_size() const {
  return PermutationGroup::get(group).order() + (bos ? 1 : 0);
}

Batch word_problem(const WordProblemConfig& c, std::int64_t batch, std::uint64_t seed) {
  const std::string op = "word_problem";
  detail::check_at_least(op, "seq_len", c.seq_len, 1);
  const PermutationGroup& g = PermutationGroup::get(c.group);
  const std::int64_t T = c.seq_len, cols = c.row_length(), lead = cols - T;
  Batch b = detail::make_batch(op, batch, cols, c.vocab_size(), 0);
  Rng rng(seed);
  for (std::int64_t r = 0; r < batch; ++r) {
    std::int64_t* x = b.inputs.data() + r * cols;
    std::int64_t* y = b.targets.data() + r * cols;
    if (c.bos) x[0] = g.order();  // the BOS id; its target stays −100
    x += lead, y += lead;
    std::int64_t prefix = 0;  // identity
    for (std::int64_t t = 0; t < T; ++t) {
      x[t] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(g.order())));
      prefix = g.multiply(prefix, x[t]);  // y_t = (x_1·…·x_{t−1})·x_t
      if (!c.final_only || t == T - 1) y[t] = prefix;
    }
  }
  return b;
}

Batch parity(std::int64_t seq_len, bool final_only, std::int64_t batch, std::uint64_t seed) {
  WordProblemConfig c;
  c.group = Group::S2;
  c.seq_len = seq_len;
  c.final_only = final_only;
  return word_problem(c, batch, seed);
}

}  // namespace phasor::tasks
