/*
 * session/records.c — a session's durable record in the store's "records"
 * database: what lets an agent reconnect after a restart and find its
 * conversation where it was.
 *
 *   key   's' + id.hi (8 bytes, big-endian) + id.lo (8 bytes, big-endian)
 *   value "CSR1" | u32 version | u32 flags | u32 key_len |
 *         u64 tenant | u64 n_tokens | u64 checksum | int32 tokens[n_tokens]
 *         | key_len bytes of the session's name (little-endian throughout)
 *
 *   flags    bit 0: persist; bit 1: the history ends with a generated reply
 *            whose turn is not closed yet (see reply_open)
 *   version  2: no name (key_len 0): what every unnamed session still
 *            writes, so an older cairn reads it; 3: a named session;
 *            4: a session with a note (a front end's bytes, session.h): the
 *            header is followed by u32 note_len, and the name by the note's
 *            note_len bytes (2 and 3 stay what a session without one writes)
 *
 * The checksum is XXH3-64 of the key and the value with the checksum field
 * zeroed: a damaged record, or one moved under another session's key, is
 * dropped at start rather than brought back with a wrong history.
 */
#include "session/session_impl.h"

#include <xxhash.h>

#define RECORD_MAGIC "CSR1"
#define RECORD_VERSION_PLAIN 2
#define RECORD_VERSION_NAMED 3
#define RECORD_VERSION_NOTE 4
#define RECORD_HEADER 40
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
    size_t body = RECORD_HEADER + (note ? 4 : 0);
    size_t bytes = body + n * sizeof(int32_t) + name + note;
    uint8_t *v = malloc(bytes), key[17];
    if (!v)
        return CAIRN_ENOMEM;
    uint32_t head[4] = {0, note   ? RECORD_VERSION_NOTE
                           : name ? RECORD_VERSION_NAMED
                                  : RECORD_VERSION_PLAIN,
                        (x->persist ? 1u : 0u) | (x->reply_open ? 2u : 0u), (uint32_t)name};
    memcpy(head, RECORD_MAGIC, 4);
    uint64_t n64 = n, zero = 0;
    memcpy(v, head, 16);
    memcpy(v + 16, &x->tenant, 8);
    memcpy(v + 24, &n64, 8);
    memcpy(v + RECORD_SUM_AT, &zero, 8);
    if (note) {
        uint32_t note32 = (uint32_t)note;
        memcpy(v + RECORD_HEADER, &note32, 4);
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

int record_delete(cairn_service *s, cairn_session_id id, uint64_t cookie)
{
    uint8_t key[17];
    record_key(id, key);
    return cairn_kvcache_record_delete(s->cache, key, sizeof key, cookie);
}

/* One record: its header and body checked against the layout above;
 * *body_out is where its tokens start. */
static bool record_valid(const cairn_service *s, const uint8_t *k, const uint8_t *v,
                         size_t bytes, uint64_t *n_out, uint32_t *name_out, uint32_t *note_out,
                         size_t *body_out)
{
    uint32_t head[4], note = 0;
    uint64_t n, sum;
    memcpy(head, v, 16);
    memcpy(&n, v + 24, 8);
    memcpy(&sum, v + RECORD_SUM_AT, 8);
    const bool plain = head[1] == RECORD_VERSION_PLAIN, named = head[1] == RECORD_VERSION_NAMED;
    const bool noted = head[1] == RECORD_VERSION_NOTE && bytes >= RECORD_HEADER + 4;
    const uint32_t name = head[3];
    if (noted)
        memcpy(&note, v + RECORD_HEADER, 4);
    const size_t body = RECORD_HEADER + (noted ? 4 : 0);
    bool ok = memcmp(head, RECORD_MAGIC, 4) == 0 && (plain || named || noted) &&
              (plain ? name == 0 : named ? name > 0 : true) && name <= RECORD_KEY_MAX &&
              (!noted || (note > 0 && note <= CAIRN_SESSION_NOTE_MAX)) &&
              n <= (uint64_t)s->n_ctx && bytes == body + n * sizeof(int32_t) + name + note &&
              record_checksum(k, v, bytes) == sum;
    for (uint64_t i = 0; ok && i < n; i++) {
        int32_t t;
        memcpy(&t, v + body + i * sizeof t, sizeof t);
        ok = t >= 0 && t < s->n_vocab;
    }
    *n_out = n;
    *name_out = name;
    *note_out = note;
    *body_out = body;
    return ok;
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
    uint64_t n;
    uint32_t name, note;
    size_t body;
    if (!record_valid(s, k, v, bytes, &n, &name, &note, &body)) {
        /* never bring a session back with a history it did not have */
        char hex[33];
        cairn_session_id_to_hex(id, hex);
        cairn_log(CAIRN_LOG_WARN, "service: session record %s failed verification; dropped", hex);
        record_delete(s, id, 0);
        return 0;
    }
    uint32_t flags;
    uint64_t tenant;
    memcpy(&flags, v + 8, 4);
    memcpy(&tenant, v + 16, 8);
    session *x = calloc(1, sizeof *x);
    const uint8_t *tok = v + body;
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
    if (session_adopt(s, x) != CAIRN_OK) {
        free(x->history.v);
        free(x->key);
        free(x->note);
        free(x);
        return 0;
    }
    if (!x->persist)
        record_delete(s, id, 0);
    return 0;
}

void records_load(cairn_service *s)
{
    cairn_kvcache_record_iterate(s->cache, load_record, s);
}

size_t records_write_all(cairn_service *s)
{
    size_t n_rec = 0;
    for (size_t b = 0; b < s->n_buckets; b++)
        for (session *x = s->buckets[b]; x; x = x->next)
            n_rec += record_put(s, x, 0) == CAIRN_OK;
    return n_rec;
}
