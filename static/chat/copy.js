// Copy buttons: one per message (its text as written: a reply's markdown source, a user's words) and one
// per code block (the code alone, without the language bar). One click listener for the page, so the
// buttons that markdown.js makes in every render need no wiring of their own.
"use strict";

function addCopyMessageButton(article) {
  const content = article.querySelector(".content");
  if (!content || article.querySelector(":scope > .actions")) return;
  const actions = document.createElement("div");
  actions.className = "actions";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.dataset.copy = "message";
  button.textContent = "Copy";
  button.setAttribute("aria-label", `Copy ${article.dataset.role === "user" ? "your message" : "reply"}`);
  actions.appendChild(button);
  content.after(actions);
}

function copiedText(button) {
  // marked ends every code block with a newline of its own; the code copied is the code as written.
  if (button.dataset.copy === "code") return button.closest(".code-block").querySelector("code").textContent.replace(/\n$/, "");
  const content = button.closest("article").querySelector(".content");
  return markdownSource(content) ?? content.textContent;
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  button.dataset.label ??= button.textContent;  // a second click before the first one's reset
  try {
    await navigator.clipboard.writeText(copiedText(button));
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";  // an insecure origin or a denied permission: say so, no silence
  }
  setTimeout(() => { button.textContent = button.dataset.label; }, 1500);
});

document.querySelectorAll("#messages article").forEach(addCopyMessageButton);
