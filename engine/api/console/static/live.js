// Live regions (docs/console.md): an element with data-live="URL" opens a Server-Sent Events
// stream; each message is a JSON object {region id: HTML}, and each region named is replaced.
// Ticked boxes, open <details> and the focus survive the swap. Without JavaScript the page is
// complete as served.
(function () {
  "use strict";
  function key(el) { return el.id || (el.name || "") + "=" + (el.value || "") + "|" + el.textContent; }
  function swap(region, html) {
    var ticked = Array.from(region.querySelectorAll("input[type=checkbox]"), function (b) { return [key(b), b.checked]; });
    var open = Array.from(region.querySelectorAll("details[open] > summary"), key);
    var focused = region.contains(document.activeElement) ? key(document.activeElement) : null;
    region.innerHTML = html;
    var was = new Map(ticked);
    region.querySelectorAll("input[type=checkbox]").forEach(function (b) {
      if (was.has(key(b))) { b.checked = was.get(key(b)); }
    });
    region.querySelectorAll("details > summary").forEach(function (s) {
      if (open.indexOf(key(s)) >= 0) { s.parentElement.open = true; }
    });
    if (focused !== null) {
      var again = Array.from(region.querySelectorAll("a, button, input, summary")).find(function (el) { return key(el) === focused; });
      if (again) { again.focus(); }
    }
  }
  document.querySelectorAll("[data-live]").forEach(function (root) {
    var source = new EventSource(root.getAttribute("data-live"));
    source.onmessage = function (message) {
      var parts = JSON.parse(message.data);
      Object.keys(parts).forEach(function (id) {
        var region = document.getElementById(id);
        if (region) { swap(region, parts[id]); }
      });
      root.setAttribute("data-live-updates", String(Number(root.getAttribute("data-live-updates") || "0") + 1));
    };
    source.addEventListener("end", function () { source.close(); });
    window.addEventListener("pagehide", function () { source.close(); });
  });
})();
