# Structured output (text/grammar_*.c): the schema compiler and matcher at
# the byte level (every keyword, random documents and mutations), the mask
# on the bundled and the real vocabulary, response_format in the protocol,
# and sampled generation through the service.
cairn_add_test(test_grammar
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grammar.c
  LABELS grammar
  TIMEOUT 240)
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
