// Optional: sorting and filtering for the catalogue's tables. Every page reads the same without it.
"use strict";

function cellKey(row, column) {
  const cell = row.cells[column];
  if (!cell) return "";
  return cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent.trim();
}

function compareKeys(a, b) {
  // Empty cells go last whichever way the column is sorted; numbers compare as numbers.
  if (a === "" || b === "") return (a === "") - (b === "");
  const x = Number(a), y = Number(b);
  if (!Number.isNaN(x) && !Number.isNaN(y)) return x - y;
  return a.localeCompare(b, undefined, { numeric: true, sensitivity: "base" });
}

function sortTable(table, column, header) {
  const descending = header.getAttribute("aria-sort") === "ascending";
  for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
  header.setAttribute("aria-sort", descending ? "descending" : "ascending");
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((first, second) => {
    const a = cellKey(first, column), b = cellKey(second, column);
    if (a === "" || b === "") return compareKeys(a, b);
    return descending ? compareKeys(b, a) : compareKeys(a, b);
  });
  for (const row of rows) body.appendChild(row);
}

function makeSortable(table) {
  Array.from(table.tHead.rows[0].cells).forEach((header, column) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = header.textContent;
    button.title = "Sort by " + header.textContent.trim().toLowerCase();
    header.textContent = "";
    header.appendChild(button);
    button.addEventListener("click", () => sortTable(table, column, header));
  });
}

function addFilter(tables) {
  if (tables.length === 0) return;
  const input = document.createElement("input");
  input.type = "search";
  input.className = "filter";
  input.placeholder = "Filter models…";
  input.setAttribute("aria-label", "Filter models");
  input.addEventListener("input", () => {
    const wanted = input.value.trim().toLowerCase();
    for (const table of tables) {
      for (const row of table.tBodies[0].rows) {
        row.hidden = wanted !== "" && !row.textContent.toLowerCase().includes(wanted);
      }
    }
  });
  tables[0].parentNode.insertBefore(input, tables[0]);
}

document.addEventListener("DOMContentLoaded", () => {
  const tables = Array.from(document.querySelectorAll("table.sortable"));
  tables.forEach(makeSortable);
  addFilter(tables);
});
