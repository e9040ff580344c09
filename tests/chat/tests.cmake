# Chat templates: byte identity with the Hugging Face (jinja2) rendering for
# the real model's template and one synthetic GGUF per family, tool-call
# parsing and end-of-generation handling, and `cairn run --chat`.
add_test(NAME chat_templates
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_templates.py $<TARGET_FILE:cairn>)
set_tests_properties(chat_templates PROPERTIES TIMEOUT 120 LABELS engine
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

cairn_add_test(test_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat.c LABELS engine TIMEOUT 120)

add_test(NAME chat_run
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_run.py $<TARGET_FILE:cairn>)
set_tests_properties(chat_run PROPERTIES TIMEOUT 180 LABELS "engine;realmodel" SKIP_RETURN_CODE 77
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")
