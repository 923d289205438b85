// The Coach: a single page over the node's operator API. No build step and no third-party
// code: it is embedded in the binary and served with a strict CSP. Everything the node sends
// is inserted as text (never as HTML), so an event's data cannot script the page.

const state = { token: localStorage.getItem("mx.token") || "", cleanup: [] };

// ---------------------------------------------------------------- helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const badge = (text) => h("span", { class: `badge ${String(text).toLowerCase()}` }, text);
const fmt = (x, digits = 4) => (typeof x === "number" ? (Math.abs(x) >= 1000 ? x.toFixed(0) : x.toPrecision(digits)) : x ?? "–");
const short = (hex, n = 12) => (typeof hex === "string" && hex.length > n ? `${hex.slice(0, n)}…` : hex ?? "–");

function say(text, error = false) {
  const m = document.getElementById("message");
  m.textContent = text;
  m.className = error ? "error" : "";
}

function authHeaders() {
  return state.token ? { authorization: `Bearer ${state.token}` } : {};
}

/** Calls the API; throws an Error carrying the server's message on a non-2xx answer. */
async function api(path, { method = "GET", body, raw = false } = {}) {
  const headers = { ...authHeaders() };
  if (body !== undefined) headers["content-type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : raw ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!r.ok && !(r.status === 400 && json?.errors)) {
    const reason = json?.error?.message || text || r.statusText;
    const err = new Error(r.status === 401 ? `${reason} — paste the operator token above` : reason);
    err.status = r.status;
    throw err;
  }
  return json;
}

/** Reads a server-sent event stream with fetch (so the token can go in a header). */
async function sseFetch(path, onEvent, signal) {
  const r = await fetch(path, { headers: authHeaders(), signal });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}

function table(columns, rows, empty = "nothing yet") {
  if (!rows.length) return h("p", { class: "dim" }, empty);
  return h("table", {}, h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c[0])))),
    h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c[2] || "" }, c[1](r)))))));
}

function onLeave(fn) {
  state.cleanup.push(fn);
}

// ---------------------------------------------------------------- charts

/** A line chart on a canvas; `push` adds a point and redraws. */
function chart(title, id) {
  const canvas = h("canvas", { id, "data-points": 0, width: 480, height: 160 });
  const last = h("span", { class: "last" });
  const points = [];
  const draw = () => {
    const ctx = canvas.getContext("2d");
    const { width: w, height: ht } = canvas;
    ctx.clearRect(0, 0, w, ht);
    if (!points.length) return;
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    if (y0 === y1) { y0 -= 1e-9 + Math.abs(y0) * 0.05; y1 += 1e-9 + Math.abs(y1) * 0.05; }
    const px = (x) => 36 + ((x - x0) / Math.max(x1 - x0, 1)) * (w - 44);
    const py = (y) => ht - 18 - ((y - y0) / (y1 - y0)) * (ht - 30);
    ctx.strokeStyle = "#2a303b"; ctx.fillStyle = "#8b93a1"; ctx.font = "10px sans-serif";
    ctx.beginPath(); ctx.moveTo(36, 8); ctx.lineTo(36, ht - 18); ctx.lineTo(w - 8, ht - 18); ctx.stroke();
    ctx.fillText(fmt(y1, 3), 2, 14); ctx.fillText(fmt(y0, 3), 2, ht - 20);
    ctx.fillText(`step ${x0}`, 38, ht - 4); ctx.fillText(`${x1}`, w - 30, ht - 4);
    ctx.strokeStyle = "#6cb6ff"; ctx.lineWidth = 1.5; ctx.beginPath();
    points.forEach(([x, y], i) => (i ? ctx.lineTo(px(x), py(y)) : ctx.moveTo(px(x), py(y))));
    ctx.stroke();
  };
  const el = h("div", { class: "chart" }, h("h3", {}, title, last), canvas);
  return {
    el,
    push(x, y) {
      if (typeof y !== "number" || !Number.isFinite(y)) return;
      const at = points.findIndex((p) => p[0] >= x);
      if (at >= 0 && points[at][0] === x) return;
      at < 0 ? points.push([x, y]) : points.splice(at, 0, [x, y]);
      canvas.dataset.points = points.length;
      last.textContent = fmt(points[points.length - 1][1]);
      draw();
    },
  };
}

// ---------------------------------------------------------------- pages

async function recipesPage(page, selected) {
  const list = await api("/api/recipes");
  const editor = h("textarea", { id: "recipe-yaml", spellcheck: "false" });
  const nameInput = h("input", { id: "recipe-name", value: "my_recipe.yaml" });
  const verdict = h("div", { id: "recipe-status" });
  const annotated = h("pre", { id: "recipe-annotated", class: "yaml" });
  const show = (yaml, errors) => {
    annotated.replaceChildren();
    const byLine = new Map();
    for (const e of errors) if (e.line) byLine.set(e.line, [...(byLine.get(e.line) || []), e]);
    yaml.split("\n").forEach((text, i) => {
      const errs = byLine.get(i + 1) || [];
      annotated.append(h("span", { class: errs.length ? "err-line" : "" }, h("span", { class: "ln" }, i + 1), text, "\n"));
      for (const e of errs) annotated.append(h("span", { class: "err-msg recipe-error" }, `↑ ${e.path}: ${e.message}`));
    });
    const unplaced = errors.filter((e) => !e.line);
    for (const e of unplaced) annotated.append(h("span", { class: "err-msg recipe-error" }, e.text));
    // Bring the first bad line into view inside the listing (not the whole page).
    const first = annotated.querySelector(".err-line");
    if (first) annotated.scrollTop = Math.max(0, first.offsetTop - annotated.offsetTop - 80);
  };
  const validate = async () => {
    const v = await api("/api/recipes/validate", { method: "POST", body: { yaml: editor.value, name: nameInput.value } });
    verdict.replaceChildren(v.valid ? badge("pass") : badge("fail"), " ",
      v.valid ? `valid — blake3 ${short(v.blake3, 16)}` : `${v.errors.length} error(s), shown on their lines below`);
    show(editor.value, v.errors);
    return v.valid;
  };
  let timer;
  editor.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => validate().catch((e) => say(e.message, true)), 400); });
  const load = async (name) => {
    const r = await api(`/api/recipes/${encodeURIComponent(name)}`);
    editor.value = r.yaml;
    nameInput.value = r.summary.name;
    await validate();
  };
  const launch = async () => {
    if (!(await validate())) return say("fix the recipe's errors first", true);
    const r = await api("/api/runs", { method: "POST", body: { yaml: editor.value, name: nameInput.value } });
    if (r.errors) return show(editor.value, r.errors);
    location.hash = `#/run/${r.id}`;
  };
  const register = async () => {
    const r = await api("/api/recipes", { method: "POST", body: { yaml: editor.value, name: nameInput.value } });
    if (r.errors) return show(editor.value, r.errors);
    say(`registered at seq ${r.seq}${r.already ? " (already known)" : ""}: ${r.recipe.blake3}`);
  };
  const entry = (name, label) => h("a", { href: `#/recipes/${encodeURIComponent(name)}`, class: name === selected ? "active" : "" }, label);
  page.append(h("section", { class: "split" },
    h("div", { class: "list" }, h("h2", {}, "Embedded"),
      list.recipes.map((r) => entry(r.name, `${r.name}${r.valid ? "" : " ⚠"}`)),
      h("h2", {}, "Registered"),
      list.registered.length ? list.registered.map((r) => entry(r.blake3, `${r.file} · ${short(r.blake3, 8)}`)) : h("p", {}, "none yet")),
    h("div", {}, h("div", { class: "row" }, "name", nameInput,
      h("button", { id: "validate-button", onclick: () => validate().catch((e) => say(e.message, true)) }, "Validate"),
      h("button", { id: "register-button", onclick: () => register().catch((e) => say(e.message, true)) }, "Register"),
      h("button", { id: "launch-button", onclick: () => launch().catch((e) => say(e.message, true)) }, "Launch run")),
    editor, verdict, annotated)));
  if (selected) await load(selected);
}

async function runsPage(page) {
  const body = h("div");
  const recipes = await api("/api/recipes");
  const pick = h("select", { id: "launch-recipe" }, recipes.recipes.filter((r) => r.valid).map((r) => h("option", { value: r.name }, r.name)));
  const launch = async () => {
    const r = await api("/api/runs", { method: "POST", body: { recipe: pick.value } });
    location.hash = `#/run/${r.id}`;
  };
  const refresh = async () => {
    const { runs } = await api("/api/runs");
    body.replaceChildren(table([
      ["run", (r) => h("a", { href: `#/run/${r.id}` }, r.id)], ["from", (r) => r.origin], ["recipe", (r) => r.recipe], ["phase", (r) => badge(r.phase)],
      ["step", (r) => `${r.step}/${r.total_steps}`, "num"], ["loss", (r) => fmt(r.loss), "num"], ["tok/s", (r) => fmt(r.tokens_per_s), "num"],
    ], runs.slice().reverse(), "no run yet: launch one above, or train with `mindxtrain train`"));
  };
  page.append(h("section", {}, h("h2", {}, "Launch a run"), h("div", { class: "row" }, pick,
    h("button", { id: "launch-embedded", onclick: () => launch().catch((e) => say(e.message, true)) }, "Launch"))),
  h("section", {}, h("h2", {}, "Runs"), body));
  await refresh();
  const t = setInterval(() => refresh().catch(() => {}), 2000);
  onLeave(() => clearInterval(t));
}

async function runPage(page, id) {
  const stats = h("div", { class: "stats", id: "run-stats" });
  const charts = { loss: chart("loss", "chart-loss"), lr: chart("learning rate", "chart-lr"), tps: chart("tokens/s", "chart-tps") };
  const planBox = h("div", { id: "run-plan" }, "measuring…");
  const ckptBox = h("div", { id: "run-checkpoints" });
  const evalBox = h("div", { id: "run-evals" });
  const manifestBox = h("div", { id: "run-manifest" }, "sealed when the run finishes");
  const receiptBox = h("div", { id: "receipt-checks" });
  const actions = h("div", { class: "row" });
  let status = null, planShown = null, sealedShown = false;

  const showPlan = async (blake3) => {
    const p = await api(`/api/plans/${blake3}`);
    const chosen = JSON.stringify(p.plan.choices);
    planBox.replaceChildren(h("p", {}, `plan ${short(blake3, 16)} · probe ${p.plan.elapsed_ms} ms of a ${p.plan.budget_seconds} s budget`,
      p.plan.truncated ? " (truncated)" : "", ` · ${p.plan.machine?.cpu ?? ""}`),
    table([["threads", (m) => m.choices.threads, "num"], ["micro-batch", (m) => m.choices.micro_batch, "num"],
      ["act. ckpt", (m) => String(m.choices.activation_checkpointing)], ["gemm rows", (m) => m.choices.gemm_rows, "num"],
      ["step", (m) => (m.step_us ? `${(m.step_us / 1000).toFixed(1)} ms` : m.note || "–"), "num"],
      ["", (m) => (JSON.stringify(m.choices) === chosen ? badge("pass") : "")]], p.plan.measurements));
  };
  const showRecords = async (runId) => {
    const [ck, ev] = await Promise.all([api(`/api/checkpoints?subject=${runId}`), api(`/api/evals?subject=${runId}`)]);
    ckptBox.replaceChildren(table([["seq", (e) => e.seq, "num"], ["step", (e) => e.data.step, "num"],
      ["files", (e) => (e.data.files || []).length, "num"], ["dir", (e) => h("code", {}, e.data.dir)]], ck.events, "no checkpoint yet"));
    evalBox.replaceChildren(table([["step", (e) => e.data.step, "num"], ["loss", (e) => fmt(e.data.loss), "num"],
      ["perplexity", (e) => fmt(e.data.perplexity), "num"], ["exact match", (e) => (e.data.exact_match_total ? `${e.data.exact_match_correct}/${e.data.exact_match_total}` : "–"), "num"]],
    ev.events, "no eval yet"));
  };
  const verifyReceipt = async (runId) => {
    receiptBox.replaceChildren("verifying…");
    const receipt = await api(`/api/receipts/${runId}`);
    const v = await api("/api/receipts/verify", { method: "POST", body: receipt });
    receiptBox.replaceChildren(h("p", { id: "receipt-outcome" }, badge(v.ok ? "pass" : "fail"), ` ${v.outcome} — ${v.report.checks.length} checks`),
      table([["check", (c) => c.name], ["status", (c) => badge(c.status)], ["detail", (c) => c.detail]], v.report.checks));
  };
  const showManifest = async (runId) => {
    const env = await api(`/api/manifests/${runId}/envelope`);
    const statement = JSON.parse(atob(env.payload));
    manifestBox.replaceChildren(h("p", {}, `${env.payloadType} · signed by ${short(env.signatures?.[0]?.keyid, 16)}`),
      table([["subject", (s) => s.name], ["blake3", (s) => h("code", {}, short(s.digest?.blake3, 24))]], statement.subject || []),
      h("div", { class: "row" }, h("button", { id: "verify-receipt", onclick: () => verifyReceipt(runId).catch((e) => say(e.message, true)) }, "Verify receipt")));
  };
  const refresh = async () => {
    status = await api(`/api/runs/${id}`);
    stats.replaceChildren(...[["phase", badge(status.phase)], ["step", `${status.step}/${status.total_steps}`], ["loss", fmt(status.loss)],
      ["lr", fmt(status.lr)], ["tok/s", fmt(status.tokens_per_s)], ["run id", status.run_id || "–"]].map(([k, v]) => h("div", {}, h("b", {}, k), v)));
    stats.dataset.phase = status.phase;
    actions.replaceChildren(
      h("button", { id: "cancel-run", disabled: !["planning", "training"].includes(status.phase), onclick: () => api(`/api/runs/${id}/cancel`, { method: "POST" }).catch((e) => say(e.message, true)) }, "Cancel"),
      h("button", { id: "resume-run", disabled: !["cancelled", "failed", "interrupted"].includes(status.phase), onclick: () => api(`/api/runs/${id}/resume`, { method: "POST" }).catch((e) => say(e.message, true)) }, "Resume"),
      ...(status.error ? [h("span", { class: "badge fail" }, status.error)] : []));
    if (status.plan_blake3 && planShown !== status.plan_blake3) { planShown = status.plan_blake3; await showPlan(status.plan_blake3); }
    if (status.run_id) await showRecords(status.run_id);
    if (status.phase === "finished" && !sealedShown) { sealedShown = true; await showManifest(status.run_id); }
  };
  page.append(h("section", {}, h("h2", {}, `Run ${id}`), stats, actions),
    h("section", {}, h("h2", {}, "Training, live"), h("div", { class: "charts" }, charts.loss.el, charts.lr.el, charts.tps.el)),
    h("section", {}, h("h2", {}, "AOT plan (measured before training, applied verbatim)"), planBox),
    h("section", {}, h("h2", {}, "Checkpoints"), ckptBox, h("h2", {}, "Evals"), evalBox),
    h("section", {}, h("h2", {}, "Manifest and receipt"), manifestBox, receiptBox));
  const events = new EventSource(`/api/runs/${encodeURIComponent(id)}/events`);
  events.addEventListener("train.progress", (m) => {
    const d = JSON.parse(m.data).data;
    charts.loss.push(d.step, d.loss); charts.lr.push(d.step, d.lr); charts.tps.push(d.step, d.tokens_per_s);
    // A step's progress proves the plan is done: show it now, not at the next 1.5 s poll.
    if (stats.dataset.phase === "planning") refresh().catch(() => {});
  });
  for (const kind of ["checkpoint.saved", "eval.completed", "manifest.sealed", "run.cancelled", "run.finished"]) {
    events.addEventListener(kind, () => refresh().catch(() => {}));
  }
  onLeave(() => events.close());
  await refresh();
  const t = setInterval(() => refresh().catch(() => {}), 1500);
  onLeave(() => clearInterval(t));
}

async function anchorsPage(page) {
  const a = await api("/api/anchors");
  page.append(h("section", {}, h("h2", {}, "Batches on chain"), table([
    ["seq", (b) => b.seq, "num"], ["chain", (b) => b.chain_id, "num"], ["block", (b) => b.block, "num"], ["items", (b) => b.items, "num"],
    ["root", (b) => h("code", {}, short(b.root, 16))],
    ["transaction", (b) => (b.tx_link ? h("a", { href: b.tx_link, target: "_blank", rel: "noopener noreferrer" }, short(b.tx, 18)) : h("code", {}, short(b.tx, 18)))],
  ], a.batches, "nothing anchored yet")),
  h("section", {}, h("h2", {}, "Items"), table([["seq", (i) => i.seq, "num"], ["label", (i) => i.label],
    ["digest", (i) => h("code", {}, short(i.digest, 24))], ["state", (i) => badge(i.state)]], a.items, "nothing to anchor yet")),
  a.failed.length ? h("section", {}, h("h2", {}, "Failures"), table([["seq", (f) => f.seq, "num"], ["error", (f) => f.error]], a.failed)) : null);
}

async function marketPage(page) {
  const [payments, rentals] = await Promise.all([api("/api/payments?limit=200"), api("/api/rentals?limit=200")]);
  const cols = [["seq", (e) => e.seq, "num"], ["time", (e) => e.time], ["kind", (e) => e.kind], ["subject", (e) => h("code", {}, short(e.subject, 20))],
    ["details", (e) => h("code", {}, JSON.stringify(e.data).slice(0, 160))]];
  page.append(h("section", {}, h("h2", {}, `Payments (${payments.total})`), table(cols, payments.events, "no payment yet")),
    h("section", {}, h("h2", {}, `Rentals (${rentals.total})`), table(cols, rentals.events, "no rental yet")));
}

async function logPage(page) {
  const cp = await api("/api/log/checkpoint");
  const from = Math.max(0, cp.size - 200);
  const { events } = await api(`/api/log?from=${from}&limit=200`);
  const chainBadge = h("span", { id: "chain-status" });
  const rows = h("tbody");
  const shown = [];
  const check = () => {
    let broken = null;
    for (let i = 1; i < shown.length; i++) if (shown[i].prev !== shown[i - 1].hash) { broken = shown[i].seq; break; }
    const span = shown.length ? `seq ${shown[0].seq}…${shown[shown.length - 1].seq}` : "empty";
    chainBadge.replaceChildren(badge(broken === null ? "intact" : "broken"),
      broken === null ? ` hash chain intact over ${span} (${Math.max(shown.length - 1, 0)} links checked here)` : ` chain breaks at seq ${broken}`);
  };
  const add = (e) => {
    shown.push(e);
    rows.prepend(h("tr", {}, h("td", { class: "num" }, e.seq), h("td", {}, e.time), h("td", {}, e.kind), h("td", {}, h("code", {}, short(e.subject, 24))),
      h("td", {}, h("code", {}, short(e.hash, 16))), h("td", {}, h("code", {}, short(e.prev, 16)))));
    check();
  };
  events.forEach(add);
  page.append(h("section", {}, h("h2", {}, "Signed checkpoint"), h("p", {}, `size ${cp.size} · root `, h("code", {}, cp.root)),
    h("pre", { class: "yaml mono" }, cp.note)),
  h("section", {}, h("h2", {}, "Events (live)"), h("p", {}, chainBadge),
    h("table", {}, h("thead", {}, h("tr", {}, ["seq", "time", "kind", "subject", "hash", "prev"].map((c) => h("th", {}, c)))), rows)));
  const ctl = new AbortController();
  onLeave(() => ctl.abort());
  sseFetch(`/api/log/tail?from=${cp.size}`, add, ctl.signal).catch((e) => { if (e.name !== "AbortError") say(`live tail: ${e.message}`, true); });
}

// ---------------------------------------------------------------- shell

const routes = [
  [/^#\/recipes(?:\/(.+))?$/, (p, m) => recipesPage(p, m[1] && decodeURIComponent(m[1]))],
  [/^#\/runs$/, (p) => runsPage(p)],
  [/^#\/run\/(.+)$/, (p, m) => runPage(p, decodeURIComponent(m[1]))],
  [/^#\/anchors$/, (p) => anchorsPage(p)],
  [/^#\/market$/, (p) => marketPage(p)],
  [/^#\/log$/, (p) => logPage(p)],
];

async function render() {
  state.cleanup.splice(0).forEach((f) => f());
  const hash = location.hash || "#/runs";
  const page = document.getElementById("page");
  page.replaceChildren();
  say("");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  const found = routes.find(([re]) => re.test(hash));
  if (!found) return say(`no page ${hash}`, true);
  try {
    await found[1](page, hash.match(found[0]));
  } catch (e) {
    say(e.message, true);
  }
}

async function health() {
  const dot = document.getElementById("health");
  try {
    const r = await fetch("/readyz");
    dot.className = `dot ${r.ok ? "up" : "down"}`;
  } catch {
    dot.className = "dot down";
  }
}

document.getElementById("token").value = state.token;
document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  state.token = document.getElementById("token").value.trim();
  localStorage.setItem("mx.token", state.token);
  render();
});
window.addEventListener("hashchange", render);
render();
health();
setInterval(health, 5000);
