# EAGLE-3 heads: a checkpoint in the published layout (written by
# tests/eagle3/eagle3_fixture.py with numpy), converted by tools/eagle_convert.py,
# computes what numpy computes from the checkpoint over the target's states.
cairn_add_test(eagle3_heads
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_eagle3.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${PROJECT_SOURCE_DIR}/tests/ref
       ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_BINARY_DIR}/eagle3
  LABELS eagle
  TIMEOUT 300)

# Speculative decoding with an EAGLE-3 head through model/spec.c: lossless
# greedy and sampled decoding, its KV a layer of its own in the pages.
cairn_add_test(eagle3_speculative
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_spec_eagle3.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${PROJECT_SOURCE_DIR}/tests/ref
       ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_BINARY_DIR}/eagle3-spec
       ${PROJECT_SOURCE_DIR}/models
  LABELS eagle
  TIMEOUT 600) # a hang guard: the two sampled-distribution checks dominate
