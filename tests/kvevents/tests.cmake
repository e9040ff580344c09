# kvevents/: the pages a replica holds, published as vLLM's KV events.
# The C test reads the publisher's wire output with msgpack-c; the Python
# test runs `cairn serve --kv-events` and decodes the stream with vLLM
# 0.32's event classes (pyzmq and msgspec: skips, 77, without them).
cairn_add_test(kvevents_publisher
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kvevents.c
  LABELS store TIMEOUT 120)

add_test(NAME kvevents_server
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_kv_events.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(kvevents_server PROPERTIES TIMEOUT 300 LABELS "server" SKIP_RETURN_CODE 77)
