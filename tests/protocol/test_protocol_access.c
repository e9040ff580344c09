/*
 * tests/protocol/test_protocol_access.c — access control without a server
 * (server/server.h, "Access"): loopback detection, tenant ids, the tenants file,
 * token files and their permissions, the credential checker, the decoder
 * used before authentication, and the `auth` answer and `unauthorized`
 * error on the wire. The real server is exercised by
 * tests/server/test_access.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/msgpack/msgpack.h"
#include "server/server.h"

/* ---- helpers ---------------------------------------------------------------- */

/* [0, msgid, method, [{key: value-string}]] (key NULL: empty map) */
static void pack_request(msgpack_sbuffer *sb, uint32_t msgid, const char *method,
                         const char *key, const char *value)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, 0);
    msgpack_pack_uint32(&pk, msgid);
    msgpack_pack_str_with_body(&pk, method, strlen(method));
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, key ? 1 : 0);
    if (key) {
        msgpack_pack_str_with_body(&pk, key, strlen(key));
        msgpack_pack_str_with_body(&pk, value, strlen(value));
    }
}

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/cairn-access-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

/* ---- tests -------------------------------------------------------------------- */

static void test_loopback(void **state)
{
    (void)state;
    const char *yes[] = {"127.0.0.1", "127.0.0.2", "127.255.255.254", "::1",
                         "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"};
    const char *no[] = {"0.0.0.0", "::", "10.0.0.1", "192.168.1.1", "128.0.0.1",
                        "126.255.255.255", "::2", "::ffff:10.0.0.1", "localhost",
                        "", "127.0.0.1 ", "fe80::1"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        assert_true(cairn_host_is_loopback(yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        if (cairn_host_is_loopback(no[i]))
            fail_msg("'%s' taken for loopback", no[i]);
    }
    assert_true(cairn_host_is_loopback(NULL)); /* no TCP at all */
}

static void test_tenant_id(void **state)
{
    (void)state;
    uint64_t a = cairn_tenant_id("alice", 5), b = cairn_tenant_id("bob", 3);
    assert_int_not_equal(a, 0);
    assert_int_not_equal(b, 0);
    assert_int_not_equal(a, b);
    /* A function of the name alone: the same on every call and process. */
    assert_int_equal(a, cairn_tenant_id("alice", 5));
    assert_int_not_equal(a, cairn_tenant_id("Alice", 5));
    assert_int_not_equal(a, cairn_tenant_id("alice2", 6));
    /* Never 0, whatever the name (0 means "no tenants"). */
    char name[16];
    for (int i = 0; i < 10000; i++) {
        int n = snprintf(name, sizeof name, "t%d", i);
        assert_int_not_equal(cairn_tenant_id(name, (size_t)n), 0);
    }
}

static void test_names_and_tokens(void **state)
{
    (void)state;
    assert_true(cairn_tenant_name_valid("team-a.prod_1", 13));
    assert_false(cairn_tenant_name_valid("", 0));
    assert_false(cairn_tenant_name_valid("a b", 3));
    assert_false(cairn_tenant_name_valid("a/b", 3));
    char long_name[CAIRN_TENANT_NAME_MAX + 2];
    memset(long_name, 'n', sizeof long_name);
    assert_true(cairn_tenant_name_valid(long_name, CAIRN_TENANT_NAME_MAX));
    assert_false(cairn_tenant_name_valid(long_name, CAIRN_TENANT_NAME_MAX + 1));

    assert_true(cairn_auth_token_valid("abc!#$%&~", 9));
    assert_false(cairn_auth_token_valid("", 0));
    assert_false(cairn_auth_token_valid("ab c", 4));
    assert_false(cairn_auth_token_valid("ab\tc", 4));
    assert_false(cairn_auth_token_valid("ab\x7f", 3));
    assert_false(cairn_auth_token_valid("caf\xc3\xa9", 5));

    char out[CAIRN_AUTH_TOKEN_MAX + 1], err[200];
    size_t n = 0;
    const char *text = "  tok-123 \r\nsecond line\n";
    assert_int_equal(cairn_token_from_text(text, strlen(text), out, &n, err, sizeof err),
                     CAIRN_OK);
    assert_string_equal(out, "tok-123");
    assert_int_equal(n, 7);
    assert_int_equal(cairn_token_from_text("\nx\n", 3, out, &n, err, sizeof err), CAIRN_EINVAL);
    assert_int_equal(cairn_token_from_text("a b\n", 4, out, &n, err, sizeof err), CAIRN_EINVAL);
    char big[CAIRN_AUTH_TOKEN_MAX + 2];
    memset(big, 'x', sizeof big);
    assert_int_equal(cairn_token_from_text(big, sizeof big, out, &n, err, sizeof err),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_token_from_text(big, CAIRN_AUTH_TOKEN_MAX, out, &n, err, sizeof err),
                     CAIRN_OK);
    assert_int_equal(n, CAIRN_AUTH_TOKEN_MAX);
}

static void test_tenants_file(void **state)
{
    (void)state;
    const char *good = "# tenants\n\n alice\tAAAAtoken \r\nbob BBBBtoken\n  # indented comment\n"
                       "carol CCCCtoken"; /* no final newline */
    cairn_credential *c = NULL;
    size_t n = 0;
    char err[200] = "";
    assert_int_equal(cairn_tenants_parse(good, strlen(good), &c, &n, err, sizeof err), CAIRN_OK);
    assert_int_equal(n, 3);
    assert_string_equal(c[0].name, "alice");
    assert_string_equal(c[0].token, "AAAAtoken");
    assert_string_equal(c[1].name, "bob");
    assert_string_equal(c[1].token, "BBBBtoken");
    assert_string_equal(c[2].name, "carol");
    assert_string_equal(c[2].token, "CCCCtoken");
    cairn_credentials_free(c, n);

    static const struct {
        const char *text, *in_err;
    } bad[] = {
        {"alice tok1\nalice tok2\n", "twice"},
        {"alice tok1\nbob tok1\n", "same token"},
        {"alice\n", "line 1"},
        {"\n\nalice tok extra\n", "line 3"},
        {"al:ice tok\n", "line 1"},
        {"alice to\x01k\n", "line 1"},
        {"", "no tenants"},
        {"# nothing\n   \n", "no tenants"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        c = (cairn_credential *)1;
        int rc = cairn_tenants_parse(bad[i].text, strlen(bad[i].text), &c, &n, err, sizeof err);
        if (rc != CAIRN_EINVAL || !strstr(err, bad[i].in_err))
            fail_msg("case %zu: rc %d, err '%s' (want '%s')", i, rc, err, bad[i].in_err);
        assert_null(c);
        assert_int_equal(n, 0);
    }
}

static void test_secret_files(void **state)
{
    (void)state;
    char path[128], err[300];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/token", g_dir);

    write_file(path, "secret\n", 0600);
    assert_int_equal(cairn_secret_file_read(path, &text, &len, err, sizeof err), CAIRN_OK);
    assert_int_equal(len, 7);
    assert_string_equal(text, "secret\n");
    free(text);

    write_file(path, "secret\n", 0400);
    assert_int_equal(cairn_secret_file_read(path, &text, &len, err, sizeof err), CAIRN_OK);
    free(text);

    const mode_t loose[] = {0640, 0604, 0620, 0602, 0644, 0666};
    for (size_t i = 0; i < sizeof loose / sizeof *loose; i++) {
        write_file(path, "secret\n", loose[i]);
        text = (char *)1;
        assert_int_equal(cairn_secret_file_read(path, &text, &len, err, sizeof err),
                         CAIRN_EINVAL);
        assert_non_null(strstr(err, "chmod 600"));
        assert_null(text);
    }
    assert_int_equal(cairn_secret_file_read(g_dir, &text, &len, err, sizeof err), CAIRN_EINVAL);
    snprintf(path, sizeof path, "%s/missing", g_dir);
    assert_int_equal(cairn_secret_file_read(path, &text, &len, err, sizeof err), CAIRN_EIO);
}

static void test_access_create_rejects(void **state)
{
    (void)state;
    cairn_access *a = NULL;
    char err[200];
    const cairn_credential two_shared[] = {{NULL, "tok1"}, {NULL, "tok2"}};
    const cairn_credential mixed[] = {{"alice", "tok1"}, {NULL, "tok2"}};
    const cairn_credential dup_name[] = {{"alice", "tok1"}, {"alice", "tok2"}};
    const cairn_credential dup_token[] = {{"alice", "tok1"}, {"bob", "tok1"}};
    const cairn_credential bad_token[] = {{"alice", "to k"}};
    const cairn_credential empty_token[] = {{"alice", ""}};
    const cairn_credential null_token[] = {{"alice", NULL}};
    const cairn_credential bad_name[] = {{"al ice", "tok"}};
    const struct {
        const cairn_credential *c;
        size_t n;
    } cases[] = {
        {two_shared, 2}, {mixed, 2}, {dup_name, 2}, {dup_token, 2},
        {bad_token, 1},  {empty_token, 1}, {null_token, 1}, {bad_name, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cairn_access_create(cases[i].c, cases[i].n, &a, err, sizeof err) != CAIRN_EINVAL)
            fail_msg("case %zu accepted", i);
        assert_null(a);
    }
}

static void test_access_check(void **state)
{
    (void)state;
    cairn_access *a = NULL;
    char err[200];
    uint64_t tenant = 99;
    const char *name = "x";

    /* Nothing configured: every token, even none, is accepted as tenant 0. */
    assert_int_equal(cairn_access_create(NULL, 0, &a, err, sizeof err), CAIRN_OK);
    assert_false(cairn_access_required(a));
    assert_false(cairn_access_has_tenants(a));
    assert_int_equal(cairn_access_check(a, "whatever", 8, &tenant, &name), CAIRN_OK);
    assert_int_equal(tenant, 0);
    assert_null(name);
    cairn_access_free(a);
    assert_false(cairn_access_required(NULL));

    /* One shared token. */
    const cairn_credential shared = {NULL, "the-shared-token"};
    assert_int_equal(cairn_access_create(&shared, 1, &a, err, sizeof err), CAIRN_OK);
    assert_true(cairn_access_required(a));
    assert_false(cairn_access_has_tenants(a));
    assert_int_equal(cairn_access_check(a, "the-shared-token", 16, &tenant, &name), CAIRN_OK);
    assert_int_equal(tenant, 0);
    assert_null(name);
    const char *wrong[] = {"", "the-shared-toke", "the-shared-tokenn", "THE-SHARED-TOKEN",
                           "the-shared-tokeN", "x"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++)
        assert_int_equal(cairn_access_check(a, wrong[i], strlen(wrong[i]), &tenant, &name),
                         CAIRN_RPC_UNAUTHORIZED);
    /* The right bytes followed by a NUL are a different token; and a
     * length past the maximum never matches. */
    assert_int_equal(cairn_access_check(a, "the-shared-token\0", 17, &tenant, &name),
                     CAIRN_RPC_UNAUTHORIZED);
    char huge[CAIRN_AUTH_TOKEN_MAX + 10];
    memset(huge, 0, sizeof huge);
    memcpy(huge, "the-shared-token", 16);
    assert_int_equal(cairn_access_check(a, huge, sizeof huge, &tenant, &name),
                     CAIRN_RPC_UNAUTHORIZED);
    assert_int_equal(cairn_access_check(a, NULL, 0, &tenant, &name), CAIRN_RPC_UNAUTHORIZED);
    cairn_access_free(a);

    /* Tenants: each token gives its tenant's id and name. The caller's
     * credentials may go away once the checker is made (it copies). */
    char t1[] = "alice-token", t2[] = "bob-token";
    cairn_credential tenants[] = {{"alice", t1}, {"bob", t2}};
    assert_int_equal(cairn_access_create(tenants, 2, &a, err, sizeof err), CAIRN_OK);
    memset(t1, 'z', strlen(t1));
    memset(t2, 'z', strlen(t2));
    assert_true(cairn_access_has_tenants(a));
    assert_int_equal(cairn_access_check(a, "bob-token", 9, &tenant, &name), CAIRN_OK);
    assert_int_equal(tenant, cairn_tenant_id("bob", 3));
    assert_string_equal(name, "bob");
    assert_int_equal(cairn_access_check(a, "alice-token", 11, &tenant, &name), CAIRN_OK);
    assert_int_equal(tenant, cairn_tenant_id("alice", 5));
    assert_string_equal(name, "alice");
    assert_int_equal(cairn_access_check(a, "zzzzzzzzz", 9, &tenant, &name),
                     CAIRN_RPC_UNAUTHORIZED);
    assert_int_equal(tenant, 0);
    assert_null(name);
    /* A tenant's name is not its token. */
    assert_int_equal(cairn_access_check(a, "alice", 5, &tenant, NULL), CAIRN_RPC_UNAUTHORIZED);
    cairn_access_free(a);

    /* A token of exactly the maximum length. */
    char max_tok[CAIRN_AUTH_TOKEN_MAX + 1];
    memset(max_tok, 'm', CAIRN_AUTH_TOKEN_MAX);
    max_tok[CAIRN_AUTH_TOKEN_MAX] = '\0';
    const cairn_credential longest = {"m", max_tok};
    assert_int_equal(cairn_access_create(&longest, 1, &a, err, sizeof err), CAIRN_OK);
    assert_int_equal(cairn_access_check(a, max_tok, CAIRN_AUTH_TOKEN_MAX, &tenant, NULL),
                     CAIRN_OK);
    assert_int_equal(cairn_access_check(a, max_tok, CAIRN_AUTH_TOKEN_MAX - 1, &tenant, NULL),
                     CAIRN_RPC_UNAUTHORIZED);
    cairn_access_free(a);
}

static void test_preauth_decoder(void **state)
{
    (void)state;
    cairn_rpc_call call;
    cairn_rpc_error err;
    msgpack_sbuffer sb;

    pack_request(&sb, 5, "auth", "token", "abc");
    assert_int_equal(cairn_rpc_decode_preauth((const uint8_t *)sb.data, sb.size, &call, &err),
                     CAIRN_OK);
    assert_int_equal(call.method, CAIRN_RPC_AUTH);
    assert_int_equal(call.msgid, 5);
    assert_int_equal(call.token_len, 3);
    assert_memory_equal(call.token, "abc", 3);
    /* The token points into the message. */
    assert_true(call.token > sb.data && call.token < sb.data + sb.size);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&sb);

    /* Everything else, known or not, is unauthorized before its params
     * are read (this generate's prompt would be tokenized otherwise, and
     * there is no vocab here). */
    const char *others[] = {"server.info", "generate", "tokenize", "session.info", "nope"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        pack_request(&sb, 9, others[i], "prompt", "text");
        int rc = cairn_rpc_decode_preauth((const uint8_t *)sb.data, sb.size, &call, &err);
        assert_int_equal(rc, CAIRN_RPC_UNAUTHORIZED);
        assert_true(err.has_msgid);
        assert_int_equal(err.msgid, 9);
        assert_int_equal(err.code, CAIRN_RPC_UNAUTHORIZED);
        msgpack_sbuffer_destroy(&sb);
    }

    /* auth without a token, or with one that is not a string. */
    pack_request(&sb, 3, "auth", NULL, NULL);
    assert_int_equal(cairn_rpc_decode_preauth((const uint8_t *)sb.data, sb.size, &call, &err),
                     CAIRN_RPC_INVALID_REQUEST);
    assert_true(err.has_msgid);
    msgpack_sbuffer_destroy(&sb);

    /* Not a request at all: nothing to answer. */
    static const uint8_t junk[] = {0x93, 0x01, 0x02, 0x03};
    assert_int_not_equal(cairn_rpc_decode_preauth(junk, sizeof junk, &call, &err), CAIRN_OK);
    assert_false(err.has_msgid);

    /* After authentication the full decoder knows `auth` too. */
    const cairn_api api = {.vocab = NULL, .n_vocab = 512, .n_ctx = 512};
    cairn_rpc_context ctx = {.api = &api};
    cairn_mp_limits_default(&ctx.limits);
    pack_request(&sb, 11, "auth", "token", "xyz");
    assert_int_equal(cairn_rpc_decode(&ctx, (const uint8_t *)sb.data, sb.size, NULL, &call, &err),
                     CAIRN_OK);
    assert_int_equal(call.method, CAIRN_RPC_AUTH);
    assert_int_equal(call.token_len, 3);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&sb);
    assert_string_equal(cairn_rpc_method_name(CAIRN_RPC_AUTH), "auth");
}

static void test_wire(void **state)
{
    (void)state;
    assert_string_equal(cairn_rpc_error_type(CAIRN_RPC_UNAUTHORIZED), "unauthorized");
    assert_int_equal(cairn_rpc_error_code(CAIRN_RPC_UNAUTHORIZED), CAIRN_RPC_UNAUTHORIZED);
    assert_int_equal(CAIRN_RPC_UNAUTHORIZED, -13);

    msgpack_sbuffer sb;
    msgpack_unpacked u;
    /* error response */
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_error(&sb, 4, CAIRN_RPC_UNAUTHORIZED, "no"), CAIRN_OK);
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    msgpack_object_map *m = &u.data.via.array.ptr[2].via.map;
    bool saw_type = false, saw_code = false;
    for (uint32_t i = 0; i < m->size; i++) {
        msgpack_object_str k = m->ptr[i].key.via.str;
        if (k.size == 4 && memcmp(k.ptr, "type", 4) == 0) {
            msgpack_object_str v = m->ptr[i].val.via.str;
            assert_int_equal(v.size, 12);
            assert_memory_equal(v.ptr, "unauthorized", 12);
            saw_type = true;
        }
        if (k.size == 4 && memcmp(k.ptr, "code", 4) == 0) {
            assert_int_equal(m->ptr[i].val.via.i64, -13);
            saw_code = true;
        }
    }
    assert_true(saw_type && saw_code);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* auth answers */
    for (int with_name = 0; with_name < 2; with_name++) {
        msgpack_sbuffer_init(&sb);
        assert_int_equal(cairn_rpc_pack_auth(&sb, 8, with_name ? "alice" : NULL), CAIRN_OK);
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
        msgpack_object *arr = u.data.via.array.ptr;
        assert_int_equal(u.data.via.array.size, 4);
        assert_int_equal(arr[0].via.u64, 1);
        assert_int_equal(arr[1].via.u64, 8);
        assert_int_equal(arr[2].type, MSGPACK_OBJECT_NIL);
        assert_int_equal(arr[3].via.map.size, 1);
        msgpack_object_kv *kv = arr[3].via.map.ptr;
        assert_memory_equal(kv->key.via.str.ptr, "tenant", 6);
        if (with_name) {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_STR);
            assert_memory_equal(kv->val.via.str.ptr, "alice", 5);
        } else {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_NIL);
        }
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loopback),
        cmocka_unit_test(test_tenant_id),
        cmocka_unit_test(test_names_and_tokens),
        cmocka_unit_test(test_tenants_file),
        cmocka_unit_test(test_secret_files),
        cmocka_unit_test(test_access_create_rejects),
        cmocka_unit_test(test_access_check),
        cmocka_unit_test(test_preauth_decoder),
        cmocka_unit_test(test_wire),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
