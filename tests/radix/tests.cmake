# radix/: the page-granular prefix tree on its own (no store, no backend).
cairn_add_test(radix_tree SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_radix.c LABELS radix TIMEOUT 120)
