/*
 * server/msgpack/scan.c — the validating msgpack scanner and the reader over
 * validated bytes (see msgpack.h for the contract).
 *
 * Both decode a value's header the same way, with mp_header(): the header
 * length, the payload length that follows it (str/bin/ext and fixed-size
 * scalars are all "payload" here) and the number of child items (arrays: n,
 * maps: 2n). Everything else is bookkeeping on top of that one table.
 */
#include "server/msgpack/msgpack.h"

#include <string.h>

void cairn_mp_limits_default(cairn_mp_limits *lim)
{
    lim->max_message_bytes = 8u << 20;
    lim->max_depth = 24; /* room for a JSON schema sent as a map (response_format) */
    lim->max_string_bytes = 4u << 20;
    lim->max_array_len = 1u << 20;
    lim->max_map_len = 1u << 16;
}

static uint64_t be16(const uint8_t *p) { return (uint64_t)p[0] << 8 | p[1]; }
static uint64_t be32(const uint8_t *p) { return be16(p) << 16 | be16(p + 2); }
static uint64_t be64(const uint8_t *p) { return be32(p) << 32 | be32(p + 4); }

typedef struct {
    cairn_mp_kind kind;
    uint32_t hdr;      /* bytes of the header, type byte included           */
    uint64_t payload;  /* bytes after the header that belong to this value  */
    uint64_t children; /* items that follow (arrays: n; maps: 2n)            */
    uint64_t count;    /* arrays/maps: n as declared; str/bin/ext: length    */
} mp_head;

/* Decode the header starting at p[0] with `avail` bytes present.
 * Returns 1 when decoded, 0 when more bytes are needed, -1 for 0xc1. */
static int mp_header(const uint8_t *p, size_t avail, mp_head *h)
{
    if (avail < 1)
        return 0;
    const uint8_t b = p[0];
    memset(h, 0, sizeof *h);
    h->hdr = 1;
    /* Size of the length field for the variable-length forms. */
    uint32_t lenbytes = 0;
    if (b <= 0x7f || b >= 0xe0) {
        h->kind = b <= 0x7f ? CAIRN_MP_UINT : CAIRN_MP_NINT;
        return 1;
    }
    if (b <= 0x8f) {
        h->kind = CAIRN_MP_MAP;
        h->count = b & 0x0f;
        h->children = 2 * h->count;
        return 1;
    }
    if (b <= 0x9f) {
        h->kind = CAIRN_MP_ARRAY;
        h->count = h->children = b & 0x0f;
        return 1;
    }
    if (b <= 0xbf) {
        h->kind = CAIRN_MP_STR;
        h->count = h->payload = b & 0x1f;
        return 1;
    }
    switch (b) {
    case 0xc0: h->kind = CAIRN_MP_NIL; return 1;
    case 0xc1: return -1;
    case 0xc2: case 0xc3: h->kind = CAIRN_MP_BOOL; return 1;
    case 0xc4: h->kind = CAIRN_MP_BIN; lenbytes = 1; break;
    case 0xc5: h->kind = CAIRN_MP_BIN; lenbytes = 2; break;
    case 0xc6: h->kind = CAIRN_MP_BIN; lenbytes = 4; break;
    case 0xc7: h->kind = CAIRN_MP_EXT; lenbytes = 1; break;
    case 0xc8: h->kind = CAIRN_MP_EXT; lenbytes = 2; break;
    case 0xc9: h->kind = CAIRN_MP_EXT; lenbytes = 4; break;
    case 0xca: h->kind = CAIRN_MP_FLOAT; h->payload = 4; return 1;
    case 0xcb: h->kind = CAIRN_MP_FLOAT; h->payload = 8; return 1;
    case 0xcc: h->kind = CAIRN_MP_UINT; h->payload = 1; return 1;
    case 0xcd: h->kind = CAIRN_MP_UINT; h->payload = 2; return 1;
    case 0xce: h->kind = CAIRN_MP_UINT; h->payload = 4; return 1;
    case 0xcf: h->kind = CAIRN_MP_UINT; h->payload = 8; return 1;
    case 0xd0: h->kind = CAIRN_MP_NINT; h->payload = 1; return 1;
    case 0xd1: h->kind = CAIRN_MP_NINT; h->payload = 2; return 1;
    case 0xd2: h->kind = CAIRN_MP_NINT; h->payload = 4; return 1;
    case 0xd3: h->kind = CAIRN_MP_NINT; h->payload = 8; return 1;
    /* fixext: a type byte and 1..16 data bytes */
    case 0xd4: h->kind = CAIRN_MP_EXT; h->count = 1; h->payload = 2; return 1;
    case 0xd5: h->kind = CAIRN_MP_EXT; h->count = 2; h->payload = 3; return 1;
    case 0xd6: h->kind = CAIRN_MP_EXT; h->count = 4; h->payload = 5; return 1;
    case 0xd7: h->kind = CAIRN_MP_EXT; h->count = 8; h->payload = 9; return 1;
    case 0xd8: h->kind = CAIRN_MP_EXT; h->count = 16; h->payload = 17; return 1;
    case 0xd9: h->kind = CAIRN_MP_STR; lenbytes = 1; break;
    case 0xda: h->kind = CAIRN_MP_STR; lenbytes = 2; break;
    case 0xdb: h->kind = CAIRN_MP_STR; lenbytes = 4; break;
    case 0xdc: h->kind = CAIRN_MP_ARRAY; lenbytes = 2; break;
    case 0xdd: h->kind = CAIRN_MP_ARRAY; lenbytes = 4; break;
    case 0xde: h->kind = CAIRN_MP_MAP; lenbytes = 2; break;
    case 0xdf: h->kind = CAIRN_MP_MAP; lenbytes = 4; break;
    default: return -1; /* unreachable: every byte value is covered above */
    }
    h->hdr = 1 + lenbytes;
    if (avail < h->hdr)
        return 0;
    uint64_t n = lenbytes == 1 ? p[1] : lenbytes == 2 ? be16(p + 1) : be32(p + 1);
    h->count = n;
    switch (h->kind) {
    case CAIRN_MP_ARRAY: h->children = n; break;
    case CAIRN_MP_MAP: h->children = 2 * n; break;
    case CAIRN_MP_EXT: h->payload = n + 1; break; /* + the ext type byte */
    default: h->payload = n; break;
    }
    return 1;
}

/* ---- scanner ------------------------------------------------------------- */

void cairn_mp_scanner_reset(cairn_mp_scanner *sc, const cairn_mp_limits *lim)
{
    memset(sc, 0, sizeof *sc);
    sc->lim = *lim;
    if (sc->lim.max_depth > CAIRN_MP_DEPTH_CAP)
        sc->lim.max_depth = CAIRN_MP_DEPTH_CAP;
}

void cairn_mp_scanner_skip(cairn_mp_scanner *sc)
{
    if (sc->can_skip)
        sc->skipping = true;
}

/* One item ended: count it against the enclosing containers, closing those
 * that are now full. Returns true when the top-level object ended. */
static bool item_done(cairn_mp_scanner *sc)
{
    while (sc->depth > 0) {
        if (--sc->left[sc->depth - 1] > 0)
            return false;
        sc->depth--; /* this container is complete: an item of its parent */
    }
    return true;
}

/* Items the open containers still expect besides the one being read; each
 * needs at least one more byte, which is what makes a count checkable. */
static uint64_t owed(const cairn_mp_scanner *sc)
{
    uint64_t n = 0;
    for (uint32_t d = 0; d < sc->depth; d++)
        n += sc->left[d];
    return n > 0 ? n - 1 : 0;
}

static int scan_fail(cairn_mp_scanner *sc, int rc, const char *what, bool can_skip)
{
    sc->error = what;
    sc->can_skip = can_skip;
    return rc;
}

int cairn_mp_scan(cairn_mp_scanner *sc, const uint8_t *buf, size_t len, size_t *used,
                  bool *complete)
{
    size_t i = 0;
    *used = 0;
    *complete = false;
    const cairn_mp_limits *lim = &sc->lim;
    for (;;) {
        if (sc->skip_payload > 0) { /* skip mode: a payload partly discarded */
            size_t n = len - i < sc->skip_payload ? len - i : (size_t)sc->skip_payload;
            i += n;
            sc->total += n;
            sc->skip_payload -= n;
            if (sc->skip_payload > 0)
                break;
            if (item_done(sc)) {
                *complete = true;
                break;
            }
            continue;
        }
        mp_head h;
        int got = mp_header(buf + i, len - i, &h);
        if (got < 0) {
            *used = i;
            return scan_fail(sc, CAIRN_EFORMAT, "invalid msgpack byte 0xc1", false);
        }
        if (got == 0)
            break;
        const bool container = h.kind == CAIRN_MP_ARRAY || h.kind == CAIRN_MP_MAP;
        if (!sc->skipping) {
            /* Limits, all checked on the header alone. Each child needs at
             * least one byte, so a count is only honest if that many bytes
             * still fit in the message. */
            const char *what = NULL;
            if ((h.kind == CAIRN_MP_STR || h.kind == CAIRN_MP_BIN || h.kind == CAIRN_MP_EXT) &&
                h.count > lim->max_string_bytes)
                what = "a string or binary value is longer than max_string_bytes";
            else if (h.kind == CAIRN_MP_ARRAY && h.count > lim->max_array_len)
                what = "an array has more elements than max_array_len";
            else if (h.kind == CAIRN_MP_MAP && h.count > lim->max_map_len)
                what = "a map has more entries than max_map_len";
            else if (sc->total + h.hdr + h.payload + h.children + owed(sc) >
                     lim->max_message_bytes)
                what = "the message is larger than max_message_bytes";
            if (what) {
                *used = i;
                return scan_fail(sc, CAIRN_ERANGE, what, sc->depth + (container ? 1 : 0) <=
                                                           CAIRN_MP_DEPTH_CAP);
            }
            if (container && sc->depth + 1 > lim->max_depth) {
                *used = i;
                return scan_fail(sc, CAIRN_ERANGE, "values are nested deeper than max_depth",
                                 sc->depth + 1 <= CAIRN_MP_DEPTH_CAP);
            }
            /* Strict mode consumes an item only once all of it is here. */
            if (len - i < h.hdr + h.payload)
                break;
            i += h.hdr + h.payload;
            sc->total += h.hdr + h.payload;
        } else {
            if (container && sc->depth + 1 > CAIRN_MP_DEPTH_CAP) {
                *used = i;
                return scan_fail(sc, CAIRN_ERANGE, "values are nested too deeply to skip",
                                 false);
            }
            i += h.hdr;
            sc->total += h.hdr;
            sc->skip_payload = h.payload;
            if (h.payload > 0)
                continue; /* the payload step above finishes the item */
        }
        if (container && h.children > 0) {
            sc->left[sc->depth++] = h.children;
            continue;
        }
        if (item_done(sc)) {
            *complete = true;
            break;
        }
    }
    *used = i;
    return CAIRN_OK;
}

int cairn_mp_scan_buffer(const uint8_t *buf, size_t len, const cairn_mp_limits *lim,
                         size_t *obj_len)
{
    cairn_mp_scanner sc;
    cairn_mp_scanner_reset(&sc, lim);
    size_t used;
    bool complete;
    *obj_len = 0;
    int rc = cairn_mp_scan(&sc, buf, len, &used, &complete);
    if (rc == CAIRN_OK && complete)
        *obj_len = used;
    return rc;
}

/* ---- reader -------------------------------------------------------------- */

/* Header of the next value, with the whole header present; 0 when not. */
static bool reader_head(const cairn_mp_reader *r, mp_head *h)
{
    if (r->p >= r->end)
        return false;
    return mp_header(r->p, (size_t)(r->end - r->p), h) == 1;
}

cairn_mp_kind cairn_mp_peek(const cairn_mp_reader *r)
{
    mp_head h;
    return reader_head(r, &h) ? h.kind : CAIRN_MP_NONE;
}

/* Take the next value if it is of `kind` and wholly present; p points at its
 * header on return (the caller decodes from there). */
static int take(cairn_mp_reader *r, cairn_mp_kind kind, mp_head *h, const uint8_t **at)
{
    if (!reader_head(r, h))
        return CAIRN_EFORMAT;
    if (h->kind != kind)
        return CAIRN_EINVAL;
    if ((uint64_t)(r->end - r->p) < h->hdr + h->payload)
        return CAIRN_EFORMAT;
    *at = r->p;
    r->p += h->hdr + h->payload;
    return CAIRN_OK;
}

int cairn_mp_read_nil(cairn_mp_reader *r)
{
    mp_head h;
    const uint8_t *at;
    return take(r, CAIRN_MP_NIL, &h, &at);
}

int cairn_mp_read_bool(cairn_mp_reader *r, bool *out)
{
    mp_head h;
    const uint8_t *at;
    int rc = take(r, CAIRN_MP_BOOL, &h, &at);
    if (rc == CAIRN_OK)
        *out = at[0] == 0xc3;
    return rc;
}

int cairn_mp_read_int(cairn_mp_reader *r, int64_t *out)
{
    mp_head h;
    const uint8_t *at;
    if (cairn_mp_peek(r) == CAIRN_MP_UINT) {
        uint64_t u;
        const uint8_t *save = r->p;
        int rc = cairn_mp_read_uint(r, &u);
        if (rc != CAIRN_OK)
            return rc;
        if (u > (uint64_t)INT64_MAX) {
            r->p = save;
            return CAIRN_ERANGE;
        }
        *out = (int64_t)u;
        return CAIRN_OK;
    }
    int rc = take(r, CAIRN_MP_NINT, &h, &at);
    if (rc != CAIRN_OK)
        return rc;
    switch (at[0]) {
    case 0xd0: *out = (int8_t)at[1]; break;
    case 0xd1: *out = (int16_t)be16(at + 1); break;
    case 0xd2: *out = (int32_t)be32(at + 1); break;
    case 0xd3: *out = (int64_t)be64(at + 1); break;
    default: *out = (int8_t)at[0]; break; /* negative fixint */
    }
    return CAIRN_OK;
}

int cairn_mp_read_uint(cairn_mp_reader *r, uint64_t *out)
{
    mp_head h;
    const uint8_t *at;
    int rc = take(r, CAIRN_MP_UINT, &h, &at);
    if (rc != CAIRN_OK)
        return rc;
    switch (at[0]) {
    case 0xcc: *out = at[1]; break;
    case 0xcd: *out = be16(at + 1); break;
    case 0xce: *out = be32(at + 1); break;
    case 0xcf: *out = be64(at + 1); break;
    default: *out = at[0]; break; /* positive fixint */
    }
    return CAIRN_OK;
}

int cairn_mp_read_number(cairn_mp_reader *r, double *out)
{
    switch (cairn_mp_peek(r)) {
    case CAIRN_MP_UINT: {
        uint64_t u;
        int rc = cairn_mp_read_uint(r, &u);
        if (rc == CAIRN_OK)
            *out = (double)u;
        return rc;
    }
    case CAIRN_MP_NINT: {
        int64_t v;
        int rc = cairn_mp_read_int(r, &v);
        if (rc == CAIRN_OK)
            *out = (double)v;
        return rc;
    }
    case CAIRN_MP_FLOAT: {
        mp_head h;
        const uint8_t *at;
        int rc = take(r, CAIRN_MP_FLOAT, &h, &at);
        if (rc != CAIRN_OK)
            return rc;
        if (at[0] == 0xca) {
            uint32_t bits = (uint32_t)be32(at + 1);
            float f;
            memcpy(&f, &bits, sizeof f);
            *out = f;
        } else {
            uint64_t bits = be64(at + 1);
            memcpy(out, &bits, sizeof *out);
        }
        return CAIRN_OK;
    }
    case CAIRN_MP_NONE: return CAIRN_EFORMAT;
    default: return CAIRN_EINVAL;
    }
}

int cairn_mp_read_str(cairn_mp_reader *r, const char **s, uint32_t *len)
{
    mp_head h;
    const uint8_t *at;
    int rc = take(r, CAIRN_MP_STR, &h, &at);
    if (rc == CAIRN_OK) {
        *s = (const char *)at + h.hdr;
        *len = (uint32_t)h.count;
    }
    return rc;
}

int cairn_mp_read_array(cairn_mp_reader *r, uint32_t *n)
{
    mp_head h;
    const uint8_t *at;
    int rc = take(r, CAIRN_MP_ARRAY, &h, &at);
    if (rc == CAIRN_OK)
        *n = (uint32_t)h.count;
    return rc;
}

int cairn_mp_read_map(cairn_mp_reader *r, uint32_t *n_pairs)
{
    mp_head h;
    const uint8_t *at;
    int rc = take(r, CAIRN_MP_MAP, &h, &at);
    if (rc == CAIRN_OK)
        *n_pairs = (uint32_t)h.count;
    return rc;
}

int cairn_mp_skip(cairn_mp_reader *r)
{
    /* Items still to skip; a container adds its children. A counter instead
     * of recursion, so hostile nesting cannot exhaust the stack. */
    uint64_t pending = 1;
    const uint8_t *p = r->p;
    while (pending > 0) {
        mp_head h;
        if (p >= r->end || mp_header(p, (size_t)(r->end - p), &h) != 1)
            return CAIRN_EFORMAT;
        if ((uint64_t)(r->end - p) < h.hdr + h.payload)
            return CAIRN_EFORMAT;
        /* An honest value has at least one byte per child. */
        if (h.children > (uint64_t)(r->end - p))
            return CAIRN_EFORMAT;
        p += h.hdr + h.payload;
        pending += h.children;
        pending--;
    }
    r->p = p;
    return CAIRN_OK;
}

bool cairn_rpc_peek_msgid(const uint8_t *buf, size_t len, uint32_t *msgid)
{
    mp_head h;
    if (mp_header(buf, len, &h) != 1 || h.kind != CAIRN_MP_ARRAY || h.count < 2)
        return false;
    size_t i = h.hdr;
    if (i >= len || buf[i] != 0x00) /* message type 0 = request */
        return false;
    i++;
    cairn_mp_reader r = cairn_mp_reader_of(buf + i, len - i);
    uint64_t id;
    if (cairn_mp_read_uint(&r, &id) != CAIRN_OK || id > UINT32_MAX)
        return false;
    *msgid = (uint32_t)id;
    return true;
}
