// The chat page: streams a reply over /ws/chat/<id>, token by token; stop, regenerate (editing a message
// is static/chat/edit.js); the composer's keys (Enter sends, Shift+Enter is a newline, Esc stops).
"use strict";

const chat = document.getElementById("chat");
const composer = document.getElementById("composer");
const messages = document.getElementById("messages");
const input = document.getElementById("input");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop-button");
const statusLine = document.getElementById("status");
let socket = null;
let reply = null;        // {article, content, text} of the reply being streamed
let pending = null;      // the user's message shown before the server took it (a "started" frame)
// Errors that mean the message was refused before it was stored: it comes off the page, back to the input.
const NOT_STORED = new Set(["busy", "invalid_params", "signed_out", "password_changed", "account_disabled"]);
let sentAt = 0;
// Deltas can come hundreds of times a second, and each render parses the whole reply's markdown again
// (a cost that grows with the square of its length): the reply is rendered at most once per painted
// frame, and at once when it ends.
let renderScheduled = false;
// A dropped socket is opened again, 0.5 s after the drop and twice as long after each failed try, at
// most 8 s apart; a reply under way is then followed from the token after the last one the page has.
let retries = 0;
let retryTimer = null;
// Closed by the server for good (not signed in, not the owner, deleted): no point trying again.
const FINAL_CLOSE = new Set([4401, 4404]);
// Closed because this session signed out (here or in another tab): the page says so, and links to the login.
const SIGNED_OUT = 4440;

document.querySelectorAll("[data-markdown]").forEach(
  (el) => renderAssistantText(el, el.textContent, storedReplyThinks(el.textContent)));

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/ws/chat/${chat.dataset.conversation}`);
  socket.onopen = () => {
    retries = 0;
    if (reply) {  // a reply was streaming when the socket dropped: catch up with it, or with its end
      socket.send(JSON.stringify({type: "resume", from_offset: reply.nextIndex}));
      return;
    }
    statusLine.textContent = "";
    setBusy(false);  // usable once connected
    stopButton.disabled = true;
  };
  socket.onmessage = (event) => handle(JSON.parse(event.data));
  socket.onclose = (event) => {
    if (event.code === SIGNED_OUT) { signedOut(); return; }
    if (FINAL_CLOSE.has(event.code)) { setBusy(false); statusLine.textContent = "Disconnected; reload the page."; return; }
    sendButton.disabled = true;
    statusLine.textContent = "Reconnecting…";
    clearTimeout(retryTimer);
    retryTimer = setTimeout(connect, Math.min(500 * 2 ** retries, 8000));
    retries += 1;
  };
}

function signedOut() {
  clearTimeout(retryTimer);
  setBusy(true);
  stopButton.disabled = true;
  statusLine.textContent = "You were signed out (in this or another tab). ";
  const again = document.createElement("a");
  again.href = `/login?next=${encodeURIComponent(location.pathname)}`;
  again.textContent = "Sign in again";
  statusLine.appendChild(again);
}

function addMessage(role, text) {
  const article = document.createElement("article");
  article.className = `message ${role}`;
  article.dataset.role = role;
  const content = document.createElement("div");
  content.className = "content";
  // A reply is markdown; the user's words are shown as typed (style.css keeps their line breaks).
  if (role === "assistant") renderAssistantText(content, text, false); else content.textContent = text;
  article.appendChild(content);
  addCopyMessageButton(article);
  if (role === "user") addEditButton(article);
  messages.appendChild(article);
  article.scrollIntoView({block: "end"});
  return {article, content, text};
}

function setBusy(busy) {
  sendButton.disabled = busy;
  stopButton.disabled = !busy;
  document.getElementById("regenerate").disabled = busy;
  document.getElementById("edit-last").disabled = busy;
}

function params() {
  const value = (id) => document.getElementById(id).value.trim();
  const p = {temperature: Number(value("temperature")), top_p: Number(value("top_p")),
             top_k: Number(value("top_k"))};
  // Empty: the server lets the reply run to the end of the model's context.
  if (value("max_tokens") !== "") p.max_tokens = Number(value("max_tokens"));
  if (value("stop")) p.stop = value("stop").split(",").map((s) => s.trim()).filter(Boolean);
  if (value("seed") !== "") p.seed = Number(value("seed"));
  return p;
}

function handle(frame) {
  if (frame.type === "started") {
    // Before the reply's article is added: an edit (edit.js) takes the messages after the one reworded off.
    chat.dispatchEvent(new CustomEvent("chat:started", {detail: frame}));
    // The user message answered (just sent, just reworded, or regenerated): its id, to edit it, and versions.
    const asked = pending ? pending.article : [...messages.querySelectorAll("[data-role=user]")].pop();
    if (frame.asked && asked) setVersions(asked, frame.asked.message_id, frame.asked.versions);
    pending = null;
    reply = addMessage("assistant", "");
    reply.article.dataset.streaming = "true";
    reply.nextIndex = 0;  // the offset of the first token the page does not have yet
    reply.thinks = Boolean(frame.thinks);  // the model's reasoning is folded away (reasoning.js)
  } else if (frame.type === "delta" && reply) {
    if (frame.index < reply.nextIndex) return;  // already had (sent again by a resume)
    reply.nextIndex = frame.index + 1;
    reply.text += frame.text;
    statusLine.textContent = "";
    if (!renderScheduled) {
      renderScheduled = true;
      requestAnimationFrame(renderReply);
    }
  } else if (frame.type === "done") {
    // A resume after the reply ended: the stored reply replaces what the page had of it.
    if (reply && frame.content !== undefined) reply.text = frame.content || reply.text;
    if (reply && frame.message_id !== undefined) {
      renderReply();
      delete reply.article.dataset.streaming;
      const meta = document.createElement("div");
      meta.className = "meta";
      const t = frame.timings || {};
      const parts = [frame.finish_reason];
      if (frame.usage) parts.push(`${frame.usage.completion_tokens} tokens`);
      if (frame.usage && frame.usage.cached_tokens) {
        parts.push(`${frame.usage.cached_tokens} of ${frame.usage.prompt_tokens} prompt tokens cached`);
      }
      if (t.time_to_first_token != null) parts.push(`TTFT ${t.time_to_first_token.toFixed(3)} s`);
      if (t.decode_tokens_per_s != null) parts.push(`${t.decode_tokens_per_s.toFixed(1)} tok/s`);
      if (frame.error) parts.push(frame.error);
      if (frame.model && document.getElementById("model-select")) parts.push(frame.model);
      meta.textContent = parts.join(" · ");
      reply.article.appendChild(meta);
    }
    reply = null;
    setBusy(false);
    statusLine.textContent = "";
    chat.dispatchEvent(new CustomEvent("chat:done", {detail: frame}));  // for conversations.js
  } else if (frame.type === "error") {
    chat.dispatchEvent(new CustomEvent("chat:error", {detail: frame}));  // for edit.js
    if (reply) renderReply();
    statusLine.textContent = `Error: ${frame.message}`;
    if (pending && !reply && NOT_STORED.has(frame.code)) {
      pending.article.remove();
      if (!input.value) input.value = pending.text;
    }
    pending = null;
    if (!reply) setBusy(false);
  }
}

function renderReply() {
  renderScheduled = false;
  if (!reply) return;  // it ended (and was rendered) before this frame
  renderAssistantText(reply.content, reply.text, reply.thinks);
  reply.article.scrollIntoView({block: "end"});
}

// Whether the frame went out: the callers change the page (clear the input, drop a reply) only when it
// did, so a refused send leaves everything as the user had it. No frame can arrive between the send
// and the caller's change: the "started" frame is handled on a later turn of the event loop.
function send(frame) {
  if (!socket || socket.readyState !== WebSocket.OPEN) { statusLine.textContent = "Not connected."; return false; }
  setBusy(true);
  sentAt = performance.now();
  // The model chosen, where the page offers a choice (several served); else the server's default.
  const model = document.getElementById("model-select")?.value;
  socket.send(JSON.stringify({...frame, params: params(), model}));
  return true;
}

composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = input.value;
  if (!text.trim()) return;
  if (!send({type: "send", content: text})) return;
  pending = addMessage("user", text);  // shown at once; taken back if the server refuses it
  input.value = "";
});
composer.addEventListener("keydown", (event) => {
  // An Enter or Esc that ends an IME composition belongs to the IME, not to the page. Safari reports
  // the composition's last Enter with isComposing false but keyCode 229, hence both checks.
  if (event.isComposing || event.keyCode === 229) return;
  if (event.key === "Enter" && !event.shiftKey && event.target === input) {
    event.preventDefault();  // Enter never types a newline; Shift+Enter does, by the default action
    // As the Send button: nothing happens while it is disabled (a reply under way), the text stays.
    if (!sendButton.disabled) composer.requestSubmit();
  } else if (event.key === "Escape" && !stopButton.disabled) {
    event.preventDefault();
    stopButton.click();
  }
});
stopButton.addEventListener("click", () => socket.send(JSON.stringify({type: "stop"})));
document.getElementById("regenerate").addEventListener("click", () => {
  const last = messages.lastElementChild;
  if (send({type: "regenerate"}) && last && last.dataset.role === "assistant") last.remove();
});

setBusy(true);
stopButton.disabled = true;
connect();
