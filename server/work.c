/*
 * server/work.c — text work off the loop thread. Decoding a request
 * (tokenizing a long document, rendering a chat template, compiling a
 * grammar) takes milliseconds to seconds; on the loop it would stall every
 * socket, inside an engine step every generation. libuv's threadpool runs
 * it; the result comes back to the loop thread, which alone touches
 * connections.
 */
#include "server/server_impl.h"

#include <string.h>

#include <stdlib.h>

static void run_work(uv_work_t *req)
{
    srv_work *w = req->data;
    w->work(w);
}

static void after_work(uv_work_t *req, int status)
{
    (void)status; /* UV_ECANCELED: never cancelled, every item finishes */
    srv_work *w = req->data;
    /* the connection may have gone meanwhile: then it is not in the table */
    srv_conn *c = srv_conn_find(w->srv, w->conn_id);
    w->done(w, c && !c->closing ? c : NULL);
}

int srv_work_queue(cairn_server *s, srv_work *w)
{
    w->srv = s;
    w->req.data = w;
    return uv_queue_work(&s->loop, &w->req, run_work, after_work) == 0 ? CAIRN_OK : CAIRN_ENOMEM;
}

static void calls_work(srv_work *w)
{
    srv_calls *k = (srv_calls *)w;
    const cairn_event *ev = &k->node->ev;
    const bool cut = ev->finish_reason && strcmp(ev->finish_reason, "length") == 0;
    cairn_api_reply(&w->srv->api, ev->text, ev->text_len, k->tools_json, k->prefix, cut,
                    &k->reasoning, &k->calls_json, &k->content);
}

static void calls_done(srv_work *w, srv_conn *c)
{
    srv_calls *k = (srv_calls *)w;
    k->answer(k, c);
    srv_calls_free(k);
}

int srv_calls_queue(cairn_server *s, srv_calls *k, uint64_t conn_id)
{
    k->w.conn_id = conn_id;
    k->w.work = calls_work;
    k->w.done = calls_done;
    return srv_work_queue(s, &k->w);
}

void srv_calls_free(srv_calls *k)
{
    if (!k)
        return;
    free(k->node);
    free(k->tools_json);
    free(k->calls_json);
    free(k->content);
    free(k->reasoning);
    free(k);
}

uint64_t srv_next_seed(cairn_server *s)
{
    return cairn_splitmix64(&s->seed_state);
}
