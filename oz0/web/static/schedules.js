// Delete asks first: without this script, a row's Delete… opens a page asking; with it, a
// dialog holding the same form post (as tokens.js does for Revoke).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const dialog = document.getElementById("delete-dialog");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const form = dialog.querySelector("form");
  const named = dialog.querySelector("[data-field=schedule]");
  dialog.querySelector("[data-close]").addEventListener("click", () => dialog.close());
  for (const ask of document.querySelectorAll("form[data-delete]")) {
    ask.addEventListener("submit", (event) => {
      event.preventDefault();
      const id = ask.dataset.delete;
      form.action = "/schedules/" + encodeURIComponent(id) + "/delete";
      named.textContent = id;
      dialog.showModal();
    });
  }
});
