
(() => {
  "use strict";
  const key = (td, num) => {
    const v = td.dataset.v ?? td.textContent;
    if (!num) return v.toLowerCase();
    const n = v === "" ? NaN : Number(v);
    return Number.isNaN(n) ? null : n;
  };
  const sort = (table, col, th) => {
    const num = th.dataset.type === "num";
    const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    const body = table.tBodies[0];
    const rows = Array.from(body.rows, (tr) => [key(tr.cells[col], num), +tr.dataset.order, tr]);
    rows.sort((a, b) => {
      if (a[0] === null || b[0] === null) {
        return a[0] === b[0] ? a[1] - b[1] : (a[0] === null ? 1 : -1);
      }
      return a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1];
    });
    for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    body.append(...rows.map((r) => r[2]));
  };
  for (const table of document.querySelectorAll("table.sortable")) {
    Array.from(table.tBodies[0].rows).forEach((tr, i) => { tr.dataset.order = i; });
    Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
      const button = document.createElement("button");
      button.type = "button";
      button.title = "Sort by " + th.textContent;
      button.append(...th.childNodes);
      th.append(button);
      th.addEventListener("click", () => sort(table, col, th));
    });
  }
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const id = input.dataset.filter;
    const rows = Array.from(document.getElementById(id).tBodies[0].rows);
    const count = document.querySelector(`output[data-count="${id}"]`);
    input.closest(".filter").hidden = false;
    input.addEventListener("input", () => {
      const q = input.value.trim().toLowerCase();
      let shown = 0;
      for (const tr of rows) {
        tr.hidden = q !== "" && !tr.dataset.name.toLowerCase().includes(q);
        shown += tr.hidden ? 0 : 1;
      }
      count.value = `${shown} of ${rows.length}`;
    });
  }
  const reveal = () => {
    const target = location.hash && document.getElementById(location.hash.slice(1));
    const details = target && target.closest("details");
    if (details && !details.open) {
      details.open = true;
      target.scrollIntoView({block: "center"});
    }
  };
  window.addEventListener("hashchange", reveal);
  reveal();
})();
