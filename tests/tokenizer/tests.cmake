# One conformance run per vocabulary that has a GGUF in tests/data/tokenizer.
add_executable(test_tokenizer_conformance ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_conformance.c)
target_link_libraries(test_tokenizer_conformance PRIVATE cairn_lib)
foreach(vocab llama-spm phi-3 gpt-2 mpt refact starcoder falcon deepseek-coder deepseek-llm)
  add_test(NAME tokenizer_${vocab} COMMAND test_tokenizer_conformance ${vocab})
  set_tests_properties(tokenizer_${vocab} PROPERTIES TIMEOUT 120 LABELS engine
    ENVIRONMENT "CAIRN_MODEL=${CAIRN_MODEL};CAIRN_TESTDATA=${CAIRN_TESTDATA}")
endforeach()

cairn_add_test(test_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.c LABELS engine TIMEOUT 120)
