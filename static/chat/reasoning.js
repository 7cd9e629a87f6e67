// A thinking model's reasoning (a reply that opens with <think>...</think>, Qwen3's and DeepSeek-R1's
// way) folded away in a <details> before the answer, as the API routes give it apart
// (workbench/api/reasoning.py). A live reply is split when its "started" frame says the model's chat
// template knows <think> blocks; a stored one when it opens with a closed block (only such a model
// wrote one there). The reasoning is shown as plain text: no markup of the model's reaches the page
// from it, and the answer alone is the message's markdown (what its copy button copies).
"use strict";

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

// {reasoning, answer} of a reply that opens with a thinking block (closed or still open), else null.
function splitReasoning(text) {
  const head = text.trimStart();
  if (!head.startsWith(THINK_OPEN)) return null;
  const body = head.slice(THINK_OPEN.length);
  const end = body.indexOf(THINK_CLOSE);
  if (end < 0) return {reasoning: body, answer: ""};
  return {reasoning: body.slice(0, end), answer: body.slice(end + THINK_CLOSE.length).replace(/^\n+/, "")};
}

function storedReplyThinks(text) {
  const split = splitReasoning(text);
  return split !== null && text.includes(THINK_CLOSE);
}

// Render an assistant message's text into `content`, its reasoning (when `thinks`) folded before it.
function renderAssistantText(content, text, thinks) {
  const split = thinks ? splitReasoning(text) : null;
  let fold = content.previousElementSibling;
  if (!fold || !fold.classList.contains("reasoning")) fold = null;
  if (!split) {
    if (fold) fold.remove();
    renderMarkdown(content, text);
    return;
  }
  if (!fold) {
    fold = document.createElement("details");
    fold.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const body = document.createElement("div");
    body.className = "reasoning-text";
    fold.append(summary, body);
    content.before(fold);
  }
  fold.querySelector(".reasoning-text").textContent = split.reasoning;
  renderMarkdown(content, split.answer);
}
