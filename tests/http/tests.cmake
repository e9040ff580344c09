# The OpenAI-compatible HTTP facade (docs/openai.md) through the real
# `cairn serve --http-port`: the official `openai` Python package on the
# bundled model, curl and raw sockets for limits, errors and authentication,
# and a tool-call round trip on the real instruct model when it is present.
# Need the `openai` and `jsonschema` Python packages and curl
# (scripts/setup.sh --test installs them).
add_test(NAME http_openai
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_openai.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_openai PROPERTIES TIMEOUT 300 LABELS "server")

add_test(NAME http_limits
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_http_limits.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_limits PROPERTIES TIMEOUT 300 LABELS "server")

add_test(NAME http_chat_model
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_chat_model.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_chat_model PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# Gemma 3 270M: its turn format from the vocabulary, a reply equal to
# llama.cpp's, a conversation over a document 4x the sliding window that
# computes each turn's new tokens only, fresh and after a restart.
add_test(NAME http_gemma_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_gemma.py $<TARGET_FILE:cairn>)
set_tests_properties(http_gemma_realmodel PROPERTIES TIMEOUT 600 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77
  ENVIRONMENT "CAIRN_GEMMA_MODEL=${CAIRN_GEMMA_MODEL};CAIRN_TESTDATA=${CAIRN_TESTDATA}")

# Anthropic's Messages API through the official `anthropic` package (skips,
# 77, when it cannot be imported).
add_test(NAME http_anthropic
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_anthropic.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_anthropic PROPERTIES TIMEOUT 300 LABELS "server" SKIP_RETURN_CODE 77)

# OpenAI's Responses API through the official `openai` package: stored
# responses, previous_response_id chains across SIGKILL restarts, function
# calls, streaming.
add_test(NAME http_responses
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_responses.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_responses PROPERTIES TIMEOUT 300 LABELS "server")

# Stored responses' lifecycle (issue 36): 10000 stored responses on a server
# with --max-sessions 64 all answer, the newest chains continue across a
# graceful restart and a SIGKILL, the oldest are pushed out (404), expired
# ones are 404, the user's sessions stay. The bundled model (seconds); the
# real instruct model with fewer calls (each is a 0.5B forward pass).
add_test(NAME http_responses_lifecycle
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_responses_lifecycle.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_responses_lifecycle PROPERTIES TIMEOUT 300 LABELS "server"
  SKIP_RETURN_CODE 77)
add_test(NAME http_responses_lifecycle_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_responses_lifecycle.py
          $<TARGET_FILE:cairn> ${CAIRN_CHAT_MODEL})
set_tests_properties(http_responses_lifecycle_realmodel PROPERTIES TIMEOUT 300
  LABELS "server;realmodel" SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_RESPONSES_CALLS=400")

# The OpenAI Agents SDK against the Responses API (skips, 77, when
# openai-agents cannot be imported): a forced tool on the bundled model, an
# unforced one on the real instruct model.
add_test(NAME http_agents
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_agents.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} AgentsSDK)
set_tests_properties(http_agents PROPERTIES TIMEOUT 300 LABELS "server" SKIP_RETURN_CODE 77)
add_test(NAME http_agents_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_agents.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} AgentsRealModel)
set_tests_properties(http_agents_realmodel PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# The client libraries agent frameworks use (LangChain's ChatOpenAI,
# instructor), unchanged, against the server; each skips with a message
# when it is not installed.
add_test(NAME http_clients
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_clients.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_clients PROPERTIES TIMEOUT 300 LABELS "server")

# What a new user met (issue 38): special tokens in /v1/completions, a reply
# cut after a tool call, max_tokens beyond the context, /tokenize of long
# text, --api-key, --http-port alone, the start banner.
add_test(NAME http_new_user
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_new_user.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} TinyModel,Progress)
set_tests_properties(http_new_user PROPERTIES TIMEOUT 300 LABELS "server")
add_test(NAME http_new_user_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_new_user.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} ChatModel,PrefillProgress)
set_tests_properties(http_new_user_realmodel PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# vLLM's metric names on /metrics (issue 42) read with prometheus_client's
# parser, on the real instruct model: names, types, labels and buckets; the
# running and KV-usage gauges around a request in flight; prefix-cache token
# counts against the usage object; measured latency histograms.
add_test(NAME http_vllm_metrics_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_vllm_metrics.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_vllm_metrics_realmodel PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# A crash keeps what was reused (issue 36): a document computed and reused
# once is written to LMDB in the background; after a SIGKILL and restart it
# comes back from disk with the same greedy output, while a one-off prompt
# was never written (real model, real LMDB, real SIGKILL).
add_test(NAME http_write_behind_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_write_behind.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_write_behind_realmodel PROPERTIES TIMEOUT 600 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# Why was my prompt recomputed (issue 36): each cache-miss reason provoked
# through a real client (openai, anthropic, the native cairn_client) on the
# real instruct model — a dropped <think> block, a nonce in the system prompt,
# reordered tools, eviction under a small --kv-mem, a restart without
# --cache-dir, another tenant, two requests at once — read from usage's
# cache_miss, counted in /metrics, and answered by POST /v1/cache/explain
# without running (docs/why-recomputed.md).
add_test(NAME http_cache_explain_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cache_explain.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_cache_explain_realmodel PROPERTIES TIMEOUT 600 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# Retention hints (issue 36): Anthropic's cache_control, OpenAI's
# prompt_cache_retention and the native cache_pin through the official
# clients on the real model: bad hints are 400s naming the field, usage
# counts cache writes and reads as Anthropic does, a pinned document
# survives a flood larger than tier 0 + host RAM and is released after its
# TTL, and a tenant pinning past --max-pinned-tokens gets a 429.
add_test(NAME http_retention_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_retention.py
          $<TARGET_FILE:cairn>)
set_tests_properties(http_retention_realmodel PROPERTIES TIMEOUT 600 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")

# Replies in channels (gpt-oss's harmony): reasoning_content, content and a
# tool call out of a forced harmony reply on the bundled model given
# gpt-oss's template, streamed and not.
add_test(NAME http_harmony
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_harmony.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_harmony PROPERTIES TIMEOUT 300 LABELS "server")

# Replies that think first (Qwen3's <think>): reasoning_content, the
# Responses reasoning item, Anthropic's thinking block, reasoning_tokens and
# enable_thinking, on the bundled model given Qwen3's template.
add_test(NAME http_thinking
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_thinking.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(http_thinking PROPERTIES TIMEOUT 300 LABELS "server")
