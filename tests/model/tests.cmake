# model/: the forward pass against the numpy reference, and model-level behaviour
# (test names keep their old "engine_" prefix and label, so -R/-L still work).
cairn_add_test(engine_forward
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_forward.c
  ARGS ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/ref/llama_ref.py
  LABELS engine TIMEOUT 300)

# The same comparison on the other code paths: a qwen2 model (q/k/v biases,
# NEOX RoPE), a qwen3 one (per-head q/k RMSNorm, heads wider than dim /
# n_head) and a Llama 3 one (rope_freqs), tiny and random, written by
# tools/gen_synthetic_model.py at test time.
add_test(NAME engine_synthetic_qwen2
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --arch qwen2 -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-qwen2.gguf)
add_test(NAME engine_synthetic_llama3
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --rope-freqs -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-llama3.gguf)
add_test(NAME engine_synthetic_qwen3
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --arch qwen3 --head-dim 48 -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-qwen3.gguf)
# YaRN on a qwen2 model (Qwen2.5's long-context setting), over a trained
# context of 16 so that the test's 37 tokens run past it.
add_test(NAME engine_synthetic_yarn
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --arch qwen2 --yarn 4 --yarn-orig-ctx 16
          -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-yarn.gguf)
# YaRN with its ramp's ends unrounded (HF's rope_scaling.truncate false,
# gpt-oss's folders)
add_test(NAME engine_synthetic_yarnexact
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --arch qwen2 --yarn 4 --yarn-orig-ctx 16 --yarn-unrounded
          -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-yarnexact.gguf)
# Sliding windows, with the test's 37 tokens well past the window: Gemma 3
# (post-norms, GeGLU, embeddings scaled, local layers with a RoPE base of
# their own, here every layer but the third) and Mistral (a window over every
# layer of a llama file).
add_test(NAME engine_synthetic_gemma3
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --layers 3 --type F32 --arch gemma3 --head-dim 48 --sliding-window 8 --swa-period 3
          -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-gemma3.gguf)
add_test(NAME engine_synthetic_mistral
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --sliding-window 6 -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-mistral.gguf)
# Mixtures of experts: 6 experts of which 2 run per token, so rows go to
# different experts and most experts see several rows of one call.
foreach(arch qwen3moe qwen2moe mixtral)
  add_test(NAME engine_synthetic_${arch}
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
            --type F32 --arch ${arch} --experts 6 --experts-used 2 --expert-ffn 96
            -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-${arch}.gguf)
endforeach()
# gpt-oss: attention sinks, biases on q/k/v/o, the router and the experts,
# the clamped SwiGLU, YaRN (factor 32 over 4096) on every layer, q wider
# than dim (4 heads of 48 on 128), even layers local with an 8-token window
# (the test's 37 tokens pass it), and MXFP4 experts as in the real model.
add_test(NAME engine_synthetic_gptoss
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py --shape tiny
          --type F32 --arch gpt-oss --head-dim 48 --experts 6 --experts-used 2 --expert-ffn 96
          --expert-type MXFP4 --sliding-window 8
          -o ${CMAKE_CURRENT_BINARY_DIR}/synthetic-gptoss.gguf)
set_tests_properties(engine_synthetic_qwen2 engine_synthetic_qwen3 engine_synthetic_llama3
  engine_synthetic_yarn engine_synthetic_yarnexact engine_synthetic_gemma3 engine_synthetic_mistral engine_synthetic_qwen3moe
  engine_synthetic_qwen2moe engine_synthetic_mixtral engine_synthetic_gptoss
  PROPERTIES FIXTURES_SETUP synthetic_models LABELS engine TIMEOUT 300)
foreach(arch qwen2 qwen3 llama3 yarn yarnexact gemma3 mistral qwen3moe qwen2moe mixtral gptoss)
  add_test(NAME engine_forward_${arch}
    COMMAND engine_forward ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/ref/llama_ref.py
            ${CMAKE_CURRENT_BINARY_DIR}/synthetic-${arch}.gguf)
  set_tests_properties(engine_forward_${arch} PROPERTIES FIXTURES_REQUIRED synthetic_models
    LABELS engine TIMEOUT 300)
endforeach()
# The experts are MXFP4: the CPU backend's exact mode (float activations)
# keeps the comparison with the float64 reference within its 1e-4 (8-bit
# activations, as llama.cpp's CPU uses for MXFP4, move logits by ~2%).
set_tests_properties(engine_forward_gptoss PROPERTIES ENVIRONMENT CAIRN_CPU_EXACT_MATMUL=1)

# A decode step whose op fails while it is recorded as a step graph: the
# recording is dropped, not launched, and the first failure is reported
# (a CPU backend with fake graph slots).
cairn_add_test(engine_graph_abandon
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_graph_abandon.c
  LABELS engine TIMEOUT 60)
