/*
 * cli/chat_edit.h — the line editor of `cairn chat`: one line read from a
 * terminal in raw mode, with cursor movement, deletion and a history of the
 * lines entered (Up/Down). When stdin is not a terminal it reads plain lines.
 *
 * Keys: Left/Right, Ctrl-B/Ctrl-F, Home/End, Ctrl-A/Ctrl-E, Backspace,
 * Delete, Ctrl-U (to the start), Ctrl-K (to the end), Ctrl-W (the word
 * before), Up/Down and Ctrl-P/Ctrl-N (history), Ctrl-L (clear the screen),
 * Enter, Ctrl-C (the line is dropped: CHAT_EDIT_INTERRUPT), Ctrl-D on an
 * empty line (CHAT_EDIT_EOF).
 */
#ifndef CAIRN_CHAT_EDIT_H
#define CAIRN_CHAT_EDIT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char **lines; /* oldest first, each malloc'ed */
    size_t n, cap, max;
} chat_history;

enum { CHAT_EDIT_LINE = 0, CHAT_EDIT_EOF = 1, CHAT_EDIT_INTERRUPT = 2 };

/* Read one line after printing `prompt` (to stdout). *line is malloc'ed
 * (without the newline) with CHAT_EDIT_LINE, NULL otherwise. The flags
 * (either may be NULL) are set by the caller's signal handlers and looked
 * at when a read is interrupted: `quit` ends the read as EOF, `intr` (the
 * SIGINT of a non-terminal stdin; cleared here) as CHAT_EDIT_INTERRUPT.
 * Ctrl-C on a terminal gives CHAT_EDIT_INTERRUPT with *line the text it
 * dropped (malloc'ed, maybe empty). */
int chat_edit_read(const char *prompt, chat_history *h, volatile sig_atomic_t *quit,
                   volatile sig_atomic_t *intr, char **line);

/* Add a line to the history (not an empty one, not the last one again). */
void chat_history_add(chat_history *h, const char *line);
void chat_history_free(chat_history *h);

#endif
