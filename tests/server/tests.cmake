# The serving contract (docs/protocol.md), exercised through the real
# `cairn serve` over TCP and a Unix socket with the Python client, plus the
# client's own plumbing against a scripted fake server. Both need the
# `msgpack` Python package (scripts/setup.sh --test installs it).
add_test(NAME server_integration
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_server.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(server_integration PROPERTIES TIMEOUT 600 LABELS "server")

add_test(NAME python_client_unit
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/clients/python/tests/test_client.py)
set_tests_properties(python_client_unit PROPERTIES TIMEOUT 120 LABELS "server")

# The persistent prefix cache: host-RAM and LMDB tiers, SIGTERM / SIGKILL
# restarts over the same --cache-dir, persisted sessions, namespace changes.
add_test(NAME server_persist
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_persist.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(server_persist PROPERTIES TIMEOUT 600 LABELS "server")

# Access control: tokens, tenants (sessions and cached prefixes stay inside a
# tenant, also across a restart), refusing a public bind without a token.
add_test(NAME server_access
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_access.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(server_access PROPERTIES TIMEOUT 300 LABELS "server")

# Same request, same tokens: alone, among 16 concurrent, from tier 0 / part
# of a page / disk after a restart, any --prefill-chunk, 1 or 2 threads; on
# the bundled model and (when scripts/get-model has fetched it) the real one.
add_test(NAME server_invariance
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_invariance.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} Invariance)
set_tests_properties(server_invariance PROPERTIES TIMEOUT 600 LABELS "server")
# ... and on synthetic models of the other families, the stories model's
# vocabulary in each ("tag|class|generator flags"): a Gemma 3 (Q4_K, 64-token
# window, every sixth layer global) whose shared document (~200 tokens) is
# three windows long, a qwen3moe (Q4_K, 8 experts, 2 a token), and a gpt-oss
# (sinks, a 64-token window on every other layer, MXFP4 experts, YaRN)
set(INVARIANCE_MODELS
  "window-gemma3|InvarianceWindow|--dim 256 --layers 6 --heads 4 --kv-heads 1 --head-dim 64 --ffn 768 --arch gemma3 --sliding-window 64"
  "experts-qwen3moe|InvarianceExperts|--dim 256 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --arch qwen3moe --experts 8 --experts-used 2 --expert-ffn 256"
  "gptoss|InvarianceExperts|--dim 256 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --arch gpt-oss --experts 8 --experts-used 2 --expert-ffn 256 --sliding-window 64 --expert-type MXFP4")
foreach(spec ${INVARIANCE_MODELS})
  string(REPLACE "|" ";" parts "${spec}")
  list(GET parts 0 tag)
  list(GET parts 1 class)
  list(GET parts 2 flags)
  separate_arguments(flags)
  add_test(NAME server_model_${tag}
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_synthetic_model.py ${flags}
            --type Q4_K --vocab-from ${CAIRN_MODEL} -o ${CMAKE_CURRENT_BINARY_DIR}/${tag}.gguf)
  set_tests_properties(server_model_${tag} PROPERTIES FIXTURES_SETUP model_${tag}
    LABELS "server")
  add_test(NAME server_invariance_${tag}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_invariance.py
            $<TARGET_FILE:cairn> ${CMAKE_CURRENT_BINARY_DIR}/${tag}.gguf ${class})
  set_tests_properties(server_invariance_${tag} PROPERTIES TIMEOUT 600 LABELS "server"
    FIXTURES_REQUIRED model_${tag})
endforeach()
add_test(NAME server_invariance_real
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_invariance.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} ${CAIRN_CHAT_MODEL} InvarianceRealModel)
# a hang guard: ~270 s alone on a 2-core AVX2 machine (its kernels are the
# slow side of this suite), twice that beside other tests
set_tests_properties(server_invariance_real PROPERTIES TIMEOUT 1200 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77)

# SIGTERM drains: listeners close, new requests are refused, running ones
# (an HTTP stream and a native call) finish, or end cleanly at
# --drain-timeout; a second signal stops at once.
add_test(NAME server_drain
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_drain.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(server_drain PROPERTIES TIMEOUT 300 LABELS "server")

# The shared cache tier: replicas with a cache directory each over one real
# redis-server (started by the test on loopback): a prefix only one replica
# computed served to another, page events, a damaged value recomputed, a
# Redis that stalls, restarts, is flushed or is absent, tenants, and a
# persisted session moving when its replica is killed.
add_test(NAME server_shared_cache
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_shared_cache.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(server_shared_cache PROPERTIES TIMEOUT 600 LABELS "server")

# bench/gpu/serve_check.py, the serving check the GPU machine runs with
# --device cuda, here in --quick mode with the CPU on both sides so that it
# cannot rot before a GPU runs it: tiers (device, host, disk after a
# restart), 32 concurrent chats, and the same greedy answers on both servers.
# Standard-library Python only.
add_test(NAME serve_check_cpu
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/gpu/serve_check.py
          --cairn $<TARGET_FILE:cairn> --model ${CAIRN_MODEL} --device cpu
          --reference-device cpu --out ${CMAKE_CURRENT_BINARY_DIR}/serve-check --quick)
set_tests_properties(serve_check_cpu PROPERTIES TIMEOUT 120 LABELS "server")

# The KV types (q8_0, q4_0, bf16) through a server on the real model:
# restart from disk, namespaces per type, server.info; skipped without it.
add_test(NAME server_kv_types
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_kv_types.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL} ${CAIRN_CHAT_MODEL})
set_tests_properties(server_kv_types PROPERTIES TIMEOUT 900 LABELS "server;realmodel")

# A prefix being computed on one replica is not computed again on another:
# three replicas of the real instruct model over one redis-server with
# --shared-write all; a burst over a cold document computes it once (and
# every replica without the wait), a replica stopped mid-prefill is waited
# for --shared-wait seconds only. Skips (77) without the model or Redis.
add_test(NAME server_shared_wait_realmodel
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_shared_wait.py $<TARGET_FILE:cairn>)
set_tests_properties(server_shared_wait_realmodel PROPERTIES TIMEOUT 600 LABELS "server;realmodel"
  SKIP_RETURN_CODE 77 ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL}")
