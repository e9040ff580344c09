# Sampler: parameters, greedy, the generator, sampled distributions
# (chi-squared with fixed seeds), penalties and logprobs.
cairn_add_test(test_sampler
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c
  LABELS sampler
  TIMEOUT 120)
