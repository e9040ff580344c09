# Medusa heads: checkpoints in the published layout (written by
# tests/medusa/medusa_fixture.py with numpy), converted by tools/eagle_convert.py,
# give the published forward's logits; draft trees are the best paths.
cairn_add_test(medusa_heads
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_medusa.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${CMAKE_CURRENT_LIST_DIR}
       ${CMAKE_CURRENT_BINARY_DIR}/medusa
  LABELS medusa
  TIMEOUT 300)
# The .pt checkpoint (torch.save) through the converter is an entry of its
# own, medusa_heads_pt: skipped (77, saying so) where torch is not installed
# (scripts/setup.sh does not install it: PyPI's wheel brings gigabytes of
# CUDA libraries); medusa_heads runs the rest everywhere.
set_property(TEST medusa_heads APPEND PROPERTY ENVIRONMENT "CAIRN_TEST_EXCEPT=test_logits_pt_checkpoint")
add_test(NAME medusa_heads_pt
  COMMAND medusa_heads ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${CMAKE_CURRENT_LIST_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/medusa-pt)
set_tests_properties(medusa_heads_pt PROPERTIES LABELS medusa TIMEOUT 300
  ENVIRONMENT "${CAIRN_TEST_ENV};CAIRN_TEST_ONLY=test_logits_pt_checkpoint")

# Speculative decoding with Medusa heads through model/spec.c: lossless greedy
# and sampled decoding with the shipped heads (which must reach tau > 1.5) and
# with heads converted from the published layout, alone and beside n-grams.
cairn_add_test(medusa_speculative
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_spec_medusa.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools ${CMAKE_CURRENT_LIST_DIR}
       ${PROJECT_SOURCE_DIR}/models/stories260K-medusa.gguf ${CMAKE_CURRENT_BINARY_DIR}/medusa-spec
  LABELS "medusa;eagle"
  TIMEOUT 600) # a hang guard: the two sampled-distribution checks dominate

# --spec medusa:HEADS and --spec eagle3:HEAD in `cairn run`, through the executable.
add_test(NAME medusa_cli
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cli_spec_heads.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/models/stories260K-medusa.gguf
          ${PROJECT_SOURCE_DIR}/tools ${PROJECT_SOURCE_DIR}/tests/ref
          ${CMAKE_CURRENT_BINARY_DIR}/medusa-cli)
set_tests_properties(medusa_cli PROPERTIES TIMEOUT 300 LABELS "medusa;eagle")
