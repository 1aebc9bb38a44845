// Keyboard help on every page: "/" focuses the page's search box (as GitHub and many
// dashboards do), and a search box with data-filter hides the items that do not match.
(function () {
  "use strict";
  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }
  document.addEventListener("keydown", function (e) {
    if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey || typing(document.activeElement)) {
      return;
    }
    var box = document.querySelector('input[type="search"]');
    if (box) {
      e.preventDefault();
      box.focus();
      box.select();
    }
  });
  document.querySelectorAll("input[data-filter]").forEach(function (box) {
    box.addEventListener("input", function () {
      var words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
      document.querySelectorAll(box.dataset.filter).forEach(function (item) {
        var text = item.textContent.toLowerCase();
        item.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      });
    });
  });
})();
