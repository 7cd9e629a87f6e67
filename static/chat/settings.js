// The chat page's settings (system prompt, sampling) saved as they change: for this conversation, and
// on request as the user's default for the conversations they start next. The server checks them by
// the rules the chat socket applies (workbench/chat/preferences.py) and names a refused field.
"use strict";

(() => {
  const panel = document.getElementById("settings");
  const status = document.getElementById("settings-status");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  let saving = Promise.resolve();

  function current() {
    // params() (chat.js) is what a send uses, so what is saved is exactly what the next reply gets.
    return {system_prompt: document.getElementById("system_prompt").value, sampling: params()};
  }

  async function save(url, done) {
    const response = await fetch(url, {method: "POST", body: JSON.stringify(current()),
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrf}, credentials: "same-origin"});
    if (response.ok) { status.textContent = done; return; }
    const body = await response.json().catch(() => null);
    status.textContent = `Not saved: ${body && body.error ? body.error.message : response.statusText}`;
  }

  // One save at a time, in order: a quick second change must not be overtaken by the first's reply.
  function queue(url, done) {
    status.textContent = "Saving…";
    saving = saving.then(() => save(url, done)).catch(() => { status.textContent = "Not saved: the server did not answer"; });
  }

  panel.addEventListener("change", (event) => {
    if (event.target.matches("input, textarea")) queue(`/c/${chat.dataset.conversation}/settings`, "Saved for this conversation");
  });
  document.getElementById("save-defaults").addEventListener("click",
    () => queue("/settings/chat-defaults", "Saved as your default for new conversations"));
})();
