// Context parallelism: one sequence split across the ranks of a c10d process group, each rank
// holding a contiguous slice of the tokens (rank r the r-th slice; slices may differ in length,
// and may be empty). Every function is the phasor/torch.h op of the same name with one more
// argument, the group, and gives each rank the outputs of its own slice — equal to the slice of
// the single-process result — with autograd through the communication (backward included).
//
//   #include <phasor/context_parallel.h>  // CMake: target_link_libraries(app PRIVATE
//   phasor::distributed) auto group = phasor::distributed::init_process_group(); auto [o,
//   final_state] = phasor::cp::chunk_gla(q_slice, k_slice, v_slice, g_slice, group);
//
// Every collective is c10d's, on the group given (Gloo on CPUs).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "phasor/distributed.h"
#include "phasor/torch.h"

namespace phasor::cp {

// ---- GLA, Gated DeltaNet and Selective RoPE phases ----------------------------------------------

// ---- Forgetting attention (FoX) -----------------------------------------------------------------

}  // namespace phasor::cp
