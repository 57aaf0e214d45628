// Plays a session's recording back in its page's <pre id="screen">: the output events
// (time in seconds, plain text) the server put in its data-events attribute, at their
// own pace, a pause of more than two seconds played as two.
(function () {
  "use strict";
  var button = document.getElementById("replay");
  var screen = document.getElementById("screen");
  if (!button || !screen) { return; }
  var events = JSON.parse(screen.getAttribute("data-events") || "[]");
  var timer = null;
  button.addEventListener("click", function () {
    if (timer !== null) { clearTimeout(timer); }
    screen.textContent = "";
    var i = 0, previous = 0;
    function next() {
      if (i >= events.length) { timer = null; return; }
      var at = events[i][0];
      var wait = Math.min(Math.max(at - previous, 0), 2) * 1000;
      previous = at;
      timer = setTimeout(function () {
        screen.textContent += events[i][1];
        i += 1;
        next();
      }, wait);
    }
    next();
  });
})();
