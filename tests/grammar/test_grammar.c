/*
 * tests/grammar/test_grammar.c — structured output (text/grammar_compile.c, text/grammar_match.c):
 *   - byte level: each supported keyword accepts the documents it should and
 *     refuses the others; unsupported keywords are errors that name them;
 *   - property: random valid documents (tests/grammar/schema_check.h, written
 *     from the spec) are accepted, and a mutated document the matcher still
 *     accepts parses and validates with the independent validator;
 *   - token level, on the bundled model's vocabulary and (when present) the
 *     real model's: the mask agrees with accept for every token checked, and
 *     random walks over allowed tokens end in valid documents;
 *   - protocol: response_format decodes as a map or as JSON text, and a bad
 *     schema is an invalid-request error;
 *   - service: sampled generation (temperature 1) with a grammar gives a
 *     valid document for every seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "server/msgpack/msgpack.h"
#include "tests/support/support.h"
#include "tests/grammar/schema_check.h"

/* ---- helpers ------------------------------------------------------------------ */

static cairn_grammar *compile(const char *schema)
{
    cairn_grammar *g = NULL;
    char err[256] = "";
    int rc = cairn_grammar_from_json_schema(schema, schema ? strlen(schema) : 0, &g, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("schema %s: %s (%d)", schema ? schema : "(null)", err, rc);
    return g;
}

static void compile_fails(const char *schema, const char *needle)
{
    cairn_grammar *g = NULL;
    char err[256] = "";
    int rc = cairn_grammar_from_json_schema(schema, strlen(schema), &g, err, sizeof err);
    if (rc == CAIRN_OK)
        fail_msg("schema %s compiled; expected an error naming '%s'", schema, needle);
    assert_null(g);
    if (!strstr(err, needle))
        fail_msg("schema %s: error '%s' does not mention '%s'", schema, err, needle);
}

/* The whole of `doc` is a complete document. */
static bool accepts(const cairn_grammar *g, const char *doc, size_t len)
{
    cairn_grammar_matcher *m = NULL;
    assert_int_equal(cairn_grammar_matcher_create(g, NULL, &m), CAIRN_OK);
    bool ok = cairn_grammar_matcher_accept_bytes(m, doc, len) == CAIRN_OK &&
              cairn_grammar_matcher_can_end(m);
    cairn_grammar_matcher_free(m);
    return ok;
}

/* The same, fed one byte at a time (partial UTF-8 and every state between). */
static bool accepts_bytewise(const cairn_grammar *g, const char *doc, size_t len)
{
    cairn_grammar_matcher *m = NULL;
    assert_int_equal(cairn_grammar_matcher_create(g, NULL, &m), CAIRN_OK);
    bool ok = true;
    for (size_t i = 0; i < len && ok; i++)
        ok = cairn_grammar_matcher_accept_bytes(m, doc + i, 1) == CAIRN_OK;
    ok = ok && cairn_grammar_matcher_can_end(m);
    cairn_grammar_matcher_free(m);
    return ok;
}

static void expect_docs(const char *schema, const char *const *good, const char *const *bad)
{
    cairn_grammar *g = compile(schema);
    for (; good && *good; good++) {
        if (!accepts(g, *good, strlen(*good)))
            fail_msg("schema %s refused valid %s", schema ? schema : "(json_object)", *good);
        if (!accepts_bytewise(g, *good, strlen(*good)))
            fail_msg("schema %s refused valid %s fed bytewise", schema ? schema : "(json_object)", *good);
        /* independent check that the test's own "good" is right */
        if (!sc_text_valid(schema, *good, strlen(*good)))
            fail_msg("test bug: %s does not validate against %s", *good, schema);
    }
    for (; bad && *bad; bad++)
        if (accepts(g, *bad, strlen(*bad)))
            fail_msg("schema %s accepted invalid %s", schema ? schema : "(json_object)", *bad);
    cairn_grammar_free(g);
}

#define DOCS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- byte level: keywords ------------------------------------------------------- */

static void test_json_object_mode(void **state)
{
    (void)state;
    expect_docs(NULL,
                DOCS("{}", "{ }", "{\"a\":1}", " {\"a\": [1, -2.5e+3, \"x\\u00e9\", true, false, null, {\"b\": {}}]}",
                     "{\n  \"k\": \"v\",\n  \"n\": {\"m\": []}\n}", "{\"é\": \"中😀\"}"),
                DOCS("", "[]", "1", "\"s\"", "{", "{\"a\" 1}", "{,}", "{\"a\":1,}", "{} x", "{}\n",
                     "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":tru}", "{'a':1}",
                     "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}",
                     "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xe4\xb8\"}",
                     "{\"a\":1e999}", "{\"a\":12345678901234567}"));
}

static void test_scalar_types(void **state)
{
    (void)state;
    expect_docs("{\"type\":\"string\"}", DOCS("\"\"", "\"abc\"", "\"a\\\"b\""), DOCS("1", "null", "\"a"));
    expect_docs("{\"type\":\"integer\"}", DOCS("0", "-7", "1234567890123456"),
                DOCS("1.5", "1e3", "-", "00", "\"1\"", "12345678901234567"));
    expect_docs("{\"type\":\"number\"}", DOCS("0", "-7.25", "1e3", "2.5E-07"), DOCS("1.", "+1", "NaN"));
    expect_docs("{\"type\":\"boolean\"}", DOCS("true", "false"), DOCS("1", "True", "null"));
    expect_docs("{\"type\":\"null\"}", DOCS("null"), DOCS("nul", "\"null\"", "0"));
    expect_docs("{\"type\":[\"integer\",\"null\"]}", DOCS("3", "null"), DOCS("\"3\"", "true", "3.5"));
}

static void test_properties_required(void **state)
{
    (void)state;
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                    "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},"
                    "\"required\":[\"name\"]}";
    expect_docs(s,
                DOCS("{\"name\":\"x\"}", "{\"name\":\"x\",\"age\":3}", "{\"name\":\"x\",\"ok\":true}",
                     "{ \"name\" : \"x\" , \"age\" : 3 , \"ok\" : false }",
                     "{\n    \"name\": \"x\",\n    \"ok\": true\n}"),
                DOCS("{}", "{\"age\":3}", "{\"age\":3,\"name\":\"x\"}", "{\"name\":\"x\",\"extra\":1}",
                     "{\"name\":3}", "{\"name\":\"x\",}", "{\"name\":\"x\",\"age\":3,\"age\":3}",
                     "{  \"name\":\"x\"}", "{\n\n\"name\":\"x\"}",
                     "{\n                     \"name\":\"x\"}"));
    /* all optional: the empty object, any subset in order */
    expect_docs("{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}",
                DOCS("{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"),
                DOCS("{,\"b\":2}", "{\"b\":2,\"a\":1}", "{\"c\":1}"));
}

static void test_additional_properties(void **state)
{
    (void)state;
    expect_docs("{\"type\":\"object\",\"additionalProperties\":false}", DOCS("{}"),
                DOCS("{\"a\":1}", "{ }"));
    expect_docs("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
                DOCS("{}", "{\"a\":1,\"b\":-2}"), DOCS("{\"a\":\"x\"}", "{\"a\":1.5}"));
    expect_docs("{\"type\":\"object\"}", DOCS("{}", "{\"a\":[{}]}"), DOCS("[]"));
    expect_docs("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}},"
                "\"additionalProperties\":false}",
                DOCS("{}", "{\"a\":null}"), DOCS("{\"b\":null}"));
}

static void test_arrays(void **state)
{
    (void)state;
    expect_docs("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
                DOCS("[1]", "[1,2]", "[ 1 , 2 , 3 ]", "[\n  1,\n  2\n]"),
                DOCS("[]", "[1,2,3,4]", "[1,]", "[\"a\"]", "[1 2]"));
    expect_docs("{\"type\":\"array\"}", DOCS("[]", "[1,\"a\",{},[]]"), DOCS("{}", "[,]"));
    expect_docs("{\"type\":\"array\",\"maxItems\":0}", DOCS("[]"), DOCS("[1]"));
    expect_docs("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}},"
                "\"minItems\":2}",
                DOCS("[[],[true]]", "[[false,true],[],[]]"), DOCS("[[]]", "[[1],[]]"));
}

static void test_enum_const(void **state)
{
    (void)state;
    expect_docs("{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1]},\"é\"]}",
                DOCS("\"red\"", "\"green\"", "1", "null", "{\"a\":[1]}", "\"é\""),
                DOCS("\"blue\"", "\"re\"", "2", "\"Red\"", "{\"a\":[2]}", "\"redd\""));
    expect_docs("{\"const\":\"fixed\"}", DOCS("\"fixed\""), DOCS("\"fixe\"", "\"fixed \""));
    /* enum values of another type than `type` can never validate: dropped */
    expect_docs("{\"type\":\"string\",\"enum\":[\"a\",1]}", DOCS("\"a\""), DOCS("1"));
}

static void test_anyof_oneof_ref(void **state)
{
    (void)state;
    expect_docs("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}",
                DOCS("5", "\"ab\""), DOCS("\"abc\"", "true"));
    expect_docs("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}", DOCS("true", "null"),
                DOCS("0"));
    /* a recursive tree through $defs */
    const char *tree = "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\","
                       "\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
                       "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
                       "\"additionalProperties\":false}}}";
    expect_docs(tree, DOCS("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"),
                DOCS("{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}", "{\"v\":1,\"kids\":[{\"v\":\"x\"}]}"));
    expect_docs("{\"definitions\":{\"c\":{\"enum\":[\"x\",\"y\"]}},\"type\":\"array\","
                "\"items\":{\"$ref\":\"#/definitions/c\"}}",
                DOCS("[\"x\",\"y\"]"), DOCS("[\"z\"]"));
    expect_docs("{\"allOf\":[{\"type\":\"integer\"}]}", DOCS("1"), DOCS("\"1\""));
}

static void test_string_lengths(void **state)
{
    (void)state;
    /* code points, not bytes; an escape is one character */
    expect_docs("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                DOCS("\"ab\"", "\"abc\"", "\"中文\"", "\"😀😀😀\"", "\"\\n\\t\"", "\"a\\u00e9\""),
                DOCS("\"a\"", "\"abcd\"", "\"😀\"", "\"\\n\"", "\"中文字x\""));
    expect_docs("{\"type\":\"string\",\"maxLength\":0}", DOCS("\"\""), DOCS("\"a\""));
    /* a format cairn does not know is an annotation: a plain string */
    expect_docs("{\"type\":\"string\",\"format\":\"uri\",\"description\":\"where\"}",
                DOCS("\"yesterday\""), DOCS("1"));
}

/* Bounds are exact: integers with digit-range rules (negative ranges, zero,
 * int64 extremes), numbers as Python's jsonschema judges them (a text with
 * a fraction is the double it parses to), without an exponent. */
static void test_numeric_bounds(void **state)
{
    (void)state;
    expect_docs("{\"type\":\"integer\",\"minimum\":1,\"maximum\":10}",
                DOCS("1", "7", "10"), DOCS("0", "11", "-1", "01", "100", "1.0", "1e1", "-0"));
    expect_docs("{\"type\":\"integer\",\"exclusiveMinimum\":0}",
                DOCS("1", "9", "10", "9999999999999999"), DOCS("0", "-1", "-0", "00"));
    expect_docs("{\"type\":\"integer\",\"minimum\":-120,\"exclusiveMaximum\":-7}",
                DOCS("-120", "-100", "-99", "-10", "-8"),
                DOCS("-7", "-6", "0", "7", "-121", "-200", "-1000"));
    expect_docs("{\"type\":\"integer\",\"minimum\":-5.5,\"maximum\":99.9}",
                DOCS("-5", "0", "99"), DOCS("-6", "100"));
    expect_docs("{\"type\":\"integer\",\"minimum\":9223372036854775800}",
                DOCS("9223372036854775800", "9223372036854775807"),
                DOCS("9223372036854775799", "922337203685477580"));
    expect_docs("{\"type\":\"integer\",\"maximum\":-9223372036854775800}",
                DOCS("-9223372036854775800", "-9223372036854775808"),
                DOCS("-9223372036854775799", "0"));
    /* draft 4: exclusive* as booleans beside minimum/maximum */
    expect_docs("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,"
                "\"maximum\":3,\"exclusiveMaximum\":false}",
                DOCS("1", "3"), DOCS("0", "4"));
    expect_docs("{\"type\":\"number\",\"maximum\":1.5}",
                /* 1.5000000000000001 parses to the double 1.5 */
                DOCS("1.5", "1.50", "1.4999", "1", "0", "-3.25", "-99", "1.5000000000000001"),
                DOCS("1.6", "1.5000000000000003", "1.51", "2", "1e5", "1.5e0", "15"));
    expect_docs("{\"type\":\"number\",\"minimum\":0,\"exclusiveMaximum\":1.5}",
                DOCS("0", "0.0", "1", "1.4", "1.4999999999999998"),
                DOCS("1.5", "1.50", "1.4999999999999999", "-0.1", "-1", "2", "-0.0"));
    /* 0.3 is the double 0.29999999999999998...: "0.3" parses to it, valid */
    expect_docs("{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.3}",
                DOCS("0.1", "0.3", "0.2", "0.3000000000000000", "0.1000000000000000"),
                DOCS("0.09", "0.31", "0.3000000000000001", "0", "1"));
    expect_docs("{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"maximum\":7}",
                DOCS("-2.4", "-2", "0", "7", "7.0", "6.9999"),
                DOCS("-2.5", "-2.50", "-3", "7.0000000000001", "8"));
    /* a bound on a type list applies to its number branch only */
    expect_docs("{\"type\":[\"integer\",\"string\"],\"minimum\":5}", DOCS("5", "\"1\""),
                DOCS("4"));
    /* no type: the bounds say number */
    expect_docs("{\"minimum\":2,\"maximum\":3}", DOCS("2", "2.5", "3"), DOCS("1", "4", "\"x\""));
    compile_fails("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
    compile_fails("{\"type\":\"integer\",\"minimum\":\"1\"}", "minimum");
    compile_fails("{\"type\":\"number\",\"minimum\":1e50}", "magnitude");
}

static void test_pattern(void **state)
{
    (void)state;
    /* anchored: the whole string; pydantic's constr(pattern=...) shape */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d+$\"}",
                DOCS("\"ABC-1\"", "\"XYZ-0042\""),
                DOCS("\"ABC-\"", "\"abc-1\"", "\"ABCD-1\"", "\"ABC-1x\"", "\" ABC-1\"", "1"));
    /* unanchored: a match anywhere */
    expect_docs("{\"type\":\"string\",\"pattern\":\"ab+c\"}",
                DOCS("\"abc\"", "\"xxabbbc\"", "\"abcyy\"", "\"é abc 中\""),
                DOCS("\"ac\"", "\"ab\"", "\"\"", "\"a bc\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"^(?:foo|ba[rz])*$\"}",
                DOCS("\"\"", "\"foo\"", "\"barfoobaz\""), DOCS("\"fo\"", "\"bar \"", "\"bax\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"^(a|b){2,3}?$\"}",
                DOCS("\"ab\"", "\"bab\""), DOCS("\"a\"", "\"abab\"", "\"abc\""));
    /* '.' is not a line terminator; classes, negation, escapes */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^a.c$\"}",
                DOCS("\"abc\"", "\"a c\"", "\"aéc\"", "\"a\\tc\""),
                DOCS("\"a\\nc\"", "\"a\\rc\"", "\"ac\"", "\"a\u2028c\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"^[^aeiou\\\\s]+$\"}",
                DOCS("\"xyz\"", "\"é中\"", "\"B-1\""), DOCS("\"xa\"", "\"x y\"", "\"\"", "\"x\\ty\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"^[\\\\w.-]+@\\\\w+\\\\.(com|org)$\"}",
                DOCS("\"a.b-c@x.com\"", "\"_1@y.org\""), DOCS("\"a@x.net\"", "\"é@x.com\"", "\"@x.com\""));
    /* the string is JSON-escaped in the output: '"', '\\', controls */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^\\\"\\\\\\\\\\\\/\\\\n\\\\u0001$\"}",
                DOCS("\"\\\"\\\\/\\n\\u0001\""), DOCS("\"\"\\\\/\\n\\u0001\"", "\"\\\"\\\\/\n\\u0001\""));
    /* non-ASCII ranges as UTF-8 */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^[\\\\u00e0-\\\\u00ff中-丰😀]+$\"}",
                DOCS("\"àÿ\"", "\"中丰\"", "\"😀é\""), DOCS("\"a\"", "\"ß\"", "\"丬\"", "\"😁\""));
    /* with lengths, in code points */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^[a-c]+$\",\"minLength\":2,\"maxLength\":3}",
                DOCS("\"ab\"", "\"cab\""), DOCS("\"a\"", "\"abca\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"x\",\"maxLength\":2}",
                DOCS("\"x\"", "\"éx\"", "\"x😀\""), DOCS("\"xxx\"", "\"ab\"", "\"éxé\""));
    expect_docs("{\"type\":\"string\",\"pattern\":\"^\\\\d\",\"minLength\":3}",
                DOCS("\"1ab\"", "\"123456\""), DOCS("\"12\"", "\"a12\""));
    /* no type: pattern says string */
    expect_docs("{\"pattern\":\"^a$\"}", DOCS("\"a\""), DOCS("\"b\"", "1"));
    /* what is refused names the construct */
    static const char *const refused[][2] = {
        {"(?=a)", "lookahead"}, {"(?<!a)b", "lookbehind"}, {"(a)\\\\1", "backreference"},
        {"\\\\bx", "word boundary"}, {"\\\\p{L}", "property"}, {"a{1,5000}", "count"},
        {"(a", "not closed"}, {"a)", "no '('"}, {"*a", "nothing to repeat"},
        {"[b-a]", "out of order"}, {"a{", "'{'"}, {"[]", "empty class"},
        {"\\\\ud83d", "surrogate"}, {"\\\\q", "unknown escape"}, {"(?i)a", "group syntax"},
        {"^.{0,20}x.{20}$", "automaton states"}, {"^a$", "no string satisfies"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char schema[200];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"%s}", refused[i][0],
                 i + 1 == sizeof refused / sizeof *refused ? ",\"minLength\":2" : "");
        compile_fails(schema, refused[i][1]);
    }
    cairn_grammar *g = NULL;
    const char *look = "{\"type\":\"string\",\"pattern\":\"(?!x)\"}";
    assert_int_equal(cairn_grammar_from_json_schema(look, strlen(look), &g, NULL, 0),
                     CAIRN_EUNSUPPORTED);
}

static void test_formats(void **state)
{
    (void)state;
    expect_docs("{\"type\":\"string\",\"format\":\"date\"}",
                DOCS("\"2024-02-29\"", "\"2000-02-29\"", "\"0001-01-01\"", "\"1999-12-31\"", "\"2023-04-30\""),
                DOCS("\"2023-02-29\"", "\"1900-02-29\"", "\"0000-01-01\"", "\"2024-04-31\"", "\"2024-13-01\"",
                     "\"2024-1-01\"", "\"2024-01-00\"", "\"20240101\""));
    expect_docs("{\"type\":\"string\",\"format\":\"time\"}",
                DOCS("\"00:00:00Z\"", "\"23:59:59.123456789+05:30\"", "\"12:30:00z\"", "\"08:00:00-08:00\""),
                DOCS("\"24:00:00Z\"", "\"12:00:00\"", "\"12:60:00Z\"", "\"12:00:60Z\"", "\"12:00Z\"",
                     "\"12:00:00.Z\"", "\"12:00:00+0530\""));
    expect_docs("{\"type\":\"string\",\"format\":\"date-time\"}",
                DOCS("\"2024-02-29T12:00:00Z\"", "\"1985-04-12t23:20:50.52-04:00\""),
                DOCS("\"2024-02-29 12:00:00Z\"", "\"2023-02-29T12:00:00Z\"", "\"2024-02-29T12:00:00\"",
                     "\"2024-02-29\""));
    expect_docs("{\"type\":\"string\",\"format\":\"uuid\"}",
                DOCS("\"123e4567-e89b-12d3-a456-426614174000\"", "\"00000000-0000-0000-0000-00000000ABCD\""),
                DOCS("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\"",
                     "\"g23e4567-e89b-12d3-a456-426614174000\""));
    expect_docs("{\"type\":\"string\",\"format\":\"ipv4\"}",
                DOCS("\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\""),
                DOCS("\"256.0.0.1\"", "\"01.2.3.4\"", "\"1.2.3\"", "\"1.2.3.4.5\""));
    expect_docs("{\"type\":\"string\",\"format\":\"hostname\"}",
                DOCS("\"example.com\"", "\"a-b.c1\"", "\"localhost\""),
                DOCS("\"-a.com\"", "\"a-.com\"", "\"a..b\"", "\"a_b.com\"", "\"\""));
    expect_docs("{\"type\":\"string\",\"format\":\"email\"}",
                DOCS("\"a.b+c@example.com\"", "\"x@y\""), DOCS("\"ab\"", "\".a@b\"", "\"a@\"", "\"a@b@c\""));
    /* with pattern and lengths */
    expect_docs("{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^2024-0[1-3]\"}",
                DOCS("\"2024-02-29\"", "\"2024-01-31\""), DOCS("\"2024-04-01\"", "\"2023-01-01\""));
    expect_docs("{\"type\":\"string\",\"format\":\"hostname\",\"maxLength\":5}",
                DOCS("\"a.b.c\"", "\"abcde\""), DOCS("\"abcdef\""));
    /* pydantic's Optional[date]: anyOf with null */
    expect_docs("{\"anyOf\":[{\"format\":\"date\",\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null}",
                DOCS("null", "\"2020-01-01\""), DOCS("\"2020-1-1\""));
    compile_fails("{\"type\":\"string\",\"format\":\"date\",\"maxLength\":9}", "no string satisfies");
    compile_fails("{\"type\":\"string\",\"format\":7}", "format");
}

static void test_prefix_items(void **state)
{
    (void)state;
    /* pydantic's tuple[int, str] */
    expect_docs("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
                "\"minItems\":2,\"maxItems\":2}",
                DOCS("[1,\"a\"]", "[ -3 , \"\" ]"), DOCS("[1]", "[1,\"a\",2]", "[\"a\",1]", "[]"));
    /* items after the prefix, counted in minItems/maxItems */
    expect_docs("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"}],"
                "\"items\":{\"type\":\"null\"},\"maxItems\":3}",
                DOCS("[]", "[true]", "[false,null]", "[true,null,null]"),
                DOCS("[null]", "[true,true]", "[true,null,null,null]"));
    expect_docs("{\"type\":\"array\",\"prefixItems\":[{\"const\":1},{\"const\":2},{\"const\":3}],"
                "\"minItems\":1,\"maxItems\":2}",
                DOCS("[1]", "[1,2]"), DOCS("[]", "[1,2,3]", "[2]"));
    expect_docs("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false}",
                DOCS("[]", "[5]"), DOCS("[5,6]", "[\"a\"]"));
    expect_docs("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"minItems\":3}",
                DOCS("[1,\"x\",{}]", "[1,2,3,4]"), DOCS("[1,2]", "[\"x\",1,2]"));
    expect_docs("{\"type\":\"array\",\"items\":false}", DOCS("[]"), DOCS("[1]"));
    compile_fails("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "minItems");
    compile_fails("{\"type\":\"array\",\"prefixItems\":{}}", "prefixItems");
}

static void test_whitespace_bounded(void **state)
{
    (void)state;
    char deep[64] = "{\n";
    for (int i = 0; i < 20; i++)
        strcat(deep, " ");
    strcat(deep, "}");
    expect_docs(NULL, DOCS("{ }", "{\n}", "{\n\t\t}", deep),
                DOCS("{  }", "{\n\n}", "{ \n}", "{\r}", "{\t}"));
    char too_deep[64] = "{\n";
    for (int i = 0; i < 21; i++)
        strcat(too_deep, " ");
    strcat(too_deep, "}");
    expect_docs(NULL, NULL, DOCS(too_deep));
}

static void test_unsupported_and_bad(void **state)
{
    (void)state;
    compile_fails("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "pattern");
    compile_fails("{\"type\":\"integer\",\"multipleOf\":2}", "multipleOf");
    compile_fails("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    compile_fails("{\"type\":\"string\"", "not JSON");
    compile_fails("{\"type\":\"strin\"}", "strin");
    compile_fails("{\"$ref\":\"#/$defs/missing\"}", "missing");
    compile_fails("{\"$ref\":\"http://x/y\"}", "http://x/y");
    compile_fails("{\"anyOf\":[{\"type\":\"integer\"}],\"type\":\"string\"}", "anyOf");
    compile_fails("{\"type\":\"string\",\"maxLength\":100000}", "maxLength");
    compile_fails("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "maxLength");
    compile_fails("{\"type\":\"object\",\"required\":[\"a\"]}", "a");
    compile_fails("{\"allOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "allOf");
    compile_fails("false", "false");
    compile_fails("{\"enum\":[]}", "enum");
    cairn_grammar *g = (cairn_grammar *)1;
    assert_int_equal(cairn_grammar_from_json_schema("[1", 2, &g, NULL, 0), CAIRN_EINVAL);
    assert_null(g);
}

/* A malformed schema is CAIRN_EINVAL, a valid one beyond the subset
 * CAIRN_EUNSUPPORTED (tools accept the second, unconstrained). */
static void test_error_kinds(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        int rc;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":\"nope\"}", CAIRN_EINVAL},
        {"{\"$ref\":\"#/$defs/missing\"}", CAIRN_EINVAL},
        {"{\"type\":\"strin\"}", CAIRN_EINVAL},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", CAIRN_EINVAL},
        {"{\"type\":\"object\",\"required\":\"a\"}", CAIRN_EINVAL},
        {"{\"type\":\"string\"", CAIRN_EINVAL},
        {"{\"type\":\"integer\",\"minimum\":\"0\"}", CAIRN_EINVAL},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", CAIRN_EINVAL},
        {"{\"type\":\"string\",\"pattern\":\"(a\"}", CAIRN_EINVAL},
        {"{\"type\":\"integer\",\"multipleOf\":3}", CAIRN_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"^(?=a)a\"}", CAIRN_EUNSUPPORTED},
        {"{\"$ref\":\"http://x/y\"}", CAIRN_EUNSUPPORTED},
        {"{\"anyOf\":[{\"type\":\"integer\"}],\"type\":\"string\"}", CAIRN_EUNSUPPORTED},
        {"{\"allOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", CAIRN_EUNSUPPORTED},
        {"{\"type\":\"string\",\"maxLength\":100000}", CAIRN_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cairn_grammar *g = NULL;
        char err[256] = "";
        int rc = cairn_grammar_from_json_schema(cases[i].schema, strlen(cases[i].schema), &g, err,
                                                sizeof err);
        if (rc != cases[i].rc)
            fail_msg("schema %s: %d (%s), expected %d", cases[i].schema, rc, err, cases[i].rc);
        assert_null(g);
    }
}

/* Nested alternatives through $defs expand exponentially; the matcher's
 * expansion budget keeps each step bounded (the ctest timeout would catch a
 * hang) and never lets an invalid document through. */
static void test_hostile_nesting(void **state)
{
    (void)state;
    char *schema = malloc(1 << 16);
    size_t n = (size_t)sprintf(schema, "{\"$ref\":\"#/$defs/d30\",\"$defs\":{\"d0\":{\"type\":\"integer\"}");
    for (int k = 1; k <= 30; k++)
        n += (size_t)sprintf(schema + n, ",\"d%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\"},{\"$ref\":\"#/$defs/d%d\"}]}", k, k - 1, k - 1);
    sprintf(schema + n, "}}");
    cairn_grammar *g = compile(schema);
    assert_false(accepts(g, "\"x\"", 3));
    (void)accepts(g, "12", 2); /* may be cut by the budget; must return */
    cairn_grammar_free(g);
    /* a schema that refers to itself without consuming anything */
    g = compile("{\"$ref\":\"#\"}");
    assert_false(accepts(g, "1", 1));
    cairn_grammar_free(g);
    free(schema);
}

static void test_done_and_can_end(void **state)
{
    (void)state;
    cairn_grammar *g = compile("{\"type\":\"integer\"}");
    cairn_grammar_matcher *m = NULL;
    assert_int_equal(cairn_grammar_matcher_create(g, NULL, &m), CAIRN_OK);
    assert_false(cairn_grammar_matcher_can_end(m));
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "12", 2), CAIRN_OK);
    assert_true(cairn_grammar_matcher_can_end(m));
    assert_false(cairn_grammar_matcher_done(m)); /* more digits may follow */
    /* a refused byte leaves the state as it was */
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "x", 1), CAIRN_EINVAL);
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "3", 1), CAIRN_OK);
    assert_int_equal(cairn_grammar_matcher_reset(m), CAIRN_OK);
    assert_false(cairn_grammar_matcher_can_end(m));
    cairn_grammar_matcher_free(m);
    cairn_grammar_free(g);

    g = compile(NULL);
    assert_int_equal(cairn_grammar_matcher_create(g, NULL, &m), CAIRN_OK);
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "{\"a\":[]", 7), CAIRN_OK);
    assert_false(cairn_grammar_matcher_done(m));
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "}", 1), CAIRN_OK);
    assert_true(cairn_grammar_matcher_done(m));
    cairn_grammar_matcher_free(m);
    cairn_grammar_free(g);
}

/* ---- property: random documents and mutations --------------------------------- */

static const char *const property_schemas[] = {
    NULL,
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\","
    "\"minLength\":1,\"maxLength\":6},\"score\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\","
    "\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":4},\"meta\":{\"type\":\"object\","
    "\"additionalProperties\":{\"type\":[\"boolean\",\"null\"]}}},\"required\":[\"id\",\"name\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"const\":1}},\"required\":[\"x\"]}]},\"minItems\":1}",
    "{\"$ref\":\"#/$defs/t\",\"$defs\":{\"t\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":3}]}}}",
    "{\"type\":[\"string\",\"number\",\"null\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-40,\"maximum\":1200},"
    "\"maxItems\":5}",
};

static void test_property_random_documents(void **state)
{
    (void)state;
    static const char mutations[] = "{}[]\",:0a -\\\ne.";
    int n_docs = 0, n_mut = 0, n_mut_refused = 0;
    for (size_t k = 0; k < sizeof property_schemas / sizeof *property_schemas; k++) {
        const char *schema = property_schemas[k];
        cairn_grammar *g = compile(schema);
        for (uint64_t seed = 1; seed <= 300; seed++) {
            char *doc = sc_generate(schema, seed * 31 + k);
            size_t len = strlen(doc);
            if (!sc_text_valid(schema, doc, len))
                fail_msg("test bug: generated %s does not validate", doc);
            if (!accepts(g, doc, len))
                fail_msg("schema %zu refused valid document %s", k, doc);
            n_docs++;
            /* mutate: delete, insert or replace one byte */
            uint64_t r = seed * 0x2545f4914f6cdd1dull + k;
            for (int t = 0; t < 4 && len > 0; t++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                size_t at = (size_t)(r % len);
                char c = mutations[(r >> 20) % (sizeof mutations - 1)];
                char *mut = malloc(len + 2);
                size_t n = 0;
                int op = (int)((r >> 40) % 3);
                memcpy(mut, doc, at);
                n = at;
                if (op == 1)
                    mut[n++] = c;
                if (op == 2)
                    mut[n++] = c;
                size_t from = op == 1 ? at : at + 1;
                memcpy(mut + n, doc + from, len - from);
                n += len - from;
                mut[n] = '\0';
                n_mut++;
                if (accepts(g, mut, n)) {
                    /* whatever is accepted must parse and validate */
                    if (!sc_text_valid(schema, mut, n))
                        fail_msg("schema %zu accepted invalid mutation %s (of %s)", k, mut, doc);
                } else {
                    n_mut_refused++;
                }
                free(mut);
            }
            free(doc);
        }
        cairn_grammar_free(g);
    }
    print_message("property: %d documents accepted, %d of %d mutations refused\n", n_docs,
                  n_mut_refused, n_mut);
    assert_true(n_mut_refused > n_mut / 2); /* the check above is not vacuous */
}

/* ---- token level -------------------------------------------------------------- */

static cairn_vocab *load_vocab(const char *path)
{
    cairn_gguf *gg = NULL;
    cairn_vocab *v = NULL;
    char err[256];
    if (cairn_gguf_open(path, &gg, err, sizeof err) != CAIRN_OK)
        fail_msg("%s: %s", path, err);
    if (cairn_vocab_load(gg, &v, err, sizeof err) != CAIRN_OK)
        fail_msg("%s: %s", path, err);
    cairn_gguf_close(gg);
    return v;
}

typedef struct {
    char *buf;
    size_t n, cap;
} text_buf;

static void text_append(text_buf *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->buf = realloc(t->buf, t->cap);
    }
    memcpy(t->buf + t->n, s, n);
    t->n += n;
    t->buf[t->n] = '\0';
}

/* Random walks over the allowed tokens. At each step the mask is checked
 * against accept for every `stride`-th token (a second matcher replays the
 * text so far, then tries the token); the finished text must validate. */
static void random_walks(const cairn_vocab *v, const cairn_grammar_vocab *gv, const char *schema,
                         int n_walks, int max_steps, int stride, bool must_end)
{
    cairn_grammar *g = compile(schema);
    int n_vocab = cairn_vocab_n_tokens(v);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    cairn_grammar_matcher *m = NULL, *check = NULL;
    assert_int_equal(cairn_grammar_matcher_create_with(g, gv, &m), CAIRN_OK);
    assert_int_equal(cairn_grammar_matcher_create_with(g, gv, &check), CAIRN_OK);
    uint64_t rng = 0x1234567ull;
    for (int w = 0; w < n_walks; w++) {
        text_buf text = {0};
        text_append(&text, "", 0);
        assert_int_equal(cairn_grammar_matcher_reset(m), CAIRN_OK);
        bool ended = false;
        for (int step = 0; step < max_steps && !ended; step++) {
            for (int t = 0; t < n_vocab; t++)
                logits[t] = 0.0f;
            int rc = cairn_grammar_matcher_mask(m, logits, n_vocab);
            assert_int_equal(rc, CAIRN_OK);
            int n_allowed = 0;
            for (int t = 0; t < n_vocab; t++)
                if (isfinite(logits[t]))
                    allowed[n_allowed++] = t;
            assert_true(n_allowed > 0);
            /* mask == accept, for a spread of tokens (offset varies per step) */
            assert_int_equal(cairn_grammar_matcher_reset(check), CAIRN_OK);
            assert_int_equal(cairn_grammar_matcher_accept_bytes(check, text.buf, text.n), CAIRN_OK);
            for (int t = (step * 7) % stride; t < n_vocab; t += stride) {
                bool ok = cairn_grammar_matcher_accept(check, t) == CAIRN_OK;
                if (ok != isfinite(logits[t])) {
                    char piece[300];
                    size_t pn = 0;
                    cairn_token_to_piece(v, t, false, piece, sizeof piece, &pn);
                    fail_msg("token %d '%.*s' after '%s': mask says %d, accept says %d", t,
                             (int)pn, piece, text.buf, isfinite(logits[t]) ? 1 : 0, ok);
                }
                if (ok && !cairn_vocab_is_eog(v, t)) { /* state moved on: replay */
                    assert_int_equal(cairn_grammar_matcher_reset(check), CAIRN_OK);
                    assert_int_equal(cairn_grammar_matcher_accept_bytes(check, text.buf, text.n),
                                     CAIRN_OK);
                }
            }
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            /* prefer EOG when allowed half the time, so walks finish */
            int32_t tok = allowed[rng % (uint64_t)n_allowed];
            if (cairn_grammar_matcher_can_end(m) && (rng >> 32) % 2 == 0)
                for (int i = 0; i < n_allowed; i++)
                    if (cairn_vocab_is_eog(v, allowed[i]))
                        tok = allowed[i];
            if (cairn_vocab_is_eog(v, tok)) {
                assert_true(cairn_grammar_matcher_can_end(m));
                ended = true;
                break;
            }
            assert_int_equal(cairn_grammar_matcher_accept(m, tok), CAIRN_OK);
            char piece[300];
            size_t pn = 0;
            assert_int_equal(cairn_token_to_piece(v, tok, false, piece, sizeof piece, &pn), CAIRN_OK);
            text_append(&text, piece, pn);
            ended = cairn_grammar_matcher_done(m);
        }
        if (!ended && must_end)
            fail_msg("walk %d did not finish in %d steps: %s", w, max_steps, text.buf);
        if (ended && !sc_text_valid(schema, text.buf, text.n))
            fail_msg("walk %d produced an invalid document: %s", w, text.buf);
        free(text.buf);
    }
    cairn_grammar_matcher_free(m);
    cairn_grammar_matcher_free(check);
    cairn_grammar_free(g);
    free(logits);
    free(allowed);
}

/* Bounded schemas: every walk must finish within max_steps tokens. */
static const char *const walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\","
    "\"items\":{\"enum\":[\"red\",\"green\",\"中文\"]},\"maxItems\":3}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":4}",
    "{\"anyOf\":[{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},{\"type\":\"null\"}]}",
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":300},"
    "\"x\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1.5},\"d\":{\"type\":\"string\","
    "\"format\":\"date\"},\"c\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}\\\\d{1,3}$\"}},"
    "\"required\":[\"n\",\"x\",\"d\",\"c\"]}",
};

/* Unbounded strings (free-form, and counted up to 100 characters): walks
 * may not end, but every step's mask is checked. */
static const char *const open_schemas[] = {
    NULL,
    /* most tokens continue, each to its own state: the transition cache */
    "{\"type\":\"string\",\"pattern\":\"ab\"}",
    "{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"pattern\":\"^[^@]+@[^@ ]+$\"}},"
    "\"required\":[\"e\"]}",
    "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"minLength\":3,"
    "\"maxLength\":100}},\"required\":[\"text\"]}",
};

static void test_tokens_bundled_vocab(void **state)
{
    (void)state;
    const char *path = getenv("CAIRN_MODEL");
    assert_non_null(path);
    cairn_vocab *v = load_vocab(path);
    cairn_grammar_vocab *gv = NULL;
    assert_int_equal(cairn_grammar_vocab_create(v, &gv), CAIRN_OK);
    for (size_t k = 0; k < sizeof walk_schemas / sizeof *walk_schemas; k++)
        random_walks(v, gv, walk_schemas[k], 6, 400, 1, true); /* every token checked */
    for (size_t k = 0; k < sizeof open_schemas / sizeof *open_schemas; k++)
        random_walks(v, gv, open_schemas[k], 2, 60, 1, false);
    /* a free-form string in json_object mode: check the mask, end by EOG */
    cairn_grammar *g = compile(NULL);
    cairn_grammar_matcher *m = NULL;
    assert_int_equal(cairn_grammar_matcher_create_with(g, gv, &m), CAIRN_OK);
    assert_int_equal(cairn_grammar_matcher_accept_bytes(m, "{\"k\": \"text", 11), CAIRN_OK);
    int n_vocab = cairn_vocab_n_tokens(v);
    float *logits = calloc((size_t)n_vocab + 5, sizeof *logits);
    assert_int_equal(cairn_grammar_matcher_mask(m, logits, n_vocab + 5), CAIRN_OK);
    for (int t = n_vocab; t < n_vocab + 5; t++)
        assert_true(isinf(logits[t])); /* past the vocabulary */
    for (int t = 0; t < n_vocab; t++)
        if (cairn_vocab_is_eog(v, t))
            assert_true(isinf(logits[t])); /* the document is not complete */
    free(logits);
    cairn_grammar_matcher_free(m);
    cairn_grammar_free(g);
    cairn_grammar_vocab_free(gv);
    cairn_vocab_free(v);
}

static void test_tokens_real_vocab(void **state)
{
    (void)state;
    const char *path = getenv("CAIRN_CHAT_MODEL");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        KT_SKIP("CAIRN_CHAT_MODEL (%s) is absent", path ? path : "unset");
    }
    fclose(f);
    cairn_vocab *v = load_vocab(path);
    cairn_grammar_vocab *gv = NULL;
    assert_int_equal(cairn_grammar_vocab_create(v, &gv), CAIRN_OK);
    for (size_t k = 0; k < sizeof walk_schemas / sizeof *walk_schemas; k++)
        random_walks(v, gv, walk_schemas[k], 3, 300, 97, true);
    for (size_t k = 0; k < sizeof open_schemas / sizeof *open_schemas; k++)
        random_walks(v, gv, open_schemas[k], 2, 40, 97, false);
    cairn_grammar_vocab_free(gv);
    cairn_vocab_free(v);
}

/* ---- protocol ------------------------------------------------------------------- */

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* generate {tokens: [1, 2], response_format: ...}; how = 0 map schema,
 * 1 schema as JSON text, 2 json_object, 3 bad schema, 4 unknown type */
static int decode_generate(int how, cairn_rpc_call *call, cairn_rpc_error *err)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, 0);
    msgpack_pack_uint32(&pk, 7);
    pack_cstr(&pk, "generate");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2);
    pack_cstr(&pk, "tokens");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_int(&pk, 2);
    pack_cstr(&pk, "response_format");
    msgpack_pack_map(&pk, how == 2 || how == 4 ? 1 : 2);
    pack_cstr(&pk, "type");
    pack_cstr(&pk, how == 2 ? "json_object" : how == 4 ? "yaml" : "json_schema");
    if (how != 2 && how != 4) {
        pack_cstr(&pk, "json_schema");
        msgpack_pack_map(&pk, 2);
        pack_cstr(&pk, "name");
        pack_cstr(&pk, "thing");
        pack_cstr(&pk, "schema");
        if (how == 1) {
            pack_cstr(&pk, "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},"
                           "\"required\":[\"n\"]}");
        } else if (how == 3) {
            msgpack_pack_map(&pk, 2);
            pack_cstr(&pk, "type");
            pack_cstr(&pk, "string");
            pack_cstr(&pk, "pattern");
            pack_cstr(&pk, "(?=a)"); /* a lookahead: not supported */
        } else {
            msgpack_pack_map(&pk, 3);
            pack_cstr(&pk, "type");
            pack_cstr(&pk, "object");
            pack_cstr(&pk, "properties");
            msgpack_pack_map(&pk, 1);
            pack_cstr(&pk, "n");
            msgpack_pack_map(&pk, 2);
            pack_cstr(&pk, "type");
            pack_cstr(&pk, "number");
            pack_cstr(&pk, "description");
            msgpack_pack_double(&pk, 0.5); /* any JSON value is fine in an annotation */
            pack_cstr(&pk, "required");
            msgpack_pack_array(&pk, 1);
            pack_cstr(&pk, "n");
        }
    }
    const cairn_api api = {.vocab = NULL, .n_vocab = 100, .n_ctx = 256};
    cairn_rpc_context ctx = {.api = &api};
    cairn_mp_limits_default(&ctx.limits);
    uint64_t seeds = 1;
    int rc = cairn_rpc_decode(&ctx, (const uint8_t *)sb.data, sb.size, &seeds, call, err);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void test_protocol_response_format(void **state)
{
    (void)state;
    for (int how = 0; how < 3; how++) {
        cairn_rpc_call call;
        cairn_rpc_error err;
        int rc = decode_generate(how, &call, &err);
        if (rc != CAIRN_OK)
            fail_msg("variant %d: %s", how, err.message);
        assert_non_null(call.gen.grammar);
        const char *good = how == 2 ? "{\"z\":[]}" : how == 1 ? "{\"n\":-3}" : "{\"n\":2.5}";
        assert_true(accepts(call.gen.grammar, good, strlen(good)));
        const char *bad = how == 2 ? "[1]" : "{\"m\":1}";
        assert_false(accepts(call.gen.grammar, bad, strlen(bad)));
        cairn_rpc_call_clear(&call);
        assert_null(call.gen.grammar);
    }
    for (int how = 3; how < 5; how++) {
        cairn_rpc_call call;
        cairn_rpc_error err;
        int rc = decode_generate(how, &call, &err);
        assert_int_equal(rc, CAIRN_RPC_INVALID_REQUEST);
        assert_int_equal(err.code, CAIRN_RPC_INVALID_REQUEST);
        assert_non_null(strstr(err.message, how == 3 ? "pattern" : "json_schema"));
        assert_null(call.gen.grammar);
    }
}

/* ---- service: sampled generation -------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done[16];
    char *text[16];
    const char *finish[16];
} collector;

static void on_event(const cairn_event *ev, void *user)
{
    collector *c = user;
    if (ev->kind == CAIRN_EV_DELTA || ev->id >= 16)
        return;
    pthread_mutex_lock(&c->mu);
    c->text[ev->id] = ev->kind == CAIRN_EV_DONE ? strndup(ev->text, ev->text_len) : NULL;
    c->finish[ev->id] = ev->kind == CAIRN_EV_DONE ? (strcmp(ev->finish_reason, "stop") == 0
                                                         ? "stop" : "other")
                                                  : "error";
    c->done[ev->id] = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void test_service_sampled_generation(void **state)
{
    (void)state;
    collector col = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    cairn_service_config cfg = {
                                .kv_bytes = (size_t)8 << 20, .page_size = 16,
                                .kv_type = CAIRN_TYPE_F16, .on_event = on_event, .user = &col};
    cairn_service *svc = NULL;
    char err[256] = "";
    if (support_service_start(getenv("CAIRN_MODEL"), 2, NULL, &cfg, &svc, err, sizeof err) != CAIRN_OK)
        fail_msg("service: %s", err);
    const cairn_vocab *v = cairn_service_vocab(svc);
    int n_req = 0;
    const char *schema_of[16];
    for (size_t k = 0; k < sizeof walk_schemas / sizeof *walk_schemas; k++) {
        for (uint64_t seed = 1; seed <= 4; seed++) {
            cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
            r->id = (uint64_t)n_req;
            r->tokens = malloc(64 * sizeof *r->tokens);
            size_t n = 0;
            assert_int_equal(cairn_tokenize(v, "Once upon a time", 16, CAIRN_TOK_ADD_BOS, r->tokens,
                                            64, &n), CAIRN_OK);
            r->n_tokens = n;
            r->gen.max_tokens = 400; /* more than the longest document of these schemas */
            r->gen.sampling.temperature = 1.0f;
            r->gen.sampling.seed = seed;
            r->gen.grammar = compile(walk_schemas[k]);
            schema_of[n_req++] = walk_schemas[k];
            assert_int_equal(cairn_service_submit(svc, r), CAIRN_OK);
        }
    }
    for (int i = 0; i < n_req; i++) {
        pthread_mutex_lock(&col.mu);
        while (!col.done[i])
            pthread_cond_wait(&col.cv, &col.mu);
        pthread_mutex_unlock(&col.mu);
        if (strcmp(col.finish[i], "stop") != 0)
            fail_msg("request %d finished with %s: %s", i, col.finish[i],
                     col.text[i] ? col.text[i] : "");
        if (!sc_text_valid(schema_of[i], col.text[i], strlen(col.text[i])))
            fail_msg("request %d: invalid document %s", i, col.text[i]);
        free(col.text[i]);
    }
    support_service_stop(svc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_object_mode),
        cmocka_unit_test(test_scalar_types),
        cmocka_unit_test(test_properties_required),
        cmocka_unit_test(test_additional_properties),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_enum_const),
        cmocka_unit_test(test_anyof_oneof_ref),
        cmocka_unit_test(test_string_lengths),
        cmocka_unit_test(test_numeric_bounds),
        cmocka_unit_test(test_pattern),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_prefix_items),
        cmocka_unit_test(test_whitespace_bounded),
        cmocka_unit_test(test_unsupported_and_bad),
        cmocka_unit_test(test_error_kinds),
        cmocka_unit_test(test_done_and_can_end),
        cmocka_unit_test(test_hostile_nesting),
        cmocka_unit_test(test_property_random_documents),
        cmocka_unit_test(test_tokens_bundled_vocab),
        cmocka_unit_test(test_tokens_real_vocab),
        cmocka_unit_test(test_protocol_response_format),
        cmocka_unit_test(test_service_sampled_generation),
    };
    kt_select_tests(); /* CAIRN_TEST_ONLY / CAIRN_TEST_EXCEPT (tests.cmake) */
    return kt_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
