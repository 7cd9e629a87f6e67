// Markdown for model output (untrusted): CommonMark + GFM (tables, task lists, strikethrough, autolinks)
// parsed by marked, its HTML passed through DOMPurify with an allow-list of the tags marked makes, code
// with a named language highlighted by highlight.js; all three vendored (static/vendor/VERSIONS.txt).
// Raw HTML in the text is shown as text, never as markup: a model that writes <img onerror=...> or
// <script> shows those characters. Markdown images become links (an image would be fetched the moment
// it is rendered: a prompt-injected reply could send the conversation to any server in its URL).
//
// While a reply streams, the whole text is lexed again each frame (cheap: docs/BENCHMARKS.md), but only
// the blocks from the first one that changed are rendered, sanitized and highlighted again; the blocks
// before it keep their DOM nodes. A block's HTML depends only on its own source and on the reference
// definitions ([x]: url), so when those change everything is rendered again.
"use strict";

const markdownParser = new marked.Marked({gfm: true, breaks: true});
markdownParser.use({renderer: {
  html: (token) => escapeHtml(token.text),
  image: (token) => `<a href="${escapeHtml(token.href)}">${escapeHtml(token.text || token.href)}</a>`,
}});
const SANITIZE = {
  ALLOWED_TAGS: ["a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
                 "input", "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul"],
  ALLOWED_ATTR: ["href", "title", "start", "type", "checked", "disabled", "align", "class"],
  RETURN_DOM_FRAGMENT: true,
};
const HIGHLIGHTED = {ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], RETURN_DOM_FRAGMENT: true};
// target -> {text, links, blocks: [{raw, nodes}]}: what renderMarkdown last put there.
const rendered = new WeakMap();

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}

// The markdown source last rendered into `target` (what a message's copy button copies), or null.
function markdownSource(target) {
  const last = rendered.get(target);
  return last ? last.text : null;
}

function renderMarkdown(target, text) {
  const tokens = markdownParser.lexer(text);
  const links = JSON.stringify(tokens.links || {});
  const last = rendered.get(target);
  const reusable = last && last.links === links &&
    last.blocks.every((block) => block.nodes.every((node) => node.parentNode === target));
  const blocks = reusable ? last.blocks : [];
  if (!reusable) target.replaceChildren();
  let same = 0;
  while (same < blocks.length && same < tokens.length && blocks[same].raw === tokens[same].raw) same++;
  blocks.splice(same).forEach((block) => block.nodes.forEach((node) => node.remove()));
  for (const token of tokens.slice(same)) {
    const fragment = renderBlock(token);
    blocks.push({raw: token.raw, nodes: [...fragment.childNodes]});
    target.appendChild(fragment);
  }
  rendered.set(target, {text, links, blocks});
}

function renderBlock(token) {
  const fragment = DOMPurify.sanitize(markdownParser.parser([token]), SANITIZE);
  fragment.querySelectorAll("a").forEach((link) => {
    link.target = "_blank";  // a reply's link never replaces the chat
    link.rel = "noopener noreferrer";
  });
  fragment.querySelectorAll("input[type=checkbox]").forEach((box) => {
    box.setAttribute("aria-label", box.checked ? "done" : "not done");
  });
  fragment.querySelectorAll("pre > code").forEach(decorateCode);
  // A wide table or code block scrolls sideways (on a phone, most do): focusable, so keys can scroll it.
  fragment.querySelectorAll("pre, table").forEach((el) => { el.tabIndex = 0; });
  return fragment;
}

// A code block gets a bar with its language and a copy button (static/chat/copy.js handles the click),
// and colours when highlight.js knows the language it names. A block that names none is left plain:
// guessing costs a pass per known language and often guesses wrong on a few lines.
function decorateCode(code) {
  const pre = code.parentElement;
  const match = /(?:^|\s)language-([\w+#.-]{1,30})(?:\s|$)/.exec(code.className);
  const language = match ? match[1] : "";
  if (language && hljs.getLanguage(language)) {
    const value = hljs.highlight(code.textContent, {language, ignoreIllegals: true}).value;
    code.replaceChildren(DOMPurify.sanitize(value, HIGHLIGHTED));
    code.classList.add("hljs");
  }
  if (language) code.dataset.language = language;
  const block = document.createElement("div");
  block.className = "code-block";
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const label = document.createElement("span");
  label.textContent = language || "text";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.dataset.copy = "code";
  copy.textContent = "Copy code";
  bar.append(label, copy);
  pre.replaceWith(block);
  block.append(bar, pre);
}
