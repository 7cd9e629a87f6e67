// Editing a user message in place: its Edit button (or "Edit last message") opens an editor in the
// message; saving sends an `edit` frame, and the server keeps the old words and what followed them as
// another version of the message (a branch, < 1/2 >), answering the new words. The page changes only
// once the server has taken the edit (its `started` frame): a refused one leaves the editor open with
// its text, and the conversation as it was.
"use strict";

let editing = null;  // {article, form, text} of the edit sent, until the server takes or refuses it
let editors = 0;     // for the editors' element ids

function addEditButton(article) {
  const actions = article.querySelector(":scope > .actions");
  if (!actions || actions.querySelector("button.edit")) return;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "edit";
  button.textContent = "Edit";
  button.setAttribute("aria-label", "Edit your message");
  button.addEventListener("click", () => openEditor(article));
  actions.appendChild(button);
}

function closeEditor(article) {
  article.querySelector(":scope > .edit-form")?.remove();
  article.querySelector(":scope > .content").hidden = false;
  article.querySelector("button.edit")?.focus();
}

function openEditor(article) {
  const open = article.querySelector(":scope > .edit-form");
  if (open) { open.querySelector("textarea").focus(); return; }
  const content = article.querySelector(":scope > .content");
  const form = document.createElement("form");
  form.className = "edit-form";
  const id = `edit-${++editors}`;
  form.innerHTML = `<label for="${id}" class="visually-hidden">Edited message</label>
    <textarea id="${id}" rows="3" maxlength="20000"></textarea>
    <p class="hint">Enter sends the new words, a new branch from here (the old one is kept) · Esc cancels</p>
    <div class="buttons"><button type="submit" class="edit-send">Save and send</button>
    <button type="button" class="edit-cancel">Cancel</button></div>`;
  const textarea = form.querySelector("textarea");
  textarea.value = content.textContent;  // the words as typed (the page shows a user message as text)
  form.querySelector(".edit-cancel").addEventListener("click", () => closeEditor(article));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = textarea.value;
    if (!text.trim() || editing) return;
    if (!article.dataset.messageId) { statusLine.textContent = "Wait for the reply before editing this message."; return; }
    if (!send({type: "edit", message_id: Number(article.dataset.messageId), content: text})) return;
    editing = {article, form, text};
    form.querySelector(".edit-send").disabled = true;
  });
  textarea.addEventListener("keydown", (event) => {
    if (event.isComposing || event.keyCode === 229) return;  // the IME's keys (as in the composer)
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
    else if (event.key === "Escape") { event.preventDefault(); event.stopPropagation(); closeEditor(article); }
  });
  content.hidden = true;
  content.after(form);
  textarea.focus();
}

chat.addEventListener("chat:started", () => {
  if (!editing) return;
  const {article, text} = editing;
  editing = null;
  // The new branch: the messages after the one reworded belong to the old one (kept on the server).
  while (article.nextElementSibling) article.nextElementSibling.remove();
  article.querySelector(":scope > .content").textContent = text;
  closeEditor(article);
});

chat.addEventListener("chat:error", () => {
  if (!editing) return;
  editing.form.querySelector(".edit-send").disabled = false;  // refused: the editor keeps the text
  editing = null;
});

document.getElementById("edit-last").addEventListener("click", () => {
  const users = messages.querySelectorAll("[data-role=user]");
  if (users.length) openEditor(users[users.length - 1]);
});
document.querySelectorAll("#messages article[data-role=user]").forEach(addEditButton);
