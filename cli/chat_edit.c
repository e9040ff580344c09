/*
 * cli/chat_edit.c — the line editor of `cairn chat` (chat_edit.h).
 *
 * The terminal is put in raw mode for the time of one read (no echo, no
 * line discipline, no signals from keys: Ctrl-C arrives as a byte) and
 * restored before the line is returned, so a reply is printed, and Ctrl-C
 * during it raises SIGINT, in the terminal's normal mode. The line is
 * redrawn whole after every key: prompt, the part of the text that fits the
 * width (scrolled sideways to keep the cursor in view), clear to the end.
 * Columns are counted in code points (wide characters are not measured).
 */
#include "cli/chat_edit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

enum { KEY_CTRL_A = 1, KEY_CTRL_B = 2, KEY_CTRL_C = 3, KEY_CTRL_D = 4, KEY_CTRL_E = 5,
       KEY_CTRL_F = 6, KEY_CTRL_H = 8, KEY_TAB = 9, KEY_LF = 10, KEY_CTRL_K = 11,
       KEY_CTRL_L = 12, KEY_CR = 13, KEY_CTRL_N = 14, KEY_CTRL_P = 16, KEY_CTRL_U = 21,
       KEY_CTRL_W = 23, KEY_ESC = 27, KEY_BACKSPACE = 127,
       /* the keys of escape sequences, apart from every byte */
       KEY_UP = 256, KEY_DOWN, KEY_RIGHT, KEY_LEFT, KEY_HOME, KEY_END, KEY_DELETE };

/* ---- history ---------------------------------------------------------------- */

void chat_history_add(chat_history *h, const char *line)
{
    if (!line[0] || (h->n && strcmp(h->lines[h->n - 1], line) == 0))
        return;
    size_t max = h->max ? h->max : 1000;
    if (h->n == max) {
        free(h->lines[0]);
        memmove(h->lines, h->lines + 1, (h->n - 1) * sizeof *h->lines);
        h->n--;
    }
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 32;
        char **v = realloc(h->lines, cap * sizeof *v);
        if (!v)
            return;
        h->lines = v;
        h->cap = cap;
    }
    char *copy = strdup(line);
    if (copy)
        h->lines[h->n++] = copy;
}

void chat_history_free(chat_history *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->lines[i]);
    free(h->lines);
    memset(h, 0, sizeof *h);
}

/* ---- the line being edited -------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap, pos; /* bytes; pos is on a code point's first byte */
    const char *prompt;
    size_t prompt_cols;
} edit_line;

static bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

static size_t cols_of(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += !is_cont((unsigned char)s[i]);
    return c;
}

/* The byte offset of code point `col` (or the end). */
static size_t offset_of_col(const char *s, size_t n, size_t col)
{
    size_t i = 0, c = 0;
    while (i < n) {
        if (!is_cont((unsigned char)s[i]) && c++ == col)
            return i;
        i++;
    }
    return n;
}

static int line_reserve(edit_line *l, size_t more)
{
    if (l->len + more + 1 <= l->cap)
        return 0;
    size_t cap = l->cap ? l->cap : 128;
    while (cap < l->len + more + 1)
        cap *= 2;
    char *b = realloc(l->buf, cap);
    if (!b)
        return -1;
    l->buf = b;
    l->cap = cap;
    return 0;
}

static void line_set(edit_line *l, const char *text)
{
    size_t n = strlen(text);
    l->len = l->pos = 0;
    if (line_reserve(l, n) == 0) {
        memcpy(l->buf, text, n);
        l->len = l->pos = n;
    }
    l->buf[l->len] = '\0';
}

static void line_insert(edit_line *l, const char *bytes, size_t n)
{
    if (line_reserve(l, n))
        return;
    memmove(l->buf + l->pos + n, l->buf + l->pos, l->len - l->pos);
    memcpy(l->buf + l->pos, bytes, n);
    l->len += n;
    l->pos += n;
    l->buf[l->len] = '\0';
}

/* Remove bytes [from, to). */
static void line_cut(edit_line *l, size_t from, size_t to)
{
    memmove(l->buf + from, l->buf + to, l->len - to);
    l->len -= to - from;
    if (l->pos > to)
        l->pos -= to - from;
    else if (l->pos > from)
        l->pos = from;
    l->buf[l->len] = '\0';
}

static size_t prev_char(const edit_line *l, size_t i)
{
    while (i > 0 && is_cont((unsigned char)l->buf[--i]))
        ;
    return i;
}

static size_t next_char(const edit_line *l, size_t i)
{
    if (i < l->len)
        i++;
    while (i < l->len && is_cont((unsigned char)l->buf[i]))
        i++;
    return i;
}

static size_t term_cols(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

static void put(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void refresh(const edit_line *l)
{
    size_t width = term_cols();
    size_t avail = width > l->prompt_cols + 2 ? width - l->prompt_cols - 1 : 1;
    size_t cur = cols_of(l->buf, l->pos), total = cols_of(l->buf, l->len);
    size_t start = cur >= avail ? cur - avail + 1 : 0;
    size_t end = start + avail < total ? start + avail : total;
    size_t b0 = offset_of_col(l->buf, l->len, start), b1 = offset_of_col(l->buf, l->len, end);
    put("\r", 1);
    put(l->prompt, strlen(l->prompt));
    put(l->buf + b0, b1 - b0);
    char tail[32];
    int n = snprintf(tail, sizeof tail, "\x1b[0K\r");
    put(tail, (size_t)n);
    size_t col = l->prompt_cols + cur - start;
    if (col > 0) {
        n = snprintf(tail, sizeof tail, "\x1b[%zuC", col);
        put(tail, (size_t)n);
    }
}

/* ---- reading ---------------------------------------------------------------- */

/* One byte: 1, 0 at end of input, -1 when a read was interrupted. */
static int read_byte(unsigned char *c)
{
    ssize_t r = read(STDIN_FILENO, c, 1);
    if (r == 1)
        return 1;
    if (r < 0 && errno == EINTR)
        return -1;
    return 0;
}

/* After ESC: the rest of an arrow or editing key; its KEY_ value, or 0. */
static int read_escape(void)
{
    unsigned char a, b, c;
    if (read_byte(&a) != 1 || read_byte(&b) != 1)
        return 0;
    if (a == 'O')
        return b == 'H' ? KEY_HOME : b == 'F' ? KEY_END : 0;
    if (a != '[')
        return 0;
    switch (b) {
    case 'A': return KEY_UP;
    case 'B': return KEY_DOWN;
    case 'C': return KEY_RIGHT;
    case 'D': return KEY_LEFT;
    case 'H': return KEY_HOME;
    case 'F': return KEY_END;
    default: break;
    }
    if (b < '0' || b > '9')
        return 0;
    if (read_byte(&c) != 1)
        return 0;
    while (c != '~') { /* parameters such as "1;5" */
        if (!((c >= '0' && c <= '9') || c == ';') || read_byte(&c) != 1)
            return 0;
    }
    switch (b) {
    case '1': case '7': return KEY_HOME;
    case '4': case '8': return KEY_END;
    case '3': return KEY_DELETE;
    default: return 0;
    }
}

typedef struct {
    chat_history *h;
    size_t index;  /* h->n: the line being written                     */
    char *scratch; /* that line while the history is being looked at  */
} history_walk;

static void history_step(edit_line *l, history_walk *w, int dir)
{
    if (dir < 0 && w->index == 0)
        return;
    if (dir > 0 && w->index >= w->h->n)
        return;
    if (w->index == w->h->n) {
        free(w->scratch);
        w->scratch = strdup(l->buf);
    }
    w->index = dir < 0 ? w->index - 1 : w->index + 1;
    line_set(l, w->index == w->h->n ? (w->scratch ? w->scratch : "") : w->h->lines[w->index]);
}

/* A key that moves or deletes: true if it was one. */
static bool edit_key(edit_line *l, history_walk *w, int key)
{
    size_t i;
    switch (key) {
    case KEY_LEFT: case KEY_CTRL_B: l->pos = prev_char(l, l->pos); return true;
    case KEY_RIGHT: case KEY_CTRL_F: l->pos = next_char(l, l->pos); return true;
    case KEY_HOME: case KEY_CTRL_A: l->pos = 0; return true;
    case KEY_END: case KEY_CTRL_E: l->pos = l->len; return true;
    case KEY_UP: case KEY_CTRL_P: history_step(l, w, -1); return true;
    case KEY_DOWN: case KEY_CTRL_N: history_step(l, w, +1); return true;
    case KEY_DELETE: line_cut(l, l->pos, next_char(l, l->pos)); return true;
    case KEY_BACKSPACE: case KEY_CTRL_H:
        line_cut(l, prev_char(l, l->pos), l->pos);
        return true;
    case KEY_CTRL_U: line_cut(l, 0, l->pos); return true;
    case KEY_CTRL_K: line_cut(l, l->pos, l->len); return true;
    case KEY_CTRL_W:
        i = l->pos;
        while (i > 0 && l->buf[i - 1] == ' ')
            i--;
        while (i > 0 && l->buf[i - 1] != ' ')
            i--;
        line_cut(l, i, l->pos);
        return true;
    case KEY_CTRL_L: put("\x1b[H\x1b[2J", 7); return true;
    default: return false;
    }
}

static int edit_raw(edit_line *l, chat_history *h, volatile sig_atomic_t *quit)
{
    history_walk w = {.h = h, .index = h->n};
    int status = CHAT_EDIT_LINE;
    refresh(l);
    for (;;) {
        unsigned char c;
        int r = read_byte(&c);
        if (r < 0) {
            if (quit && *quit) {
                status = CHAT_EDIT_EOF;
                break;
            }
            refresh(l); /* a resize, a stop and continue: draw again */
            continue;
        }
        if (r == 0) {
            status = CHAT_EDIT_EOF;
            break;
        }
        if (c == KEY_CR || c == KEY_LF)
            break;
        if (c == KEY_CTRL_C) {
            status = CHAT_EDIT_INTERRUPT;
            put("^C", 2);
            break;
        }
        if (c == KEY_CTRL_D) {
            if (l->len == 0) {
                status = CHAT_EDIT_EOF;
                break;
            }
            edit_key(l, &w, KEY_DELETE);
        } else if (c == KEY_ESC) {
            edit_key(l, &w, read_escape());
        } else if (!edit_key(l, &w, c) && (c >= 0x20 || c == KEY_TAB)) {
            char ch = c == KEY_TAB ? ' ' : (char)c;
            line_insert(l, &ch, 1);
        }
        refresh(l);
    }
    free(w.scratch);
    put("\r\n", 2);
    return status;
}

/* stdin is not a terminal: plain lines, no editing. */
static int read_plain(const char *prompt, volatile sig_atomic_t *quit,
                      volatile sig_atomic_t *intr, char **line)
{
    if (isatty(STDOUT_FILENO)) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    char *buf = NULL;
    size_t cap = 0;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, stdin);
        if (n >= 0) {
            while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
                buf[--n] = '\0';
            *line = buf;
            return CHAT_EDIT_LINE;
        }
        if (errno == EINTR) {
            clearerr(stdin);
            if (quit && *quit)
                break;
            if (intr && *intr) {
                *intr = 0;
                free(buf);
                return CHAT_EDIT_INTERRUPT;
            }
            continue;
        }
        break;
    }
    free(buf);
    return CHAT_EDIT_EOF;
}

int chat_edit_read(const char *prompt, chat_history *h, volatile sig_atomic_t *quit,
                   volatile sig_atomic_t *intr, char **line)
{
    *line = NULL;
    struct termios saved, raw;
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved) != 0)
        return read_plain(prompt, quit, intr, line);
    raw = saved;
    raw.c_iflag &= (tcflag_t) ~(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_cflag |= CS8;
    raw.c_lflag &= (tcflag_t) ~(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0)
        return read_plain(prompt, quit, intr, line);
    fflush(stdout);
    edit_line l = {.prompt = prompt, .prompt_cols = cols_of(prompt, strlen(prompt))};
    line_set(&l, "");
    int status = l.buf ? edit_raw(&l, h, quit) : CHAT_EDIT_EOF;
    tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    if (status == CHAT_EDIT_LINE || status == CHAT_EDIT_INTERRUPT)
        *line = l.buf; /* an interrupted line: what was dropped */
    else
        free(l.buf);
    return status;
}
