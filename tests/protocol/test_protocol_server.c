/*
 * tests/protocol/test_protocol_server.c — the real `cairn serve`, started as
 * a child process ($CAIRN_BIN serve -m $CAIRN_MODEL --port 0 --unix ...),
 * driven over TCP and over its Unix socket: server.info, a greedy generation
 * with a known continuation, streaming, tokenize/detokenize, sessions,
 * malformed input (garbage, unknown methods, an oversized string, a stalled
 * half message), and a clean exit on SIGTERM.
 *
 * The server's stderr goes to a log file that the test polls for the
 * "listening" line (a pipe could fill up and block the server).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server/msgpack/msgpack.h"
#include "server/server.h"

static pid_t g_pid = -1;
static int g_port = -1;
static char g_sock[108];
static char g_log[256];

static const char *EXPECTED_STORY =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, "
    "she saw";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *read_log(void)
{
    FILE *f = fopen(g_log, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int start_server(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    const char *bin = getenv("CAIRN_BIN"), *model = getenv("CAIRN_MODEL");
    if (!bin || !model) {
        fprintf(stderr, "CAIRN_BIN and CAIRN_MODEL must be set\n");
        return -1;
    }
    snprintf(g_sock, sizeof g_sock, "/tmp/cairn-test-%d.sock", (int)getpid());
    snprintf(g_log, sizeof g_log, "/tmp/cairn-test-%d.log", (int)getpid());
    unlink(g_sock);
    g_pid = fork();
    if (g_pid < 0)
        return -1;
    if (g_pid == 0) {
        int fd = open(g_log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execl(bin, bin, "serve", "-m", model, "--port", "0", "--unix", g_sock, "-t", "1",
              "--idle-timeout", "1", "--max-output", "2M", (char *)NULL);
        _exit(127);
    }
    for (double t0 = now_s(); now_s() - t0 < 120;) {
        int status;
        if (waitpid(g_pid, &status, WNOHANG) == g_pid) {
            fprintf(stderr, "server exited early:\n%s\n", read_log() ? read_log() : "");
            g_pid = -1;
            return -1;
        }
        char *log = read_log();
        char *line = log ? strstr(log, "listening") : NULL;
        if (line && strchr(line, '\n')) {
            char *colon = strstr(line, "127.0.0.1:");
            if (!colon)
                return -1;
            g_port = atoi(colon + strlen("127.0.0.1:"));
            return g_port > 0 ? 0 : -1;
        }
        sleep_ms(20);
    }
    fprintf(stderr, "no 'listening' line from the server\n");
    return -1;
}

static int stop_server(void **state)
{
    (void)state;
    if (g_pid > 0) {
        /* A server that died on its own: show why. */
        if (waitpid(g_pid, NULL, WNOHANG) == g_pid) {
            const char *log = read_log();
            fprintf(stderr, "the server exited during the tests; its log:\n%s\n", log ? log : "");
        } else {
            kill(g_pid, SIGKILL);
            waitpid(g_pid, NULL, 0);
        }
    }
    unlink(g_sock);
    unlink(g_log);
    return 0;
}

/* ---- a tiny blocking client ---------------------------------------------------- */

static int connect_tcp(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static int connect_unix(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, g_sock);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void send_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n > 0);
        p += n;
        len -= (size_t)n;
    }
}

typedef struct {
    int fd;
    char buf[1 << 20];
    size_t len;
    char *cur; /* the last message: msgpack-c's objects point into it */
} client;

static client *client_new(int fd)
{
    client *c = calloc(1, sizeof *c);
    c->fd = fd;
    return c;
}

static void client_free(client *c)
{
    close(c->fd);
    free(c->cur);
    free(c);
}

/* Read the next whole message into *u. Returns false on EOF/reset or after
 * timeout_s without a complete message. */
static bool next_message(client *c, msgpack_unpacked *u, double timeout_s)
{
    cairn_mp_limits lim;
    cairn_mp_limits_default(&lim);
    double t0 = now_s();
    for (;;) {
        size_t n = 0;
        if (c->len > 0 && cairn_mp_scan_buffer((uint8_t *)c->buf, c->len, &lim, &n) == CAIRN_OK &&
            n > 0) {
            size_t off = 0;
            free(c->cur);
            c->cur = malloc(n);
            memcpy(c->cur, c->buf, n);
            msgpack_unpacked_init(u);
            assert_int_equal(msgpack_unpack_next(u, c->cur, n, &off), MSGPACK_UNPACK_SUCCESS);
            memmove(c->buf, c->buf + n, c->len - n);
            c->len -= n;
            return true;
        }
        double left = timeout_s - (now_s() - t0);
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        assert_true(c->len < sizeof c->buf);
        ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
        if (got <= 0)
            return false;
        c->len += (size_t)got;
    }
}

/* True when the server closes the connection within timeout_s (any data
 * before the close is ignored). */
static bool wait_closed(client *c, double timeout_s)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char tmp[4096];
        ssize_t got = read(c->fd, tmp, sizeof tmp);
        if (got <= 0)
            return true;
    }
    return false;
}

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} msg;

static void put_str(msg *m, const char *s)
{
    msgpack_pack_str(&m->pk, strlen(s));
    msgpack_pack_str_body(&m->pk, s, strlen(s));
}

static void request_head(msg *m, uint32_t msgid, const char *method, uint32_t n_pairs)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&m->pk, 4);
    msgpack_pack_uint8(&m->pk, 0);
    msgpack_pack_uint32(&m->pk, msgid);
    put_str(m, method);
    msgpack_pack_array(&m->pk, 1);
    msgpack_pack_map(&m->pk, n_pairs);
}

static void send_msg(client *c, msg *m)
{
    send_all(c->fd, m->sb.data, m->sb.size);
    msgpack_sbuffer_destroy(&m->sb);
}

static const msgpack_object *map_get(const msgpack_object *o, const char *key)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
            return &kv->val;
    }
    return NULL;
}

static bool str_is(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, strlen(s)) == 0;
}

/* Wait for the response to `msgid` (skipping notifications, which are
 * appended to *notes when given). Returns the response array. */
static msgpack_object response(client *c, uint32_t msgid, msgpack_unpacked *u, int *n_notes,
                               char *notes_text, size_t notes_cap)
{
    for (;;) {
        assert_true(next_message(c, u, 60));
        msgpack_object o = u->data;
        assert_int_equal(o.type, MSGPACK_OBJECT_ARRAY);
        if (o.via.array.size == 3 && o.via.array.ptr[0].via.u64 == 2) {
            assert_true(str_is(&o.via.array.ptr[1], "gen.delta"));
            const msgpack_object *d = &o.via.array.ptr[2].via.array.ptr[0];
            assert_int_equal(map_get(d, "request")->via.u64, msgid);
            if (n_notes)
                (*n_notes)++;
            const msgpack_object *t = map_get(d, "text");
            if (notes_text && strlen(notes_text) + t->via.str.size < notes_cap)
                strncat(notes_text, t->via.str.ptr, t->via.str.size);
            msgpack_unpacked_destroy(u);
            continue;
        }
        assert_int_equal(o.via.array.size, 4);
        assert_int_equal(o.via.array.ptr[0].via.u64, 1);
        assert_int_equal(o.via.array.ptr[1].via.u64, msgid);
        return o;
    }
}

/* The error map of a response (NULL when it succeeded). */
static const msgpack_object *error_of(const msgpack_object *resp)
{
    const msgpack_object *e = &resp->via.array.ptr[2];
    return e->type == MSGPACK_OBJECT_NIL ? NULL : e;
}

static int64_t error_code(const msgpack_object *resp)
{
    const msgpack_object *e = error_of(resp);
    assert_non_null(e);
    assert_non_null(map_get(e, "type"));
    assert_non_null(map_get(e, "message"));
    return map_get(e, "code")->via.i64;
}

static void check_server_info(client *c, uint32_t msgid)
{
    msg m;
    request_head(&m, msgid, "server.info", 0);
    send_msg(c, &m);
    msgpack_unpacked u;
    msgpack_object r = response(c, msgid, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    const msgpack_object *res = &r.via.array.ptr[3];
    assert_non_null(map_get(res, "version"));
    const msgpack_object *model = map_get(res, "model");
    assert_non_null(model);
    assert_true(str_is(map_get(model, "arch"), "llama"));
    assert_true(map_get(model, "n_vocab")->via.u64 > 0);
    assert_true(map_get(model, "n_ctx")->via.u64 > 0);
    assert_int_equal(map_get(res, "page_size")->via.u64, 16);
    assert_int_equal(map_get(map_get(res, "limits"), "max_depth")->via.u64, 24);
    msgpack_unpacked_destroy(&u);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_info_tcp_and_unix(void **state)
{
    (void)state;
    client *a = client_new(connect_tcp());
    check_server_info(a, 1);
    client *b = client_new(connect_unix());
    check_server_info(b, 2);
    /* The socket file is private to its owner. */
    struct stat st;
    assert_int_equal(stat(g_sock, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    client_free(a);
    client_free(b);
}

static void generate_story(client *c, uint32_t msgid, bool stream)
{
    msg m;
    request_head(&m, msgid, "generate", 4);
    put_str(&m, "prompt");
    put_str(&m, "Once upon a time");
    put_str(&m, "max_tokens");
    msgpack_pack_int(&m.pk, 32);
    put_str(&m, "temperature");
    msgpack_pack_double(&m.pk, 0.0);
    put_str(&m, "stream");
    if (stream)
        msgpack_pack_true(&m.pk);
    else
        msgpack_pack_false(&m.pk);
    send_msg(c, &m);
    msgpack_unpacked u;
    int n_notes = 0;
    char streamed[4096] = "";
    msgpack_object r = response(c, msgid, &u, &n_notes, streamed, sizeof streamed);
    assert_null(error_of(&r));
    const msgpack_object *res = &r.via.array.ptr[3];
    const msgpack_object *text = map_get(res, "text");
    assert_non_null(text);
    char got[4096];
    snprintf(got, sizeof got, "%.*s", (int)text->via.str.size, text->via.str.ptr);
    assert_string_equal(got, EXPECTED_STORY);
    assert_true(str_is(map_get(res, "finish_reason"), "length"));
    assert_int_equal(map_get(res, "tokens")->via.array.size, 32);
    const msgpack_object *usage = map_get(res, "usage");
    assert_int_equal(map_get(usage, "completion_tokens")->via.u64, 32);
    assert_true(map_get(usage, "prompt_tokens")->via.u64 > 0);
    if (stream) {
        assert_true(n_notes > 0);
        assert_string_equal(streamed, EXPECTED_STORY);
    } else {
        assert_int_equal(n_notes, 0);
    }
    msgpack_unpacked_destroy(&u);
}

static void test_generate_greedy(void **state)
{
    (void)state;
    client *c = client_new(connect_tcp());
    generate_story(c, 10, false);
    client_free(c);
    client *u = client_new(connect_unix());
    generate_story(u, 11, true);
    client_free(u);
}

static void test_tokenize_roundtrip(void **state)
{
    (void)state;
    client *c = client_new(connect_tcp());
    msg m;
    request_head(&m, 20, "tokenize", 2);
    put_str(&m, "text");
    put_str(&m, "Lily liked the park.");
    put_str(&m, "add_bos");
    msgpack_pack_false(&m.pk);
    send_msg(c, &m);
    msgpack_unpacked u;
    msgpack_object r = response(c, 20, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    const msgpack_object *toks = map_get(&r.via.array.ptr[3], "tokens");
    assert_true(toks->via.array.size > 0);
    request_head(&m, 21, "detokenize", 1);
    put_str(&m, "tokens");
    msgpack_pack_object(&m.pk, *toks);
    msgpack_unpacked_destroy(&u);
    send_msg(c, &m);
    r = response(c, 21, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    const msgpack_object *text = map_get(&r.via.array.ptr[3], "text");
    char got[256];
    snprintf(got, sizeof got, "%.*s", (int)text->via.str.size, text->via.str.ptr);
    assert_non_null(strstr(got, "Lily liked the park."));
    msgpack_unpacked_destroy(&u);

    /* A token id outside the vocab is an invalid request. */
    request_head(&m, 22, "detokenize", 1);
    put_str(&m, "tokens");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 1 << 30);
    send_msg(c, &m);
    r = response(c, 22, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -1);
    msgpack_unpacked_destroy(&u);
    client_free(c);
}

static void test_sessions(void **state)
{
    (void)state;
    client *c = client_new(connect_tcp());
    msg m;
    msgpack_unpacked u;
    request_head(&m, 30, "session.open", 1);
    put_str(&m, "text");
    put_str(&m, "Once upon a time");
    send_msg(c, &m);
    msgpack_object r = response(c, 30, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    const msgpack_object *sid = map_get(&r.via.array.ptr[3], "session_id");
    assert_non_null(sid);
    assert_int_equal(sid->via.str.size, 32);
    char id[33];
    memcpy(id, sid->via.str.ptr, 32);
    id[32] = '\0';
    int64_t n_open = (int64_t)map_get(&r.via.array.ptr[3], "n_tokens")->via.u64;
    assert_true(n_open > 0);
    msgpack_unpacked_destroy(&u);

    /* Generating in the session continues the story like a plain generate. */
    request_head(&m, 31, "session.generate", 3);
    put_str(&m, "session_id");
    put_str(&m, id);
    put_str(&m, "max_tokens");
    msgpack_pack_int(&m.pk, 32);
    put_str(&m, "temperature");
    msgpack_pack_int(&m.pk, 0);
    send_msg(c, &m);
    r = response(c, 31, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    const msgpack_object *text = map_get(&r.via.array.ptr[3], "text");
    assert_int_equal(text->via.str.size, strlen(EXPECTED_STORY));
    assert_memory_equal(text->via.str.ptr, EXPECTED_STORY, strlen(EXPECTED_STORY));
    msgpack_unpacked_destroy(&u);

    request_head(&m, 32, "session.info", 1);
    put_str(&m, "session_id");
    put_str(&m, id);
    send_msg(c, &m);
    r = response(c, 32, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    assert_int_equal(map_get(&r.via.array.ptr[3], "n_tokens")->via.u64, n_open + 32);
    msgpack_unpacked_destroy(&u);

    request_head(&m, 33, "session.close", 1);
    put_str(&m, "session_id");
    put_str(&m, id);
    send_msg(c, &m);
    r = response(c, 33, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    msgpack_unpacked_destroy(&u);

    request_head(&m, 34, "session.info", 1);
    put_str(&m, "session_id");
    put_str(&m, id);
    send_msg(c, &m);
    r = response(c, 34, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -6); /* not_found */
    msgpack_unpacked_destroy(&u);

    request_head(&m, 35, "session.info", 1); /* not 32 hex digits */
    put_str(&m, "session_id");
    put_str(&m, "xyz");
    send_msg(c, &m);
    r = response(c, 35, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -1);
    msgpack_unpacked_destroy(&u);

    request_head(&m, 36, "cache.stats", 0);
    send_msg(c, &m);
    r = response(c, 36, &u, NULL, NULL, 0);
    assert_null(error_of(&r));
    assert_true(map_get(&r.via.array.ptr[3], "queries")->via.u64 >= 1);
    assert_non_null(map_get(&r.via.array.ptr[3], "hit_rate"));
    msgpack_unpacked_destroy(&u);
    client_free(c);
}

static void test_malformed_input(void **state)
{
    (void)state;
    /* Garbage: not msgpack-RPC, no msgid -> the connection is closed (or an
     * error answered); either way the server serves the next client. */
    client *g = client_new(connect_tcp());
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(g->fd, junk, sizeof junk - 1);
    assert_true(wait_closed(g, 30));
    client_free(g);
    client *g2 = client_new(connect_unix());
    const uint8_t never_valid[] = {0xc1, 0xc1, 0xc1};
    send_all(g2->fd, never_valid, sizeof never_valid);
    assert_true(wait_closed(g2, 30));
    client_free(g2);

    client *c = client_new(connect_tcp());
    check_server_info(c, 40);

    /* Answerable: an unknown method; the connection stays usable. */
    msg m;
    msgpack_unpacked u;
    request_head(&m, 41, "no.such.method", 0);
    send_msg(c, &m);
    msgpack_object r = response(c, 41, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -1);
    assert_true(r.via.array.ptr[3].type == MSGPACK_OBJECT_NIL);
    msgpack_unpacked_destroy(&u);

    /* A prompt one byte over max_string_bytes: too_large, and the stream is
     * resynchronised (the rest of the message is skipped, not buffered). */
    size_t big = (4u << 20) + 1;
    char *text = malloc(big + 1);
    memset(text, 'a', big);
    text[big] = '\0';
    request_head(&m, 42, "generate", 1);
    put_str(&m, "prompt");
    put_str(&m, text);
    free(text);
    send_msg(c, &m);
    r = response(c, 42, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -7);
    assert_true(str_is(map_get(error_of(&r), "type"), "too_large"));
    msgpack_unpacked_destroy(&u);
    check_server_info(c, 43);

    /* A hostile header: array32 claiming 2^32-1 params -> too_large. */
    const uint8_t hostile[] = {0x94, 0x00, 0x2c, 0xab, 's', 'e', 'r', 'v', 'e', 'r', '.',
                               'i', 'n', 'f', 'o', 0xdd, 0xff, 0xff, 0xff, 0xff};
    send_all(c->fd, hostile, sizeof hostile);
    r = response(c, 44, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -7);
    msgpack_unpacked_destroy(&u);
    client_free(c);

    /* Nesting deeper than max_depth (24): too_large, then back in sync. */
    c = client_new(connect_tcp());
    uint8_t deep[64] = {0x94, 0x00, 0x2e, 0xab, 's', 'e', 'r', 'v', 'e', 'r', '.',
                        'i', 'n', 'f', 'o'};
    size_t n_deep = 15;
    for (int i = 0; i < 28; i++)
        deep[n_deep++] = 0x91;
    deep[n_deep++] = 0xc0;
    send_all(c->fd, deep, n_deep);
    r = response(c, 46, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -7);
    msgpack_unpacked_destroy(&u);
    check_server_info(c, 47);

    /* A byte that is never msgpack after a readable msgid: the error is
     * answered, then the connection is closed (it cannot be resynchronised). */
    const uint8_t broken[] = {0x94, 0x00, 0x30, 0xc1, 0x01, 0x02};
    send_all(c->fd, broken, sizeof broken);
    r = response(c, 48, &u, NULL, NULL, 0);
    assert_int_equal(error_code(&r), -1);
    msgpack_unpacked_destroy(&u);
    shutdown(c->fd, SHUT_WR);
    assert_true(wait_closed(c, 30));
    client_free(c);

    /* Half a message, then silence: closed after the idle timeout (1 s in
     * this test's server), so it cannot hold resources forever. */
    client *h = client_new(connect_tcp());
    const uint8_t half[] = {0x94, 0x00, 0x01};
    send_all(h->fd, half, sizeof half);
    assert_true(wait_closed(h, 30));
    client_free(h);

    /* Still serving. */
    client *d = client_new(connect_unix());
    check_server_info(d, 45);
    client_free(d);
}

/* A client that sends requests but never reads the answers is disconnected
 * once its unread output passes --max-output (2M here); others are served. */
static void test_backpressure(void **state)
{
    (void)state;
    client *c = client_new(connect_tcp());
    size_t len = 500000;
    char *text = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        text[i] = "Once upon a time, a dog. "[i % 25];
    text[len] = '\0';
    msg m;
    request_head(&m, 0, "tokenize", 1);
    put_str(&m, "text");
    put_str(&m, text);
    free(text);
    /* ~40 x 500 KB of answers: far beyond 2M plus the kernel's buffers. */
    bool send_failed = false;
    for (int i = 0; i < 40 && !send_failed; i++) {
        m.sb.data[2] = (char)i; /* msgid: positive fixint at offset 2 */
        const char *p = m.sb.data;
        size_t left = m.sb.size;
        while (left > 0) {
            ssize_t n = write(c->fd, p, left);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* the server has reset the connection */
                send_failed = true;
                break;
            }
            p += n;
            left -= (size_t)n;
        }
    }
    msgpack_sbuffer_destroy(&m.sb);
    assert_true(wait_closed(c, 60));
    client_free(c);
    client *d = client_new(connect_tcp());
    check_server_info(d, 1);
    client_free(d);
}

/* Must run last: SIGTERM stops the server cleanly with exit status 0. */
static void test_sigterm(void **state)
{
    (void)state;
    /* A client in the middle of a generation does not prevent shutdown. */
    client *c = client_new(connect_tcp());
    msg m;
    request_head(&m, 50, "generate", 2);
    put_str(&m, "prompt");
    put_str(&m, "Once upon a time");
    put_str(&m, "max_tokens");
    msgpack_pack_int(&m.pk, 200);
    send_msg(c, &m);
    assert_int_equal(kill(g_pid, SIGTERM), 0);
    int status = 0;
    pid_t got = 0;
    for (double t0 = now_s(); got == 0 && now_s() - t0 < 60; sleep_ms(20))
        got = waitpid(g_pid, &status, WNOHANG);
    assert_int_equal(got, g_pid);
    g_pid = -1;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    struct stat st;
    assert_int_not_equal(stat(g_sock, &st), 0); /* the socket file is removed */
    client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_tcp_and_unix),
        cmocka_unit_test(test_generate_greedy),
        cmocka_unit_test(test_tokenize_roundtrip),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_malformed_input),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_sigterm),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
