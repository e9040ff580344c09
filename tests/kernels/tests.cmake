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
cairn_add_test(kernels_cpu_attention_simd
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_attention_simd.c
  LABELS kernels TIMEOUT 120)
