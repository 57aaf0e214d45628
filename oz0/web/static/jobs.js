// A running job's page follows the job: it asks /jobs/<id>/live.json for the output after
// what it shows and for the job's state, and updates the page in place until the job ends.
// Each ask after the first is a long poll (wait): the server answers as soon as there is
// output or the job changed since the version the page was given, so the page is told
// rather than polling; a server that did not wait (it is stopping, or older) is asked again
// a second later. Without this script the page has a Refresh link.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("job");
  if (!root) return;
  const jobId = root.dataset.job;
  let cursor = Number(root.dataset.cursor) || 0;
  const decoders = new Map();
  const field = (name) => root.querySelector(`[data-field="${name}"]`);
  const live = field("live");
  const refresh = field("refresh");
  if (!live || !refresh) return;
  live.hidden = false;
  refresh.hidden = true;

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function badge(state) {
    const span = el("span", "state state-" + state, state);
    span.dataset.field = "state";
    return span;
  }

  function setText(name, value) {
    const node = field(name);
    if (node) node.textContent = value === null || value === undefined ? "—" : String(value);
  }

  function attemptBox(number, node) {
    const output = field("output");
    let box = output.querySelector(`[data-attempt="${number}"]`);
    if (box) return box;
    const none = field("no-output");
    if (none) none.remove();
    box = el("div", "attempt-output");
    box.dataset.attempt = String(number);
    const head = el("h3", "", "Attempt " + number + " ");
    const where = el("span", "muted", "on ");
    where.append(el("span", "mono", node || ""));
    head.append(where);
    const cut = el("p", "truncated", "Output past the cap was dropped.");
    cut.dataset.field = "truncated";
    cut.hidden = true;
    box.append(head, el("pre"), cut);
    output.append(box);
    return box;
  }

  function append(chunk, nodes) {
    const key = chunk.attempt + "/" + chunk.stream;
    if (!decoders.has(key)) decoders.set(key, new TextDecoder("utf-8"));
    const bytes = Uint8Array.from(atob(chunk.data), (c) => c.charCodeAt(0));
    const text = decoders.get(key).decode(bytes, { stream: true });
    const box = attemptBox(chunk.attempt, nodes.get(chunk.attempt));
    const pre = box.querySelector("pre");
    if (chunk.stream === "stderr") {
      const span = el("span", "stderr", text);
      span.title = "stderr";
      pre.append(span);
    } else {
      pre.append(document.createTextNode(text));
    }
    if (chunk.truncated) box.querySelector("[data-field=truncated]").hidden = false;
  }

  function attemptsTable(attempts) {
    const body = field("attempts");
    if (!attempts.length) return;
    body.replaceChildren(...attempts.map((a) => {
      const row = el("tr");
      const link = el("a", "mono", a.node);
      link.href = "/nodes/" + encodeURIComponent(a.node);
      const cells = [a.number, link, badge(a.state), a.exit_code ?? "—", a.started || "—",
        a.ended || "—", a.ended_because || "—"];
      for (const value of cells) {
        const td = el("td");
        if (value instanceof Node) td.append(value); else td.textContent = String(value);
        row.append(td);
      }
      // The node's words on why it failed the attempt, on the reason's cell.
      if (a.ended_detail) row.lastChild.title = a.ended_detail;
      return row;
    }));
    for (const a of attempts) {
      const box = attemptBox(a.number, a.node);
      if (a.truncated) box.querySelector("[data-field=truncated]").hidden = false;
    }
  }

  function show(data) {
    field("job-state").replaceChildren(badge(data.state));
    setText("state-text", data.state);
    setText("reason", data.reason);
    setText("exit-code", data.exit_code);
    setText("started", data.started);
    setText("ended", data.ended_at);
    if (data.parts) setText("parts", data.parts); // an --all job's parts by state
    const nodes = new Map(data.attempts.map((a) => [a.number, a.node]));
    attemptsTable(data.attempts);
    const applied = field("applied");
    const lines = data.applied || []; // what each attempt's node applied (limits)
    applied.replaceChildren(...lines.map((line) => el("li", null, line)));
    applied.hidden = !lines.length;
    for (const chunk of data.chunks) append(chunk, nodes);
    cursor = data.cursor;
  }

  function stop(text) {
    live.textContent = text;
    refresh.hidden = false;
  }

  const WAIT = 15; // seconds the server may hold an ask (at most its limit, 20)
  let version = null; // the job as last shown (the server's digest); null before any answer
  let failures = 0;
  async function poll() {
    let data;
    const query = version === null ? "" : `&wait=${WAIT}&seen=${encodeURIComponent(version)}`;
    try {
      const answer = await fetch(`/jobs/${encodeURIComponent(jobId)}/live.json?after=${cursor}${query}`, {
        credentials: "same-origin", headers: { Accept: "application/json" }, redirect: "error",
      });
      if (!answer.ok) return stop("Live updates stopped (" + answer.status + "): refresh.");
      data = await answer.json();
    } catch (e) {
      // A lost connection (try again: the server may be back) or a signed-out session.
      failures += 1;
      if (failures >= 5) return stop("Live updates stopped: refresh.");
      setTimeout(poll, 3000);
      return;
    }
    failures = 0;
    show(data);
    version = data.version === undefined ? null : data.version;
    if (data.more) return poll(); // a full answer (rows or bytes): more is waiting
    if (data.ended) {
      const cancel = field("cancel");
      if (cancel) cancel.remove();
      live.hidden = true;
      return;
    }
    if (data.waited) return poll(); // it waited for news: ask again at once
    setTimeout(poll, 1000);
  }
  poll(); // answered at once (no version yet): the page's state since it was made
});
