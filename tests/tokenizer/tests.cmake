# One conformance run per vocabulary that has a GGUF in tests/data/tokenizer.
add_executable(test_tokenizer_conformance ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_conformance.c)
target_link_libraries(test_tokenizer_conformance PRIVATE cairn_lib)
foreach(vocab llama-spm phi-3 gpt-2 mpt refact starcoder falcon deepseek-coder deepseek-llm)
  add_test(NAME tokenizer_${vocab} COMMAND test_tokenizer_conformance ${vocab})
  set_tests_properties(tokenizer_${vocab} PROPERTIES TIMEOUT 120 LABELS engine
    ENVIRONMENT "CAIRN_MODEL=${CAIRN_MODEL};CAIRN_TESTDATA=${CAIRN_TESTDATA}")
endforeach()

# Llama 3 (llama-bpe) and Qwen2 ship no vocab-only GGUF; their conformance
# data runs on the vocabulary of a real model of the family, skipped (77)
# with a message when that file is absent (for llama-bpe always, unless
# CAIRN_LLAMA3_MODEL names one: tokenizer_llama-bpe_hf below checks it
# without).
set(CAIRN_LLAMA3_MODEL "$ENV{CAIRN_LLAMA3_MODEL}" CACHE FILEPATH
    "a Llama 3 GGUF whose vocabulary checks the llama-bpe pre-tokenizer")
if(NOT CAIRN_LLAMA3_MODEL)
  set(CAIRN_LLAMA3_MODEL ${PROJECT_SOURCE_DIR}/models/llama3.gguf)
endif()
foreach(pair "qwen2|${CAIRN_CHAT_MODEL}" "llama-bpe|${CAIRN_LLAMA3_MODEL}")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 vocab)
  list(GET pair 1 file)
  add_test(NAME tokenizer_${vocab} COMMAND test_tokenizer_conformance ${vocab} ${file})
  set_tests_properties(tokenizer_${vocab} PROPERTIES TIMEOUT 120 LABELS engine
    SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_TESTDATA=${CAIRN_TESTDATA}")
endforeach()

# llama-bpe where no Llama 3 vocabulary is (every machine here): HF
# tokenizers trains a byte-level BPE with Llama 3's pre-tokenizer at test
# time, cairn reads its tokenizer.json from a checkpoint folder, and cairn's
# ids must be HF's on the llama-bpe .inp texts and more (unicode, numbers,
# contractions, whitespace runs). Skipped (77) without tokenizers/numpy.
add_test(NAME tokenizer_llama-bpe_hf
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_llama_bpe_hf.py
          $<TARGET_FILE:test_tokenizer_conformance> ${CMAKE_CURRENT_BINARY_DIR}/llama-bpe-hf)
set_tests_properties(tokenizer_llama-bpe_hf PROPERTIES TIMEOUT 120 LABELS engine
  SKIP_RETURN_CODE 77)

# The same for GPT-4o's o200k split (gpt-oss, Llama 4): cairn must map its
# regex to gpt-4o and give HF's ids, CamelCase and case changes under
# combining marks, contractions after upper runs, slashes after symbols.
add_test(NAME tokenizer_gpt-4o_hf
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_gpt4o_hf.py
          $<TARGET_FILE:test_tokenizer_conformance> ${CMAKE_CURRENT_BINARY_DIR}/gpt-4o-hf)
set_tests_properties(tokenizer_gpt-4o_hf PROPERTIES TIMEOUT 120 LABELS engine
  SKIP_RETURN_CODE 77)

# gpt-oss's real vocabulary (o200k_harmony, built from OpenAI's o200k_base
# ranks that ride in a PyPI wheel) against OpenAI's tiktoken: ids of ~1100
# texts and of every UTF-8 token alone, decoding, and harmony's specials.
add_test(NAME tokenizer_o200k_tiktoken
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_o200k_tiktoken.py
          $<TARGET_FILE:test_tokenizer_conformance> $<TARGET_FILE:cairn>
          ${CMAKE_CURRENT_BINARY_DIR}/o200k)
set_tests_properties(tokenizer_o200k_tiktoken PROPERTIES TIMEOUT 300 LABELS engine
  SKIP_RETURN_CODE 77)

cairn_add_test(test_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.c LABELS engine TIMEOUT 120)

# Plain text never produces a special token: every vocabulary in
# tests/data/tokenizer and the bundled model, then the real instruct model
# (label realmodel; skipped, 77, when it is absent).
add_executable(test_special_text ${CMAKE_CURRENT_LIST_DIR}/test_special_text.c)
target_link_libraries(test_special_text PRIVATE cairn_lib)
set(special_text_files ${CAIRN_MODEL})
foreach(vocab llama-spm phi-3 gpt-2 mpt refact starcoder falcon deepseek-coder deepseek-llm bert-bge)
  list(APPEND special_text_files ${CAIRN_TESTDATA}/tokenizer/ggml-vocab-${vocab}.gguf)
endforeach()
add_test(NAME tokenizer_special_text COMMAND test_special_text ${special_text_files})
set_tests_properties(tokenizer_special_text PROPERTIES TIMEOUT 300 LABELS engine)
add_test(NAME tokenizer_special_text_chat_model COMMAND test_special_text ${CAIRN_CHAT_MODEL})
set_tests_properties(tokenizer_special_text_chat_model PROPERTIES TIMEOUT 300
  LABELS "engine;realmodel" SKIP_RETURN_CODE 77)

# SentencePiece-style tokenizer.json (BPE with byte_fallback: Llama 2,
# Mistral, Gemma) in a checkpoint folder: written by tools/ckpt from the
# llama-spm vocabulary and the real Gemma 3's, checked with HF tokenizers
# and read by cairn (ids equal to HF's and to the GGUF's own). Skipped (77)
# without tokenizers/numpy; the Gemma part only when the model is present.
add_test(NAME tokenizer_spm_hf
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_spm_hf.py
          $<TARGET_FILE:test_tokenizer_conformance> ${CMAKE_CURRENT_BINARY_DIR}/spm-hf
          ${PROJECT_SOURCE_DIR}/models/gemma3-270m-q4_k_m.gguf)
set_tests_properties(tokenizer_spm_hf PROPERTIES TIMEOUT 300 LABELS engine
  SKIP_RETURN_CODE 77)
