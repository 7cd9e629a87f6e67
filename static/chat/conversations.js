// The conversation's own controls on the chat page: rename (a form shown on demand), delete (asks
// first), and the title made from the first exchange shown as soon as the reply that sets it is stored.
"use strict";

(() => {
  const renameButton = document.getElementById("rename-button");
  const renameForm = document.getElementById("rename-form");
  const renameInput = document.getElementById("rename-title");
  renameButton.addEventListener("click", () => {
    const open = renameForm.hidden;
    renameForm.hidden = !open;
    renameButton.setAttribute("aria-expanded", String(open));
    if (open) { renameInput.focus(); renameInput.select(); }
  });

  const deleteForm = document.getElementById("delete-form");
  deleteForm.addEventListener("submit", (event) => {
    const title = document.getElementById("title").textContent;
    if (!confirm(`Delete “${title}” and all its messages? This cannot be undone.`)) event.preventDefault();
  });

  // chat.js tells of each stored reply; the first one may have titled the conversation.
  document.getElementById("chat").addEventListener("chat:done", (event) => {
    const title = event.detail.title;
    if (!title) return;
    document.getElementById("title").textContent = title;
    document.title = title;
    renameInput.value = title;
    const current = document.querySelector("aside li.current a");
    if (current) current.textContent = title;
  });
})();
