# route/: the router's index, page hashes, cost and choice on their own.
cairn_add_test(route_index SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_route_index.c LABELS route TIMEOUT 60)

# The router end to end: a real redis-server, three real replicas publishing
# their page events (--shared-cache), the RAG workload computing each
# document once, sticky sessions, the index rebuilt from the stream after a
# restart, SIGKILL of a replica under load, tenants. Needs redis-server and
# the Python package msgpack.
add_test(NAME route_integration
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_route.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(route_integration PROPERTIES TIMEOUT 300 LABELS "route;server")
