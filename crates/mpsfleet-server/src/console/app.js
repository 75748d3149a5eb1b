// The mpsfleet console: plain DOM over the REST API (the routes of /v1/openapi.json), no build
// step, nothing fetched from elsewhere. Every text from the API goes into the page as a text
// node (textContent), never as markup: a hostname or task name holding HTML is shown as it is.
// The token stays in this tab's sessionStorage and goes only in the Authorization header.
// `mpsfleet console` opens `/#login=CODE`: a one-time code, traded once for a token of the
// console's own (POST /v1/console/session) and taken out of the address at once.
'use strict';

const state = {
  token: sessionStorage.getItem('mpsfleet.token'),
  stream: null,
  redraw: null,
  // The CLI's --all: STOPPED tasks and DEREGISTERED hosts are hidden unless it is on.
  all: sessionStorage.getItem('mpsfleet.all') === 'yes',
};

// An element with attributes and children; strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k === 'on') for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

class ApiError extends Error {}

async function api(path) {
  return (await apiWithTotal(path)).body;
}

// The answer and, for a paged list, its X-Total-Count.
async function apiWithTotal(path) {
  const r = await fetch(path, { headers: { Authorization: 'Bearer ' + state.token } });
  if (r.status === 401) {
    signOut('The token was refused; sign in again.');
    throw new ApiError('unauthorized');
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(body.message || ('HTTP ' + r.status));
  return { body, total: Number(r.headers.get('x-total-count') || (Array.isArray(body) ? body.length : 0)) };
}

const seg = (s) => encodeURIComponent(s);
const utc = (ms) => (ms ? new Date(ms).toISOString().replace('.000', '') : '-');

// How long ago, in the CLI's AGE words: 45s, 12m, 3h, 2d.
function ago(ms) {
  const s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
  if (s < 120) return s + 's';
  if (s < 7200) return Math.floor(s / 60) + 'm';
  if (s < 172800) return Math.floor(s / 3600) + 'h';
  return Math.floor(s / 86400) + 'd';
}

// A time as UTC and how long ago: 2026-12-05T10:00:00Z (3m ago).
function when(ms) {
  if (!ms) return '-';
  return el('time', { datetime: new Date(ms).toISOString() }, utc(ms), ' (', ago(ms), ' ago)');
}

// A host's health in the CLI's words: a host that left the fleet has none.
const health = (h) => (h.status === 'DEREGISTERED' ? '-' : status(h.healthStatus));
const mib = (n) => n + ' MiB';
const status = (s) => el('span', { class: s }, s);

function table(headers, rows) {
  return el('table', {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c) => el('td', {}, c))))));
}

function fields(pairs) {
  return el('dl', {}, pairs.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

// Any JSON value as nested fields (the pool's responsibility record, an incident's trigger);
// a field named …AtMs (or a list of them) is a time, shown as one.
function value(v, key) {
  if (v === null || v === undefined) return '-';
  const time = key && /AtMs$/.test(key);
  if (Array.isArray(v)) return v.length ? el('ol', {}, v.map((x) => el('li', {}, value(x, key)))) : '-';
  if (typeof v === 'object') return fields(Object.entries(v).map(([k, x]) => [k, value(x, k)]));
  if (time && typeof v === 'number') return when(v);
  return String(v);
}

function link(href, text, attrs) {
  return el('a', Object.assign({ href }, attrs || {}), text);
}

// ---- views -------------------------------------------------------------------------------

const secs = (ms) => (ms === undefined || ms === null ? '-' : (ms / 1000).toFixed(1) + ' s');

// A pool's recovery bounds: one row per failure kind, then how they are derived.
function bounds(b) {
  const rows = (b.kinds || []).map((k) => [k.kind, secs(k.detectMs), secs(k.notifyMs), secs(k.decideMs),
    secs(k.replaceMs), secs(k.totalMs), secs(k.totalFencedMs)]);
  return el('div', { class: 'bounds' },
    el('h3', {}, 'Recovery bounds', b.maxResumeMs ? ' (maxResumeSeconds ' + secs(b.maxResumeMs) + ')' : ''),
    table(['FAILURE', 'DETECT', 'NOTIFY', 'DECIDE', 'REPLACE', 'TOTAL (RESTART)', 'TOTAL (FENCED)'], rows),
    el('ul', {}, (b.formulas || []).map((f) => el('li', {}, f))),
    value(b.inputs));
}

async function pools() {
  const list = await api('/v1/pools');
  const out = [el('h1', {}, 'Pools')];
  for (const p of list) {
    const explain = await api('/v1/pools/' + seg(p.name) + '/explain').catch((e) => ({ error: e.message }));
    const { bounds: b, ...record } = explain;
    const events = ((p.events && p.events.entries) || []).map((e) => [when(e.atMs), e.reason, e.message]);
    out.push(el('section', { 'data-pool': p.name }, el('h2', {}, p.name, ' (', p.mode, ')'), value(record),
      b ? bounds(b) : null,
      events.length ? [el('h3', {}, 'Events'), table(['WHEN', 'REASON', 'MESSAGE'], events)] : null));
  }
  return out;
}

// Hosts are read a page at a time: a fleet of thousands draws its first page at once.
const HOST_PAGE = 500;

function hostRow(h) {
  return el('tr', {}, [
    link('#/host/' + seg(h.id), h.hostname, { 'data-host-name': h.id }),
    h.pool, status(h.status), health(h), String(h.gpus.length), String(h.taskCount),
    when(h.lastHeartbeatMs),
  ].map((c) => el('td', {}, c)));
}

async function hosts() {
  const t0 = performance.now();
  const live = state.all ? '' : '&live=true';
  const first = await apiWithTotal('/v1/hosts?limit=' + HOST_PAGE + live);
  window.mpsfleetFetchMs = performance.now() - t0;
  const body = el('tbody', {}, first.body.map(hostRow));
  let shown = first.body.length;
  const more = el('button', { type: 'button', id: 'more-hosts' }, 'Show more');
  const count = el('span', {});
  const showing = () => {
    count.textContent = 'Showing ' + shown + ' of ' + first.total + ' ';
    more.hidden = shown >= first.total;
  };
  more.addEventListener('click', async () => {
    const next = await api('/v1/hosts?limit=' + HOST_PAGE + '&skip=' + shown + live);
    body.append(...next.map(hostRow));
    shown += next.length;
    showing();
  });
  showing();
  return [el('h1', {}, 'Hosts (', String(first.total), ')', state.all ? '' : ' without DEREGISTERED'),
    el('table', {}, el('thead', {}, el('tr', {},
      ['HOSTNAME', 'POOL', 'STATUS', 'HEALTH', 'GPUS', 'TASKS', 'LAST HEARTBEAT'].map((h) => el('th', {}, h)))), body),
    el('p', {}, count, more)];
}

async function host(id) {
  const h = await api('/v1/hosts/' + seg(id));
  const gpus = h.gpus.map((g) => {
    const used = g.totalMemoryMib - g.remainingMemoryMib;
    return [String(g.index), g.gpuId, g.model, status(g.sharingMode),
      el('span', {}, el('meter', { min: 0, max: g.totalMemoryMib, value: used }), ' ', mib(used), ' / ', mib(g.totalMemoryMib)),
      el('span', {}, el('meter', { min: 0, max: 100, value: Math.min(100, g.computePercentSum) }), ' ', g.computePercentSum + '%'),
      g.clientCount + ' / ' + g.maxClients];
  });
  const checks = (h.checks || []).map((c) => [c.name, c.gpuId || '-', status(c.status), when(c.sinceMs),
    String(c.restarts || 0), c.reason || '-']);
  const use = (h.gpuUse || []).map((u) => [u.taskId, u.gpuId, mib(u.memoryUsedMiB),
    u.memoryLimitMiB === undefined ? '-' : mib(u.memoryLimitMiB), u.smPercent === undefined ? '-' : u.smPercent + '%']);
  return [
    el('h1', { id: 'host-title' }, h.hostname),
    fields([['ID', h.id], ['Pool', h.pool], ['Status', status(h.status)], ['Health', health(h)],
      ['Cordoned', h.cordoned ? 'yes' : 'no'], ['Runtime', h.runtime + (h.runtimeVersion ? ' ' + h.runtimeVersion : '')],
      ['Last heartbeat', when(h.lastHeartbeatMs)]]),
    el('h2', {}, 'GPUs'),
    table(['INDEX', 'UUID', 'MODEL', 'SHARING', 'MPS MEMORY', 'COMPUTE', 'CLIENTS'], gpus),
    el('h2', {}, 'Checks'),
    table(['CHECK', 'GPU', 'STATUS', 'SINCE', 'LOCAL RESTARTS', 'REASON'], checks),
    use.length ? [el('h2', {}, 'GPU use'), table(['TASK', 'GPU', 'MEMORY USED', 'DECLARED', 'SM'], use)] : [],
  ];
}

// Unresolved incidents by host: a task on such a host is shown with it, where the work is.
async function openIncidents() {
  const list = await api('/v1/incidents').catch(() => []);
  const byHost = new Map();
  for (const i of list) if (i.state.status !== 'RESOLVED') byHost.set(i.hostId, i);
  return byHost;
}

function hostCell(hostId, byHost) {
  if (!hostId) return '-';
  const i = byHost.get(hostId);
  if (!i) return hostId;
  return el('span', { class: 'error', 'data-impaired': i.id }, hostId, ' (impaired: incident ', i.id, ', ',
    i.state.status, ')');
}

async function tasks() {
  const [list, byHost] = await Promise.all([api('/v1/tasks?order=newest' + (state.all ? '' : '&live=true')), openIncidents()]);
  const rows = list.map((t) => [t.id, t.taskDefinition.family + ':' + t.taskDefinition.revision, t.group || '-',
    status(t.lastStatus), status(t.healthStatus),
    t.lastStatus === 'STOPPED' ? (t.hostId || '-') : hostCell(t.hostId, byHost),
    (t.gpuIds || []).join(', ') || '-', t.pendingReason || '-', String(t.priority ?? 50)]);
  return [el('h1', {}, 'Tasks (', String(list.length), ')', state.all ? '' : ' without STOPPED'),
    table(['ID', 'DEFINITION', 'SERVICE', 'STATUS', 'HEALTH', 'HOST', 'GPUS', 'WAITING', 'PRIORITY', 'CREATED'],
      rows.map((r, n) => r.concat([when(list[n].createdAtMs)])))];
}

async function services() {
  const [list, byHost] = await Promise.all([api('/v1/services'), openIncidents()]);
  const out = [el('h1', {}, 'Services')];
  for (const s of list) {
    const deployments = await api('/v1/services/' + seg(s.name) + '/deployments').catch(() => []);
    const replicas = await api('/v1/tasks?service=' + seg(s.name) + '&live=true').catch(() => []);
    const impaired = replicas.filter((t) => t.hostId && byHost.has(t.hostId));
    out.push(el('section', { 'data-service': s.name }, el('h2', {}, s.name),
      fields([['Pool', s.pool], ['Priority', String(s.priority ?? 50)],
        ['Desired', String(s.desiredCount)], ['Running', String(s.runningCount)],
        // "Healthy" only of tasks with a health check; without one it would mean running.
        s.healthChecked ? ['Healthy', String(s.healthyCount)] : ['Health', 'no health check'],
        ['On impaired hosts', impaired.length
          ? el('span', {}, ...impaired.map((t) => el('span', {}, t.id, ' on ', hostCell(t.hostId, byHost), ' ')))
          : 'none']]),
      table(['DEPLOYMENT', 'STATUS', 'ROLLOUT', 'DESIRED', 'RUNNING', 'FAILED'], deployments.map((d) => [
        d.id, status(d.status), status(d.rolloutState), String(d.desiredCount), String(d.runningCount ?? '-'),
        String(d.failedTasks ?? 0)])),
      // Each replica's place in the service's traffic (what service discovery publishes).
      (s.traffic || []).length ? el('div', { 'data-traffic': s.name }, table(['REPLICA', 'TRAFFIC', 'WHY'],
        s.traffic.map((r) => [r.taskId, status(r.state), r.why || '-']))) : null));
  }
  return out;
}

async function incidents() {
  const list = (await api('/v1/incidents')).sort((a, b) => b.openedAtMs - a.openedAtMs);
  const out = [el('h1', {}, 'Incidents (', String(list.length), ')')];
  for (const i of list) {
    const entries = (i.timeline && i.timeline.entries) || [];
    out.push(el('section', { class: 'incident', 'data-incident': i.id },
      el('h2', {}, i.id, ' ', status(i.state.status), ' host ', i.hostId),
      i.state.reason ? el('p', { class: 'error' }, i.state.reason) : null,
      fields([['Pool', i.pool], ['Owner', i.owner], ['Opened', when(i.openedAtMs)],
        ['First failure', i.timing && i.timing.firstFailureAtMs ? when(i.timing.firstFailureAtMs) : '-'],
        ['Down for', i.timing && i.timing.totalMs != null ? (i.timing.totalMs / 1000).toFixed(3) + ' s (first failure to resumed)' : '-'],
        ['Trigger', value(i.trigger)], ['Drill', i.drill || 'no']]),
      (i.judgement || []).length ? table(['PHASE', 'MEASURED', 'BOUND', 'VERDICT'], i.judgement.map((j) =>
        [j.phase, secs(j.measuredMs), secs(j.boundMs), j.verdict + (j.cause ? ' (' + j.cause + ')' : '')])) : null,
      table(['WHEN', 'STEP', 'DETAIL'], entries.map((e) => [when(e.atMs), e.step, e.detail]))));
  }
  return out;
}

const routes = [
  [/^#\/pools$/, pools],
  [/^#\/hosts$/, hosts],
  [/^#\/host\/(.+)$/, (m) => host(decodeURIComponent(m[1]))],
  [/^#\/tasks$/, tasks],
  [/^#\/services$/, services],
  [/^#\/incidents$/, incidents],
];

async function render() {
  if (!state.token) return;
  const hash = location.hash || '#/hosts';
  const main = document.getElementById('main');
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('current', hash.startsWith(a.getAttribute('href')));
  }
  for (const [re, view] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    try {
      const nodes = await view(m);
      // Navigated while this view was fetched (a live event's redraw of the old view racing a
      // click): the render of the new view draws, not this one.
      if ((location.hash || '#/hosts') !== hash) return;
      main.replaceChildren(...[nodes].flat(3));
      document.body.dataset.rendered = hash;
      // Since the page's navigation started: what `mpsfleet bench console` reads.
      if (window.mpsfleetFirstRenderAt === undefined) window.mpsfleetFirstRenderAt = performance.now();
    } catch (e) {
      if ((location.hash || '#/hosts') !== hash) return;
      if (!(e instanceof ApiError && e.message === 'unauthorized')) {
        main.replaceChildren(el('p', { class: 'error' }, 'Cannot show ' + hash + ': ' + e.message));
      }
    }
    return;
  }
  main.replaceChildren(el('p', { class: 'error' }, 'No such view: ' + hash));
}

// ---- live: /v1/events, read as a stream (EventSource cannot send the token) ---------------

function redrawSoon() {
  clearTimeout(state.redraw);
  state.redraw = setTimeout(render, 250);
}

function showEvent(type, data) {
  const list = document.getElementById('event-list');
  let subject = '';
  let at = Date.now();
  try {
    const v = JSON.parse(data);
    subject = (v.subject && v.subject.id) || (v.host && v.host.id) || (v.task && v.task.id)
      || (v.incident && v.incident.id) || '';
    if (v.at_ms) at = v.at_ms;
  } catch (_) { /* a comment or a partial event */ }
  list.prepend(el('li', {}, utc(at), ' ', type, ' ', subject));
  while (list.children.length > 50) list.lastChild.remove();
}

async function follow() {
  const live = document.getElementById('live');
  const controller = new AbortController();
  state.stream = controller;
  try {
    const r = await fetch('/v1/events', { headers: { Authorization: 'Bearer ' + state.token }, signal: controller.signal });
    if (!r.ok) throw new Error('HTTP ' + r.status);
    live.classList.remove('down');
    const reader = r.body.getReader();
    const text = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value: chunk, done } = await reader.read();
      if (done) break;
      buf += text.decode(chunk, { stream: true });
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let type = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith('event:')) type = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).trim());
        }
        if (data.length) {
          showEvent(type, data.join('\n'));
          redrawSoon();
        }
      }
    }
  } catch (e) {
    if (controller.signal.aborted) return;
  }
  live.classList.add('down');
  if (state.token && state.stream === controller) setTimeout(follow, 2000);
}

// ---- sign in and out ---------------------------------------------------------------------

function signedIn() {
  for (const id of ['nav', 'live', 'signout', 'events', 'all-toggle']) document.getElementById(id).hidden = false;
  if (!location.hash) location.hash = '#/hosts';
  render();
  follow();
}

function signOut(why) {
  state.token = null;
  sessionStorage.removeItem('mpsfleet.token');
  if (state.stream) state.stream.abort();
  if (why) sessionStorage.setItem('mpsfleet.why', why);
  location.reload();
}

async function signIn(ev) {
  ev.preventDefault();
  const token = document.getElementById('token').value.trim();
  const err = document.getElementById('signin-error');
  const r = await fetch('/v1/pools', { headers: { Authorization: 'Bearer ' + token } }).catch((e) => ({ ok: false, status: e.message }));
  if (!r.ok) {
    err.textContent = r.status === 401 ? 'That token is not known.' : r.status === 403
      ? 'That token may not read the fleet (a viewer token is enough).' : 'Cannot sign in: ' + r.status;
    return;
  }
  state.token = token;
  sessionStorage.setItem('mpsfleet.token', token);
  signedIn();
}

// `/#login=CODE` from `mpsfleet console`: the code leaves the address before anything else, and
// is traded once for the console's own token.
async function signInWithLink(code) {
  history.replaceState(null, '', location.pathname + location.search + '#/hosts');
  const err = document.getElementById('signin-error');
  const r = await fetch('/v1/console/session', { method: 'POST', headers: { 'x-mpsfleet-console-code': code } })
    .catch((e) => ({ ok: false, status: e.message }));
  if (!r.ok) {
    const body = r.json ? await r.json().catch(() => ({})) : {};
    err.textContent = r.status === 401
      ? 'This sign-in link was used already or has expired: run mpsfleet console again.'
      : 'Cannot sign in with the link: ' + (body.message || r.status);
    return;
  }
  const session = await r.json();
  state.token = session.token;
  sessionStorage.setItem('mpsfleet.token', session.token);
  sessionStorage.setItem('mpsfleet.role', session.role);
  signedIn();
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('signin').addEventListener('submit', signIn);
  const toggle = document.getElementById('show-all');
  toggle.checked = state.all;
  toggle.addEventListener('change', () => {
    state.all = toggle.checked;
    sessionStorage.setItem('mpsfleet.all', state.all ? 'yes' : 'no');
    render();
  });
  document.getElementById('signout').addEventListener('click', () => signOut());
  const why = sessionStorage.getItem('mpsfleet.why');
  if (why) {
    document.getElementById('signin-error').textContent = why;
    sessionStorage.removeItem('mpsfleet.why');
  }
  window.addEventListener('hashchange', render);
  const login = location.hash.match(/^#login=([A-Za-z0-9_-]{1,128})$/);
  document.body.dataset.ready = 'yes';
  if (login) signInWithLink(login[1]);
  else if (state.token) signedIn();
});
