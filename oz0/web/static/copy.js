// Copy buttons: <button data-copy="ID" hidden> copies the text of the element ID to the
// clipboard. Without this script the buttons stay hidden and the text is selectable.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copy]")) {
    const source = document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) continue;
    const label = button.textContent;
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(source.textContent);
        button.textContent = "Copied";
      } catch (e) {
        button.textContent = "Copy failed: select the text";
      }
      setTimeout(() => { button.textContent = label; }, 2000);
    });
  }
});
