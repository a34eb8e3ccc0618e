// Reloads a page that shows something still changing (a run going on), every N seconds as
// its <meta name="sluice-refresh" content="N"> says, but never while someone is typing in
// one of its forms or has a form opened: a reload would throw their input away.
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="sluice-refresh"]');
  if (!meta) return;
  var seconds = Number(meta.getAttribute("content"));
  if (!(seconds > 0)) return;
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  function busy() {
    var active = document.activeElement;
    var typing = active && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.type !== "submit";
    return touched || typing || document.querySelector("details[open]") !== null;
  }
  function tick() {
    if (busy()) { setTimeout(tick, seconds * 1000); return; }
    window.location.reload();
  }
  setTimeout(tick, seconds * 1000);
})();
