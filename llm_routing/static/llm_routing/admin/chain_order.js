/* Drag-and-drop ordering of a Chain's entries (self-hosted, no dependencies).
 *
 * Dragging is the one way to order: the position inputs are hidden, and each entry
 * row gets a handle. Dropping a row elsewhere reorders the rows; the positions are
 * rewritten 0, 1, 2 … in the order shown, for the rows that will be saved (a provider
 * chosen, Delete not ticked) — on every drop and again just before the form is sent.
 * A row with no provider keeps exactly the position the server gave it (its initial
 * value), so Django still sees it as the untouched blank row and does not ask for its
 * provider. Nothing is sent until Save: the server validates and writes the final
 * order in one transaction. */
(function () {
  "use strict";

  var PREFIX = "entries";

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

  function isSaved(tr) {
    var provider = tr.querySelector("select[name$='-provider'], input[name$='-provider']");
    var deleted = tr.querySelector("input[name$='-DELETE']");
    return Boolean(provider && provider.value && !(deleted && deleted.checked));
  }

  function managementCount(name) {
    var input = document.getElementById("id_" + PREFIX + "-" + name);
    return input ? parseInt(input.value, 10) : NaN;
  }

  /* The position the server gives a new row of this index (ChainEntryFormSet:
   * the first free position, plus the row's offset among the new rows). */
  function serverInitial(tr, firstFree) {
    var index = parseInt(tr.id.slice(PREFIX.length + 1), 10);
    var initialForms = managementCount("INITIAL_FORMS");
    if (isNaN(index) || isNaN(initialForms) || isNaN(firstFree)) {
      return null;
    }
    return String(firstFree + index - initialForms);
  }

  function renumber(tbody) {
    var next = 0;
    rows(tbody).forEach(function (tr) {
      var input = positionInput(tr);
      if (!input) {
        return;
      }
      if (isSaved(tr)) {
        input.value = String(next);
        next += 1;
      } else if (input.hasAttribute("data-llmr-initial")) {
        input.value = input.getAttribute("data-llmr-initial");
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
    handle.setAttribute("aria-label", "Drag to reorder");
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
    // The empty-form template's position is the first free one plus the number of new
    // rows the page was rendered with (ChainEntryFormSet.empty_form).
    var template = document.querySelector("#" + PREFIX + "-empty input[name$='-position']");
    var firstFree = template
      ? parseInt(template.defaultValue, 10) -
        (managementCount("TOTAL_FORMS") - managementCount("INITIAL_FORMS"))
      : NaN;
    rows(tbody).forEach(function (tr) {
      var input = positionInput(tr);
      if (input && !tr.classList.contains("has_original")) {
        input.setAttribute("data-llmr-initial", input.defaultValue);
      }
      addHandle(tbody, tr);
    });
    document.addEventListener("formset:added", function (event) {
      var tr = event.target;
      if (tr && tr.parentNode === tbody) {
        addHandle(tbody, tr);
        var input = positionInput(tr);
        var initial = serverInitial(tr, firstFree);
        if (input && initial !== null) {
          input.value = initial;
          input.setAttribute("data-llmr-initial", initial);
        }
      }
    });
    var form = tbody.closest("form");
    if (form) {
      form.addEventListener("submit", function () {
        renumber(tbody);
      });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
