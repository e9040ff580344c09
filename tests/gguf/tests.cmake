cairn_add_test(test_gguf SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.c LABELS engine TIMEOUT 300)
