/*
 * tests/support/support.h — helpers the C tests share, so that no test
 * writes its own copy: a service with a runtime of its own (service.c).
 *
 * Everything here is test code: it aborts the test (cmocka's fail_msg) or
 * returns a status, never hides a failure, and asserts nothing of its own
 * about the code under test.
 */
#ifndef CAIRN_TESTS_SUPPORT_H
#define CAIRN_TESTS_SUPPORT_H

#include "session/session.h"

/* Open a CPU runtime over model_path (n_threads, draft_path: an EAGLE head
 * or NULL) sized for cfg's batch, and start a service on it with cfg (whose
 * `runtime` is filled in). On failure nothing is left open. */
int support_service_start(const char *model_path, int n_threads, const char *draft_path,
                          cairn_service_config *cfg, cairn_service **out, char *err,
                          size_t err_len);
/* Stop the service and close the runtime it was started on. NULL: no-op. */
void support_service_stop(cairn_service *svc);

#endif /* CAIRN_TESTS_SUPPORT_H */
