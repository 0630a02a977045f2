/* Drag-and-drop ordering of a Chain's entries (self-hosted, no dependencies).
 *
 * Each entry row gets a handle; dropping a row elsewhere reorders the rows and rewrites
 * every position input to 0, 1, 2 … in the order shown. Nothing is sent until Save: the
 * server validates and writes the final order in one transaction. Typing numbers into
 * the position inputs keeps working as before. */
(function () {
  "use strict";

  function group() {
    return document.querySelector(".llmr-chain-entries tbody");
  }

  function rows(tbody) {
    return Array.prototype.filter.call(tbody.querySelectorAll("tr.form-row"), function (tr) {
      return !tr.classList.contains("empty-form") && tr.id.indexOf("-empty") === -1;
    });
  }

  function positionInput(tr) {
    return tr.querySelector("input[name$='-position']");
  }

  function renumber(tbody) {
    var next = 0;
    rows(tbody).forEach(function (tr) {
      var input = positionInput(tr);
      var provider = tr.querySelector("select[name$='-provider'], input[name$='-provider']");
      var deleted = tr.querySelector("input[name$='-DELETE']");
      if (!input || !provider || !provider.value || (deleted && deleted.checked)) {
        return;
      }
      input.value = String(next);
      next += 1;
    });
    rows(tbody).forEach(function (tr) {
      var input = positionInput(tr);
      var provider = tr.querySelector("select[name$='-provider'], input[name$='-provider']");
      if (input && provider && !provider.value) {
        input.value = String(next);
        next += 1;
      }
    });
  }

  function addHandle(tbody, tr) {
    if (tr.querySelector(".llmr-drag")) {
      return;
    }
    var cell = tr.querySelector("td.original") || tr.firstElementChild;
    if (!cell) {
      return;
    }
    var handle = document.createElement("span");
    handle.className = "llmr-drag";
    handle.title = "Drag to reorder";
    handle.textContent = "\u2630";
    handle.setAttribute("draggable", "true");
    cell.insertBefore(handle, cell.firstChild);
    handle.addEventListener("dragstart", function (event) {
      tr.classList.add("llmr-dragging");
      event.dataTransfer.effectAllowed = "move";
      event.dataTransfer.setData("text/plain", tr.id);
    });
    handle.addEventListener("dragend", function () {
      tr.classList.remove("llmr-dragging");
    });
    tr.addEventListener("dragover", function (event) {
      event.preventDefault();
      event.dataTransfer.dropEffect = "move";
    });
    tr.addEventListener("drop", function (event) {
      event.preventDefault();
      var moving = document.getElementById(event.dataTransfer.getData("text/plain"));
      if (!moving || moving === tr || moving.parentNode !== tbody) {
        return;
      }
      var box = tr.getBoundingClientRect();
      var after = event.clientY > box.top + box.height / 2;
      tbody.insertBefore(moving, after ? tr.nextSibling : tr);
      renumber(tbody);
    });
  }

  function init() {
    var tbody = group();
    if (!tbody) {
      return;
    }
    rows(tbody).forEach(function (tr) {
      addHandle(tbody, tr);
    });
    document.addEventListener("formset:added", function (event) {
      var tr = event.target;
      if (tr && tr.parentNode === tbody) {
        addHandle(tbody, tr);
        var input = positionInput(tr);
        if (input) {
          var used = rows(tbody)
            .filter(function (other) { return other !== tr; })
            .map(function (other) { return parseInt((positionInput(other) || {}).value, 10); })
            .filter(function (n) { return !isNaN(n); });
          input.value = String(used.length ? Math.max.apply(null, used) + 1 : 0);
        }
      }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
