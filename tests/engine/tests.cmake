# Forward pass against the numpy reference, and model-level behaviour.
cairn_add_test(engine_forward
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_forward.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/ref/llama_ref.py
  TIMEOUT 300)
