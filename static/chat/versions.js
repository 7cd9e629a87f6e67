// A reply's < n/m > versions for a reply that has just streamed in (the page renders them for stored
// ones, templates/chat/_versions.html): the same two forms, each a POST that shows that version.
"use strict";

(() => {
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;

  function button(label, cls, id) {
    const form = document.createElement("form");
    form.method = "post";
    form.className = "inline";
    if (id != null) form.action = `/c/${chat.dataset.conversation}/versions/${id}`;
    const token = document.createElement("input");
    token.type = "hidden";
    token.name = "csrfmiddlewaretoken";
    token.value = csrf;
    const b = document.createElement("button");
    b.type = "submit";
    b.className = cls;
    b.textContent = label === "Previous version" ? "<" : ">";
    b.setAttribute("aria-label", label);
    b.disabled = id == null;
    form.append(token, b);
    return form;
  }

  chat.addEventListener("chat:done", (event) => {
    const v = event.detail.versions;
    const article = messages.lastElementChild;
    if (!v || v.count < 2 || !article || article.dataset.role !== "assistant") return;
    article.dataset.messageId = event.detail.message_id;
    const nav = document.createElement("nav");
    nav.className = "versions";
    nav.setAttribute("aria-label", "Versions of this reply");
    const count = document.createElement("span");
    count.className = "version-count";
    count.textContent = `${v.version}/${v.count}`;
    nav.append(button("Previous version", "version-previous", v.previous), count,
               button("Next version", "version-next", v.next));
    article.appendChild(nav);
  });
})();
