// Live updates: every element with data-node="ID" has its state and connection kept
// current from /ui/events (server-sent events); a page marked data-node-reload reloads
// when its node's state changes, so its actions match; a list marked data-live-list says
// when nodes not on it changed. Without this script, pages are simply as loaded.
(function () {
  "use strict";
  const holders = Array.from(document.querySelectorAll("[data-node]"));
  const list = document.querySelector("[data-live-list]");
  if (holders.length === 0 && list === null) {
    return;
  }
  const ids = Array.from(new Set(holders.map((el) => el.dataset.node))).slice(0, 200);
  const url = "/ui/events?nodes=" + encodeURIComponent(ids.join(",")) + (list ? "&new=1" : "");
  const source = new EventSource(url);

  function fields(holder, name) {
    return Array.from(holder.querySelectorAll('[data-field="' + name + '"]'))
      .filter((el) => el.closest("[data-node]") === holder);
  }

  function note(text) {
    if (document.getElementById("live-note")) {
      return;
    }
    const p = document.createElement("p");
    p.id = "live-note";
    p.className = "live-note";
    p.setAttribute("role", "status");
    p.append(text + " ");
    const again = document.createElement("a");
    again.href = location.href;
    again.textContent = "Reload";
    p.append(again);
    document.getElementById("main").prepend(p);
  }

  function show(node) {
    for (const holder of holders) {
      if (holder.dataset.node !== node.id) {
        continue;
      }
      if (node.gone) {
        if (holder.hasAttribute("data-node-reload")) {
          location.reload();
          return;
        }
        holder.classList.add("gone");
        for (const el of fields(holder, "state")) {
          el.textContent = "deleted";
          el.className = "state state-deleted";
        }
        continue;
      }
      for (const el of fields(holder, "state")) {
        if (el.textContent !== node.state && holder.hasAttribute("data-node-reload")) {
          location.reload();
          return;
        }
        el.textContent = node.state;
        el.className = "state state-" + node.state;
      }
      for (const el of fields(holder, "connection")) {
        el.textContent = node.connected ? "connected to " + node.server : "disconnected";
        el.className = "conn " + (node.connected ? "conn-up" : "conn-down");
      }
      for (const el of fields(holder, "reason")) {
        el.textContent = node.reason || "—";
      }
    }
  }

  // A form being sent (an action on this very node) is about to change the page: a reload
  // now would cancel it, so the stream stops listening.
  document.addEventListener("submit", (event) => {
    if (!event.defaultPrevented) {
      source.close();
    }
  });

  source.addEventListener("node", (event) => show(JSON.parse(event.data)));
  source.addEventListener("others", () => note("Other nodes joined or changed."));
  source.addEventListener("signed-out", () => {
    source.close();
    location.assign("/");
  });
  // The person's role or tenants changed: the page is made again for them.
  source.addEventListener("reload", () => {
    source.close();
    location.reload();
  });
})();
