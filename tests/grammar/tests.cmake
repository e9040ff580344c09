# Structured output (text/grammar_*.c): the schema compiler and matcher at
# the byte level (every keyword, random documents and mutations), the mask
# on the bundled and the real vocabulary, response_format in the protocol,
# and sampled generation through the service.
cairn_add_test(test_grammar
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grammar.c
  LABELS grammar
  TIMEOUT 240)
# The mask on the real vocabulary is test_grammar_realmodel (label
# realmodel, skipped, 77, when the model is absent); test_grammar the rest.
set_property(TEST test_grammar APPEND PROPERTY ENVIRONMENT "CAIRN_TEST_EXCEPT=test_tokens_real_vocab")
add_test(NAME test_grammar_realmodel COMMAND test_grammar)
set_tests_properties(test_grammar_realmodel PROPERTIES TIMEOUT 240 LABELS "grammar;realmodel"
  ENVIRONMENT "${CAIRN_TEST_ENV};CAIRN_TEST_ONLY=test_tokens_real_vocab")
# End to end through `cairn run --json-schema` at temperature 1, validated
# with Python's jsonschema.
add_test(NAME grammar_cli_jsonschema
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_grammar_cli.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(grammar_cli_jsonschema PROPERTIES TIMEOUT 240 LABELS grammar
  SKIP_RETURN_CODE 77)
# Every document the grammar generates at the byte level validates with
# Python's jsonschema (formats checked), and on candidate texts of the
# supported forms the grammar and jsonschema agree (bounds, pattern, format,
# prefixItems; pydantic v2's schemas when pydantic is installed).
add_executable(grammar_walk ${CMAKE_CURRENT_LIST_DIR}/grammar_walk.c)
target_link_libraries(grammar_walk PRIVATE cairn_lib)
add_test(NAME grammar_walk_jsonschema
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_grammar_walk.py
          $<TARGET_FILE:grammar_walk>)
set_tests_properties(grammar_walk_jsonschema PROPERTIES TIMEOUT 300 LABELS grammar
  SKIP_RETURN_CODE 77)
