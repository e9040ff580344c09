/*
 * store/disk_records.c — the disk tier's durability calls: the durable
 * fence (cairn_disk_sync) and durable records (put / delete / get through
 * the queue, and the blocking read / iterate on the calling thread). Apart
 * from disk.c because records are not pages: their own database, never
 * evicted, no namespace.
 */
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- durability and records --------------------------------------------- */

int cairn_disk_sync(cairn_disk *d, uint64_t cookie)
{
    if (!d)
        return CAIRN_EINVAL;
    disk_req *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    r->op = CAIRN_DISK_SYNC;
    r->cookie = cookie;
    return disk_enqueue(d, r);
}

static bool record_key_ok(const cairn_disk *d, const void *key, size_t key_len)
{
    return key && key_len > 0 && key_len <= (size_t)mdb_env_get_maxkeysize(d->env);
}

static int record_request(cairn_disk *d, cairn_disk_op op, const void *key, size_t key_len,
                          const void *value, size_t value_bytes, uint64_t cookie)
{
    if (!d || !record_key_ok(d, key, key_len) || (value_bytes && !value) ||
        value_bytes > CAIRN_DISK_RECORD_MAX_BYTES)
        return CAIRN_EINVAL;
    disk_req *r = malloc(sizeof *r + key_len + value_bytes);
    if (!r)
        return CAIRN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->op = op;
    r->cookie = cookie;
    r->key_len = key_len;
    r->bytes = key_len + value_bytes;
    memcpy(r->data, key, key_len);
    if (value_bytes)
        memcpy(r->data + key_len, value, value_bytes);
    return disk_enqueue(d, r);
}

int cairn_disk_record_put(cairn_disk *d, const void *key, size_t key_len, const void *value,
                          size_t value_bytes, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_PUT, key, key_len, value, value_bytes, cookie);
}

int cairn_disk_record_delete(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_DELETE, key, key_len, NULL, 0, cookie);
}

int cairn_disk_record_get(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_GET, key, key_len, NULL, 0, cookie);
}

int cairn_disk_record_read(cairn_disk *d, const void *key, size_t key_len, void **value,
                           size_t *value_bytes)
{
    if (!d || !record_key_ok(d, key, key_len) || !value || !value_bytes)
        return CAIRN_EINVAL;
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return disk_map_mdb(rc);
    MDB_val k = {key_len, (void *)key}, v;
    rc = mdb_get(txn, d->db_records, &k, &v);
    int out = disk_map_mdb(rc);
    if (rc == MDB_SUCCESS) {
        void *copy = malloc(v.mv_size ? v.mv_size : 1);
        if (!copy) {
            out = CAIRN_ENOMEM;
        } else {
            memcpy(copy, v.mv_data, v.mv_size);
            *value = copy;
            *value_bytes = v.mv_size;
        }
    }
    mdb_txn_abort(txn);
    return out;
}

int cairn_disk_record_iterate(cairn_disk *d, cairn_disk_record_fn fn, void *user)
{
    if (!d || !fn)
        return CAIRN_EINVAL;
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return disk_map_mdb(rc);
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, d->db_records, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return disk_map_mdb(rc);
    }
    MDB_val k, v;
    int out = CAIRN_OK;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        out = fn(k.mv_data, k.mv_size, v.mv_data, v.mv_size, user);
        if (out)
            break;
    }
    if (!out && rc != MDB_NOTFOUND)
        out = disk_map_mdb(rc);
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return out;
}
