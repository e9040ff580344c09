# Kernel tests: the reference formats and the CPU backend's ops against
# double-precision references. Each prints its random seed; rerun a failure
# with CAIRN_TEST_SEED=<seed>.
cairn_add_test(kernels_quant
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quant.c
  LABELS kernels TIMEOUT 120)
cairn_add_test(kernels_cpu_ops
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_ops.c
  LABELS kernels TIMEOUT 300)
cairn_add_test(kernels_cpu_attention
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_attention.c
  LABELS kernels TIMEOUT 300)
cairn_add_test(kernels_cpu_matmul
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_matmul.c
  LABELS kernels TIMEOUT 300)
# The packed weight layout: lossless, and every ISA level to the same bits
# at every batch size.
cairn_add_test(kernels_cpu_packed
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_packed.c
  LABELS kernels TIMEOUT 300)
# The checkpoint weight types (Q4_Z, F8_E4M3) and the e4m3 conversions,
# at every instruction-set level.
cairn_add_test(kernels_cpu_ckpt_types
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_ckpt_types.c
  LABELS kernels TIMEOUT 300)
cairn_add_test(kernels_cpu_attention_simd
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_attention_simd.c
  LABELS kernels TIMEOUT 120)
cairn_add_test(kernels_kquants
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kquants.c
  LABELS kernels TIMEOUT 300)
# The optional slots of the backend table: the fallbacks of supports_type,
# synchronize and copy, and the model loader's type check.
cairn_add_test(kernels_backend_slots
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_slots.c
  LABELS kernels TIMEOUT 120)
# cairn's Q5_0/K-quant dequantizers against gguf-py's, on random blocks and
# (when CAIRN_CHAT_MODEL exists) on rows of the real Q4_K_M model; skipped
# (exit 77) without numpy/gguf.
add_executable(kquants_dequant ${CMAKE_CURRENT_LIST_DIR}/kquants_dequant.c)
target_link_libraries(kquants_dequant PRIVATE cairn_lib)
add_test(NAME kernels_kquants_real
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_kquants_real.py
          $<TARGET_FILE:kquants_dequant> ${CAIRN_CHAT_MODEL})
set_tests_properties(kernels_kquants_real PROPERTIES
  TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "kernels;realmodel")
# The KV types (BF16, Q8_0, Q4_0 with their rotation) and sliding windows:
# attention over what kv_store stored against a double reference.
cairn_add_test(kernels_cpu_kv_types
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_kv_types.c
  LABELS kernels TIMEOUT 120)
# The CUDA backend's staging table (host C, built everywhere): a captured
# decode step records the same copies every step, so its graph is updated
# in place rather than made anew.
cairn_add_test(kernels_graph_staging
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage_table.c
  LABELS kernels TIMEOUT 60)
