# store/: tiers, LMDB, and the whole tiered cache against a model.
set(CAIRN_STORE_TEST_UTIL ${CMAKE_CURRENT_LIST_DIR}/test_util.c)

cairn_add_test(store_property
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_property.c ${CAIRN_STORE_TEST_UTIL}
  LABELS store TIMEOUT 300)
target_include_directories(store_property PRIVATE ${CMAKE_CURRENT_LIST_DIR})

cairn_add_test(store_disk
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_disk.c ${CAIRN_STORE_TEST_UTIL}
  LABELS store TIMEOUT 300)
target_include_directories(store_disk PRIVATE ${CMAKE_CURRENT_LIST_DIR})

cairn_add_test(store_kvcache_fetch
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kvcache_fetch.c ${CAIRN_STORE_TEST_UTIL}
  LABELS store TIMEOUT 300)
target_include_directories(store_kvcache_fetch PRIVATE ${CMAKE_CURRENT_LIST_DIR})

cairn_add_test(store_eviction_order
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_eviction_order.c ${CAIRN_STORE_TEST_UTIL}
  LABELS store TIMEOUT 120)
target_include_directories(store_eviction_order PRIVATE ${CMAKE_CURRENT_LIST_DIR})

cairn_add_test(store_kvcache_share
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kvcache_share.c ${CAIRN_STORE_TEST_UTIL}
  LABELS store TIMEOUT 120)
target_include_directories(store_kvcache_share PRIVATE ${CMAKE_CURRENT_LIST_DIR})

# The tiered cache again on a backend whose page copies finish late, as a
# device's do (test_util.c: CAIRN_TEST_TRANSFER_DELAY): a page or host slot
# used before its copy ends shows up as a wrong payload.
foreach(t store_property store_kvcache_fetch store_kvcache_share)
  add_test(NAME ${t}_late_copies COMMAND ${t})
  set_tests_properties(${t}_late_copies PROPERTIES LABELS store TIMEOUT 300
    ENVIRONMENT "CAIRN_TEST_TRANSFER_DELAY=3")
endforeach()

# The property test again, under AddressSanitizer + UBSan, whatever
# CAIRN_SANITIZE says: an object library of the radix/store sources (and the
# little of common/ and kernels/ they use) compiled with the sanitizers, and a
# test executable linked against it rather than against cairn_lib. Leak
# checking is on (LeakSanitizer is part of ASan on Linux).
file(GLOB CAIRN_SAN_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/pagekey/*.c ${PROJECT_SOURCE_DIR}/radix/*.c ${PROJECT_SOURCE_DIR}/store/*.c
  ${PROJECT_SOURCE_DIR}/common/*.c)
add_library(cairn_store_asan OBJECT ${CAIRN_SAN_SOURCES}
  ${PROJECT_SOURCE_DIR}/kernels/backend.c)
set(CAIRN_SAN_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
target_compile_options(cairn_store_asan PRIVATE ${CAIRN_SAN_FLAGS})
target_include_directories(cairn_store_asan PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(cairn_store_asan PUBLIC PkgConfig::XXHASH PkgConfig::LMDB PkgConfig::HIREDIS Threads::Threads m)

function(cairn_add_asan_test name)
  add_executable(${name} ${ARGN})
  target_compile_options(${name} PRIVATE ${CAIRN_SAN_FLAGS})
  target_link_options(${name} PRIVATE -fsanitize=address,undefined)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(${name} PRIVATE cairn_store_asan PkgConfig::CMOCKA)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "store;asan"
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endfunction()
# The property tests' reference model, without the rest of tests/support
# (which links cairn_lib).
set(CAIRN_PREFIX_MODEL ${PROJECT_SOURCE_DIR}/tests/support/prefix_model.c
  ${PROJECT_SOURCE_DIR}/tests/support/rng.c)
cairn_add_asan_test(store_property_asan
  ${CMAKE_CURRENT_LIST_DIR}/test_store_property.c ${CAIRN_STORE_TEST_UTIL} ${CAIRN_PREFIX_MODEL})
cairn_add_asan_test(radix_tree_asan ${PROJECT_SOURCE_DIR}/tests/radix/test_radix.c
  ${CAIRN_PREFIX_MODEL})
cairn_add_asan_test(store_disk_asan
  ${CMAKE_CURRENT_LIST_DIR}/test_disk.c ${CAIRN_STORE_TEST_UTIL})
cairn_add_asan_test(store_kvcache_fetch_asan
  ${CMAKE_CURRENT_LIST_DIR}/test_kvcache_fetch.c ${CAIRN_STORE_TEST_UTIL})
cairn_add_asan_test(store_kvcache_share_asan
  ${CMAKE_CURRENT_LIST_DIR}/test_kvcache_share.c ${CAIRN_STORE_TEST_UTIL})
cairn_add_asan_test(store_eviction_order_asan
  ${CMAKE_CURRENT_LIST_DIR}/test_eviction_order.c ${CAIRN_STORE_TEST_UTIL})

# Benchmark (a build target, not a test): see bench/radix_store/README.md.
add_executable(bench_radix_store ${PROJECT_SOURCE_DIR}/bench/radix_store/bench_radix_store.c
  ${CAIRN_STORE_TEST_UTIL})
target_include_directories(bench_radix_store PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(bench_radix_store PRIVATE cairn_lib)

# A page copy still running at the store's first poll, on the CPU backend
# with a fake copy queue: the page drains, and ops after it still work.
cairn_add_test(store_transfer_busy
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_transfer_busy.c
  LABELS store TIMEOUT 60)
