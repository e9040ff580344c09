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
