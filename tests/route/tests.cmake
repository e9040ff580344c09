# route/: the router's index, page hashes, cost and choice on their own.
cairn_add_test(route_index SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_route_index.c LABELS route TIMEOUT 60)
