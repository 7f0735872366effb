// The onthejob dashboard: plain JS over the admin API. Recorded text is untrusted, so
// every value reaches the page through textContent, never innerHTML.
"use strict";

const API = "api";
const POLL_MS = 5000;
const state = { token: sessionStorage.getItem("onthejob-token"), view: "overview", cursor: null, open: null, timer: null, openHistories: new Set() };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const response = await fetch(`${API}${path}`, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  if (response.status === 401) throw new Unauthorized("wrong token");
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) throw new Error((body && body.error && body.error.message) || `HTTP ${response.status}`);
  return body;
}

function say(text, isError) {
  const box = $("message");
  box.textContent = text;
  box.classList.toggle("error", Boolean(isError));
  box.hidden = !text;
}

const fmt = window.charts.formatNumber;
const shortTime = (iso) => (iso ? iso.replace("T", " ").slice(0, 19) : "–");
// a share as a whole percentage ("38 %"); under 1 % with one decimal, so a rare event shows
const percent = (v) => (v === null || v === undefined ? "–" : `${Math.abs(v) < 0.01 && v !== 0 ? (100 * v).toFixed(1) : Math.round(100 * v)} %`);

function duration(seconds) {
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${seconds / 60} min`;
  if (seconds < 86400) return `${seconds / 3600} h`;
  return `${seconds / 86400} days`;
}

function clockOf(ms, withDate) {
  const iso = new Date(ms).toISOString();
  return withDate ? iso.slice(5, 16).replace("T", " ") : iso.slice(11, 19);
}

// -- login ---------------------------------------------------------------------------
async function login(event) {
  event.preventDefault();
  state.token = $("token").value.trim();
  try {
    await api("/learner");
  } catch (err) {
    $("login-error").textContent = err instanceof Unauthorized ? "That token is not the admin token." : String(err.message);
    $("login-error").hidden = false;
    return;
  }
  sessionStorage.setItem("onthejob-token", state.token);
  start();
}

function logout() {
  sessionStorage.removeItem("onthejob-token");
  state.token = null;
  clearInterval(state.timer);
  $("main-view").hidden = true;
  $("login-view").hidden = false;
}

function start() {
  $("login-view").hidden = true;
  $("main-view").hidden = false;
  show(state.view);
  clearInterval(state.timer);
  state.timer = setInterval(() => refresh(false), POLL_MS);
}

async function guarded(fn) {
  try {
    await fn();
  } catch (err) {
    if (err instanceof Unauthorized) logout();
    else say(String(err.message), true);
  }
}

function show(view) {
  state.view = view;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === view);
  for (const name of ["overview", "trajectories", "versions", "tasks", "types", "harnesses", "curricula", "selfjudge", "signals", "tenants", "canaries"]) $(`view-${name}`).hidden = name !== view;
  refresh(true);
}

// live updates: the visible view is polled; an open trajectory is left as it is
function refresh(first) {
  const work = {
    overview: loadOverview,
    trajectories: () => (first ? loadTrajectories(true) : Promise.resolve()),
    versions: loadVersions,
    tasks: loadTasks,
    types: loadTypes,
    harnesses: loadHarnesses,
    curricula: loadCurricula,
    selfjudge: loadSelfJudge,
    signals: loadSignals,
    tenants: loadTenants,
    canaries: loadCanaries,
  }[state.view];
  return guarded(async () => {
    await work();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  });
}

// -- overview ------------------------------------------------------------------------
async function loadOverview() {
  const [stats, learner, curves] = await Promise.all([api("/stats"), api("/learner"), api("/learning-curves")]);
  const t = stats.traffic;
  $("card-calls").textContent = fmt(t.calls_per_minute);
  $("card-errors").textContent = percent(t.error_rate);
  const ms = (v) => (v === null ? "–" : String(Math.round(v)));
  $("card-latency").textContent = `${ms(t.latency_ms.p50)} / ${ms(t.latency_ms.p99)} ms`;
  $("card-tokens").textContent = `${t.tokens_in} / ${t.tokens_out}`;
  $("card-version").textContent = learner.serving || "–";
  showLearner(learner);
  window.charts.barChart(
    $("chart-reward-version"),
    stats.rewards.by_version.map((r) => ({ label: r.version || "(none)", value: r.mean_reward, title: `${r.version} (${r.trajectories} graded)` })),
    { xLabel: "policy version (that served the trajectory's first call)", yLabel: "mean reward" },
  );
  showCurves(curves);
  const traffic = [];
  for (const b of t.series) {
    traffic.push({ label: b.t.slice(11, 16), value: b.calls - b.errors, title: `${b.t} ok` });
    if (b.errors) traffic.push({ label: "", value: b.errors, cls: "error", title: `${b.t} errors` });
  }
  window.charts.barChart($("chart-traffic"), traffic, { xLabel: "hour (UTC)", yLabel: "calls" });
}

// the learning curve: one line per interaction type, in buckets that fit the run
function showCurves(curves) {
  const size = curves.bucket_seconds;
  $("curve-bucket").textContent = size ? `${duration(size)} bucket` : "time bucket";
  const span = curves.since && curves.until ? Date.parse(curves.until) - Date.parse(curves.since) : 0;
  const series = curves.types.map((c) => ({
    name: c.interaction_type === null ? "(untyped)" : c.interaction_type,
    points: c.points.map((p) => ({
      x: Date.parse(p.t) + (500 * size),
      y: p.mean_reward,
      low: p.low,
      high: p.high,
      title: `${c.interaction_type || "(untyped)"} · ${clockOf(Date.parse(p.t), true)} UTC: mean reward ${fmt(p.mean_reward)} over ${p.trajectories}` + (p.low === null ? "" : ` (95% band ${fmt(p.low)} to ${fmt(p.high)})`) + ` · success ${percent(p.success_rate)}`,
    })),
  }));
  const legend = window.charts.seriesChart($("chart-learning"), series, {
    xLabel: `when the trajectories ended (UTC, ${size ? duration(size) : "–"} buckets)`,
    yLabel: "mean reward",
    xTick: (ms) => clockOf(ms, span > 86400000),
  }) || [];
  const more = curves.types_total > curves.types.length ? [el("span", { class: "muted" }, `and ${curves.types_total - curves.types.length} more types (Types tab)`)] : [];
  $("curve-legend").replaceChildren(...legend.map((l) => el("span", { class: "key" }, el("i", { style: `background: ${l.color}` }), l.name)), ...more);
}

function showLearner(learner) {
  const names = { running: "running", paused: "paused", stopped: "not running", never_seen: "not started" };
  const pending = learner.pause_requested && learner.state === "running" ? " (pausing)" : "";
  $("card-learner").textContent = (names[learner.state] || learner.state) + pending;
  const step = learner.last_step ? `step ${learner.last_step.step}` : "no step yet";
  const q = learner.queue;
  const doing = learner.state === "running" && learner.heartbeat?.activity ? `${learner.heartbeat.activity} · ` : "";
  const failed = q.grading_failed || q.grading_retrying ? ` · grading failed: ${q.grading_failed}, retrying: ${q.grading_retrying}` : "";
  $("learner-detail").textContent = `${doing}${step} · ${q.ungraded_finished} to grade · ${q.graded_untrained} graded, waiting · ${q.open} open${failed}`;
  // the last batch a step took: what it trained on and dropped, and why (also a batch with
  // nothing to train on, which records no step)
  const batch = learner.heartbeat?.last_batch || learner.last_step?.metrics;
  $("learner-batch").replaceChildren(...(batch ? stepAccount(batch, learner.heartbeat?.last_batch ? "last batch" : "last step") : []));
}

// a step's accounting (learner/accounting.py): trained vs considered, the drops by reason
const SINGULAR = { trajectories: "trajectory", samples: "sample", calls: "call" };
const unitOf = (n, unit) => `${n} ${n === 1 ? SINGULAR[unit] || unit : unit}`;
function stepAccount(m, title) {
  if (!m || m.considered_trajectories === undefined) return [];
  const low = m.trained_share < 0.25;
  const nothing = m.trained === false ? " — nothing to train on, no version" : "";
  const head = `${title ? `${title}: ` : ""}${unitOf(m.trained_samples, "samples")} trained, from ${m.trained_trajectories} of ${unitOf(m.considered_trajectories, "trajectories")} (${Math.round(100 * m.trained_share)} %)${nothing}`;
  const nodes = [el("div", { class: low ? "account-low" : "account-head" }, head)];
  for (const d of m.dropped || []) {
    nodes.push(el("div", { class: "account-drop", "data-reason": d.reason, title: `changed by: ${d.setting}` }, `${d.label} ${unitOf(d.count, d.unit)} `, el("span", { class: "muted" }, `(${d.setting})`)));
  }
  if (m.waiting_trajectories) nodes.push(el("div", { class: "muted" }, `${unitOf(m.waiting_trajectories, "trajectories")} with a signal left for later steps (--max-batch-trajectories)`));
  return nodes;
}

async function setPaused(paused) {
  await guarded(async () => {
    showLearner(await api(paused ? "/learner/pause" : "/learner/resume", { method: "POST" }));
    say(paused ? "Learning paused." : "Learning resumed.");
  });
}

// -- trajectories --------------------------------------------------------------------
function filterParams() {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData($("filters")).entries()) if (String(v).trim()) params.set(k, String(v).trim());
  return params;
}

async function loadTrajectories(reset) {
  const params = filterParams();
  params.set("limit", "50");
  if (!reset && state.cursor) params.set("cursor", state.cursor);
  const page = await api(`/trajectories?${params}`);
  const body = $("trajectory-table").tBodies[0];
  if (reset) body.replaceChildren();
  for (const t of page.items) {
    const row = el(
      "tr",
      { "data-id": t.id },
      el("td", { title: shortTime(t.started_at) }, t.started_at ? shortTime(t.started_at).slice(5) : "–"),
      el("td", { title: t.task_key || "" }, t.task_key || "–"),
      el("td", { class: "type", title: t.interaction_type || "" }, t.interaction_type || "–"),
      el("td", {}, t.policy_versions.join(", ") || "–"),
      el("td", {}, `${t.calls}${t.errors ? ` (${t.errors} err)` : ""}`),
      rewardCell(t),
      el("td", {}, t.status),
    );
    row.addEventListener("click", () => guarded(() => openTrajectory(t.id)));
    body.appendChild(row);
  }
  state.cursor = page.next_cursor;
  $("more").hidden = !page.next_cursor;
}

function rewardCell(t) {
  const failure = t.grading_failure;
  if (!failure) return el("td", {}, t.reward === null ? "–" : fmt(t.reward));
  // a grading that failed says why; "retrying" ones are graded again by the learner
  const label = failure.state === "retrying" ? "retrying" : "grading failed";
  const reason = failure.error.length > 60 ? `${failure.error.slice(0, 60)}…` : failure.error;
  return el("td", { class: `grading-${failure.state}`, title: failure.error }, `${label}: ${reason}`);
}

async function openTrajectory(id) {
  const t = await api(`/trajectories/${encodeURIComponent(id)}`);
  state.open = t;
  $("viewer").hidden = false;
  $("split").classList.add("open");
  $("viewer-title").textContent = t.id;
  $("viewer-meta").textContent = `session ${t.session || "–"} · task ${t.task_key || "–"} · type ${t.interaction_type || "–"} · ${t.status} · ${t.calls.length} calls · started ${shortTime(t.started_at)}`;
  showReward(t);
  renderConversation(t.messages, t.signals || []);
  renderTokens(t.tokens);
}

function showReward(t) {
  const failed = t.grade && t.grade.error;
  const why = failed ? (t.grade.transient ? `grading failed, tried again at ${shortTime(t.grade.retry_at)}: ` : "grading failed: ") + t.grade.error : null;
  $("viewer-reward").textContent = why || (t.reward === null ? "not graded" : fmt(t.reward));
  $("viewer-grade").textContent = t.grade ? JSON.stringify({ reward: t.grade.reward, error: t.grade.error, transient: t.grade.transient, attempts: t.grade.attempts, retry_at: t.grade.retry_at, detail: t.grade.detail, trained_in_step: t.grade.trained_in_step }, null, 1) : "no grade yet";
  const list = $("viewer-feedback");
  list.replaceChildren(...t.feedback.map((f) => el("li", {}, `${shortTime(f.created_at)}: ${fmt(f.reward)}${f.comment ? ` — ${f.comment}` : ""}`)));
}

const SIGNALS = { tool_error: "its tool call failed", interrupted: "the user interrupted it", retried: "the user asked again, word for word", corrected: "the user said it was wrong", approved: "the user said it was right", judged: "the judge read the user's reply" };

function renderConversation(messages, signals) {
  const box = $("conversation");
  box.replaceChildren();
  const judged = new Map(signals.map((s) => [s.turn, s]));
  messages.forEach((m, i) => {
    const node = el("div", { class: `msg ${m.role}${m.is_error ? " failed" : ""}` }, el("span", { class: "role" }, m.role + (m.tool_call_id ? ` · ${m.tool_call_id}` : "")), m.text);
    for (const call of m.tool_calls) node.appendChild(el("div", { class: "toolcall" }, `${call.name}(${call.arguments})`));
    const signal = judged.get(i);
    if (signal) node.appendChild(el("div", { class: `signal${signal.value > 0 ? " good" : ""}`, "data-rule": signal.rule, title: signal.evidence }, `next turn: ${SIGNALS[signal.rule] || signal.rule} (${fmt(signal.value)})`));
    box.appendChild(node);
  });
}

function renderTokens(sequences) {
  const box = $("tokens");
  box.replaceChildren();
  if (!sequences.length) box.appendChild(el("span", { class: "muted" }, "no trainable tokens captured"));
  sequences.forEach((seq, s) => {
    if (s) box.appendChild(el("span", { class: "seq-break" }));
    seq.token_ids.forEach((id, i) => {
      const text = seq.token_text ? seq.token_text[i] : null;
      const trained = seq.loss_mask[i];
      const logprob = seq.logprobs[i];
      const title = `id ${id}` + (trained ? ` · logprob ${logprob.toFixed(4)} (p ${Math.exp(logprob).toFixed(3)})` : " · context (not trained)");
      const token = el("span", { class: trained ? "tok trained" : "tok", title }, text === null ? `[${id}]` : text);
      if (trained) {
        // the heat strip: red where the sampling policy found the token unlikely, green where sure
        token.dataset.logprob = String(logprob);
        token.style.background = `hsl(${Math.round(120 * Math.exp(logprob))}, 70%, 84%)`;
      }
      box.appendChild(token);
    });
  });
}

async function feedback(reward) {
  if (!state.open) return;
  await guarded(async () => {
    await api("/feedback", { method: "POST", body: JSON.stringify({ trajectory_id: state.open.id, reward, comment: reward > 0 ? "thumbs up" : "thumbs down" }) });
    await openTrajectory(state.open.id);
    say(`Reward ${reward} recorded for ${state.open.id}.`);
  });
}

// -- versions ------------------------------------------------------------------------
async function loadVersions() {
  const data = await api("/versions");
  showStepCharts(data.items);
  const body = $("version-table").tBodies[0];
  body.replaceChildren();
  for (const v of data.items) {
    const actions = el("td", {});
    // a version that failed verification (no ordinal) never served and cannot
    if (v.status !== "serving" && v.has_checkpoint && v.ordinal !== null) {
      const serving = data.items.find((x) => x.version === data.serving);
      const older = !serving || v.ordinal < serving.ordinal;
      const action = older ? "rollback" : "promote";
      const button = el("button", { class: action, "data-version": v.version }, older ? "Roll back to this" : "Promote");
      button.addEventListener("click", () => swap(v.version, action));
      actions.appendChild(button);
    }
    body.appendChild(
      el(
        "tr",
        { "data-version": v.version },
        el("td", {}, v.version),
        el("td", { class: `status-${v.status}` }, v.status),
        el("td", {}, shortTime(v.created_at)),
        el("td", {}, v.mean_reward === null ? "–" : fmt(v.mean_reward)),
        el("td", {}, String(v.trajectories_graded)),
        el("td", {}, String(v.calls)),
        el("td", {}, v.swap_seconds === null ? "–" : fmt(v.swap_seconds)),
        el("td", { class: "account" }, ...stepAccount(v.metrics)),
        guardCell(v),
        actions,
      ),
    );
  }
}

// the learner's metrics per step, oldest first: versions a step made carry them
function showStepCharts(items) {
  const steps = items.filter((v) => v.ordinal !== null && v.metrics && v.metrics.mismatch_kl !== undefined).sort((a, b) => a.ordinal - b.ordinal);
  const point = (v, y, extra) => ({ x: v.ordinal, y, title: `${v.version}: ${fmt(y)}`, ...extra });
  const finite = (y) => y !== null && y !== undefined && Number.isFinite(y);
  const of = (key) => steps.filter((v) => finite(v.metrics[key])).map((v) => point(v, v.metrics[key]));
  const byStep = { xLabel: "policy version (in the order they served)", xTick: (n) => steps.find((v) => v.ordinal === n)?.version || String(n) };
  window.charts.seriesChart($("chart-step-kl"), [{ name: "mismatch KL", points: of("mismatch_kl") }], { ...byStep, yLabel: "KL", min: 0 });
  const clip = window.charts.seriesChart($("chart-step-clip"), [
    { name: "PPO clip", points: of("clip_fraction") },
    { name: "behaviour clip", points: of("behaviour_clip_fraction") },
  ], { ...byStep, yLabel: "fraction of tokens", min: 0 }) || [];
  $("clip-legend").replaceChildren(...clip.map((l) => el("span", { class: "key" }, el("i", { style: `background: ${l.color}` }), l.name)));
  const ratio = steps.filter((v) => finite(v.metrics.ratio_mean)).map((v) => point(v, v.metrics.ratio_mean, { low: v.metrics.ratio_min, high: v.metrics.ratio_max, title: `${v.version}: mean ${fmt(v.metrics.ratio_mean)}, ${fmt(v.metrics.ratio_min)} to ${fmt(v.metrics.ratio_max)}` }));
  window.charts.seriesChart($("chart-step-ratio"), [{ name: "ratio", points: ratio }], { ...byStep, yLabel: "π_new / π_old" });
  const swaps = items.filter((v) => v.ordinal !== null && finite(v.swap_seconds)).sort((a, b) => a.ordinal - b.ordinal);
  window.charts.seriesChart($("chart-step-swap"), [{ name: "swap", points: swaps.map((v) => point(v, v.swap_seconds)) }], { ...byStep, xTick: (n) => swaps.find((v) => v.ordinal === n)?.version || String(n), yLabel: "seconds", min: 0 });
}

// the regression guard's numbers for a version it rolled back (or that was accepted)
function guardCell(v) {
  const cell = el("td", { class: "guard" });
  if (!v.guard) return cell;
  cell.appendChild(el("div", { class: "guard-flag" }, `rolled back by the guard → ${v.guard.serving_after || "?"}`));
  for (const t of v.guard.types || []) {
    const before = t.before ? fmt(t.before.value) : "–";
    const after = t.after ? fmt(t.after.value) : "–";
    const allowed = t.allowed === null ? "" : ` (drop allowed ${fmt(t.allowed)})`;
    const text = `${t.type}${t.protected ? " (protected)" : ""}: ${before} → ${after}${allowed}`;
    cell.appendChild(el("div", { class: t.regressed ? "guard-regressed" : "muted", "data-type": t.type }, text));
  }
  if (v.status === "rolled_back") {
    const button = el("button", { class: "accept", "data-version": v.version }, "Accept anyway");
    button.addEventListener("click", () => acceptVersion(v.version));
    cell.appendChild(button);
  }
  return cell;
}

async function acceptVersion(version) {
  if (!window.confirm(`Serve ${version} again, regression and all?`)) return;
  await guarded(async () => {
    const result = await api(`/guard/accept/${encodeURIComponent(version)}`, { method: "POST" });
    say(`Accepted: now serving ${result.serving} (the weights of ${version}).`);
    await loadVersions();
  });
}

async function swap(version, action) {
  if (!window.confirm(`${action === "rollback" ? "Roll back to" : "Promote"} ${version}? vLLM will serve its weights.`)) return;
  say(`${action} to ${version}…`);
  await guarded(async () => {
    const result = await api(`/versions/${encodeURIComponent(version)}/${action}`, { method: "POST" });
    say(`Now serving ${result.serving} (the weights of ${version}).`);
    await loadVersions();
  });
}

// -- tasks ---------------------------------------------------------------------------
async function loadTasks() {
  const data = await api("/tasks?limit=500");
  const body = $("task-table").tBodies[0];
  body.replaceChildren(
    ...data.items.map((t) =>
      el("tr", {}, el("td", {}, t.key), el("td", {}, t.answer || "–"), el("td", {}, t.match), el("td", {}, String(t.trajectories)), el("td", {}, t.mean_reward === null ? "–" : fmt(t.mean_reward))),
    ),
  );
}

// -- types: per interaction type and policy version -----------------------------------------
const rate = percent;

function typeRow(kind, version, figures) {
  const name = kind === null ? "(none)" : kind;
  const cell = el("td", { class: version === undefined ? "type-name" : "muted" }, version === undefined ? name : "");
  const row = el(
    "tr",
    { "data-type": name, "data-version": version === undefined ? "" : version || "(none)" },
    cell,
    el("td", {}, version === undefined ? "all" : version || "(none)"),
    el("td", {}, String(figures.trajectories)),
    el("td", {}, String(figures.graded)),
    el("td", { class: "mean-reward" }, figures.mean_reward === null ? "–" : fmt(figures.mean_reward)),
    el("td", { class: "success" }, rate(figures.success_rate)),
  );
  if (kind !== null) {
    row.addEventListener("click", () => {
      $("filters").elements.type.value = kind;
      show("trajectories");
    });
  }
  return row;
}

async function loadTypes() {
  const data = await api("/types");
  $("types-success-at").textContent = fmt(data.success_at);
  const body = $("type-table").tBodies[0];
  body.replaceChildren();
  for (const t of data.types) {
    body.appendChild(typeRow(t.interaction_type, undefined, t));
    for (const v of t.by_version) body.appendChild(typeRow(t.interaction_type, v.policy_version, v));
  }
  if (!data.types.length) body.appendChild(el("tr", {}, el("td", { colSpan: 6, class: "muted" }, "no trajectories yet")));
}

// -- harnesses: the compatibility policy per User-Agent ---------------------------------
const COMPAT_COLUMNS = ["honoured", "ignored", "unknown", "flattened", "left_out", "clamped", "refused"];

function featureCell(category, features, extra) {
  const cell = el("td", { class: `compat compat-${category}` });
  for (const f of features) cell.appendChild(el("span", { class: "chip", title: `${f.calls} call(s)` }, `${f.feature} (${f.calls})`));
  for (const line of extra || []) cell.appendChild(el("div", { class: "muted" }, line));
  return cell;
}

async function loadHarnesses() {
  const data = await api("/compat");
  const body = $("harness-table").tBodies[0];
  body.replaceChildren();
  for (const h of data.harnesses) {
    const apis = Object.entries(h.apis).map(([api, n]) => `${api} ${n}`).join(", ");
    const refusals = h.refusals.map((r) => `${r.param || ""}: ${r.message}`);
    body.appendChild(
      el(
        "tr",
        { "data-harness": h.user_agent || "" },
        el("td", { class: "harness" }, h.user_agent || "(no User-Agent)"),
        el("td", { title: apis }, `${h.calls}`, el("div", { class: "muted" }, apis)),
        ...COMPAT_COLUMNS.map((c) => featureCell(c, h[c], c === "refused" ? refusals : null)),
      ),
    );
  }
  if (!data.harnesses.length) body.appendChild(el("tr", {}, el("td", { colSpan: 9, class: "muted" }, "no calls in the last 24 h")));
}

// -- curricula: the stage over time ----------------------------------------------------
function describeRule(rule) {
  const names = { pass_at_1: "pass@1", mean_reward: "mean reward", pass_at_k: "pass@k" };
  const over = rule.over_last === 1 ? "the last eval" : `the last ${rule.over_last} evals`;
  return `${names[rule.metric] || rule.metric} ≥ ${rule.at_least} over ${over}`;
}

function curriculumCard(c, evals) {
  const stages = el("div", { class: "stages" });
  for (const s of c.stages) {
    stages.appendChild(el("span", { class: `stage stage-${s.status}`, "data-stage": s.name, title: `${describeRule(s.rule)}; replay ${s.replay}; ${s.train_tasks} train / ${s.eval_tasks} eval tasks` }, `${s.index + 1}. ${s.name} · ${s.status}`));
  }
  const where = c.complete ? `every stage passed (${shortTime(c.completed_at)})` : `at ${c.stage} since ${shortTime(c.stage_since)}, ${c.stage_rounds} training rounds in it`;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart curriculum-chart");
  const promotions = el("table", { class: "promotion-table" }, el("thead", {}, el("tr", {}, ...["promoted at", "from", "to", "version", "passed with"].map((h) => el("th", {}, h)))));
  const body = el("tbody", {});
  for (const p of c.promotions) {
    const rule = p.metrics && p.metrics.rule ? describeRule(p.metrics.rule) : "";
    const value = p.metrics && p.metrics.value !== undefined ? fmt(p.metrics.value) : "–";
    body.appendChild(el("tr", { "data-from": p.from_stage }, el("td", {}, shortTime(p.at)), el("td", {}, p.from_stage), el("td", {}, p.to_stage || "(the end)"), el("td", {}, p.policy_version || "–"), el("td", {}, `${value}${rule ? ` (${rule})` : ""}`)));
  }
  if (!c.promotions.length) body.appendChild(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "no promotion yet")));
  promotions.appendChild(body);
  const card = el(
    "section",
    { class: "curriculum card", "data-curriculum": c.name },
    el("h2", {}, c.name),
    el("div", { class: "muted curriculum-where" }, `${where} · ${c.rounds} training rounds in all · ${c.path || ""}`),
    stages,
    el("figure", {}, el("figcaption", {}, "pass@1 of each eval of the stage's split, oldest first"), svg),
    el("h3", {}, "Promotions"),
    promotions,
  );
  const shown = evals.filter((e) => e.pass_at_1 !== null);
  const points = shown.map((e) => ({ label: `${e.stage} · ${e.policy_version || "?"} · ${shortTime(e.at)}`, value: e.pass_at_1 }));
  // a dashed line where the evals move on to the next stage: the promotion
  const marks = shown.map((e, i) => ({ index: i, label: e.stage })).filter((m, i) => i === 0 || shown[i - 1].stage !== shown[i].stage);
  return { card, svg, points, marks };
}

async function loadCurricula() {
  const data = await api("/curricula");
  const box = $("curricula");
  const details = await Promise.all(data.items.map((c) => api(`/curricula/${encodeURIComponent(c.name)}?limit=200`)));
  box.replaceChildren();
  details.forEach((c) => {
    const { card, svg, points, marks } = curriculumCard(c, c.evals);
    box.appendChild(card);
    window.charts.lineChart(svg, points, { min: 0, max: 1, marks }); // in the page: it needs its width
  });
  if (!data.items.length) box.appendChild(el("p", { class: "muted" }, "no curriculum has run against this store yet"));
}

// -- self-judge: its agreement with the ground truth, per interaction type --------------
const share = percent;

async function loadSelfJudge() {
  const data = await api("/self-judge");
  const body = $("selfjudge-table").tBodies[0];
  body.replaceChildren();
  for (const t of data.types) {
    const sources = Object.entries(t.by_source).map(([source, f]) => `${source}: ${share(f.agreement)} of ${f.compared}`);
    body.appendChild(
      el(
        "tr",
        { "data-type": t.type === null ? "" : t.type },
        el("td", {}, t.type === null ? "(untyped)" : t.type),
        el("td", {}, String(t.self_judged)),
        el("td", {}, t.self_judged_mean_reward === null ? "–" : fmt(t.self_judged_mean_reward)),
        el("td", {}, String(t.compared)),
        el("td", { class: "agreement" }, share(t.agreement)),
        el("td", {}, share(t.judge_pass_rate)),
        el("td", {}, share(t.truth_pass_rate)),
        el("td", {}, t.correlation === null ? "–" : fmt(t.correlation)),
        el("td", { class: "muted" }, sources.join(" · ") || "–"),
        el("td", {}, String(t.judge_errors)),
      ),
    );
  }
  if (!data.types.length) body.appendChild(el("tr", {}, el("td", { colSpan: 10, class: "muted" }, "no self-judge verdicts yet")));
}

// -- next-turn signals per client key, one-sided bursts flagged --------------------------
async function loadSignals() {
  const data = await api("/signals");
  const body = $("signals-table").tBodies[0];
  body.replaceChildren();
  for (const k of data.keys) {
    body.appendChild(
      el(
        "tr",
        { "data-key": k.key_name === null ? "" : k.key_name, class: k.flagged ? "flagged" : "" },
        el("td", {}, k.key_name === null ? "(no key)" : k.key_name),
        el("td", {}, String(k.signals)),
        el("td", {}, String(k.good)),
        el("td", {}, String(k.bad)),
        el("td", {}, String(k.words.signals)),
        el("td", {}, share(k.words.good_share)),
        el("td", {}, share(k.rest_words.good_share)),
        el("td", { class: k.flagged ? "error" : "muted" }, k.flagged ? `flagged: ${k.reason}` : "–"),
      ),
    );
  }
  if (!data.keys.length) body.appendChild(el("tr", {}, el("td", { colSpan: 8, class: "muted" }, "no next-turn signals stored in the last 24 hours")));
}

// -- tenants: their adapters, where loaded, their traffic and reward per version ----------
async function loadTenants() {
  const data = await api("/tenants");
  const body = $("tenants-table").tBodies[0];
  const charts = $("tenant-charts");
  body.replaceChildren();
  charts.replaceChildren();
  for (const t of data.items) {
    const loaded = t.loaded_on.length ? `${t.loaded_on.length} replica(s)` : (t.serving_version ? "not loaded: the shared policy answers" : "–");
    body.appendChild(
      el(
        "tr",
        { "data-tenant": t.name },
        el("td", {}, t.name),
        el("td", {}, t.client_keys.join(", ") || "–"),
        el("td", {}, t.interaction_types.join(", ") || "–"),
        el("td", { title: t.steered_by_hand ? `its lineage serves ${t.lineage_version || "the shared policy"}` : "" },
          (t.serving_version || "(shared policy)") + (t.steered_by_hand ? " (set by hand: not trained)" : "")),
        el("td", { class: t.loaded_on.length ? "" : "muted" }, loaded),
        el("td", {}, String(t.traffic.graded)),
        el("td", {}, String(t.traffic.trained)),
        el("td", { class: t.canary ? "" : "muted" }, canarySettings(t.canary)),
      ),
    );
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("data-tenant", t.name);
    charts.appendChild(el("h3", {}, `${t.name}: mean reward by version`));
    charts.appendChild(svg);
    window.charts.barChart(
      svg,
      t.traffic.by_version.map((v) => ({ label: v.version || "(none)", value: v.mean_reward, title: `${v.version} (${v.trajectories} graded)` })),
      { xLabel: "policy version (that served the trajectory's first call)", yLabel: "mean reward" },
    );
  }
  if (!data.items.length) body.appendChild(el("tr", {}, el("td", { colSpan: 8, class: "muted" }, "no tenants: PUT /admin/api/tenants/NAME defines one")));
}

// a tenant's own canary settings, each over the learner's (null: all the learner's)
function canarySettings(c) {
  if (!c) return "the learner's";
  const parts = [];
  if (c.share !== undefined) parts.push(c.share > 0 ? `share ${c.share}` : "no canary");
  if (c.min_calls !== undefined) parts.push(`${c.min_calls} calls an arm`);
  if (c.time_limit_s !== undefined) parts.push(`${c.time_limit_s} s`);
  if (c.default_decision !== undefined) parts.push(`then ${c.default_decision}`);
  for (const [name, value] of Object.entries(c.watch || {})) parts.push(`watch ${name} ${value}`);
  return parts.join(", ") + "; else the learner's";
}

// -- canaries: their arms, the test's state, the decision, and the watch's alerts ----------
const armCell = (arm) => `${arm.calls} / ${arm.graded} / ${arm.mean_reward === null ? "–" : fmt(arm.mean_reward)}`;

function decisionOf(c) {
  if (c.status !== "running") return `${c.status.replace("_", " ")} by ${c.decided_by}: ${c.reason || "–"}`;
  const last = c.actions[c.actions.length - 1];
  if (last && last.action === "hold") return `held by the watch: ${last.reason}`;
  return `collecting until ${shortTime(c.ends_at)} (then: ${c.default_decision})`;
}

async function loadCanaries() {
  const [data, watch] = await Promise.all([api("/canaries"), api("/watch")]);
  const body = $("canaries-table").tBodies[0];
  body.replaceChildren();
  for (const c of data.items) {
    const open = c.alerts.filter((a) => a.cleared_at === null);
    body.appendChild(
      el(
        "tr",
        { "data-canary": String(c.id) },
        el("td", {}, String(c.id)),
        el("td", {}, c.tenant || "(shared policy)"),
        el("td", {}, c.candidate),
        el("td", {}, c.incumbent || "–"),
        el("td", {}, percent(c.share)),
        el("td", {}, armCell(c.arms.candidate)),
        el("td", {}, armCell(c.arms.incumbent)),
        el("td", {}, c.status.replace("_", " ")),
        el("td", {}, decisionOf(c)),
        el("td", { class: open.length ? "error" : "muted" },
          open.length ? open.map((a) => a.reason).join("; ") : `${c.alerts.length} cleared`),
        historyCell(c),
        canaryButtons(c),
      ),
    );
  }
  if (!data.items.length) body.appendChild(el("tr", {}, el("td", { colSpan: 12, class: "muted" }, "no canaries: POST /admin/api/canaries starts one")));
  const alerts = $("watch-table").tBodies[0];
  alerts.replaceChildren();
  for (const a of watch.active) {
    alerts.appendChild(
      el(
        "tr",
        { "data-alert": String(a.id) },
        el("td", {}, a.detector),
        el("td", {}, a.canary_id === null ? `newest version (${a.tenant || "shared policy"})` : `canary ${a.canary_id}`),
        el("td", {}, a.version),
        el("td", {}, a.baseline || "the other versions"),
        el("td", {}, a.reason),
        el("td", {}, shortTime(a.raised_at)),
      ),
    );
  }
  if (!watch.active.length) alerts.appendChild(el("tr", {}, el("td", { colSpan: 6, class: "muted" }, "no detector alerts")));
}

// every action taken on the canary, oldest first; open ones stay open through the polling
function historyCell(c) {
  const until = (a) => (a.action === "extend" && a.detail && a.detail.ends_at ? ` (until ${shortTime(a.detail.ends_at)})` : "");
  const items = c.actions.map((a) => el("li", { "data-action": a.action }, `${shortTime(a.at)} · ${a.action}${until(a)} · ${a.by}${a.reason ? ` — ${a.reason}` : ""}`));
  const last = c.actions[c.actions.length - 1];
  const summary = last ? `${c.actions.length}, last: ${last.action} by ${last.by}` : "none";
  const details = el("details", { open: state.openHistories.has(c.id) }, el("summary", {}, summary), el("ol", {}, ...items));
  details.addEventListener("toggle", () => (details.open ? state.openHistories.add(c.id) : state.openHistories.delete(c.id)));
  return el("td", { class: "history" }, details);
}

// -- an operator's actions on a running canary, recorded as admin:NAME (admin without a name)
const OPERATOR_KEY = "onthejob-operator";
const scopeName = (c) => (c.tenant ? `tenant ${c.tenant}` : "the shared policy");
const CANARY_ACTIONS = {
  promote: {
    label: "Promote",
    done: "promoted",
    ask: (c) => `Promote ${c.candidate}? It serves ${scopeName(c)} from now on` + (c.tenant ? "." : " (every replica is swapped to it)."),
  },
  rollback: {
    label: "Roll back",
    done: "rolled back",
    ask: (c) => `Roll back canary ${c.id}? Every call of ${scopeName(c)} goes to ${c.incumbent || "the incumbent"} again.`,
  },
  extend: { label: "Extend", done: "extended" },
};

function canaryButtons(c) {
  const cell = el("td", { class: "canary-actions" });
  if (c.status !== "running") return cell;
  for (const [action, spec] of Object.entries(CANARY_ACTIONS)) {
    const button = el("button", { class: action, "data-action": action, title: action === "extend" ? "by the seconds above" : "" }, spec.label);
    button.addEventListener("click", () => actOnCanary(c, action));
    cell.appendChild(button);
  }
  return cell;
}

function operatorBody(extra) {
  const name = $("operator").value.trim();
  return JSON.stringify({ ...(name ? { by: name } : {}), reason: $("canary-reason").value.trim(), ...extra });
}

async function actOnCanary(c, action) {
  const spec = CANARY_ACTIONS[action];
  const extra = {};
  if (action === "extend") {
    extra.seconds = Number($("extend-seconds").value);
    if (!(extra.seconds > 0)) return say("Extend by how many seconds? Give a number above 0.", true);
  } else if (!window.confirm(spec.ask(c))) return;
  say(`${spec.label}: canary ${c.id}…`);
  await guarded(async () => {
    const after = await api(`/canaries/${c.id}/${action}`, { method: "POST", body: operatorBody(extra) });
    const last = after.actions[after.actions.length - 1];
    const until = action === "extend" ? ` until ${shortTime(after.ends_at)}` : "";
    say(`Canary ${c.id} ${spec.done}${until} by ${last.by}.`);
    $("canary-reason").value = "";
    await loadCanaries();
  });
}

function rememberOperator() {
  const name = $("operator").value.trim();
  if (name) localStorage.setItem(OPERATOR_KEY, name);
  else localStorage.removeItem(OPERATOR_KEY);
}

// -- wiring --------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));
  $("pause").addEventListener("click", () => setPaused(true));
  $("resume").addEventListener("click", () => setPaused(false));
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); guarded(() => loadTrajectories(true)); });
  $("more").addEventListener("click", () => guarded(() => loadTrajectories(false)));
  $("thumbs-up").addEventListener("click", () => feedback(1));
  $("thumbs-down").addEventListener("click", () => feedback(0));
  $("operator").value = localStorage.getItem(OPERATOR_KEY) || "";
  $("operator").addEventListener("change", rememberOperator);
  if (state.token) start();
});
