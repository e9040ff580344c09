// web/assets/md.js — a small Markdown renderer for the chat's replies,
// written for cairn. It builds DOM nodes (never HTML strings), so nothing a
// model writes can become markup or script. Block level: fenced code (also
// an unclosed fence while a reply streams), headings, lists, block quotes,
// rules, paragraphs. Inline: code spans, bold, italics, http(s) links.
"use strict";

(function () {
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Inline markup into `parent`.
  function inline(parent, text) {
    const re = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
    let last = 0, m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      if (m[1]) parent.appendChild(el("code", null, m[2].trim() || m[2]));
      else if (m[3] || m[4]) { const b = el("strong"); inline(b, m[3] || m[4]); parent.appendChild(b); }
      else if (m[5] || m[6]) { const i = el("em"); inline(i, m[5] || m[6]); parent.appendChild(i); }
      else if (m[7]) {
        const a = el("a", null, m[7]);
        a.href = m[8];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        parent.appendChild(a);
      }
      last = re.lastIndex;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function codeBlock(lang, lines) {
    const pre = el("pre", "code");
    if (lang) pre.appendChild(el("span", "lang", lang));
    const code = el("code", null, lines.join("\n"));
    if (lang) code.dataset.lang = lang;
    pre.appendChild(code);
    return pre;
  }

  // Markdown text -> a DocumentFragment.
  function render(src) {
    const out = document.createDocumentFragment();
    const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    let para = [];
    function flush() {
      if (!para.length) return;
      const p = el("p");
      para.forEach(function (l, k) {
        if (k) p.appendChild(el("br"));
        inline(p, l);
      });
      out.appendChild(p);
      para = [];
    }
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/.exec(line))) {
        flush();
        const fence = m[1], body = [];
        i++;
        while (i < lines.length && lines[i].trim().indexOf(fence) !== 0) body.push(lines[i++]);
        i++; // the closing fence (or past the end while streaming)
        out.appendChild(codeBlock(m[2], body));
        continue;
      }
      if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flush();
        const h = el("h" + Math.min(6, m[1].length + 2));
        inline(h, m[2]);
        out.appendChild(h);
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        out.appendChild(el("hr"));
        i++;
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        const q = el("blockquote");
        q.appendChild(render(quoted.join("\n")));
        out.appendChild(q);
        continue;
      }
      if ((m = /^\s*([-*+]|\d+[.)])\s+/.exec(line))) {
        flush();
        const ordered = /\d/.test(m[1]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(m[1], 10) !== 1) list.start = parseInt(m[1], 10);
        const itemRe = ordered ? /^\s*\d+[.)]\s+(.*)$/ : /^\s*[-*+]\s+(.*)$/;
        while (i < lines.length) {
          const im = itemRe.exec(lines[i]);
          if (im) {
            const li = el("li");
            inline(li, im[1]);
            list.appendChild(li);
            i++;
          } else if (/^\s{2,}\S/.test(lines[i]) && list.lastChild) {
            list.lastChild.appendChild(el("br"));
            inline(list.lastChild, lines[i].trim());
            i++;
          } else break;
        }
        out.appendChild(list);
        continue;
      }
      if (!line.trim()) { flush(); i++; continue; }
      para.push(line);
      i++;
    }
    flush();
    return out;
  }

  window.cairnMarkdown = { render: render };
})();
