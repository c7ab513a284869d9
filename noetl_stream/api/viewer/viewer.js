// The noetl-stream execution viewer: plain browser JavaScript, no build step. The one third-party file is
// the graph layout library, vendored as it is published (vendor/dagre.min.js, see vendor/README.md).
//
// /ui                      the list of executions        (GET /api/executions, paged by cursor)
// /ui/executions/{id}      the step graph, the step panel, the controls and the timeline
//                          (GET /api/executions/{id}/graph, .../steps/{step}, .../result, and
//                          GET /api/executions/{id}/events?follow=1 read as server-sent events;
//                          POST .../cancel, .../pause, .../resume, .../retry)
// GET /api/session says once per page load what the token may do: a read-only token's action buttons
// are disabled (the API would answer 403).
//
// Every data call carries "Authorization: Bearer <token>". The token comes from the URL fragment
// (#token=...), which is removed from the address bar at once, or from the page's form, and is kept in
// sessionStorage (this tab only). EventSource cannot send headers, so the event stream is read with
// fetch() and a ReadableStream reader. Text from the server is only ever set as textContent.
"use strict";

(() => {
  const TOKEN_KEY = "noetl-viewer-token";
  const TERMINAL = new Set(["success", "failed", "cancelled", "rejected"]);
  const STATUSES = ["pending", "running", "paused", "success", "failed", "cancelled", "rejected"];
  const PAGE_SIZES = [10, 25, 50, 100, 200];
  const NODE_W = 196;
  const NODE_H = 68;
  const COL_GAP = 84;
  const ROW_GAP = 30;
  const PAD = 24;
  const MIN_SCALE = 0.02;
  const MAX_SCALE = 4;
  const READABLE = 0.6; // the smallest scale a graph opens at: below it, it opens at the start, not fitted
  const ITERATIONS_PAGE = 50;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const READ_ONLY_TITLE = "this token may only read: the server refuses its actions (an operator token may act)";

  class AuthError extends Error {}

  // -- small DOM helpers ---------------------------------------------------------------------------

  function build(doc, make, tag, attrs, children) {
    const node = make(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(typeof child === "string" ? doc.createTextNode(child) : child);
    }
    return node;
  }
  const h = (tag, attrs, ...children) =>
    build(document, (t) => document.createElement(t), tag, attrs, children);
  const s = (tag, attrs, ...children) =>
    build(document, (t) => document.createElementNS(SVG_NS, t), tag, attrs, children);
  const byId = (id) => document.getElementById(id);
  const fill = (node, ...children) => node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const enc = encodeURIComponent;

  // -- the token and the API -----------------------------------------------------------------------

  function takeTokenFromFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const given = params.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  async function refusal(resp) {
    let detail = "HTTP " + resp.status;
    try {
      const body = await resp.json();
      detail = body.detail || body.error || detail;
    } catch (_) {
      // not JSON: keep the status
    }
    return detail;
  }

  async function api(path, accept = "application/json") {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) throw new AuthError("no token yet");
    const resp = await fetch("/api" + path, {
      headers: { Authorization: "Bearer " + token, Accept: accept },
      cache: "no-store",
    });
    if (resp.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      throw new AuthError("the server refused the token");
    }
    if (!resp.ok) throw new Error(await refusal(resp));
    return resp;
  }

  const apiJson = async (path) => (await api(path)).json();

  // What the token may do (GET /api/session): asked once per page load, after the token is known.
  const session = { may: null };

  async function loadSession() {
    if (session.may) return;
    try {
      session.may = (await apiJson("/session")).may;
    } catch (err) {
      if (err instanceof AuthError) throw err;
      session.may = ["read", "operate"]; // a server that cannot say: the buttons stay, its answer is shown
    }
    document.body.dataset.may = session.may.join(" ");
  }

  const mayOperate = () => !session.may || session.may.includes("operate");

  // An operator's action: the API's answer as it is, a refusal included (shown, never thrown).
  async function apiSend(path, body) {
    const token = sessionStorage.getItem(TOKEN_KEY) || "";
    let resp;
    try {
      resp = await fetch("/api" + path, {
        method: "POST",
        headers: { Authorization: "Bearer " + token, Accept: "application/json", "Content-Type": "application/json" },
        body: JSON.stringify(body || {}),
        cache: "no-store",
      });
    } catch (err) {
      return { ok: false, status: 0, detail: String(err && err.message ? err.message : err) };
    }
    if (resp.ok) return { ok: true, status: resp.status, body: await resp.json() };
    const detail = resp.status === 401 ? "the server refused the token" : await refusal(resp);
    return { ok: false, status: resp.status, detail };
  }

  function showLogin(message) {
    document.body.dataset.view = "login";
    byId("app").replaceChildren();
    byId("login").hidden = false;
    const error = byId("login-error");
    error.hidden = !message;
    error.textContent = message || "";
    byId("token-input").focus();
  }

  function showError(message) {
    const shown = byId("page-error");
    if (shown) shown.textContent = message;
    else byId("app").prepend(h("p", { class: "error-text", id: "page-error", text: message }));
  }

  // -- formatting ----------------------------------------------------------------------------------

  function parseTime(iso) {
    return iso ? Date.parse(iso) : NaN;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 60) return seconds.toFixed(1) + " s";
    if (seconds < 3600) {
      const m = Math.floor(seconds / 60);
      return m + " m " + Math.round(seconds - m * 60) + " s";
    }
    const hrs = Math.floor(seconds / 3600);
    return hrs + " h " + Math.round((seconds - hrs * 3600) / 60) + " m";
  }

  function clock(iso) {
    const t = parseTime(iso);
    if (Number.isNaN(t)) return "";
    const d = new Date(t);
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function when(iso) {
    const t = parseTime(iso);
    if (Number.isNaN(t)) return "";
    const d = new Date(t);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function elapsed(fromIso) {
    const t = parseTime(fromIso);
    return Number.isNaN(t) ? null : Math.max(0, (Date.now() - t) / 1000);
  }

  function badge(status) {
    return h("span", { class: "badge status-" + status, "data-status": status, text: status });
  }

  function crumbs(...items) {
    byId("crumbs").replaceChildren(...items.map((item) => h("span", { class: "crumb" }, item)));
  }

  function executionLink(id, text) {
    return h("a", { href: "/ui/executions/" + enc(id), "data-execution-link": id, text: text || id });
  }

  function errorText(e) {
    if (!e) return "";
    const message = e.message || "";
    const kind = e.kind || "error";
    return message.startsWith(kind) ? message : `${kind}: ${message}`;
  }

  const isRef = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 && v.$ref && typeof v.$ref === "object";

  function refsIn(value, out = []) {
    if (isRef(value)) out.push(value.$ref);
    else if (Array.isArray(value)) value.forEach((v) => refsIn(v, out));
    else if (value && typeof value === "object") Object.values(value).forEach((v) => refsIn(v, out));
    return out;
  }

  function bytes(n) {
    if (typeof n !== "number") return "";
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1024 / 1024).toFixed(1) + " MiB";
  }

  const MAX_SHOWN = 2 * 1024 * 1024; // characters of a value shown; the rest is cut

  // A JSON value as text, with a button per value stored by reference that fetches and shows it.
  function jsonBlock(value, cls) {
    const text = JSON.stringify(value, null, 2);
    const shown = text === undefined ? "null" : text.length > MAX_SHOWN ? text.slice(0, MAX_SHOWN) + "\n… (" + text.length + " characters)" : text;
    const block = h("div", { class: "json " + (cls || "") }, h("pre", { text: shown }));
    for (const ref of refsIn(value)) block.append(storedRef(ref));
    return block;
  }

  const fetched = new Map(); // stored values fetched in this page, by key: shown again on a re-render

  function storedRef(ref) {
    const out = h("div", { class: "stored-value" });
    const shown = (got) => fill(out, h("span", { class: "muted", text: `stored value ${ref.key} (${bytes(got.size)})` }), jsonBlock(got.value, "fetched"));
    if (fetched.has(ref.key)) {
      shown(fetched.get(ref.key));
      return out;
    }
    const button = h("button", {
      type: "button",
      class: "fetch-stored",
      "data-key": ref.key,
      text: "Fetch stored value",
      on: {
        click: async () => {
          button.disabled = true;
          const owner = String(ref.key || "").split("/")[0];
          const query = `key=${enc(ref.key)}` + (ref.checksum ? `&checksum=${enc(ref.checksum)}` : "");
          try {
            const got = await apiJson(`/executions/${enc(owner)}/result?${query}`);
            fetched.set(ref.key, got);
            shown(got);
          } catch (err) {
            if (err instanceof AuthError) return onError(err);
            button.disabled = false;
            out.append(h("p", { class: "error-text", text: String(err.message || err) }));
          }
        },
      },
    });
    fill(out, h("span", { class: "muted", text: `stored by reference: ${ref.key} (${bytes(ref.size)}) ` }), button);
    return out;
  }

  function errorBlock(error) {
    if (!error) return null;
    return h("div", { class: "error-box" },
      h("p", { class: "error-text", text: errorText(error) }),
      error.task ? h("p", { class: "muted", text: "task: " + error.task }) : null,
      error.traceback ? h("pre", { class: "traceback", text: error.traceback }) : null,
    );
  }

  function section(title, ...content) {
    const items = content.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
    if (!items.length) return null;
    return h("section", { class: "detail-section", "data-section": title.toLowerCase() }, h("h3", { text: title }), items);
  }

  function field(label, value) {
    if (value === null || value === undefined || value === "") return null;
    return [h("dt", { text: label }), h("dd", { text: String(value) })];
  }

  // -- the list of executions ----------------------------------------------------------------------

  async function listView() {
    document.title = "noetl-stream · executions";
    crumbs("executions");
    const params = new URLSearchParams(location.search);
    const state = {
      cursors: [null], // the cursor of each page seen so far (page k starts after cursors[k])
      page: 0,
      limit: PAGE_SIZES.includes(Number(params.get("limit"))) ? Number(params.get("limit")) : 50,
      playbooks: new Set(),
    };
    const status = h("select", { id: "status-filter", "aria-label": "status" },
      h("option", { value: "", text: "every status" }),
      STATUSES.map((st) => h("option", { value: st, text: st })));
    status.value = STATUSES.includes(params.get("status")) ? params.get("status") : "";
    const playbook = h("input", { id: "playbook-filter", type: "search", list: "playbooks", placeholder: "playbook path or name", "aria-label": "playbook", autocomplete: "off" });
    playbook.value = params.get("playbook") || "";
    const known = h("datalist", { id: "playbooks" });
    const search = h("input", { id: "search", type: "search", placeholder: "execution id", "aria-label": "search by execution id", autocomplete: "off" });
    search.value = params.get("q") || "";
    const size = h("select", { id: "page-size", "aria-label": "rows per page" },
      PAGE_SIZES.map((n) => h("option", { value: String(n), text: `${n} per page` })));
    size.value = String(state.limit);
    const prev = h("button", { type: "button", id: "prev-page", text: "‹ Newer" });
    const next = h("button", { type: "button", id: "next-page", text: "Older ›" });
    const count = h("span", { id: "count", class: "muted" });
    const table = h("table", { id: "executions", class: "grid" },
      h("thead", {}, h("tr", {}, ["execution", "playbook", "status", "started", "duration", "steps", "retry"].map((c) => h("th", { text: c })))),
      h("tbody"));
    byId("app").replaceChildren(
      h("div", { class: "toolbar" }, h("h1", { text: "Executions" }), search, status, playbook, known, size),
      table,
      h("div", { class: "toolbar pager" }, prev, count, next),
    );

    const query = () => {
      const q = new URLSearchParams({ order: "started", limit: String(state.limit) });
      if (status.value) q.set("status", status.value);
      if (playbook.value.trim()) q.set("playbook", playbook.value.trim());
      if (search.value.trim()) q.set("q", search.value.trim());
      const cursor = state.cursors[state.page];
      if (cursor) q.set("cursor", cursor);
      return q;
    };
    const remember = () => {
      const q = new URLSearchParams();
      for (const key of ["status", "playbook", "q"]) {
        const v = { status: status.value, playbook: playbook.value.trim(), q: search.value.trim() }[key];
        if (v) q.set(key, v);
      }
      if (state.limit !== 50) q.set("limit", String(state.limit));
      const text = q.toString();
      history.replaceState(null, "", location.pathname + (text ? "?" + text : ""));
    };

    const row = (item) => {
      const steps = Object.values(item.steps || {});
      const tally = {};
      for (const st of steps) tally[st] = (tally[st] || 0) + 1;
      const summary = Object.entries(tally).map(([k, v]) => `${v} ${k}`).join(", ");
      const took = item.duration_s ?? (item.status === "running" ? elapsed(item.started_at) : null);
      const retries = item.retried_by || [];
      if (item.path || item.name) state.playbooks.add(item.path || item.name);
      return h("tr", { "data-execution-id": item.execution_id, "data-status": item.status },
        h("td", {}, executionLink(item.execution_id)),
        h("td", { class: "playbook", text: item.path || item.name || item.file || "" }),
        h("td", {}, badge(item.status), item.paused ? h("span", { class: "badge paused", text: "paused" }) : null),
        h("td", { class: "muted started", title: item.started_at || "", text: when(item.started_at) }),
        h("td", { class: "num duration", text: duration(took) }),
        h("td", { class: "muted", text: summary }),
        h("td", { class: "retry-links" },
          item.retry_of ? h("span", { class: "retry-of" }, "retry of ", executionLink(item.retry_of, item.retry_of.slice(0, 8) + "…")) : null,
          retries.length ? h("span", { class: "retried-by" }, "retried by ", retries.map((r, i) => [i ? ", " : "", executionLink(r, r.slice(0, 8) + "…")])) : null,
        ),
      );
    };

    let loading = 0;
    const load = async () => {
      const mine = ++loading;
      const page = await apiJson("/executions?" + query().toString());
      if (mine !== loading) return; // a newer request (another filter) answers instead
      table.tBodies[0].replaceChildren(...page.items.map(row));
      if (!page.items.length) table.tBodies[0].append(h("tr", { class: "empty" }, h("td", { colspan: 7, class: "muted", text: "No execution matches." })));
      state.cursors[state.page + 1] = page.next_cursor || null;
      const first = page.offset + 1;
      const last = page.offset + page.items.length;
      count.textContent = page.items.length ? `${first}–${last} of ${page.total}` : `0 of ${page.total}`;
      prev.disabled = state.page === 0;
      next.disabled = !page.next_cursor;
      fill(known, [...state.playbooks].sort().map((p) => h("option", { value: p })));
      document.body.dataset.page = String(state.page + 1);
      document.body.dataset.total = String(page.total);
      document.body.dataset.loaded = "true";
    };
    const reload = () => {
      state.cursors = [null];
      state.page = 0;
      remember();
      document.body.dataset.loaded = "false";
      load().catch(onError);
    };
    let typing = null;
    const onType = () => {
      clearTimeout(typing);
      typing = setTimeout(reload, 250);
    };
    status.addEventListener("change", reload);
    playbook.addEventListener("input", onType);
    search.addEventListener("input", onType);
    size.addEventListener("change", () => {
      state.limit = Number(size.value);
      reload();
    });
    next.addEventListener("click", () => {
      if (!state.cursors[state.page + 1]) return;
      state.page += 1;
      document.body.dataset.loaded = "false";
      load().catch(onError);
    });
    prev.addEventListener("click", () => {
      if (state.page === 0) return;
      state.page -= 1;
      document.body.dataset.loaded = "false";
      load().catch(onError);
    });
    document.body.dataset.view = "list";
    await load();
    setInterval(() => {
      if (document.visibilityState === "visible") load().catch(onError);
    }, 5000);
  }

  // -- one execution: layout -----------------------------------------------------------------------

  const view = {
    id: "",
    graph: null,
    selected: null,
    t0: null,
    events: 0,
    layout: null, // {key, at: {step: {x, y}}, arcs: [points per arc], width, height}
    zoom: { k: 1, x: 0, y: 0 },
    placed: false, // the first view of the graph was chosen (fit, or the start at a readable scale)
    detail: null,
    detailRun: null,
    iterationPage: 0,
    openIteration: null,
  };

  function layoutKey(g) {
    return g.steps.map((st) => st.name).join("\u0000") + "\u0001" + g.arcs.map((a) => a.source + ">" + a.target).join("\u0000");
  }

  // Positions of the steps and the arcs' routes: dagre's layered layout when it is there, else the
  // server's layers (`layer`, `order`), as before.
  function computeLayout(g) {
    const lib = window.dagre;
    if (lib && lib.graphlib && lib.layout) {
      try {
        const dg = new lib.graphlib.Graph({ multigraph: true });
        dg.setGraph({ rankdir: "LR", nodesep: ROW_GAP, ranksep: COL_GAP, edgesep: 12, marginx: PAD, marginy: PAD });
        dg.setDefaultEdgeLabel(() => ({}));
        for (const st of g.steps) dg.setNode(st.name, { width: NODE_W, height: NODE_H });
        g.arcs.forEach((arc, i) => {
          if (dg.hasNode(arc.source) && dg.hasNode(arc.target)) dg.setEdge(arc.source, arc.target, { minlen: 1 }, "a" + i);
        });
        lib.layout(dg);
        const at = {};
        for (const st of g.steps) {
          const n = dg.node(st.name);
          at[st.name] = { x: n.x - NODE_W / 2, y: n.y - NODE_H / 2 };
        }
        const routes = g.arcs.map((arc, i) => {
          const e = dg.edge({ v: arc.source, w: arc.target, name: "a" + i });
          return e && e.points ? e.points : null;
        });
        const info = dg.graph();
        return { key: layoutKey(g), at, routes, width: info.width || 0, height: info.height || 0, engine: "dagre" };
      } catch (err) {
        console.warn("dagre layout failed, using the server's layers", err);
      }
    }
    const at = {};
    let cols = 0;
    let rows = 0;
    for (const st of g.steps) {
      at[st.name] = { x: PAD + st.layer * (NODE_W + COL_GAP), y: PAD + st.order * (NODE_H + ROW_GAP) };
      cols = Math.max(cols, st.layer + 1);
      rows = Math.max(rows, st.order + 1);
    }
    const width = PAD * 2 + cols * NODE_W + Math.max(0, cols - 1) * COL_GAP;
    const height = PAD * 2 + rows * NODE_H + Math.max(0, rows - 1) * ROW_GAP + ROW_GAP + 20;
    return { key: layoutKey(g), at, routes: g.arcs.map(() => null), width, height, engine: "layers" };
  }

  function routePath(points) {
    if (points.length < 2) return null;
    let d = `M ${points[0].x} ${points[0].y}`;
    if (points.length === 2) return d + ` L ${points[1].x} ${points[1].y}`;
    for (let i = 1; i < points.length - 1; i++) {
      const p = points[i];
      const q = points[i + 1];
      const mx = i === points.length - 2 ? q.x : (p.x + q.x) / 2;
      const my = i === points.length - 2 ? q.y : (p.y + q.y) / 2;
      d += ` Q ${p.x} ${p.y}, ${mx} ${my}`;
    }
    return d;
  }

  function arcPath(arc, i, layout) {
    const route = layout.routes[i];
    if (route) return routePath(route);
    const a = layout.at[arc.source];
    const b = layout.at[arc.target];
    if (!a || !b) return null;
    if (!arc.back && b.x > a.x) {
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x;
      const y2 = b.y + NODE_H / 2;
      const dx = Math.max(30, (x2 - x1) / 2);
      return `M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`;
    }
    const x1 = a.x + NODE_W / 2 + 12;
    const y1 = a.y + NODE_H;
    const x2 = b.x + NODE_W / 2 - 12;
    const y2 = b.y + NODE_H;
    const dip = Math.max(y1, y2) + ROW_GAP + 14;
    return `M ${x1} ${y1} C ${x1} ${dip}, ${x2} ${dip}, ${x2} ${y2}`;
  }

  // -- one execution: zoom and pan -----------------------------------------------------------------

  function applyZoom() {
    const vp = byId("viewport");
    const z = view.zoom;
    if (vp) vp.setAttribute("transform", `translate(${z.x} ${z.y}) scale(${z.k})`);
    const svg = byId("graph");
    if (svg) svg.dataset.scale = z.k.toFixed(4);
    const level = byId("zoom-level");
    if (level) level.textContent = Math.round(z.k * 100) + "%";
    updateMinimap();
  }

  // -- one execution: the overview (the whole graph, small, with the part in view outlined) ---------

  function buildMinimap(g, L) {
    const mini = byId("minimap");
    if (!mini) return;
    mini.setAttribute("viewBox", `0 0 ${L.width} ${L.height}`);
    const boxes = g.steps.map((st) => {
      const p = L.at[st.name];
      return s("rect", { x: p.x, y: p.y, width: NODE_W, height: NODE_H, rx: 10, "data-step": st.name });
    });
    fill(mini, s("g", {}, boxes), s("rect", { id: "minimap-view", class: "minimap-view", rx: 6 }));
    view.miniBoxes = boxes;
  }

  function updateMinimap() {
    const mini = byId("minimap");
    const L = view.layout;
    const frame = byId("minimap-view");
    if (!mini || !L || !frame) return;
    const z = view.zoom;
    const { w, h: hh } = viewportSize();
    const x = -z.x / z.k;
    const y = -z.y / z.k;
    const vw = w / z.k;
    const vh = hh / z.k;
    frame.setAttribute("x", String(Math.max(0, x)));
    frame.setAttribute("y", String(Math.max(0, y)));
    frame.setAttribute("width", String(Math.max(0, Math.min(L.width, x + vw) - Math.max(0, x))));
    frame.setAttribute("height", String(Math.max(0, Math.min(L.height, y + vh) - Math.max(0, y))));
    // shown only while part of the graph is out of view (an SVG element has no `hidden` property)
    const whole = x <= 0.5 && y <= 0.5 && x + vw >= L.width - 0.5 && y + vh >= L.height - 0.5;
    if (whole) mini.setAttribute("hidden", "");
    else mini.removeAttribute("hidden");
  }

  // A press (or a drag) on the overview brings that part of the graph to the middle of the view.
  function wireMinimap(mini) {
    let pressed = null;
    const centreAt = (e) => {
      const ctm = mini.getScreenCTM();
      if (!ctm) return;
      const pt = new DOMPoint(e.clientX, e.clientY).matrixTransform(ctm.inverse());
      const { w, h: hh } = viewportSize();
      view.zoom.x = w / 2 - pt.x * view.zoom.k;
      view.zoom.y = hh / 2 - pt.y * view.zoom.k;
      applyZoom();
    };
    mini.addEventListener("pointerdown", (e) => {
      e.stopPropagation();
      pressed = e.pointerId;
      mini.setPointerCapture(e.pointerId);
      centreAt(e);
    });
    mini.addEventListener("pointermove", (e) => pressed === e.pointerId && centreAt(e));
    const end = (e) => {
      if (pressed === e.pointerId) pressed = null;
    };
    mini.addEventListener("pointerup", end);
    mini.addEventListener("pointercancel", end);
  }

  function zoomAt(factor, cx, cy) {
    const z = view.zoom;
    const k = Math.min(MAX_SCALE, Math.max(MIN_SCALE, z.k * factor));
    // keep the graph point under (cx, cy) where it is
    z.x = cx - ((cx - z.x) * k) / z.k;
    z.y = cy - ((cy - z.y) * k) / z.k;
    z.k = k;
    applyZoom();
  }

  function viewportSize() {
    const svg = byId("graph");
    const r = svg ? svg.getBoundingClientRect() : { width: 800, height: 500 };
    return { w: r.width || 800, h: r.height || 500 };
  }

  function fit() {
    const L = view.layout;
    if (!L) return;
    const { w, h: hh } = viewportSize();
    const k = Math.min(MAX_SCALE, Math.max(MIN_SCALE, Math.min(w / L.width, hh / L.height, 1.25)));
    view.zoom = { k, x: (w - L.width * k) / 2, y: (hh - L.height * k) / 2 };
    applyZoom();
  }

  // Show `name`'s box at scale `k`: the first step at the left edge, any other in the middle.
  function focus(name, k) {
    const L = view.layout;
    const p = L && L.at[name];
    if (!p) return;
    const { w, h: hh } = viewportSize();
    const first = view.graph.steps[0] && view.graph.steps[0].name === name;
    const x = first ? PAD - p.x * k : w / 2 - (p.x + NODE_W / 2) * k;
    view.zoom = { k, x, y: hh / 2 - (p.y + NODE_H / 2) * k };
    applyZoom();
  }

  // The first view: the whole graph when it stays readable; else the start (or the step that runs or
  // failed) at a readable scale, the rest a drag or a "fit" away.
  function placeFirst() {
    const L = view.layout;
    const { w, h: hh } = viewportSize();
    const k = Math.min(w / L.width, hh / L.height, 1);
    if (k >= READABLE) {
      fit();
    } else {
      const g = view.graph;
      const busy = g.steps.find((st) => st.status === "running" || st.status === "scheduled") || g.steps.find((st) => st.status === "failed");
      focus((busy || g.steps[0]).name, 0.9);
    }
    view.placed = true;
  }

  function wireZoom(svg) {
    svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = svg.getBoundingClientRect();
      const factor = Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.0015));
      zoomAt(factor, e.clientX - r.left, e.clientY - r.top);
    }, { passive: false });
    let drag = null;
    svg.addEventListener("pointerdown", (e) => {
      if (e.button !== 0 || e.target.closest("g.node")) return;
      drag = { x: e.clientX, y: e.clientY, zx: view.zoom.x, zy: view.zoom.y, id: e.pointerId };
      svg.setPointerCapture(e.pointerId);
      svg.classList.add("dragging");
    });
    svg.addEventListener("pointermove", (e) => {
      if (!drag || e.pointerId !== drag.id) return;
      view.zoom.x = drag.zx + (e.clientX - drag.x);
      view.zoom.y = drag.zy + (e.clientY - drag.y);
      applyZoom();
    });
    const end = (e) => {
      if (!drag || e.pointerId !== drag.id) return;
      drag = null;
      svg.classList.remove("dragging");
    };
    svg.addEventListener("pointerup", end);
    svg.addEventListener("pointercancel", end);
    svg.addEventListener("keydown", (e) => {
      const { w, h: hh } = viewportSize();
      if (e.key === "+" || e.key === "=") zoomAt(1.25, w / 2, hh / 2);
      else if (e.key === "-") zoomAt(0.8, w / 2, hh / 2);
      else if (e.key === "0") fit();
      else return;
      e.preventDefault();
    });
  }

  // -- one execution: the graph --------------------------------------------------------------------

  function nodeLines(step) {
    const running = step.status === "running" || step.status === "scheduled";
    const took = running ? elapsed(step.started_at || step.scheduled_at) : step.duration_s;
    const status = [step.status, duration(took)].filter(Boolean).join(" · ");
    let extra = "";
    if (step.loop) {
      const lp = step.loop;
      const total = lp.total === null || lp.total === undefined ? "?" : lp.total;
      extra = `loop ${lp.done}/${total}` + (lp.failed ? ` · ${lp.failed} failed` : "");
    } else if (step.kind === "router") {
      extra = "router";
    } else {
      extra = step.tasks.length === 1 ? step.tasks[0] : `${step.tasks.length} tasks`;
    }
    if (step.retries) extra += ` · ${step.retries} ${step.retries === 1 ? "retry" : "retries"}`;
    if (step.runs > 1) extra += ` · ${step.runs} runs`;
    return { status, extra };
  }

  // The graph's elements are made once per layout and updated in place afterwards: a node under the
  // pointer stays the same element across refreshes, so a click on it is never lost.
  function buildGraph(vp, g, L) {
    const arcs = g.arcs.map((arc, i) => {
      const d = arcPath(arc, i, L);
      if (!d) return null;
      return s("path", { d, "data-source": arc.source, "data-target": arc.target }, s("title"));
    });
    const nodes = g.steps.map((step) => {
      const p = L.at[step.name];
      const parts = [
        s("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 8 }),
        s("rect", { class: "stripe", width: 6, height: NODE_H, rx: 3 }),
        s("text", { class: "name", x: 16, y: 22, text: step.name.length > 24 ? step.name.slice(0, 23) + "…" : step.name }),
        s("text", { class: "state", x: 16, y: 40 }),
        s("text", { class: step.loop ? "extra loop-progress" : "extra", x: 16, y: 57 }),
        step.loop ? s("rect", { class: "bar", x: 16, y: NODE_H - 6, width: NODE_W - 32, height: 3, rx: 1.5 }) : null,
        step.loop ? s("rect", { class: "bar-fill", x: 16, y: NODE_H - 6, width: 0, height: 3, rx: 1.5 }) : null,
        s("title"),
      ];
      return s("g", {
        transform: `translate(${p.x} ${p.y})`,
        tabindex: "0",
        role: "button",
        "data-step": step.name,
        "data-kind": step.kind,
        on: {
          click: () => select(step.name),
          keydown: (e) => (e.key === "Enter" || e.key === " ") && select(step.name),
        },
      }, parts);
    });
    fill(vp, s("g", { class: "arcs" }, arcs), s("g", { class: "nodes" }, nodes));
    view.elements = { arcs, nodes };
    buildMinimap(g, L);
  }

  function renderGraph() {
    const g = view.graph;
    const vp = byId("viewport");
    if (!g || !vp) return;
    if (!view.layout || view.layout.key !== layoutKey(g) || !view.elements) {
      view.layout = computeLayout(g);
      byId("graph").dataset.layout = view.layout.engine;
      view.placed = false;
      buildGraph(vp, g, view.layout);
    }
    const { arcs, nodes } = view.elements;
    g.arcs.forEach((arc, i) => {
      const path = arcs[i];
      if (!path) return;
      const cls = ["arc", arc.taken ? "taken" : "", arc.when ? "conditional" : "", arc.back ? "back" : ""];
      path.setAttribute("class", cls.filter(Boolean).join(" "));
      path.setAttribute("marker-end", arc.taken ? "url(#arrow-taken)" : "url(#arrow)");
      path.dataset.taken = String(arc.taken);
      path.firstChild.textContent = `${arc.source} → ${arc.target}` + (arc.when ? `\nwhen: ${arc.when}` : "") + `\nfired ${arc.taken}×`;
    });
    g.steps.forEach((step, i) => {
      const node = nodes[i];
      const { status, extra } = nodeLines(step);
      node.setAttribute("class", "node status-" + step.status + (view.selected === step.name ? " selected" : ""));
      node.dataset.status = step.status;
      node.querySelector("text.state").textContent = status;
      node.querySelector("text.extra").textContent = extra;
      if (step.loop) {
        const lp = step.loop;
        const total = lp.total || Math.max(lp.started, lp.done + lp.failed) || 0;
        const frac = total ? Math.min(1, (lp.done + lp.failed) / total) : 0;
        node.querySelector("rect.bar-fill").setAttribute("width", String((NODE_W - 32) * frac));
      }
      const tip = [step.name, `status: ${step.status}`, step.error ? "error: " + errorText(step.error) : ""];
      node.lastChild.textContent = tip.filter(Boolean).join("\n");
      if (view.miniBoxes && view.miniBoxes[i]) view.miniBoxes[i].setAttribute("class", "mini status-" + step.status);
    });
    if (!view.placed) placeFirst();
  }

  // -- one execution: the step panel ---------------------------------------------------------------

  function select(name) {
    view.selected = view.selected === name ? null : name;
    view.detail = null;
    view.detailText = "";
    view.detailRun = null;
    view.iterationPage = 0;
    view.openIteration = null;
    view.openTasks = new Set();
    renderGraph();
    renderDetails();
    if (view.selected) loadDetail().catch(onError);
  }

  async function loadDetail() {
    const name = view.selected;
    if (!name) return;
    const path = `/executions/${enc(view.id)}/steps/${enc(name)}?offset=${view.iterationPage * ITERATIONS_PAGE}&limit=${ITERATIONS_PAGE}`;
    const detail = await apiJson(path);
    if (view.selected !== name) return;
    const text = JSON.stringify(detail);
    if (view.detail && view.detailText === text) return; // nothing new: the panel stays as it is
    view.detail = detail;
    view.detailText = text;
    renderDetails();
  }

  // The detail again when the step changed (coalesced: at most one request in flight).
  const detailRefresher = { busy: false, again: false };
  async function refreshDetail() {
    if (!view.selected) return;
    if (detailRefresher.busy) {
      detailRefresher.again = true;
      return;
    }
    detailRefresher.busy = true;
    try {
      await loadDetail();
    } finally {
      detailRefresher.busy = false;
      if (detailRefresher.again) {
        detailRefresher.again = false;
        refreshDetail().catch(onError);
      }
    }
  }

  function taskRunRow(tr) {
    const open = view.openTasks && view.openTasks.has(tr.task_run_id);
    const more = h("tr", { class: "task-more", hidden: !open },
      h("td", { colspan: 5 }, taskRunBody(tr)));
    const toggle = () => {
      more.hidden = !more.hidden;
      if (!view.openTasks) view.openTasks = new Set();
      if (more.hidden) view.openTasks.delete(tr.task_run_id);
      else view.openTasks.add(tr.task_run_id);
    };
    const row = h("tr", {
      class: "task-run status-" + tr.status,
      "data-task": tr.task,
      "data-attempt": tr.attempt,
      title: "show the args, result and error",
      on: { click: toggle },
    },
      h("td", { text: tr.task }),
      h("td", { class: "num", text: String(tr.attempt) }),
      h("td", {}, badge(tr.status)),
      h("td", { class: "num", text: duration(tr.duration_s) }),
      h("td", { class: "muted", text: tr.do || "" }),
    );
    return [row, more];
  }

  function taskRunBody(tr) {
    return h("div", { class: "task-body" },
      h("dl", {}, field("kind", tr.kind), field("worker", tr.worker), field("started", clock(tr.started_at)), field("finished", clock(tr.finished_at))),
      tr.args !== null && tr.args !== undefined
        ? section("Inputs", jsonBlock(tr.args, "args"))
        : tr.args_bytes ? section("Inputs", h("p", { class: "muted", text: tr.args_bytes > 0 ? `args of ${bytes(tr.args_bytes)}: too large to record` : "args that are no JSON: not recorded" })) : null,
      tr.status === "ok" ? section("Result", jsonBlock(tr.result, "result")) : null,
      section("Error", errorBlock(tr.error)),
      tr.output && (tr.output.stdout || tr.output.stderr)
        ? section("Output", tr.output.stdout ? h("pre", { class: "stdout", text: tr.output.stdout }) : null, tr.output.stderr ? h("pre", { class: "stderr", text: tr.output.stderr }) : null)
        : null,
    );
  }

  function taskRunsTable(runs) {
    if (!runs || !runs.length) return null;
    return h("table", { class: "grid compact task-runs" },
      h("thead", {}, h("tr", {}, ["task", "attempt", "status", "took", "then"].map((c) => h("th", { text: c })))),
      h("tbody", {}, runs.map(taskRunRow)));
  }

  function iterationsBlock(run) {
    if (!run.iterations_total) return null;
    const pages = Math.max(1, Math.ceil(run.iterations_total / ITERATIONS_PAGE));
    const rows = run.iterations.map((it) =>
      h("tr", {
        class: "iteration status-" + it.status + (view.openIteration === it.index ? " open" : ""),
        "data-index": it.index,
        "data-status": it.status,
        title: "open this iteration",
        on: {
          click: () => {
            view.openIteration = view.openIteration === it.index ? null : it.index;
            renderDetails();
          },
        },
      },
        h("td", { class: "num", text: "#" + it.index }),
        h("td", {}, badge(it.status)),
        h("td", { class: "num", text: duration(it.duration_s) }),
        h("td", { class: "muted", text: it.worker || "" }),
      ));
    const open = run.iterations.find((it) => it.index === view.openIteration);
    const pager = pages > 1
      ? h("div", { class: "toolbar pager" },
        h("button", { type: "button", id: "iterations-prev", disabled: view.iterationPage === 0 ? "disabled" : null, text: "‹", on: { click: () => { view.iterationPage -= 1; loadDetail().catch(onError); } } }),
        h("span", { class: "muted", text: `page ${view.iterationPage + 1} of ${pages}` }),
        h("button", { type: "button", id: "iterations-next", disabled: view.iterationPage + 1 >= pages ? "disabled" : null, text: "›", on: { click: () => { view.iterationPage += 1; loadDetail().catch(onError); } } }))
      : null;
    return [
      h("table", { class: "grid compact iterations", id: "iterations" },
        h("thead", {}, h("tr", {}, ["#", "status", "took", "worker"].map((c) => h("th", { text: c })))),
        h("tbody", {}, rows)),
      pager,
      open
        ? h("div", { class: "iteration-detail", id: "iteration-detail", "data-index": open.index },
          h("h4", { text: `Iteration #${open.index}` }),
          h("dl", {}, field("status", open.status), field("worker", open.worker), field("started", clock(open.started_at)), field("finished", clock(open.finished_at)), field("duration", duration(open.duration_s))),
          open.tasks.length && open.tasks.some((t) => t.args !== null && t.args !== undefined)
            ? section("Inputs", open.tasks.filter((t) => t.args !== null && t.args !== undefined).map((t) => [h("p", { class: "muted", text: `${t.task} (attempt ${t.attempt})` }), jsonBlock(t.args, "args")]))
            : null,
          open.status === "ok" ? section("Result", jsonBlock(open.result, "result")) : null,
          section("Error", errorBlock(open.error)),
          section("Task runs", taskRunsTable(open.tasks)))
        : null,
    ];
  }

  function runBlock(detail, run) {
    const attempts = run.tasks.length;
    const retried = run.tasks.filter((t) => t.do === "retry").length;
    const hasArgs = run.args && Object.keys(run.args).length;
    const declared = (detail.declared || []).filter((t) => t.args !== null && t.args !== undefined);
    const lastArgs = {};
    for (const t of run.tasks) if (t.args !== null && t.args !== undefined) lastArgs[t.task] = t.args;
    const inputs = [
      hasArgs ? [h("p", { class: "muted", text: "scheduled with (arc args)" }), jsonBlock(run.args, "args")] : null,
      Object.entries(lastArgs).map(([task, args]) => [h("p", { class: "muted", text: `${task} ran with` }), jsonBlock(args, "args")]),
      !Object.keys(lastArgs).length && declared.length
        ? declared.map((t) => [h("p", { class: "muted", text: `${t.name} declares (templates)` }), jsonBlock(t.args, "declared")])
        : null,
    ];
    return h("div", { class: "run", "data-run": run.step_run_id },
      h("h3", { text: "Run " + run.step_run_id }),
      h("dl", { id: "run-details" },
        field("status", run.status),
        field("worker", run.worker),
        field("pool", run.pool),
        field("scheduled", clock(run.scheduled_at)),
        field("started", clock(run.started_at)),
        field("finished", clock(run.finished_at)),
        field("duration", duration(run.duration_s ?? (run.started_at && !run.finished_at ? elapsed(run.started_at) : null))),
        field("task runs", attempts || null),
        field("retries", retried || null),
        run.loop ? field("iterations", `${run.loop.done ?? 0} done, ${run.loop.failed ?? 0} failed, total ${run.loop.total ?? "?"}`) : null,
        field("skipped", run.reason),
      ),
      section("Inputs", inputs),
      run.status === "ok" ? section("Result", jsonBlock(run.result, "result")) : null,
      section("Error", errorBlock(run.error)),
      section("Task runs", taskRunsTable(run.tasks)),
      section("Iterations", iterationsBlock(run)),
    );
  }

  function renderDetails() {
    const box = byId("details");
    const g = view.graph;
    if (!box || !g) return;
    const step = g.steps.find((st) => st.name === view.selected);
    if (!step) {
      fill(box,
        h("h2", { text: "Execution" }),
        h("dl", {},
          field("status", g.status + (g.paused ? " (paused)" : "")),
          field("playbook", g.path || g.name),
          field("started", g.started_at && new Date(g.started_at).toLocaleString()),
          field("duration", duration(g.finished_at ? g.duration_s : elapsed(g.started_at))),
          field("steps", g.steps.length),
          field("events", g.events),
        ),
        section("Error", errorBlock(g.error)),
        h("p", { class: "muted", text: "Select a step for its inputs, result, error and task runs." }),
      );
      return;
    }
    const d = view.detail;
    const runs = d ? d.runs : [];
    const run = runs.find((r) => r.step_run_id === view.detailRun) || runs[runs.length - 1];
    const lp = step.loop;
    const operate = mayOperate();
    const retryHere = h("button", {
      type: "button",
      id: "retry-from-step",
      class: "action",
      "data-step": step.name,
      disabled: operate && TERMINAL.has(g.status) ? null : "disabled",
      title: !operate ? READ_ONLY_TITLE : TERMINAL.has(g.status) ? `start a new execution from ${step.name}, reusing what succeeded before it` : "the execution has to end first",
      text: "Retry from this step",
      on: { click: () => act("retry", { from_steps: [step.name] }) },
    });
    fill(box,
      h("div", { class: "panel-head" }, h("h2", { text: step.name }), h("button", { type: "button", class: "close", title: "close", text: "×", on: { click: () => select(step.name) } })),
      step.desc ? h("p", { class: "muted", text: step.desc }) : null,
      h("dl", { id: "step-details", "data-step": step.name },
        field("status", step.status),
        field("kind", step.kind + (lp ? ` (${lp.mode}, ${lp.exec})` : "")),
        field("tasks", step.tasks.join(", ")),
        field("runs", step.runs),
        field("duration", duration(step.duration_s)),
        field("retries", step.retries),
        lp ? field("iterations", `${lp.done} done, ${lp.failed} failed, ${lp.started} started, total ${lp.total ?? "?"}`) : null,
        field("error", step.error && errorText(step.error)),
        field("line", step.line || null),
      ),
      h("div", { class: "actions" }, retryHere),
      runs.length > 1
        ? h("div", { class: "runs-picker" }, h("span", { class: "muted", text: "run: " }),
          runs.map((r, i) => h("button", {
            type: "button",
            class: "run-pick" + (r === run ? " current" : ""),
            text: String(i + 1),
            title: r.step_run_id,
            on: { click: () => { view.detailRun = r.step_run_id; renderDetails(); } },
          })))
        : null,
      !d ? h("p", { class: "muted", text: "loading…" }) : run ? runBlock(d, run) : h("p", { class: "muted", id: "no-run", text: step.status === "ok" ? "Not run in this execution (its result was reused from the execution retried)." : "Not run." }),
    );
    box.dataset.loaded = d ? "true" : "false";
  }

  // -- one execution: controls ---------------------------------------------------------------------

  const CONFIRM = { cancel: "Confirm cancel" };
  const armed = { action: null, timer: null };

  async function act(action, body) {
    const outcome = byId("action-outcome");
    if (CONFIRM[action] && armed.action !== action) {
      armed.action = action;
      clearTimeout(armed.timer);
      armed.timer = setTimeout(() => { armed.action = null; renderControls(); }, 5000);
      renderControls();
      return;
    }
    armed.action = null;
    clearTimeout(armed.timer);
    outcome.dataset.state = "pending";
    fill(outcome, `${action}…`);
    const res = await apiSend(`/executions/${enc(view.id)}/${action}`, body);
    outcome.dataset.state = res.ok ? "ok" : "refused";
    outcome.dataset.action = action;
    outcome.dataset.status = String(res.status);
    if (!res.ok) {
      fill(outcome, h("span", { class: "error-text", text: `${action} refused (HTTP ${res.status}): ${res.detail}` }));
    } else if (action === "retry") {
      const id = res.body.execution_id;
      fill(outcome, "retry started: ", executionLink(id));
      loadRetries().catch(() => {});
    } else {
      fill(outcome, `${action}: accepted (${res.body.accepted})`);
    }
    renderControls();
    if (res.ok) scheduleRefresh(100);
  }

  // The buttons are made once and updated in place (a refresh never replaces one under the pointer).
  const ACTIONS = [
    ["cancel", "Cancel", "stop it: nothing new is scheduled, running steps stop"],
    ["pause", "Pause", "running steps finish, nothing new starts"],
    ["resume", "Resume", "go on from where it paused"],
    ["retry", "Retry", "a new execution from the failed or interrupted steps, reusing what succeeded"],
  ];

  function renderControls() {
    const box = byId("controls");
    const g = view.graph;
    if (!box || !g) return;
    if (!box.childElementCount) {
      fill(box, ACTIONS.map(([action, label, title]) => h("button", {
        type: "button",
        class: "action",
        id: "action-" + action,
        "data-action": action,
        "data-label": label,
        "data-title": title,
        title,
        text: label,
        on: { click: () => act(action, action === "cancel" ? { reason: "cancelled from the viewer" } : {}) },
      })));
    }
    const ended = TERMINAL.has(g.status);
    const enabled = { cancel: !ended, pause: !ended && !g.paused, resume: !ended && g.paused, retry: ended };
    const operate = mayOperate();
    for (const button of box.querySelectorAll("button.action")) {
      const action = button.dataset.action;
      button.disabled = !operate || !enabled[action];
      button.title = operate ? button.dataset.title : READ_ONLY_TITLE;
      button.classList.toggle("armed", armed.action === action);
      button.textContent = armed.action === action ? CONFIRM[action] : button.dataset.label;
    }
  }

  async function loadRetries() {
    const page = await apiJson(`/executions?retry_of=${enc(view.id)}&order=started&limit=20`);
    view.retries = page.items.map((i) => i.execution_id);
    renderSummary();
  }

  function renderSummary() {
    const g = view.graph;
    const box = byId("summary");
    if (!g || !box) return;
    document.body.dataset.executionStatus = g.status;
    const retries = view.retries || [];
    fill(box,
      h("h1", { text: g.name || view.id }),
      badge(g.status),
      g.paused ? h("span", { class: "badge paused", text: "paused" }) : null,
      h("span", { class: "muted", text: g.path ? g.path + " · " : "" }),
      h("code", { class: "muted", text: view.id }),
      h("span", { class: "muted", text: " · " + duration(g.finished_at ? g.duration_s : elapsed(g.started_at)) }),
      g.retry_of ? h("span", { class: "retry-of" }, " · retry of ", executionLink(g.retry_of)) : null,
      retries.length ? h("span", { class: "retried-by" }, " · retried by ", retries.map((r, i) => [i ? ", " : "", executionLink(r)])) : null,
    );
  }

  async function refreshGraph() {
    const before = view.graph ? view.graph.last_seq : -1;
    const wasEnded = view.graph && TERMINAL.has(view.graph.status);
    view.graph = await apiJson(`/executions/${enc(view.id)}/graph`);
    renderSummary();
    renderGraph();
    renderControls();
    // The panel changes only with the execution (it keeps what was opened or fetched in it otherwise).
    if (view.graph.last_seq !== before) {
      if (view.selected) refreshDetail().catch(onError);
      else renderDetails();
    }
    if (TERMINAL.has(view.graph.status) && !wasEnded) loadRetries().catch(() => {});
    document.body.dataset.graphSeq = String(view.graph.last_seq);
  }

  // Coalesce refreshes: at most one request in flight, and one more after it if events kept coming.
  const refresher = { timer: null, busy: false, again: false };
  function scheduleRefresh(delay = 250) {
    if (refresher.timer) return;
    refresher.timer = setTimeout(async () => {
      refresher.timer = null;
      if (refresher.busy) {
        refresher.again = true;
        return;
      }
      refresher.busy = true;
      try {
        await refreshGraph();
      } catch (err) {
        onError(err);
      } finally {
        refresher.busy = false;
        if (refresher.again) {
          refresher.again = false;
          scheduleRefresh();
        }
      }
    }, delay);
  }

  // -- one execution: the timeline -----------------------------------------------------------------

  function describe(ev) {
    const p = ev.payload || {};
    const err = errorText;
    switch (ev.name) {
      case "task.started":
        return `${p.task} (${p.kind}) attempt ${p.attempt}`;
      case "task.done":
        return `${p.task}: ${p.status}` + (p.do && p.do !== "continue" ? ` → ${p.do}` : "") + (p.error ? ` · ${err(p.error)}` : "");
      case "step.failed":
      case "loop.iteration.failed":
      case "keychain.failed":
        return (p.index !== undefined ? `#${p.index} ` : "") + err(p.error);
      case "keychain.resolved":
        return (p.entries || []).join(", ");
      case "step.skipped":
        return p.reason || "";
      case "loop.iteration.started":
      case "loop.iteration.done":
        return `#${p.index}`;
      case "loop.started":
        return `${p.total} iterations`;
      case "loop.done":
        return `${p.done}/${p.total} done, ${p.failed} failed`;
      case "next.evaluated":
        return `on ${p.on}: → ${(p.matched || []).join(", ") || "no arc"}`;
      case "step.scheduled":
        return p.pool ? `pool ${p.pool}` : "";
      case "workflow.finished":
      case "playbook.processed":
        return (p.status || "") + (p.error ? ` · ${err(p.error)}` : "");
      case "playbook.request.evaluated":
        return p.path || p.name || "";
      default:
        return p.reason ? String(p.reason) : "";
    }
  }

  function addEvent(seq, ev) {
    const body = byId("timeline").tBodies[0];
    const t = parseTime(ev.timestamp);
    if (view.t0 === null && !Number.isNaN(t)) view.t0 = t;
    const offset = Number.isNaN(t) || view.t0 === null ? "" : "+" + ((t - view.t0) / 1000).toFixed(3) + " s";
    const payload = JSON.stringify(ev.payload || {}, null, 2);
    const more = h("tr", { class: "payload", hidden: true },
      h("td", { colspan: 6 }, h("pre", { text: payload.length > 8000 ? payload.slice(0, 8000) + "\n…" : payload })));
    const row = h("tr", {
      "data-seq": seq,
      "data-event": ev.name,
      "data-step": ev.step || "",
      class: "ev status-" + (ev.status || ""),
      title: "show the payload",
      on: { click: () => (more.hidden = !more.hidden) },
    },
      h("td", { class: "num", text: String(seq) }),
      h("td", { class: "muted", text: clock(ev.timestamp) }),
      h("td", { class: "num muted", text: offset }),
      h("td", { class: "event", text: ev.name }),
      h("td", { text: ev.step || "" }),
      h("td", { class: "detail", text: describe(ev) }),
    );
    body.append(row, more);
    view.events += 1;
    byId("event-count").textContent = `${view.events} events`;
  }

  function setLive(state) {
    const live = byId("live");
    live.hidden = false;
    live.dataset.state = state;
    live.textContent = { following: "● live", reconnecting: "● reconnecting", done: "finished" }[state] || state;
    document.body.dataset.live = state;
  }

  async function follow() {
    let after = 0; // the last message shown (whole when afterK is Infinity, else its first afterK events)
    let afterK = Infinity;
    let shownUpTo = 0; // the last message shown whole before `after`
    let finished = false;
    let failures = 0;
    setLive("following");
    while (!finished) {
      try {
        const from = afterK === Infinity ? after : shownUpTo; // a message shown in part comes again
        const path = `/executions/${enc(view.id)}/events?follow=1` + (from ? `&after=${from}` : "");
        const resp = await api(path, "text/event-stream");
        const reader = resp.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true }).replace(/\r/g, "");
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const msg = {};
            for (const line of block.split("\n")) {
              if (!line || line.startsWith(":")) continue;
              const i = line.indexOf(":");
              const key = i < 0 ? line : line.slice(0, i);
              const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
              msg[key] = key === "data" && msg.data !== undefined ? msg.data + "\n" + val : val;
            }
            if (msg.data === undefined) continue;
            // id: the stream sequence; "<seq>-<k>" for the k-th event a message carries (before it)
            const [seqText, kText] = String(msg.id || "").split("-");
            const seq = Number(seqText) || after;
            const k = kText === undefined ? Infinity : Number(kText);
            if (seq < after || (seq === after && k <= afterK)) continue; // already shown (a resumed stream)
            if (seq > after) shownUpTo = after;
            after = seq;
            afterK = k;
            const ev = JSON.parse(msg.data);
            addEvent(seq, ev);
            scheduleRefresh();
            if (ev.name === "playbook.processed") finished = true;
          }
        }
        failures = 0;
      } catch (err) {
        if (err instanceof AuthError) {
          showLogin(err.message);
          return;
        }
        failures += 1;
        setLive("reconnecting");
      }
      if (!finished) {
        await refreshGraph().catch(() => {});
        const shownWhole = view.graph && (view.graph.last_seq < after || (view.graph.last_seq === after && afterK === Infinity));
        if (view.graph && TERMINAL.has(view.graph.status) && shownWhole) break;
        await sleep(Math.min(5000, 500 * (failures + 1)));
        setLive("following");
      }
    }
    await refreshGraph();
    setLive("done");
  }

  async function executionView(id) {
    view.id = id;
    document.title = "noetl-stream · " + id;
    crumbs(h("a", { href: "/ui", text: "executions" }), id);
    const marker = (mid) =>
      s("marker", { id: mid, viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
        s("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
    const svg = s("svg", { id: "graph", role: "img", "aria-label": "step graph", tabindex: "0" },
      s("defs", {}, marker("arrow"), marker("arrow-taken")),
      s("g", { id: "viewport" }));
    const zoomButton = (id_, label, title, fn) => h("button", { type: "button", id: id_, title, text: label, on: { click: fn } });
    const centre = () => {
      const { w, h: hh } = viewportSize();
      return [w / 2, hh / 2];
    };
    byId("app").replaceChildren(
      h("section", { id: "summary", class: "summary" }),
      h("div", { class: "toolbar controls-bar" }, h("div", { id: "controls", class: "actions" }), h("span", { id: "action-outcome", class: "outcome", "aria-live": "polite" })),
      h("div", { class: "columns" },
        h("div", { class: "graph-wrap", id: "graph-wrap" },
          h("div", { class: "zoom-bar" },
            zoomButton("zoom-in", "+", "zoom in (+, or the wheel)", () => zoomAt(1.25, ...centre())),
            zoomButton("zoom-out", "−", "zoom out (-, or the wheel)", () => zoomAt(0.8, ...centre())),
            zoomButton("zoom-fit", "Fit", "the whole graph (0)", fit),
            zoomButton("zoom-reset", "100%", "actual size", () => { const [cx, cy] = centre(); zoomAt(1 / view.zoom.k, cx, cy); }),
            h("span", { id: "zoom-level", class: "muted" })),
          svg,
          s("svg", { id: "minimap", class: "minimap", role: "img", "aria-label": "overview of the graph", preserveAspectRatio: "xMidYMid meet" })),
        h("aside", { id: "details", class: "panel" }),
      ),
      h("section", { class: "timeline" },
        h("div", { class: "toolbar" }, h("h2", { text: "Event timeline" }), h("span", { id: "event-count", class: "muted" })),
        h("table", { id: "timeline", class: "grid" },
          h("thead", {}, h("tr", {}, ["seq", "time", "offset", "event", "step", "detail"].map((c) => h("th", { text: c })))),
          h("tbody"),
        ),
      ),
    );
    wireZoom(svg);
    wireMinimap(byId("minimap"));
    window.addEventListener("resize", updateMinimap);
    document.body.dataset.view = "execution";
    await loadSession();
    await refreshGraph();
    setInterval(() => {
      if (view.graph && !view.graph.finished_at) {
        renderSummary();
        renderGraph();
      }
    }, 1000);
    await follow();
  }

  // -- start ---------------------------------------------------------------------------------------

  function onError(err) {
    if (err instanceof AuthError) showLogin(err.message === "no token yet" ? "" : err.message);
    else showError(String(err && err.message ? err.message : err));
  }

  function route() {
    byId("login").hidden = true;
    const match = location.pathname.match(/\/ui\/executions\/([^/]+)\/?$/);
    return (match ? executionView(decodeURIComponent(match[1])) : listView()).catch(onError);
  }

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    byId("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = byId("token-input").value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      byId("token-input").value = "";
      session.may = null; // another token: asked again
      route();
    });
    route();
  });
})();
