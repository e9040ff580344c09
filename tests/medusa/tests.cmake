# Medusa heads: checkpoints in the published layout (written by
# tests/medusa/medusa_fixture.py with numpy), converted by tools/eagle_convert.py,
# give the published forward's logits; draft trees are the best paths.
cairn_add_test(medusa_heads
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_medusa.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${CMAKE_CURRENT_LIST_DIR}
       ${CMAKE_CURRENT_BINARY_DIR}/medusa
  LABELS medusa
  TIMEOUT 300)
