# The CLI contract, exercised through the real executable.
add_test(NAME cli_contract
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cli.py $<TARGET_FILE:cairn>
          ${CAIRN_MODEL} ${PROJECT_SOURCE_DIR}/tests/ref/llama_ref.py
          ${PROJECT_SOURCE_DIR}/tests/data/text/stories.txt)
set_tests_properties(cli_contract PROPERTIES TIMEOUT 300 LABELS cli)

# `cairn chat` through a pseudo-terminal on the real instruct model: turns,
# /save, Ctrl-C stopping a reply, a restart on the same --cache-dir, /load
# and the history served from the cache.
add_test(NAME cli_chat
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat.py $<TARGET_FILE:cairn>)
set_tests_properties(cli_chat PROPERTIES TIMEOUT 300 LABELS "cli;realmodel" SKIP_RETURN_CODE 77
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")
