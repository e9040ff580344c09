# The CLI contract, exercised through the real executable.
add_test(NAME cli_contract
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cli.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/tests/ref/llama_ref.py
          ${PROJECT_SOURCE_DIR}/tests/data/text/stories.txt)
set_tests_properties(cli_contract PROPERTIES TIMEOUT 300 LABELS cli)
