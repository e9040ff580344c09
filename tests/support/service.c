/*
 * tests/support/service.c — a service on a runtime of its own, for tests
 * that drive the engine thread without a server (support.h).
 */
#include "tests/support/support.h"

#include <stdio.h>

int support_service_start(const char *model_path, int n_threads, const char *draft_path,
                          cairn_service_config *cfg, cairn_service **out, char *err,
                          size_t err_len)
{
    cairn_runtime_config rc_cfg = {
        .model_path = model_path, .device = {CAIRN_DEVICE_CPU, 0}, .n_threads = n_threads,
        .max_batch_tokens = cfg->max_batch_tokens > 0 ? cfg->max_batch_tokens : 512,
        .max_seqs = cfg->max_seqs > 0 ? cfg->max_seqs : 32, .draft_path = draft_path};
    cairn_runtime *rt = NULL;
    int rc = cairn_runtime_open(&rc_cfg, &rt, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cfg->runtime = rt;
    rc = cairn_service_start(cfg, out, err, err_len);
    if (rc != CAIRN_OK)
        cairn_runtime_close(rt);
    return rc;
}

void support_service_stop(cairn_service *svc)
{
    if (!svc)
        return;
    cairn_runtime *rt = cairn_service_runtime(svc);
    cairn_service_stop(svc);
    cairn_runtime_close(rt);
}
