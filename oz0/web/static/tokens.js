// Revoke asks first: without this script, Revoke… opens a confirm page; with it, a dialog
// holding the same form post.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const dialog = document.getElementById("revoke-dialog");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const form = dialog.querySelector("form");
  const named = dialog.querySelector("[data-field=token]");
  dialog.querySelector("[data-close]").addEventListener("click", () => dialog.close());
  for (const ask of document.querySelectorAll("form[data-revoke]")) {
    ask.addEventListener("submit", (event) => {
      event.preventDefault();
      const id = ask.dataset.revoke;
      form.action = "/tokens/" + encodeURIComponent(id) + "/revoke";
      named.textContent = id;
      dialog.showModal();
    });
  }
});
