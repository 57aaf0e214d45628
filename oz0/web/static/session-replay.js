// Plays a session's recording back in its page's terminal view, <pre id="screen">: the
// frames of its data-frames URL (oz0/web/terminal_frames.py: the lines that changed, at
// their recorded time, a page at a time, each page beginning with the whole screen), at
// the chosen speed, a pause longer than two seconds played as two; colours and styles as
// CSS classes, the cursor as a cell of class "cursor". Without JavaScript the page shows
// the screen the session left, and the controls stay hidden.
(function () {
  "use strict";
  var screen = document.getElementById("screen");
  var controls = document.getElementById("replay-controls");
  if (!screen || !controls) { return; }
  var replay = document.getElementById("replay");
  var pause = document.getElementById("pause");
  var speed = document.getElementById("speed");
  var clock = document.getElementById("clock");
  var url = screen.getAttribute("data-frames");
  var MAX_PAUSE = 2;
  // Each Replay starts a new run; what an older run had scheduled does nothing.
  var run = 0;
  var state = null;
  controls.hidden = false;

  // A line is its text, or runs of [text, CSS classes] when any of it is styled.
  function runsOf(line) {
    return typeof line === "string" ? [[line, ""]] : line.slice();
  }

  function widthOf(runs) {
    return runs.reduce(function (n, run) { return n + run[0].length; }, 0);
  }

  // RUNS with the character at PLACE (a space past their end) in a run of its own.
  function withCursor(runs, place) {
    var out = [], start = 0;
    runs.forEach(function (run) {
      var end = start + run[0].length;
      if (start <= place && place < end) {
        var at = place - start;
        out.push([run[0].slice(0, at), run[1]], [run[0][at], (run[1] + " cursor").trim()],
          [run[0].slice(at + 1), run[1]]);
      } else {
        out.push(run);
      }
      start = end;
    });
    if (place >= start) { out.push([" ".repeat(place - start), ""], [" ", "cursor"]); }
    return out;
  }

  // Every line as wide as the screen: a grid of its size.
  function draw() {
    var drawn = document.createDocumentFragment();
    state.lines.forEach(function (line, row) {
      var runs = runsOf(line);
      var width = widthOf(runs);
      if (state.cursor && state.cursor[1] === row) {
        runs = withCursor(runs, state.cursor[0]);
        width = Math.max(width, state.cursor[0] + 1);
      }
      if (width < state.cols) { runs.push([" ".repeat(state.cols - width), ""]); }
      runs.forEach(function (run) {
        if (!run[0]) { return; }
        if (run[1]) {
          var span = document.createElement("span");
          span.className = run[1];
          span.textContent = run[0];
          drawn.appendChild(span);
        } else {
          drawn.appendChild(document.createTextNode(run[0]));
        }
      });
      if (row < state.lines.length - 1) { drawn.appendChild(document.createTextNode("\n")); }
    });
    screen.replaceChildren(drawn);
  }

  function seconds(t) {
    var whole = Math.floor(t);
    var s = whole % 60;
    return Math.floor(whole / 60) + ":" + (s < 10 ? "0" : "") + s + "." +
      Math.floor((t - whole) * 10);
  }

  function apply(frame) {
    if (frame.size) {
      state.cols = frame.size[0];
      state.lines.length = Math.min(state.lines.length, frame.size[1]);
      while (state.lines.length < frame.size[1]) { state.lines.push(""); }
    }
    frame.lines.forEach(function (line) { state.lines[line[0]] = line[1]; });
    state.cursor = frame.cursor;
    draw();
    clock.textContent = seconds(frame.t);
  }

  function fetchPage(number) {
    return fetch(url + "?page=" + number, {
      credentials: "same-origin", headers: { Accept: "application/json" }
    }).then(function (answer) {
      return answer.json().then(function (body) {
        if (!answer.ok) { throw new Error(body.error || answer.statusText); }
        return body;
      });
    });
  }

  function failed(mine, error) {
    if (mine !== run) { return; }
    clock.textContent = "the replay stopped: " + error.message;
    pause.disabled = true;
  }

  function load(page) {
    state.frames = page.frames;
    state.index = 0;
    // The next page is asked for while this one plays.
    state.pending = page.next === null ? null : fetchPage(page.next);
  }

  function step(mine) {
    if (mine !== run || state.paused) { return; }
    if (state.index >= state.frames.length) {
      if (state.pending === null) {
        pause.disabled = true;
        pause.textContent = "Pause";
        return;
      }
      state.pending.then(function (page) {
        if (mine !== run) { return; }
        load(page);
        step(mine);
      }, function (error) { failed(mine, error); });
      return;
    }
    var frame = state.frames[state.index];
    var gap = Math.min(Math.max(frame.t - state.at, 0), MAX_PAUSE);
    state.timer = setTimeout(function () {
      if (mine !== run || state.paused) { return; }
      apply(frame);
      state.at = frame.t;
      state.index += 1;
      step(mine);
    }, gap * 1000 / Number(speed.value));
  }

  replay.addEventListener("click", function () {
    run += 1;
    var mine = run;
    if (state !== null) { clearTimeout(state.timer); }
    var rows = screen.textContent.split("\n").length;
    state = { lines: [], cols: 0, cursor: null, at: 0, frames: [], index: 0, pending: null,
      paused: false, timer: null };
    // Blank at once, as the terminal was before the session's first output.
    for (var i = 0; i < rows; i += 1) { state.lines.push(""); }
    draw();
    clock.textContent = seconds(0);
    pause.disabled = false;
    pause.textContent = "Pause";
    fetchPage(0).then(function (page) {
      if (mine !== run) { return; }
      load(page);
      step(mine);
    }, function (error) { failed(mine, error); });
  });

  pause.addEventListener("click", function () {
    if (state === null) { return; }
    state.paused = !state.paused;
    pause.textContent = state.paused ? "Play" : "Pause";
    if (state.paused) {
      clearTimeout(state.timer);
    } else {
      step(run);
    }
  });
})();
