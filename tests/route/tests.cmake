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

# cairn behind the routers people deploy: three replicas of the real
# instruct model behind vllm-router (round_robin, cache_aware, kv_aware fed
# by --kv-events), sglang-router and cairn route; the RAG floor, a burst,
# same tokens through every router, a replica SIGKILLed and restarted.
# Needs the router wheels (pip-installed when missing), redis-server, pyzmq
# and msgspec; skips (77) saying which is missing.
add_test(NAME route_routers_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_routers.py $<TARGET_FILE:cairn>)
set_tests_properties(route_routers_realmodel PROPERTIES TIMEOUT 900 LABELS "route;server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")
