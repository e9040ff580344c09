# EAGLE speculative decoding: lossless greedy and sampled decoding, tree-mask
# verification. Generates a synthetic model and random heads with numpy + gguf
# (tools/gen_synthetic_model.py, tools/eagle_convert.py); torch is not needed.
cairn_add_test(eagle_speculative
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_eagle.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools
       ${PROJECT_SOURCE_DIR}/models/stories260K-eagle.gguf ${CMAKE_CURRENT_BINARY_DIR}
  LABELS eagle
  TIMEOUT 1500) # a hang guard: the sampled-distribution checks of every method take ~7 min under ASan on a 2-core AVX2 machine

# --draft in `cairn run` and `cairn bench`, through the executable.
add_test(NAME eagle_cli
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cli_draft.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/models/stories260K-eagle.gguf)
set_tests_properties(eagle_cli PROPERTIES TIMEOUT 300 LABELS eagle)

# tools/eagle_convert.py on a published-style (Hugging Face names, safetensors) head.
add_test(NAME eagle_convert
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_convert.py ${PROJECT_SOURCE_DIR}/tools
          ${PROJECT_SOURCE_DIR}/models/stories260K-eagle.gguf ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(eagle_convert PROPERTIES TIMEOUT 120 LABELS eagle
  ENVIRONMENT "CAIRN_MODEL=${CAIRN_MODEL}")

# `cairn serve --draft`: speculation inside the service (lossless greedy and
# seed-stable sampled outputs over shared, cached and disk-loaded pages,
# concurrent clients, sessions, restarts with and without the head).
add_test(NAME eagle_server
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_server_draft.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/models/stories260K-eagle.gguf)
set_tests_properties(eagle_server PROPERTIES TIMEOUT 300 LABELS "eagle;server")

# `cairn serve --spec ngram / draft:MODEL`: every request with speculation
# gives the tokens it gives without (greedy, seeded sampling, penalties,
# logprobs, grammars, concurrent clients), usage reports tau, namespaces and
# restarts, refused configurations.
add_test(NAME spec_server
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_server_spec.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/models/stories260K-eagle.gguf ${Python3_EXECUTABLE}
          ${PROJECT_SOURCE_DIR}/tools)
set_tests_properties(spec_server PROPERTIES TIMEOUT 300 LABELS "eagle;server")
