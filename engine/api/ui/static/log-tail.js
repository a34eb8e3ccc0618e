// Streams the log of a running task try: asks the page's log-tail endpoint for what was
// written after the last offset, about once a second, appends it, and reloads the page once
// the try is over (so its final state and the whole log show). No other script is needed.
(function () {
  "use strict";
  var pre = document.querySelector("pre[data-tail-url]");
  if (!pre) return;
  var offset = Number(pre.getAttribute("data-offset") || "0");
  var status = document.querySelector("[data-tail-status]");
  var INTERVAL_MS = 1000;

  function atBottom() {
    return pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
  }

  function poll() {
    var url = new URL(pre.getAttribute("data-tail-url"), window.location.href);
    url.searchParams.set("offset", String(offset));
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (answer) {
        if (!answer.ok) throw new Error("HTTP " + answer.status);
        return answer.json();
      })
      .then(function (chunk) {
        var follow = atBottom();
        if (chunk.text) pre.appendChild(document.createTextNode(chunk.text));
        if (follow) pre.scrollTop = pre.scrollHeight;
        offset = chunk.offset;
        if (chunk.finished) {
          if (status) status.textContent = "the try is over (" + chunk.state + "); reloading";
          window.location.reload();
          return;
        }
        setTimeout(poll, INTERVAL_MS);
      })
      .catch(function (error) {
        if (status) status.textContent = "log updates paused (" + error.message + "), retrying";
        setTimeout(poll, INTERVAL_MS * 3);
      });
  }
  setTimeout(poll, INTERVAL_MS);
})();
