// The node page's Delete and Purge ask first in a <dialog>. Without this script their
// buttons lead to a page asking the same (/nodes/<id>/delete, .../purge), so nothing
// here is needed for them to work; the server checks a purge's typed ID either way.
"use strict";

// A submit button stays disabled until its form's [data-confirm-id] field holds exactly
// that ID (the node's).
function guardConfirm(input) {
  const button = input.form.querySelector("button[type=submit]");
  const check = () => {
    button.disabled = input.value !== input.dataset.confirmId;
  };
  input.addEventListener("input", check);
  input.form.addEventListener("reset", () => window.setTimeout(check));
  check();
}

function openByDialog(opener) {
  const dialog = document.getElementById(opener.dataset.dialog);
  if (!(dialog instanceof HTMLDialogElement)) {
    return; // the confirmation page still asks
  }
  opener.addEventListener("submit", (event) => {
    event.preventDefault();
    dialog.showModal();
    const field = dialog.querySelector("input:not([type=hidden])");
    (field || dialog.querySelector("button")).focus();
  });
  // Whatever closes it (Cancel, Escape), the typed ID goes: the next opening starts over.
  dialog.addEventListener("close", () => {
    for (const form of dialog.querySelectorAll("form")) {
      form.reset();
    }
  });
  for (const cancel of dialog.querySelectorAll("[data-close]")) {
    cancel.addEventListener("click", () => dialog.close());
  }
}

document.querySelectorAll("input[data-confirm-id]").forEach(guardConfirm);
document.querySelectorAll("form[data-dialog]").forEach(openByDialog);
