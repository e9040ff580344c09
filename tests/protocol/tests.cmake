# protocol/: the msgpack-RPC codec on its own (scanner, reader, request
# decoding, packing, random input), then the real `cairn serve` over TCP and
# a Unix socket.
cairn_add_test(protocol_codec SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_codec.c
  LABELS protocol TIMEOUT 120)
cairn_add_test(protocol_server SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_server.c
  LABELS protocol TIMEOUT 300)
add_dependencies(protocol_server cairn)
# Access control without a server: tokens, tenants file, loopback, the
# checker and the decoder used before authentication.
cairn_add_test(protocol_access SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_access.c
  LABELS protocol TIMEOUT 60)
