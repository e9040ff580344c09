# EAGLE-3 heads: a checkpoint in the published layout (written by
# tests/eagle3/eagle3_fixture.py with numpy), converted by tools/eagle_convert.py,
# computes what numpy computes from the checkpoint over the target's states.
cairn_add_test(eagle3_heads
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_eagle3.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${PROJECT_SOURCE_DIR}/tests/ref
       ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_BINARY_DIR}/eagle3
  LABELS eagle
  TIMEOUT 300)
