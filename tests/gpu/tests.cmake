# CUDA backend against the CPU backend (ctest label `gpu`). Built in every
# build (without CUDA the backend's stubs answer "no device", and the device
# tests report themselves skipped); the synthetic models and gpu_bench only
# with CUDA. A test exits 77 (reported as skipped, with
# a message) only when the CUDA runtime sees no device at all; a device
# whose backend fails to come up (cuBLAS not found, ...) is a failure, and
# with CAIRN_GPU_REQUIRED=1 in the environment so is "no device" (a GPU run
# must not turn green by skipping; tests/gpu/gpu_probe.h).
# CAIRN_GPU_TEST_BACKEND=cpu ctest -L gpu runs all of them on the CPU
# harness (a scalar CPU backend as the "GPU"), huge cases scaled down.
cairn_add_test(gpu_ops
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_ops.c
  LABELS gpu TIMEOUT 300)
cairn_add_test(gpu_model
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_model.c
  LABELS gpu TIMEOUT 300)
cairn_add_test(gpu_transfer
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_transfer.c
  LABELS gpu TIMEOUT 300)
cairn_add_test(gpu_graph
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_graph.c
  LABELS gpu TIMEOUT 300 ARGS ${CAIRN_MODEL})
set_tests_properties(gpu_ops gpu_model gpu_transfer gpu_graph PROPERTIES SKIP_RETURN_CODE 77)
# sampling on the device (sample_rows) against the CPU sampler; its draws
# per setting at 151936 tokens: CAIRN_GPU_SAMPLE_DRAWS (default 2048,
# about a minute of CPU twin draws; test_gpu_sample.c says what they prove)
cairn_add_test(gpu_sample
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_sample.c
  ARGS ${CAIRN_MODEL}
  LABELS gpu TIMEOUT 300)
set_tests_properties(gpu_sample PROPERTIES SKIP_RETURN_CODE 77)
# ctest -j starts the costliest first: these two carry the CPU references
# (full-size ops, the twin draws); the rest take seconds
set_tests_properties(gpu_ops gpu_sample PROPERTIES COST 100)

# The harness itself, with a scalar CPU backend standing in for the GPU:
# runs everywhere (also in the sanitizer builds, which have no CUDA), so
# the tests above stay sound between GPU runs.
add_test(NAME gpu_ops_harness COMMAND gpu_ops)
add_test(NAME gpu_model_harness COMMAND gpu_model ${CAIRN_MODEL})
add_test(NAME gpu_transfer_harness COMMAND gpu_transfer)
add_test(NAME gpu_sample_harness COMMAND gpu_sample ${CAIRN_MODEL})
set_tests_properties(gpu_sample_harness PROPERTIES
  ENVIRONMENT "CAIRN_GPU_TEST_BACKEND=cpu" LABELS kernels TIMEOUT 600)
add_test(NAME gpu_graph_harness COMMAND gpu_graph ${CAIRN_MODEL})
# the harness over a window model and a mixture of experts too (tests/model's
# synthetic files)
add_test(NAME gpu_model_harness_gemma3 COMMAND gpu_model ${CMAKE_CURRENT_BINARY_DIR}/synthetic-gemma3.gguf)
add_test(NAME gpu_model_harness_qwen2moe COMMAND gpu_model ${CMAKE_CURRENT_BINARY_DIR}/synthetic-qwen2moe.gguf)
add_test(NAME gpu_model_harness_gptoss COMMAND gpu_model ${CMAKE_CURRENT_BINARY_DIR}/synthetic-gptoss.gguf)
set_tests_properties(gpu_model_harness_gemma3 gpu_model_harness_qwen2moe gpu_model_harness_gptoss
  PROPERTIES FIXTURES_REQUIRED synthetic_models)
set_tests_properties(gpu_ops_harness gpu_model_harness gpu_transfer_harness gpu_graph_harness
  gpu_model_harness_gemma3 gpu_model_harness_qwen2moe gpu_model_harness_gptoss
  PROPERTIES
  ENVIRONMENT "CAIRN_GPU_TEST_BACKEND=cpu" LABELS kernels TIMEOUT 300)

if(CAIRN_HAVE_CUDA)

  # The other weight types and model code paths, on tiny random models
  # written at test time: BF16 with Llama 3 rope_freqs, Q8_0 qwen2 (biases,
  # NEOX RoPE), F16 qwen3 (q/k norms, 128-wide heads), Q4_K and F16 llama,
  # Q8_0 gemma3 (post-norms, GeGLU, sliding windows).
  set(GPU_SYN ${CMAKE_CURRENT_BINARY_DIR}/gpu-synthetic)
  set(GPU_SYN_MODELS
    "bf16-llama3|--type BF16 --shape tiny --rope-freqs"
    "q8_0-qwen2|--type Q8_0 --shape tiny --arch qwen2"
    "f16-qwen3|--type F16 --shape tiny --arch qwen3 --head-dim 128"
    "q4_k-llama|--type Q4_K --shape tiny --dim 256 --ffn 512"
    "f16-llama|--type F16 --shape tiny"
    "q8_0-gemma3|--type Q8_0 --shape tiny --arch gemma3 --head-dim 64 --layers 3 --swa-period 3 --sliding-window 8")
  foreach(spec ${GPU_SYN_MODELS})
    string(REPLACE "|" ";" parts "${spec}")
    list(GET parts 0 tag)
    list(GET parts 1 flags)
    separate_arguments(flags)
    add_test(NAME gpu_synthetic_${tag}
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py ${flags}
              -o ${GPU_SYN}-${tag}.gguf)
    set_tests_properties(gpu_synthetic_${tag} PROPERTIES
      FIXTURES_SETUP gpu_synthetic_${tag} LABELS gpu TIMEOUT 300)
    add_test(NAME gpu_model_${tag} COMMAND gpu_model ${GPU_SYN}-${tag}.gguf loose)
    add_test(NAME gpu_graph_${tag} COMMAND gpu_graph ${GPU_SYN}-${tag}.gguf)
    set_tests_properties(gpu_graph_${tag} PROPERTIES
      FIXTURES_REQUIRED gpu_synthetic_${tag} LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
    set_tests_properties(gpu_model_${tag} PROPERTIES
      FIXTURES_REQUIRED gpu_synthetic_${tag} LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
  endforeach()

  # A mixture of experts (qwen3moe, Q4_K): the router's choice is made on
  # the host between ops, so its steps never run as graphs (no gpu_graph).
  add_test(NAME gpu_synthetic_q4_k-qwen3moe
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --type Q4_K
            --shape tiny --dim 256 --ffn 512 --arch qwen3moe --experts 6 --experts-used 2
            --expert-ffn 256 -o ${GPU_SYN}-q4_k-qwen3moe.gguf)
  add_test(NAME gpu_model_q4_k-qwen3moe COMMAND gpu_model ${GPU_SYN}-q4_k-qwen3moe.gguf loose)
  set_tests_properties(gpu_synthetic_q4_k-qwen3moe PROPERTIES
    FIXTURES_SETUP gpu_synthetic_q4_k-qwen3moe LABELS gpu TIMEOUT 300)
  set_tests_properties(gpu_model_q4_k-qwen3moe PROPERTIES
    FIXTURES_REQUIRED gpu_synthetic_q4_k-qwen3moe LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)

  # bench/gpu/run.sh's driver: batched decode and prefill throughput (its
  # random tokens come from tests/support's support_lcg64).
  add_executable(gpu_bench ${PROJECT_SOURCE_DIR}/bench/gpu/gpu_bench.c)
  target_link_libraries(gpu_bench PRIVATE cairn_test_support cairn_lib)
endif()
