// A message's < n/m > versions for a message the page has just added (the page renders them for stored
// ones, templates/chat/_versions.html): the same two forms, each a POST that shows that version. A
// reply's come with its `done` frame; a user message's (an edit made a new branch) with `started`.
"use strict";

const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]").value;

function versionButton(label, cls, id) {
  const form = document.createElement("form");
  form.method = "post";
  form.className = "inline";
  if (id != null) form.action = `/c/${chat.dataset.conversation}/versions/${id}`;
  const token = document.createElement("input");
  token.type = "hidden";
  token.name = "csrfmiddlewaretoken";
  token.value = csrfToken;
  const b = document.createElement("button");
  b.type = "submit";
  b.className = cls;
  b.textContent = label === "Previous version" ? "<" : ">";
  b.setAttribute("aria-label", label);
  b.disabled = id == null;
  form.append(token, b);
  return form;
}

// Put `article`'s message id and versions (a frame's {version, count, previous, next}) on the page.
function setVersions(article, messageId, v) {
  article.dataset.messageId = messageId;
  article.querySelector(":scope > nav.versions")?.remove();
  if (!v || v.count < 2) return;
  const nav = document.createElement("nav");
  nav.className = "versions";
  nav.setAttribute("aria-label", `Versions of this ${article.dataset.role === "user" ? "message" : "reply"}`);
  const count = document.createElement("span");
  count.className = "version-count";
  count.textContent = `${v.version}/${v.count}`;
  nav.append(versionButton("Previous version", "version-previous", v.previous), count,
             versionButton("Next version", "version-next", v.next));
  article.appendChild(nav);
}

chat.addEventListener("chat:done", (event) => {
  const article = messages.lastElementChild;
  if (event.detail.message_id === undefined || !article || article.dataset.role !== "assistant") return;
  setVersions(article, event.detail.message_id, event.detail.versions);
});
