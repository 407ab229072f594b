// phasor::tasks — data generators and metrics of the synthetic-task harness (no LibTorch).
//
// Every generator returns a Batch: `rows` examples of `cols` tokens, row-major, as int64 token ids
// (`inputs`) and int64 targets (`targets`, same shape). targets[r][t] is what the model must
// predict from inputs[r][0..t] (so it is usually the next token, already shifted: no further
// shift is needed), or kIgnoreIndex (−100, as torch.nn.CrossEntropyLoss's ignore_index) where
// there is nothing to learn/score.
//
// Determinism. A generator is a pure function of (config, batch size, seed): it draws from one
// std::mt19937_64 seeded with `seed` (the engine's output sequence is fixed by the C++ standard)
// through the samplers of `Rng` below, which use only its raw 64-bit outputs. The standard
// distributions (std::uniform_int_distribution, std::discrete_distribution, std::shuffle, ...) are
// avoided on purpose: their algorithms are implementation-defined, so they would give different
// data with libstdc++, libc++ and MSVC. Rows are generated one after the other from the same
// stream, so the first n rows of a batch of size m ≥ n equal the batch of size n (same seed).
// (The MQAR gap weights use std::pow; a libm differing in the last ulp could in principle flip a
// draw, nothing else depends on floating point.)
//
// Errors: invalid arguments throw phasor::Error with the message
//   "<generator>: argument '<name>': expected <what>, got <what was given>".
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "phasor/common.h"

namespace phasor::tasks {

// Target value of positions that are not scored (torch's default ignore_index).
inline constexpr std::int64_t kIgnoreIndex = -100;

// `rows` × `cols` token ids and targets, row-major: element (r, t) is at index r * cols + t.
struct Batch {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t vocab_size = 0;  // every input id is in [0, vocab_size); so is every target ≠ −100
  std::vector<std::int64_t> inputs;
  std::vector<std::int64_t> targets;

  std::int64_t input(std::int64_t r, std::int64_t t) const {
    return inputs[static_cast<std::size_t>(r * cols + t)];
  }
  std::int64_t target(std::int64_t r, std::int64_t t) const {
    return targets[static_cast<std::size_t>(r * cols + t)];
  }
};

// ------------------------------------------------------------------------------------------------
// Random numbers: portable samplers on top of std::mt19937_64's raw output.
// ------------------------------------------------------------------------------------------------
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}

  std::uint64_t next() { return engine_(); }  // one raw 64-bit output
  // Uniform integer in [0, n), n ≥ 1: rejection sampling on the raw output (outputs in the
  // incomplete last block of n values are redrawn), so exactly uniform.
  std::uint64_t below(std::uint64_t n);
  // Uniform integer in [lo, hi] (lo ≤ hi).
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi);
  // Uniform double in the open interval (0, 1): (top 53 bits + 1/2) / 2^53.
  double uniform_open01();
  // k distinct elements of `pool` (k ≤ pool.size()), uniformly: the first k steps of a
  // Fisher–Yates shuffle. The result is in draw order (a uniformly random ordered k-subset).
  std::vector<std::int64_t> choice_without_replacement(std::vector<std::int64_t> pool,
                                                       std::int64_t k);
  // k distinct integers of [lo, hi) (k ≤ hi − lo): exactly choice_without_replacement applied to
  // the pool lo, lo+1, …, hi−1 (same draws, same result), in O(k) time and memory (the
  // Fisher–Yates swaps are kept in a map instead of materialising the pool).
  std::vector<std::int64_t> distinct_in_range(std::int64_t lo, std::int64_t hi, std::int64_t k);
  // k distinct indices of [0, weights.size()) drawn without replacement, successively, each with
  // probability proportional to its weight among those not drawn yet (numpy's
  // `choice(replace=False, p=...)` semantics), returned in draw order. Weights must be positive
  // and finite. Implemented as Efraimidis–Spirakis (2006) "A-ES": key_i = log(u_i) / w_i with
  // u_i uniform in (0, 1); the indices sorted by decreasing key are distributed exactly as the
  // successive draws. Ties (probability 0) are broken by the smaller index.
  std::vector<std::int64_t> weighted_without_replacement(const std::vector<double>& weights,
                                                         std::int64_t k);

 private:
  std::mt19937_64 engine_;
};

// ------------------------------------------------------------------------------------------------
// MQAR: multi-query associative recall, with the semantics of Zoology's `multiquery_ar`
// (Arora, Eyuboglu et al. 2023, "Zoology: Measuring and improving recall in efficient language
// models"), num_passes = 1.
// ------------------------------------------------------------------------------------------------
//
// Each row (length L = seq_len, vocabulary V = vocab_size, n = num_kv_pairs):
//   * keys k_1..k_n: n distinct ids drawn uniformly from [1, V/2) (V/2 rounded down; 0 is never a
//     key), values v_1..v_n: n distinct ids drawn uniformly from [V/2, V);
//   * positions 0..2n−1 hold the context k_1 v_1 k_2 v_2 … k_n v_n;
//   * the remaining L − 2n positions hold the queries: with space = (L − 2n)/2, gaps g_1..g_n are
//     n distinct values of {0, …, space−1} drawn without replacement with
//         p(i) ∝ a·(i+1)^(a−1)      (a = power_a; a = 1 is uniform, a → 0 favours small gaps),
//     successively (g_1 ∝ p, g_2 ∝ p over the rest, …), and key k_j is placed at position
//     2n + 2·g_j; its target there is v_j. Every other target is −100;
//   * every other position is filler: 0, or, with random_filler (Zoology's random_non_queries),
//     a token drawn uniformly from [0, V) (so filler may be 0, a key or a value). Zoology does it
//     by replacing every input token equal to 0 by a random one; since keys start at 1 and values
//     at V/2 ≥ 1, that replaces exactly the filler.
// Example (V = 20, n = 2, L = 16, filler 0, seed 2026; keys in [1, 10), values in [10, 20);
// gaps 0 and 2, queries at 4 + 2·gap):
//   position  0    1    2    3    4  5  6   7  8  9  10  11 12 13 14 15
//   inputs    9    11   2    19   0  0  2   0  0  0  9   0  0  0  0  0
//   targets   −100 −100 −100 −100 …  …  19  …  …  …  11  …  …  …  …  …    (… = −100)
// (Zoology's docstring shows a similar row with V = 12, L = 16, which its own assert V > L
// rejects.)
// Zoology builds an (L+1)-long example and shifts (inputs = example[:−1], labels = labels[1:]);
// the result is the same: the target of a query position is the value of its key.
// Valid configurations (Zoology's asserts): L even, V > L, 1 ≤ n, 4n ≤ L (so space ≥ n);
// power_a positive and finite.
// Random draws per row, in this order: keys, values, the `space` A-ES keys of the gaps, then one
// uniform filler token per filler position, left to right (only with random_filler).
struct MqarConfig {
  std::int64_t seq_len = 64;
  std::int64_t num_kv_pairs = 8;
  std::int64_t vocab_size = 8192;
  double power_a = 0.01;
  bool random_filler = true;
};
void validate(const MqarConfig& config);  // throws phasor::Error (op "mqar")
Batch mqar(const MqarConfig& config, std::int64_t batch, std::uint64_t seed);

// ------------------------------------------------------------------------------------------------
// Copying: `$ s | s .` over a 26-letter alphabet.
// ------------------------------------------------------------------------------------------------
// Vocabulary (kCopyVocabSize = 30): letters 'a'..'z' = ids 0..25, then '$' (start), '|'
// (separator), '.' (end), and a pad token. The copy part of an example `$ s | s .` is the second
// s and the final '.'; the targets are the next token at the positions that predict it — from the
// '|' to the last letter of the copy — and −100 everywhere else (the first s cannot be predicted;
// what follows '.' is the next example).
// Example, s = "ab" (letters shown as characters):
//   inputs   $    a    b    |  a  b  .
//   targets  −100 −100 −100 a  b  .  −100
inline constexpr std::int64_t kCopyLetters = 26;
inline constexpr std::int64_t kCopyStart = 26;  // '$'
inline constexpr std::int64_t kCopySep = 27;    // '|'
inline constexpr std::int64_t kCopyEnd = 28;    // '.'
inline constexpr std::int64_t kCopyPad = 29;
inline constexpr std::int64_t kCopyVocabSize = 30;
// "$ab|ab." for an inputs row, '_' for pad; ids outside the vocabulary print as '?'.
std::string copy_to_string(const std::int64_t* tokens, std::int64_t count);

// Training rows: examples with letters uniform over the alphabet and length uniform in
// [min_len, max_len], packed back to back from position 0; when the next drawn example
// (2·len + 3 tokens) does not fit in the rest of the row, it is discarded and the row is filled
// with pad (targets −100). Requires 1 ≤ min_len ≤ max_len and 2·max_len + 3 ≤ context, so every
// row holds at least one example.
// Example, context 16: inputs  $ab|ab.$c|c.____ ; targets on "|ab" → "ab." and on "|c" → "c.".
// Random draws per row: for each example, its length then its letters.
struct CopyTrainConfig {
  std::int64_t context = 256;
  std::int64_t min_len = 1;
  std::int64_t max_len = 50;
};
void validate(const CopyTrainConfig& config);  // throws phasor::Error (op "copy_train")
Batch copy_train(const CopyTrainConfig& config, std::int64_t batch, std::uint64_t seed);

// Evaluation rows: one example `$ s | s .` per row, s of exactly `length` ≥ 1 uniform letters;
// cols = 2·length + 3, no pad. Teacher-forced: run the model on `inputs`, take the argmax at
// every position, and score with copy_metrics.
Batch copy_eval(std::int64_t length, std::int64_t batch, std::uint64_t seed);

// ------------------------------------------------------------------------------------------------
// Group word problems: parity (S2), A3 (≅ Z3), S3, S5.
// ------------------------------------------------------------------------------------------------
// The elements of S_n are the permutations of {0, …, n−1} in one-line notation (p[i] = image of
// i), enumerated in lexicographic order of that notation; their id is their rank (identity
// [0, 1, …, n−1] = 0). A3 is the even permutations of 3 points in the same order: ids
// 0 = [0,1,2], 1 = [1,2,0], 2 = [2,0,1] (a cyclic group of order 3: 1·1 = 2, 1·2 = 0).
// S2: 0 = [0,1], 1 = [1,0] — parity, the product is XOR.
// Product convention: a·b applies a first, then b: (a·b)[i] = b[a[i]].
enum class Group : std::uint8_t { S2, A3, S3, S5 };
const char* to_string(Group group);  // "S2" | "A3" | "S3" | "S5"
Group group_from_string(const std::string& name);

// A finite permutation group with its multiplication table (computed once, on first use).
class PermutationGroup {
 public:
  static const PermutationGroup& get(Group group);

  Group group() const { return group_; }
  int degree() const { return degree_; }  // n of S_n
  std::int64_t order() const { return static_cast<std::int64_t>(elements_.size()); }
  const std::vector<int>& element(std::int64_t id) const {
    return elements_[static_cast<std::size_t>(id)];
  }
  std::int64_t multiply(std::int64_t a, std::int64_t b) const {  // a·b (a first, then b)
    return table_[static_cast<std::size_t>(a * order() + b)];
  }
  std::int64_t inverse(std::int64_t a) const { return inverse_[static_cast<std::size_t>(a)]; }

 private:
  explicit PermutationGroup(Group group);
  Group group_;
  int degree_;
  std::vector<std::vector<int>> elements_;
  std::vector<std::int64_t> table_;
  std::vector<std::int64_t> inverse_;
};

// Rows of `seq_len` tokens x_1..x_T drawn uniformly from the group (ids 0..|G|−1, vocab_size =
// |G|). targets[t] = x_1·x_2·…·x_t (the running product from the identity, left to right);
// with final_only, only the last position has a target (the product of the whole row) and the
// others are −100. Example, S2 (parity): inputs 1 0 1 1 → targets 1 1 0 1 (final_only:
// −100 −100 −100 1). Random draws: one uniform element per token, left to right.
// With bos, every row starts with a BOS token, id |G| (vocab_size |G| + 1), without a target,
// before its seq_len elements: rows of seq_len + 1 tokens whose elements and targets are those
// of the same seed without bos, one position later (S2: BOS 1 0 1 1 → −100 1 1 0 1). The
// Selective RoPE code's tokenizer prepends one; it gives a linear-attention layer a reference
// key at the start of the row.
struct WordProblemConfig {
  Group group = Group::S3;
  std::int64_t seq_len = 64;
  bool final_only = false;
  bool bos = false;
  // The one place the BOS rule lives: a row holds seq_len tokens plus the BOS, and the
  // vocabulary holds the |G| elements plus the BOS id |G|.
  std::int64_t row_length() const { return seq_len + (bos ? 1 : 0); }
  std::int64_t vocab_size() const;
};
Batch word_problem(const WordProblemConfig& config, std::int64_t batch, std::uint64_t seed);
// Parity: word_problem with Group::S2.
Batch parity(std::int64_t seq_len, bool final_only, std::int64_t batch, std::uint64_t seed);

// ------------------------------------------------------------------------------------------------
// Metrics. predictions and targets: `rows` × `cols`, row-major (e.g. the argmax of the logits
// and Batch::targets). Positions whose target is −100 are ignored everywhere. Every other target
// must be ≥ 0. Throws phasor::Error (op "metrics") on a size mismatch or an invalid target.
// ------------------------------------------------------------------------------------------------
struct Metrics {
  std::int64_t scored_tokens = 0;   // positions with a target
  std::int64_t correct_tokens = 0;  // of which predicted correctly
  std::int64_t rows = 0;
  std::int64_t correct_rows = 0;  // rows whose every scored position is correct
  // correct_tokens / scored_tokens (NaN if nothing is scored).
  double token_accuracy = 0.0;
  // correct_rows / rows (a row without scored positions counts as correct; NaN if rows = 0).
  double sequence_accuracy = 0.0;
  // prefix_sequence_accuracy[t]: fraction of rows whose scored positions 0..t are all correct
  // (non-increasing in t; the last entry equals sequence_accuracy). Size cols.
  std::vector<double> prefix_sequence_accuracy;
};
Metrics evaluate(const std::int64_t* predictions, const std::int64_t* targets, std::int64_t rows,
                 std::int64_t cols);
Metrics evaluate(const std::vector<std::int64_t>& predictions,
                 const std::vector<std::int64_t>& targets, std::int64_t rows, std::int64_t cols);
double token_accuracy(const std::vector<std::int64_t>& predictions,
                      const std::vector<std::int64_t>& targets, std::int64_t rows,
                      std::int64_t cols);
double sequence_accuracy(const std::vector<std::int64_t>& predictions,
                         const std::vector<std::int64_t>& targets, std::int64_t rows,
                         std::int64_t cols);
std::vector<double> cumulative_sequence_accuracy(const std::vector<std::int64_t>& predictions,
                                                 const std::vector<std::int64_t>& targets,
                                                 std::int64_t rows, std::int64_t cols);

// The longest prefix of positions that at least half of the rows get entirely right: the number
// of leading entries t of a prefix_sequence_accuracy curve with value ≥ 0.5 (the curve does not
// increase, so counting stops at the first entry below 0.5; NaN counts as below). For a row,
// let F be the position of its first wrong scored prediction (its length if it has none): the
// result is the largest m with F ≥ m for at least half of the rows, F's median. It tells how far
// a model carries a task's state when hardly any row is right to its end (a parity model that
// tracks 20 of 128 tokens and one that tracks 2 both have sequence accuracy 0). Positions, not
// scored tokens: where only some positions are scored (MQAR's queries), the unscored ones between
// count too.
std::int64_t correct_prefix_length(const std::vector<double>& prefix_sequence_accuracy);

// Copying scores of teacher-forced predictions (copy_eval or copy_train rows):
//   exact_match     fraction of rows whose every scored position is correct — the copied
//                   string and its terminating '.' (a row is "s." exactly);
//   char_accuracy   fraction of the scored letter positions (targets in 0..25, i.e. excluding
//                   the '.') predicted correctly.
struct CopyMetrics {
  double exact_match = 0.0;
  double char_accuracy = 0.0;
};
CopyMetrics copy_metrics(const std::int64_t* predictions, const std::int64_t* targets,
                         std::int64_t rows, std::int64_t cols);
CopyMetrics copy_metrics(const std::vector<std::int64_t>& predictions,
                         const std::vector<std::int64_t>& targets, std::int64_t rows,
                         std::int64_t cols);

}  // namespace phasor::tasks
