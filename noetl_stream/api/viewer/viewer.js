// The noetl-stream execution viewer: plain browser JavaScript, no build step, no third-party code.
//
// /ui                      the list of executions        (GET /api/executions)
// /ui/executions/{id}      the step graph and timeline   (GET /api/executions/{id}/graph, and
//                          GET /api/executions/{id}/events?follow=1 read as server-sent events)
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
  const NODE_W = 196;
  const NODE_H = 68;
  const COL_GAP = 84;
  const ROW_GAP = 30;
  const PAD = 24;
  const SVG_NS = "http://www.w3.org/2000/svg";

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
    for (const child of children.flat()) {
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
  const fill = (node, ...children) => node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // -- the token and the API -----------------------------------------------------------------------

  function takeTokenFromFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const given = params.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      history.replaceState(null, "", location.pathname + location.search);
    }
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
    if (!resp.ok) {
      let detail = "HTTP " + resp.status;
      try {
        const body = await resp.json();
        detail = body.detail || body.error || detail;
      } catch (_) {
        // not JSON: keep the status
      }
      throw new Error(detail);
    }
    return resp;
  }

  const apiJson = async (path) => (await api(path)).json();

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
    const m = Math.floor(seconds / 60);
    return m + " m " + Math.round(seconds - m * 60) + " s";
  }

  function clock(iso) {
    const t = parseTime(iso);
    if (Number.isNaN(t)) return "";
    const d = new Date(t);
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
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

  // -- the list of executions ----------------------------------------------------------------------

  async function listView() {
    document.title = "noetl-stream · executions";
    crumbs("executions");
    const filter = h(
      "select",
      { id: "status-filter", "aria-label": "status" },
      h("option", { value: "", text: "every status" }),
      STATUSES.map((st) => h("option", { value: st, text: st })),
    );
    const table = h(
      "table",
      { id: "executions", class: "grid" },
      h(
        "thead",
        {},
        h("tr", {}, ["execution", "playbook", "status", "steps", "updated"].map((c) => h("th", { text: c }))),
      ),
      h("tbody"),
    );
    const count = h("span", { id: "count", class: "muted" });
    byId("app").replaceChildren(
      h("div", { class: "toolbar" }, h("h1", { text: "Executions" }), filter, count),
      table,
    );

    const load = async () => {
      const query = filter.value ? "&status=" + encodeURIComponent(filter.value) : "";
      const page = await apiJson("/executions?limit=200" + query);
      const rows = page.items.map((item) => {
        const steps = Object.values(item.steps || {});
        const tally = {};
        for (const st of steps) tally[st] = (tally[st] || 0) + 1;
        const summary = Object.entries(tally)
          .map(([k, v]) => `${v} ${k}`)
          .join(", ");
        return h(
          "tr",
          { "data-execution-id": item.execution_id, "data-status": item.status },
          h("td", {}, h("a", { href: "/ui/executions/" + encodeURIComponent(item.execution_id), text: item.execution_id })),
          h("td", { text: item.path || item.name || item.file || "" }),
          h("td", {}, badge(item.status), item.paused ? h("span", { class: "badge paused", text: "paused" }) : null),
          h("td", { class: "muted", text: summary }),
          h("td", { class: "muted", text: item.updated_at ? new Date(item.updated_at).toLocaleString() : "" }),
        );
      });
      table.tBodies[0].replaceChildren(...rows);
      count.textContent = `${page.items.length} of ${page.total}`;
      document.body.dataset.loaded = "true";
    };
    filter.addEventListener("change", () => load().catch(onError));
    document.body.dataset.view = "list";
    await load();
    setInterval(() => {
      if (document.visibilityState === "visible") load().catch(onError);
    }, 5000);
  }

  // -- one execution -------------------------------------------------------------------------------

  const view = { id: "", graph: null, selected: null, t0: null, events: 0 };

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

  function arcPath(arc, at) {
    const a = at[arc.source];
    const b = at[arc.target];
    if (!a || !b) return null;
    if (!arc.back && b.x > a.x) {
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x;
      const y2 = b.y + NODE_H / 2;
      const dx = Math.max(30, (x2 - x1) / 2);
      return `M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`;
    }
    // a back edge (or an arc to the same column): below the boxes
    const x1 = a.x + NODE_W / 2 + 12;
    const y1 = a.y + NODE_H;
    const x2 = b.x + NODE_W / 2 - 12;
    const y2 = b.y + NODE_H;
    const dip = Math.max(y1, y2) + ROW_GAP + 14;
    return `M ${x1} ${y1} C ${x1} ${dip}, ${x2} ${dip}, ${x2} ${y2}`;
  }

  function renderGraph() {
    const g = view.graph;
    const root = byId("graph");
    if (!g || !root) return;
    const at = {};
    let cols = 0;
    let rows = 0;
    for (const step of g.steps) {
      at[step.name] = { x: PAD + step.layer * (NODE_W + COL_GAP), y: PAD + step.order * (NODE_H + ROW_GAP) };
      cols = Math.max(cols, step.layer + 1);
      rows = Math.max(rows, step.order + 1);
    }
    const hasBack = g.arcs.some((a) => a.back || (at[a.target] && at[a.source] && at[a.target].x <= at[a.source].x));
    const width = PAD * 2 + cols * NODE_W + Math.max(0, cols - 1) * COL_GAP;
    const height = PAD * 2 + rows * NODE_H + Math.max(0, rows - 1) * ROW_GAP + (hasBack ? ROW_GAP + 20 : 0);
    root.setAttribute("viewBox", `0 0 ${width} ${height}`);
    root.setAttribute("width", String(width));
    root.setAttribute("height", String(height));

    const marker = (id) =>
      s("marker", { id, viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
        s("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
    const defs = s("defs", {}, marker("arrow"), marker("arrow-taken"));
    const arcs = g.arcs.map((arc) => {
      const d = arcPath(arc, at);
      if (!d) return null;
      const cls = ["arc", arc.taken ? "taken" : "", arc.when ? "conditional" : "", arc.back ? "back" : ""];
      const title = `${arc.source} → ${arc.target}` + (arc.when ? `\nwhen: ${arc.when}` : "") + `\nfired ${arc.taken}×`;
      return s("path", {
        d,
        class: cls.filter(Boolean).join(" "),
        "data-source": arc.source,
        "data-target": arc.target,
        "data-taken": arc.taken,
        "marker-end": arc.taken ? "url(#arrow-taken)" : "url(#arrow)",
      }, s("title", { text: title }));
    });
    const nodes = g.steps.map((step) => {
      const { status, extra } = nodeLines(step);
      const p = at[step.name];
      const parts = [
        s("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 8 }),
        s("rect", { class: "stripe", width: 6, height: NODE_H, rx: 3 }),
        s("text", { class: "name", x: 16, y: 22, text: step.name.length > 24 ? step.name.slice(0, 23) + "…" : step.name }),
        s("text", { class: "state", x: 16, y: 40, text: status }),
        s("text", { class: step.loop ? "extra loop-progress" : "extra", x: 16, y: 57, text: extra }),
      ];
      if (step.loop) {
        const lp = step.loop;
        const total = lp.total || Math.max(lp.started, lp.done + lp.failed) || 0;
        const frac = total ? Math.min(1, (lp.done + lp.failed) / total) : 0;
        parts.push(s("rect", { class: "bar", x: 16, y: NODE_H - 6, width: NODE_W - 32, height: 3, rx: 1.5 }));
        parts.push(s("rect", { class: "bar-fill", x: 16, y: NODE_H - 6, width: (NODE_W - 32) * frac, height: 3, rx: 1.5 }));
      }
      const tip = [step.name, `status: ${step.status}`, step.error ? "error: " + errorText(step.error) : ""];
      parts.push(s("title", { text: tip.filter(Boolean).join("\n") }));
      return s("g", {
        class: "node status-" + step.status + (view.selected === step.name ? " selected" : ""),
        transform: `translate(${p.x} ${p.y})`,
        tabindex: "0",
        role: "button",
        "data-step": step.name,
        "data-status": step.status,
        "data-kind": step.kind,
        on: {
          click: () => select(step.name),
          keydown: (e) => (e.key === "Enter" || e.key === " ") && select(step.name),
        },
      }, parts);
    });
    fill(root, defs, s("g", { class: "arcs" }, arcs), s("g", { class: "nodes" }, nodes));
  }

  function select(name) {
    view.selected = view.selected === name ? null : name;
    renderGraph();
    renderDetails();
  }

  function field(label, value) {
    if (value === null || value === undefined || value === "") return null;
    return [h("dt", { text: label }), h("dd", { text: String(value) })];
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
          field("error", g.error && (g.error.message ? errorText(g.error) : JSON.stringify(g.error))),
        ),
        h("p", { class: "muted", text: "Select a step for its details." }),
      );
      return;
    }
    const lp = step.loop;
    fill(box,
      h("h2", { text: step.name }),
      step.desc ? h("p", { class: "muted", text: step.desc }) : null,
      h("dl", { id: "step-details", "data-step": step.name },
        field("status", step.status),
        field("kind", step.kind + (lp ? ` (${lp.mode}, ${lp.exec})` : "")),
        field("tasks", step.tasks.join(", ")),
        field("runs", step.runs),
        field("scheduled", clock(step.scheduled_at)),
        field("started", clock(step.started_at)),
        field("finished", clock(step.finished_at)),
        field("duration", duration(step.duration_s)),
        field("task runs", step.task_runs || null), // none written: one plain run (--task-events informative)
        field("retries", step.retries),
        lp ? field("iterations", `${lp.done} done, ${lp.failed} failed, ${lp.started} started, total ${lp.total ?? "?"}`) : null,
        field("error", step.error && errorText(step.error)),
        field("line", step.line || null),
      ),
    );
  }

  function renderSummary() {
    const g = view.graph;
    const box = byId("summary");
    if (!g || !box) return;
    document.body.dataset.executionStatus = g.status;
    fill(box,
      h("h1", { text: g.name || view.id }),
      badge(g.status),
      g.paused ? h("span", { class: "badge paused", text: "paused" }) : null,
      h("span", { class: "muted", text: g.path ? g.path + " · " : "" }),
      h("code", { class: "muted", text: view.id }),
      h("span", { class: "muted", text: " · " + duration(g.finished_at ? g.duration_s : elapsed(g.started_at)) }),
    );
  }

  async function refreshGraph() {
    view.graph = await apiJson(`/executions/${encodeURIComponent(view.id)}/graph`);
    renderSummary();
    renderGraph();
    renderDetails();
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

  function errorText(e) {
    if (!e) return "";
    const message = e.message || "";
    const kind = e.kind || "error";
    return message.startsWith(kind) ? message : `${kind}: ${message}`;
  }

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
        const path = `/executions/${encodeURIComponent(view.id)}/events?follow=1` + (from ? `&after=${from}` : "");
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
    byId("app").replaceChildren(
      h("section", { id: "summary", class: "summary" }),
      h("div", { class: "columns" },
        h("div", { class: "graph-wrap" }, s("svg", { id: "graph", role: "img", "aria-label": "step graph" })),
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
    document.body.dataset.view = "execution";
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
      route();
    });
    route();
  });
})();
