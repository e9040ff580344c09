# ckpt/: Hugging Face checkpoint folders. The material is built at test time
# from real and synthetic weights by tools/ckpt (tests/ckpt/make_material.py):
# tiny synthetic folders always; folders made from the real Qwen2.5 GGUF
# (BF16, AWQ, GPTQ act-order asymmetric, FP8 per channel and per block) when
# that model is present, else those tests skip.
set(CAIRN_CKPT_DIR ${CMAKE_BINARY_DIR}/ckpt)
add_test(NAME ckpt_material_synthetic
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/make_material.py synthetic
          ${CAIRN_CKPT_DIR})
set_tests_properties(ckpt_material_synthetic PROPERTIES FIXTURES_SETUP ckpt_synthetic
  LABELS ckpt TIMEOUT 300)

cairn_add_test(ckpt_reader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt.c LABELS ckpt TIMEOUT 300)
set_property(TEST ckpt_reader APPEND PROPERTY ENVIRONMENT "CAIRN_CKPT_SYNTH=${CAIRN_CKPT_DIR}/synth")
# Folders packed by vLLM / compressed-tensors, committed (tests/data/ckpt/indep/PROVENANCE.md).
set_property(TEST ckpt_reader APPEND PROPERTY ENVIRONMENT
  "CAIRN_CKPT_INDEP=${PROJECT_SOURCE_DIR}/tests/data/ckpt/indep")
set_tests_properties(ckpt_reader PROPERTIES FIXTURES_REQUIRED ckpt_synthetic)

add_test(NAME ckpt_material_real
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/make_material.py real
          ${CAIRN_CKPT_DIR} ${CAIRN_CHAT_MODEL})
set_tests_properties(ckpt_material_real PROPERTIES FIXTURES_SETUP ckpt_real
  LABELS "ckpt;realmodel" TIMEOUT 900 SKIP_RETURN_CODE 77)

# The tokenizer.json written from the GGUF's vocabulary, through cairn, on the
# qwen2 conformance data (HF tokenizers' ids).
add_test(NAME tokenizer_qwen2_ckpt
  COMMAND test_tokenizer_conformance qwen2 ${CAIRN_CKPT_DIR}/qwen-bf16)
set_tests_properties(tokenizer_qwen2_ckpt PROPERTIES FIXTURES_REQUIRED ckpt_real
  LABELS "ckpt;realmodel" TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "CAIRN_TESTDATA=${CAIRN_TESTDATA}")

add_test(NAME ckpt_real
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_real.py
          $<TARGET_FILE:cairn> ${CAIRN_CKPT_DIR} ${CAIRN_TESTDATA})
set_tests_properties(ckpt_real PROPERTIES FIXTURES_REQUIRED ckpt_real
  LABELS "ckpt;realmodel" TIMEOUT 900 SKIP_RETURN_CODE 77)

# The test material's own layouts (tools/ckpt packers against literal
# restatements of the published formats), so a wrong packer cannot make a
# wrong reader look right.
add_test(NAME ckpt_tool_layouts
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/ckpt/test_layouts.py)
set_tests_properties(ckpt_tool_layouts PROPERTIES LABELS ckpt TIMEOUT 120)

# Gemma 3 and the mixtures of experts as HF folders: tiny random models
# always, the real Gemma 3 270M when present (skipped, 77, when absent).
add_test(NAME ckpt_material_families
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/make_material.py families
          ${CAIRN_CKPT_DIR})
set_tests_properties(ckpt_material_families PROPERTIES FIXTURES_SETUP ckpt_families
  LABELS ckpt TIMEOUT 300)
add_test(NAME ckpt_material_gemma
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/make_material.py gemma
          ${CAIRN_CKPT_DIR} ${PROJECT_SOURCE_DIR}/models/gemma3-270m-q4_k_m.gguf)
set_tests_properties(ckpt_material_gemma PROPERTIES FIXTURES_SETUP ckpt_gemma
  LABELS "ckpt;realmodel" TIMEOUT 900 SKIP_RETURN_CODE 77)
add_test(NAME ckpt_families
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_families.py
          $<TARGET_FILE:cairn> ${CAIRN_CKPT_DIR} ${CAIRN_TESTDATA})
set_tests_properties(ckpt_families PROPERTIES FIXTURES_REQUIRED "ckpt_families;ckpt_gemma"
  LABELS ckpt TIMEOUT 900 SKIP_RETURN_CODE 77)
