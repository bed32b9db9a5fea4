// Carteiro console. "Back" links on error pages go back in history (the CSP allows no
// inline `javascript:` links).
document.addEventListener("click", function (e) {
  var back = e.target.closest && e.target.closest("[data-back]");
  if (back && window.history.length > 1) { e.preventDefault(); window.history.back(); }
});
// Carteiro console: live progress of a job page (polls /api/jobs/ID until the job is over).
(function () {
  var box = document.querySelector("[data-job]");
  if (!box) return;
  var id = box.getAttribute("data-job");
  function set(name, text) {
    var el = box.querySelector("[data-field=" + name + "]");
    if (el) el.textContent = text;
  }
  function tick() {
    fetch("/api/jobs/" + id, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (job) {
        set("done", job.done);
        set("planned", job.planned);
        var bar = box.querySelector("progress");
        if (bar) { bar.max = Math.max(job.planned, 1); bar.value = job.done; }
        if (job.finished) {
          // The page rendered after the end shows the whole report.
          window.location.reload();
        } else {
          setTimeout(tick, 500);
        }
      })
      .catch(function () { setTimeout(tick, 2000); });
  }
  if (box.getAttribute("data-finished") !== "true") setTimeout(tick, 500);
})();
