/*
 * text/text.h — everything cairn does with text: tokenizers, chat templates,
 * tool calls and grammars for structured output.
 *
 * Where text meets tokens:
 *
 *     messages + tools ──chat template──▶ text with turn markers
 *                                              │ tokenizer (only the
 *                                              ▼ template's own markers
 *     prompt text ───────────────────────▶ token ids       are special)
 *                                              │
 *                          engine ─ sampling ◀─┘ masked by a grammar
 *                                              │ matcher (JSON schema,
 *                                              ▼ forced tool calls)
 *     reply text ◀──streaming detokenizer── token ids
 *         │
 *         └──tool-call parser──▶ OpenAI tool_calls + remaining content
 *                                (+ reasoning, for replies in channels)
 *
 * Four parts, each an opaque handle with create/free functions:
 *   cairn_vocab              a tokenizer built from GGUF metadata
 *                            (SentencePiece or byte-level BPE)
 *   cairn_detok              streaming detokenizer: only whole UTF-8 out
 *   cairn_chat_template      a model's chat template, by family
 *   cairn_grammar (+ matcher, + grammar vocab)  JSON schema -> token masks
 *
 * Threads: vocabularies, templates, grammars and grammar vocabularies are
 * immutable once built, so any number of threads may use one at once (the
 * server's text workers do); detokenizers and matchers belong to one
 * sequence and one thread at a time. Text work is never done on the
 * server's loop thread, nor inside an engine step beyond masking and
 * detokenizing the tokens a step produced.
 *
 * Ownership: a `*_load`/`*_create`/`*_from_*` function gives the caller a
 * new object, released by the matching `*_free`; strings a function returns
 * through a `char **` are malloc'ed for the caller. All functions return
 * CAIRN_OK or a negative status from common/common.h.
 *
 * Layering: text/ reads GGUF metadata (gguf/) and never touches a model,
 * a backend or the cache; the model module never touches text.
 */
#ifndef CAIRN_TEXT_H
#define CAIRN_TEXT_H

#include "common/common.h"
#include "gguf/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* Vocabulary and tokenizer                                                 */
/* ======================================================================== */
/*
 * Built from `tokenizer.ggml.*` metadata; works on vocab-only GGUF files.
 *
 *   model "llama"  SentencePiece: scores, a "▁" space marker, optional space
 *                  prefix, <0xNN> byte fallback for characters not in vocab.
 *   model "gpt2"   byte-level BPE: the text is split by the pre-tokenizer
 *                  named in `tokenizer.ggml.pre` (PCRE2 regexes with Unicode
 *                  properties), each piece mapped to byte-level symbols and
 *                  merged by rank from `tokenizer.ggml.merges`.
 *
 * Special tokens and plain text. Control tokens (<s>, <|im_start|>, ...)
 * are only recognised in the input text when CAIRN_TOK_PARSE_SPECIAL is
 * given; by default their text is tokenized as ordinary characters (and no
 * merge ever spells one), so user text cannot inject turn markers. Without
 * PARSE_SPECIAL, text produces no control, unknown or unused token — the one
 * exception is the unknown token standing for a character the vocabulary
 * cannot spell (never one that ends generation; see cairn_tokenize). User-defined
 * (added) tokens are matched in plain text as whole tokens, as the reference
 * tokenizers do (mpt's runs of spaces, Qwen's <tool_call> and <think>: their
 * models read those as text). But GGUF files also type real markers as
 * user-defined (Phi-3's </s>, DeepSeek-Coder's <|User|> and <|EOT|>), so an
 * added token counts as control, whatever type the file gives it, when
 *   - it is a special id the file names (tokenizer.ggml.*_token_id: bos,
 *     eos, eot, eom, unknown, padding, separator, cls, mask, fim_*), or
 *   - its text has a marker's shape: <|...|>, DeepSeek's full-width
 *     <｜...｜>, or an upper-case name in brackets ([INST], [/INST],
 *     [TOOL_CALLS], [CLS], the [PAD123] fillers converters add), or
 *   - its text is a marker by name: <s> </s> <unk> <pad> <mask> <bos> <eos>
 *     <sep> <cls>, <start_of_turn> <end_of_turn> <end_of_utterance> <EOT>,
 *     and the fill-in-the-middle markers (<PRE> <SUF> <MID> (also with "▁"),
 *     <fim_prefix>, <fim-prefix>, ..., <repo_name>, <file_sep>, <filename>);
 * and end-of-turn markers (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>,
 * ...) are control and end generation even when typed normal. Other
 * angle-bracket words (<think>, <tool_call>, Gemma's HTML tags) stay
 * user-defined. This is stricter than llama.cpp, which overrides only its
 * end-of-generation and fill-in-the-middle lists. Tokens now counted as
 * control also detokenize to "" unless `special`, like every control token.
 * Special matching is leftmost, then longest.
 */

typedef struct cairn_vocab cairn_vocab;

enum {
    CAIRN_TOK_ADD_BOS = 1 << 0,       /* prepend BOS (only if the vocab has one) */
    CAIRN_TOK_PARSE_SPECIAL = 1 << 1, /* match special-token strings in text     */
};

typedef enum {
    CAIRN_VOCAB_SPM = 1, /* "llama"  */
    CAIRN_VOCAB_BPE = 2, /* "gpt2"   */
} cairn_vocab_kind;

/* Build a vocab from a GGUF's metadata. The vocab copies what it needs; the
 * gguf may be closed afterwards. */
int cairn_vocab_load(const cairn_gguf *g, cairn_vocab **out, char *err, size_t err_len);
void cairn_vocab_free(cairn_vocab *v);

/* The tokenizer family, the number of token ids, and the special ids.
 * Immutable after load: any thread. */
cairn_vocab_kind cairn_vocab_kind_of(const cairn_vocab *v);
int32_t cairn_vocab_n_tokens(const cairn_vocab *v);
int32_t cairn_vocab_bos(const cairn_vocab *v); /* -1 when none */
int32_t cairn_vocab_eos(const cairn_vocab *v); /* -1 when none */
bool cairn_vocab_add_bos(const cairn_vocab *v); /* the model asks for BOS     */
/* SentencePiece: a "▁" goes in front of the text (Llama 2), or not (Gemma). */
bool cairn_vocab_add_space_prefix(const cairn_vocab *v);
/* End of generation: eos, eot, <|im_end|> and the like. */
bool cairn_vocab_is_eog(const cairn_vocab *v, int32_t token);
/* The token's stored text (SentencePiece "▁" / byte-level symbols as-is). */
const char *cairn_vocab_token_text(const cairn_vocab *v, int32_t token);

/* Tokenize `len` bytes of UTF-8 `text` (invalid bytes are treated as single
 * characters, never rejected; a byte a byte-level vocabulary cannot spell
 * becomes its unknown token only when that is not a control token, else
 * U+FFFD — so plain text can never produce an end-of-generation token). Writes at most `cap` ids to `out`; *n_out is
 * always set to the full count, and CAIRN_ERANGE is returned when it exceeds
 * `cap`, so a caller can retry with a larger buffer. */
int cairn_tokenize(const cairn_vocab *v, const char *text, size_t len, int flags, int32_t *out,
                   size_t cap, size_t *n_out);

/* The bytes a token stands for: "▁" becomes a space, <0xNN> its byte,
 * byte-level symbols their bytes. Control tokens give "" unless `special`.
 * Same size contract as cairn_tokenize. The bytes may be part of a UTF-8
 * character; use cairn_detok to stream text. */
int cairn_token_to_piece(const cairn_vocab *v, int32_t token, bool special, char *out,
                         size_t cap, size_t *n_out);

/* Streaming detokenizer: push tokens, get back only complete UTF-8 (bytes of
 * a character split across tokens are held until it completes; bytes that can
 * never form valid UTF-8 come out as U+FFFD). The vocab must outlive it. */
typedef struct cairn_detok cairn_detok;
int cairn_detok_create(const cairn_vocab *v, bool special, cairn_detok **out);
void cairn_detok_free(cairn_detok *d);
/* Appends the text now complete to out (cap bytes; a token never yields more
 * than 256 bytes plus 3 held ones, so cap >= 260 always suffices). */
int cairn_detok_push(cairn_detok *d, int32_t token, char *out, size_t cap, size_t *n_out);
/* Emits whatever is held (as U+FFFD for an incomplete character). */
int cairn_detok_flush(cairn_detok *d, char *out, size_t cap, size_t *n_out);

/* ======================================================================== */
/* Chat templates                                                           */
/* ======================================================================== */
/*
 * Instruct models ship a Jinja2 chat template in `tokenizer.chat_template`.
 * cairn does not interpret Jinja: it recognises the template's family by
 * markers in its source and formats with a hand-written formatter that
 * reproduces byte for byte what the Hugging Face rendering (jinja2,
 * trim_blocks + lstrip_blocks, tojson = json.dumps(ensure_ascii=False)) gives
 * for that family's reference template:
 *
 *   <|im_start|> + <tool_call>   QWEN2   ChatML with a <tools> block,
 *                                        <tool_call> calls and
 *                                        <tool_response> results; Qwen2.5's
 *                                        default system prompt only when the
 *                                        source has it (Qwen3 and Hermes-style
 *                                        templates have none). A template
 *                                        that thinks (Qwen3, QwQ:
 *                                        cairn_chat_template_thinks) renders
 *                                        reasoning_content, or <think>..
 *                                        </think> in a reply's content, as
 *                                        Qwen3's does: kept on the replies
 *                                        after the last question, dropped
 *                                        before it
 *   <|im_start|>                 CHATML  plain ChatML turns
 *   <|start_header_id|>          LLAMA3  3.0 turns; with "Cutting Knowledge
 *                                        Date" the 3.1+ form (dated system
 *                                        header, tools in the first user
 *                                        message, {"name","parameters"} calls,
 *                                        results as "ipython" turns)
 *   <start_of_turn>              GEMMA   no system role: its text opens the
 *                                        first user turn; contents trimmed
 *   <|assistant|> + <|end|>      PHI3    empty system left out; EOS ends a
 *                                        render without generation prompt
 *   [INST]                       LLAMA2  with <<SYS>>: Llama 2 (BOS before
 *                                        every user turn); else Mistral
 *                                        v1 ("[INST] u [/INST] a</s>", system
 *                                        text + "\n\n" opens the first user
 *                                        message) or, with "[INST]" right
 *                                        before a quote, v3-tekken/Nemo
 *                                        ("[INST]u[/INST]a</s>", system text
 *                                        on the last user message); Mistral
 *                                        tool formats are not rendered
 *   <|start|> + <|channel|> +    HARMONY gpt-oss: a system message (model
 *   <|message|>                          identity, knowledge cutoff, today's
 *                                        local date as strftime_now gives it,
 *                                        "Reasoning: medium"), the first
 *                                        system text and the tools (as a
 *                                        TypeScript namespace) in a
 *                                        developer message; replies in the
 *                                        final channel, reasoning in the
 *                                        analysis channel only where the
 *                                        template keeps it; one tool call per
 *                                        assistant message, as the template
 *                                        renders it (others are dropped, with
 *                                        a warning); tool results named after
 *                                        the last call
 *   anything else / no template  GENERIC "<|ROLE|>\n" content "\n" per
 *                                        message, "<|assistant|>\n" to prompt
 *                                        (docs/protocol.md), with a warning
 *
 * "developer" is treated as "system". Tool lists are rendered by QWEN2,
 * LLAMA3 (3.1+) and HARMONY only; other families ignore them with a
 * warning. Tool-call
 * arguments given as a JSON string (OpenAI form) are parsed and rendered as
 * the object the templates expect; a string that is not JSON stays a string.
 *
 * BOS: templates that begin with bos_token (Llama 3, Gemma, Llama 2, Mistral)
 * have it removed from the start of cairn_chat_format's text — the BOS token
 * belongs to tokenization (CAIRN_TOK_ADD_BOS, cairn_vocab_add_bos), so
 * tokenizing the text with ADD_BOS | PARSE_SPECIAL gives the reference ids.
 * BOS written later in the text (Llama 2's every user turn) stays as text.
 *
 * A template is immutable once made: safe to share between threads.
 */

typedef enum {
    CAIRN_CHAT_GENERIC = 0,
    CAIRN_CHAT_CHATML,
    CAIRN_CHAT_QWEN2,  /* chatml + Qwen2.5 tool format */
    CAIRN_CHAT_LLAMA3,
    CAIRN_CHAT_LLAMA2, /* [INST], also Mistral */
    CAIRN_CHAT_GEMMA,
    CAIRN_CHAT_PHI3,
    CAIRN_CHAT_HARMONY, /* OpenAI's harmony format (gpt-oss) */
} cairn_chat_family;

typedef struct cairn_chat_template cairn_chat_template;

typedef struct {
    const char *role;            /* "system", "developer" (= system), "user",
                                    "assistant", "tool"                        */
    const char *content;         /* UTF-8; NULL counts as ""                  */
    const char *tool_calls_json; /* assistant: JSON array of OpenAI tool calls
                                    [{"id","type":"function","function":
                                    {"name","arguments"}}], or NULL           */
    const char *tool_call_id;    /* tool: id of the call answered, or NULL    */
    const char *name;            /* tool: function name, or NULL              */
    const char *reasoning_content; /* assistant: the reasoning before the reply
                                    (OpenAI-compatible servers' field; Hugging
                                    Face templates call it `thinking`), or
                                    NULL. HARMONY renders it as the analysis
                                    channel where its template does; other
                                    families leave it out                    */
} cairn_chat_message;

/* From a GGUF's tokenizer.chat_template (absent: generic, with a warning).
 * `v` (may be NULL) supplies the BOS/EOS texts. *out is the caller's; free
 * with cairn_chat_template_free. CAIRN_EFORMAT when the key is not a string. */
int cairn_chat_template_from_gguf(const cairn_gguf *g, const cairn_vocab *v,
                                  cairn_chat_template **out);
/* From template source (NULL or "" = generic). `v` may be NULL: the family's
 * customary BOS/EOS texts are used then. */
int cairn_chat_template_from_string(const char *jinja_source, const cairn_vocab *v,
                                    cairn_chat_template **out);
void cairn_chat_template_free(cairn_chat_template *t); /* NULL is a no-op */
cairn_chat_family cairn_chat_template_family(const cairn_chat_template *t);
/* Does the template's model reason first, in <think> ... </think> (a ChatML
 * or Qwen template whose source has those markers: Qwen3, QwQ)? Its replies
 * are then read into reasoning and content (cairn_chat_parse_reply), it
 * takes CAIRN_CHAT_NO_THINKING, and it renders an assistant message's
 * reasoning_content back as Qwen3's template does. */
bool cairn_chat_template_thinks(const cairn_chat_template *t);
const char *cairn_chat_family_name(cairn_chat_family f); /* "qwen2", ... static */

/* The whole conversation as text. tools_json: JSON array of OpenAI tools
 * [{"type":"function","function":{...}}] or NULL. *out is malloc'ed and
 * NUL-terminated (caller frees); *out_len (may be NULL) its length.
 * CAIRN_EINVAL for an unknown role, tools/tool_calls that are not JSON arrays,
 * or what the family's template refuses (Llama 3.1: tools without a user
 * message, several calls in one turn). */
int cairn_chat_format(const cairn_chat_template *t, const cairn_chat_message *msgs,
                      size_t n_msgs, const char *tools_json, bool add_generation_prompt,
                      char **out, size_t *out_len);
/* The same with CAIRN_CHAT_* flags (below): GENERATION_PROMPT,
 * CONTINUE_FINAL, REASONING_*, NO_THINKING; the others are ignored. */
int cairn_chat_format_flags(const cairn_chat_template *t, const cairn_chat_message *msgs,
                            size_t n_msgs, const char *tools_json, int flags, char **out,
                            size_t *out_len);

enum {
    CAIRN_CHAT_GENERATION_PROMPT = 1 << 0, /* open an assistant turn at the end */
    CAIRN_CHAT_CONTINUE = 1 << 1, /* the messages continue a conversation already
                                     in the context: no preamble (BOS, default
                                     system prompt, tools block, date header) */
    CAIRN_CHAT_ADD_BOS = 1 << 2,  /* start with BOS (templates that write it
                                     get it anyway, once)                    */
    CAIRN_CHAT_CONTINUE_FINAL = 1 << 3, /* the last message is an assistant
                                     reply to continue (a prefill): the text
                                     ends with its content, no end of turn
                                     and no new turn (GENERATION_PROMPT is
                                     ignored); CAIRN_EINVAL when the last
                                     message is not a plain assistant reply */
    CAIRN_CHAT_REASONING_LOW = 1 << 4, /* how long the model is to reason, for
                                     templates that take it (HARMONY's
                                     "Reasoning: low|medium|high"; neither
                                     flag: the template's default, medium) */
    CAIRN_CHAT_REASONING_HIGH = 1 << 5,
    CAIRN_CHAT_NO_THINKING = 1 << 6, /* answer without reasoning (Hugging Face's
                                     enable_thinking=false): a template that
                                     thinks (cairn_chat_template_thinks) opens
                                     the reply with an empty <think></think>
                                     block, as Qwen3's does; HARMONY, which
                                     always reasons, takes it as "low" unless
                                     an effort is given                      */
};

/* Format and tokenize in one step, safely: only the markers the formatter
 * itself writes (turn delimiters, BOS/EOS) are parsed as special tokens;
 * message contents and tool texts are tokenized as plain text, so a message
 * can never forge a turn marker. A marker the vocabulary has no special
 * token for (Llama 2's [INST], where Mistral's vocabularies have a control
 * token) is tokenized as part of the text around it. For contents without
 * marker text the ids equal tokenizing cairn_chat_format's text with
 * PARSE_SPECIAL. *tokens is
 * malloc'ed (caller frees). */
int cairn_chat_tokenize(const cairn_chat_template *t, const cairn_vocab *v,
                        const cairn_chat_message *msgs, size_t n_msgs, const char *tools_json,
                        int flags, int32_t **tokens, size_t *n_tokens);

/* The text that closes an assistant turn in this family ("<|im_end|>\n",
 * "<|eot_id|>", ...): what follows a generated reply, whose end-of-generation
 * token is not kept, when the conversation continues. Static or owned by t. */
const char *cairn_chat_turn_end(const cairn_chat_template *t);

/* Tool calls in a generated assistant text. Every family's forms are read,
 * whatever the template's family, left to right:
 *   <tool_call>{"name":..., "arguments":{...}}</tool_call>  (Qwen2.5, Hermes;
 *       several in a row; the closing tag may be missing at the end)
 *   [TOOL_CALLS][{"name":..., "arguments":{...}}, ...]     (Mistral v3) and
 *   [TOOL_CALLS]NAME[ARGS]{...}                            (Mistral v11+)
 *   <|python_tag|>{"name":..., "parameters":{...}}         (Llama 3.x; several
 *       separated by ';') or <|python_tag|>NAME.call(k="v", ...) (its
 *       built-in tools; plain code for the code interpreter is not a call)
 *   ```json (or ```) fenced blocks holding a call or an array of calls
 *   a run of call objects (or arrays) opening the reply, one after another
 * A call with a marker may name any function; the fenced and opening forms,
 * which have none, count only with `tools_json` (an OpenAI tools array;
 * NULL: none) and only when every call of the block or object names one of
 * those tools and carries "arguments" or "parameters" — so an ordinary JSON
 * answer stays content (LLAMA3: its opening {"name", "parameters"} object
 * is the template's own format and may name any function). A block that is
 * not calls (malformed JSON, a stranger's name, another language) stays
 * text whole. Arguments may be an object or JSON text of one (OpenAI's
 * form); anything else is not a call.
 * On success *calls_json is a malloc'ed JSON array in OpenAI form
 * [{"id":"<id_prefix><n>","type":"function","function":{"name",
 * "arguments": "<JSON text of the object>"}}] (n from 0; id_prefix NULL:
 * "call_"; a caller makes ids unique across replies with its own prefix;
 * ids a model writes are not kept) and *content the text around the calls,
 * trimmed (malloc'ed, may be ""). CAIRN_ENOTFOUND when the text holds no
 * tool call (outputs untouched); CAIRN_EINVAL when tools_json is not a JSON
 * array. Forced calls (cairn_chat_tool_call_schema) are read back as calls. */
int cairn_chat_parse_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                const char *tools_json, const char *id_prefix, char **calls_json,
                                char **content);
/* The same, for the content of a reply already read (cairn_chat_parse_reply
 * split its reasoning off): a <think> in it is text, never reasoning again
 * (cairn_chat_parse_tool_calls, given a thinking template's whole reply,
 * leaves its reasoning out first). */
int cairn_chat_parse_answer_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                       const char *tools_json, const char *id_prefix,
                                       char **calls_json, char **content);

/* ---- replies in channels (HARMONY) ----
 *
 * gpt-oss writes its reply as harmony messages after the generation prompt
 * "<|start|>assistant", e.g.
 *   <|channel|>analysis<|message|>REASONING<|end|>
 *   <|start|>assistant<|channel|>final<|message|>ANSWER
 * or, for a tool call (a recipient in the header, before or after the
 * channel),
 *   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS
 * (generation stops at <|return|> or <|call|>, which the text does not
 * hold; the vocabulary detokenizes the other markers to their text, see
 * text/vocab.c). A client is given the parts, never the markers: the
 * analysis channel is the reasoning (OpenAI-compatible servers'
 * `reasoning_content`), final and commentary without a recipient the
 * content, and a message to "functions.NAME" (any recipient but
 * "assistant": a built-in tool keeps its whole name) a tool call of NAME
 * with the message as its arguments. Text before any header (a reply
 * continued from a prefill) is content. */

/* Must this template's replies be read (cairn_chat_parse_reply,
 * cairn_chat_reply_next) before a client sees them? True for HARMONY and
 * for templates that think (cairn_chat_template_thinks), whose replies
 * open with <think>REASONING</think>: text before <think> and after
 * </think> is content (leading whitespace and the newlines around the
 * reasoning dropped), a reply cut off inside the reasoning is all
 * reasoning, and without <think> there is none. Their calls are the
 * content's, read as Qwen's (with tools_json only); while streaming,
 * content stops at a call's opening marker (held, like a reply that opens
 * with JSON, and given whole by the parse at the end). */
bool cairn_chat_reply_has_channels(const cairn_chat_template *t);

typedef enum {
    CAIRN_REPLY_REASONING = 1, /* text of the reasoning                      */
    CAIRN_REPLY_CONTENT,       /* text of the content                        */
    CAIRN_REPLY_CALL,          /* a whole tool call                          */
} cairn_chat_reply_kind;

/* One part of a reply: a span of its text. */
typedef struct {
    cairn_chat_reply_kind kind;
    size_t off, len;           /* the text (a call: its arguments)           */
    size_t name_off, name_len; /* a call: the recipient after "to=", with
                                  any "functions." prefix left off          */
    bool complete;             /* a call: its message was closed (a call cut
                                  off at the end of the text is not)        */
} cairn_chat_reply_part;

/* Where reading a reply has got to; zero it to start. */
typedef struct {
    size_t pos;       /* text read                                          */
    int state;        /* 0 at a message's header, else the kind being read  */
    size_t call_name, call_name_len, call_body; /* the call being read      */
} cairn_chat_reply_cursor;

/* The next part of a reply (text[0..len), all of it so far, while it is
 * being streamed) from *c on: true with *part, false when nothing more is
 * settled yet. Reasoning and content come in pieces as they are written
 * (a piece that may be the beginning of a marker is held back; an empty
 * reasoning message is an empty piece); a call only whole, once its
 * message is closed. `done`: the text is complete;
 * everything left is given. Parts of one kind, concatenated, are what
 * cairn_chat_parse_reply gives for the complete text (a call as one part).
 * Cheap (no JSON is parsed, each byte is looked at about once): fine on a
 * loop thread. For templates without channels every piece is content. */
bool cairn_chat_reply_next(const cairn_chat_template *t, cairn_chat_reply_cursor *c,
                           const char *text, size_t len, bool done, cairn_chat_reply_part *part);

/* A complete reply read into its parts (malloc'ed, caller frees):
 * *reasoning (NULL when there was none), *content ("" when none), and
 * *calls_json (NULL when no call) in cairn_chat_parse_tool_calls' form
 * (ids "<id_prefix><n>"). A call's arguments are its message when that is
 * JSON; a closed message that is not keeps its text as the arguments; a
 * call cut off at the end whose text is not JSON is dropped. For templates
 * without channels, and for a reply without a single harmony header (a
 * forced call: cairn_chat_tool_call_schema), this is
 * cairn_chat_parse_tool_calls (with tools_json), its content then the whole
 * text when it holds no call. CAIRN_EINVAL, CAIRN_ENOMEM. */
int cairn_chat_parse_reply(const cairn_chat_template *t, const char *text, size_t len,
                           const char *tools_json, const char *id_prefix, char **reasoning,
                           char **calls_json, char **content);

/* Where, in a reply being streamed (text[0..len), all of it so far), a
 * tool call may have begun: the offset from which the text must be held
 * back (len: send it all). *certain: a call has begun there (keep holding
 * until the end); else the text from there is only the beginning of what
 * may become one (a partial marker, a fence whose first lines are still
 * coming) and the next, longer text decides again. Held: a reply that is
 * only whitespace yet, or opens with {" or [{" (a leading call object or
 * array; "{", "[" alone wait for the next character), the markers above
 * (and <function=, <|tool_call_begin|>),
 * and a ```json / ``` fence whose body opens with {"name": "TOOL" (or
 * [{"name": ...) for a TOOL of tools_json (compact JSON text as
 * cairn_chat_tools_select writes it). Any other fenced block is released
 * as it comes, markers inside it included, once its opening lines show
 * what it is. Cheap (no JSON is parsed): fine on a loop thread. */
size_t cairn_chat_tool_call_start(const char *text, size_t len, const char *tools_json,
                                  bool *certain);

/* The JSON schema (malloc'ed text in *schema_json, caller frees) of a reply
 * that is a call of one of `tools_json`'s tools (an OpenAI tools array), for
 * cairn_grammar_from_json_schema: {"name": TOOL, "arguments": {...}}
 * ("parameters" instead of "arguments" for the Llama 3 family, whose
 * template asks for that key), or with `several` also a JSON array of one or
 * more such calls. The arguments follow each tool's `parameters` schema,
 * whose $defs and $refs are carried over; a tool whose schema uses what the
 * grammar does not support (CAIRN_EUNSUPPORTED, CAIRN_ERANGE from
 * cairn_grammar_from_json_schema) gets free-form object arguments (a
 * warning is logged). cairn_chat_parse_tool_calls with the same tools reads
 * such a reply back as calls. CAIRN_EINVAL when tools_json is not a
 * non-empty array of named function tools, or a tool's schema is malformed
 * (cairn_chat_tools_select refuses those first). */
int cairn_chat_tool_call_schema(const cairn_chat_template *t, const char *tools_json,
                                bool several, char **schema_json);

/* OpenAI's tool semantics, for every protocol: `tools_json` (an array of
 * {"type": "function", "function": {"name", "description"?, "parameters"?}},
 * or NULL) and `choice_json` (tool_choice as JSON text: "none", "auto",
 * "required" or {"type": "function", "function": {"name": N}}; NULL = auto)
 * become the tools to render and parse (*render_json, malloc'ed JSON array,
 * NULL when there are none: no tools, an empty array, or "none") and what
 * the reply must be (*mode: OFF when *render_json is NULL; AUTO; REQUIRED,
 * a call of any of them; NAMED, a call of the one tool left in
 * *render_json). CAIRN_EINVAL for a malformed value, with a message in err
 * and the name of the offending field in field[field_len] (may be NULL):
 * "tools", "tool_choice", or "tools[I].function.parameters" for tool I
 * whose parameters schema is malformed (not an object, or refused by
 * cairn_grammar_from_json_schema with CAIRN_EINVAL: 'properties' not an
 * object, a $ref to nothing, ...). The schemas are checked whatever
 * tool_choice is, "none" included, as OpenAI does; one the grammar merely
 * does not support is accepted (see cairn_chat_tool_call_schema). */
typedef enum {
    CAIRN_TOOLS_OFF = 0,
    CAIRN_TOOLS_AUTO,
    CAIRN_TOOLS_REQUIRED,
    CAIRN_TOOLS_NAMED,
} cairn_chat_tool_mode;

/* (The semantics are above the enum.) Pure: any thread. */
int cairn_chat_tools_select(const char *tools_json, const char *choice_json, char **render_json,
                            cairn_chat_tool_mode *mode, char *field, size_t field_len, char *err,
                            size_t err_len);

/* ======================================================================== */
/* Grammar-constrained sampling                                             */
/* ======================================================================== */
/*
 * Structured output: a JSON schema is compiled to a byte-level grammar, and a
 * matcher follows one generation, setting the logits of every token that
 * cannot continue a valid document to -INFINITY before sampling. Whatever
 * the sampler then draws, the text parses as JSON and validates against the
 * schema — provided generation is not cut short by max_tokens.
 *
 * Supported JSON Schema subset:
 *   type           object, array, string, number, integer, boolean, null, or
 *                  a list of them; no type: inferred from properties/items/
 *                  minLength/pattern/format/minimum..., else any JSON value
 *   properties, required
 *                  properties are emitted in schema order; optional ones may
 *                  be omitted. Only declared properties are ever generated,
 *                  whatever additionalProperties says (valid either way); a
 *                  required name missing from properties is refused.
 *   additionalProperties
 *                  false/true/absent; a schema is used only for objects
 *                  without properties (free keys, values of that schema)
 *   items, prefixItems, minItems, maxItems
 *                  prefixItems (2020-12) for the first items, items (a
 *                  schema, true, or false: no more) for the rest, all counted
 *                  by minItems/maxItems
 *   minLength, maxLength   in code points (at most 1024, as are minItems and
 *                  maxItems); \u escapes of surrogates are never generated
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum
 *                  exact, as Python's jsonschema compares: integer texts
 *                  exactly, texts with a fraction as the double they parse
 *                  to; draft 4's boolean exclusive* work too. A bounded
 *                  number is written without an exponent (at most 16
 *                  fraction digits); unbounded sides stop at 16 integer
 *                  digits, or as many as the far bound needs (int64 bounds
 *                  are exact). A bound of magnitude 1e40 or more beyond
 *                  the digits is CAIRN_EUNSUPPORTED.
 *   pattern        ECMA-262: literals, escapes (\d \w \s \D \W \S, \t \n
 *                  \r \v \f \0, \xHH, \uXXXX, escaped punctuation), classes
 *                  with ranges and negation, '.', groups ((...), (?:...),
 *                  (?<name>...)), |, * + ? {m} {m,} {m,n} (lazy forms too),
 *                  ^ and $. Unanchored unless ^/$ say otherwise (a match
 *                  anywhere, as JSON Schema means it). The string's code
 *                  points are spelled as JSON needs (\" \\ \n ... \u00XX,
 *                  UTF-8 otherwise). \d \w \D \W generate ASCII only (where
 *                  ECMA-262 and Python's re agree); \s \S what both call
 *                  space or not. Lookaround, backreferences, \b \B, \p{..},
 *                  \c, octal and surrogate escapes, [] and [^], inline flags
 *                  and an unescaped literal '{' are CAIRN_EUNSUPPORTED; a
 *                  count above {1000} or an automaton of more than 4000
 *                  states CAIRN_ERANGE. Combines exactly with minLength/
 *                  maxLength and format.
 *   format         date, time, date-time (RFC 3339, real month lengths and
 *                  leap years, no leap second, at most 9 fraction digits),
 *                  uuid, ipv4 (no leading zeros), hostname (RFC 1123, at
 *                  most 253 characters), email (dot-atom@hostname) constrain
 *                  the string; any other format is an annotation (JSON
 *                  Schema 2020-12's default)
 *   enum, const    any JSON values, emitted in compact form; values not of
 *                  the schema's `type` are dropped
 *   anyOf, oneOf   alternatives; oneOf is treated as anyOf (its branches
 *                  must be disjoint for the output to validate)
 *   allOf          with exactly one schema
 *   $ref           "#", "#/$defs/NAME", "#/definitions/NAME" (recursion ok)
 *   title, description, default, examples, $schema, $id, $comment,
 *   deprecated, readOnly, writeOnly: ignored (annotations)
 * Any other keyword (multipleOf, uniqueItems, not, if/then/else,
 * patternProperties, ...) is refused with CAIRN_EUNSUPPORTED naming it, as
 * are $ref/enum/const/anyOf/oneOf combined with other constraints. A schema
 * that is not JSON, or a keyword with a bad value (a malformed pattern,
 * minimum not a number, bounds or lengths no value satisfies, 'properties'
 * not an object, an unknown type, a $ref to nothing), is CAIRN_EINVAL.
 *
 * Generated text: optional leading whitespace, then the value, nothing
 * after it. Whitespace between tokens is bounded (nothing, one space, or a
 * newline and at most 20 spaces/tabs); integers have at most 16 digits,
 * fractions 16, exponents 2 — so a model cannot loop on whitespace or
 * digits. Free-form strings, unanchored patterns and unbounded arrays are
 * bounded only by the caller's max_tokens.
 *
 * Threads: a cairn_grammar and a cairn_grammar_vocab are immutable after
 * creation and may be shared by any number of matchers on any threads; a
 * matcher belongs to one generation and one thread at a time.
 */

typedef struct cairn_grammar cairn_grammar;

/* Compile `len` bytes of JSON schema text; schema_json NULL: any JSON object
 * (response_format json_object). With a message in err: CAIRN_EINVAL for a
 * malformed schema (not JSON, a keyword of the wrong shape such as
 * 'properties' not an object, an unknown type, a $ref to nothing, a bad
 * pattern, bounds that allow no value); CAIRN_EUNSUPPORTED for a valid
 * schema beyond the subset above (an unsupported keyword, combination,
 * pattern construct, $ref form or count, nesting deeper than 64);
 * CAIRN_ERANGE when the grammar would be too large. The first problem met
 * decides. The caller owns *out. */
int cairn_grammar_from_json_schema(const char *schema_json, size_t len, cairn_grammar **out,
                                   char *err, size_t err_len);
/* One more owner of `g` (returned): each owner calls cairn_grammar_free
 * once, and the last one frees it. Thread-safe, like the grammar itself;
 * what lets several requests (n choices) share one compiled grammar. */
cairn_grammar *cairn_grammar_retain(cairn_grammar *g);
void cairn_grammar_free(cairn_grammar *g);

/* The bytes of every token of a vocabulary and a byte trie over them, built
 * once per vocabulary and shared by matchers (building it walks every
 * token: do it once, not per request). EOG tokens and tokens
 * without text (control tokens) are never part of a document. The vocab
 * may be freed afterwards. */
typedef struct cairn_grammar_vocab cairn_grammar_vocab;
int cairn_grammar_vocab_create(const cairn_vocab *v, cairn_grammar_vocab **out);
void cairn_grammar_vocab_free(cairn_grammar_vocab *gv);

typedef struct cairn_grammar_matcher cairn_grammar_matcher;

/* A matcher at the start of a document. `g` (and `gv`) are borrowed and must
 * outlive it. cairn_grammar_matcher_create builds a private vocab index
 * from `v` (v may be NULL: then only the byte-level calls work);
 * create_with shares `gv` (may be NULL likewise). */
int cairn_grammar_matcher_create(const cairn_grammar *g, const cairn_vocab *v,
                                 cairn_grammar_matcher **out);
int cairn_grammar_matcher_create_with(const cairn_grammar *g, const cairn_grammar_vocab *gv,
                                      cairn_grammar_matcher **out);
void cairn_grammar_matcher_free(cairn_grammar_matcher *m);
/* Back to the start of a document. */
int cairn_grammar_matcher_reset(cairn_grammar_matcher *m);

/* Set logits[t] = -INFINITY for every token t < n_vocab that cannot continue
 * the document (ids past the vocabulary included). EOG tokens stay allowed
 * exactly when the document may end here; once it is complete and nothing
 * can follow, only they do. CAIRN_ENOTFOUND when no token at all is
 * allowed (the vocabulary cannot spell any continuation); the logits are
 * masked even then. */
int cairn_grammar_matcher_mask(cairn_grammar_matcher *m, float *logits, int n_vocab);

/* Advance over a sampled token. CAIRN_EINVAL (state unchanged) for a token
 * the grammar refuses; an EOG token is accepted (changing nothing) when the
 * document may end. */
int cairn_grammar_matcher_accept(cairn_grammar_matcher *m, int32_t token);
/* The same over raw bytes (tests, validation): all or nothing. */
int cairn_grammar_matcher_accept_bytes(cairn_grammar_matcher *m, const char *bytes, size_t len);
/* The text so far is a complete document (more may still follow, e.g. digits). */
bool cairn_grammar_matcher_can_end(const cairn_grammar_matcher *m);
/* Complete, and nothing may follow: generation should stop. */
bool cairn_grammar_matcher_done(const cairn_grammar_matcher *m);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_TEXT_H */
