/*
 * session/records.c — a session's durable record in the store's "records"
 * database: what lets an agent reconnect after a restart and find its
 * conversation where it was.
 *
 *   key   's' + id.hi (8 bytes, big-endian) + id.lo (8 bytes, big-endian)
 *   value "CSR1" | u32 version | u32 flags | u32 key_len |
 *         u64 tenant | u64 n_tokens | u64 checksum |
 *         [version 4, 5: u64 vocabulary | u32 note_len] |
 *         [version 5: i64 created | i64 expires] |
 *         int32 tokens[n_tokens] | key_len bytes of the session's name |
 *         [note_len bytes of its note] (little-endian throughout)
 *
 *   flags      bit 0: persist; bit 1: the history ends with a generated
 *              reply whose turn is not closed yet (see reply_open);
 *              bit 2 (version 5): a stored response (session.h)
 *   version    2: no name (key_len 0); 3: a named session; 4 (what this
 *              cairn writes): name optional, the vocabulary field, and a
 *              note (note_len 0..CAIRN_SESSION_NOTE_MAX: a front end's
 *              bytes kept with the session, session.h); 5: version 4
 *              and the Unix times a stored response was created and
 *              expires (0: never; fixed at creation from the TTL then in
 *              force, so a restart under another --responses-ttl neither
 *              shortens nor stretches it; only stored responses are written as
 *              5, so a user's sessions stay readable by a cairn that
 *              knows version 4). A version 2-4 record with a note and no
 *              name is a stored response written before version 5 (see
 *              load_record) and is rewritten as 5.
 *   vocabulary XXH3-64 of the vocabulary the tokens are ids of (its size
 *              and every token's text, see records_vocab_id)
 *
 * The checksum is XXH3-64 of the key and the value with the checksum field
 * zeroed: a damaged record, or one moved under another session's key, is
 * dropped at start rather than brought back with a wrong history. Only
 * that: a sound record that this server cannot take — written under
 * another vocabulary (`-m` another model), or longer than this server's
 * context (a smaller `-c`) — is the user's conversation all the same. It
 * is kept on disk untouched and skipped (a warning says why), and comes
 * back when the server is started as it was. (A cairn older than version 4
 * records drops version 4 records as damaged: do not go back to one over
 * a cache directory with sessions in it.)
 */
#include "session/session_impl.h"

#include <time.h>
#include <xxhash.h>

#define RECORD_MAGIC "CSR1"
#define RECORD_VERSION_PLAIN 2
#define RECORD_VERSION_NAMED 3
#define RECORD_VERSION_VOCAB 4
#define RECORD_HEADER 40    /* up to the tokens in versions 2 and 3          */
#define RECORD_VERSION_RESPONSE 5
#define RECORD_HEADER_V4 52 /* version 4: + vocabulary and note_len          */
#define RECORD_HEADER_V5 68 /* version 5: + created, expires                 */
#define RECORD_FLAG_RESPONSE 4u
#define RECORD_SUM_AT 32
#define RECORD_KEY_MAX 1024 /* bytes of a session's name */

static uint64_t record_checksum(const uint8_t key[17], const uint8_t *value, size_t bytes)
{
    /* the key, then the value with its checksum field read as zero */
    static const uint8_t zero[8];
    uint64_t h = XXH3_64bits(key, 17);
    h = XXH3_64bits_withSeed(value, RECORD_SUM_AT, h);
    h = XXH3_64bits_withSeed(zero, 8, h);
    return XXH3_64bits_withSeed(value + RECORD_HEADER, bytes - RECORD_HEADER, h);
}

static void record_key(cairn_session_id id, uint8_t key[17])
{
    key[0] = 's';
    for (int i = 0; i < 8; i++) {
        key[1 + i] = (uint8_t)(id.hi >> (56 - 8 * i));
        key[9 + i] = (uint8_t)(id.lo >> (56 - 8 * i));
    }
}

int record_put(cairn_service *s, const session *x, uint64_t cookie)
{
    size_t n = x->history.n, name = x->key ? x->key_len : 0, note = x->note ? x->note_len : 0;
    size_t body = x->response ? RECORD_HEADER_V5 : RECORD_HEADER_V4;
    size_t bytes = body + n * sizeof(int32_t) + name + note;
    uint8_t *v = malloc(bytes), key[17];
    if (!v)
        return CAIRN_ENOMEM;
    uint32_t head[4] = {0, x->response ? RECORD_VERSION_RESPONSE : RECORD_VERSION_VOCAB,
                        (x->persist ? 1u : 0u) | (x->reply_open ? 2u : 0u) |
                            (x->response ? RECORD_FLAG_RESPONSE : 0u),
                        (uint32_t)name};
    memcpy(head, RECORD_MAGIC, 4);
    uint64_t n64 = n, zero = 0;
    memcpy(v, head, 16);
    memcpy(v + 16, &x->tenant, 8);
    memcpy(v + 24, &n64, 8);
    memcpy(v + RECORD_SUM_AT, &zero, 8);
    const uint32_t note_len = (uint32_t)note;
    memcpy(v + RECORD_HEADER, &s->vocab_id, 8);
    memcpy(v + RECORD_HEADER + 8, &note_len, 4);
    if (x->response) {
        memcpy(v + RECORD_HEADER_V4, &x->created, 8);
        memcpy(v + RECORD_HEADER_V4 + 8, &x->expires, 8);
    }
    if (n)
        memcpy(v + body, x->history.v, n * sizeof(int32_t));
    if (name)
        memcpy(v + body + n * sizeof(int32_t), x->key, name);
    if (note)
        memcpy(v + body + n * sizeof(int32_t) + name, x->note, note);
    record_key(x->id, key);
    uint64_t sum = record_checksum(key, v, bytes);
    memcpy(v + RECORD_SUM_AT, &sum, 8);
    int rc = cairn_kvcache_record_put(s->cache, key, sizeof key, v, bytes, cookie);
    free(v);
    return rc;
}

uint64_t records_vocab_id(const cairn_vocab *vocab, int n_vocab)
{
    /* the ids' meaning: the vocabulary's size and each token's text, in
     * order (a model of the same tokenizer with other weights shares it) */
    XXH3_state_t *st = XXH3_createState();
    uint64_t n64 = (uint64_t)n_vocab, h = n64;
    if (!st)
        return h;
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &n64, sizeof n64);
    for (int32_t t = 0; vocab && t < cairn_vocab_n_tokens(vocab); t++) {
        const char *text = cairn_vocab_token_text(vocab, t);
        XXH3_64bits_update(st, text ? text : "", text ? strlen(text) + 1 : 1);
    }
    h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

int record_delete(cairn_service *s, cairn_session_id id, uint64_t cookie)
{
    uint8_t key[17];
    record_key(id, key);
    return cairn_kvcache_record_delete(s->cache, key, sizeof key, cookie);
}

void record_unshare(cairn_service *s, cairn_session_id id)
{
    if (!s->have_shared)
        return;
    uint8_t key[17];
    record_key(id, key);
    cairn_kvcache_unshare_record(s->cache, key, sizeof key);
}

/* What a record is to this server. */
typedef enum {
    RECORD_SOUND,   /* taken                                                */
    RECORD_DAMAGED, /* fails its layout or checksum: deleted                */
    RECORD_FOREIGN, /* sound, but not for this configuration: kept, skipped */
} record_verdict;

/* Where a sound record's parts are. */
typedef struct {
    size_t body;   /* offset of the tokens */
    uint64_t n;    /* tokens               */
    uint32_t name; /* bytes of the name    */
    uint32_t note; /* bytes of the note    */
    bool response; /* a stored response (version 5) */
    int64_t created; /* its creation time     */
    int64_t expires; /* when it expires (0: never) */
} record_layout;

/* One record checked against the layout above. *why says what makes a
 * foreign one foreign. */
static record_verdict record_check(const cairn_service *s, const uint8_t *k, const uint8_t *v,
                                   size_t bytes, record_layout *out, const char **why)
{
    uint32_t head[4];
    uint64_t n, sum, vocab = s->vocab_id;
    memcpy(head, v, 16);
    memcpy(&n, v + 24, 8);
    memcpy(&sum, v + RECORD_SUM_AT, 8);
    const uint32_t version = head[1], name = head[3];
    const bool v5 = version == RECORD_VERSION_RESPONSE;
    const bool v4 = version == RECORD_VERSION_VOCAB || v5; /* 5 is 4 and more */
    const size_t body = v5 ? RECORD_HEADER_V5 : v4 ? RECORD_HEADER_V4 : RECORD_HEADER;
    uint32_t note = 0;
    if (v4 && bytes >= body)
        memcpy(&note, v + RECORD_HEADER + 8, 4);
    bool ok = memcmp(head, RECORD_MAGIC, 4) == 0 &&
              (version == RECORD_VERSION_PLAIN ? name == 0
               : version == RECORD_VERSION_NAMED ? name > 0 && name <= RECORD_KEY_MAX
               : v4 && name <= RECORD_KEY_MAX && note <= CAIRN_SESSION_NOTE_MAX) &&
              bytes >= body && n <= (bytes - body) / sizeof(int32_t) &&
              bytes == body + n * sizeof(int32_t) + name + note &&
              record_checksum(k, v, bytes) == sum;
    if (!ok)
        return RECORD_DAMAGED;
    if (v4)
        memcpy(&vocab, v + RECORD_HEADER, 8);
    *out = (record_layout){.body = body, .n = n, .name = name, .note = note};
    if (v5) {
        out->response = (head[2] & RECORD_FLAG_RESPONSE) != 0;
        memcpy(&out->created, v + RECORD_HEADER_V4, 8);
        memcpy(&out->expires, v + RECORD_HEADER_V4 + 8, 8);
    }
    if (vocab != s->vocab_id) {
        *why = "it was written under another vocabulary (another model)";
        return RECORD_FOREIGN;
    }
    if (n > (uint64_t)s->n_ctx) {
        *why = "its history is longer than this server's context (-c)";
        return RECORD_FOREIGN;
    }
    for (uint64_t i = 0; i < n; i++) {
        int32_t t;
        memcpy(&t, v + body + i * sizeof t, sizeof t);
        if (t < 0 || t >= s->n_vocab) {
            *why = "it holds token ids outside this model's vocabulary";
            return RECORD_FOREIGN;
        }
    }
    return RECORD_SOUND;
}

/* Sessions from the records on disk: persisted ones, and — after a graceful
 * stop — every session that was open. Records of sessions that were not
 * persisted are deleted once read, so a later crash cannot bring back a
 * stale history. */
static int load_record(const void *key, size_t key_len, const void *value, size_t bytes,
                       void *user)
{
    cairn_service *s = user;
    const uint8_t *k = key, *v = value;
    if (key_len != 17 || k[0] != 's' || bytes < RECORD_HEADER)
        return 0;
    cairn_session_id id = {0, 0};
    for (int i = 0; i < 8; i++) {
        id.hi = id.hi << 8 | k[1 + i];
        id.lo = id.lo << 8 | k[9 + i];
    }
    record_layout lay = {.body = RECORD_HEADER};
    const char *why = NULL;
    char hex[33];
    switch (record_check(s, k, v, bytes, &lay, &why)) {
    case RECORD_SOUND:
        break;
    case RECORD_DAMAGED:
        /* never bring a session back with a history it did not have */
        cairn_session_id_to_hex(id, hex);
        cairn_log(CAIRN_LOG_WARN, "service: session record %s is damaged (layout or checksum); "
                  "dropped", hex);
        record_delete(s, id, 0); /* this copy only: the shared tier's is checked apart */
        return 0;
    case RECORD_FOREIGN:
        /* the user's conversation: never deleted for how the server started */
        cairn_session_id_to_hex(id, hex);
        cairn_log(CAIRN_LOG_WARN, "service: session %s kept on disk but not loaded: %s; start the "
                  "server as it was to get it back", hex, why);
        s->records_skipped++;
        return 0;
    }
    if (lay.response) {
        /* a stored response past its TTL is not brought back (its pages
         * stay in the cache); the user's sessions never expire */
        session probe = {.response = true, .created = lay.created, .expires = lay.expires};
        if (response_expired(s, &probe, (int64_t)time(NULL))) {
            record_delete(s, id, 0);
            record_unshare(s, id);
            s->resp_expired++;
            return 0;
        }
    }
    uint32_t flags;
    uint64_t tenant;
    memcpy(&flags, v + 8, 4);
    memcpy(&tenant, v + 16, 8);
    session *x = calloc(1, sizeof *x);
    const uint8_t *tok = v + lay.body;
    const uint64_t n = lay.n;
    const uint32_t name = lay.name, note = lay.note;
    const uint8_t *note_at = tok + n * sizeof(int32_t) + name;
    if (x && note && (x->note = malloc(note))) {
        memcpy(x->note, note_at, note);
        x->note_len = note;
    }
    if (!x || tokvec_append(&x->history, (const int32_t *)tok, (size_t)n) ||
        (name && session_set_key(x, (const char *)tok + n * sizeof(int32_t), name)) ||
        (note && !x->note)) {
        if (x) {
            free(x->history.v);
            free(x->key);
            free(x->note);
        }
        free(x);
        return 0;
    }
    x->id = id;
    x->persist = flags & 1;
    x->reply_open = (flags & 2) != 0;
    x->tenant = tenant;
    /* Before version 5 a stored response was written as a plain session,
     * and only the Responses front end gave an unnamed session a note
     * (`cairn chat` notes named ones): such a record is a stored response,
     * made now as far as its TTL goes, and is written again as one so that
     * the TTL then runs on across restarts. Without this a server wedged by
     * them before the upgrade would stay wedged. */
    const bool legacy = !lay.response && lay.body != RECORD_HEADER_V5 && note && !name;
    x->response = lay.response || legacy;
    x->created = legacy ? (int64_t)time(NULL) : lay.created;
    x->expires = legacy ? response_deadline(s, x->created) : lay.expires;
    if (session_adopt(s, x) != CAIRN_OK) {
        free(x->history.v);
        free(x->key);
        free(x->note);
        free(x);
        return 0;
    }
    if (legacy && x->persist)
        record_put(s, x, 0);
    if (!x->persist) {
        /* in memory now, and not durable: a copy left behind could bring it
         * back after a crash with an older history than its last reply */
        record_delete(s, id, 0);
        record_unshare(s, id);
    }
    return 0;
}

bool records_lookup(cairn_service *s, cairn_request *r)
{
    if (!s->have_shared || r->session_looked_up)
        return false;
    lookup *l = calloc(1, sizeof *l);
    if (!l)
        return false; /* answered as not found: no worse than without Redis */
    uint8_t key[17];
    record_key(r->session, key);
    l->cookie = ++s->next_cookie;
    if (cairn_kvcache_record_get(s->cache, key, sizeof key, l->cookie) != CAIRN_OK) {
        free(l);
        return false;
    }
    l->req = r;
    l->next = s->lookups;
    s->lookups = l;
    return true;
}

bool records_lookup_done(cairn_service *s, uint64_t cookie, int status, void *data, size_t bytes)
{
    for (lookup **pp = &s->lookups; *pp; pp = &(*pp)->next) {
        lookup *l = *pp;
        if (l->cookie != cookie)
            continue;
        *pp = l->next;
        cairn_request *r = l->req;
        free(l);
        r->session_looked_up = true;
        if (status == CAIRN_OK && data && !session_find(s, r->session)) {
            uint8_t key[17];
            record_key(r->session, key);
            size_t before = s->n_sessions;
            load_record(key, sizeof key, data, bytes, s);
            /* a stored response taken over counts toward max_responses */
            responses_trim(s, s->cfg.max_responses, session_find(s, r->session));
            if (s->n_sessions > before) {
                char hex[33];
                cairn_session_id_to_hex(r->session, hex);
                cairn_log(CAIRN_LOG_INFO, "service: session %s taken over from its record", hex);
            }
        }
        free(data);
        intake_handle(s, r);
        return true;
    }
    free(data);
    return false;
}

void records_load(cairn_service *s)
{
    cairn_kvcache_record_iterate(s->cache, load_record, s);
    responses_loaded(s);
}

size_t records_write_all(cairn_service *s)
{
    size_t n_rec = 0;
    for (size_t b = 0; b < s->n_buckets; b++)
        for (session *x = s->buckets[b]; x; x = x->next)
            n_rec += record_put(s, x, 0) == CAIRN_OK;
    return n_rec;
}
