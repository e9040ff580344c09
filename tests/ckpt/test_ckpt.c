/*
 * tests/ckpt/test_ckpt.c — the checkpoint reader (ckpt/ckpt.h) on the tiny
 * folders tools/ckpt/make_synthetic.py writes (CAIRN_CKPT_SYNTH):
 *
 *   - every quantized folder (AWQ, GPTQ with act-order and asymmetric
 *     zeros, whole-row groups, compressed-tensors int4 likewise, FP8 per
 *     tensor / channel / block): each
 *     repacked linear weight, decoded by cairn_dequantize_row and put back in
 *     the checkpoint's input order, equals the Python tool's own dequantized
 *     reference (ref/NAME.dequant.safetensors) bit for bit;
 *   - the same for the committed folders of tests/data/ckpt/indep
 *     (CAIRN_CKPT_INDEP), whose tensors other packages packed (vLLM,
 *     compressed-tensors) and whose references those packages' readers gave;
 *   - the BF16 folders (one file, three shards) and the F16 outlier load;
 *   - every broken folder is refused with a message, never a crash (the
 *     ASan job runs this too);
 *   - the model fingerprint: the same folder twice gives the same one, two
 *     formats of the same model never do.
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/support.h"

#include "ckpt/ckpt.h"
#include "kernels/backend.h"
#include "model/model.h"

static const char *synth_dir(void)
{
    const char *d = getenv("CAIRN_CKPT_SYNTH");
    return d && d[0] ? d : NULL;
}

/* A float32 tensor of a reference .safetensors file, read the plain way. */
static float *read_ref(const char *path, const char *name, int64_t *n_out, int64_t *n_in)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint64_t n = 0;
    float *out = NULL;
    if (fread(&n, 8, 1, f) == 1 && n < (1u << 26)) {
        char *hdr = malloc(n + 1);
        if (hdr && fread(hdr, 1, n, f) == n) {
            json_t *j = json_loadb(hdr, n, 0, NULL);
            json_t *t = json_object_get(j, name);
            json_t *shape = json_object_get(t, "shape"), *off = json_object_get(t, "data_offsets");
            if (t && json_array_size(shape) == 2 &&
                strcmp(json_string_value(json_object_get(t, "dtype")), "F32") == 0) {
                *n_out = json_integer_value(json_array_get(shape, 0));
                *n_in = json_integer_value(json_array_get(shape, 1));
                const long begin = (long)json_integer_value(json_array_get(off, 0));
                out = malloc((size_t)(*n_out * *n_in) * sizeof *out);
                if (out && (fseek(f, (long)(8 + n) + begin, SEEK_SET) != 0 ||
                            fread(out, sizeof *out, (size_t)(*n_out * *n_in), f) !=
                                (size_t)(*n_out * *n_in))) {
                    free(out);
                    out = NULL;
                }
            }
            json_decref(j);
        }
        free(hdr);
    }
    fclose(f);
    return out;
}

static const struct {
    const char *hf, *gguf;
} LINEAR[] = {
    {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_proj", "ffn_gate"},  {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

/* Every linear weight of folder base/name against base/ref/name.dequant.safetensors;
 * returns how many weights were compared. */
static int check_quantized_in(const char *base, const char *name, cairn_type want_type)
{
    char dir[1024], ref[1024], err[512] = "";
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    snprintf(ref, sizeof ref, "%s/ref/%s.dequant.safetensors", base, name);
    cairn_gguf *g = NULL;
    int rc = cairn_ckpt_open(dir, &g, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("%s: %s", name, err);
    int compared = 0, permuted = 0;
    for (int l = 0; l < 64; l++) {
        for (size_t i = 0; i < sizeof LINEAR / sizeof LINEAR[0]; i++) {
            char hf[160], gname[96], pname[96];
            snprintf(hf, sizeof hf, "model.layers.%d.%s.weight", l, LINEAR[i].hf);
            snprintf(gname, sizeof gname, "blk.%d.%s.weight", l, LINEAR[i].gguf);
            snprintf(pname, sizeof pname, "blk.%d.%s.input_perm", l, LINEAR[i].gguf);
            const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, gname);
            if (!t)
                continue;
            int64_t n_out = 0, n_in = 0;
            float *want = read_ref(ref, hf, &n_out, &n_in);
            if (!want)
                fail_msg("%s: no reference for %s in %s", name, hf, ref);
            assert_int_equal(t->type, want_type);
            assert_int_equal(t->ne[0], n_in);
            assert_int_equal(t->ne[1], n_out);
            const cairn_gguf_tensor *p = cairn_gguf_find_tensor(g, pname);
            const int32_t *perm = p ? p->data : NULL;
            permuted += perm != NULL;
            float *row = malloc((size_t)n_in * sizeof *row);
            const size_t row_bytes = cairn_type_row_bytes(t->type, n_in);
            for (int64_t o = 0; o < n_out; o++) {
                assert_int_equal(cairn_dequantize_row(t->type, (const uint8_t *)t->data +
                                                                   (size_t)o * row_bytes,
                                                      row, n_in),
                                 CAIRN_OK);
                for (int64_t j = 0; j < n_in; j++) {
                    const int64_t col = perm ? perm[j] : j;
                    const float w = want[o * n_in + col];
                    if (memcmp(&row[j], &w, sizeof w) != 0)
                        fail_msg("%s %s [%lld, %lld]: cairn %a, reference %a", name, hf,
                                 (long long)o, (long long)col, (double)row[j], (double)w);
                }
            }
            free(row);
            free(want);
            compared++;
        }
    }
    if (strstr(name, "actorder"))
        assert_true(permuted > 0); /* act-order must have produced input orders */
    else
        assert_int_equal(permuted, 0);
    cairn_gguf_close(g);
    return compared;
}

static int check_quantized(const char *name, cairn_type want_type)
{
    return check_quantized_in(synth_dir(), name, want_type);
}

static void test_quantized_exact(void **state)
{
    (void)state;
    if (!synth_dir())
        KT_SKIP("CAIRN_CKPT_SYNTH (the synthetic checkpoint folders) is not set");
    static const struct {
        const char *name;
        cairn_type type;
    } folders[] = {
        {"awq-g64", CAIRN_TYPE_Q4_Z},          {"gptq-g32", CAIRN_TYPE_Q4_Z},
        {"gptq-gall", CAIRN_TYPE_Q4_Z},        {"gptq-actorder-asym", CAIRN_TYPE_Q4_Z},
        {"ct-int4-g32", CAIRN_TYPE_Q4_Z},      {"ct-int4-actorder-asym", CAIRN_TYPE_Q4_Z},
        {"fp8-tensor", CAIRN_TYPE_F8_E4M3},    {"fp8-tensor-scalar", CAIRN_TYPE_F8_E4M3},
        {"fp8-channel", CAIRN_TYPE_F8_E4M3},   {"fp8-block", CAIRN_TYPE_F8_E4M3},
    };
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++)
        assert_true(check_quantized(folders[i].name, folders[i].type) >= 14);
}

/* Folders whose quantized tensors were packed by code the project did not
 * write (vLLM's awq_pack / gptq_pack, compressed-tensors' compressor), with
 * references from those packages' own readers (vLLM's AWQ dequantization
 * kernel, compressed-tensors' unpack + dequantize): committed under
 * tests/data/ckpt/indep by tools/ckpt/make_indep_fixture.py, PROVENANCE.md
 * there. Unlike the synthetic folders, reader and packer cannot share one
 * misreading of a format here. */
static void test_independent_writers_exact(void **state)
{
    (void)state;
    const char *base = getenv("CAIRN_CKPT_INDEP");
    if (!base || !base[0])
        fail_msg("CAIRN_CKPT_INDEP (tests/data/ckpt/indep) is not set");
    static const char *const names[] = {"awq-g32", "gptq-actorder-asym-g32",
                                        "ct-int4-actorder-asym-g32"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        assert_int_equal(check_quantized_in(base, names[i], CAIRN_TYPE_Q4_Z), 7);
}

static cairn_model *load(cairn_backend *be, const char *name, char *err, size_t err_len)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", synth_dir(), name);
    cairn_model_params mp = {.max_batch_tokens = 8, .max_seqs = 1};
    cairn_model *m = NULL;
    return cairn_model_load(dir, be, &mp, &m, err, err_len) == CAIRN_OK ? m : NULL;
}

static void test_models_load_and_fingerprint(void **state)
{
    (void)state;
    if (!synth_dir())
        KT_SKIP("CAIRN_CKPT_SYNTH (the synthetic checkpoint folders) is not set");
    cairn_backend *be = NULL;
    assert_int_equal(cairn_backend_cpu_create(1, &be), CAIRN_OK);
    static const char *const names[] = {"bf16", "bf16-shards3", "awq-g64", "gptq-actorder-asym",
                                        "fp8-block", "ct-int4-g32"};
    enum { N = sizeof names / sizeof names[0] };
    uint8_t fp[N][16], again[16];
    char err[512];
    for (int i = 0; i < N; i++) {
        cairn_model *m = load(be, names[i], err, sizeof err);
        if (!m)
            fail_msg("%s: %s", names[i], err);
        cairn_model_fingerprint(m, fp[i]);
        assert_int_equal(cairn_model_hparams(m)->n_layer, 2);
        cairn_model_free(m);
    }
    cairn_model *m = load(be, "bf16", err, sizeof err);
    assert_non_null(m);
    cairn_model_fingerprint(m, again);
    cairn_model_free(m);
    assert_memory_equal(fp[0], again, 16);
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            assert_memory_not_equal(fp[i], fp[j], 16);
    /* the same quantized weights in two layouts (GPTQ and compressed-tensors,
     * both act-order asymmetric from one quantizer) are one model: one
     * fingerprint, so they share cached prefixes */
    m = load(be, "gptq-actorder-asym", err, sizeof err);
    assert_non_null(m);
    cairn_model_fingerprint(m, fp[0]);
    cairn_model_free(m);
    m = load(be, "ct-int4-actorder-asym", err, sizeof err);
    if (!m)
        fail_msg("ct-int4-actorder-asym: %s", err);
    cairn_model_fingerprint(m, again);
    cairn_model_free(m);
    assert_memory_equal(fp[0], again, 16);
    cairn_backend_destroy(be);
}

/* What each broken folder of bad/MANIFEST.json must be refused with: the
 * status, and a piece of the message that names the MANIFEST's `why` (the
 * file, tensor or setting at fault). dtype-mismatch is not here: F16 loads. */
static const struct {
    const char *name;
    int rc;
    const char *says;
} broken_expected[] = {
    {"truncated-header", CAIRN_EFORMAT, "model.safetensors: header length 2656 does not fit"},
    {"header-len-past-eof", CAIRN_EFORMAT, "model.safetensors: header length 284368 does not fit"},
    {"header-len-huge", CAIRN_EFORMAT, "header length 9223372036854775816 does not fit"},
    {"offsets-out-of-range", CAIRN_EFORMAT, "'model.norm.weight' data [280640, 280768) runs past"},
    {"offsets-overlap", CAIRN_EFORMAT,
     "'model.layers.0.input_layernorm.weight' and "
     "'model.layers.0.post_attention_layernorm.weight' overlap"},
    {"offsets-reversed", CAIRN_EFORMAT, "'model.norm.weight' has invalid data_offsets"},
    {"size-mismatch", CAIRN_EFORMAT,
     "'model.norm.weight' is 128 bytes, but BF16 of 128 elements needs 256"},
    {"shape-mismatch", CAIRN_EFORMAT,
     "'model.layers.1.self_attn.q_proj.weight' (model.safetensors) has shape [32, 128], "
     "config.json implies [64, 64]"},
    {"dtype-unknown", CAIRN_EUNSUPPORTED, "'model.layers.0.mlp.up_proj.weight' has dtype 'Q4_K'"},
    {"header-not-json", CAIRN_EFORMAT, "model.safetensors: the header is not a JSON object"},
    {"missing-tensor", CAIRN_EFORMAT, "missing tensor 'model.layers.1.mlp.down_proj.weight'"},
    {"unknown-quant-method", CAIRN_EUNSUPPORTED, "quant_method 'made-up-q3' is not supported"},
    {"gptq-bits-3", CAIRN_EUNSUPPORTED, "gptq with 3 bits is not supported"},
    {"missing-shard", CAIRN_ENOTFOUND, "model-00002-of-00003.safetensors: No such file"},
    {"index-wrong-shard", CAIRN_EFORMAT,
     "names 'model.norm.weight' in model-00001-of-00003.safetensors, which does not hold it"},
    {"no-config", CAIRN_ENOTFOUND, "without config.json"},
    {"empty-file", CAIRN_EFORMAT, "model.safetensors: truncated (0 bytes"},
};
enum { N_BROKEN = sizeof broken_expected / sizeof broken_expected[0] };

static void test_broken_folders_refused(void **state)
{
    (void)state;
    if (!synth_dir())
        KT_SKIP("CAIRN_CKPT_SYNTH (the synthetic checkpoint folders) is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/bad/MANIFEST.json", synth_dir());
    json_t *manifest = json_load_file(path, 0, NULL);
    assert_non_null(manifest);
    const char *name;
    json_t *why;
    int refused = 0;
    bool seen[N_BROKEN] = {false};
    json_object_foreach(manifest, name, why)
    {
        char dir[1024], err[512] = "";
        snprintf(dir, sizeof dir, "%s/bad/%s", synth_dir(), name);
        cairn_gguf *g = NULL;
        const int rc = cairn_ckpt_open(dir, &g, err, sizeof err);
        if (strcmp(name, "dtype-mismatch") == 0) {
            /* F16 is a weight type cairn runs: it must load, as F16 */
            if (rc != CAIRN_OK)
                fail_msg("%s: %s", name, err);
            const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, "blk.0.ffn_up.weight");
            assert_non_null(t);
            assert_int_equal(t->type, CAIRN_TYPE_F16);
            cairn_gguf_close(g);
            continue;
        }
        if (rc == CAIRN_OK)
            fail_msg("broken folder %s (%s) was accepted", name, json_string_value(why));
        int k = 0;
        while (k < N_BROKEN && strcmp(broken_expected[k].name, name) != 0)
            k++;
        if (k == N_BROKEN)
            fail_msg("broken folder %s (%s) has no expected refusal here: %s", name,
                     json_string_value(why), err);
        seen[k] = true;
        if (rc != broken_expected[k].rc || !strstr(err, broken_expected[k].says))
            fail_msg("broken folder %s (%s): refused with %d \"%s\", expected %d \"...%s...\"",
                     name, json_string_value(why), rc, err, broken_expected[k].rc,
                     broken_expected[k].says);
        /* the message starts with the folder */
        assert_non_null(strstr(err, name));
        refused++;
    }
    for (int k = 0; k < N_BROKEN; k++)
        if (!seen[k])
            fail_msg("broken folder %s is not in the MANIFEST", broken_expected[k].name);
    assert_int_equal(refused, N_BROKEN);
    json_decref(manifest);
}

/* HF llama keeps each head's q/k rows in rotate-half order; the reader
 * puts them in GGUF's pairing: the folder made from the bundled llama GGUF
 * (make_material.py) must give back that GGUF's rows, BF16-rounded. */
static void test_llama_rows_in_gguf_order(void **state)
{
    (void)state;
    const char *model = getenv("CAIRN_MODEL");
    if (!synth_dir() || !model)
        KT_SKIP("CAIRN_CKPT_SYNTH or CAIRN_MODEL is not set");
    char dir[1024], err[512] = "";
    snprintf(dir, sizeof dir, "%s/../llama-stories", synth_dir());
    cairn_gguf *folder = NULL, *file = NULL;
    if (cairn_ckpt_open(dir, &folder, err, sizeof err) != CAIRN_OK)
        fail_msg("%s", err);
    assert_int_equal(cairn_gguf_open(model, &file, err, sizeof err), CAIRN_OK);
    int checked = 0;
    for (int l = 0; l < 64; l++) {
        static const char *const names[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
        for (int i = 0; i < 4; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
            const cairn_gguf_tensor *a = cairn_gguf_find_tensor(folder, name);
            const cairn_gguf_tensor *b = cairn_gguf_find_tensor(file, name);
            if (!a || !b)
                continue;
            assert_int_equal(a->type, CAIRN_TYPE_BF16);
            assert_int_equal(b->type, CAIRN_TYPE_F32);
            assert_int_equal(a->ne[0], b->ne[0]);
            assert_int_equal(a->ne[1], b->ne[1]);
            for (int64_t e = 0; e < a->ne[0] * a->ne[1]; e++) {
                uint16_t got;
                float want;
                memcpy(&got, (const uint8_t *)a->data + 2 * e, 2);
                memcpy(&want, (const uint8_t *)b->data + 4 * e, 4);
                if (got != cairn_fp32_to_bf16(want))
                    fail_msg("%s [%lld, %lld]: %a, GGUF %a", name, (long long)(e / a->ne[0]),
                             (long long)(e % a->ne[0]), (double)cairn_bf16_to_fp32(got),
                             (double)want);
            }
            checked++;
        }
    }
    assert_true(checked >= 8);
    cairn_gguf_close(folder);
    cairn_gguf_close(file);
}

/* A GGUF file still opens through the same entry point. */
static void test_gguf_file_still_opens(void **state)
{
    (void)state;
    const char *model = getenv("CAIRN_MODEL");
    if (!model)
        KT_SKIP("CAIRN_MODEL is not set");
    cairn_gguf *g = NULL;
    char err[256];
    assert_int_equal(cairn_ckpt_open(model, &g, err, sizeof err), CAIRN_OK);
    assert_non_null(cairn_gguf_find_tensor(g, "token_embd.weight"));
    cairn_gguf_close(g);
    assert_false(cairn_ckpt_is_folder(model));
    assert_int_equal(cairn_ckpt_open("/nonexistent/folder", &g, err, sizeof err), CAIRN_ENOTFOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantized_exact),
        cmocka_unit_test(test_independent_writers_exact),
        cmocka_unit_test(test_models_load_and_fingerprint),
        cmocka_unit_test(test_broken_folders_refused),
        cmocka_unit_test(test_llama_rows_in_gguf_order),
        cmocka_unit_test(test_gguf_file_still_opens),
    };
    return kt_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
