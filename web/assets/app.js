// web/assets/app.js — cairn's page (docs/web.md), written for cairn: the
// Chat view (streaming replies from /v1/chat/completions, one named cairn
// session per conversation) and the Cache view (polls /web/state).
// Plain browser JavaScript, no library, nothing from the network but this
// server's own API.
"use strict";

(function () {
  const $ = function (id) { return document.getElementById(id); };
  const TIERS = ["device", "host", "disk", "shared"];
  const POLL_MS = 2000;

  // ---- storage (this browser only) -------------------------------------------------
  function load(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v === null ? fallback : JSON.parse(v);
    } catch (e) {
      return fallback;
    }
  }
  function save(key, value) {
    try { localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* full: keep going */ }
  }

  const state = {
    token: load("cairn.token", ""),
    authRequired: true,
    model: "",
    convs: load("cairn.convs", []),
    current: load("cairn.current", null),
    settings: load("cairn.settings", {}),
    busy: null,        // {ctrl, conv, msg} while a reply streams
    pollTimer: null,
    view: "chat",
    prefixText: {},    // "1,2,3" -> detokenized text
  };

  // ---- the API -------------------------------------------------------------------------
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (state.token) h.Authorization = "Bearer " + state.token;
    return h;
  }
  // An error answer -> "STATUS message" (OpenAI's error shape).
  async function errorText(resp) {
    let msg = resp.statusText;
    try {
      const body = await resp.json();
      if (body && body.error) msg = body.error.message || msg;
    } catch (e) { /* not JSON */ }
    return resp.status + " " + msg;
  }
  function api(path, opts) {
    opts = opts || {};
    opts.headers = headers(opts.headers);
    opts.cache = "no-store";
    return fetch(path, opts);
  }

  // ---- views ---------------------------------------------------------------------------
  function show(view) {
    state.view = view;
    $("token-view").classList.toggle("hidden", view !== "token");
    $("chat-view").classList.toggle("hidden", view !== "chat");
    $("cache-view").classList.toggle("hidden", view !== "cache");
    $("tab-chat").classList.toggle("active", view === "chat");
    $("tab-cache").classList.toggle("active", view === "cache");
    if (state.pollTimer) {
      clearInterval(state.pollTimer);
      state.pollTimer = null;
    }
    if (view === "cache") {
      refreshCache();
      state.pollTimer = setInterval(refreshCache, POLL_MS);
    }
    if (view === "chat") $("prompt").focus();
  }

  async function connect() {
    $("token-error").textContent = "";
    let resp;
    try {
      resp = await api("/v1/models");
    } catch (e) {
      $("token-error").textContent = "cannot reach the server: " + e.message;
      show("token");
      return false;
    }
    if (!resp.ok) {
      $("token-error").textContent = await errorText(resp);
      $("token-error").dataset.status = String(resp.status);
      show("token");
      return false;
    }
    const models = await resp.json();
    state.model = models.data && models.data[0] ? models.data[0].id : "";
    $("model").textContent = state.model;
    $("token-change").classList.toggle("hidden", !state.authRequired);
    show("chat");
    renderConvs();
    renderMessages();
    return true;
  }

  // ---- conversations ---------------------------------------------------------------------
  function randomHex(n) {
    const a = new Uint8Array(n);
    crypto.getRandomValues(a);
    return Array.from(a, function (b) { return b.toString(16).padStart(2, "0"); }).join("");
  }
  function conv() {
    return state.convs.find(function (c) { return c.id === state.current; }) || null;
  }
  function newConv() {
    const c = { id: "web-" + randomHex(12), title: "New chat", system: $("system").value,
                messages: [], updated: Date.now() };
    state.convs.unshift(c);
    state.current = c.id;
    persist();
    renderConvs();
    renderMessages();
    return c;
  }
  function persist() {
    save("cairn.convs", state.convs);
    save("cairn.current", state.current);
  }
  function selectConv(id) {
    if (state.busy) return;
    state.current = id;
    persist();
    renderConvs();
    renderMessages();
    show("chat");
  }

  function renderConvs() {
    const ul = $("conv-list");
    ul.textContent = "";
    state.convs.forEach(function (c) {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      li.className = c.id === state.current ? "active" : "";
      const t = document.createElement("span");
      t.className = "title";
      t.textContent = c.title;
      const n = document.createElement("span");
      n.className = "muted";
      n.textContent = " " + c.messages.filter(function (m) { return m.role === "user"; }).length + " turns";
      li.appendChild(t);
      li.appendChild(n);
      li.addEventListener("click", function () { selectConv(c.id); });
      ul.appendChild(li);
    });
    const c = conv();
    $("system").value = c ? c.system || "" : $("system").value;
  }

  function fmtInt(n) { return Number(n || 0).toLocaleString("en-US"); }

  function statsText(s) {
    if (!s) return "";
    const parts = ["prompt " + fmtInt(s.prompt_tokens) + " tok"];
    let cached = "cached " + fmtInt(s.cached_tokens);
    const tiers = TIERS.filter(function (t) { return s.by_tier && s.by_tier[t] > 0; })
      .map(function (t) { return t + " " + fmtInt(s.by_tier[t]); });
    if (tiers.length) cached += " (" + tiers.join(", ") + ")";
    parts.push(cached);
    if (s.ttft_ms !== null && s.ttft_ms !== undefined) parts.push("TTFT " + Math.round(s.ttft_ms) + " ms");
    parts.push(fmtInt(s.completion_tokens) + " tok out");
    if (s.stopped) parts.push("stopped");
    return parts.join(" · ");
  }

  function messageNode(m) {
    const div = document.createElement("div");
    div.className = "msg " + m.role;
    const role = document.createElement("div");
    role.className = "role";
    role.textContent = m.role === "user" ? "you" : "assistant";
    const body = document.createElement("div");
    body.className = "body";
    fillBody(body, m);
    div.appendChild(role);
    div.appendChild(body);
    const st = document.createElement("div");
    st.className = "stats";
    if (m.stats) {
      st.textContent = statsText(m.stats);
      st.dataset.cached = String(m.stats.cached_tokens || 0);
      st.dataset.prompt = String(m.stats.prompt_tokens || 0);
    }
    if (m.error) {
      st.textContent = m.error;
      st.classList.add("error");
    }
    div.appendChild(st);
    return div;
  }
  function fillBody(body, m) {
    body.textContent = "";
    if (m.role === "assistant" && m.reasoning) {
      // a reasoning model's analysis (reasoning_content), folded above the answer
      const d = document.createElement("details");
      d.className = "reasoning";
      d.open = !m.content; // open while it is all there is
      const s = document.createElement("summary");
      s.textContent = "Reasoning";
      const t = document.createElement("div");
      t.textContent = m.reasoning;
      d.appendChild(s);
      d.appendChild(t);
      body.appendChild(d);
    }
    if (m.role === "assistant") body.appendChild(window.cairnMarkdown.render(m.content));
    else body.textContent = m.content;
  }

  function renderMessages() {
    const box = $("messages");
    box.textContent = "";
    const c = conv();
    if (!c || !c.messages.length) {
      const p = document.createElement("p");
      p.className = "muted empty";
      p.textContent = "Ask something. Each conversation is a cairn session: its history stays " +
        "cached on the server, so the next turn only computes what is new.";
      box.appendChild(p);
      return;
    }
    c.messages.forEach(function (m) { box.appendChild(messageNode(m)); });
    box.scrollTop = box.scrollHeight;
  }

  // ---- sending -----------------------------------------------------------------------------
  function numberOf(id) {
    const v = $(id).value.trim();
    return v === "" ? null : Number(v);
  }
  function saveSettings() {
    state.settings = { temperature: $("temperature").value, top_p: $("top-p").value,
                       max_tokens: $("max-tokens").value, seed: $("seed").value };
    save("cairn.settings", state.settings);
  }

  async function send() {
    const text = $("prompt").value.trim();
    if (!text || state.busy) return;
    $("chat-error").textContent = "";
    const c = conv() || newConv();
    c.system = $("system").value;
    const history = c.messages.filter(function (m) { return !m.error; })
      .map(function (m) { return { role: m.role, content: m.content }; });
    const user = { role: "user", content: text };
    const reply = { role: "assistant", content: "", stats: null };
    c.messages.push(user, reply);
    if (c.title === "New chat") c.title = text.slice(0, 40);
    c.updated = Date.now();
    $("prompt").value = "";
    persist();
    renderConvs();
    renderMessages();

    const messages = [];
    if (c.system.trim()) messages.push({ role: "system", content: c.system });
    Array.prototype.push.apply(messages, history);
    messages.push(user);
    const body = { model: state.model, messages: messages, stream: true,
                   stream_options: { include_usage: true }, session_id: c.id };
    [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"],
     ["seed", "seed"]].forEach(function (p) {
      const v = numberOf(p[0]);
      if (v !== null && !Number.isNaN(v)) body[p[1]] = v;
    });

    const ctrl = new AbortController();
    state.busy = { ctrl: ctrl, conv: c, msg: reply };
    $("send").disabled = true;
    $("stop").disabled = false;
    const node = $("messages").lastChild;
    const bodyNode = node.querySelector(".body");
    node.classList.add("streaming");
    const t0 = performance.now();
    let ttft = null, usage = null, pending = false, stopped = false;
    function redraw() {
      pending = false;
      fillBody(bodyNode, reply);
      $("messages").scrollTop = $("messages").scrollHeight;
    }
    try {
      const resp = await api("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body), signal: ctrl.signal });
      if (!resp.ok) throw new Error(await errorText(resp));
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "", done = false;
      while (!done) {
        const r = await reader.read();
        if (r.done) break;
        buf += dec.decode(r.value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          event.split("\n").forEach(function (line) {
            if (line.indexOf("data:") !== 0) return;
            const data = line.slice(5).trim();
            if (data === "[DONE]") { done = true; return; }
            let chunk;
            try { chunk = JSON.parse(data); } catch (e) { return; }
            if (chunk.error) throw new Error(chunk.error.message || "error");
            const ch = chunk.choices && chunk.choices[0];
            const delta = ch && ch.delta && ch.delta.content;
            const thought = ch && ch.delta && ch.delta.reasoning_content;
            if (thought) {
              if (ttft === null) ttft = performance.now() - t0;
              reply.reasoning = (reply.reasoning || "") + thought;
              if (!pending) {
                pending = true;
                requestAnimationFrame(redraw);
              }
            }
            if (delta) {
              if (ttft === null) ttft = performance.now() - t0;
              reply.content += delta;
              if (!pending) {
                pending = true;
                requestAnimationFrame(redraw);
              }
            }
            if (chunk.usage) usage = chunk.usage;
          });
        }
      }
    } catch (e) {
      if (e.name === "AbortError") stopped = true;
      else {
        reply.error = e.message;
        $("chat-error").textContent = e.message;
      }
    }
    const det = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details : {};
    if (usage || stopped) {
      reply.stats = {
        prompt_tokens: usage ? usage.prompt_tokens : null,
        cached_tokens: det.cached_tokens || 0,
        by_tier: det.cached_tokens_by_tier || {},
        completion_tokens: usage ? usage.completion_tokens : null,
        ttft_ms: ttft,
        stopped: stopped,
      };
      if (!usage) {
        reply.stats.prompt_tokens = 0;
        reply.stats.completion_tokens = 0;
      }
    }
    if (reply.error && !reply.content) reply.content = "";
    state.busy = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    c.updated = Date.now();
    persist();
    renderConvs();
    renderMessages();
  }

  // ---- the Cache view ----------------------------------------------------------------------
  function fmtBytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    n = Number(n || 0);
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  }

  function renderTiers(st) {
    const box = $("tiers");
    box.textContent = "";
    st.tiers.forEach(function (t) {
      const d = document.createElement("div");
      d.className = "tier " + t.name + (t.on ? "" : " off");
      d.dataset.tier = t.name;
      const head = document.createElement("div");
      head.className = "tier-head";
      const name = document.createElement("strong");
      name.textContent = t.name;
      const info = document.createElement("span");
      info.className = "muted";
      const bar = document.createElement("div");
      bar.className = "bar";
      const fill = document.createElement("div");
      fill.className = "fill";
      bar.appendChild(fill);
      let frac = 0;
      if (!t.on) info.textContent = t.name === "shared" ? "off (no --shared-cache)" : "off";
      else if (t.name === "shared") info.textContent = (t.up ? "up" : "down") + " · " + fmtInt(t.writes) + " writes";
      else {
        const cap = t.capacity_bytes || 0;
        frac = t.name === "device" && t.capacity_pages
          ? (t.capacity_pages - t.free_pages) / t.capacity_pages
          : cap ? t.bytes / cap : 0;
        info.textContent = fmtInt(t.pages) + " pages · " + fmtBytes(t.bytes) +
          (cap ? " of " + fmtBytes(cap) : "");
      }
      fill.style.width = Math.min(100, Math.max(frac > 0 ? 1 : 0, frac * 100)).toFixed(1) + "%";
      d.dataset.pages = String(t.pages || 0);
      d.dataset.hits = String(t.hit_tokens || 0);
      const served = document.createElement("div");
      served.className = "muted small";
      served.textContent = "served " + fmtInt(t.hit_tokens) + " cached tokens";
      head.appendChild(name);
      head.appendChild(info);
      d.appendChild(head);
      d.appendChild(bar);
      d.appendChild(served);
      box.appendChild(d);
    });
    const tot = st.totals;
    $("totals").textContent = tot
      ? fmtInt(tot.requests) + " requests · " + fmtInt(tot.prompt_tokens) + " prompt tokens, " +
        fmtInt(tot.cached_tokens) + " from the cache · " + fmtInt(tot.generated_tokens) +
        " generated · " + tot.running + " running, " + tot.waiting + " waiting"
      : "";
  }

  const SVGNS = "http://www.w3.org/2000/svg";
  const SERIES = ["device", "host", "disk", "shared", "computed"];
  function renderChart(series) {
    const pts = series.points;
    const W = 600, H = 160, pad = 24;
    let max = 1;
    pts.forEach(function (p) {
      const sum = SERIES.reduce(function (a, k) { return a + p[k]; }, 0);
      if (sum > max) max = sum;
    });
    const svg = document.createElementNS(SVGNS, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + (H + pad));
    svg.setAttribute("class", "chart");
    const bw = W / pts.length;
    let total = 0;
    pts.forEach(function (p, i) {
      let y = H;
      SERIES.forEach(function (k) {
        if (!p[k]) return;
        total += p[k];
        const h = Math.max(1, p[k] / max * (H - 8));
        const r = document.createElementNS(SVGNS, "rect");
        r.setAttribute("x", (i * bw + 1).toFixed(1));
        r.setAttribute("width", Math.max(1, bw - 2).toFixed(1));
        r.setAttribute("y", (y - h).toFixed(1));
        r.setAttribute("height", h.toFixed(1));
        r.setAttribute("class", "s-" + k);
        const title = document.createElementNS(SVGNS, "title");
        title.textContent = k + ": " + p[k] + " tokens at " + new Date(p.t * 1000).toLocaleTimeString();
        r.appendChild(title);
        svg.appendChild(r);
        y -= h;
      });
    });
    const axis = document.createElementNS(SVGNS, "line");
    axis.setAttribute("x1", "0"); axis.setAttribute("x2", String(W));
    axis.setAttribute("y1", String(H)); axis.setAttribute("y2", String(H));
    axis.setAttribute("class", "axis");
    svg.appendChild(axis);
    [["-10 min", 0, "start"], ["now", W, "end"], [fmtInt(max) + " tok", 0, "start"]].forEach(function (l, k) {
      const t = document.createElementNS(SVGNS, "text");
      t.setAttribute("x", String(l[1]));
      t.setAttribute("y", String(k === 2 ? 10 : H + 16));
      t.setAttribute("text-anchor", l[2]);
      t.setAttribute("class", "label");
      t.textContent = l[0];
      svg.appendChild(t);
    });
    const box = $("chart");
    box.textContent = "";
    box.dataset.total = String(total);
    box.appendChild(svg);
    const legend = $("legend");
    if (!legend.childNodes.length) {
      SERIES.forEach(function (k) {
        const s = document.createElement("span");
        const sw = document.createElement("i");
        sw.className = "sw s-" + k;
        s.appendChild(sw);
        s.appendChild(document.createTextNode(k === "computed" ? "computed (not cached)" : k + " hits"));
        legend.appendChild(s);
      });
    }
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function renderSessions(list) {
    const tb = $("sessions").querySelector("tbody");
    tb.textContent = "";
    if (!list.length) {
      const tr = document.createElement("tr");
      cell(tr, "no open sessions", "muted").colSpan = 4;
      tb.appendChild(tr);
    }
    list.forEach(function (s) {
      const tr = document.createElement("tr");
      const local = state.convs.find(function (c) { return c.id === s.name; });
      tr.dataset.name = s.name;
      cell(tr, local ? local.title + " (" + s.name + ")" : s.name || s.id.slice(0, 12) + "…");
      cell(tr, fmtInt(s.tokens));
      cell(tr, (s.busy ? "generating · " : "") + (s.persisted ? "persisted" : "live"));
      let where = "";
      if (s.last_turn) {
        const lt = s.last_turn;
        const tiers = TIERS.filter(function (t) { return lt.cached_by_tier[t] > 0; })
          .map(function (t) { return t + " " + fmtInt(lt.cached_by_tier[t]); });
        where = (tiers.length ? tiers.join(", ") : "nothing cached") + " of " + fmtInt(lt.prompt_tokens);
      }
      cell(tr, where);
      if (local) {
        tr.classList.add("resumable");
        tr.title = "open this conversation";
        tr.addEventListener("click", function () { selectConv(local.id); });
      }
      tb.appendChild(tr);
    });
  }

  async function prefixText(tokens) {
    const key = tokens.join(",");
    if (state.prefixText[key] !== undefined) return state.prefixText[key];
    state.prefixText[key] = "…";
    try {
      const r = await api("/detokenize", { method: "POST", headers: { "Content-Type": "application/json" },
                                           body: JSON.stringify({ tokens: tokens }) });
      if (r.ok) state.prefixText[key] = (await r.json()).content;
    } catch (e) { /* shown as … */ }
    return state.prefixText[key];
  }

  async function renderPrefixes(list) {
    const tb = $("prefixes").querySelector("tbody");
    const rows = [];
    for (const p of list) {
      const tr = document.createElement("tr");
      const text = await prefixText(p.tokens);
      cell(tr, JSON.stringify(text).slice(1, -1), "mono");
      cell(tr, fmtInt(p.uses));
      cell(tr, fmtInt(p.saved_tokens));
      rows.push(tr);
    }
    tb.textContent = "";
    if (!rows.length) {
      const tr = document.createElement("tr");
      cell(tr, "none yet: a prompt counts here when at least a page of it came from the cache", "muted").colSpan = 3;
      rows.push(tr);
    }
    rows.forEach(function (tr) { tb.appendChild(tr); });
  }

  async function refreshCache() {
    let resp;
    try {
      resp = await api("/web/state");
    } catch (e) {
      $("cache-status").textContent = "cannot reach the server";
      return;
    }
    if (!resp.ok) {
      $("cache-status").textContent = await errorText(resp);
      if (resp.status === 401) show("token");
      return;
    }
    const st = await resp.json();
    if (state.view !== "cache") return;
    renderTiers(st);
    renderChart(st.series);
    renderSessions(st.sessions);
    await renderPrefixes(st.prefixes);
    $("cache-status").textContent = "updated " + new Date(st.now * 1000).toLocaleTimeString() +
      (st.tenants ? " · this tenant's sessions and activity only" : "");
    $("cache-view").dataset.updated = String(st.now);
  }

  // ---- wiring ---------------------------------------------------------------------------------
  function init() {
    $("tab-chat").addEventListener("click", function () { show("chat"); });
    $("tab-cache").addEventListener("click", function () { show("cache"); });
    $("token-change").addEventListener("click", function () { show("token"); });
    $("token-form").addEventListener("submit", function (e) {
      e.preventDefault();
      state.token = $("token").value.trim();
      save("cairn.token", state.token);
      connect();
    });
    $("new-chat").addEventListener("click", function () { if (!state.busy) newConv(); });
    $("composer").addEventListener("submit", function (e) { e.preventDefault(); send(); });
    $("prompt").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        send();
      }
    });
    $("stop").addEventListener("click", function () { if (state.busy) state.busy.ctrl.abort(); });
    $("system").addEventListener("input", function () {
      const c = conv();
      if (c) { c.system = $("system").value; persist(); }
    });
    ["temperature", "top-p", "max-tokens", "seed"].forEach(function (id) {
      $(id).addEventListener("change", saveSettings);
    });
    const s = state.settings;
    if (s.temperature !== undefined) $("temperature").value = s.temperature;
    if (s.top_p !== undefined) $("top-p").value = s.top_p;
    if (s.max_tokens !== undefined) $("max-tokens").value = s.max_tokens;
    if (s.seed !== undefined) $("seed").value = s.seed;

    // Does this server want a token? (/web/info needs none.)
    fetch("/web/info", { cache: "no-store" }).then(function (r) { return r.json(); })
      .then(function (info) {
        state.authRequired = !!info.auth_required;
        if (state.authRequired && !state.token) show("token");
        else connect();
      })
      .catch(function () { connect(); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
