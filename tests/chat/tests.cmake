# Chat templates: byte identity with the Hugging Face (jinja2) rendering for
# the real model's template and one synthetic GGUF per family, tool-call
# parsing and end-of-generation handling, and `cairn run --chat`.
# The classes that read the real model (RealQwen, QwenOtherDefaultPrompt)
# are an entry of their own, chat_templates_realmodel (label realmodel,
# skipped, 77, when the model is absent); chat_templates runs the rest, the
# synthetic and vendored templates, everywhere (also under -LE realmodel).
set(CHAT_REAL_CLASSES RealQwen QwenOtherDefaultPrompt)
list(JOIN CHAT_REAL_CLASSES " " CHAT_REAL_CLASSES_STR)
add_test(NAME chat_templates
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_templates.py $<TARGET_FILE:cairn>)
set_tests_properties(chat_templates PROPERTIES TIMEOUT 120 LABELS engine
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL};CAIRN_TEST_EXCEPT=${CHAT_REAL_CLASSES_STR}")
add_test(NAME chat_templates_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_templates.py $<TARGET_FILE:cairn>
          ${CHAT_REAL_CLASSES})
set_tests_properties(chat_templates_realmodel PROPERTIES TIMEOUT 120 LABELS "engine;realmodel"
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# test_chat's test_real_* read the real model: test_chat_realmodel runs them
# (skipped, 77, when it is absent), test_chat the rest without loading it.
cairn_add_test(test_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat.c LABELS engine TIMEOUT 120)
set_property(TEST test_chat APPEND PROPERTY ENVIRONMENT "CAIRN_CHAT_MODEL=;CAIRN_TEST_EXCEPT=test_real_*")
add_test(NAME test_chat_realmodel COMMAND test_chat)
set_tests_properties(test_chat_realmodel PROPERTIES TIMEOUT 120 LABELS "engine;realmodel"
  ENVIRONMENT "${CAIRN_TEST_ENV};CAIRN_TEST_ONLY=test_real_*")

add_test(NAME chat_run
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_run.py $<TARGET_FILE:cairn>)
set_tests_properties(chat_run PROPERTIES TIMEOUT 180 LABELS "engine;realmodel" SKIP_RETURN_CODE 77
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")
