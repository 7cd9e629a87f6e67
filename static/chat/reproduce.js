// "Reproduce" on a stored reply: the server re-derives it from its record (the same prompt token ids,
// sampling parameters and seed) and says whether every token and logprob bit came out the same, or
// where the two first part (docs/PROTOCOL.md, "Reproduce"). A reply that did not run to its end has no
// record, and no button.
"use strict";

function addReproduceButton(article) {
  if (article.dataset.role !== "assistant" || !article.dataset.messageId) return;
  if (article.dataset.reproducible !== "true" || article.querySelector(":scope > .reproduce")) return;
  const box = document.createElement("div");
  box.className = "reproduce";
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "Reproduce";
  button.setAttribute("aria-label", "Reproduce this reply");
  const result = document.createElement("output");
  result.className = "reproduce-result";
  box.append(button, result);
  article.appendChild(box);
}

function describeToken(token) {
  return token === null ? "(ended)" : `${JSON.stringify(token.text)} (id ${token.id})`;
}

function describeReproduction(answer) {
  if (answer.identical) return "identical";
  const at = answer.first_difference;
  const model = answer.same_model ? "" : " (the model serving now is not the one that answered)";
  return `differs at token ${at.index}: recorded ${describeToken(at.recorded)}, ` +
         `reproduced ${describeToken(at.reproduced)}${model}`;
}

chat.addEventListener("click", async (event) => {
  const button = event.target.closest(".reproduce > button");
  if (!button) return;
  const article = button.closest("article");
  const result = article.querySelector(".reproduce-result");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  button.disabled = true;
  result.textContent = "reproducing…";
  try {
    const response = await fetch(`/c/${chat.dataset.conversation}/replies/${article.dataset.messageId}/reproduce`,
                                 {method: "POST", headers: {"X-CSRFToken": csrf}, credentials: "same-origin"});
    const answer = await response.json();
    result.textContent = response.ok ? describeReproduction(answer) : `failed: ${answer.error.message}`;
    result.dataset.identical = String(response.ok && answer.identical);
  } catch (error) {
    result.textContent = `failed: ${error}`;
  } finally {
    button.disabled = false;
  }
});

chat.addEventListener("chat:done", (event) => {
  const article = messages.lastElementChild;
  if (!article || article.dataset.role !== "assistant" || event.detail.message_id === undefined) return;
  article.dataset.messageId = event.detail.message_id;
  // What keeps a record: a reply that ran to its end, neither stopped nor failed.
  article.dataset.reproducible = String(!["canceled", "error"].includes(event.detail.finish_reason));
  addReproduceButton(article);
});

document.querySelectorAll("#messages article").forEach(addReproduceButton);
