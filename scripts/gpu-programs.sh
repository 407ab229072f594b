# The programs scripts/gpu-check.sh runs on a GPU machine (sourced by it and by
# scripts/gpu-package.sh, which packs them): every GPU test suite, then the chunk benchmarks.
# Paths relative to a build directory.
gpu_test_programs=(simt_test device_test validate_test gla_gpu_test gated_delta_rule_gpu_test
  forgetting_attn_gpu_test favor_gpu_test rotary_gpu_test short_conv_gpu_test)
gpu_bench_programs=(gla_bench gated_delta_rule_bench forgetting_attn_bench)
# The chunk suites, each with the one test that compute-sanitizer's racecheck runs (racecheck takes
# ~80 s for GLA's on an H200: the whole suite does not fit a check's time).
gpu_chunk_suites=(gla_gpu_test gated_delta_rule_gpu_test forgetting_attn_gpu_test)
gpu_racecheck_filter='*ChunkMatchesCpuAndReference/cuda:*ForgettingAttnChunkGpu.MatchesCpuAndReference/cuda'
