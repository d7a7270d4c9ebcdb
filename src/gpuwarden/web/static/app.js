// gpuwarden's web page: GPU memory over time, the queue, and one page per job.
// Everything is built with DOM calls (textContent, setAttribute), never from HTML
// strings: job names and commands come from users.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const MiB = 1024 * 1024, GiB = 1024 * MiB;
const LEAK_THRESHOLD = 64 * MiB;
const REFRESH_MS = 10000;
const view = { hours: Number(localStorage.getItem("gw.hours")) || 6,
               by: localStorage.getItem("gw.by") || "job" };

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 10 * GiB) return (n / GiB).toFixed(1) + " GiB";
  return Math.round(n / MiB) + " MiB";
}

function fmtTime(ts, span) {
  const d = new Date(ts * 1000);
  const opts = { hour: "2-digit", minute: "2-digit", hour12: false };
  if (span !== undefined && span < 600) opts.second = "2-digit";
  return d.toLocaleTimeString([], opts);
}

function fmtWhen(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit",
                                minute: "2-digit", second: "2-digit" });
}

function hue(name) {
  let x = 0;
  for (const ch of name) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return x % 360;
}

function color(name) {
  if (name === "leaked") return "#d92d20";
  if (name.startsWith("user ")) return `hsl(${hue(name)}, 12%, ${55 + hue(name) % 20}%)`;
  return `hsl(${hue(name)}, 62%, 52%)`;
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}

// -- charts --------------------------------------------------------------------------

const W = 640, H = 210, L = 52, R = 8, T = 8, B = 20;

function axes(svg, t0, t1, ymax, ylabel) {
  const x = (t) => L + (W - L - R) * (t - t0) / Math.max(1, t1 - t0);
  const y = (v) => H - B - (H - T - B) * v / Math.max(1, ymax);
  for (const frac of [0, 0.5, 1]) {
    const v = ymax * frac;
    svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.append(s("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, ylabel(v)));
  }
  for (const frac of [0, 0.5, 1]) {
    const t = t0 + (t1 - t0) * frac;
    const anchor = frac === 0 ? "start" : frac === 1 ? "end" : "middle";
    svg.append(s("text", { x: x(t), y: H - 5, "text-anchor": anchor }, fmtTime(t, t1 - t0)));
  }
  return { x, y };
}

function gpuChart(gpu, t0, t1) {
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
                         "data-gpu": gpu.index, "data-total": gpu.total });
  svg.append(s("title", {}, `GPU ${gpu.index} memory over time`));
  const { x, y } = axes(svg, t0, t1, gpu.total, fmtBytes);
  for (const [a, b] of gpu.leak_periods) {
    svg.append(s("rect", { class: "leakband", x: x(a), y: T, width: Math.max(2, x(b) - x(a)),
                           height: H - T - B, "data-start": a, "data-end": b },
                 s("title", {}, `leaked memory from ${fmtTime(a)} to ${fmtTime(b)}`)));
  }
  const names = Object.keys(gpu.layers).sort((p, q) =>
    (p.startsWith("user ") - q.startsWith("user ")) || p.localeCompare(q));
  const layers = names.map((n) => [n, gpu.layers[n]]);
  layers.push(["leaked", gpu.leaked]);
  const base = gpu.t.map(() => 0);
  for (const [name, values] of layers) {
    const top = values.map((v, i) => base[i] + v);
    if (values.some((v) => v > 0)) {
      const upper = gpu.t.map((t, i) => `${x(t).toFixed(1)},${y(top[i]).toFixed(1)}`);
      const lower = gpu.t.map((t, i) => `${x(t).toFixed(1)},${y(base[i]).toFixed(1)}`).reverse();
      const d = gpu.t.length === 1
        ? `M${x(gpu.t[0]) - 2},${y(top[0])}H${x(gpu.t[0]) + 2}V${y(0)}H${x(gpu.t[0]) - 2}Z`
        : `M${upper.join("L")}L${lower.join("L")}Z`;
      svg.append(s("path", { d, fill: color(name), "fill-opacity": 0.85, "data-layer": name,
                             "data-last": values[values.length - 1],
                             "data-max": Math.max(...values) },
                   s("title", {}, `${name}: ${fmtBytes(values[values.length - 1])} now, `
                                  + `${fmtBytes(Math.max(...values))} at most`)));
    }
    top.forEach((v, i) => { base[i] = v; });
  }
  const used = gpu.t.map((t, i) => `${x(t).toFixed(1)},${y(gpu.used[i]).toFixed(1)}`);
  if (used.length > 1) {
    svg.append(s("path", { class: "usedline", d: `M${used.join("L")}`,
                           "data-last": gpu.used[gpu.used.length - 1] },
                 s("title", {}, "used on the GPU, as the driver reports it")));
  }
  return [svg, layers];
}

function legend(layers) {
  return h("div", { class: "legend" }, layers
    .filter(([, values]) => values.some((v) => v > 0))
    .map(([name, values]) => h("span", { "data-layer": name },
      h("span", { class: "swatch", "data-color": color(name) }), name, " ",
      h("span", { class: "muted" }, values[values.length - 1] > 0
        ? fmtBytes(values[values.length - 1]) : `gone, max ${fmtBytes(Math.max(...values))}`))));
}

function paintSwatches(root) {
  // Colours go through the CSSOM (inline style attributes are barred by the page's CSP).
  for (const el of root.querySelectorAll("[data-color]")) el.style.background = el.dataset.color;
}

// -- pages ---------------------------------------------------------------------------

function jobLink(job) {
  // An array's task as the CLI names it (12_7), its job id beside it.
  const task = job.array ? job.array.task : null;
  return h("a", { href: `#job/${job.id}` }, task ? `${task} (${job.id})` : String(job.id));
}

function stateText(j) {
  // A service says so, with its restarts, as `ps` marks it (svc:N).
  if (!j.service) return j.state;
  const n = j.restarts || 0;
  return `${j.state} · service, ${n} restart${n === 1 ? "" : "s"}`;
}

function jobsTable(jobs, id) {
  const showCommand = jobs.some((j) => j.command !== undefined);
  const head = ["job", "user", "name", "state", "QoS", "prio", "GPUs", "budget", "peak",
                "submitted", "why / exit"];
  if (showCommand) head.push("command");
  const rows = jobs.map((j) => h("tr", { "data-job": j.id },
    h("td", {}, jobLink(j)), h("td", {}, j.user), h("td", {}, j.name || "–"),
    h("td", { class: `state-${j.state}` }, stateText(j)), h("td", {}, j.qos),
    h("td", { class: "num" }, j.priority), h("td", {}, j.gpus.length ? j.gpus.join(",") : "–"),
    h("td", { class: "num" }, j.mem === null ? "whole" : fmtBytes(j.budget ?? j.request)),
    h("td", { class: "num" }, fmtBytes(j.peak_memory)), h("td", {}, fmtWhen(j.submitted_at)),
    h("td", { class: "wide" }, j.reason || (j.exit_code === null ? "" : `exit ${j.exit_code}`),
      j.memory_release && !j.memory_release.released_at && j.ended_at
        ? h("span", { class: "error" }, " · memory not back") : null),
    showCommand ? h("td", { class: "wide" }, (j.command || []).join(" ")) : null));
  return h("table", { id },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: head.length,
                                                              class: "muted" }, "none"))));
}

function renderOverview(data) {
  // The window asked for, narrowed to where samples exist (a new daemon has minutes).
  const first = Math.min(...data.gpus.map((g) => g.t[0] ?? data.now));
  const t1 = data.now, t0 = Math.max(data.now - data.hours * 3600, first - 30);
  // GPUs an admin drained (gpu drain): no new placement there.
  const drained = new Map((data.drains || []).map((d) => [d.gpu, d.reason ? `drained: ${d.reason}` : "drained"]));
  const cards = data.gpus.map((gpu) => {
    const last = gpu.t.length - 1;
    const leaked = gpu.leaked[last];
    const [chart, layers] = gpuChart(gpu, t0, t1);
    return h("section", { class: "card", "data-gpu": gpu.index },
      h("h3", {}, `GPU ${gpu.index}`,
        h("span", { class: "figures" }, `${fmtBytes(gpu.used[last])} of ${fmtBytes(gpu.total)} used`),
        leaked >= LEAK_THRESHOLD ? h("span", { class: "leak" }, `${fmtBytes(leaked)} leaked`) : null,
        drained.has(gpu.index) ? h("span", { class: "drained" }, drained.get(gpu.index)) : null),
      chart, legend(layers));
  });
  const main = h("div", {},
    h("h2", {}, `GPU memory, last ${data.hours} h, by ${data.by}`),
    cards.length ? h("div", { class: "gpus" }, cards)
                 : h("p", { class: "muted" }, "no samples yet: the daemon records one every history_interval"),
    drained.size ? h("p", { class: "drained" }, [...drained].map(([i, t]) => `GPU ${i} ${t}`).join("; ")
                                               + " (no new placement there)") : null,
    h("h2", {}, `Queue (${data.queue.length})`), jobsTable(data.queue, "queue"),
    h("h2", {}, "Recently ended"), jobsTable(data.recent, "recent"));
  return main;
}

const BAD = new Set(["oom", "failed", "leak", "lost", "preempted", "killed"]);

function jobChart(data) {
  const job = data.job, tl = data.timeline;
  const events = job.events.map((e) => ({ ...e, ts: Date.parse(e.at) / 1000 }));
  const times = tl.t.concat(events.map((e) => e.ts));
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 60);
  const ymax = Math.max(data.limit || 0, data.budget || 0, ...tl.used, 1) * 1.1;
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
                         "data-budget": data.budget, "data-limit": data.limit });
  svg.append(s("title", {}, `job ${job.id} memory against its budget`));
  const { x, y } = axes(svg, t0, t1, ymax, fmtBytes);
  for (const e of events) {
    svg.append(s("line", { class: "event" + (BAD.has(e.kind) ? " bad" : ""), x1: x(e.ts),
                           x2: x(e.ts), y1: T, y2: H - B, "data-kind": e.kind },
                 s("title", {}, `${e.kind} ${fmtWhen(e.at)}: ${e.detail || ""}`)));
  }
  if (tl.t.length) {
    const pts = tl.t.map((t, i) => `${x(t).toFixed(1)},${y(tl.used[i]).toFixed(1)}`);
    const area = `M${x(tl.t[0]).toFixed(1)},${y(0)}L${pts.join("L")}L${x(tl.t[tl.t.length - 1]).toFixed(1)},${y(0)}Z`;
    svg.append(s("path", { d: area, fill: color(`job ${job.id}`), "fill-opacity": 0.35 }));
    svg.append(s("path", { class: "usedline", d: `M${pts.join("L")}`,
                           "data-max": Math.max(...tl.used), "data-last": tl.used[tl.used.length - 1] },
                 s("title", {}, "memory on the job's fullest GPU")));
  }
  for (const [cls, value, label] of [["budget", data.budget, "budget"], ["limit", data.limit, "limit"]]) {
    if (value && !(cls === "limit" && value === data.budget)) {
      svg.append(s("line", { class: cls, x1: L, x2: W - R, y1: y(value), y2: y(value) },
                   s("title", {}, `${label} ${fmtBytes(value)}`)));
      svg.append(s("text", { x: W - R - 2, y: y(value) - 3, "text-anchor": "end" },
                   `${label} ${fmtBytes(value)}`));
    }
  }
  return svg;
}

function renderJob(data) {
  const j = data.job;
  const facts = [["user", j.user], ["state", j.state], ["QoS", j.qos], ["priority", j.priority],
    ["GPUs", j.gpus.join(",") || "–"], ["budget per GPU", j.mem === null ? "whole GPU" : fmtBytes(data.budget)],
    ["limit", fmtBytes(data.limit)], ["peak", fmtBytes(j.peak_memory)],
    ["attempts", j.attempts], ["OOM retries", j.oom_retries], ["preemptions", j.preemptions],
    ["submitted", fmtWhen(j.submitted_at)], ["started", fmtWhen(j.started_at)],
    ["ended", fmtWhen(j.ended_at)], ["exit code", j.exit_code ?? "–"], ["reason", j.reason || "–"]];
  if (j.memory_release) {
    const r = j.memory_release;
    facts.push(["release", r.said || (r.released_at ? `${r.seconds} s after the end (${r.how})`
                                                    : `not yet${r.leak ? ": " + r.leak : ""}`)]);
  }
  if (j.service) {
    const s = j.service;
    const check = s.health_url || s.health_cmd;
    facts.push(["service", `restart ${s.restart}, ${j.restarts || 0} restarts (at most ` +
      `${s.restart_limit} in ${s.restart_window} s), ${j.health_failures || 0} failed health ` +
      `checks` + (check ? ` · health: ${check} every ${s.health_interval} s` : "")]);
  }
  if (j.array) {
    facts.push(["array", `task ${j.array.task} of array ${j.array.id}` +
      (j.array.limit === null ? "" : `, at most ${j.array.limit} at once`)]);
  }
  if (j.command) facts.push(["command", j.command.join(" ")]);
  return h("div", { id: "job", "data-job": j.id },
    h("h2", {}, `Job ${j.id}${j.name ? " · " + j.name : ""} · `, h("span", { class: `state-${j.state}` }, j.state)),
    h("section", { class: "card" }, h("h3", {}, "Memory against its budget",
      h("span", { class: "figures" }, data.timeline.t.length ? "" : "no samples while it ran")),
      jobChart(data)),
    h("h2", {}, "Facts"),
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])),
    h("h2", {}, "Events"),
    h("table", { id: "events" }, h("thead", {}, h("tr", {}, ["time", "event", "detail"].map((c) => h("th", {}, c)))),
      h("tbody", {}, j.events.map((e) => h("tr", { "data-kind": e.kind },
        h("td", {}, fmtWhen(e.at)), h("td", { class: BAD.has(e.kind) ? "state-failed" : "" }, e.kind),
        h("td", { class: "wide" }, e.detail || ""))))));
}

// -- routing -------------------------------------------------------------------------

async function show() {
  const main = document.getElementById("main");
  const m = location.hash.match(/^#job\/(\d+)$/);
  document.getElementById("controls").hidden = Boolean(m);
  for (const b of document.querySelectorAll("#hours button")) b.classList.toggle("on", Number(b.dataset.hours) === view.hours);
  for (const b of document.querySelectorAll("#by button")) b.classList.toggle("on", b.dataset.by === view.by);
  try {
    const page = m ? renderJob(await getJSON(`data/jobs/${m[1]}`))
                   : renderOverview(await getJSON(`data/overview?hours=${view.hours}&by=${view.by}`));
    main.replaceChildren(page);
    paintSwatches(main);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.ready = "true";
  } catch (err) {
    main.replaceChildren(h("p", { class: "error" }, `cannot load: ${err.message}`));
    document.body.dataset.ready = "error";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("#hours button")) {
    b.addEventListener("click", () => { view.hours = Number(b.dataset.hours); localStorage.setItem("gw.hours", view.hours); show(); });
  }
  for (const b of document.querySelectorAll("#by button")) {
    b.addEventListener("click", () => { view.by = b.dataset.by; localStorage.setItem("gw.by", view.by); show(); });
  }
  window.addEventListener("hashchange", show);
  setInterval(show, REFRESH_MS);
  show();
});
