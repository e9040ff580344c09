# The suffix drafter on token sequences built in the test: matches in the
# request and the corpus, frequency weighting, tenants apart, the ring's
# bound, draft depth by match length.
cairn_add_test(spec_suffix
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_suffix.c
  LABELS spec
  TIMEOUT 60)
