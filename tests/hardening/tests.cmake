# Hardening (docs/security.md): the real `cairn serve` under load and under
# faults -- misbehaving clients, disk faults, corruption, SIGKILL during a
# write storm. Python (needs the `msgpack` package, like tests/server).
# The load test can run longer by hand: CAIRN_LOAD_SECONDS=600 (see its
# docstring).
foreach(t load connections disk_faults)
  add_test(NAME hardening_${t}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_${t}.py
            $<TARGET_FILE:cairn> ${CAIRN_MODEL})
  set_tests_properties(hardening_${t} PROPERTIES TIMEOUT 600 LABELS "hardening")
endforeach()
