# The OpenAI-compatible HTTP facade (docs/openai.md) through the real
# `cairn serve --http-port`: the official `openai` Python package on the
# bundled model, curl and raw sockets for limits, errors and authentication,
# and a tool-call round trip on the real instruct model when it is present.
# Need the `openai` and `jsonschema` Python packages and curl
# (scripts/setup.sh --test installs them).
add_test(NAME http_openai
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_openai.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_openai PROPERTIES TIMEOUT 300 LABELS "server")

add_test(NAME http_limits
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_http_limits.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_limits PROPERTIES TIMEOUT 300 LABELS "server")

add_test(NAME http_chat_model
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_model.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_chat_model PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# Anthropic's Messages API through the official `anthropic` package (skips,
# 77, when it cannot be imported).
add_test(NAME http_anthropic
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_anthropic.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_anthropic PROPERTIES TIMEOUT 300 LABELS "server" SKIP_RETURN_CODE 77)
