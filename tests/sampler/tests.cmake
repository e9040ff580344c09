# Sampler: parameters, greedy, the generator, sampled distributions
# (chi-squared with fixed seeds), penalties and logprobs.
cairn_add_test(test_sampler
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c
  LABELS sampler
  TIMEOUT 120)

# Batched sampling (model/sample_batch.c): the fallback equals per-row
# cairn_sampler_sample bit for bit; a device slot is handed the exact state.
cairn_add_test(test_sample_batch
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sample_batch.c
  LABELS sampler
  TIMEOUT 120)
