// The policy editor's line-number gutter and cursor position, kept in step with the
// textarea. Without JavaScript the textarea works alone.
(function () {
  "use strict";
  document.querySelectorAll(".editor textarea").forEach(function (area) {
    var gutter = area.parentNode.querySelector(".gutter");
    var pos = document.getElementById(area.id + "-pos");
    var shown = -1;
    function numbers() {
      var n = area.value.split("\n").length;
      if (n !== shown) {
        var lines = [];
        for (var i = 1; i <= n; i += 1) { lines.push(String(i)); }
        gutter.textContent = lines.join("\n") + "\n";
        shown = n;
      }
      gutter.scrollTop = area.scrollTop;
    }
    function cursor() {
      if (!pos) { return; }
      var before = area.value.slice(0, area.selectionStart).split("\n");
      pos.textContent = "Line " + before.length + ", column " + (before[before.length - 1].length + 1) + ".";
    }
    area.addEventListener("input", function () { numbers(); cursor(); });
    area.addEventListener("scroll", numbers);
    area.addEventListener("keyup", cursor);
    area.addEventListener("click", cursor);
    numbers();
  });
}());
