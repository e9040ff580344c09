# The independent numpy reference of the forward pass (tests/ref/llama_ref.py).
# These tests check the reference itself, so that the C forward-pass tests can
# trust it. They need numpy and gguf (scripts/setup.sh --test); without them
# the scripts exit 77 and ctest reports the tests as skipped.

# Greedy decoding of stories260K from a fixed prompt must give exactly the
# sequence llama.cpp produces for the same model and prompt.
add_test(NAME ref_numpy_greedy
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/llama_ref.py ${CAIRN_MODEL}
          --tokens 1,403,407,261,378 --greedy 32
          --expect "432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394")

# The --out / --hidden file layout the C tests rely on.
add_test(NAME ref_numpy_files
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_ref_files.py ${CAIRN_MODEL}
          ${CMAKE_CURRENT_BINARY_DIR}/ref_numpy_files)

set_tests_properties(ref_numpy_greedy ref_numpy_files PROPERTIES
  TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "ref")
