# The engine thread and scheduler, driven directly (no sockets).
cairn_add_test(session_service
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_service.c
  LABELS session
  TIMEOUT 300)
